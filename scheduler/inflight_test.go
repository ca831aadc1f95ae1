package scheduler

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestMaxInFlight: with k in flight a replica gets a new batch while earlier
// ones still run, never more than k at once; with the default it waits.
func TestMaxInFlight(t *testing.T) {
	tests := []struct {
		name      string
		opts      []ReplicaOption
		wantAtMax int // batches running at once while all are held
	}{
		{"default one at a time", nil, 1},
		{"one", []ReplicaOption{WithMaxInFlight(1)}, 1},
		{"two", []ReplicaOption{WithMaxInFlight(2)}, 2},
		{"three", []ReplicaOption{WithMaxInFlight(3)}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f := newFake("gpu:0")
			f.hold = make(chan struct{})
			if err := s.AddReplica("m", Device{ID: "gpu:0", Type: "gpu"}, 2, f, tt.opts...); err != nil {
				t.Fatal(err)
			}
			// Five requests of two items: one batch each.
			var chans []<-chan submitted
			var ins [][]any
			for i := range 5 {
				in := inputs(string(rune('a'+i)), 2)
				ins = append(ins, in)
				chans = append(chans, submitAsync(context.Background(), s, Request{Model: "m", Inputs: in}))
				if i < tt.wantAtMax {
					waitEntered(t, f) // batch i starts while the earlier ones are held
				}
			}
			waitFor(t, "the rest queued", func() bool { return queuedItems(t, s, "m") == int64(2*(5-tt.wantAtMax)) })
			// Nothing beyond the limit starts, however long we wait.
			time.Sleep(20 * time.Millisecond)
			if got := f.callCount(); got != tt.wantAtMax {
				t.Fatalf("%d batches started while held, want %d", got, tt.wantAtMax)
			}
			if got := modelRow(t, s, "m").Running; got != int64(2*tt.wantAtMax) {
				t.Errorf("Stats running = %d items, want %d", got, 2*tt.wantAtMax)
			}
			close(f.hold)
			for i, ch := range chans {
				r := recv(t, ch)
				if r.err != nil {
					t.Fatalf("request %d: %v", i, r.err)
				}
				checkOutputs(t, ins[i], r.resp.Outputs)
			}
			if got := f.callCount(); got != 5 {
				t.Errorf("%d batches, want 5", got)
			}
		})
	}
}

// TestMaxInFlightFailover: batches in flight on a failing pipelined replica
// are each retried once on the other replica; every item is answered once.
func TestMaxInFlightFailover(t *testing.T) {
	s := newTestScheduler(t, Options{UnhealthyAfter: 2, ProbeInterval: time.Hour})
	bad, good := newFake("gpu:0"), newFake("cpu:0")
	bad.fail.Store(true)
	bad.hold = make(chan struct{})
	if err := s.AddReplica("m", Device{ID: "gpu:0", Type: "gpu"}, 2, bad, WithMaxInFlight(2)); err != nil {
		t.Fatal(err)
	}
	good.hold = make(chan struct{})
	mustAdd(t, s, "m", Device{ID: "cpu:0", Type: "cpu"}, 2, good)
	var chans []<-chan submitted
	var ins [][]any
	for i := range 6 {
		in := inputs(string(rune('a'+i)), 2)
		ins = append(ins, in)
		chans = append(chans, submitAsync(context.Background(), s, Request{Model: "m", Inputs: in}))
	}
	// gpu:0 takes two batches at once, cpu:0 one.
	waitFor(t, "three batches running", func() bool { return bad.callCount() == 2 && good.callCount() == 1 })
	close(bad.hold)
	close(good.hold)
	for i, ch := range chans {
		r := recv(t, ch)
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		checkOutputs(t, ins[i], r.resp.Outputs)
		for _, out := range r.resp.Outputs {
			if dev := out.(result).Dev; dev != "cpu:0" {
				t.Fatalf("request %d answered by %s, want cpu:0 (gpu:0 always fails)", i, dev)
			}
		}
	}
	for _, in := range ins {
		for _, x := range in {
			if n := good.runCount(x); n != 1 {
				t.Errorf("%v ran %d times on cpu:0, want once", x, n)
			}
		}
	}
	// Two failures in a row made gpu:0 unhealthy: it gets nothing more.
	var healthy = true
	for _, st := range s.Stats("m") {
		if st.DeviceID == "gpu:0" {
			healthy = st.Healthy
		}
	}
	if healthy {
		t.Error("gpu:0 still healthy after failing two batches in a row")
	}
}

// TestMaxInFlightDrainAndRemove: a drain waits for every batch in flight,
// and removing a pipelined replica waits for all of its batches.
func TestMaxInFlightDrainAndRemove(t *testing.T) {
	for _, op := range []string{"drain", "remove"} {
		t.Run(op, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f := newFake("gpu:0")
			f.hold = make(chan struct{})
			if err := s.AddReplica("m", Device{ID: "gpu:0", Type: "gpu"}, 1, f, WithMaxInFlight(2)); err != nil {
				t.Fatal(err)
			}
			a := submitAsync(context.Background(), s, Request{Model: "m", Inputs: inputs("a", 1)})
			b := submitAsync(context.Background(), s, Request{Model: "m", Inputs: inputs("b", 1)})
			waitEntered(t, f)
			waitEntered(t, f)
			done := make(chan error, 1)
			go func() {
				if op == "drain" {
					done <- s.Drain(context.Background())
				} else {
					done <- s.RemoveReplica(context.Background(), "m", "gpu:0")
				}
			}()
			select {
			case err := <-done:
				t.Fatalf("%s returned (%v) with two batches still running", op, err)
			case <-time.After(30 * time.Millisecond):
			}
			close(f.hold)
			if err := <-done; err != nil {
				t.Fatalf("%s: %v", op, err)
			}
			for _, ch := range []<-chan submitted{a, b} {
				if r := recv(t, ch); r.err != nil {
					t.Errorf("accepted request failed: %v", r.err)
				}
			}
			if op == "drain" {
				_, err := s.Submit(context.Background(), Request{Model: "m", Inputs: inputs("c", 1)})
				if !errors.Is(err, ErrDraining) {
					t.Errorf("Submit after drain = %v, want ErrDraining", err)
				}
			}
		})
	}
}
