package benchkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/lifecycle"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/scheduler"
)

// Job is one sequence of a generation round: its prompt and how many
// tokens to generate.
type Job struct {
	Prompt []int32
	Out    int
}

// RoundResult is how a round went: the time until the last sequence
// finished, and per job its time to first token, the time of its last
// token and the tokens it generated.
type RoundResult struct {
	Took      time.Duration
	TTFT, End []time.Duration
	Tokens    [][]int32
}

// Round runs jobs through a fresh scheduler over eng with a running set
// of at most running sequences and a prefill chunk of chunk tokens, greedy
// and ignoring EOS, so each job generates exactly its Out tokens; all jobs
// are submitted at once, as a council round's are.
func Round(ctx context.Context, m *llm.Model, eng *llm.Engine, jobs []Job, running, chunk int) (RoundResult, error) {
	return RoundWith(ctx, m, eng, jobs, RoundOptions{Running: running, Chunk: chunk})
}

// RoundOptions are a round's scheduler settings.
type RoundOptions struct {
	Running, Chunk int
	// Spec is the tokens a decoding step may guess (GenOptions.SpecTokens;
	// the engine's MaxDrafts must allow them): 0 off.
	Spec int
	// Registerer takes the scheduler's metrics (nil: none).
	Registerer prometheus.Registerer
}

// RoundWith is Round with o's settings. A step that took guesses gives
// several tokens in one event: they are read from its llm.Delta.
func RoundWith(ctx context.Context, m *llm.Model, eng *llm.Engine, jobs []Job, o RoundOptions) (RoundResult, error) {
	s := scheduler.New(scheduler.Options{Registerer: o.Registerer})
	defer s.Close()
	if err := s.AddGenReplica("m", scheduler.Device{ID: "cpu:0", Type: "cpu"},
		scheduler.GenOptions{MaxRunning: o.Running, MaxStepTokens: eng.Options().MaxStepTokens, MaxChunk: o.Chunk, SpecTokens: o.Spec},
		lifecycle.EngineExecutor{Engine: eng}); err != nil {
		return RoundResult{}, err
	}
	res := RoundResult{TTFT: make([]time.Duration, len(jobs)), End: make([]time.Duration, len(jobs)), Tokens: make([][]int32, len(jobs))}
	errs := make([]error, len(jobs))
	start := time.Now()
	var wg sync.WaitGroup
	for i, j := range jobs {
		seq, err := m.NewSequence(llm.Sampling{IgnoreEOS: true}, j.Prompt)
		if err != nil {
			return res, err
		}
		st, err := s.Generate(ctx, scheduler.GenRequest{Model: "m", Prompt: j.Prompt, MaxNewTokens: j.Out, State: seq})
		if err != nil {
			return res, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ev, err := st.Recv()
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					errs[i] = err
					return
				}
				if !ev.HasToken {
					continue
				}
				toks := []int32{ev.Token}
				if d, ok := ev.Out.(llm.Delta); ok && len(d.TokenIDs) > 0 {
					if d.TokenIDs[len(d.TokenIDs)-1] != ev.Token {
						errs[i] = fmt.Errorf("job %d: an event's token %d is not the last of its delta's %v", i, ev.Token, d.TokenIDs)
						return
					}
					toks = d.TokenIDs
				}
				now := time.Since(start)
				if len(res.Tokens[i]) == 0 {
					res.TTFT[i] = now
				}
				res.End[i] = now
				res.Tokens[i] = append(res.Tokens[i], toks...)
			}
		}()
	}
	wg.Wait()
	res.Took = time.Since(start)
	return res, errors.Join(errs...)
}
