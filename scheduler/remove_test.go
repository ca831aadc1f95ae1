package scheduler

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestRemoveGenReplicaAnswersPreempted: the last replica of a
// generator is removed (an UnloadModel) while two sequences run on it and
// its KV cache is full. At the next step the newest is preempted and sent
// back to wait, but the model's genQueue has left the scheduler and no
// replica will ever admit it: the replica's loop ends once its other
// sequence finishes, RemoveReplica returns, and the preempted sequence is
// never answered. Its stream blocks until its caller goes, and the
// scheduler counts it active for ever, so Drain never completes.
func TestRemoveGenReplicaAnswersPreempted(t *testing.T) {
	s := New(Options{})
	defer s.CloseWithin(time.Second)
	// Three blocks of 4 tokens: a and b's 4-token prompts take one each,
	// and their first sampled tokens a second each, one more than there
	// is, so b, the newest, is preempted, whether the first step ran both
	// or (the loop waking before b came) only a, and the second both.
	f := newFakeGen(4, 3)
	hold := make(chan struct{})
	entered := make(chan struct{}, 1)
	f.hold, f.entered = hold, entered
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 2, MaxStepTokens: 64}, f); err != nil {
		t.Fatal(err)
	}
	a, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: "a", Prompt: prompt(1, 4), MaxNewTokens: 3, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: "b", Prompt: prompt(2, 4), MaxNewTokens: 3, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	// Wait until one step runs both (the first step may take only a, if
	// the loop woke before b arrived).
	for {
		select {
		case <-entered:
		case <-time.After(30 * time.Second):
			t.Fatal("no step started")
		}
		s.mu.Lock()
		both := a.seq.inStep && b.seq.inStep
		s.mu.Unlock()
		if both {
			break
		}
		hold <- struct{}{}
	}

	removed := make(chan error, 1)
	go func() { removed <- s.RemoveReplica(context.Background(), "llm", "cpu:0") }()
	waitFor(t, "the replica detached", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.gens["llm"] == nil
	})
	close(hold) // let every step through

	select {
	case err := <-removed:
		if err != nil {
			t.Fatalf("RemoveReplica: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("RemoveReplica did not return")
	}
	// The replica's loop has returned: every sequence it accepted must
	// have been answered by now, one way or another.
	for name, st := range map[string]*GenStream{"a": a, "b": b} {
		s.mu.Lock()
		fin, pre := st.seq.finished, st.seq.preempted
		s.mu.Unlock()
		if !fin {
			t.Errorf("sequence %s (preempted %d times) is unanswered after its last replica was removed", name, pre)
			continue
		}
		if r := collect(st); r.err != nil && !errors.Is(r.err, ErrNoDevice) {
			t.Errorf("sequence %s: %v, want its tokens or ErrNoDevice", name, r.err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Drain(ctx); err != nil {
		s.mu.Lock()
		active := s.active
		s.mu.Unlock()
		t.Errorf("Drain after the unload: %v (%d sequences still counted active)", err, active)
	}
}
