package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

var cpu0 = Device{ID: "cpu:0", Type: "cpu"}

// TestBatchesFillToLimit queues single-item requests behind a held batch and
// checks they leave in batches of exactly maxBatch, then the remainder.
func TestBatchesFillToLimit(t *testing.T) {
	cases := []struct {
		name     string
		maxBatch int
		queued   int
		want     []int // batch sizes after the held first batch
	}{
		{"limit 8, 20 queued", 8, 20, []int{8, 8, 4}},
		{"limit 1", 1, 3, []int{1, 1, 1}},
		{"limit above the queue", 32, 20, []int{20}},
		{"exact multiple", 4, 8, []int{4, 4}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f := newFake("cpu:0")
			f.hold = make(chan struct{})
			mustAdd(t, s, "m", cpu0, tc.maxBatch, f)
			ctx := context.Background()

			first := submitAsync(ctx, s, Request{Model: "m", Client: "a", Inputs: inputs("first", 1)})
			waitEntered(t, f)
			var chans []<-chan submitted
			var ins [][]any
			for i := range tc.queued {
				in := inputs(fmt.Sprintf("r%d", i), 1)
				ins = append(ins, in)
				chans = append(chans, submitAsync(ctx, s, Request{Model: "m", Client: fmt.Sprint("c", i), Inputs: in}))
			}
			waitFor(t, "all queued", func() bool { return queuedItems(t, s, "m") == int64(tc.queued) })
			close(f.hold)
			if r := recv(t, first); r.err != nil {
				t.Fatal(r.err)
			}
			for i, ch := range chans {
				r := recv(t, ch)
				if r.err != nil {
					t.Fatal(r.err)
				}
				checkOutputs(t, ins[i], r.resp.Outputs)
			}
			if got := f.batchSizes()[1:]; !slices.Equal(got, tc.want) {
				t.Errorf("batch sizes %v, want %v", got, tc.want)
			}
		})
	}
}

// TestQueueDelay checks that a partial batch waits for MaxQueueDelay on an
// idle device, that a full batch does not, and that items arriving within
// the delay share a batch. Only lower bounds are wall-clock: a batch that
// must not wait is given a delay (a minute) far past its context's
// deadline (20 s), so waiting it fails the call instead of racing a margin.
func TestQueueDelay(t *testing.T) {
	const delay = 80 * time.Millisecond
	cases := []struct {
		name      string
		delay     time.Duration
		items     int
		min       time.Duration
		wantSizes []int
	}{
		{"lone item waits the delay", delay, 1, delay, []int{1}},
		{"full batch leaves at once", time.Minute, 4, 0, []int{4}},
		{"no delay leaves at once", 0, 1, 0, []int{1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{MaxQueueDelay: tc.delay})
			f := newFake("cpu:0")
			mustAdd(t, s, "m", cpu0, 4, f)
			in := inputs("x", tc.items)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			resp, err := s.Submit(ctx, Request{Model: "m", Inputs: in})
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			checkOutputs(t, in, resp.Outputs)
			if took < tc.min {
				t.Errorf("took %v, want at least %v", took, tc.min)
			}
			if resp.Info.Queue < tc.min {
				t.Errorf("ExecInfo.Queue %v, want at least %v", resp.Info.Queue, tc.min)
			}
			if got := f.batchSizes(); !slices.Equal(got, tc.wantSizes) {
				t.Errorf("batch sizes %v, want %v", got, tc.wantSizes)
			}
		})
	}

	t.Run("items within the delay share a batch", func(t *testing.T) {
		// The second request arrives while the first is queued (however
		// slow the machine), and fills the batch, which then leaves long
		// before the delay.
		s := newTestScheduler(t, Options{MaxQueueDelay: time.Minute})
		f := newFake("cpu:0")
		mustAdd(t, s, "m", cpu0, 3, f)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		a := submitAsync(ctx, s, Request{Model: "m", Client: "a", Inputs: inputs("a", 1)})
		waitFor(t, "the first request queued", func() bool { return queuedItems(t, s, "m") == 1 })
		b := submitAsync(ctx, s, Request{Model: "m", Client: "b", Inputs: inputs("b", 2)})
		for _, ch := range []<-chan submitted{a, b} {
			if r := recv(t, ch); r.err != nil {
				t.Fatal(r.err)
			}
		}
		if got := f.batchSizes(); !slices.Equal(got, []int{3}) {
			t.Errorf("batch sizes %v, want [3]", got)
		}
	})
}

// TestPriority queues requests behind a held batch and checks the order in
// which they run: higher levels first, arrival order inside one (a lower
// level's share, one pick in 8, needs longer queues:
// TestPriorityFloodCannotStarveLowerLevels).
func TestPriority(t *testing.T) {
	cases := []struct {
		name       string
		priorities []int // in submission order; request i has input "p<i>"
		wantOrder  []int // request indexes in execution order
	}{
		{"high behind lows runs first", []int{1, 1, 1, 1, 3}, []int{4, 0, 1, 2, 3}},
		{"three levels", []int{1, 2, 3, 1, 2, 3}, []int{2, 5, 1, 4, 0, 3}},
		{"one level keeps arrival order", []int{2, 2, 2}, []int{0, 1, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f := newFake("cpu:0")
			f.hold = make(chan struct{})
			mustAdd(t, s, "m", cpu0, 1, f)
			ctx := context.Background()
			warm := submitAsync(ctx, s, Request{Model: "m", Inputs: []any{"warm"}})
			waitEntered(t, f)
			var chans []<-chan submitted
			for i, p := range tc.priorities {
				// One client, so only priority and arrival order matter.
				chans = append(chans, submitAsync(ctx, s, Request{Model: "m", Client: "c", Priority: p, Inputs: []any{fmt.Sprint("p", i)}}))
				waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == int64(i+1) })
			}
			close(f.hold)
			recv(t, warm)
			for _, ch := range chans {
				if r := recv(t, ch); r.err != nil {
					t.Fatal(r.err)
				}
			}
			var got []int
			for _, b := range f.batchList()[1:] {
				var i int
				fmt.Sscanf(b[0].(string), "p%d", &i)
				got = append(got, i)
			}
			if !slices.Equal(got, tc.wantOrder) {
				t.Errorf("execution order %v, want %v", got, tc.wantOrder)
			}
		})
	}
}

// TestExpiredItemsNeverRun checks that an item whose deadline passes while
// it is queued is dropped, never executed, and its slot released.
func TestExpiredItemsNeverRun(t *testing.T) {
	cases := []struct {
		name  string
		delay time.Duration // MaxQueueDelay
		hold  bool          // the device is busy with a held batch
	}{
		{"while the device is busy", 0, true},
		{"while waiting for the queue delay", 300 * time.Millisecond, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{MaxQueueDelay: tc.delay})
			f := newFake("cpu:0")
			mustAdd(t, s, "m", cpu0, 8, f)
			var warm <-chan submitted
			if tc.hold {
				f.hold = make(chan struct{})
				warm = submitAsync(context.Background(), s, Request{Model: "m", Inputs: []any{"warm"}})
				waitEntered(t, f)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			in := inputs("doomed", 3)
			_, err := s.Submit(ctx, Request{Model: "m", Inputs: in})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want DeadlineExceeded", err)
			}
			if q := queuedItems(t, s, "m"); q != 0 {
				t.Errorf("queued after expiry = %d, want 0", q)
			}
			if tc.hold {
				close(f.hold)
				recv(t, warm)
			}
			// Later work still runs, and the expired items never did.
			if _, err := s.Submit(context.Background(), Request{Model: "m", Inputs: []any{"after"}}); err != nil {
				t.Fatal(err)
			}
			for _, x := range in {
				if n := f.runCount(x); n != 0 {
					t.Errorf("expired input %v ran %d times", x, n)
				}
			}
			if got := modelRow(t, s, "m").Failed[ReasonTimeout]; got != 1 {
				t.Errorf("timeout failures = %d, want 1", got)
			}
		})
	}
}

// TestCancelLeavesQueue cancels a queued call: Submit returns Canceled at
// once, its items leave the queue and never run.
func TestCancelLeavesQueue(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFake("cpu:0")
	f.hold = make(chan struct{})
	mustAdd(t, s, "m", cpu0, 4, f)
	warm := submitAsync(context.Background(), s, Request{Model: "m", Inputs: []any{"warm"}})
	waitEntered(t, f)

	ctx, cancel := context.WithCancel(context.Background())
	in := inputs("gone", 10)
	ch := submitAsync(ctx, s, Request{Model: "m", Inputs: in})
	waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == 10 })
	cancel()
	r := recv(t, ch)
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("err = %v, want Canceled", r.err)
	}
	if q := queuedItems(t, s, "m"); q != 0 {
		t.Errorf("queued after cancel = %d, want 0", q)
	}
	close(f.hold)
	recv(t, warm)
	if _, err := s.Submit(context.Background(), Request{Model: "m", Inputs: []any{"after"}}); err != nil {
		t.Fatal(err)
	}
	for _, x := range in {
		if n := f.runCount(x); n != 0 {
			t.Errorf("cancelled input %v ran %d times", x, n)
		}
	}
	if got := modelRow(t, s, "m").Failed[ReasonCancelled]; got != 1 {
		t.Errorf("cancelled failures = %d, want 1", got)
	}
}

// TestQueueFull fills the bounded queue and checks a request that does not
// fit is refused whole, with a retry hint, while one that fits is taken.
func TestQueueFull(t *testing.T) {
	s := newTestScheduler(t, Options{MaxQueueItems: 10})
	f := newFake("cpu:0")
	f.hold = make(chan struct{})
	mustAdd(t, s, "m", cpu0, 1, f)
	ctx := context.Background()
	warm := submitAsync(ctx, s, Request{Model: "m", Inputs: []any{"warm"}})
	waitEntered(t, f)
	big := submitAsync(ctx, s, Request{Model: "m", Inputs: inputs("big", 8)})
	waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == 8 })

	cases := []struct {
		name    string
		items   int
		refused bool
	}{
		{"over the bound is refused", 3, true},
		// Larger than the whole queue is ErrInvalidArgument, not a retry:
		// TestRequestLargerThanQueueIsInvalid.
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Submit(ctx, Request{Model: "m", Inputs: inputs(tc.name, tc.items)})
			if !errors.Is(err, ErrQueueFull) {
				t.Fatalf("err = %v, want ErrQueueFull", err)
			}
			var qf *QueueFullError
			if !errors.As(err, &qf) || qf.RetryAfter <= 0 || qf.Requested != tc.items || qf.Queued != 8 {
				t.Errorf("QueueFullError = %+v, want RetryAfter > 0, Requested %d, Queued 8", qf, tc.items)
			}
			if q := queuedItems(t, s, "m"); q != 8 {
				t.Errorf("queued = %d after a refusal, want 8 (nothing enqueued)", q)
			}
		})
	}
	// Another client's: the first holds 8, past its share of 5
	// (TestQueueShareOfOneClient).
	fits := submitAsync(ctx, s, Request{Model: "m", Client: "other", Inputs: inputs("fits", 2)})
	waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == 10 })
	close(f.hold)
	for _, ch := range []<-chan submitted{warm, big, fits} {
		if r := recv(t, ch); r.err != nil {
			t.Fatal(r.err)
		}
	}
	if got := modelRow(t, s, "m").Failed[ReasonRejected]; got != 1 {
		t.Errorf("rejected = %d, want 1", got)
	}
}

// TestLargeRequestSplitsAndInterleaves sends a 5000-item request and, after
// it, small requests of other clients: they run in the next batch, and the
// large one is split into full batches with its outputs in order.
func TestLargeRequestSplitsAndInterleaves(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFake("cpu:0")
	f.hold = make(chan struct{})
	mustAdd(t, s, "m", cpu0, 8, f)
	ctx := context.Background()
	warm := submitAsync(ctx, s, Request{Model: "m", Client: "w", Inputs: []any{"warm"}})
	waitEntered(t, f)

	bigIn := inputs("big", 5000)
	big := submitAsync(ctx, s, Request{Model: "m", Client: "big", Inputs: bigIn})
	waitFor(t, "big queued", func() bool { return queuedItems(t, s, "m") == 5000 })
	smallIn := [][]any{inputs("s1", 1), inputs("s2", 2)}
	var small []<-chan submitted
	for i, in := range smallIn {
		small = append(small, submitAsync(ctx, s, Request{Model: "m", Client: fmt.Sprint("small", i), Inputs: in}))
	}
	waitFor(t, "small queued", func() bool { return queuedItems(t, s, "m") == 5003 })
	close(f.hold)
	recv(t, warm)

	for i, ch := range small {
		r := recv(t, ch)
		if r.err != nil {
			t.Fatal(r.err)
		}
		checkOutputs(t, smallIn[i], r.resp.Outputs)
	}
	rb := recv(t, big)
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	checkOutputs(t, bigIn, rb.resp.Outputs)
	if rb.resp.Info.BatchSize != 8 || len(rb.resp.Info.BatchSizes) < 5000/8 {
		t.Errorf("big request ran in %d batches, largest %d; want at least %d batches of up to 8",
			len(rb.resp.Info.BatchSizes), rb.resp.Info.BatchSize, 5000/8)
	}
	// Round-robin: the first batch after the held one holds the small
	// clients' 3 items between the big one's.
	first := f.batchList()[1]
	var smalls int
	for _, x := range first {
		if s := x.(string); s[0] == 's' {
			smalls++
		}
	}
	if len(first) != 8 || smalls != 3 {
		t.Errorf("first batch %v: want 8 items, 3 of them from the small clients", first)
	}
}

// TestOutputsInOrderNoMixing runs many concurrent clients with random sizes
// over two replicas with different batch limits: every output belongs to
// its own input, in order.
func TestOutputsInOrderNoMixing(t *testing.T) {
	s := newTestScheduler(t, Options{})
	mustAdd(t, s, "m", cpu0, 8, newFake("cpu:0"))
	mustAdd(t, s, "m", Device{ID: "gpu:0", Type: "gpu"}, 32, newFake("gpu:0"))
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for c := range 64 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			for r := range 5 {
				in := inputs(fmt.Sprintf("c%d/r%d", c, r), 1+rng.IntN(40))
				resp, err := s.Submit(context.Background(), Request{Model: "m", Client: fmt.Sprint(c), Priority: 1 + rng.IntN(3), Inputs: in})
				if err != nil {
					errs <- err
					return
				}
				for i := range in {
					if got, ok := resp.Outputs[i].(result); !ok || got.In != in[i] {
						errs <- fmt.Errorf("client %d request %d: output %d = %v, want the result of %v", c, r, i, resp.Outputs[i], in[i])
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestSubmitErrors checks the fast failures and their sentinels.
func TestSubmitErrors(t *testing.T) {
	s := newTestScheduler(t, Options{})
	mustAdd(t, s, "m", cpu0, 4, newFake("cpu:0"))
	cases := []struct {
		name string
		req  Request
		want error
	}{
		{"unknown model", Request{Model: "nope", Inputs: []any{1}}, ErrUnknownModel},
		{"pinned ID not serving the model", Request{Model: "m", DeviceID: "gpu:7", Inputs: []any{1}}, ErrDeviceNotFound},
		{"pinned type with no replica", Request{Model: "m", DeviceType: "tpu", Inputs: []any{1}}, ErrNoMatchingReplica},
		{"ID and type disagree", Request{Model: "m", DeviceID: "cpu:0", DeviceType: "gpu", Inputs: []any{1}}, ErrNoMatchingReplica},
		{"pins matching nothing are still no device", Request{Model: "m", DeviceType: "tpu", Inputs: []any{1}}, ErrNoDevice},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Submit(context.Background(), tc.req); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("pins that match run there", func(t *testing.T) {
		resp, err := s.Submit(context.Background(), Request{Model: "m", DeviceID: "cpu:0", DeviceType: "cpu", Inputs: []any{"p"}})
		if err != nil || resp.Info.DeviceID != "cpu:0" {
			t.Errorf("resp %+v, err %v; want run on cpu:0", resp.Info, err)
		}
	})
	t.Run("empty request", func(t *testing.T) {
		resp, err := s.Submit(context.Background(), Request{Model: "m"})
		if err != nil || len(resp.Outputs) != 0 {
			t.Errorf("resp %+v, err %v; want no outputs, no error", resp, err)
		}
	})
	t.Run("add replica validation", func(t *testing.T) {
		for _, err := range []error{
			s.AddReplica("", cpu0, 1, newFake("x")),
			s.AddReplica("m", Device{}, 1, newFake("x")),
			s.AddReplica("m", cpu0, 0, newFake("x")),
			s.AddReplica("m", Device{ID: "gpu:3"}, 1, nil),
			s.AddReplica("m", cpu0, 1, newFake("x")), // already served
		} {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("err = %v, want ErrInvalidArgument", err)
			}
		}
	})
}

// TestPinnedRequestsShareTheQueue checks that pinned requests are batched in
// the model's queue but run only on matching replicas.
func TestPinnedRequestsShareTheQueue(t *testing.T) {
	s := newTestScheduler(t, Options{})
	fc, fg := newFake("cpu:0"), newFake("gpu:0")
	mustAdd(t, s, "m", cpu0, 4, fc)
	mustAdd(t, s, "m", Device{ID: "gpu:0", Type: "gpu"}, 4, fg)
	cases := []struct {
		name, id, typ, want string
	}{
		{"by type", "", "gpu", "gpu:0"},
		{"by ID", "cpu:0", "", "cpu:0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Go(func() {
					in := inputs(fmt.Sprint(tc.name, i), 3)
					resp, err := s.Submit(context.Background(), Request{Model: "m", DeviceID: tc.id, DeviceType: tc.typ, Inputs: in})
					if err != nil {
						t.Error(err)
						return
					}
					for _, o := range resp.Outputs {
						if o.(result).Dev != tc.want {
							t.Errorf("ran on %s, want %s", o.(result).Dev, tc.want)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestBatchCostLimit: with WithMaxBatchCost, batches also stop at the summed
// item costs (tokens), an item over the limit runs alone, and every item is
// still answered in order.
func TestBatchCostLimit(t *testing.T) {
	cases := []struct {
		name  string
		costs []int // one single-item request each, from different clients
		limit int
		want  []int // batch sizes after the held first batch
	}{
		{"tokens split batches", []int{40, 40, 40, 40, 40}, 100, []int{2, 2, 1}},
		{"item count still bounds", []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 1000, []int{8, 2}},
		{"oversized item runs alone", []int{10, 500, 10}, 100, []int{1, 1, 1}},
		{"exact fit", []int{50, 50, 50, 50}, 100, []int{2, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f := newFake("cpu:0")
			f.hold = make(chan struct{})
			if err := s.AddReplica("m", cpu0, 8, f, WithMaxBatchCost(tc.limit)); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			first := submitAsync(ctx, s, Request{Model: "m", Client: "a", Inputs: inputs("first", 1)})
			waitEntered(t, f)
			var chans []<-chan submitted
			var ins [][]any
			for i, c := range tc.costs {
				in := inputs(fmt.Sprintf("r%d", i), 1)
				ins = append(ins, in)
				chans = append(chans, submitAsync(ctx, s, Request{Model: "m", Client: "c", Inputs: in, Costs: []int{c}}))
				waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == int64(i+1) })
			}
			close(f.hold)
			if r := recv(t, first); r.err != nil {
				t.Fatal(r.err)
			}
			for i, ch := range chans {
				r := recv(t, ch)
				if r.err != nil {
					t.Fatal(r.err)
				}
				checkOutputs(t, ins[i], r.resp.Outputs)
			}
			if got := f.batchSizes()[1:]; !slices.Equal(got, tc.want) {
				t.Errorf("batch sizes %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("costs must match inputs", func(t *testing.T) {
		s := newTestScheduler(t, Options{})
		mustAdd(t, s, "m", cpu0, 8, newFake("cpu:0"))
		_, err := s.Submit(context.Background(), Request{Model: "m", Inputs: inputs("x", 2), Costs: []int{1}})
		if !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("err = %v, want ErrInvalidArgument", err)
		}
	})
}
