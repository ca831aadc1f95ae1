package llm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"

	"github.com/brokerd/brokerd/scheduler"
)

// genExecutor adapts the engine to scheduler.GenExecutor, as the model
// lifecycle does (the runtime does not import the scheduler; only this
// test does).
type genExecutor struct {
	e    *Engine
	gate <-chan struct{} // when non-nil, steps wait for it to close
}

func (g genExecutor) Reserve(seq uint64, tokens int) bool { return g.e.Reserve(seq, tokens) }
func (g genExecutor) Release(seq uint64)                  { g.e.Release(seq) }
func (g genExecutor) Step(ctx context.Context, items []scheduler.StepItem) ([]scheduler.StepResult, error) {
	if g.gate != nil {
		<-g.gate
	}
	in := make([]SeqStep, len(items))
	for i, it := range items {
		in[i] = SeqStep(it)
	}
	res, err := g.e.Step(ctx, in)
	if err != nil {
		return nil, err
	}
	out := make([]scheduler.StepResult, len(res))
	for i, r := range res {
		out[i] = scheduler.StepResult(r)
	}
	return out, nil
}

// TestUnderScheduler runs sequences through the scheduler's continuous
// batching with a cache too small for all of them (so the newest are
// preempted and recomputed) and checks each sequence's tokens against the
// same sequence run alone, greedy and seeded.
func TestUnderScheduler(t *testing.T) {
	for name, open := range testDevices(t) {
		t.Run(name, func(t *testing.T) {
			s := tinyNet("qwen3")
			perBlock := int64(2 * s.Layers * 4 * s.KVHeads * s.HeadDim * 4)
			e := newTestEngine(t, open(t), s, 5, EngineOptions{CacheBytes: 24 * perBlock, BlockSize: 4})
			type want struct {
				prompt []int32
				params Sampling
				gen    int
				out    []int32
			}
			var wants []*want
			for i := range 8 {
				p := Sampling{}
				if i%2 == 1 {
					p = Sampling{Temperature: 0.8, TopP: 0.9, Seed: uint64(i), Seeded: true}
				}
				w := &want{prompt: prompt(3+5*i%23, int32(i), s.Vocab), params: p, gen: 6 + 3*i%17}
				j := &job{seq: uint64(1000 + i), prompt: w.prompt, gen: w.gen, chunk: len(w.prompt), params: p}
				simulate(t, e, []*job{j})
				w.out = j.out
				wants = append(wants, w)
			}
			sch := scheduler.New(scheduler.Options{})
			defer sch.Close()
			// Steps wait until every sequence is submitted, so they share
			// steps whatever the goroutines' timing.
			gate := make(chan struct{})
			if err := sch.AddGenReplica("m", scheduler.Device{ID: "cpu:0", Type: "cpu"},
				scheduler.GenOptions{MaxRunning: 5, MaxStepTokens: 12, MaxChunk: 5}, genExecutor{e, gate}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			preempted, maxBatch := 0, 0
			errs := make(chan error, len(wants))
			streams := make([]*scheduler.GenStream, len(wants))
			for i, w := range wants {
				seq, err := newSequence(w.params, w.prompt, s.Vocab, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if streams[i], err = sch.Generate(context.Background(), scheduler.GenRequest{Model: "m", Prompt: w.prompt, MaxNewTokens: w.gen, State: seq}); err != nil {
					t.Fatal(err)
				}
			}
			close(gate)
			for i, w := range wants {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st := streams[i]
					var got []int32
					for {
						ev, err := st.Recv()
						if errors.Is(err, io.EOF) {
							break
						}
						if err != nil {
							errs <- err
							return
						}
						if ev.HasToken {
							got = append(got, ev.Token)
						}
						if ev.Info != nil {
							mu.Lock()
							preempted += ev.Info.Preemptions
							maxBatch = max(maxBatch, ev.Info.MaxBatch)
							mu.Unlock()
						}
					}
					if !slices.Equal(got, w.out) {
						errs <- fmt.Errorf("sequence %d: %v under the scheduler, %v alone", i, got, w.out)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			// The test means something only if steps were shared and the
			// cache ran out.
			if preempted == 0 || maxBatch < 3 {
				t.Errorf("%d preemptions, at most %d sequences in a step: the schedule did not mix", preempted, maxBatch)
			}
			t.Logf("%d preemptions, up to %d sequences per step", preempted, maxBatch)
			if err := sch.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
			if used, _ := e.CacheBlocks(); used != 0 {
				t.Errorf("%d cache blocks held after the drain", used)
			}
		})
	}
}
