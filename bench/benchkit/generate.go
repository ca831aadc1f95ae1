package benchkit

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

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
	s := scheduler.New(scheduler.Options{})
	defer s.Close()
	opts := eng.Options()
	if err := s.AddGenReplica("m", scheduler.Device{ID: "cpu:0", Type: "cpu"},
		scheduler.GenOptions{MaxRunning: running, MaxStepTokens: opts.MaxStepTokens, MaxChunk: chunk}, lifecycle.EngineExecutor{Engine: eng}); err != nil {
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
				now := time.Since(start)
				if len(res.Tokens[i]) == 0 {
					res.TTFT[i] = now
				}
				res.End[i] = now
				res.Tokens[i] = append(res.Tokens[i], ev.Token)
			}
		}()
	}
	wg.Wait()
	res.Took = time.Since(start)
	return res, errors.Join(errs...)
}
