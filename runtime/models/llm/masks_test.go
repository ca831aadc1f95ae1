package llm

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
	"github.com/brokerd/brokerd/scheduler"
)

// stepper is genExecutor run one step at a time: each Step waits for a
// value on step (or for free to close) and reports what it ran on ran.
type stepper struct {
	e    *Engine
	step chan struct{}
	free chan struct{}
	ran  chan stepRecord
}

// stepRecord is one step: its items' sequences and which of them were
// answered Pending, or given a token.
type stepRecord struct {
	seqs    []uint64
	pending []uint64
	tokens  map[uint64]int32
}

func (s *stepper) Reserve(seq uint64, tokens int) bool { return s.e.Reserve(seq, tokens) }
func (s *stepper) Release(seq uint64)                  { s.e.Release(seq) }
func (s *stepper) Step(ctx context.Context, items []scheduler.StepItem) ([]scheduler.StepResult, error) {
	stepped := false
	select {
	case <-s.step:
		stepped = true
	case <-s.free:
	}
	res, err := genExecutor{e: s.e}.Step(ctx, items)
	if stepped {
		rec := stepRecord{tokens: map[uint64]int32{}}
		for i, it := range items {
			rec.seqs = append(rec.seqs, it.Seq)
			switch {
			case err != nil || !it.Sample:
			case res[i].Pending != nil:
				rec.pending = append(rec.pending, it.Seq)
			case res[i].End == "":
				rec.tokens[it.Seq] = res[i].Token
			}
		}
		s.ran <- rec
	}
	return res, err
}

// TestDeferredMaskDoesNotHoldOthers: a constrained sequence whose grammar
// mask cannot be computed (every mask slot held by the test) is answered
// Pending, sits out the scheduler's steps while a plain sequence beside it
// generates all its tokens, and once its mask is done runs its last token
// again and writes what it writes without deferral; both sequences' tokens
// equal a run of each without the other.
func TestDeferredMaskDoesNotHoldOthers(t *testing.T) {
	ctx := context.Background()
	m, ref := constrainedModel(t, ModelOptions{})
	pa := Sampling{Temperature: 1, Seed: 7, Seeded: true, Constraint: &Constraint{Kind: grammar.KindRegex, Source: testRegex}}
	pb := Sampling{}
	promptA, promptB := prompt(7, 3, 96), prompt(5, 9, 96)
	const genB = 24
	wantA := generate(t, m, ref, []Sampling{pa}, promptA, 64)[0].tokens
	wantB := generate(t, m, ref, []Sampling{pb}, promptB, genB)[0].tokens

	e, err := m.NewEngine(ctx, openCPU(t, runtime.F32), EngineOptions{CacheBytes: 32 << 20, BlockSize: 16, MaxSeqs: 8, MaxStepTokens: 256, DeferSampling: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	w := &stepper{e: e, step: make(chan struct{}), free: make(chan struct{}), ran: make(chan stepRecord, 1)}
	sch := scheduler.New(scheduler.Options{})
	// A failure below must not leave the replica's loop waiting for a
	// step or a mask slot: free both before Close.
	var freeOnce sync.Once
	freeAll := func() { freeOnce.Do(func() { close(w.free) }) }
	held := 0
	defer func() {
		for ; held > 0; held-- {
			<-e.masks.slots
		}
		freeAll()
		sch.Close()
	}()
	if err := sch.AddGenReplica("m", scheduler.Device{ID: "cpu:0", Type: "cpu"}, scheduler.GenOptions{MaxRunning: 4, MaxStepTokens: 256}, w); err != nil {
		t.Fatal(err)
	}
	// A step held by the mask (the bug this tests) would never end: a
	// deadline far beyond a step's milliseconds says so.
	run := func() stepRecord {
		w.step <- struct{}{}
		select {
		case rec := <-w.ran:
			return rec
		case <-time.After(2 * time.Minute):
			t.Fatal("a step waited minutes for a mask that cannot start")
			return stepRecord{}
		}
	}
	submit := func(p Sampling, pr []int32, maxNew int) *scheduler.GenStream {
		seq, err := m.NewSequenceContext(ctx, p, pr)
		if err != nil {
			t.Fatal(err)
		}
		st, err := sch.Generate(ctx, scheduler.GenRequest{Model: "m", Prompt: pr, MaxNewTokens: maxNew, State: seq})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	// No mask can start: the test holds every slot.
	for ; held < cap(e.masks.slots); held++ {
		e.masks.slots <- struct{}{}
	}
	stB := submit(pb, promptB, genB)
	var gotB []int32
	rec := run() // B's prompt, alone
	gotB = append(gotB, rec.tokens[stB.Seq()])
	stA := submit(pa, promptA, 64)
	deferred := false
	for len(gotB) < genB {
		rec := run()
		if tok, ok := rec.tokens[stB.Seq()]; ok {
			gotB = append(gotB, tok)
		}
		inStep := slices.Contains(rec.seqs, stA.Seq())
		switch {
		case !deferred && inStep:
			if !slices.Equal(rec.pending, []uint64{stA.Seq()}) {
				t.Fatalf("the constrained sequence's first step answered %v Pending, want only it", rec.pending)
			}
			deferred = true
		case deferred && inStep:
			t.Fatalf("the constrained sequence ran again while its mask could not start (step of %v)", rec.seqs)
		}
	}
	if !deferred {
		t.Fatal("the constrained sequence never joined a step")
	}
	t.Logf("constrained: %d tokens alone; plain: %d", len(wantA), len(wantB))
	// B ends without another step, A's mask still held back.
	if got := recvAll(t, stB); !slices.Equal(got, wantB) || !slices.Equal(gotB, wantB) {
		t.Errorf("plain sequence beside a deferred one: %v (stream %v), alone %v", gotB, got, wantB)
	}

	for ; held > 0; held-- {
		<-e.masks.slots
	}
	freeAll()
	if got := recvAll(t, stA); !slices.Equal(got, wantA) {
		t.Errorf("deferred constrained sequence: %v, alone %v", got, wantA)
	}
	for _, row := range sch.Stats("m") {
		if row.Gen != nil && row.Gen.DeferredSamples != 1 {
			t.Errorf("stats row %q: %d deferred samples, want 1", row.DeviceID, row.Gen.DeferredSamples)
		}
	}
}

// recvAll returns a stream's tokens until its end.
func recvAll(t *testing.T, st *scheduler.GenStream) []int32 {
	t.Helper()
	var got []int32
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.HasToken {
			got = append(got, ev.Out.(Delta).TokenIDs...)
		}
	}
}

// TestWaitMasks: without DeferSampling a step waits for every mask; with
// it, past the grace it answers those not done, but never before one item
// of the step has its answer.
func TestWaitMasks(t *testing.T) {
	open, shut := make(chan struct{}), make(chan struct{})
	close(open)
	for _, tc := range []struct {
		name    string
		deferOn bool
		masks   []<-chan struct{}
		late    []bool // nil: none late
	}{
		{"all done", true, []<-chan struct{}{open, nil, open}, nil},
		{"one late beside a plain item", true, []<-chan struct{}{shut, nil}, []bool{true, false}},
		{"one late beside a done one", true, []<-chan struct{}{open, shut}, []bool{false, true}},
		{"no masks", true, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &Engine{masks: newMaskRunner(), opts: EngineOptions{DeferSampling: tc.deferOn}}
			late := e.waitMasks(slices.Clone(tc.masks), 0)
			var got []bool
			for _, ch := range late {
				got = append(got, ch != nil)
			}
			if !slices.Equal(got, tc.late) {
				t.Errorf("late %v, want %v", got, tc.late)
			}
		})
	}
	// All late: it waits for the first to end, then answers the others.
	e := &Engine{masks: newMaskRunner(), opts: EngineOptions{DeferSampling: true}}
	a, b := make(chan struct{}), make(chan struct{})
	var late []<-chan struct{}
	var wg sync.WaitGroup
	wg.Go(func() { late = e.waitMasks([]<-chan struct{}{a, b}, 0) })
	close(a)
	e.masks.ended <- struct{}{}
	wg.Wait()
	if len(late) != 2 || late[0] != nil || late[1] == nil {
		t.Errorf("late %v, want only the second", late)
	}
	// Without DeferSampling it waits for all.
	e.opts.DeferSampling = false
	done := make(chan struct{})
	go func() {
		e.waitMasks([]<-chan struct{}{a, b}, 0)
		close(done)
	}()
	close(b)
	<-done
}
