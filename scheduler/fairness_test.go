package scheduler

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestFairness: a client sending 100× more items than a quiet one does not
// delay the quiet client's items by more than one batch: batches cannot be
// preempted, so under load a newcomer waits for the running batch and then
// runs in the next one, which round-robin between clients guarantees it a
// place in (at most 2 batch times, against the queue delay plus one batch
// alone). Without round-robin the quiet item would queue behind the flood's
// backlog (up to 400 items, about 6 batches).
//
// The bound is counted in batches, not measured on the clock, so a loaded
// machine cannot fail it: each quiet item must run in one of the first two
// batches to start after it was submitted. Latencies are logged.
func TestFairness(t *testing.T) {
	const (
		batchTime  = 20 * time.Millisecond
		queueDelay = 10 * time.Millisecond
		maxBatch   = 64
		quietN     = 100 // requests of one item; p99 is the 2nd worst
		floodConc  = 4   // flood requests in flight
		floodItems = 100
	)
	s := newTestScheduler(t, Options{MaxQueueDelay: queueDelay})
	f := newFake("cpu:0")
	f.sleep = batchTime
	mustAdd(t, s, "m", cpu0, maxBatch, f)
	ctx := context.Background()

	// quiet sends quietN one-item requests, one after another, and returns
	// their p99 latency and, for each, how many batches started after it
	// was submitted before the one it ran in.
	quiet := func(tag string) (time.Duration, []int) {
		lat := make([]time.Duration, 0, quietN)
		waited := make([]int, 0, quietN)
		for i := range quietN {
			in := []any{fmt.Sprintf("quiet/%s/%d", tag, i)}
			before := f.callCount()
			start := time.Now()
			resp, err := s.Submit(ctx, Request{Model: "m", Client: "quiet", Priority: 2, Inputs: in})
			lat = append(lat, time.Since(start))
			if err != nil {
				t.Fatal(err)
			}
			checkOutputs(t, in, resp.Outputs)
			batches := f.batchList()
			ran := slices.IndexFunc(batches[before:], func(b []any) bool { return slices.Contains(b, in[0]) })
			if ran < 0 {
				t.Fatalf("%v is in no batch that started after it was submitted", in[0])
			}
			waited = append(waited, ran)
		}
		slices.Sort(lat)
		return quantile(lat, 0.99), waited
	}

	alone, _ := quiet("alone")

	stop := make(chan struct{})
	var sent atomic.Int64
	var wg sync.WaitGroup
	for g := range floodConc {
		wg.Go(func() {
			// Inputs are reused so the flood spends its CPU in the
			// scheduler, not in making strings; outputs are checked.
			in := inputs(fmt.Sprint("flood/", g), floodItems)
			for {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(floodItems)
				resp, err := s.Submit(ctx, Request{Model: "m", Client: "flood", Priority: 2, Inputs: in})
				if err != nil {
					t.Error(err)
					return
				}
				checkOutputs(t, in, resp.Outputs)
			}
		})
	}
	waitFor(t, "a flood backlog", func() bool { return queuedItems(t, s, "m") >= 2*maxBatch })
	sentBefore := sent.Load()
	loaded, waited := quiet("loaded")
	floodSent := sent.Load() - sentBefore
	close(stop)
	wg.Wait()

	t.Logf("quiet p99 alone %v, under a flood %v (%.2f×); flood sent %d items meanwhile, %d× the quiet client's",
		alone, loaded, float64(loaded)/float64(alone), floodSent, floodSent/quietN)
	if floodSent < 100*quietN {
		t.Fatalf("the flood sent only %d items while the quiet client sent %d: not a 100× flood", floodSent, quietN)
	}
	if worst := slices.Max(waited); worst > 1 {
		t.Errorf("a quiet item waited for %d batches that started after it (batches waited per item: %v), want at most 1: the running one's successor", worst, waited)
	}
}
