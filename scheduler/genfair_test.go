package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// Fairness of generation between clients, counted in steps (never on the
// clock): a greedy client's load must not decide when another client's
// sequence runs.

// stepsWith returns the indices of f's steps that ran sequence id.
func (f *fakeGen) stepsWith(id uint64) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for i, ids := range f.steps {
		if slices.Contains(ids, id) {
			out = append(out, i)
		}
	}
	return out
}

func (f *fakeGen) stepCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.steps)
}

// running is how many sequences model's replicas run.
func running(s *Scheduler, model string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	if gq := s.gens[model]; gq != nil {
		for _, r := range gq.replicas {
			n += len(r.running)
		}
	}
	return n
}

// floodAndProbe starts client a's sequences (stepping through f's gate
// until the running set is full of them), then client b's one short sequence, lets
// every step through and returns how many steps b's first step came after
// its submission, and the steps b took part in.
func floodAndProbe(t *testing.T, s *Scheduler, f *fakeGen, gate chan struct{}, full int, flood []GenRequest, probe GenRequest) (wait int, steps []int) {
	t.Helper()
	var streams []*GenStream
	for _, req := range flood {
		st, err := s.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	// The loop may have admitted the first before the others came: steps
	// go through until all run, and one more, so a has tokens served.
	for running(s, "llm") < full {
		gate <- struct{}{}
	}
	gate <- struct{}{}
	b, err := s.Generate(context.Background(), probe)
	if err != nil {
		t.Fatal(err)
	}
	submitted := f.stepCount()
	close(gate)
	if r := collect(b); r.err != nil || len(r.tokens) != probe.MaxNewTokens {
		t.Fatalf("client b: %d tokens, %v", len(r.tokens), r.err)
	}
	for _, st := range streams {
		if r := collect(st); r.err != nil {
			t.Fatal(r.err)
		}
	}
	f.check(t)
	steps = f.stepsWith(b.Seq())
	return steps[0] - submitted, steps
}

// TestGenerateFairRunningSlots: client a fills the running set with long
// sequences and queues more; client b's one short sequence runs within a
// few steps (a's newest running sequence is preempted for it), not once
// one of a's 200-token sequences ends.
func TestGenerateFairRunningSlots(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f, gate := addHeldGen(t, s, 4096, GenOptions{MaxRunning: 4, MaxStepTokens: 64})
	var flood []GenRequest
	for i := range 8 {
		flood = append(flood, GenRequest{Model: "llm", Client: "a", Prompt: prompt(i, 3), MaxNewTokens: 200, State: &genState{}})
	}
	wait, _ := floodAndProbe(t, s, f, gate, 4, flood,
		GenRequest{Model: "llm", Client: "b", Prompt: prompt(99, 3), MaxNewTokens: 2, State: &genState{}})
	if wait > 3 {
		t.Errorf("client b's sequence first ran %d steps after it was submitted, want at most 3 (a's sequences are 200 tokens long)", wait)
	}
}

// TestGeneratePrefillLeavesRoom: client a's long prompts, prefilled in
// chunks that would fill every step's token budget, leave room for client
// b's prompt within a few steps, and b's sequence then advances in every
// step until it ends.
func TestGeneratePrefillLeavesRoom(t *testing.T) {
	s := newTestScheduler(t, Options{})
	opts := GenOptions{MaxRunning: 8, MaxStepTokens: 16, MaxChunk: 8}
	f, gate := addHeldGen(t, s, 4096, opts)
	var flood []GenRequest
	for i := range 2 {
		flood = append(flood, GenRequest{Model: "llm", Client: "a", Prompt: prompt(i, 400), MaxNewTokens: 2, State: &genState{}})
	}
	wait, steps := floodAndProbe(t, s, f, gate, 2, flood,
		GenRequest{Model: "llm", Client: "b", Prompt: prompt(99, 3), MaxNewTokens: 5, State: &genState{}})
	if wait > 3 {
		t.Errorf("client b's prompt first ran %d steps after it was submitted, want at most 3 (a's prompts take 50 steps)", wait)
	}
	if n := len(steps); n != 5 || steps[n-1]-steps[0] != n-1 {
		t.Errorf("client b's sequence (5 tokens) ran in steps %v, want 5 steps in a row", steps)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, n := range f.tokens {
		if n > opts.MaxStepTokens || len(f.steps[i]) > opts.MaxRunning {
			t.Errorf("step %d: %d tokens of %d sequences", i, n, len(f.steps[i]))
		}
	}
}

// TestGeneratePreemptionProgresses: sequences of several clients that
// cannot all fit the KV cache preempt one another, and every one still
// ends with its own tokens, in a bounded number of steps (no livelock of
// sequences evicting each other before they finish).
func TestGeneratePreemptionProgresses(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFakeGen(4, 12) // 48 tokens: one of the sequences below at a time
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 32, MaxChunk: 8}, f); err != nil {
		t.Fatal(err)
	}
	cs := make([]genCase, 4)
	alone := 0
	for i := range cs {
		cs[i] = genCase{prompt: prompt(i, 16), maxNew: 24}
		alone += 2 + 24 // two chunks, then a token a step
	}
	res := make([]genResult, len(cs))
	var streams []*GenStream
	for i, c := range cs {
		st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: fmt.Sprint("c", i), Prompt: c.prompt, MaxNewTokens: c.maxNew, State: &genState{}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	for i, st := range streams {
		res[i] = collect(st)
	}
	checkGen(t, cs, res)
	f.check(t)
	if n := f.stepCount(); n > 4*alone {
		t.Errorf("%d steps, over 4× the %d the sequences take one after another", n, alone)
	}
	t.Logf("%d steps (%d one after another)", f.stepCount(), alone)
}

// TestGenerateCancelDuringPrefill: a caller that goes while its long
// prompt is prefilled in chunks, or while it waits, leaves at the next
// step boundary: no chunk of it runs after the step in flight, its blocks
// are freed, and the sequences beside it go on.
func TestGenerateCancelDuringPrefill(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f, gate := addHeldGen(t, s, 4096, GenOptions{MaxRunning: 2, MaxStepTokens: 16, MaxChunk: 8})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long, err := s.Generate(ctx, GenRequest{Model: "llm", Client: "a", Prompt: prompt(1, 400), MaxNewTokens: 5, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: "b", Prompt: prompt(2, 3), MaxNewTokens: 20, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	waiting, err := s.Generate(ctx, GenRequest{Model: "llm", Client: "c", Prompt: prompt(3, 300), MaxNewTokens: 5, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	<-f.entered
	gate <- struct{}{}        // the first step ran a chunk of the long prompt
	<-f.entered               // the second is in flight
	inFlight := f.stepCount() // the step in flight has not been recorded yet
	cancel()
	for _, st := range []*GenStream{long, waiting} {
		if r := collect(st); !errors.Is(r.err, context.Canceled) {
			t.Errorf("cancelled sequence: %v", r.err)
		}
	}
	close(gate)
	if r := collect(other); r.err != nil || len(r.tokens) != 20 {
		t.Fatalf("the sequence beside them: %d tokens, %v", len(r.tokens), r.err)
	}
	if steps := f.stepsWith(long.Seq()); steps[len(steps)-1] > inFlight {
		t.Errorf("the cancelled prompt ran in steps %v, none after %d (the one in flight)", steps, inFlight)
	}
	if steps := f.stepsWith(waiting.Seq()); len(steps) > 0 {
		t.Errorf("the sequence cancelled while waiting ran in steps %v", steps)
	}
	waitFor(t, "every block freed", func() bool { return f.blocksUsed() == 0 })
	f.check(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.clientQueued) != 0 || s.queued != 0 {
		t.Errorf("%d queued, queued per client %v after every sequence ended", s.queued, s.clientQueued)
	}
}

// TestGenerateForgetsIdleClients: the tokens served per client are kept
// while the client has sequences, not for every client ever seen (client
// IDs are addresses or keys: a caller rotating addresses grew the map by
// one entry per sequence, for the model's life).
func TestGenerateForgetsIdleClients(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFakeGen(4, 64)
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 64}, f); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	for i := range 50 {
		c := context.Background()
		if i%2 == 1 {
			c = ctx // half of them cancelled, possibly mid-step
		}
		st, err := s.Generate(c, GenRequest{Model: "llm", Client: fmt.Sprint("ip:", i), Prompt: prompt(i, 5), MaxNewTokens: 3, State: &genState{}})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			cancel()
			ctx, cancel = context.WithCancel(context.Background())
		}
		collect(st)
	}
	cancel()
	waitFor(t, "every block freed", func() bool { return f.blocksUsed() == 0 })
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.gens["llm"].served); n != 0 {
		t.Errorf("tokens served are kept for %d clients with nothing queued or running", n)
	}
}

// TestGenerateOutgrowsCache: a sequence longer than the whole KV cache
// (the edge refuses one longer than the context, and a replica's cache
// holds a context) ends with FinishLength and the tokens it has once it
// runs alone, instead of looping; the newer one it preempted on the way
// still ends with all its tokens.
func TestGenerateOutgrowsCache(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFakeGen(4, 6) // 24 tokens
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 16, MaxChunk: 8}, f); err != nil {
		t.Fatal(err)
	}
	big, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: "a", Prompt: prompt(1, 10), MaxNewTokens: 40, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	small, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: "b", Prompt: prompt(2, 3), MaxNewTokens: 8, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	rb, rs := collect(big), collect(small)
	want, _ := expected(prompt(1, 10), 40, 0)
	if rb.err != nil || rb.finish != FinishLength || len(rb.tokens) == 0 || len(rb.tokens) > 24-10+1 || !slices.Equal(rb.tokens, want[:len(rb.tokens)]) {
		t.Errorf("the sequence over the cache: %d tokens, finish %q, %v; want FinishLength within the cache's 24 tokens (the last one sampled, not stored)", len(rb.tokens), rb.finish, rb.err)
	}
	checkGen(t, []genCase{{prompt: prompt(2, 3), maxNew: 8}}, []genResult{rs})
	waitFor(t, "every block freed", func() bool { return f.blocksUsed() == 0 })
	f.check(t)
}
