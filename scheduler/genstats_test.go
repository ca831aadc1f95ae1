package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// genRows returns the model row and the replica rows of a generator.
func genRows(t *testing.T, s *Scheduler, key string) (QueueStats, []QueueStats) {
	t.Helper()
	rows := s.Stats(key)
	if len(rows) == 0 || rows[0].DeviceID != "" {
		t.Fatalf("stats of %q: %+v", key, rows)
	}
	for _, r := range rows {
		if r.Gen == nil {
			t.Fatalf("a generator row without Gen: %+v", r)
		}
	}
	return rows[0], rows[1:]
}

// TestGeneratorStats: with 8 sequences generating, Stats shows the
// generator (it showed no row at all): running and waiting sequences,
// tokens per second over the last 10 s, TTFT and inter-token quantiles, KV
// blocks, under the model version's name (WithName), never its queue key;
// the model-server protocol's gauges and the finish-reason counter and
// end-to-end histogram agree. A fake clock that each step moves by
// exactly 100 ms makes every duration exact.
func TestGeneratorStats(t *testing.T) {
	clock := &fakeClock{}
	clock.ns.Store(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	reg := prometheus.NewRegistry()
	s := newTestScheduler(t, Options{Now: clock.Now, Registerer: reg})
	f := newFakeGen(4, 64)
	gate := make(chan struct{})
	f.hold = gate
	f.entered = make(chan struct{}, 1)
	f.advance = func() { clock.Advance(100 * time.Millisecond) }
	f.hits = 12
	const key, name = "llm@1.r3", "llm@1"
	if err := s.AddGenReplica(key, Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 8, MaxStepTokens: 256}, f, WithName(name)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n, maxNew = 8, 5
	streams := make([]*GenStream, n)
	promptTokens := 0
	for i := range n {
		p := prompt(i, 3+i)
		promptTokens += len(p)
		st, err := s.Generate(ctx, GenRequest{Model: key, Client: fmt.Sprint("c", i), Prompt: p, MaxNewTokens: maxNew, State: &genState{}})
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
	}
	// The first step (held) has some of them; the second admits the rest,
	// and its plan's KV sample is taken before the step starts.
	<-f.entered
	gate <- struct{}{}
	<-f.entered

	row, reps := genRows(t, s, key)
	if row.Running != n {
		t.Fatalf("%d running in the second step, want %d", row.Running, n)
	}
	if row.Model != name || len(reps) != 1 || reps[0].Model != name {
		t.Fatalf("rows named %q and %+v, want %q", row.Model, reps, name)
	}
	used := f.blocksUsed()
	if row.Queued != 0 || row.Gen.KV != (KVCache{UsedBlocks: used, TotalBlocks: 64, PrefixHitTokens: 12}) || reps[0].Gen.KV != row.Gen.KV || reps[0].Running != n || reps[0].MaxBatch != 8 {
		t.Errorf("while running: queued %d, KV %+v (replica %+v), want 0 and {%d 64}; replica running %d, max %d",
			row.Queued, row.Gen.KV, reps[0].Gen.KV, used, reps[0].Running, reps[0].MaxBatch)
	}
	gauges := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"brokerd_generation_model_running_sequences", []string{"model", name}, n},
		{"brokerd_generation_waiting_sequences", []string{"model", name}, 0},
		{"brokerd_generation_running_sequences", []string{"model", name, "device", "cpu:0"}, n},
		{"brokerd_generation_kv_cache_usage_ratio", []string{"model", name}, float64(used) / 64},
		{"brokerd_generation_kv_cache_blocks", []string{"model", name, "device", "cpu:0", "state", "used"}, float64(used)},
		{"brokerd_generation_kv_cache_blocks", []string{"model", name, "device", "cpu:0", "state", "total"}, 64},
		{"brokerd_generation_prefix_cache_hit_tokens_total", []string{"model", name, "device", "cpu:0"}, 12},
	}
	for _, g := range gauges {
		if got := value(t, reg, g.name, g.labels...); got != g.want {
			t.Errorf("%s%v = %v, want %v", g.name, g.labels, got, g.want)
		}
	}
	if used == 0 {
		t.Fatal("no KV blocks held while 8 sequences run")
	}

	stop := feedSteps(gate)
	var ttft, total latencyRing
	for _, st := range streams {
		r := collect(st)
		if r.err != nil || r.finish != FinishLength || len(r.tokens) != maxNew {
			t.Fatalf("stream: %d tokens, finish %q, err %v", len(r.tokens), r.finish, r.err)
		}
		ttft.add(r.info.TimeToFirstToken)
		total.add(r.info.Total)
	}
	stop()
	waitFor(t, "the cache freed", func() bool { return f.blocksUsed() == 0 })
	waitFor(t, "the last sample", func() bool { row, _ := genRows(t, s, key); return row.Gen.KV.UsedBlocks == 0 })

	f.mu.Lock()
	steps, stepSeqs := len(f.steps), 0
	for _, ids := range f.steps {
		stepSeqs += len(ids)
	}
	f.mu.Unlock()
	ms := 100 * time.Millisecond
	row, reps = genRows(t, s, key)
	for _, r := range []QueueStats{row, reps[0]} {
		g := r.Gen
		if r.Completed != n || r.Running != 0 || r.Queued != 0 || r.Batches != int64(steps) ||
			r.MeanBatchSize != float64(stepSeqs)/float64(steps) || !r.Healthy {
			t.Errorf("%s row: completed %d, running %d, queued %d, steps %d (want %d), mean batch %v, healthy %v",
				r.DeviceID, r.Completed, r.Running, r.Queued, r.Batches, steps, r.MeanBatchSize, r.Healthy)
		}
		if g.GeneratedTokens != n*maxNew || g.PromptTokens != int64(promptTokens) || g.Preemptions != 0 {
			t.Errorf("%s row: %d generated, %d prompt, %d preemptions; want %d, %d, 0", r.DeviceID, g.GeneratedTokens, g.PromptTokens, g.Preemptions, n*maxNew, promptTokens)
		}
		// Every step took 100 ms, so every gap between tokens did.
		if g.InterToken != (LatencySummary{Mean: ms, P50: ms, P95: ms, P99: ms, Count: n * (maxNew - 1)}) {
			t.Errorf("%s row: inter-token %+v", r.DeviceID, g.InterToken)
		}
		if g.TimeToFirstToken != ttft.summary() || r.Latency != total.summary() {
			t.Errorf("%s row: TTFT %+v, want %+v from the streams; latency %+v, want %+v", r.DeviceID, g.TimeToFirstToken, ttft.summary(), r.Latency, total.summary())
		}
		// Everything happened within the last 10 s of the fake clock.
		if g.OutputTokensPerSecond != n*maxNew/RateWindow.Seconds() || g.PromptTokensPerSecond != float64(promptTokens)/RateWindow.Seconds() ||
			r.RecentItemsPerSecond != n/RateWindow.Seconds() {
			t.Errorf("%s row: %v output and %v prompt tokens/s, %v sequences/s", r.DeviceID, g.OutputTokensPerSecond, g.PromptTokensPerSecond, r.RecentItemsPerSecond)
		}
		if g.KV != (KVCache{TotalBlocks: 64, PrefixHitTokens: 12}) {
			t.Errorf("%s row: KV %+v after the sequences ended", r.DeviceID, g.KV)
		}
	}
	if got := value(t, reg, "brokerd_generation_request_success_total", "model", name, "finished_reason", FinishLength); got != n {
		t.Errorf("request_success_total{length} = %v, want %d", got, n)
	}
	e2e := series(t, reg, "brokerd_generation_e2e_request_latency_seconds", map[string]string{"model": name})
	if e2e == nil || e2e.GetHistogram().GetSampleCount() != n {
		t.Errorf("e2e latency histogram: %v", e2e)
	}
	if got := value(t, reg, "brokerd_generation_kv_cache_usage_ratio", "model", name); got != 0 {
		t.Errorf("KV usage after the sequences ended = %v", got)
	}
	if got := seriesOf(t, reg, key); len(got) != 0 {
		t.Errorf("series labelled with the queue key: %v", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if problems, err := promlint.NewWithMetricFamilies(mfs).Lint(); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %v", problems, err)
	}

	// Ten seconds later the rates are back to 0; the totals stay.
	clock.Advance(RateWindow + time.Second)
	row, _ = genRows(t, s, key)
	if row.Gen.OutputTokensPerSecond != 0 || row.Gen.PromptTokensPerSecond != 0 || row.RecentItemsPerSecond != 0 || row.Gen.GeneratedTokens != n*maxNew {
		t.Errorf("11 s later: %+v, %+v", row, row.Gen)
	}
}

// TestGeneratorPreemptionsAndHealth: preemptions show in both rows as in
// the counter; a failing generator replica is unhealthy in its rows and in
// Health, which counted batch replicas only.
func TestGeneratorPreemptionsAndHealth(t *testing.T) {
	t.Run("preemptions", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		s := newTestScheduler(t, Options{Registerer: reg})
		// Three sequences of 4 + 8 tokens need 9 blocks of 4 at the end;
		// 6 make one wait while the others grow.
		f := newFakeGen(4, 6)
		gate := make(chan struct{})
		f.hold = gate
		if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 3, MaxStepTokens: 64}, f); err != nil {
			t.Fatal(err)
		}
		var streams []*GenStream
		for i := range 3 {
			st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(i, 4), MaxNewTokens: 8, State: &genState{}})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, st)
		}
		stop := feedSteps(gate)
		defer stop()
		for _, st := range streams {
			if r := collect(st); r.err != nil || len(r.tokens) != 8 {
				t.Fatalf("%d tokens, %v", len(r.tokens), r.err)
			}
		}
		row, reps := genRows(t, s, "llm")
		metric := value(t, reg, "brokerd_generation_preemptions_total", "model", "llm", "device", "cpu:0")
		if row.Gen.Preemptions < 1 || float64(row.Gen.Preemptions) != metric || reps[0].Gen.Preemptions != row.Gen.Preemptions {
			t.Errorf("preemptions: model row %d, replica row %d, counter %v", row.Gen.Preemptions, reps[0].Gen.Preemptions, metric)
		}
	})
	t.Run("health", func(t *testing.T) {
		s := newTestScheduler(t, Options{UnhealthyAfter: 1, ProbeInterval: time.Hour})
		f := newFakeGen(4, 64)
		f.fail = func(int) error { return errors.New("device lost") }
		if err := s.AddGenReplica("llm", Device{ID: "gpu:0", Type: "gpu"}, GenOptions{MaxRunning: 2, MaxStepTokens: 64}, f); err != nil {
			t.Fatal(err)
		}
		st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(1, 4), MaxNewTokens: 3, State: &genState{}})
		if err != nil {
			t.Fatal(err)
		}
		if r := collect(st); !errors.Is(r.err, ErrBackend) {
			t.Fatalf("err = %v, want ErrBackend", r.err)
		}
		h := s.Health("gpu:0")
		if !h.Known || h.Healthy || h.ConsecutiveFailures != 1 || !strings.Contains(h.LastError, "device lost") || h.ProbeAt.IsZero() {
			t.Errorf("Health = %+v", h)
		}
		row, reps := genRows(t, s, "llm")
		if row.Healthy || reps[0].Healthy || reps[0].ConsecutiveFailures != 1 || reps[0].Failed[ReasonBackend] != 1 ||
			row.Failed[ReasonBackend] != 1 || row.Totals.Failed != 1 {
			t.Errorf("rows after a failure: model %+v, replica %+v", row, reps[0])
		}
		if h := s.Health("gpu:1"); h.Known || !h.Healthy {
			t.Errorf("Health of a device without replicas = %+v", h)
		}
	})
}

// TestInstancesShareTheirName: the instances of one model version (a hot
// reload queues the new one under a key of its own) show under one name
// in Stats and share their series, which stay while either serves on the
// device and go with the last; every series is labelled with the name.
func TestInstancesShareTheirName(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newTestScheduler(t, Options{Registerer: reg})
	ctx := context.Background()
	for _, key := range []string{"m@1", "m@1.r1"} {
		if err := s.AddReplica(key, cpu0, 4, newFake("cpu:0"), WithName("m@1")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Submit(ctx, Request{Model: key, Inputs: []any{1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddReplica("m@1.r1", Device{ID: "gpu:0", Type: "gpu"}, 4, newFake("gpu:0"), WithName("other")); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a replica naming its key otherwise: %v", err)
	}
	for _, row := range s.Stats("") {
		if row.Model != "m@1" {
			t.Errorf("row named %q", row.Model)
		}
	}
	if got := value(t, reg, "brokerd_items_completed_total", "model", "m@1", "device", "cpu:0"); got != 2 {
		t.Errorf("items completed = %v, want both instances' 2", got)
	}
	if err := s.RemoveReplica(ctx, "m@1", "cpu:0"); err != nil {
		t.Fatal(err)
	}
	if got := value(t, reg, "brokerd_items_completed_total", "model", "m@1", "device", "cpu:0"); got != 2 {
		t.Errorf("items completed after the old instance left = %v, want 2: the new one still serves there", got)
	}

	// Generators: the gauges sum the instances.
	for i, key := range []string{"g@1", "g@1.r1"} {
		if err := s.AddGenReplica(key, cpu0, GenOptions{MaxRunning: 2, MaxStepTokens: 64}, newFakeGen(4, 32*(i+1)), WithName("g@1")); err != nil {
			t.Fatal(err)
		}
	}
	if got := value(t, reg, "brokerd_generation_kv_cache_blocks", "model", "g@1", "device", "cpu:0", "state", "total"); got != 96 {
		t.Errorf("KV blocks of both instances = %v, want 96", got)
	}
	for _, key := range []string{"g@1", "g@1.r1"} {
		if err := s.RemoveReplica(ctx, key, "cpu:0"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RemoveReplica(ctx, "m@1.r1", "cpu:0"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"m@1", "g@1"} {
		if got := seriesOf(t, reg, name); len(got) != 0 {
			t.Errorf("series of %s after its last instance left: %v", name, got)
		}
	}
}

// typedGen is a fakeGen that reports its KV cache's type (KVCacheTyper).
type typedGen struct {
	*fakeGen
	dtype string
}

func (g typedGen) KVCacheDType() string { return g.dtype }

// TestGeneratorKVCacheType: each replica's row shows its executor's KV
// cache type from the moment it is added, and the model's row its
// replicas' distinct types in device order; an executor that does not say
// leaves its row's empty.
func TestGeneratorKVCacheType(t *testing.T) {
	s := newTestScheduler(t, Options{})
	for _, c := range []struct {
		dev  string
		exec GenExecutor
	}{
		{"gpu:0", typedGen{newFakeGen(4, 16), "bf16"}},
		{"cpu:0", typedGen{newFakeGen(4, 16), "q8_0"}},
		{"cpu:1", typedGen{newFakeGen(4, 16), "q8_0"}},
		{"cpu:2", newFakeGen(4, 16)},
	} {
		if err := s.AddGenReplica("llm", Device{ID: c.dev, Type: c.dev[:3]}, GenOptions{MaxRunning: 2, MaxStepTokens: 64}, c.exec); err != nil {
			t.Fatal(err)
		}
	}
	row, reps := genRows(t, s, "llm")
	if row.Gen.KV.DType != "q8_0,bf16" || row.Gen.KV.TotalBlocks != 64 {
		t.Errorf("model row KV %+v, want types q8_0,bf16 and 64 blocks", row.Gen.KV)
	}
	want := map[string]string{"cpu:0": "q8_0", "cpu:1": "q8_0", "cpu:2": "", "gpu:0": "bf16"}
	for _, r := range reps {
		if r.Gen.KV.DType != want[r.DeviceID] {
			t.Errorf("%s row: KV type %q, want %q", r.DeviceID, r.Gen.KV.DType, want[r.DeviceID])
		}
	}
}
