package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// bench --generate: closed-loop Generate clients per concurrency level, with
// the figures of vLLM's serving benchmark: output tokens/s, time to first
// token and inter-token latency as the client sees them.

// genBenchReport is bench --generate --json's document.
type genBenchReport struct {
	Model           string          `json:"model"`
	PromptBytes     int             `json:"prompt_bytes"`
	MaxTokens       int             `json:"max_tokens"`
	IgnoreEOS       bool            `json:"ignore_eos"`
	Seed            uint64          `json:"seed"`
	DurationSeconds float64         `json:"duration_seconds"`
	WarmupSeconds   float64         `json:"warmup_seconds"`
	Percentiles     string          `json:"percentiles"`
	Interrupted     bool            `json:"interrupted"`
	Levels          []genBenchLevel `json:"levels"`
}

type genBenchLevel struct {
	Concurrency           int            `json:"concurrency"`
	WindowSeconds         float64        `json:"window_seconds"`
	Requests              int            `json:"requests"`
	OutputTokens          int            `json:"output_tokens"`
	PromptTokens          int            `json:"prompt_tokens"`
	RequestsPerSecond     float64        `json:"requests_per_second"`
	OutputTokensPerSecond float64        `json:"output_tokens_per_second"`
	TimeToFirstTokenMs    latencyReport  `json:"time_to_first_token_ms"`
	InterTokenMs          latencyReport  `json:"inter_token_ms"`
	LatencyMs             latencyReport  `json:"latency_ms"`
	MeanBatchSize         float64        `json:"mean_batch_size"`
	FailedRequests        int            `json:"failed_requests"`
	Failures              map[string]int `json:"failures"`
	Interrupted           bool           `json:"interrupted"`
}

type genBenchConfig struct {
	model            string
	levels           []int
	duration, warmup time.Duration
	promptBytes      int
	maxTokens        int
	ignoreEOS        bool
	seed             uint64
	connections      int
}

// genRecord is what one client saw in the window.
type genRecord struct {
	ttft, itl, lat        []time.Duration
	out, prompt, batchSum int
	failures              map[string]int
	interrupted           bool
}

func runGenBench(ctx context.Context, inv *invocation, cfg genBenchConfig) (*genBenchReport, error) {
	conns, closeConns, err := benchConns(ctx, inv, cfg.connections)
	if err != nil {
		return nil, err
	}
	defer closeConns()
	clients := make([]brokerv1.BrokerServiceClient, len(conns))
	for i, c := range conns {
		clients[i] = brokerv1.NewBrokerServiceClient(c)
	}
	rep := &genBenchReport{
		Model: cfg.model, PromptBytes: cfg.promptBytes, MaxTokens: cfg.maxTokens, IgnoreEOS: cfg.ignoreEOS, Seed: cfg.seed,
		DurationSeconds: cfg.duration.Seconds(), WarmupSeconds: cfg.warmup.Seconds(), Percentiles: "nearest-rank",
		Levels: []genBenchLevel{},
	}
	for li, n := range cfg.levels {
		fmt.Fprintf(inv.stderr, "bench: concurrency %d: Generate %s, %s warmup + %s\n", n, cfg.model, cfg.warmup, cfg.duration)
		lvl := genPhase(ctx, cfg, clients, n, uint64(li))
		rep.Levels = append(rep.Levels, lvl)
		if lvl.Interrupted {
			rep.Interrupted = true
			break
		}
	}
	return rep, nil
}

// genPhase runs n clients, each generating one sequence after another,
// until the window closes. Like runPhase, a request counts when it ends
// inside the window.
func genPhase(ctx context.Context, cfg genBenchConfig, clients []brokerv1.BrokerServiceClient, n int, level uint64) genBenchLevel {
	start := time.Now()
	mStart := start.Add(cfg.warmup)
	mEnd := mStart.Add(cfg.duration)
	recs := make([]genRecord, n)
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			rec := &recs[w]
			rec.failures = map[string]int{}
			gen := newTextGen(cfg.seed, level, uint64(w))
			for ctx.Err() == nil && time.Now().Before(mEnd) {
				ttft, itl, out, prompt, batch, err := genOnce(ctx, clients[w%len(clients)], cfg, gen.text(cfg.promptBytes))
				t1 := time.Now()
				if ctx.Err() != nil {
					rec.interrupted = true
					return
				}
				if t1.Before(mStart) || !t1.Before(mEnd) {
					continue
				}
				if err != nil {
					rec.failures[failureCode(err)]++
					continue
				}
				rec.ttft = append(rec.ttft, ttft)
				rec.itl = append(rec.itl, itl...)
				total := ttft
				for _, d := range itl {
					total += d
				}
				rec.lat = append(rec.lat, total)
				rec.out += out
				rec.prompt += prompt
				rec.batchSum += batch
			}
		})
	}
	wg.Wait()
	lvl := genBenchLevel{Concurrency: n, WindowSeconds: cfg.duration.Seconds(), Failures: map[string]int{}}
	var ttft, itl, lat []time.Duration
	batches := 0
	for _, r := range recs {
		ttft = append(ttft, r.ttft...)
		itl = append(itl, r.itl...)
		lat = append(lat, r.lat...)
		lvl.OutputTokens += r.out
		lvl.PromptTokens += r.prompt
		batches += r.batchSum
		for c, k := range r.failures {
			lvl.Failures[c] += k
			lvl.FailedRequests += k
		}
		lvl.Interrupted = lvl.Interrupted || r.interrupted
	}
	lvl.Requests = len(lat)
	if lvl.Interrupted {
		lvl.WindowSeconds = max(time.Since(mStart), 0).Seconds()
	}
	if lvl.WindowSeconds > 0 {
		lvl.RequestsPerSecond = float64(lvl.Requests) / lvl.WindowSeconds
		lvl.OutputTokensPerSecond = float64(lvl.OutputTokens) / lvl.WindowSeconds
	}
	if lvl.Requests > 0 {
		lvl.MeanBatchSize = float64(batches) / float64(lvl.Requests)
	}
	lvl.TimeToFirstTokenMs, lvl.InterTokenMs, lvl.LatencyMs = summarize(ttft), summarize(itl), summarize(slices.Clone(lat))
	return lvl
}

// genOnce sends one Generate and times its stream: the first delta with
// tokens, then the gap before each further token (a delta carrying k tokens
// counts as k gaps of a k-th of its wait each).
func genOnce(ctx context.Context, c brokerv1.BrokerServiceClient, cfg genBenchConfig, prompt string) (ttft time.Duration, itl []time.Duration, out, promptTokens, batch int, err error) {
	t0 := time.Now()
	s, err := c.Generate(ctx, &brokerv1.GenerateRequest{
		Model: cfg.model, Prompts: []string{prompt},
		Sampling: &brokerv1.SamplingParams{MaxTokens: int32(cfg.maxTokens), IgnoreEos: cfg.ignoreEOS},
	})
	if err != nil {
		return 0, nil, 0, 0, 0, err
	}
	last := t0
	got := false
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, nil, 0, 0, 0, err
		}
		now := time.Now()
		k := 0
		for _, d := range m.GetDeltas() {
			k += len(d.GetTokenIds())
		}
		switch {
		case k == 0:
		case !got:
			// Tokens arriving with the first one have no gap of their own.
			ttft, got = now.Sub(t0), true
			last = now
		default:
			gap := now.Sub(last) / time.Duration(k)
			for range k {
				itl = append(itl, gap)
			}
			last = now
		}
		for _, r := range m.GetResults() {
			out += int(r.GetUsage().GetCompletionTokens())
			promptTokens += int(r.GetUsage().GetPromptTokens())
			batch = int(r.GetExecution().GetBatchSize())
		}
	}
	if !got {
		ttft = time.Since(t0)
	}
	return ttft, itl, out, promptTokens, batch, nil
}

func writeGenBenchTable(w io.Writer, rep *genBenchReport) error {
	fmt.Fprintf(w, "model %s · prompts ~%d bytes · up to %d tokens · %s window after %s warmup\n",
		rep.Model, rep.PromptBytes, rep.MaxTokens, time.Duration(rep.DurationSeconds*float64(time.Second)), time.Duration(rep.WarmupSeconds*float64(time.Second)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONCURRENCY\tREQ/S\tOUT TOK/S\tTTFT P50\tTTFT P99\tITL P50\tITL P99\tBATCH\tFAILED")
	for _, l := range rep.Levels {
		fmt.Fprintf(tw, "%d\t%.2f\t%.1f\t%.1f ms\t%.1f ms\t%.2f ms\t%.2f ms\t%.1f\t%d\n", l.Concurrency, l.RequestsPerSecond, l.OutputTokensPerSecond,
			l.TimeToFirstTokenMs.P50, l.TimeToFirstTokenMs.P99, l.InterTokenMs.P50, l.InterTokenMs.P99, l.MeanBatchSize, l.FailedRequests)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, l := range rep.Levels {
		if len(l.Failures) > 0 {
			var parts []string
			for c, k := range l.Failures {
				parts = append(parts, fmt.Sprintf("%s %d", c, k))
			}
			slices.Sort(parts)
			fmt.Fprintf(w, "concurrency %d failures: %s\n", l.Concurrency, strings.Join(parts, ", "))
		}
	}
	return nil
}

func writeGenBenchJSON(w io.Writer, rep *genBenchReport) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("marshal bench results: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
