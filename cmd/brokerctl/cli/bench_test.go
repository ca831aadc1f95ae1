package cli

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/brokerd/brokerd/server/endpoint"
)

const (
	encodeMethod = "/broker.v1.BrokerService/Encode"
	checkMethod  = "/grpc.health.v1.Health/Check"
)

// parseBench parses bench --json output, failing the test when it does not.
func parseBench(t *testing.T, out string) *benchReport {
	t.Helper()
	var rep benchReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("bench --json does not parse: %v\n%s", err, out)
	}
	return &rep
}

// total is every request a phase sent that got an answer: the ones in the
// window (successful or failed), and those that completed in the warmup or
// after the window.
func (p *phaseReport) total() int {
	return p.Requests + p.FailedRequests + p.WarmupRequests + p.LateRequests
}

// checkPhase checks the figures of one phase against each other.
func checkPhase(t *testing.T, name string, p *phaseReport, itemsPerRequest int, window float64) {
	t.Helper()
	if p.Requests == 0 {
		t.Fatalf("%s: no successful requests: %+v", name, p)
	}
	if p.WindowSeconds != window {
		t.Errorf("%s: window_seconds = %v, want %v", name, p.WindowSeconds, window)
	}
	if p.Items != p.Requests*itemsPerRequest {
		t.Errorf("%s: items = %d, want %d requests x %d", name, p.Items, p.Requests, itemsPerRequest)
	}
	if want := float64(p.Requests) / p.WindowSeconds; math.Abs(p.RequestsPerSecond-want) > 1e-9*want {
		t.Errorf("%s: requests_per_second = %v, want %v", name, p.RequestsPerSecond, want)
	}
	if want := float64(p.Items) / p.WindowSeconds; math.Abs(p.ItemsPerSecond-want) > 1e-9*want {
		t.Errorf("%s: items_per_second = %v, want %v", name, p.ItemsPerSecond, want)
	}
	l := p.LatencyMs
	if !(l.Min > 0 && l.Min <= l.P50 && l.P50 <= l.P95 && l.P95 <= l.P99 && l.P99 <= l.Max && l.Min <= l.Mean && l.Mean <= l.Max) {
		t.Errorf("%s: latencies out of order: %+v", name, l)
	}
	sum := 0
	for _, n := range p.Failures {
		sum += n
	}
	if sum != p.FailedRequests {
		t.Errorf("%s: failures %v add up to %d, failed_requests = %d", name, p.Failures, sum, p.FailedRequests)
	}
}

// TestBenchCounts runs short closed loops against the fake and checks that
// every request the server saw is accounted for, and the figures agree.
func TestBenchCounts(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		failEvery   int
		levels      []int
		items       int
		connections int
		warmup      bool
	}{
		{name: "single items", args: []string{"--concurrency", "1,4"}, levels: []int{1, 4}, items: 1, connections: 1},
		{name: "three items per request", args: []string{"--concurrency", "2", "--items-per-request", "3", "--text-bytes", "48"}, levels: []int{2}, items: 3, connections: 1},
		{name: "warmup is not measured", args: []string{"--concurrency", "2", "--warmup", "500ms"}, levels: []int{2}, items: 1, connections: 1, warmup: true},
		{name: "failures are counted", args: []string{"--concurrency", "1,4", "--max-failure-rate", "1"}, failEvery: 5, levels: []int{1, 4}, items: 1, connections: 1},
		{name: "three connections", args: []string{"--concurrency", "3", "--connections", "3"}, levels: []int{3}, items: 1, connections: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t)
			ts.broker.failEvery = tt.failEvery
			args := append([]string{"bench", "--json", "--duration", "250ms", "--warmup", "0"}, tt.args...)
			r := ts.run(t, nil, args...)
			if r.code != ExitOK {
				t.Fatalf("got %v", r)
			}
			rep := parseBench(t, r.stdout)
			if rep.ServedModel != "nbmf-hash-v1" || rep.Interrupted || rep.Percentiles != "nearest-rank" || rep.ItemsPerRequest != tt.items {
				t.Errorf("header = %+v", rep)
			}
			if len(rep.Levels) != len(tt.levels) {
				t.Fatalf("got %d levels, want %d", len(rep.Levels), len(tt.levels))
			}
			sent, windowFailures := 0, 0
			for i, l := range rep.Levels {
				e := &l.Encode
				name := "concurrency " + strconv.Itoa(l.Concurrency)
				if l.Concurrency != tt.levels[i] {
					t.Errorf("level %d has concurrency %d, want %d", i, l.Concurrency, tt.levels[i])
				}
				checkPhase(t, name, e, tt.items, 0.25)
				if e.MeanBatchSize != float64(tt.items) {
					t.Errorf("%s: mean_batch_size = %v, want %d (the fake's batch is the request)", name, e.MeanBatchSize, tt.items)
				}
				if tt.warmup != (e.WarmupRequests > 0) {
					t.Errorf("%s: warmup_requests = %d with warmup %v", name, e.WarmupRequests, tt.warmup)
				}
				// In-flight requests at the window's end complete late: at
				// most one per client.
				if e.LateRequests > l.Concurrency {
					t.Errorf("%s: late_requests = %d > concurrency", name, e.LateRequests)
				}
				if l.Health != nil || l.Ratio != nil {
					t.Errorf("%s: health phase without --baseline", name)
				}
				sent += e.total()
				windowFailures += e.FailedRequests
				if tt.failEvery == 0 && len(e.Failures) != 0 {
					t.Errorf("%s: failures %v from a server that never fails", name, e.Failures)
				}
				for code := range e.Failures {
					if code != "UNAVAILABLE" {
						t.Errorf("%s: failure code %q, the fake only fails with UNAVAILABLE", name, code)
					}
				}
			}
			calls := ts.broker.encodeCalls()
			if sent != len(calls) {
				t.Errorf("bench accounts for %d requests, the server got %d", sent, len(calls))
			}
			ts.broker.mu.Lock()
			failed, texts := ts.broker.encodeFailed, ts.broker.texts
			ts.broker.mu.Unlock()
			if tt.failEvery > 0 && (windowFailures == 0 || windowFailures > failed) {
				t.Errorf("window failures = %d, the server failed %d", windowFailures, failed)
			}
			if len(texts) != len(calls)*tt.items {
				t.Errorf("%d distinct texts in %d items: texts repeat", len(texts), len(calls)*tt.items)
			}
			// One health check per connection before the run, none after.
			if got := ts.callCount(checkMethod); got != tt.connections {
				t.Errorf("%d health checks, want %d (one per connection)", got, tt.connections)
			}
		})
	}
}

// benchTableLines returns the table of bench's human output: the header and
// the rows, without the description line above and the notes below.
func benchTableLines(t *testing.T, out string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "model ") || !strings.HasPrefix(lines[1], "CONCURRENCY") {
		t.Fatalf("not bench's output:\n%s", out)
	}
	table := lines[1:2]
	for _, l := range lines[2:] {
		if l != "" && unicode.IsDigit(rune(l[0])) {
			table = append(table, l)
		}
	}
	return strings.Join(table, "\n") + "\n"
}

func TestBenchTable(t *testing.T) {
	header := []string{"CONCURRENCY", "ITEMS/S", "REQUESTS/S", "P50", "P95", "P99", "MEAN-BATCH", "FAILURES"}
	baseline := append(slices.Clone(header), "HEALTH-REQ/S", "HEALTH-P50", "HEALTH-P99", "HEALTH-FAILURES", "RATIO")
	tests := []struct {
		name      string
		args      []string
		failEvery int
		header    []string
		levels    []string
	}{
		{name: "plain", args: []string{"--concurrency", "1,4"}, header: header, levels: []string{"1", "4"}},
		{name: "failures shown", args: []string{"--concurrency", "2", "--max-failure-rate", "1"}, failEvery: 3, header: header, levels: []string{"2"}},
		{name: "baseline", args: []string{"--concurrency", "1,2", "--baseline", "--items-per-request", "2"}, header: baseline, levels: []string{"1", "2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t)
			ts.broker.failEvery = tt.failEvery
			r := ts.run(t, nil, append([]string{"bench", "--duration", "200ms", "--warmup", "0"}, tt.args...)...)
			if r.code != ExitOK {
				t.Fatalf("got %v", r)
			}
			rows := checkTable(t, benchTableLines(t, r.stdout), tt.header)
			if len(rows) != len(tt.levels) {
				t.Fatalf("got %d rows, want %d:\n%s", len(rows), len(tt.levels), r.stdout)
			}
			for i, row := range rows {
				if row["CONCURRENCY"] != tt.levels[i] {
					t.Errorf("row %d CONCURRENCY = %q, want %q", i, row["CONCURRENCY"], tt.levels[i])
				}
				reqs, err1 := strconv.ParseFloat(row["REQUESTS/S"], 64)
				items, err2 := strconv.ParseFloat(row["ITEMS/S"], 64)
				if err1 != nil || err2 != nil || reqs <= 0 || items < reqs {
					t.Errorf("row %d: REQUESTS/S %q ITEMS/S %q", i, row["REQUESTS/S"], row["ITEMS/S"])
				}
				for _, col := range []string{"P50", "P95", "P99"} {
					if !strings.HasSuffix(row[col], "ms") {
						t.Errorf("row %d %s = %q, want milliseconds", i, col, row[col])
					}
				}
				wantFailures := "0"
				if tt.failEvery > 0 {
					wantFailures = "UNAVAILABLE="
				}
				if !strings.HasPrefix(row["FAILURES"], wantFailures) {
					t.Errorf("row %d FAILURES = %q, want %q...", i, row["FAILURES"], wantFailures)
				}
				if tt.failEvery == 0 {
					wantBatch := "1.00"
					if slices.Contains(tt.args, "--items-per-request") {
						wantBatch = "2.00"
					}
					if row["MEAN-BATCH"] != wantBatch {
						t.Errorf("row %d MEAN-BATCH = %q, want %q", i, row["MEAN-BATCH"], wantBatch)
					}
				}
				if slices.Contains(tt.header, "RATIO") {
					ratio, err := strconv.ParseFloat(row["RATIO"], 64)
					health, err2 := strconv.ParseFloat(row["HEALTH-REQ/S"], 64)
					if err != nil || err2 != nil || ratio <= 0 || health <= 0 {
						t.Errorf("row %d: RATIO %q HEALTH-REQ/S %q", i, row["RATIO"], row["HEALTH-REQ/S"])
					} else if want := reqs / health; math.Abs(ratio-want) > 0.01+0.01*want {
						t.Errorf("row %d: RATIO %v, want %v / %v = %v", i, ratio, reqs, health, want)
					}
					if row["HEALTH-FAILURES"] != "0" {
						t.Errorf("row %d HEALTH-FAILURES = %q", i, row["HEALTH-FAILURES"])
					}
				}
			}
			if slices.Contains(tt.header, "RATIO") != strings.Contains(r.stdout, "RATIO = Encode requests/s / health-check requests/s") {
				t.Errorf("ratio note present iff --baseline:\n%s", r.stdout)
			}
		})
	}
}

func TestBenchBaselineJSON(t *testing.T) {
	ts := startServer(t)
	// A warmup long enough to hold requests however loaded the machine
	// (each is a millisecond or so in process).
	r := ts.run(t, nil, "bench", "--json", "--baseline", "--duration", "200ms", "--warmup", "500ms", "--concurrency", "1,3")
	if r.code != ExitOK {
		t.Fatalf("got %v", r)
	}
	rep := parseBench(t, r.stdout)
	if !rep.Baseline || len(rep.Levels) != 2 {
		t.Fatalf("got %+v", rep)
	}
	checks := 1 // the check before the run
	for _, l := range rep.Levels {
		name := "concurrency " + strconv.Itoa(l.Concurrency)
		checkPhase(t, name+" encode", &l.Encode, 1, 0.2)
		if l.Health == nil || l.Ratio == nil {
			t.Fatalf("%s: no health phase or ratio", name)
		}
		checkPhase(t, name+" health", l.Health, 0, 0.2)
		if want := l.Encode.RequestsPerSecond / l.Health.RequestsPerSecond; *l.Ratio != want {
			t.Errorf("%s: ratio = %v, want %v", name, *l.Ratio, want)
		}
		if l.Health.MeanBatchSize != 0 || l.Health.WarmupRequests == 0 {
			t.Errorf("%s: health phase %+v: want no batch and warmup requests", name, l.Health)
		}
		checks += l.Health.total()
	}
	if got := ts.callCount(checkMethod); got != checks {
		t.Errorf("server got %d health checks, bench accounts for %d", got, checks)
	}
}

// TestBenchJSONShape pins the documented keys of bench --json.
func TestBenchJSONShape(t *testing.T) {
	ts := startServer(t)
	r := ts.run(t, nil, "bench", "--json", "--baseline", "--duration", "100ms", "--warmup", "0", "--concurrency", "1")
	if r.code != ExitOK {
		t.Fatalf("got %v", r)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatal(err)
	}
	level := doc["levels"].([]any)[0].(map[string]any)
	encode := level["encode"].(map[string]any)
	tests := []struct {
		name string
		obj  map[string]any
		keys []string
	}{
		{name: "top", obj: doc, keys: []string{"model", "served_model", "rpc", "fidelity", "items_per_request", "text_bytes", "seed",
			"duration_seconds", "warmup_seconds", "connections", "concurrency", "baseline", "percentiles", "interrupted", "levels"}},
		{name: "level", obj: level, keys: []string{"concurrency", "encode", "health", "ratio"}},
		{name: "phase", obj: encode, keys: []string{"window_seconds", "requests", "items", "requests_per_second", "items_per_second",
			"latency_ms", "mean_batch_size", "failed_requests", "failures", "warmup_requests", "late_requests", "interrupted"}},
		{name: "health phase", obj: level["health"].(map[string]any), keys: slices.Collect(func(yield func(string) bool) {
			for k := range encode {
				if !yield(k) {
					return
				}
			}
		})},
		{name: "latency", obj: encode["latency_ms"].(map[string]any), keys: []string{"min", "mean", "p50", "p95", "p99", "max"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for k := range tt.obj {
				got = append(got, k)
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tt.keys))
			if !slices.Equal(got, want) {
				t.Errorf("keys = %v, want %v", got, want)
			}
		})
	}
	if f, ok := encode["failures"].(map[string]any); !ok || len(f) != 0 {
		t.Errorf("failures = %#v, want an empty object", encode["failures"])
	}
	if !strings.HasPrefix(r.stdout, "{\n  \"model\": \"\",\n") || !strings.HasSuffix(r.stdout, "}\n") {
		t.Errorf("not indented by two spaces:\n%.80s", r.stdout)
	}
}

// TestBenchInterrupt cancels the run (Ctrl-C) and expects the partial results
// right away, marked as such, and exit 1.
func TestBenchInterrupt(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantLevels int
	}{
		{name: "during the window", args: []string{"--warmup", "0"}, wantLevels: 1},
		{name: "during warmup", args: []string{"--warmup", "20s"}, wantLevels: 0},
	}
	for _, tt := range tests {
		for _, asJSON := range []bool{true, false} {
			t.Run(tt.name+" json="+strconv.FormatBool(asJSON), func(t *testing.T) {
				ts := startServer(t)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				// The interrupt comes once requests flow (in the window, or
				// in the warmup), not at a time that a loaded machine
				// could reach before the run starts.
				go func() {
					for len(ts.broker.encodeCalls()) < 3 && ctx.Err() == nil {
						time.Sleep(time.Millisecond)
					}
					cancel()
				}()
				args := append([]string{"bench", "--duration", "20s", "--concurrency", "2,4"}, tt.args...)
				if asJSON {
					args = append(args, "--json")
				}
				start := time.Now()
				r := runWith(ctx, nil, map[string]string{endpoint.EnvSocket: ts.socket}, args...)
				if took := time.Since(start); took > 5*time.Second {
					t.Errorf("bench took %s after the interrupt", took)
				}
				if r.code != ExitError || !strings.Contains(r.stderr, "brokerctl: bench: interrupted; the results above are partial\n") {
					t.Fatalf("got %v", r)
				}
				if !asJSON {
					table := benchTableLines(t, r.stdout+"\n")
					if n := strings.Count(table, "\n") - 1; n != tt.wantLevels {
						t.Errorf("%d rows, want %d:\n%s", n, tt.wantLevels, r.stdout)
					}
					if tt.wantLevels > 0 && !strings.Contains(r.stdout, "\n2*  ") {
						t.Errorf("the interrupted level is not marked:\n%s", r.stdout)
					}
					if !strings.Contains(r.stdout, "* interrupted: the window was cut short") {
						t.Errorf("no interrupted note:\n%s", r.stdout)
					}
					return
				}
				rep := parseBench(t, r.stdout)
				if !rep.Interrupted || len(rep.Levels) != tt.wantLevels {
					t.Fatalf("interrupted %v with %d levels, want true with %d", rep.Interrupted, len(rep.Levels), tt.wantLevels)
				}
				if tt.wantLevels == 0 {
					return
				}
				e := rep.Levels[0].Encode
				// The window ends at the interrupt, long before its 20 s,
				// and holds the requests that flowed before it.
				if !e.Interrupted || e.WindowSeconds <= 0 || e.WindowSeconds >= 20 || e.Requests == 0 ||
					math.Abs(e.RequestsPerSecond-float64(e.Requests)/e.WindowSeconds) > 1e-9*e.RequestsPerSecond {
					t.Errorf("interrupted level %+v: want a window cut short by the interrupt, with requests", e)
				}
				if len(e.Failures) != 0 {
					t.Errorf("requests aborted by the interrupt counted as failures: %v", e.Failures)
				}
			})
		}
	}
}

// TestBenchTimeout checks that --timeout bounds each request of bench, not
// the whole run, and that expired requests show as DEADLINE_EXCEEDED.
func TestBenchTimeout(t *testing.T) {
	// No assertion rests on a request finishing within its timeout on a
	// busy machine: the first case's timeout is far above an in-process
	// request, and it only needs some requests through; the second's
	// requests take four times their timeout.
	tests := []struct {
		name         string
		delay        time.Duration
		timeout      string
		wantFailures bool
	}{
		{name: "run outlasts --timeout", delay: 0, timeout: "300ms"},
		{name: "slow requests expire", delay: 200 * time.Millisecond, timeout: "50ms", wantFailures: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t)
			ts.broker.encodeDelay = tt.delay
			r := ts.run(t, nil, "bench", "--json", "--timeout", tt.timeout, "--duration", "400ms", "--warmup", "0", "--concurrency", "2", "--max-failure-rate", "1")
			if r.code != ExitOK {
				t.Fatalf("got %v", r)
			}
			e := parseBench(t, r.stdout).Levels[0].Encode
			if e.WindowSeconds != 0.4 || e.Interrupted {
				t.Errorf("window %v interrupted %v: the run was cut short", e.WindowSeconds, e.Interrupted)
			}
			if tt.wantFailures {
				if e.Requests != 0 || e.Failures["DEADLINE_EXCEEDED"] == 0 || e.Failures["DEADLINE_EXCEEDED"] != e.FailedRequests {
					t.Errorf("requests %d failures %v: want only DEADLINE_EXCEEDED", e.Requests, e.Failures)
				}
			} else if e.Requests == 0 || e.Failures["DEADLINE_EXCEEDED"] != e.FailedRequests {
				// A request slower than its timeout on a loaded machine
				// is DEADLINE_EXCEEDED, and the run goes on.
				t.Errorf("requests %d failures %v: want requests through, and failures only DEADLINE_EXCEEDED", e.Requests, e.Failures)
			}
		})
	}
}

func TestBenchErrors(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantStderr string
	}{
		{name: "zero concurrency", args: []string{"--concurrency", "1,0"}, wantStderr: "brokerctl: bench: invalid value \"1,0\" for flag -concurrency: \"0\" is not a positive integer\n"},
		{name: "not a number", args: []string{"--concurrency", "8,x"}, wantStderr: "brokerctl: bench: invalid value \"8,x\" for flag -concurrency"},
		{name: "zero duration", args: []string{"--duration", "0s"}, wantStderr: "brokerctl: bench: --duration 0s: must be positive\n"},
		{name: "negative warmup", args: []string{"--warmup", "-1s"}, wantStderr: "brokerctl: bench: --warmup -1s: must not be negative\n"},
		{name: "no items", args: []string{"--items-per-request", "0"}, wantStderr: "brokerctl: bench: --items-per-request 0: must be at least 1\n"},
		{name: "no text", args: []string{"--text-bytes", "0"}, wantStderr: "brokerctl: bench: --text-bytes 0: must be at least 1\n"},
		{name: "bad fidelity", args: []string{"--fidelity", "fast"}, wantStderr: "brokerctl: bench: --fidelity \"fast\": want semantic, lossless or both\n"},
		{name: "no connections", args: []string{"--connections", "0"}, wantStderr: "brokerctl: bench: --connections 0: must be at least 1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startServer(t)
			r := ts.run(t, nil, append([]string{"bench", "--duration", "100ms"}, tt.args...)...)
			if r.code != ExitUsage || !strings.HasPrefix(r.stderr, tt.wantStderr) || r.stdout != "" {
				t.Errorf("got %v\nwant exit 2, stderr starting %q", r, tt.wantStderr)
			}
			if n := ts.callCount(encodeMethod) + ts.callCount(checkMethod); n != 0 {
				t.Errorf("%d calls reached the server", n)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		missing := t.TempDir() + "/missing.sock"
		r := runMain(t, map[string]string{endpoint.EnvSocket: missing}, "bench", "--duration", "100ms")
		if r.code != ExitError || !strings.HasPrefix(r.stderr, "brokerctl: bench: cannot reach brokerd at socket "+missing) || r.stdout != "" {
			t.Errorf("got %v", r)
		}
	})
}

func TestNearestRank(t *testing.T) {
	seq := func(n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = time.Duration(i + 1)
		}
		return out
	}
	tests := []struct {
		n, p int
		want time.Duration
	}{
		{n: 0, p: 50, want: 0},
		{n: 1, p: 50, want: 1},
		{n: 1, p: 99, want: 1},
		{n: 3, p: 50, want: 2},   // ceil(1.5) = 2
		{n: 4, p: 50, want: 2},   // ceil(2) = 2: exact ranks do not round up
		{n: 10, p: 95, want: 10}, // ceil(9.5)
		{n: 10, p: 1, want: 1},
		{n: 100, p: 95, want: 95},
		{n: 100, p: 99, want: 99},
		{n: 100, p: 100, want: 100},
		{n: 1000, p: 99, want: 990},
		{n: 1001, p: 99, want: 991}, // ceil(990.99)
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.n)+"/p"+strconv.Itoa(tt.p), func(t *testing.T) {
			if got := nearestRank(seq(tt.n), tt.p); got != tt.want {
				t.Errorf("nearestRank(1..%d, %d) = %d, want %d", tt.n, tt.p, got, tt.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	lat := []time.Duration{4 * time.Millisecond, time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}
	got := summarize(lat)
	want := latencyReport{Min: 1, Mean: 2.5, P50: 2, P95: 4, P99: 4, Max: 4}
	if got != want {
		t.Errorf("summarize = %+v, want %+v", got, want)
	}
	if (summarize(nil) != latencyReport{}) {
		t.Errorf("summarize(nil) = %+v, want zeros", summarize(nil))
	}
}

func TestTextGen(t *testing.T) {
	maxWord := 0
	for _, w := range benchWords {
		maxWord = max(maxWord, len(w))
	}
	tests := []struct {
		name string
		size int
	}{
		{name: "one byte", size: 1},
		{name: "short", size: 12},
		{name: "default", size: 64},
		{name: "long", size: 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newTextGen(7, 0, 3), newTextGen(7, 0, 3)
			other := newTextGen(7, 1, 3)
			seen := map[string]bool{}
			for i := range 200 {
				s := a.text(tt.size)
				if s != b.text(tt.size) {
					t.Fatalf("text %d differs between two generators with the same seed", i)
				}
				if s == other.text(tt.size) && tt.size >= 64 {
					t.Errorf("text %d equals the other level's: %q", i, s)
				}
				if len(s) > tt.size || len(s) == 0 || (tt.size > maxWord+2 && len(s) < tt.size-maxWord-2) {
					t.Errorf("len(%q) = %d, want about %d", s, len(s), tt.size)
				}
				if !unicode.IsUpper(rune(s[0])) {
					t.Errorf("%q does not start a sentence", s)
				}
				if strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsLetter(r) && r != ' ' && r != '.' }) {
					t.Errorf("%q has characters other than letters, spaces and periods", s)
				}
				seen[s] = true
			}
			// Texts vary from request to request; short ones (a word or
			// two) may repeat by chance.
			if tt.size >= 64 && len(seen) != 200 {
				t.Errorf("%d distinct texts of 200", len(seen))
			}
		})
	}
}

// TestBenchFailureRate: a run where most requests fail exits 1, and the
// clients back off while the server answers UNAVAILABLE instead of
// hammering it.
func TestBenchFailureRate(t *testing.T) {
	ts := startServer(t)
	ts.broker.failEvery = 1 // every call fails with UNAVAILABLE
	r := ts.run(t, nil, "bench", "--json", "--duration", "300ms", "--warmup", "0", "--concurrency", "2")
	if r.code != ExitError || !strings.Contains(r.stderr, "100.0% of the requests at concurrency 2 failed") {
		t.Fatalf("got %v", r)
	}
	// Doubling from 5 ms up to 1 s, two clients fail at most ~2×7 times
	// in 300 ms; without backoff they fail thousands of times.
	if n := len(ts.broker.encodeCalls()); n > 40 {
		t.Errorf("%d calls in 300 ms against an unavailable server: no backoff", n)
	}
	ts.broker.failEvery = 0
	if r := ts.run(t, nil, "bench", "--duration", "100ms", "--warmup", "0", "--concurrency", "1"); r.code != ExitOK {
		t.Errorf("a clean run: %v", r)
	}
}
