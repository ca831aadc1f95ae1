package scheduler

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// result is what fakeExec returns for one input: the input itself and the
// device that ran it, so tests can check order and that nothing mixed.
type result struct {
	In  any
	Dev string
}

// fakeExec is a hand-written Executor. It records every batch and how many
// times each input ran; it can sleep per batch, hold batches at a gate and
// fail on demand.
type fakeExec struct {
	dev   string
	sleep time.Duration
	// hold, when non-nil, makes every batch wait until it is closed.
	hold chan struct{}
	// fail makes every batch fail while true.
	fail atomic.Bool
	// advance, when set, runs inside each batch (a fake clock moving).
	advance func()

	entered chan int // batch sizes as batches start, when non-nil

	mu      sync.Mutex
	batches [][]any
	runs    map[any]int
	calls   int
}

func newFake(dev string) *fakeExec {
	return &fakeExec{dev: dev, runs: make(map[any]int), entered: make(chan int, 4096)}
}

func (f *fakeExec) Execute(ctx context.Context, inputs []any) ([]any, error) {
	f.mu.Lock()
	f.calls++
	f.batches = append(f.batches, append([]any(nil), inputs...))
	for _, in := range inputs {
		f.runs[in]++
	}
	f.mu.Unlock()
	select {
	case f.entered <- len(inputs):
	default:
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if f.sleep > 0 {
		time.Sleep(f.sleep)
	}
	if f.advance != nil {
		f.advance()
	}
	if f.fail.Load() {
		return nil, errors.New("fake device fault")
	}
	out := make([]any, len(inputs))
	for i, in := range inputs {
		out[i] = result{In: in, Dev: f.dev}
	}
	return out, nil
}

func (f *fakeExec) batchSizes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]int, len(f.batches))
	for i, b := range f.batches {
		out[i] = len(b)
	}
	return out
}

func (f *fakeExec) runCount(in any) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runs[in]
}

func (f *fakeExec) batchList() [][]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]any(nil), f.batches...)
}

func (f *fakeExec) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// waitEntered waits for the next batch to start on f.
func waitEntered(t *testing.T, f *fakeExec) int {
	t.Helper()
	select {
	case n := <-f.entered:
		return n
	case <-time.After(5 * time.Second):
		t.Fatalf("no batch started on %s", f.dev)
		return 0
	}
}

// inputs makes n distinct inputs tagged with prefix.
func inputs(prefix string, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s/%d", prefix, i)
	}
	return out
}

// checkOutputs verifies that out answers in, in order, each output being
// its own input's result.
func checkOutputs(t *testing.T, in, out []any) {
	t.Helper()
	if len(out) != len(in) {
		t.Fatalf("got %d outputs for %d inputs", len(out), len(in))
	}
	for i := range in {
		r, ok := out[i].(result)
		if !ok || r.In != in[i] {
			t.Fatalf("output %d = %v, want the result of %v", i, out[i], in[i])
		}
	}
}

// waitFor polls cond until it holds or 5 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// modelRow returns the model-wide Stats row of model.
func modelRow(t *testing.T, s *Scheduler, model string) QueueStats {
	t.Helper()
	for _, st := range s.Stats(model) {
		if st.DeviceID == "" {
			return st
		}
	}
	t.Fatalf("no stats for model %q", model)
	return QueueStats{}
}

// queuedItems is the model's queue depth.
func queuedItems(t *testing.T, s *Scheduler, model string) int64 {
	t.Helper()
	return modelRow(t, s, model).Queued
}

// newTestScheduler returns a Scheduler closed at the end of the test, and
// checks then that no goroutine it started is left behind.
func newTestScheduler(t *testing.T, opts Options) *Scheduler {
	t.Helper()
	before := runtime.NumGoroutine()
	s := New(opts)
	t.Cleanup(func() {
		s.Close()
		deadline := time.Now().Add(2 * time.Second)
		for {
			now := runtime.NumGoroutine()
			if now <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<16)
				t.Errorf("goroutine leak: %d before, %d after Close\n%s", before, now, buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	return s
}

// submitAsync runs Submit in a goroutine and returns where its result lands.
type submitted struct {
	resp Response
	err  error
}

func submitAsync(ctx context.Context, s *Scheduler, req Request) <-chan submitted {
	ch := make(chan submitted, 1)
	go func() {
		resp, err := s.Submit(ctx, req)
		ch <- submitted{resp, err}
	}()
	return ch
}

func recv(t *testing.T, ch <-chan submitted) submitted {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Submit did not return")
		return submitted{}
	}
}

func mustAdd(t *testing.T, s *Scheduler, model string, dev Device, maxBatch int, exec Executor) {
	t.Helper()
	if err := s.AddReplica(model, dev, maxBatch, exec); err != nil {
		t.Fatal(err)
	}
}
