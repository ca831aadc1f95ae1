package scheduler

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// specGen is fakeGen's model with guesses (StepItem.Draft): a decoding
// item granted room guesses that many tokens, of which the first accept
// are the model's own continuation (taken) and the rest wrong. Each
// result's Out is every token it gives, []int32.
type specGen struct {
	*fakeGen
	accept int

	smu    sync.Mutex
	drafts [][]int // Draft of each item of each step
}

func (f *specGen) Step(ctx context.Context, items []StepItem) ([]StepResult, error) {
	if err := f.gate(ctx); err != nil {
		return nil, err
	}
	drafts := make([]int, len(items))
	for i, it := range items {
		drafts[i] = it.Draft
	}
	f.smu.Lock()
	f.drafts = append(f.drafts, drafts)
	f.smu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.recordLocked(items)
	out := make([]StepResult, len(items))
	for i, it := range items {
		if it.Draft > 0 && !it.Sample {
			f.errs = append(f.errs, fmt.Errorf("step %d: seq %d may guess %d after %d tokens it does not sample after", n, it.Seq, it.Draft, len(it.Tokens)))
		}
		c := f.runLocked(n, it)
		if !it.Sample {
			continue
		}
		st := it.State.(*genState)
		take := min(f.accept, it.Draft)
		var got []int32
		res := StepResult{Drafted: it.Draft}
		for {
			tok := nextToken(c)
			st.generated++
			if st.endAt > 0 && st.generated >= st.endAt {
				res.End = "dead-end"
				break
			}
			got = append(got, tok)
			if st.stopAfter > 0 && st.generated >= st.stopAfter {
				res.Token, res.Stop = tok, true
				break
			}
			if len(res.Accepted) == take {
				res.Token = tok
				break
			}
			res.Accepted = append(res.Accepted, tok)
			c = append(c, tok) // a guess taken is in the cache
		}
		if len(got) > 0 {
			res.Out = got
		}
		f.cache[it.Seq] = c
		out[i] = res
		// The room of refused guesses goes back (GenExecutor.Step).
		if keep := len(c)/f.blockSize + 1; it.Draft > 0 && f.held[it.Seq] > keep {
			f.used -= f.held[it.Seq] - keep
			f.held[it.Seq] = keep
		}
	}
	return out, nil
}

// flatTokens is the tokens of a specGen stream's events.
func flatTokens(r genResult) []int32 {
	var all []int32
	for _, o := range r.outs {
		all = append(all, o.([]int32)...)
	}
	return all
}

// TestSpecDecodeSameTokens: with guesses granted, sequences of every
// kind (chunked prompts, stops, preemptions) give the tokens they give
// without, in order, with their counts, never past max_tokens; each
// step's tokens and guesses fit its budget and the guesses their cache
// room; the metrics count what was guessed and taken.
func TestSpecDecodeSameTokens(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   GenOptions
		blocks int
		accept int
	}{
		{"all taken", GenOptions{MaxRunning: 4, MaxStepTokens: 64, MaxChunk: 16, SpecTokens: 3, SpecMaxRunning: 4}, 256, 3},
		{"some taken", GenOptions{MaxRunning: 4, MaxStepTokens: 32, MaxChunk: 8, SpecTokens: 5, SpecMaxRunning: 4}, 256, 2},
		{"none taken", GenOptions{MaxRunning: 2, MaxStepTokens: 16, SpecTokens: 4}, 256, 0},
		{"small cache", GenOptions{MaxRunning: 4, MaxStepTokens: 64, MaxChunk: 16, SpecTokens: 4, SpecMaxRunning: 4}, 14, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s := newTestScheduler(t, Options{Registerer: reg})
			f := &specGen{fakeGen: newFakeGen(4, tc.blocks), accept: tc.accept}
			if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, tc.opts, f); err != nil {
				t.Fatal(err)
			}
			cs := genCases(12)
			res := runGen(t, s, "llm", cs, 0)
			for i, c := range cs {
				want, finish := expected(c.prompt, c.maxNew, c.stopAfter)
				r := res[i]
				if got := flatTokens(r); r.err != nil || !slices.Equal(got, want) || r.finish != finish {
					t.Errorf("sequence %d: tokens %v finish %q err %v, want %v %q", i, got, r.finish, r.err, want, finish)
				}
				if r.info == nil || r.info.GeneratedTokens != len(want) {
					t.Errorf("sequence %d: info %+v, want %d generated", i, r.info, len(want))
				}
				if n := len(r.tokens); n > 0 && r.tokens[n-1] != want[len(want)-1] {
					t.Errorf("sequence %d: last event's token %d, want the last token %d", i, r.tokens[n-1], want[len(want)-1])
				}
			}
			f.check(t)
			waitFor(t, "every block freed", func() bool { return f.blocksUsed() == 0 })
			// The fake's lock is let go before the metrics are read: the
			// scheduler's collector takes the scheduler's lock, under which
			// the loop may be asking the fake for its blocks.
			f.smu.Lock()
			f.mu.Lock()
			granted := 0
			for i, d := range f.drafts {
				for _, n := range d {
					granted += n
				}
				if f.tokens[i] > tc.opts.MaxStepTokens {
					t.Errorf("step %d: %d tokens and guesses, budget %d", i, f.tokens[i], tc.opts.MaxStepTokens)
				}
			}
			f.mu.Unlock()
			f.smu.Unlock()
			if granted == 0 {
				t.Fatal("no guesses granted")
			}
			drafted := value(t, reg, "brokerd_generation_spec_decode_draft_tokens_total", "model", "llm", "device", "cpu:0")
			accepted := value(t, reg, "brokerd_generation_spec_decode_accepted_tokens_total", "model", "llm", "device", "cpu:0")
			if int(drafted) != granted || accepted > drafted || (tc.accept == 0) != (accepted == 0) {
				t.Errorf("metrics: %g drafted, %g accepted; %d granted", drafted, accepted, granted)
			}
		})
	}
}

// TestSpecDecodeGrants: guesses go only to sampling items, only while
// at most SpecMaxRunning run, within max_tokens, and never by preempting
// another sequence; none when SpecTokens is 0.
func TestSpecDecodeGrants(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       GenOptions
		blocks     int
		seqs       int
		maxNew     int
		wantGrants bool
		most       int // the largest Draft allowed
	}{
		{"off", GenOptions{MaxRunning: 4, MaxStepTokens: 64}, 256, 1, 20, false, 0},
		{"too many running", GenOptions{MaxRunning: 4, MaxStepTokens: 64, SpecTokens: 4, SpecMaxRunning: 1}, 256, 3, 20, false, 0},
		{"default bound", GenOptions{MaxRunning: 8, MaxStepTokens: 64, SpecTokens: 4}, 256, 5, 20, false, 0},
		{"max tokens", GenOptions{MaxRunning: 4, MaxStepTokens: 64, SpecTokens: 8}, 256, 1, 3, true, 2},
		{"alone", GenOptions{MaxRunning: 4, MaxStepTokens: 64, SpecTokens: 8}, 256, 1, 40, true, 8},
		// Two prompts of 9 tokens and 2 more each fill the 6 blocks of 4:
		// the guesses would fit the blocks each holds, but none is free
		// for a running sequence's next block.
		{"no free block", GenOptions{MaxRunning: 4, MaxStepTokens: 64, SpecTokens: 8}, 6, 2, 3, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f := &specGen{fakeGen: newFakeGen(4, tc.blocks), accept: 1}
			// Steps wait until every sequence is in.
			gate := make(chan struct{})
			f.hold = gate
			if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, tc.opts, f); err != nil {
				t.Fatal(err)
			}
			cs := make([]genCase, tc.seqs)
			streams := make([]*GenStream, tc.seqs)
			for i := range cs {
				cs[i] = genCase{prompt: prompt(i, 9), maxNew: tc.maxNew}
				st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: cs[i].prompt, MaxNewTokens: tc.maxNew, State: &genState{}})
				if err != nil {
					t.Fatal(err)
				}
				streams[i] = st
			}
			close(gate)
			res := make([]genResult, len(cs))
			for i, st := range streams {
				res[i] = collect(st)
			}
			for i, c := range cs {
				want, _ := expected(c.prompt, c.maxNew, 0)
				if got := flatTokens(res[i]); !slices.Equal(got, want) {
					t.Errorf("sequence %d: %v, want %v", i, got, want)
				}
				if res[i].info == nil || res[i].info.Preemptions != 0 {
					t.Errorf("sequence %d: info %+v", i, res[i].info)
				}
			}
			f.check(t)
			f.smu.Lock()
			defer f.smu.Unlock()
			// Only steps every sequence is in: the replica plans its first
			// step (a prompt's last chunk, which may guess) as soon as the
			// first sequence comes, before the gate holds it.
			grants, most := 0, 0
			for _, d := range f.drafts {
				if len(d) < tc.seqs {
					continue
				}
				for _, n := range d {
					grants += min(n, 1)
					most = max(most, n)
				}
			}
			if (grants > 0) != tc.wantGrants || most > tc.most {
				t.Errorf("%d items granted guesses, at most %d; want grants %v, at most %d", grants, most, tc.wantGrants, tc.most)
			}
		})
	}
}

// TestSpecDecodeEndAfterGuesses: a sequence whose constraint ends after
// it took guesses gets those tokens, then the End's finish.
func TestSpecDecodeEndAfterGuesses(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := &specGen{fakeGen: newFakeGen(4, 64), accept: 4}
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 2, MaxStepTokens: 32, SpecTokens: 4}, f); err != nil {
		t.Fatal(err)
	}
	p := prompt(3, 5)
	st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: p, MaxNewTokens: 50, State: &genState{endAt: 4}})
	if err != nil {
		t.Fatal(err)
	}
	r := collect(st)
	want, _ := expected(p, 3, 0)
	if got := flatTokens(r); r.err != nil || !slices.Equal(got, want) || r.finish != "dead-end" || r.info.GeneratedTokens != 3 {
		t.Fatalf("tokens %v finish %q info %+v err %v; want %v and dead-end", got, r.finish, r.info, r.err, want)
	}
	f.check(t)
}

// TestSpecDecodeNoPreemptions: guesses, all refused, cost no preemption
// that decoding without them does not: their room goes back after each
// step, so a sequence that keeps guessing does not hold the block a
// prompt's next chunk needs (it did, and the prompt was preempted and
// computed again at every chunk).
func TestSpecDecodeNoPreemptions(t *testing.T) {
	run := func(spec, blocks int) int {
		s := newTestScheduler(t, Options{})
		f := &specGen{fakeGen: newFakeGen(4, blocks)}
		gate := make(chan struct{})
		f.hold = gate
		// The first step holds the short sequence alone, every run: the
		// long prompt arrives while it waits (when both could land in the
		// first step, the counts of the two runs compared came of two
		// different schedules).
		f.entered = make(chan struct{}, 1)
		opts := GenOptions{MaxRunning: 2, MaxStepTokens: 16, MaxChunk: 8, SpecTokens: spec}
		if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, opts, f); err != nil {
			t.Fatal(err)
		}
		var streams []*GenStream
		for i, c := range []genCase{{prompt: prompt(1, 3), maxNew: 30}, {prompt: prompt(2, 40), maxNew: 2}} {
			st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: fmt.Sprint(i), Prompt: c.prompt, MaxNewTokens: c.maxNew, State: &genState{}})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, st)
			if i == 0 {
				<-f.entered
			}
		}
		close(gate)
		preempted := 0
		for _, st := range streams {
			r := collect(st)
			if r.err != nil || r.info == nil {
				t.Fatalf("spec %d, %d blocks: %v", spec, blocks, r.err)
			}
			preempted += r.info.Preemptions
		}
		f.check(t)
		return preempted
	}
	for blocks := 12; blocks <= 14; blocks++ {
		without, with := run(0, blocks), run(4, blocks)
		t.Logf("%d blocks: %d preemptions with guesses, %d without", blocks, with, without)
		if with > without {
			t.Errorf("%d blocks: %d preemptions with guesses, %d without", blocks, with, without)
		}
	}
}
