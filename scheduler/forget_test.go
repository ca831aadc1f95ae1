package scheduler

import (
	"context"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// seriesOf lists "metric{device}" for every gathered series whose model
// label is model.
func seriesOf(t *testing.T, reg *prometheus.Registry, model string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["model"] == model {
				out = append(out, mf.GetName()+"{"+labels["device"]+"}")
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestRemovedReplicasLeaveNoSeries: after a hot reload the old instance's
// series (its model label is its own serving key) stayed in /metrics with
// their last values for as long as brokerd ran. A removed replica's
// (model, device) series go with it, and the model's own (queue depth,
// failures, waiting sequences) once no replica serves that key; the
// replicas still serving keep theirs.
func TestRemovedReplicasLeaveNoSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newTestScheduler(t, Options{Registerer: reg})
	ctx := context.Background()
	gpu := Device{ID: "gpu:0", Type: "gpu"}
	mustAdd(t, s, "m@1", cpu0, 4, newFake("cpu:0"))
	mustAdd(t, s, "m@1", gpu, 4, newFake("gpu:0"))
	for _, dev := range []string{"cpu:0", "gpu:0"} {
		if _, err := s.Submit(ctx, Request{Model: "m@1", DeviceID: dev, Inputs: []any{1}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Submit(ctx, Request{Model: "m@1", DeviceType: "tpu", Inputs: []any{1}}); err == nil {
		t.Fatal("a request pinned to a type no replica runs on was served")
	}
	// The reload's new instance, under its own key.
	mustAdd(t, s, "m@1.r1", cpu0, 4, newFake("cpu:0"))
	if _, err := s.Submit(ctx, Request{Model: "m@1.r1", Inputs: []any{1}}); err != nil {
		t.Fatal(err)
	}
	before := seriesOf(t, reg, "m@1")
	if !slices.Contains(before, "brokerd_items_completed_total{cpu:0}") || !slices.Contains(before, "brokerd_request_failures_total{}") {
		t.Fatalf("series before the removal: %v", before)
	}
	newBefore := seriesOf(t, reg, "m@1.r1")

	if err := s.RemoveReplica(ctx, "m@1", "cpu:0"); err != nil {
		t.Fatal(err)
	}
	for _, got := range seriesOf(t, reg, "m@1") {
		if got[len(got)-len("{cpu:0}"):] == "{cpu:0}" {
			t.Errorf("removed replica's series %s is still exported", got)
		}
	}
	if got := seriesOf(t, reg, "m@1"); !slices.Contains(got, "brokerd_items_completed_total{gpu:0}") || !slices.Contains(got, "brokerd_queue_depth_items{}") {
		t.Errorf("the replica still serving lost its series: %v", got)
	}
	if err := s.RemoveReplica(ctx, "m@1", "gpu:0"); err != nil {
		t.Fatal(err)
	}
	if got := seriesOf(t, reg, "m@1"); len(got) != 0 {
		t.Errorf("series of the retired instance m@1: %v", got)
	}
	if got := seriesOf(t, reg, "m@1.r1"); !slices.Equal(got, newBefore) {
		t.Errorf("the new instance's series changed: %v, were %v", got, newBefore)
	}

	// Generators too.
	if err := s.AddGenReplica("llm@1", cpu0, GenOptions{MaxRunning: 2, MaxStepTokens: 64}, newFakeGen(16, 64)); err != nil {
		t.Fatal(err)
	}
	st, err := s.Generate(ctx, GenRequest{Model: "llm@1", Prompt: prompt(1, 5), MaxNewTokens: 3, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(st); r.err != nil {
		t.Fatal(r.err)
	}
	if got := seriesOf(t, reg, "llm@1"); !slices.Contains(got, "brokerd_generation_generated_tokens_total{cpu:0}") ||
		!slices.Contains(got, "brokerd_generation_waiting_sequences{}") {
		t.Fatalf("generator series: %v", got)
	}
	if err := s.RemoveReplica(ctx, "llm@1", "cpu:0"); err != nil {
		t.Fatal(err)
	}
	if got := seriesOf(t, reg, "llm@1"); len(got) != 0 {
		t.Errorf("series of the removed generator: %v", got)
	}

	// Unloaded and loaded again under the same key: the series come back
	// with the new replica.
	mustAdd(t, s, "m@1", cpu0, 4, newFake("cpu:0"))
	if _, err := s.Submit(ctx, Request{Model: "m@1", Inputs: []any{1}}); err != nil {
		t.Fatal(err)
	}
	if got := seriesOf(t, reg, "m@1"); !slices.Contains(got, "brokerd_items_completed_total{cpu:0}") {
		t.Errorf("series of m@1 served again: %v", got)
	}
}
