package scheduler

import (
	"context"
	"testing"
)

// TestGenerateManyWaitingLeaveInLinearWork: n waiting sequences that all
// leave at once (their callers cancel, their last replica is removed, the
// scheduler closes) are taken out of the waiting list in O(1) each, under
// the scheduler's lock that every model's steps share. Counted in waiting
// entries visited, not timed: a scan per removal is n²/2 of them (8.4M for
// 4096), and n is up to 32768 per client.
func TestGenerateManyWaitingLeaveInLinearWork(t *testing.T) {
	const n = 4096
	cases := []struct {
		name string
		// leave makes the waiting sequences leave while the running one
		// is held in its step, and then lets the step go (close(gate)).
		leave func(t *testing.T, s *Scheduler, cancel func(), gate chan struct{})
	}{
		{"their callers cancel", func(t *testing.T, s *Scheduler, cancel func(), gate chan struct{}) {
			cancel()
			waitFor(t, "the waiting sequences answered", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return s.queued == 0
			})
			close(gate)
		}},
		{"the last replica is removed", func(t *testing.T, s *Scheduler, cancel func(), gate chan struct{}) {
			removed := make(chan error, 1)
			go func() { removed <- s.RemoveReplica(context.Background(), "llm", "cpu:0") }()
			waitFor(t, "the replica detached", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return s.gens["llm"] == nil
			})
			close(gate)
			if err := <-removed; err != nil {
				t.Fatal(err)
			}
		}},
		{"the scheduler closes", func(t *testing.T, s *Scheduler, cancel func(), gate chan struct{}) {
			s.Close() // cancels the held step
			close(gate)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f, gate := addHeldGen(t, s, 64, GenOptions{MaxRunning: 1, MaxStepTokens: 64})
			// One sequence runs, held in its first step, so the rest wait.
			first, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: "a", Prompt: prompt(0, 3), MaxNewTokens: 1, State: &genState{}})
			if err != nil {
				t.Fatal(err)
			}
			<-f.entered
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			streams := make([]*GenStream, n)
			for i := range streams {
				if streams[i], err = s.Generate(ctx, GenRequest{Model: "llm", Client: "b", Prompt: prompt(i, 3), MaxNewTokens: 1, State: &genState{}}); err != nil {
					t.Fatal(err)
				}
			}
			s.mu.Lock()
			gq := s.gens["llm"]
			before := gq.waitVisits
			s.mu.Unlock()

			tc.leave(t, s, cancel, gate)
			for _, st := range streams {
				if r := collect(st); r.err == nil {
					t.Fatalf("a waiting sequence ended with %d tokens, want an error", len(r.tokens))
				}
			}
			collect(first)
			s.mu.Lock()
			visits := gq.waitVisits - before
			queued := s.queued
			s.mu.Unlock()
			if queued != 0 {
				t.Errorf("%d still queued", queued)
			}
			if visits > 2*n {
				t.Errorf("%d waiting sequences left after %d entries of the waiting list were visited, want at most %d (O(1) each)", n, visits, 2*n)
			}
		})
	}
}
