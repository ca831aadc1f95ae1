package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	brokerruntime "github.com/brokerd/brokerd/runtime"
)

// Fault injection: executors that fail, panic, hang past any deadline, run
// slowly or run out of memory, with callers that cancel and time out. The
// invariant every test checks: each caller gets an answer, successful
// outputs are the caller's own, and the queue accounting returns to zero.

// stuckExec ignores its context, as a device call blocked in C would, until
// release is closed.
type stuckExec struct {
	release chan struct{}
	entered chan struct{}
	calls   atomic.Int32
}

func newStuck() *stuckExec {
	return &stuckExec{release: make(chan struct{}), entered: make(chan struct{}, 16)}
}

func (e *stuckExec) Execute(_ context.Context, inputs []any) ([]any, error) {
	e.calls.Add(1)
	e.entered <- struct{}{}
	<-e.release
	out := make([]any, len(inputs))
	for i, in := range inputs {
		out[i] = result{In: in, Dev: "stuck"}
	}
	return out, nil
}

func TestBatchTimeoutRetriesOnAnotherReplica(t *testing.T) {
	reg := prometheus.NewRegistry()
	// The good replica joins after the stuck one took the batch and before
	// the batch timeout: a second is far from that step's microseconds,
	// however loaded the machine.
	s := newTestScheduler(t, Options{BatchTimeout: time.Second, ProbeInterval: time.Hour, Registerer: reg})
	stuck := newStuck()
	t.Cleanup(func() { close(stuck.release) }) // before the leak check of newTestScheduler
	mustAdd(t, s, "m", Device{ID: "gpu:0", Type: "gpu"}, 4, stuck)

	// The stuck replica takes the first batch (it is the only replica yet).
	in := inputs("a", 3)
	ch := submitAsync(context.Background(), s, Request{Model: "m", Inputs: in}) // no deadline
	<-stuck.entered
	good := newFake("cpu:0")
	mustAdd(t, s, "m", Device{ID: "cpu:0", Type: "cpu"}, 4, good)

	r := recv(t, ch)
	if r.err != nil {
		t.Fatalf("Submit: %v; want the items retried on cpu:0", r.err)
	}
	checkOutputs(t, in, r.resp.Outputs)
	if r.resp.Info.DeviceID != "cpu:0" {
		t.Errorf("ran on %s, want cpu:0", r.resp.Info.DeviceID)
	}
	if got := testutil.ToFloat64(s.metrics.abandoned.WithLabelValues("m", "gpu:0")); got != 1 {
		t.Errorf("batches_abandoned_total = %v, want 1", got)
	}
	for _, st := range s.Stats("m") {
		if st.DeviceID == "gpu:0" && st.Healthy {
			t.Error("the replica with the abandoned batch is still healthy")
		}
	}
	// The hung replica takes no new work while its call is stuck.
	in2 := inputs("b", 2)
	resp, err := s.Submit(context.Background(), Request{Model: "m", Inputs: in2})
	if err != nil {
		t.Fatal(err)
	}
	checkOutputs(t, in2, resp.Outputs)
	if n := stuck.calls.Load(); n != 1 {
		t.Errorf("stuck executor called %d times, want 1", n)
	}
}

func TestBatchTimeoutAloneAnswersDrainsAndCloses(t *testing.T) {
	s := New(Options{BatchTimeout: 30 * time.Millisecond})
	stuck := newStuck()
	defer close(stuck.release)
	mustAdd(t, s, "m", Device{ID: "cpu:0", Type: "cpu"}, 4, stuck)

	ch := submitAsync(context.Background(), s, Request{Model: "m", Inputs: inputs("a", 2)})
	r := recv(t, ch)
	if !errors.Is(r.err, ErrBackend) || !errors.Is(r.err, ErrBatchTimeout) {
		t.Fatalf("Submit = %v, want ErrBackend and ErrBatchTimeout", r.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Drain(ctx); err != nil {
		t.Fatalf("Drain with a stuck device call: %v", err)
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for a device call that never returns")
	}
}

func TestAbandonedBatchReturningLateIsDiscarded(t *testing.T) {
	s := newTestScheduler(t, Options{BatchTimeout: 30 * time.Millisecond, ProbeInterval: time.Millisecond})
	stuck := newStuck()
	mustAdd(t, s, "m", Device{ID: "cpu:0", Type: "cpu"}, 4, stuck)
	r := recv(t, submitAsync(context.Background(), s, Request{Model: "m", Inputs: inputs("a", 2)}))
	if !errors.Is(r.err, ErrBatchTimeout) {
		t.Fatalf("Submit = %v, want ErrBatchTimeout", r.err)
	}
	close(stuck.release) // the call returns; its outputs belong to nobody now
	// The replica probes back to health with the next request.
	in := inputs("b", 2)
	waitFor(t, "the replica to take work again", func() bool {
		resp, err := s.Submit(context.Background(), Request{Model: "m", Inputs: in})
		if err != nil {
			return false
		}
		checkOutputs(t, in, resp.Outputs)
		return true
	})
	row := modelRow(t, s, "m")
	if row.Queued != 0 || row.Running != 0 {
		t.Errorf("queued %d running %d after everything answered", row.Queued, row.Running)
	}
}

// chaosExec fails, panics, runs out of memory, is slow or honours
// cancellation at random, from a seeded source.
type chaosExec struct {
	dev string
	mu  sync.Mutex
	rng *rand.Rand
}

func (e *chaosExec) Execute(ctx context.Context, inputs []any) ([]any, error) {
	e.mu.Lock()
	roll := e.rng.IntN(100)
	sleep := time.Duration(e.rng.IntN(3)) * time.Millisecond
	e.mu.Unlock()
	switch {
	case roll < 10:
		return nil, fmt.Errorf("device fault")
	case roll < 15:
		panic("executor bug")
	case roll < 20:
		return nil, fmt.Errorf("alloc activations: %w", brokerruntime.ErrOutOfMemory)
	case roll < 23:
		return inputs[:len(inputs)-1], nil // wrong output count
	}
	select {
	case <-time.After(sleep):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	out := make([]any, len(inputs))
	for i, in := range inputs {
		out[i] = result{In: in, Dev: e.dev}
	}
	return out, nil
}

func TestFaultStormEveryCallerAnswered(t *testing.T) {
	tests := []struct {
		name     string
		replicas int
		inFlight int
	}{
		{"one replica", 1, 1},
		{"two replicas", 2, 1},
		{"pipelined replicas", 2, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{MaxQueueItems: 256, ProbeInterval: 2 * time.Millisecond, BatchTimeout: time.Second})
			for i := range tc.replicas {
				exec := &chaosExec{dev: fmt.Sprint("cpu:", i), rng: rand.New(rand.NewPCG(uint64(i), 7))}
				if err := s.AddReplica("m", Device{ID: exec.dev, Type: "cpu"}, 8, exec, WithMaxInFlight(tc.inFlight)); err != nil {
					t.Fatal(err)
				}
			}
			const callers, calls = 16, 25
			var ok, failed, answered atomic.Int64
			var wg sync.WaitGroup
			for c := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(c), 11))
					for k := range calls {
						in := inputs(fmt.Sprintf("c%d/%d", c, k), 1+rng.IntN(6))
						ctx, cancel := context.Background(), context.CancelFunc(func() {})
						switch rng.IntN(4) {
						case 0:
							ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(3000))*time.Microsecond)
						case 1:
							ctx, cancel = context.WithCancel(ctx)
							after := time.Duration(rng.IntN(2000)) * time.Microsecond
							go func() { time.Sleep(after); cancel() }()
						}
						resp, err := s.Submit(ctx, Request{Model: "m", Client: fmt.Sprint(c), Inputs: in})
						cancel()
						answered.Add(1)
						if err != nil {
							failed.Add(1)
							var full *QueueFullError
							if !errors.Is(err, ErrBackend) && !errors.Is(err, context.DeadlineExceeded) &&
								!errors.Is(err, context.Canceled) && !errors.As(err, &full) && !errors.Is(err, ErrNoDevice) {
								t.Errorf("unexpected error class: %v", err)
							}
							continue
						}
						ok.Add(1)
						checkOutputs(t, in, resp.Outputs)
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Fatalf("callers still waiting: %d of %d answered", answered.Load(), callers*calls)
			}
			if ok.Load() == 0 {
				t.Errorf("no call succeeded (%d failed)", failed.Load())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Drain(ctx); err != nil {
				t.Fatalf("drain after the storm: %v", err)
			}
			row := modelRow(t, s, "m")
			if row.Queued != 0 || row.Running != 0 {
				t.Errorf("after the storm: queued %d, running %d; want 0", row.Queued, row.Running)
			}
			t.Logf("%d succeeded, %d failed", ok.Load(), failed.Load())
		})
	}
}

func TestOutOfMemoryKeepsItsCause(t *testing.T) {
	s := newTestScheduler(t, Options{})
	exec := &errExec{err: fmt.Errorf("alloc [64,4096]: %w", brokerruntime.ErrOutOfMemory)}
	mustAdd(t, s, "m", Device{ID: "cpu:0", Type: "cpu"}, 4, exec)
	_, err := s.Submit(context.Background(), Request{Model: "m", Inputs: inputs("a", 2)})
	if !errors.Is(err, ErrBackend) || !errors.Is(err, brokerruntime.ErrOutOfMemory) {
		t.Fatalf("Submit = %v, want ErrBackend wrapping runtime.ErrOutOfMemory", err)
	}
}

type errExec struct{ err error }

func (e *errExec) Execute(context.Context, []any) ([]any, error) { return nil, e.err }

func TestRemoveAndCordonMidBatchLoseNothing(t *testing.T) {
	for _, action := range []string{"cordon", "remove"} {
		t.Run(action, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			a, b := newFake("cpu:0"), newFake("cpu:1")
			a.hold = make(chan struct{})
			mustAdd(t, s, "m", Device{ID: "cpu:0", Type: "cpu"}, 4, a)
			first := inputs("first", 4)
			ch1 := submitAsync(context.Background(), s, Request{Model: "m", Inputs: first})
			waitEntered(t, a)
			mustAdd(t, s, "m", Device{ID: "cpu:1", Type: "cpu"}, 4, b)
			second := inputs("second", 6)
			ch2 := submitAsync(context.Background(), s, Request{Model: "m", Inputs: second})

			removed := make(chan error, 1)
			switch action {
			case "cordon":
				s.Cordon("cpu:0", true)
				removed <- nil
			case "remove":
				go func() { removed <- s.RemoveReplica(context.Background(), "m", "cpu:0") }()
			}
			r2 := recv(t, ch2) // served by cpu:1 while cpu:0 is busy and leaving
			if r2.err != nil {
				t.Fatal(r2.err)
			}
			checkOutputs(t, second, r2.resp.Outputs)
			close(a.hold)
			r1 := recv(t, ch1)
			if r1.err != nil {
				t.Fatalf("the batch running during %s: %v", action, r1.err)
			}
			checkOutputs(t, first, r1.resp.Outputs)
			if err := <-removed; err != nil {
				t.Fatal(err)
			}
			for _, in := range second {
				if n := a.runCount(in); n != 0 {
					t.Errorf("%v ran on the %s device", in, action)
				}
			}
		})
	}
}

// TestResponseDevicesPerItem: a request split across devices says which
// device ran each item (the encoder writes it into each record).
func TestResponseDevicesPerItem(t *testing.T) {
	s := newTestScheduler(t, Options{})
	a, b := newFake("cpu:0"), newFake("gpu:0")
	a.hold = make(chan struct{})
	mustAdd(t, s, "m", Device{ID: "cpu:0", Type: "cpu"}, 2, a)
	first := submitAsync(context.Background(), s, Request{Model: "m", Inputs: inputs("x", 2)})
	waitEntered(t, a) // cpu:0 is busy with x; y's items go to both once it frees
	mustAdd(t, s, "m", Device{ID: "gpu:0", Type: "gpu"}, 2, b)
	in := inputs("y", 8)
	ch := submitAsync(context.Background(), s, Request{Model: "m", Inputs: in})
	waitEntered(t, b)
	close(a.hold)
	r := recv(t, ch)
	if r.err != nil {
		t.Fatal(r.err)
	}
	recv(t, first)
	if len(r.resp.Devices) != len(in) {
		t.Fatalf("%d devices for %d items", len(r.resp.Devices), len(in))
	}
	seen := map[string]bool{}
	for i, o := range r.resp.Outputs {
		if dev := o.(result).Dev; r.resp.Devices[i] != dev {
			t.Errorf("item %d ran on %s, Devices says %s", i, dev, r.resp.Devices[i])
		}
		seen[r.resp.Devices[i]] = true
	}
	if len(seen) != 2 || len(r.resp.Info.DeviceIDs) != 2 {
		t.Logf("items ran on %v (info %v); the split is up to timing", seen, r.resp.Info.DeviceIDs)
	}
}

func TestRequestLargerThanQueueIsInvalid(t *testing.T) {
	s := newTestScheduler(t, Options{MaxQueueItems: 64})
	mustAdd(t, s, "m", Device{ID: "cpu:0", Type: "cpu"}, 8, newFake("cpu:0"))
	_, err := s.Submit(context.Background(), Request{Model: "m", Inputs: inputs("a", 100)})
	var full *QueueFullError
	if !errors.Is(err, ErrInvalidArgument) || errors.As(err, &full) {
		t.Fatalf("100 items, queue of 64: %v; want ErrInvalidArgument, not a retry", err)
	}
	if _, err := s.Submit(context.Background(), Request{Model: "m", Inputs: inputs("b", 64)}); err != nil {
		t.Fatal(err)
	}
}

// TestItemsThatCannotMeetTheirDeadlineDoNotRun: an item whose deadline
// comes before its batch could finish (by the replica's measured
// throughput) is dropped before the device runs it.
func TestItemsThatCannotMeetTheirDeadlineDoNotRun(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFake("cpu:0")
	f.sleep = 40 * time.Millisecond // 25 items/s at batch 1
	mustAdd(t, s, "m", Device{ID: "cpu:0", Type: "cpu"}, 1, f)
	if _, err := s.Submit(context.Background(), Request{Model: "m", Inputs: inputs("warm", 1)}); err != nil {
		t.Fatal(err) // measures the throughput
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	doomed := inputs("doomed", 1)
	_, err := s.Submit(ctx, Request{Model: "m", Inputs: doomed})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Submit = %v, want DeadlineExceeded", err)
	}
	if n := f.runCount(doomed[0]); n != 0 {
		t.Errorf("an item that could not finish in 5 ms on a 40 ms device ran %d times", n)
	}
	// One with time to spare runs.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if _, err := s.Submit(ctx2, Request{Model: "m", Inputs: inputs("fine", 1)}); err != nil {
		t.Fatal(err)
	}
}

// TestCloseWithinGivesUpOnAStuckCall: shutdown has a hard bound even when a
// device call never returns and the batch timeout is far away.
func TestCloseWithinGivesUpOnAStuckCall(t *testing.T) {
	s := New(Options{BatchTimeout: time.Hour})
	stuck := newStuck()
	defer close(stuck.release)
	mustAdd(t, s, "m", Device{ID: "cpu:0", Type: "cpu"}, 1, stuck)
	ch := submitAsync(context.Background(), s, Request{Model: "m", Inputs: inputs("a", 1)})
	<-stuck.entered
	start := time.Now()
	if s.CloseWithin(50 * time.Millisecond) {
		t.Error("CloseWithin says every call returned")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("CloseWithin took %v", took)
	}
	if r := recv(t, ch); !errors.Is(r.err, ErrDraining) && !errors.Is(r.err, context.Canceled) && !errors.Is(r.err, ErrBackend) {
		t.Logf("the caller got %v", r.err)
	}
}
