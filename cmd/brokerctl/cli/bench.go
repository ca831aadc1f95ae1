package cli

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/client"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// Defaults of bench, after Triton's perf_analyzer.
const (
	DefaultBenchDuration = 10 * time.Second
	DefaultBenchWarmup   = time.Second
	DefaultBenchSeed     = 1
)

// badResponse is the failure code of an Encode answer that broke the
// contract (wrong number of results): counted, never hidden.
const badResponse = "BAD_RESPONSE"

// intList is a comma-separated list of positive integers; a flag value
// replaces the default rather than appending to it.
type intList []int

func (l *intList) String() string {
	parts := make([]string, len(*l))
	for i, n := range *l {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func (l *intList) Set(s string) error {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

// benchConfig is bench's validated command line.
type benchConfig struct {
	model           string
	levels          []int
	duration        time.Duration
	warmup          time.Duration
	itemsPerRequest int
	textBytes       int
	fidelity        brokerv1.Fidelity
	fidelityName    string
	connections     int
	baseline        bool
	seed            uint64
	rpcTimeout      time.Duration // 0 for none
	forceInfer      bool          // --infer: Infer even for an encoder
}

func benchCmd(fs *flag.FlagSet) action {
	levels := intList{1, 8, 64}
	fs.Var(&levels, "concurrency", "comma-separated `LIST` of concurrency levels: closed-loop clients per level")
	model := fs.String("model", "", "model `NAME` (default: the server's default, nbmf-hash-v1)")
	duration := fs.Duration("duration", DefaultBenchDuration, "measurement window `DUR` of each level; the baseline phase gets the same")
	warmup := fs.Duration("warmup", DefaultBenchWarmup, "unmeasured load for `DUR` before each window")
	items := fs.Int("items-per-request", 1, "`N` items (texts, or rows of an mlp) in each request")
	textBytes := fs.Int("text-bytes", 64, "approximate size `N` of each generated text in bytes")
	fidelity := fs.String("fidelity", "semantic", "fidelity `F` of the requests: semantic, lossless or both")
	conns := fs.Int("connections", 1, "spread the clients round-robin over `K` gRPC connections")
	baseline := fs.Bool("baseline", false, "also run the same load against grpc.health.v1 Check and print the Encode/health requests/s ratio")
	seed := fs.Uint64("seed", DefaultBenchSeed, "seed `N` of the generated texts (the same seed sends the same texts)")
	forceInfer := fs.Bool("infer", false, "send Infer (\"text\" BYTES) even to a bert encoder, which Encode serves by default; mlp and bert-classifier models always get Infer")
	asJSON := fs.Bool("json", false, "print the results as one JSON document (see README)")
	maxFail := fs.Float64("max-failure-rate", 0.01, "exit 1 when more than this `FRACTION` of a level's requests failed (0 to 1)")
	generate := fs.Bool("generate", false, "send Generate to a generator --model instead: output tokens/s, time to first token and inter-token latency per concurrency (--text-bytes sizes the prompts)")
	maxTokens := fs.Int("max-tokens", 128, "with --generate, `N` tokens to generate per request")
	untilEOS := fs.Bool("stop-at-eos", false, "with --generate, let sequences end at end-of-sequence tokens (by default they run to --max-tokens, so every request does the same work)")
	return func(ctx context.Context, inv *invocation, _ []string) error {
		if *generate {
			cfg := genBenchConfig{
				model: *model, levels: levels, duration: *duration, warmup: *warmup, promptBytes: *textBytes,
				maxTokens: *maxTokens, ignoreEOS: !*untilEOS, seed: *seed, connections: *conns,
			}
			switch {
			case cfg.model == "":
				return usagef("--generate needs --model NAME (a generator model)")
			case cfg.duration <= 0:
				return usagef("--duration %s: must be positive", cfg.duration)
			case cfg.warmup < 0:
				return usagef("--warmup %s: must not be negative", cfg.warmup)
			case cfg.maxTokens < 1:
				return usagef("--max-tokens %d: must be at least 1", cfg.maxTokens)
			case cfg.promptBytes < 1 || cfg.connections < 1:
				return usagef("--text-bytes and --connections must be at least 1")
			}
			rep, err := runGenBench(ctx, inv, cfg)
			if err != nil {
				return err
			}
			var b bytes.Buffer
			if *asJSON {
				err = writeGenBenchJSON(&b, rep)
			} else {
				err = writeGenBenchTable(&b, rep)
			}
			if err != nil {
				return err
			}
			if err := inv.write(b.Bytes()); err != nil {
				return err
			}
			if rep.Interrupted {
				fmt.Fprintln(inv.stderr, "brokerctl: bench: interrupted; the results above are partial")
				return exitStatus(ExitError)
			}
			for _, l := range rep.Levels {
				if rate := failureRate(l.Requests, l.FailedRequests); rate > *maxFail {
					fmt.Fprintf(inv.stderr, "brokerctl: bench: %.1f%% of the requests at concurrency %d failed (more than --max-failure-rate %g)\n",
						100*rate, l.Concurrency, *maxFail)
					return exitStatus(ExitError)
				}
			}
			return nil
		}
		cfg := benchConfig{
			forceInfer: *forceInfer,
			model:      *model, levels: levels, duration: *duration, warmup: *warmup,
			itemsPerRequest: *items, textBytes: *textBytes, fidelityName: strings.ToLower(*fidelity),
			connections: *conns, baseline: *baseline, seed: *seed, rpcTimeout: inv.timeout,
		}
		var ok bool
		if cfg.fidelity, ok = parseFidelity(*fidelity); !ok {
			return usagef("--fidelity %q: want semantic, lossless or both", *fidelity)
		}
		switch {
		case cfg.duration <= 0:
			return usagef("--duration %s: must be positive", cfg.duration)
		case cfg.warmup < 0:
			return usagef("--warmup %s: must not be negative", cfg.warmup)
		case cfg.itemsPerRequest < 1:
			return usagef("--items-per-request %d: must be at least 1", cfg.itemsPerRequest)
		case cfg.textBytes < 1:
			return usagef("--text-bytes %d: must be at least 1", cfg.textBytes)
		case cfg.connections < 1:
			return usagef("--connections %d: must be at least 1", cfg.connections)
		}
		rep, err := runBench(ctx, inv, cfg)
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if *asJSON {
			err = writeBenchJSON(&b, rep)
		} else {
			err = writeBenchTable(&b, rep)
		}
		if err != nil {
			return err
		}
		if err := inv.write(b.Bytes()); err != nil {
			return err
		}
		if rep.Interrupted {
			fmt.Fprintln(inv.stderr, "brokerctl: bench: interrupted; the results above are partial")
			return exitStatus(ExitError)
		}
		for _, l := range rep.Levels {
			if rate := failureRate(l.Encode.Requests, l.Encode.FailedRequests); rate > *maxFail {
				fmt.Fprintf(inv.stderr, "brokerctl: bench: %.1f%% of the requests at concurrency %d failed (more than --max-failure-rate %g)\n",
					100*rate, l.Concurrency, *maxFail)
				return exitStatus(ExitError)
			}
		}
		return nil
	}
}

// failureRate is failed over all requests of a window (0 when none ran).
func failureRate(ok, failed int) float64 {
	if ok+failed == 0 {
		return 0
	}
	return float64(failed) / float64(ok+failed)
}

// benchReport is the document bench --json prints; the human table is
// rendered from it too. Field order and names are part of the documented
// output (README.md).
type benchReport struct {
	Model           string       `json:"model"`
	ServedModel     string       `json:"served_model"`
	RPC             string       `json:"rpc"`
	Fidelity        string       `json:"fidelity"`
	ItemsPerRequest int          `json:"items_per_request"`
	TextBytes       int          `json:"text_bytes"`
	Seed            uint64       `json:"seed"`
	DurationSeconds float64      `json:"duration_seconds"`
	WarmupSeconds   float64      `json:"warmup_seconds"`
	Connections     int          `json:"connections"`
	Concurrency     []int        `json:"concurrency"`
	Baseline        bool         `json:"baseline"`
	Percentiles     string       `json:"percentiles"`
	Interrupted     bool         `json:"interrupted"`
	Levels          []benchLevel `json:"levels"`
}

type benchLevel struct {
	Concurrency int          `json:"concurrency"`
	Encode      phaseReport  `json:"encode"`
	Health      *phaseReport `json:"health"`
	// Ratio is Encode requests/s over health requests/s; null without
	// --baseline or when the health phase completed nothing.
	Ratio *float64 `json:"ratio"`
}

// phaseReport is one closed-loop run (Encode or health) at one concurrency.
type phaseReport struct {
	WindowSeconds     float64        `json:"window_seconds"`
	Requests          int            `json:"requests"`
	Items             int            `json:"items"`
	RequestsPerSecond float64        `json:"requests_per_second"`
	ItemsPerSecond    float64        `json:"items_per_second"`
	LatencyMs         latencyReport  `json:"latency_ms"`
	MeanBatchSize     float64        `json:"mean_batch_size"`
	FailedRequests    int            `json:"failed_requests"`
	Failures          map[string]int `json:"failures"`
	WarmupRequests    int            `json:"warmup_requests"`
	LateRequests      int            `json:"late_requests"`
	Interrupted       bool           `json:"interrupted"`
}

type latencyReport struct {
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// callFunc sends one request of a phase and says how many items it carried
// and the batch size the server reports (0 for health checks).
type callFunc func(ctx context.Context, worker int, gen *textGen) (items int, batch int32, model string, err error)

func runBench(ctx context.Context, inv *invocation, cfg benchConfig) (*benchReport, error) {
	conns, closeConns, err := benchConns(ctx, inv, cfg.connections)
	if err != nil {
		return nil, err
	}
	defer closeConns()
	// One health check per connection connects it before the clock starts
	// and fails fast, with the usual "cannot reach brokerd" hint, when
	// brokerd is not there.
	for _, c := range conns {
		rctx, cancel := withOptionalTimeout(ctx, cfg.rpcTimeout)
		resp, err := healthpb.NewHealthClient(c).Check(rctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("bench: health check before the run: %w", err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			fmt.Fprintf(inv.stderr, "brokerctl: bench: brokerd reports %s; requests will likely fail\n", resp.GetStatus())
		}
	}

	brokers := make([]brokerv1.BrokerServiceClient, len(conns))
	healths := make([]healthpb.HealthClient, len(conns))
	for i, c := range conns {
		brokers[i] = brokerv1.NewBrokerServiceClient(c)
		healths[i] = healthpb.NewHealthClient(c)
	}
	rpc, infer, err := benchTarget(ctx, brokers, cfg)
	if err != nil {
		return nil, err
	}
	encode := func(ctx context.Context, worker int, gen *textGen) (int, int32, string, error) {
		req := &brokerv1.EncodeRequest{Model: cfg.model, Fidelity: cfg.fidelity, Items: make([]*brokerv1.EncodeItem, cfg.itemsPerRequest)}
		for i := range req.Items {
			req.Items[i] = &brokerv1.EncodeItem{Content: &brokerv1.EncodeItem_Text{Text: gen.text(cfg.textBytes)}}
		}
		resp, err := brokers[worker%len(brokers)].Encode(ctx, req)
		if err != nil {
			return 0, 0, "", err
		}
		if len(resp.GetResults()) != len(req.Items) {
			return 0, 0, "", errBadResponse
		}
		return len(req.Items), resp.GetExecution().GetBatchSize(), resp.GetModel(), nil
	}
	health := func(ctx context.Context, worker int, _ *textGen) (int, int32, string, error) {
		_, err := healths[worker%len(healths)].Check(ctx, &healthpb.HealthCheckRequest{})
		return 0, 0, "", err
	}

	rep := &benchReport{
		Model: cfg.model, RPC: rpc, Fidelity: cfg.fidelityName, ItemsPerRequest: cfg.itemsPerRequest, TextBytes: cfg.textBytes,
		Seed: cfg.seed, DurationSeconds: cfg.duration.Seconds(), WarmupSeconds: cfg.warmup.Seconds(),
		Connections: cfg.connections, Concurrency: slices.Clone(cfg.levels), Baseline: cfg.baseline,
		Percentiles: "nearest-rank", Levels: []benchLevel{},
	}
	for li, n := range cfg.levels {
		fmt.Fprintf(inv.stderr, "bench: concurrency %d: %s, %s warmup + %s\n", n, rpc, cfg.warmup, cfg.duration)
		call := encode
		if infer != nil {
			call = infer
		}
		enc, served := runPhase(ctx, cfg, n, uint64(li), call)
		if rep.ServedModel == "" {
			rep.ServedModel = served
		}
		if enc.WindowSeconds == 0 {
			// Interrupted before its window opened: nothing to show.
			rep.Interrupted = true
			break
		}
		lvl := benchLevel{Concurrency: n, Encode: enc}
		if cfg.baseline && !enc.Interrupted {
			fmt.Fprintf(inv.stderr, "bench: concurrency %d: health check, %s warmup + %s\n", n, cfg.warmup, cfg.duration)
			h, _ := runPhase(ctx, cfg, n, uint64(li), health)
			if h.WindowSeconds > 0 {
				lvl.Health = &h
				if h.RequestsPerSecond > 0 {
					r := enc.RequestsPerSecond / h.RequestsPerSecond
					lvl.Ratio = &r
				}
			}
			if h.Interrupted || h.WindowSeconds == 0 {
				rep.Interrupted = true
			}
		}
		rep.Levels = append(rep.Levels, lvl)
		if enc.Interrupted || rep.Interrupted {
			rep.Interrupted = true
			break
		}
	}
	return rep, nil
}

var errBadResponse = errors.New("the server returned a different number of results than items")

// benchConns returns the connection of the invocation and k-1 more to the
// same endpoint.
func benchConns(ctx context.Context, inv *invocation, k int) ([]*grpc.ClientConn, func(), error) {
	first, err := inv.dial(ctx)
	if err != nil {
		return nil, nil, err
	}
	conns := []*grpc.ClientConn{first}
	closeExtra := func() {
		for _, c := range conns[1:] {
			_ = c.Close()
		}
	}
	for len(conns) < k {
		c, err := inv.connect(ctx)
		if err != nil {
			closeExtra()
			return nil, nil, err
		}
		conns = append(conns, c.Conn())
	}
	return conns, closeExtra, nil
}

func withOptionalTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
}

// workerRecord is what one closed-loop client saw; each worker owns its own,
// so recording takes no lock.
type workerRecord struct {
	latencies      []time.Duration
	items          int
	batchSum       int64
	failures       map[string]int
	warmup, late   int
	model          string
	sawInterrupted bool
}

// runPhase runs n closed-loop clients: each sends a request, waits for the
// answer, and sends the next, from the start until the window closes
// (warmup + duration); no request starts after that. A request counts in the
// window when it completes inside it; ones completing during warmup or after
// the window are counted apart (warmup_requests, late_requests) and left out
// of the figures. A cancelled ctx (Ctrl-C) ends the window at that moment and
// its aborted requests are not failures.
func runPhase(ctx context.Context, cfg benchConfig, n int, level uint64, call callFunc) (phaseReport, string) {
	start := time.Now()
	mStart := start.Add(cfg.warmup)
	mEnd := mStart.Add(cfg.duration)
	// When ctx is cancelled, cancelledAfter is how long after start.
	var cancelledAfter time.Duration
	watched := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		cancelledAfter = max(time.Since(start), 1)
		close(watched)
	})

	recs := make([]workerRecord, n)
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			rec := &recs[w]
			rec.failures = map[string]int{}
			gen := newTextGen(cfg.seed, level, uint64(w))
			var backoff time.Duration
			for ctx.Err() == nil && time.Now().Before(mEnd) {
				if backoff > 0 {
					wake := time.Now().Add(backoff)
					if wake.After(mEnd) {
						wake = mEnd
					}
					sleepUntil(ctx, wake)
					if ctx.Err() != nil || !time.Now().Before(mEnd) {
						break
					}
				}
				rctx, cancel := withOptionalTimeout(ctx, cfg.rpcTimeout)
				t0 := time.Now()
				items, batch, model, err := call(rctx, w, gen)
				t1 := time.Now()
				cancel()
				if err != nil {
					backoff = client.RetryDelay(err, backoff)
				}
				if ctx.Err() != nil {
					rec.sawInterrupted = true
					return
				}
				switch {
				case t1.Before(mStart):
					rec.warmup++
				case !t1.Before(mEnd):
					rec.late++
				case err != nil:
					rec.failures[failureCode(err)]++
				default:
					backoff = 0
					rec.latencies = append(rec.latencies, t1.Sub(t0))
					rec.items += items
					rec.batchSum += int64(batch)
					if rec.model == "" {
						rec.model = model
					}
				}
			}
		})
	}
	wg.Wait()
	if !stopWatch() {
		// ctx was cancelled, and the watcher started: wait for its time.
		<-watched
	}

	window := cfg.duration
	interrupted := false
	if c := cancelledAfter; c > 0 && start.Add(c).Before(mEnd) {
		interrupted = true
		window = max(c-cfg.warmup, 0)
	}
	var all []time.Duration
	p := phaseReport{WindowSeconds: window.Seconds(), Failures: map[string]int{}, Interrupted: interrupted}
	var batchSum int64
	model := ""
	for _, r := range recs {
		all = append(all, r.latencies...)
		p.Items += r.items
		batchSum += r.batchSum
		for code, k := range r.failures {
			p.Failures[code] += k
			p.FailedRequests += k
		}
		p.WarmupRequests += r.warmup
		p.LateRequests += r.late
		if model == "" {
			model = r.model
		}
	}
	p.Requests = len(all)
	if window > 0 {
		p.RequestsPerSecond = float64(p.Requests) / window.Seconds()
		p.ItemsPerSecond = float64(p.Items) / window.Seconds()
	}
	if p.Requests > 0 {
		p.MeanBatchSize = float64(batchSum) / float64(p.Requests)
	}
	p.LatencyMs = summarize(all)
	return p, model
}

func failureCode(err error) string {
	if errors.Is(err, errBadResponse) {
		return badResponse
	}
	return codeName(status.Code(err))
}

// summarize sorts lat and reports it in milliseconds with nearest-rank
// percentiles.
func summarize(lat []time.Duration) latencyReport {
	if len(lat) == 0 {
		return latencyReport{}
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return latencyReport{
		Min:  ms(lat[0]),
		Mean: math.Round(ms(sum)/float64(len(lat))*1e6) / 1e6, // to the nanosecond, like the others
		P50:  ms(nearestRank(lat, 50)),
		P95:  ms(nearestRank(lat, 95)),
		P99:  ms(nearestRank(lat, 99)),
		Max:  ms(lat[len(lat)-1]),
	}
}

// nearestRank is the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it, i.e. sorted[ceil(p/100*n)-1]. Integer arithmetic keeps the
// rank exact.
func nearestRank(sorted []time.Duration, p int) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := (p*n + 99) / 100
	return sorted[min(max(rank, 1), n)-1]
}

// writeBenchTable prints a one-line description of the run and a row per
// concurrency level.
func writeBenchTable(w io.Writer, rep *benchReport) error {
	model := rep.ServedModel
	if model == "" {
		model = orDash(rep.Model)
	}
	rpc := rep.RPC
	if rpc == "" {
		rpc = "Encode"
	}
	fmt.Fprintf(w, "model %s, %s, %d item(s)/request, ~%d-byte texts, fidelity %s, %d connection(s), %gs warmup + %gs per level, latency percentiles nearest-rank\n",
		model, rpc, rep.ItemsPerRequest, rep.TextBytes, rep.Fidelity, rep.Connections, rep.WarmupSeconds, rep.DurationSeconds)
	tw := newTable(w)
	header := []string{"CONCURRENCY", "ITEMS/S", "REQUESTS/S", "P50", "P95", "P99", "MEAN-BATCH", "FAILURES"}
	if rep.Baseline {
		header = append(header, "HEALTH-REQ/S", "HEALTH-P50", "HEALTH-P99", "HEALTH-FAILURES", "RATIO")
	}
	row(tw, "", header...)
	for _, l := range rep.Levels {
		e := l.Encode
		conc := strconv.Itoa(l.Concurrency)
		if e.Interrupted {
			conc += "*"
		}
		cells := []string{conc, rate(e.ItemsPerSecond), rate(e.RequestsPerSecond)}
		cells = append(cells, latencyCells(e)...)
		cells = append(cells, strconv.FormatFloat(e.MeanBatchSize, 'f', 2, 64), codeCountsCell(e.Failures))
		if rep.Baseline {
			if h := l.Health; h != nil {
				lc := latencyCells(*h)
				cells = append(cells, rate(h.RequestsPerSecond), lc[0], lc[2], codeCountsCell(h.Failures))
			} else {
				cells = append(cells, "-", "-", "-", "-")
			}
			ratio := "-"
			if l.Ratio != nil {
				ratio = strconv.FormatFloat(*l.Ratio, 'f', 2, 64)
			}
			cells = append(cells, ratio)
		}
		row(tw, "", cells...)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write bench table: %w", err)
	}
	if rep.Interrupted {
		fmt.Fprintln(w, "* interrupted: the window was cut short; later levels did not run")
	}
	if rep.Baseline {
		fmt.Fprintf(w, "RATIO = %s requests/s / health-check requests/s at the same concurrency\n", rpc)
	}
	return nil
}

func rate(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// latencyCells are P50, P95 and P99, or "-" when nothing succeeded.
func latencyCells(p phaseReport) []string {
	if p.Requests == 0 {
		return []string{"-", "-", "-"}
	}
	return []string{formatMs(p.LatencyMs.P50), formatMs(p.LatencyMs.P95), formatMs(p.LatencyMs.P99)}
}

// codeCountsCell prints failures by gRPC code, most frequent first:
// "UNAVAILABLE=3 DEADLINE_EXCEEDED=1", or "0".
func codeCountsCell(f map[string]int) string {
	codes := slices.Collect(maps.Keys(f))
	slices.SortFunc(codes, func(a, b string) int {
		if f[a] != f[b] {
			return f[b] - f[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, 0, len(codes))
	for _, c := range codes {
		parts = append(parts, c+"="+strconv.Itoa(f[c]))
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, " ")
}

func writeBenchJSON(w io.Writer, rep *benchReport) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("marshal bench results: %w", err)
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// benchWords are common English words; generated texts are random runs of
// them in sentences, so they look like the short notes a memory encoder sees
// without repeating.
var benchWords = strings.Fields(`the of and to in is that it for was on are as with his they at be this
from have or by one had not but what all were when we there can an your which their said if do will each
about how up out them then she many some so these would other into has more her two like him see time
could no make than first been its who now people my made over did down only way find use may water long
little very after words called just where most know get through back much before go good new write our
used me man too any day same right look think also around another came come work three word must because
does part even place well such here take why things help put years different away again off went old
number great tell men say small every found still between name should home big give air line set own
under read last never us left end along while might next sound below saw something thought both few
those always looked show large often together asked house world going want school important until form
food keep children feet land side without boy once animals life enough took sometimes four head above
kind began almost live page got earth need far hand high year mother light country father let night
picture being study second soon story since white ever paper hard near sentence better best across during
today others sure means knew try told young miles sun ways thing whole hear example heard several change
answer room sea against top turned learn point city play toward five using himself usually memory record
council advisor device queue batch signal river garden winter summer market morning evening letter`)

// BenchWords returns the words bench builds its texts from, so benchmark
// models (bench/mkbert) can give each of them one token.
func BenchWords() []string { return slices.Clone(benchWords) }

// BenchText returns the text bench's generator makes for (seed, level,
// worker) at size bytes: the same texts a bench run sends.
func BenchText(seed, level, worker uint64, size int) string {
	return newTextGen(seed, level, worker).text(size)
}

// textGen makes pseudo-random English-like texts from a fixed seed, so two
// runs with the same seed send the same texts, while every request's texts
// differ (no cache can answer them).
type textGen struct {
	rng *rand.Rand
	b   strings.Builder
}

// newTextGen seeds a generator per (level, worker), so a worker's texts do
// not depend on how the others were scheduled.
func newTextGen(seed, level, worker uint64) *textGen {
	return &textGen{rng: rand.New(rand.NewPCG(seed, level<<32|worker))}
}

// text returns sentences of random words of at most size bytes (at least
// one word, cut to size if that word alone is longer); ends are within one
// word of size.
func (g *textGen) text(size int) string {
	g.b.Reset()
	sentence := 0
	for {
		w := benchWords[g.rng.IntN(len(benchWords))]
		sep := " "
		switch {
		case g.b.Len() == 0:
			sep = ""
		case sentence == 0:
			sep = ". "
		}
		if sentence == 0 {
			w = strings.ToUpper(w[:1]) + w[1:]
		}
		if g.b.Len() > 0 && g.b.Len()+len(sep)+len(w) > size {
			break
		}
		g.b.WriteString(sep)
		g.b.WriteString(w)
		if g.b.Len() >= size {
			break
		}
		sentence++
		// Sentences of 3 words or more, about 8 on average.
		if sentence >= 3 && g.rng.IntN(6) == 0 {
			sentence = 0
		}
	}
	s := g.b.String()
	if len(s) > size {
		s = s[:size]
	}
	return s
}

// benchTarget decides what bench sends to the model: Encode for the
// built-in encoder and bert encoders (the memory-encoder path), Infer for
// mlp and bert-classifier models, and for bert too with --infer. Without
// --model, or for a model ListModels does not show, it is Encode (the
// server's default model). infer is nil for Encode.
func benchTarget(ctx context.Context, brokers []brokerv1.BrokerServiceClient, cfg benchConfig) (string, callFunc, error) {
	if cfg.model == "" {
		if cfg.forceInfer {
			return "", nil, usagef("--infer needs --model NAME")
		}
		return "Encode", nil, nil
	}
	rctx, cancel := withOptionalTimeout(ctx, cfg.rpcTimeout)
	defer cancel()
	resp, err := brokers[0].ListModels(rctx, &brokerv1.ListModelsRequest{})
	if err != nil {
		return "", nil, fmt.Errorf("bench: list models: %w", err)
	}
	var m *brokerv1.Model
	for _, x := range resp.GetModels() {
		if x.GetName() == cfg.model {
			m = x
		}
	}
	if m == nil {
		return "", nil, fmt.Errorf("bench: brokerd has no model %q (see brokerctl models)", cfg.model)
	}
	if m.GetState() != brokerv1.ModelState_MODEL_STATE_READY {
		return "", nil, fmt.Errorf("bench: model %s is %s, not ready (brokerctl load %s)", cfg.model,
			enumName(m.GetState().Descriptor(), m.GetState().Number()), cfg.model)
	}
	kind := m.GetKind()
	if kind != "mlp" && kind != "bert-classifier" && !(kind == "bert" && cfg.forceInfer) {
		if cfg.forceInfer {
			return "", nil, usagef("--infer: model %s (%s) is served by Encode only", cfg.model, kind)
		}
		return "Encode", nil, nil
	}
	if len(m.GetInputs()) == 0 {
		return "", nil, fmt.Errorf("bench: model %s lists no inputs", cfg.model)
	}
	in := m.GetInputs()[0]
	var build func(gen *textGen) *brokerv1.Tensor
	if in.GetDtype() == brokerv1.DataType_DATA_TYPE_BYTES {
		build = func(gen *textGen) *brokerv1.Tensor {
			texts := make([]string, cfg.itemsPerRequest)
			for i := range texts {
				texts[i] = gen.text(cfg.textBytes)
			}
			return &brokerv1.Tensor{Name: in.GetName(), Dtype: in.GetDtype(), Shape: []int64{int64(len(texts))}, Data: bytesData(texts)}
		}
	} else {
		// An mlp row: random normal values of the input's width.
		shape := in.GetShape()
		if in.GetDtype() != brokerv1.DataType_DATA_TYPE_FP32 || len(shape) != 2 || shape[1] < 1 {
			return "", nil, fmt.Errorf("bench: model %s input %s: want FP32 [-1, width], not %s %v", cfg.model, in.GetName(), dtypeName(in.GetDtype()), shape)
		}
		width := int(shape[1])
		build = func(gen *textGen) *brokerv1.Tensor {
			vals := make([]float32, cfg.itemsPerRequest*width)
			for i := range vals {
				vals[i] = float32(gen.rng.NormFloat64())
			}
			data := make([]byte, 0, 4*len(vals))
			for _, v := range vals {
				data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
			}
			return &brokerv1.Tensor{Name: in.GetName(), Dtype: in.GetDtype(), Shape: []int64{int64(cfg.itemsPerRequest), int64(width)}, Data: data}
		}
	}
	call := func(ctx context.Context, worker int, gen *textGen) (int, int32, string, error) {
		resp, err := brokers[worker%len(brokers)].Infer(ctx, &brokerv1.InferRequest{Model: cfg.model, Inputs: []*brokerv1.Tensor{build(gen)}})
		if err != nil {
			return 0, 0, "", err
		}
		if len(resp.GetOutputs()) == 0 || len(resp.GetOutputs()[0].GetShape()) == 0 || resp.GetOutputs()[0].GetShape()[0] != int64(cfg.itemsPerRequest) {
			return 0, 0, "", errBadResponse
		}
		return cfg.itemsPerRequest, resp.GetExecution().GetBatchSize(), resp.GetModel(), nil
	}
	return "Infer", call, nil
}

// bytesData encodes texts as BYTES tensor data.
func bytesData(texts []string) []byte {
	var out []byte
	for _, t := range texts {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(t)))
		out = append(out, t...)
	}
	return out
}

// sleepUntil waits until t or ctx ends.
func sleepUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}
