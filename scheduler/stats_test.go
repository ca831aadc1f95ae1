package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
)

// The prometheus testutil package needs github.com/kylelemons/godebug,
// which this module does not carry, so the test reads the registry through
// Gather and lints with promlint, which testutil.GatherAndLint wraps.

// series returns the gathered sample of name whose labels include want, or
// nil when there is none.
func series(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

// value is a counter's or gauge's value (0 when absent); for a histogram,
// its sample count.
func value(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	m := series(t, reg, name, want)
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	t.Fatalf("%s: unexpected metric type", name)
	return 0
}

// TestMetrics checks the brokerd_ series are registered and move.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newTestScheduler(t, Options{Registerer: reg})
	f := newFake("gpu:0")
	f.sleep = 2 * time.Millisecond
	f.hold = make(chan struct{})
	mustAdd(t, s, "m", Device{ID: "gpu:0", Type: "gpu", CostPerHour: 3600}, 4, f)
	ctx := context.Background()
	md := []string{"model", "m", "device", "gpu:0"}

	warm := submitAsync(ctx, s, Request{Model: "m", Inputs: []any{"warm"}})
	waitEntered(t, f)
	queued := submitAsync(ctx, s, Request{Model: "m", Inputs: inputs("q", 6)})
	waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == 6 })
	if got := value(t, reg, "brokerd_queue_depth_items", "model", "m"); got != 6 {
		t.Errorf("queue depth while held = %v, want 6", got)
	}
	if got := value(t, reg, "brokerd_running_batches", md...); got != 1 {
		t.Errorf("running batches while held = %v, want 1", got)
	}
	close(f.hold)
	for _, ch := range []<-chan submitted{warm, queued} {
		if r := recv(t, ch); r.err != nil {
			t.Fatal(r.err)
		}
	}
	if _, err := s.Submit(ctx, Request{Model: "m", DeviceType: "tpu", Inputs: []any{1}}); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("err = %v, want ErrNoDevice", err)
	}
	expired, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Submit(expired, Request{Model: "m", Inputs: []any{1}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want Canceled", err)
	}

	// Batches: [1] then [4, 2]; requests: warm and queued.
	cases := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"brokerd_items_completed_total", md, 7},
		{"brokerd_queue_depth_items", []string{"model", "m"}, 0},
		{"brokerd_running_batches", md, 0},
		{"brokerd_request_failures_total", []string{"model", "m", "reason", ReasonRejected}, 1},
		{"brokerd_request_failures_total", []string{"model", "m", "reason", ReasonCancelled}, 1},
		{"brokerd_batch_size", md, 3},
		{"brokerd_compute_duration_seconds", md, 3},
		{"brokerd_queue_duration_seconds", md, 7}, // per item
		{"brokerd_request_duration_seconds", md, 2},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.name, tc.labels), func(t *testing.T) {
			if got := value(t, reg, tc.name, tc.labels...); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	// $1/s over 3 batches of at least 2ms each.
	if c := value(t, reg, "brokerd_cost_usd_total", md...); c < 0.006 {
		t.Errorf("cost total $%v, want at least $0.006", c)
	}
	if m := series(t, reg, "brokerd_batch_size", map[string]string{"model": "m"}); m.GetHistogram().GetSampleSum() != 7 {
		t.Errorf("batch size sum = %v, want 7 items", m.GetHistogram().GetSampleSum())
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if problems, err := promlint.NewWithMetricFamilies(mfs).Lint(); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %v", problems, err)
	}

	// A second scheduler on the same registry shares the series.
	s2 := newTestScheduler(t, Options{Registerer: reg})
	mustAdd(t, s2, "m", Device{ID: "gpu:0", Type: "gpu"}, 4, newFake("gpu:0"))
	if _, err := s2.Submit(ctx, Request{Model: "m", Inputs: []any{"again"}}); err != nil {
		t.Fatal(err)
	}
	if got := value(t, reg, "brokerd_items_completed_total", md...); got != 8 {
		t.Errorf("items completed after a second scheduler = %v, want 8", got)
	}
}

// TestStats checks the model and replica rows.
func TestStats(t *testing.T) {
	s := newTestScheduler(t, Options{})
	fc, fg := newFake("cpu:0"), newFake("gpu:0")
	fc.sleep = time.Millisecond
	fg.hold = make(chan struct{})
	mustAdd(t, s, "m", cpu0, 4, fc)
	mustAdd(t, s, "m", gpu0, 8, fg)
	ctx := context.Background()

	held := submitAsync(ctx, s, Request{Model: "m", DeviceID: "gpu:0", Inputs: inputs("held", 3)})
	waitEntered(t, fg)
	pinned := submitAsync(ctx, s, Request{Model: "m", DeviceID: "gpu:0", Inputs: inputs("pinned", 2)})
	waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == 2 })
	for i := range 10 {
		if _, err := s.Submit(ctx, Request{Model: "m", DeviceType: "cpu", Inputs: inputs(string(rune('a'+i)), 2)}); err != nil {
			t.Fatal(err)
		}
	}
	rows := s.Stats("m")
	if len(rows) != 3 || rows[0].DeviceID != "" || rows[1].DeviceID != "cpu:0" || rows[2].DeviceID != "gpu:0" {
		t.Fatalf("rows %+v: want the model row, then cpu:0, gpu:0", rows)
	}
	model, cpu, gpu := rows[0], rows[1], rows[2]
	cases := []struct {
		name      string
		got, want int64
	}{
		{"model queued", model.Queued, 2},
		{"model running", model.Running, 3},
		{"model completed", model.Completed, 20},
		{"cpu queued (pinned to gpu:0)", cpu.Queued, 0},
		{"gpu queued", gpu.Queued, 2},
		{"gpu running", gpu.Running, 3},
		{"cpu completed", cpu.Completed, 20},
		{"cpu batches", cpu.Batches, 10},
		{"cpu latency window", int64(cpu.Latency.Count), 10},
		{"gpu latency window", int64(gpu.Latency.Count), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %d, want %d", tc.got, tc.want)
			}
		})
	}
	l := cpu.Latency
	if cpu.MeanBatchSize != 2 || cpu.ItemsPerSecond <= 0 || l.P50 <= 0 || l.P50 > l.P95 || l.P95 > l.P99 || l.Mean <= 0 {
		t.Errorf("cpu row %+v: want mean batch 2, positive throughput, ordered quantiles", cpu)
	}
	if !cpu.Healthy || cpu.MaxBatch != 4 || cpu.DeviceType != "cpu" {
		t.Errorf("cpu row %+v", cpu)
	}
	// Totals: the 10 CPU requests succeeded (2 items each, 1 ms compute
	// or more per batch); the held and pinned ones are still running.
	tot := model.Totals
	if tot.Succeeded != 10 || tot.Failed != 0 || tot.ComputeTime < 10*time.Millisecond || tot.SuccessTime < tot.ComputeTime ||
		tot.QueueTime < 0 || tot.LastSuccess.IsZero() {
		t.Errorf("model totals %+v", tot)
	}
	if b := tot.BatchesBySize[2]; b.Count != 10 || b.Compute < 10*time.Millisecond || len(tot.BatchesBySize) != 1 {
		t.Errorf("batches by size %+v: want 10 batches of 2", tot.BatchesBySize)
	}
	if all := s.Stats(""); len(all) != 3 {
		t.Errorf("Stats(\"\") has %d rows, want 3", len(all))
	}
	if none := s.Stats("nope"); len(none) != 0 {
		t.Errorf("Stats of an unknown model: %+v", none)
	}
	close(fg.hold)
	recv(t, held)
	recv(t, pinned)
}

func TestQuantile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	cases := []struct {
		name   string
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{"single", ms(7), 0.99, 7 * time.Millisecond},
		{"median of 4", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", ms(seq(100)...), 0.99, 99 * time.Millisecond},
		{"p95 of 20", ms(seq(20)...), 0.95, 19 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := quantile(tc.sorted, tc.q); got != tc.want {
				t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}

// seq is 1..n.
func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// TestLatencyRingWindow checks that only the last latencyWindow samples count.
func TestLatencyRingWindow(t *testing.T) {
	var l latencyRing
	for i := range latencyWindow + 10 {
		l.add(time.Duration(i))
	}
	sum := l.summary()
	if sum.Count != latencyWindow || sum.P50 < 10 {
		t.Errorf("summary %+v: want %d samples, none of the first 10", sum, latencyWindow)
	}
}

// TestRecentRate: RecentItemsPerSecond is what completed in the last
// RateWindow (an idle model reads 0), unlike the busy throughput.
func TestRecentRate(t *testing.T) {
	var w rateWindow
	t0 := time.Unix(1_000_000, 0)
	for i := range 5 { // 100 items a second for 5 seconds
		w.add(100, t0.Add(time.Duration(i)*time.Second))
	}
	tests := []struct {
		at   time.Duration
		want float64
	}{
		{4 * time.Second, 50},                  // 500 items in the 10 s window
		{9 * time.Second, 50},                  // still all inside
		{11 * time.Second, 30},                 // the first two seconds aged out
		{20 * time.Second, 0},                  // idle
		{-time.Duration(1e6) * time.Second, 0}, // clock before the samples
	}
	for _, tc := range tests {
		if got := w.rate(t0.Add(tc.at)); got != tc.want {
			t.Errorf("at +%v: %v items/s, want %v", tc.at, got, tc.want)
		}
	}
	w.add(10, t0.Add(25*time.Second)) // a bucket reused after its second passed
	if got := w.rate(t0.Add(25 * time.Second)); got != 1 {
		t.Errorf("after reuse: %v, want 1", got)
	}
}

// countedSpec is a specGen that counts the guesses its results report run
// and kept, as the engine would report them.
type countedSpec struct {
	*specGen
	drafted, accepted atomic.Int64
}

func (c *countedSpec) Step(ctx context.Context, items []StepItem) ([]StepResult, error) {
	res, err := c.specGen.Step(ctx, items)
	for _, r := range res {
		c.drafted.Add(int64(r.Drafted))
		c.accepted.Add(int64(len(r.Accepted)))
	}
	return res, err
}

// TestGeneratorSpecDecodeStats: each replica's Stats row counts the
// guessed tokens its steps ran and those kept, as its executor reported
// them and as the metrics count them; the model's row sums its replicas'
// and keeps a removed replica's.
func TestGeneratorSpecDecodeStats(t *testing.T) {
	for _, tc := range []struct {
		name   string
		accept int
	}{
		{"none taken", 0},
		{"some taken", 2},
		{"all taken", 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s := newTestScheduler(t, Options{Registerer: reg})
			execs := map[string]*countedSpec{}
			for _, dev := range []string{"cpu:0", "cpu:1"} {
				execs[dev] = &countedSpec{specGen: &specGen{fakeGen: newFakeGen(4, 256), accept: tc.accept}}
				opts := GenOptions{MaxRunning: 4, MaxStepTokens: 64, MaxChunk: 16, SpecTokens: 4, SpecMaxRunning: 4}
				if err := s.AddGenReplica("llm", Device{ID: dev, Type: "cpu"}, opts, execs[dev]); err != nil {
					t.Fatal(err)
				}
			}
			runGen(t, s, "llm", genCases(12), 0)
			row, reps := genRows(t, s, "llm")
			var drafted, accepted int64
			for _, r := range reps {
				f := execs[r.DeviceID]
				g := r.Gen
				if g.DraftTokens != f.drafted.Load() || g.AcceptedTokens != f.accepted.Load() {
					t.Errorf("%s: row %d drafted, %d accepted; the executor reported %d, %d", r.DeviceID, g.DraftTokens, g.AcceptedTokens, f.drafted.Load(), f.accepted.Load())
				}
				if m := value(t, reg, "brokerd_generation_spec_decode_draft_tokens_total", "model", "llm", "device", r.DeviceID); int64(m) != g.DraftTokens {
					t.Errorf("%s: row %d drafted, metric %g", r.DeviceID, g.DraftTokens, m)
				}
				if m := value(t, reg, "brokerd_generation_spec_decode_accepted_tokens_total", "model", "llm", "device", r.DeviceID); int64(m) != g.AcceptedTokens {
					t.Errorf("%s: row %d accepted, metric %g", r.DeviceID, g.AcceptedTokens, m)
				}
				drafted += g.DraftTokens
				accepted += g.AcceptedTokens
			}
			if drafted == 0 || (tc.accept == 0) != (accepted == 0) || accepted > drafted {
				t.Errorf("replicas' rows: %d drafted, %d accepted (guesses taken %d of each)", drafted, accepted, tc.accept)
			}
			if row.Gen.DraftTokens != drafted || row.Gen.AcceptedTokens != accepted {
				t.Errorf("model row: %d drafted, %d accepted; its replicas' %d, %d", row.Gen.DraftTokens, row.Gen.AcceptedTokens, drafted, accepted)
			}
			if err := s.RemoveReplica(t.Context(), "llm", "cpu:1"); err != nil {
				t.Fatal(err)
			}
			if row, _ := genRows(t, s, "llm"); row.Gen.DraftTokens != drafted || row.Gen.AcceptedTokens != accepted {
				t.Errorf("model row after a replica left: %d drafted, %d accepted; want %d, %d", row.Gen.DraftTokens, row.Gen.AcceptedTokens, drafted, accepted)
			}
		})
	}
}
