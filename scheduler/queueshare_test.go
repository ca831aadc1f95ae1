package scheduler

import (
	"context"
	"errors"
	"testing"
)

// TestQueueShareOfOneClient: one client's queued items, batch items and
// waiting generation sequences together, fill at most half the queue, so
// it cannot fill the queue and refuse every other client. Refused items
// are a *QueueFullError naming the client (RESOURCE_EXHAUSTED with a retry
// delay at the edge, as the queue's own bound); a client with nothing
// queued may still queue one request larger than its share, which could
// never run otherwise.
func TestQueueShareOfOneClient(t *testing.T) {
	s := newTestScheduler(t, Options{MaxQueueItems: 10})
	f := newFake("cpu:0")
	f.hold = make(chan struct{})
	mustAdd(t, s, "m", cpu0, 1, f)
	g := newFakeGen(4, 64)
	if err := s.AddGenReplica("llm", Device{ID: "cpu:1", Type: "cpu"}, GenOptions{MaxRunning: 1, MaxStepTokens: 64}, g); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	warm := submitAsync(ctx, s, Request{Model: "m", Client: "w", Inputs: []any{"warm"}})
	waitEntered(t, f)

	var chans []<-chan submitted
	queue := func(client string, n int) {
		chans = append(chans, submitAsync(ctx, s, Request{Model: "m", Client: client, Inputs: inputs(client, n)}))
	}
	queue("a", 5) // a's share: (10+1)/2
	waitFor(t, "a's items queued", func() bool { return queuedItems(t, s, "m") == 5 })

	type refusal struct {
		client        string // "" for the queue's own bound
		queued, limit int
	}
	cases := []struct {
		name   string
		client string
		items  int
		gen    bool // a generation sequence of the client instead of items
		want   refusal
	}{
		{"past a's share, the queue with room", "a", 1, false, refusal{"a", 5, 5}},
		{"a's waiting sequences count in its share", "a", 1, true, refusal{"a", 5, 5}},
		{"b's items fill the queue", "b", 5, false, refusal{}},
		{"then the queue's own bound", "c", 1, false, refusal{"", 10, 10}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.gen {
				_, err = s.Generate(ctx, GenRequest{Model: "llm", Client: tc.client, Prompt: prompt(1, 3), MaxNewTokens: 1, State: &genState{}})
			} else if tc.want.limit == 0 {
				queue(tc.client, tc.items)
				waitFor(t, "queued", func() bool { return queuedItems(t, s, "m") == 10 })
				return
			} else {
				// Refused at once, or queued (a failure: it is cancelled).
				before := queuedItems(t, s, "m")
				cctx, ccancel := context.WithCancel(ctx)
				ch := submitAsync(cctx, s, Request{Model: "m", Client: tc.client, Inputs: inputs(tc.client, tc.items)})
				waitFor(t, "an answer or the items queued", func() bool { return len(ch) > 0 || queuedItems(t, s, "m") != before })
				ccancel()
				err = recv(t, ch).err
			}
			var full *QueueFullError
			if !errors.As(err, &full) || !errors.Is(err, ErrQueueFull) {
				t.Fatalf("err = %v, want a *QueueFullError", err)
			}
			if full.Client != tc.want.client || full.Queued != tc.want.queued || full.Limit != tc.want.limit || full.RetryAfter <= 0 {
				t.Errorf("QueueFullError = %+v, want client %q, queued %d, limit %d, a retry delay", full, tc.want.client, tc.want.queued, tc.want.limit)
			}
		})
	}
	close(f.hold)
	for _, ch := range append(chans, warm) {
		if r := recv(t, ch); r.err != nil {
			t.Fatal(r.err)
		}
	}
	s.mu.Lock()
	left, perClient := s.queued, len(s.clientQueued)
	s.mu.Unlock()
	if left != 0 || perClient != 0 {
		t.Errorf("%d queued, %d clients counted after every item ran", left, perClient)
	}
	// Alone, a client may queue more than its share in one request.
	if _, err := s.Submit(ctx, Request{Model: "m", Client: "d", Inputs: inputs("d", 8)}); err != nil {
		t.Errorf("8 items of a client with nothing queued, queue of 10: %v", err)
	}
}
