package daemon

import (
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/client"
	"github.com/brokerd/brokerd/cmd/brokerctl/cli"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// sample is the value of the series line that starts with prefix (name and
// labels), or -1 when there is none.
func sample(text, prefix string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, prefix+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				return -1
			}
			return v
		}
	}
	return -1
}

// TestGeneratorStatsEndToEnd: a real daemon with a tiny random LLM runs 8
// sequences; GetStats shows the generator (it showed none) under the
// model version's name, for the name and for NAME@VERSION, with its
// generation figures; /metrics labels every series of the model with that
// one name, counts the sequences by finish reason with their end-to-end
// latency, exports the model-server protocol's gauges, and drops every
// series of the model when it is unloaded.
func TestGeneratorStatsEndToEnd(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "tiny-llm"
	writeTinyLlama(t, cfg.ModelRepo, "tiny-llm")
	core, logs := observer.New(zap.InfoLevel)
	d := startDaemonLog(t, Options{Config: cfg, Tokenizers: byteTokenizers}, zap.New(core))
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	// The load's warm-up step put the weights in their kernels' layouts
	// (logged, and counted in the relayout series): requests relay none.
	if n := logs.FilterMessage("generator warmed up").Len(); n != 1 {
		t.Errorf("%d warm-up lines, want 1: %v", n, logs.All())
	}
	relaid := func() (sum float64) {
		for _, l := range []string{"packed", "relaid16", "row-major"} {
			sum += sample(scrape(t, d.addrs.Metrics), `brokerd_onednn_weight_relayout_bytes_total{device="cpu:0",layout="`+l+`"}`)
		}
		return sum
	}
	relaidAtLoad := relaid()
	if relaidAtLoad <= 0 {
		t.Errorf("no weight relaid at load: %v", relaidAtLoad)
	}

	const n, maxTokens = 8, 20
	prompts := make([]string, n)
	promptTokens := 0
	for i := range prompts {
		prompts[i] = strings.Repeat("x", 3+i)
		promptTokens += len(prompts[i]) + 1 // BOS
	}
	st, err := c.Generate(ctx, &brokerv1.GenerateRequest{Model: "tiny-llm", Prompts: prompts,
		Sampling: &brokerv1.SamplingParams{Temperature: new(float32), MaxTokens: maxTokens, IgnoreEos: true}})
	if err != nil {
		t.Fatal(err)
	}
	results := 0
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		results += len(m.GetResults())
	}
	if results != n {
		t.Fatalf("%d results, want %d", results, n)
	}
	if got := relaid(); got != relaidAtLoad {
		t.Errorf("weights relaid during requests: %v bytes in all after them, %v after the load", got, relaidAtLoad)
	}

	for _, name := range []string{"tiny-llm", "tiny-llm@1"} {
		resp, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{Model: name})
		if err != nil {
			t.Fatalf("GetStats(%s): %v", name, err)
		}
		rows := resp.GetStats()
		if len(rows) != 2 || rows[0].GetDeviceId() != "" || rows[1].GetDeviceId() != "cpu:0" {
			t.Fatalf("GetStats(%s) rows: %v", name, rows)
		}
		for _, r := range rows {
			g := r.GetGeneration()
			if r.GetModel() != "tiny-llm@1" || g == nil {
				t.Fatalf("row %v", r)
			}
			if r.GetCompleted() != n || r.GetRunning() != 0 || r.GetQueued() != 0 || !r.GetHealthy() ||
				g.GetGeneratedTokens() != n*maxTokens || g.GetPromptTokens() != int64(promptTokens) ||
				g.GetKvCacheBlocksTotal() <= 0 || g.GetKvCacheBlocksUsed() != 0 ||
				g.GetTimeToFirstToken().GetP99Seconds() <= 0 || g.GetInterTokenLatency().GetP50Seconds() <= 0 ||
				g.GetOutputTokensPerSecond() <= 0 || r.GetLatency().GetP99Seconds() <= 0 {
				t.Errorf("GetStats(%s) row %q: %v", name, r.GetDeviceId(), r)
			}
		}
		if rows[1].GetMaxBatch() <= 0 {
			t.Errorf("replica row's running set %d", rows[1].GetMaxBatch())
		}
	}
	// brokerctl stats and top show the generator's table; the Go client
	// gets the same rows.
	for _, args := range [][]string{{"stats"}, {"stats", "--model", "tiny-llm"}, {"top", "--once"}} {
		var out, errOut strings.Builder
		if code := cli.Main(ctx, append([]string{"--socket", d.addrs.Socket}, args...), nil, &out, &errOut, func(string) string { return "" }); code != 0 {
			t.Fatalf("brokerctl %v: exit %d: %s", args, code, errOut.String())
		}
		if !regexp.MustCompile(`(?m)^MODEL +DEVICE +RUNNING +WAITING +COMPLETED .*KV-BLOCKS +KV-TYPE +PREFIX-HIT +PREEMPTED +ACCEPT +DEFERRED\n` +
			`tiny-llm@1 +all +0 +0 +8 +- .* 0/\d+ +\w+ +\d+\.\d% +0 +- +0\n` + `tiny-llm@1 +cpu:0 +0 +0 +8 `).MatchString(out.String()) {
			t.Errorf("brokerctl %v:\n%s", args, out.String())
		}
	}
	gc, err := client.Dial(ctx, client.WithSocket(d.addrs.Socket))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	viaClient, err := gc.Stats(ctx, &brokerv1.GetStatsRequest{Model: "tiny-llm"})
	if err != nil || len(viaClient.GetStats()) != 2 || viaClient.GetStats()[0].GetGeneration().GetGeneratedTokens() != n*maxTokens {
		t.Errorf("the Go client's Stats: %v, %v", viaClient, err)
	}

	if _, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{Model: "tiny-llm@2"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetStats of a version not served: %v", err)
	}
	all, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all.GetStats() {
		if strings.Contains(r.GetModel(), ".r") {
			t.Errorf("a queue key in GetStats: %q", r.GetModel())
		}
	}

	text := scrape(t, d.addrs.Metrics)
	model := regexp.MustCompile(`model="([^"]*)"`)
	for _, m := range model.FindAllStringSubmatch(text, -1) {
		if strings.HasPrefix(m[1], "tiny-llm") && m[1] != "tiny-llm@1" {
			t.Errorf("a series labels the model %q, not tiny-llm@1", m[1])
		}
	}
	for prefix, want := range map[string]float64{
		`brokerd_generation_request_success_total{finished_reason="length",model="tiny-llm@1"}`: n,
		`brokerd_generation_e2e_request_latency_seconds_count{model="tiny-llm@1"}`:              n,
		`brokerd_generation_waiting_sequences{model="tiny-llm@1"}`:                              0,
		`brokerd_generation_model_running_sequences{model="tiny-llm@1"}`:                        0,
		`brokerd_generation_kv_cache_usage_ratio{model="tiny-llm@1"}`:                           0,
		`brokerd_generation_running_sequences{device="cpu:0",model="tiny-llm@1"}`:               0,
		`brokerd_generation_kv_cache_blocks{device="cpu:0",model="tiny-llm@1",state="used"}`:    0,
	} {
		if got := sample(text, prefix); got != want {
			t.Errorf("%s = %v, want %v", prefix, got, want)
		}
	}
	if got := sample(text, `brokerd_generation_kv_cache_blocks{device="cpu:0",model="tiny-llm@1",state="total"}`); got <= 0 {
		t.Errorf("KV blocks in total: %v", got)
	}

	if _, err := c.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: "tiny-llm"}); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(scrape(t, d.addrs.Metrics), "\n") {
		if strings.Contains(line, `model="tiny-llm@1"`) {
			t.Errorf("after the unload: %s", line)
		}
	}
}
