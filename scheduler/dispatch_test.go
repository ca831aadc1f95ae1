package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var gpu0 = Device{ID: "gpu:0", Type: "gpu"}

// TestFailover runs load over a failing and a working replica: every item is
// answered once and correctly, the failing one is marked unhealthy after 3
// failures in a row, and it is probed back once it works again.
func TestFailover(t *testing.T) {
	const probe = 200 * time.Millisecond
	s := newTestScheduler(t, Options{ProbeInterval: probe})
	bad, good := newFake("gpu:0"), newFake("cpu:0")
	bad.fail.Store(true)
	// The bad replica is unmeasured, so it is tried first: it sees batches.
	mustAdd(t, s, "m", gpu0, 4, bad)
	mustAdd(t, s, "m", cpu0, 4, good)

	var wg sync.WaitGroup
	var all sync.Map
	for c := range 16 {
		wg.Go(func() {
			for r := range 5 {
				in := inputs(fmt.Sprintf("c%d/r%d", c, r), 1+(c+r)%6)
				resp, err := s.Submit(context.Background(), Request{Model: "m", Client: fmt.Sprint(c), Inputs: in})
				if err != nil {
					t.Error(err)
					return
				}
				for i, o := range resp.Outputs {
					if o.(result).In != in[i] || o.(result).Dev != "cpu:0" {
						t.Errorf("output %d = %v, want %v from cpu:0", i, o, in[i])
					}
					all.Store(in[i], true)
				}
			}
		})
	}
	wg.Wait()
	if bad.callCount() < DefaultUnhealthyAfter {
		t.Fatalf("the failing replica ran %d batches; the test needs it to fail at least %d", bad.callCount(), DefaultUnhealthyAfter)
	}
	all.Range(func(k, _ any) bool {
		if n := good.runCount(k); n != 1 {
			t.Errorf("input %v ran %d times on the good device, want 1", k, n)
		}
		return true
	})
	h := s.Health("gpu:0")
	if !h.Known || h.Healthy || h.ConsecutiveFailures < 3 || h.LastError == "" {
		t.Errorf("Health(gpu:0) = %+v, want unhealthy after 3+ failures", h)
	}
	if h := s.Health("cpu:0"); !h.Healthy {
		t.Errorf("Health(cpu:0) = %+v, want healthy", h)
	}
	for _, st := range s.Stats("m") {
		if st.DeviceID == "gpu:0" && (st.Healthy || st.Failed[ReasonBackend] == 0) {
			t.Errorf("gpu:0 stats %+v: want unhealthy with backend failures", st)
		}
	}

	// Unhealthy: no batches before its probe time, the work goes elsewhere.
	calls := bad.callCount()
	for i := 0; i < 5 && time.Until(h.ProbeAt) > 20*time.Millisecond; i++ {
		if _, err := s.Submit(context.Background(), Request{Model: "m", Inputs: []any{fmt.Sprint("unhealthy", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if time.Now().Before(h.ProbeAt) && bad.callCount() != calls {
		t.Errorf("unhealthy replica got a batch before its probe time")
	}

	// It recovers: after the probe interval one real batch goes to it.
	bad.fail.Store(false)
	waitFor(t, "gpu:0 probed back to healthy", func() bool {
		if _, err := s.Submit(context.Background(), Request{Model: "m", Inputs: []any{"probe"}}); err != nil {
			t.Fatal(err)
		}
		return s.Health("gpu:0").Healthy
	})
}

// TestBackendFailure checks when a failing batch ends in ErrBackend.
func TestBackendFailure(t *testing.T) {
	cases := []struct {
		name      string
		failing   []bool // per replica
		wantErr   error
		wantCalls []int // batches each replica ran
	}{
		{"single replica: no retry", []bool{true}, ErrBackend, []int{1}},
		{"both fail: retried once then ErrBackend", []bool{true, true}, ErrBackend, []int{1, 1}},
		{"retry elsewhere succeeds", []bool{true, false}, nil, []int{1, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			var fakes []*fakeExec
			for i, fail := range tc.failing {
				f := newFake(fmt.Sprint("cpu:", i))
				f.fail.Store(fail)
				fakes = append(fakes, f)
				mustAdd(t, s, "m", Device{ID: f.dev, Type: "cpu"}, 4, f)
			}
			in := inputs("x", 3)
			resp, err := s.Submit(context.Background(), Request{Model: "m", Inputs: in})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err == nil {
				checkOutputs(t, in, resp.Outputs)
			}
			for i, f := range fakes {
				if got := f.callCount(); got != tc.wantCalls[i] {
					t.Errorf("replica %d ran %d batches, want %d", i, got, tc.wantCalls[i])
				}
			}
		})
	}
}

// TestCordon checks that cordoned devices take no new batches: work goes to
// the other replica, waits while none is usable, and Submit fails fast when
// no replica can take it.
func TestCordon(t *testing.T) {
	t.Run("work goes elsewhere", func(t *testing.T) {
		s := newTestScheduler(t, Options{})
		fc, fg := newFake("cpu:0"), newFake("gpu:0")
		mustAdd(t, s, "m", cpu0, 4, fc)
		mustAdd(t, s, "m", gpu0, 4, fg)
		s.Cordon("gpu:0", true)
		for i := range 10 {
			resp, err := s.Submit(context.Background(), Request{Model: "m", Inputs: inputs(fmt.Sprint(i), 3)})
			if err != nil || resp.Info.DeviceID != "cpu:0" {
				t.Fatalf("ran on %q (err %v), want cpu:0", resp.Info.DeviceID, err)
			}
		}
		if fg.callCount() != 0 {
			t.Errorf("cordoned gpu:0 ran %d batches", fg.callCount())
		}
		if h := s.Health("gpu:0"); !h.Cordoned {
			t.Errorf("Health(gpu:0).Cordoned = false")
		}
		s.Cordon("cpu:0", true)
		if _, err := s.Submit(context.Background(), Request{Model: "m", Inputs: []any{1}}); !errors.Is(err, ErrNoDevice) || errors.Is(err, ErrNoMatchingReplica) {
			t.Errorf("all cordoned: err = %v, want ErrNoDevice (the uncordon helps), not ErrNoMatchingReplica", err)
		}
	})
	t.Run("queued work waits for the uncordon", func(t *testing.T) {
		s := newTestScheduler(t, Options{})
		f := newFake("cpu:0")
		f.hold = make(chan struct{})
		mustAdd(t, s, "m", cpu0, 4, f)
		warm := submitAsync(context.Background(), s, Request{Model: "m", Inputs: []any{"warm"}})
		waitEntered(t, f)
		queued := submitAsync(context.Background(), s, Request{Model: "m", Inputs: []any{"q"}})
		waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == 1 })
		s.Cordon("cpu:0", true)
		close(f.hold)
		recv(t, warm)
		time.Sleep(50 * time.Millisecond)
		if f.runCount("q") != 0 || queuedItems(t, s, "m") != 1 {
			t.Fatalf("queued item ran on a cordoned device")
		}
		s.Cordon("cpu:0", false)
		if r := recv(t, queued); r.err != nil {
			t.Fatal(r.err)
		}
	})
}

// TestDrain checks that Drain refuses new work, lets everything accepted
// complete, and returns only then.
func TestDrain(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFake("cpu:0")
	f.hold = make(chan struct{})
	mustAdd(t, s, "m", cpu0, 2, f)
	ctx := context.Background()
	var chans []<-chan submitted
	var ins [][]any
	for i := range 5 {
		in := inputs(fmt.Sprint("d", i), 3)
		ins = append(ins, in)
		chans = append(chans, submitAsync(ctx, s, Request{Model: "m", Client: fmt.Sprint(i), Inputs: in}))
	}
	waitEntered(t, f)
	waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == 15-2 })

	drained := make(chan error, 1)
	go func() { drained <- s.Drain(ctx) }()
	waitFor(t, "draining", s.Draining)
	if _, err := s.Submit(ctx, Request{Model: "m", Inputs: []any{"late"}}); !errors.Is(err, ErrDraining) {
		t.Errorf("Submit while draining: err = %v, want ErrDraining", err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := s.Drain(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Drain with work held: err = %v, want DeadlineExceeded", err)
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned %v with work still running", err)
	default:
	}
	close(f.hold)
	for i, ch := range chans {
		r := recv(t, ch)
		if r.err != nil {
			t.Fatalf("accepted call %d: %v", i, r.err)
		}
		checkOutputs(t, ins[i], r.resp.Outputs)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return")
	}
	if f.runCount("late") != 0 {
		t.Error("a call refused while draining ran")
	}
}

// fakeClock is a settable clock for exact durations.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestExecInfo checks every ExecInfo field and the cost arithmetic with a
// fake clock that each batch advances by exactly 2 s.
func TestExecInfo(t *testing.T) {
	t.Run("one device, split request", func(t *testing.T) {
		clock := &fakeClock{}
		clock.ns.Store(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
		s := newTestScheduler(t, Options{Now: clock.Now})
		f := newFake("gpu:0")
		f.hold = make(chan struct{})
		f.advance = func() { clock.Advance(2 * time.Second) }
		// $3600/h is $1/s: a 2 s batch costs $2.
		mustAdd(t, s, "m", Device{ID: "gpu:0", Type: "gpu", CostPerHour: 3600}, 4, f)
		ctx := context.Background()
		warm := submitAsync(ctx, s, Request{Model: "m", Client: "w", Inputs: []any{"warm"}})
		waitEntered(t, f)
		aIn, bIn := inputs("a", 5), inputs("b", 1)
		a := submitAsync(ctx, s, Request{Model: "m", Client: "a", Inputs: aIn})
		waitFor(t, "a queued", func() bool { return queuedItems(t, s, "m") == 5 })
		b := submitAsync(ctx, s, Request{Model: "m", Client: "b", Inputs: bIn})
		waitFor(t, "b queued", func() bool { return queuedItems(t, s, "m") == 6 })
		close(f.hold)
		recv(t, warm)
		// Batch 1 (t=2..4 s): a a a b. Batch 2 (t=4..6 s): a a.
		ra, rb := recv(t, a), recv(t, b)
		if ra.err != nil || rb.err != nil {
			t.Fatal(ra.err, rb.err)
		}
		checkOutputs(t, aIn, ra.resp.Outputs)
		checkOutputs(t, bIn, rb.resp.Outputs)
		cases := []struct {
			name string
			got  ExecInfo
			want ExecInfo
		}{
			{"a", ra.resp.Info, ExecInfo{DeviceID: "gpu:0", DeviceType: "gpu", BatchSize: 4, BatchSizes: []int{4, 2},
				Queue: 2 * time.Second, Compute: 4 * time.Second, Total: 6 * time.Second, CostUSD: 2*3.0/4 + 2*2.0/2}},
			{"b", rb.resp.Info, ExecInfo{DeviceID: "gpu:0", DeviceType: "gpu", BatchSize: 4, BatchSizes: []int{4},
				Queue: 2 * time.Second, Compute: 2 * time.Second, Total: 4 * time.Second, CostUSD: 2 * 1.0 / 4}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				g, w := tc.got, tc.want
				if g.DeviceID != w.DeviceID || g.DeviceType != w.DeviceType || g.DeviceIDs != nil ||
					g.BatchSize != w.BatchSize || fmt.Sprint(g.BatchSizes) != fmt.Sprint(w.BatchSizes) ||
					g.Queue != w.Queue || g.Compute != w.Compute || g.Total != w.Total || math.Abs(g.CostUSD-w.CostUSD) > 1e-12 {
					t.Errorf("ExecInfo\n got %+v\nwant %+v", g, w)
				}
			})
		}
	})
	t.Run("two devices", func(t *testing.T) {
		s := newTestScheduler(t, Options{})
		f0, f1 := newFake("cpu:0"), newFake("cpu:1")
		f0.hold, f1.hold = make(chan struct{}), make(chan struct{})
		mustAdd(t, s, "m", cpu0, 4, f0)
		mustAdd(t, s, "m", Device{ID: "cpu:1", Type: "cpu"}, 4, f1)
		// Both idle and unmeasured: the 6 items split 4 and 2.
		in := inputs("x", 6)
		ch := submitAsync(context.Background(), s, Request{Model: "m", Inputs: in})
		waitEntered(t, f0)
		waitEntered(t, f1)
		close(f0.hold)
		close(f1.hold)
		r := recv(t, ch)
		if r.err != nil {
			t.Fatal(r.err)
		}
		checkOutputs(t, in, r.resp.Outputs)
		info := r.resp.Info
		if info.DeviceID != "cpu:0" || info.DeviceType != "cpu" || fmt.Sprint(info.DeviceIDs) != "[cpu:0 cpu:1]" ||
			info.BatchSize != 4 || len(info.BatchSizes) != 2 || info.CostUSD != 0 {
			t.Errorf("ExecInfo %+v: want main cpu:0 (4 items), DeviceIDs [cpu:0 cpu:1], batch sizes 4 and 2, cost 0", info)
		}
	})
}

// TestDispatchEarliestFinish checks the choice between replicas: unmeasured
// ones are tried first, then the one expected to finish first, even when
// a slower one is idle.
func TestDispatchEarliestFinish(t *testing.T) {
	s := newTestScheduler(t, Options{})
	fast, slow := newFake("gpu:0"), newFake("cpu:0")
	fast.sleep, slow.sleep = time.Millisecond, 40*time.Millisecond
	mustAdd(t, s, "m", cpu0, 4, slow)
	ctx := context.Background()
	if _, err := s.Submit(ctx, Request{Model: "m", Inputs: []any{"warm-slow"}}); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, s, "m", gpu0, 4, fast)
	resp, err := s.Submit(ctx, Request{Model: "m", Inputs: []any{"first-after-add"}})
	if err != nil || resp.Info.DeviceID != "gpu:0" {
		t.Fatalf("first request after adding gpu:0 ran on %q (err %v): unmeasured replicas go first", resp.Info.DeviceID, err)
	}
	var wg sync.WaitGroup
	var onSlow, total atomic.Int64
	for c := range 8 {
		wg.Go(func() {
			for r := range 20 {
				resp, err := s.Submit(ctx, Request{Model: "m", Client: fmt.Sprint(c), Inputs: []any{fmt.Sprint(c, "/", r)}})
				if err != nil {
					t.Error(err)
					return
				}
				total.Add(1)
				if resp.Info.DeviceID == "cpu:0" {
					onSlow.Add(1)
				}
			}
		})
	}
	wg.Wait()
	// gpu:0 clears the whole backlog (at most 8 items) far sooner than
	// cpu:0 runs one batch, so cpu:0 should stay idle.
	if n := onSlow.Load(); n*10 > total.Load() {
		t.Errorf("%d of %d requests ran on the slow replica; want under 10%%", n, total.Load())
	}

	// A stuck fast replica is not waited for past twice its expected time:
	// the idle slow one takes the work.
	for len(fast.entered) > 0 {
		<-fast.entered
	}
	fast.hold = make(chan struct{})
	stuck := submitAsync(ctx, s, Request{Model: "m", DeviceID: "gpu:0", Inputs: []any{"stuck"}})
	waitEntered(t, fast)
	bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err = s.Submit(bounded, Request{Model: "m", Inputs: []any{"while-stuck"}})
	if err != nil || resp.Info.DeviceID != "cpu:0" {
		t.Errorf("with gpu:0 stuck, ran on %q (err %v), want cpu:0", resp.Info.DeviceID, err)
	}
	close(fast.hold)
	if r := recv(t, stuck); r.err != nil {
		t.Fatal(r.err)
	}
}

// TestRemoveReplica checks that a removed replica finishes its batch, gets
// nothing more, and that removing the last one fails what is queued.
func TestRemoveReplica(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f0, f1 := newFake("cpu:0"), newFake("gpu:0")
	f0.hold = make(chan struct{})
	mustAdd(t, s, "m", cpu0, 2, f0)
	ctx := context.Background()
	running := submitAsync(ctx, s, Request{Model: "m", Inputs: []any{"r"}})
	waitEntered(t, f0)
	queued := submitAsync(ctx, s, Request{Model: "m", Inputs: []any{"q"}})
	pinned := submitAsync(ctx, s, Request{Model: "m", DeviceID: "cpu:0", Inputs: []any{"pinned"}})
	waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == 2 })
	mustAdd(t, s, "m", gpu0, 2, f1)
	r := recv(t, queued)
	if r.err != nil || r.resp.Info.DeviceID != "gpu:0" {
		t.Fatalf("queued item: %+v %v, want it run on gpu:0", r.resp.Info, r.err)
	}

	removed := make(chan error, 1)
	go func() { removed <- s.RemoveReplica(ctx, "m", "cpu:0") }()
	if rp := recv(t, pinned); !errors.Is(rp.err, ErrNoDevice) {
		t.Errorf("item pinned to the removed replica: err = %v, want ErrNoDevice", rp.err)
	}
	select {
	case err := <-removed:
		t.Fatalf("RemoveReplica returned %v while its batch runs", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(f0.hold)
	if r := recv(t, running); r.err != nil {
		t.Errorf("batch running during removal: %v", r.err)
	}
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveReplica(ctx, "m", "cpu:0"); !errors.Is(err, ErrDeviceNotFound) {
		t.Errorf("second removal: err = %v, want ErrDeviceNotFound", err)
	}
	if err := s.RemoveReplica(ctx, "m", "gpu:0"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(ctx, Request{Model: "m", Inputs: []any{1}}); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("after removing every replica: err = %v, want ErrUnknownModel", err)
	}
}
