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
	if got, err := recvAll(stB); err != nil || !slices.Equal(got, wantB) || !slices.Equal(gotB, wantB) {
		t.Errorf("plain sequence beside a deferred one: %v (stream %v, %v), alone %v", gotB, got, err, wantB)
	}

	for ; held > 0; held-- {
		<-e.masks.slots
	}
	freeAll()
	if got, err := recvAll(stA); err != nil || !slices.Equal(got, wantA) {
		t.Errorf("deferred constrained sequence: %v (%v), alone %v", got, err, wantA)
	}
	for _, row := range sch.Stats("m") {
		if row.Gen != nil && row.Gen.DeferredSamples != 1 {
			t.Errorf("stats row %q: %d deferred samples, want 1", row.DeviceID, row.Gen.DeferredSamples)
		}
	}
}

// recvAll returns a stream's tokens until its end.
func recvAll(st *scheduler.GenStream) ([]int32, error) {
	var got []int32
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
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

// TestDeferralKeepsOutputs: sequences under the scheduler whose masks are
// held back now and then (so some are deferred, some several times,
// rejoining steps at other places) write exactly what each writes alone:
// constrained ones of three kinds, three choices of one prompt (sharing
// its cache blocks) and plain ones, greedy and seeded.
func TestDeferralKeepsOutputs(t *testing.T) {
	ctx := context.Background()
	m, ref := constrainedModel(t, ModelOptions{})
	type job struct {
		p      Sampling
		prompt []int32
		maxNew int
		want   []int32
	}
	shared := prompt(21, 4, 96) // more than a block of 16: the choices share one
	regex := &Constraint{Kind: grammar.KindRegex, Source: testRegex}
	jobs := []*job{
		{p: Sampling{}, prompt: prompt(9, 1, 96), maxNew: 160}, // plain and long: steps keep a ready item
		{p: Sampling{Temperature: 1, Seed: 1, Seeded: true, Constraint: regex}, prompt: shared, maxNew: 40},
		{p: Sampling{Temperature: 1, Seed: 2, Seeded: true, Constraint: regex}, prompt: shared, maxNew: 40},
		{p: Sampling{Temperature: 1, Seed: 3, Seeded: true, Constraint: regex}, prompt: shared, maxNew: 40},
		{p: Sampling{Temperature: 1, Seed: 4, Seeded: true, FrequencyPenalty: 1, Constraint: &Constraint{Kind: grammar.KindJSONSchema, Source: testSchema}}, prompt: prompt(6, 2, 96), maxNew: 60},
		{p: Sampling{Temperature: 1, Seed: 5, Seeded: true, Constraint: &Constraint{Kind: grammar.KindGBNF, Source: gbnfList}}, prompt: prompt(11, 3, 96), maxNew: 40},
		{p: Sampling{Temperature: 0.8, Seed: 6, Seeded: true}, prompt: prompt(3, 5, 96), maxNew: 30},
	}
	for _, j := range jobs {
		j.want = generate(t, m, ref, []Sampling{j.p}, j.prompt, j.maxNew)[0].tokens
	}
	e, err := m.NewEngine(ctx, openCPU(t, runtime.F32), EngineOptions{CacheBytes: 32 << 20, BlockSize: 16, MaxSeqs: 8, MaxStepTokens: 256, DeferSampling: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	sch := scheduler.New(scheduler.Options{})
	defer sch.Close()
	if err := sch.AddGenReplica("m", scheduler.Device{ID: "cpu:0", Type: "cpu"}, scheduler.GenOptions{MaxRunning: 8, MaxStepTokens: 256, ChunkAlign: 16}, genExecutor{e: e}); err != nil {
		t.Fatal(err)
	}
	deferred := func() int64 {
		for _, row := range sch.Stats("m") {
			if row.DeviceID == "" && row.Gen != nil {
				return row.Gen.DeferredSamples
			}
		}
		return 0
	}
	// Hold the mask threads until a sample is deferred (or a few
	// milliseconds pass: a step of constrained sequences only waits for
	// its first mask), free them for a moment, and again, until the
	// sequences end.
	stop := make(chan struct{})
	var toggled sync.WaitGroup
	toggled.Go(func() {
		held := false
		defer func() {
			if held {
				releaseSlots(e.masks)
			}
		}()
		for {
			n := deferred()
			holdSlots(e.masks)
			held = true
			for i := 0; i < 50 && deferred() == n; i++ {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Microsecond):
				}
			}
			releaseSlots(e.masks)
			held = false
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(100+200*(n%5)) * time.Microsecond):
			}
		}
	})
	submit := func(j *job) *scheduler.GenStream {
		seq, err := m.NewSequenceContext(ctx, j.p, j.prompt)
		if err != nil {
			t.Fatal(err)
		}
		st, err := sch.Generate(ctx, scheduler.GenRequest{Model: "m", Prompt: j.prompt, MaxNewTokens: j.maxNew, State: seq})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	streams := []*scheduler.GenStream{submit(jobs[0])}
	if ev, err := streams[0].Recv(); err != nil || !ev.HasToken {
		t.Fatalf("the plain sequence's first event: %+v, %v", ev, err)
	}
	for _, j := range jobs[1:] {
		streams = append(streams, submit(j))
	}
	got := make([][]int32, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, st := range streams {
		wg.Go(func() { got[i], errs[i] = recvAll(st) })
	}
	wg.Wait()
	close(stop)
	toggled.Wait()
	got[0] = append([]int32{jobs[0].want[0]}, got[0]...) // its first token was read above
	for i, j := range jobs {
		if errs[i] != nil || !slices.Equal(got[i], j.want) {
			t.Errorf("sequence %d: %v (%v) under deferrals, %v alone", i, got[i], errs[i], j.want)
		}
	}
	if n := deferred(); n == 0 {
		t.Error("no sample was deferred: the test held no mask back")
	} else {
		t.Logf("%d samples deferred", n)
	}
}

// holdSlots takes every mask slot of r, once the masks running end: no
// mask starts until releaseSlots.
func holdSlots(r *maskRunner) {
	for range cap(r.slots) {
		r.slots <- struct{}{}
	}
}

func releaseSlots(r *maskRunner) {
	for range cap(r.slots) {
		<-r.slots
	}
}
