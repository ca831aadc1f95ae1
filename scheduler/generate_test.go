package scheduler

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeGen is a hand-written GenExecutor: a KV cache of fixed-size blocks,
// and a "model" whose next token is a hash of the sequence's whole history,
// so a sequence's tokens do not depend on what shares its steps, and a
// cache that lost or duplicated a token would change them. It checks that
// every step continues exactly where the sequence's cache ends.
type fakeGen struct {
	blockSize, blocks int
	hold              chan struct{} // when non-nil, each step waits for a receive... or close
	fail              func(step int) error
	advance           func()        // when non-nil, called as each step ends (a fake clock's tick)
	entered           chan struct{} // when non-nil, each step sends on it (if it can) before hold

	mu      sync.Mutex
	cache   map[uint64][]int32 // tokens in the cache per sequence
	held    map[uint64]int     // blocks per sequence
	used    int
	steps   [][]uint64 // sequence IDs of each step
	tokens  []int      // tokens of each step
	chunks  [][]int    // tokens of each item of each step
	cuts    [][2]int   // where each prompt chunk that does not sample starts and ends
	errs    []error
	maxUsed int
	hits    int64 // PrefixHitTokens' answer
	// cachedEach, when set, is every item's StepResult.Cached (at most
	// its tokens): the prefix cache's hits as the executor reports them.
	cachedEach int
}

// genState is a sequence's executor state in the tests: it stops after
// stopAfter tokens (0: never), or ends without a token at its endAt-th
// sampling step (StepResult.End "dead-end"; 0: never). While pending is
// open, its sampling steps answer StepResult.Pending with it.
type genState struct {
	stopAfter, endAt, generated int
	pending                     chan struct{}
}

func newFakeGen(blockSize, blocks int) *fakeGen {
	return &fakeGen{blockSize: blockSize, blocks: blocks, cache: map[uint64][]int32{}, held: map[uint64]int{}}
}

// addHeldGen adds to s a CPU replica of model "llm" on a fakeGen (blocks
// of 4 tokens) whose steps each signal f.entered and wait for gate.
func addHeldGen(t *testing.T, s *Scheduler, blocks int, opts GenOptions) (f *fakeGen, gate chan struct{}) {
	t.Helper()
	f = newFakeGen(4, blocks)
	gate = make(chan struct{})
	f.hold, f.entered = gate, make(chan struct{}, 1)
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, opts, f); err != nil {
		t.Fatal(err)
	}
	return f, gate
}

func (f *fakeGen) Reserve(seq uint64, tokens int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	need := (tokens + f.blockSize - 1) / f.blockSize
	have := f.held[seq]
	if need <= have {
		return true
	}
	if f.used+need-have > f.blocks {
		return false
	}
	f.used += need - have
	f.maxUsed = max(f.maxUsed, f.used)
	f.held[seq] = need
	return true
}

func (f *fakeGen) Release(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.used -= f.held[seq]
	delete(f.held, seq)
	delete(f.cache, seq)
}

func nextToken(history []int32) int32 {
	h := fnv.New32a()
	for _, t := range history {
		fmt.Fprint(h, t, ",")
	}
	return int32(h.Sum32() % 1000)
}

func (f *fakeGen) Step(ctx context.Context, items []StepItem) ([]StepResult, error) {
	if err := f.gate(ctx); err != nil {
		return nil, err
	}
	if f.advance != nil {
		defer f.advance()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.recordLocked(items)
	if f.fail != nil {
		if err := f.fail(n); err != nil {
			return nil, err
		}
	}
	out := make([]StepResult, len(items))
	defer func() {
		for i, it := range items {
			out[i].Cached = min(f.cachedEach, len(it.Tokens))
		}
	}()
	for i, it := range items {
		c := f.runLocked(n, it)
		if it.Sample {
			st := it.State.(*genState)
			if st.pending != nil && !isClosed(st.pending) {
				// The cache holds all but the last token, run again later.
				f.cache[it.Seq] = c[:len(c)-1]
				out[i] = StepResult{Pending: st.pending}
				continue
			}
			st.generated++
			out[i] = StepResult{Token: nextToken(c), Out: fmt.Sprint("t", nextToken(c)), Stop: st.stopAfter > 0 && st.generated >= st.stopAfter}
			if st.endAt > 0 && st.generated >= st.endAt {
				out[i] = StepResult{End: "dead-end"}
			}
		}
	}
	return out, nil
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// gate signals entered and waits for hold, where the test set them.
func (f *fakeGen) gate(ctx context.Context) error {
	if f.entered != nil {
		select {
		case f.entered <- struct{}{}:
		default:
		}
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// recordLocked records a step of items (their sequences, chunks, and
// tokens with any guesses) and returns its index.
func (f *fakeGen) recordLocked(items []StepItem) int {
	n := len(f.steps)
	ids := make([]uint64, len(items))
	chunks := make([]int, len(items))
	toks := 0
	for i, it := range items {
		ids[i] = it.Seq
		chunks[i] = len(it.Tokens)
		toks += len(it.Tokens) + it.Draft
		if !it.Sample {
			f.cuts = append(f.cuts, [2]int{it.Pos, it.Pos + len(it.Tokens)})
		}
	}
	f.steps = append(f.steps, ids)
	f.chunks = append(f.chunks, chunks)
	f.tokens = append(f.tokens, toks)
	return n
}

// runLocked checks item it of step n against its sequence's cache (its
// position, and blocks reserved for its tokens and guesses), adds its
// tokens to the cache and returns the cache.
func (f *fakeGen) runLocked(n int, it StepItem) []int32 {
	c := f.cache[it.Seq]
	if it.Pos != len(c) {
		f.errs = append(f.errs, fmt.Errorf("step %d: seq %d at pos %d but its cache holds %d tokens", n, it.Seq, it.Pos, len(c)))
	}
	if need := (len(c) + len(it.Tokens) + it.Draft + f.blockSize - 1) / f.blockSize; need > f.held[it.Seq] {
		f.errs = append(f.errs, fmt.Errorf("step %d: seq %d runs %d tokens and %d guesses with %d blocks reserved", n, it.Seq, len(c)+len(it.Tokens), it.Draft, f.held[it.Seq]))
	}
	c = append(c, it.Tokens...)
	f.cache[it.Seq] = c
	return c
}

func (f *fakeGen) check(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, err := range f.errs {
		t.Error(err)
	}
}

// CacheBlocks makes fakeGen a KVCacheReporter.
func (f *fakeGen) CacheBlocks() (used, total int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.used, f.blocks
}

// PrefixHitTokens makes fakeGen a PrefixCacheReporter.
func (f *fakeGen) PrefixHitTokens() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits
}

func (f *fakeGen) blocksUsed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.used
}

// genResult is what a stream gave.
type genResult struct {
	tokens []int32
	outs   []any
	finish string
	info   *GenInfo
	err    error
}

func collect(st *GenStream) genResult {
	var r genResult
	for {
		ev, err := st.Recv()
		if err == io.EOF {
			return r
		}
		if err != nil {
			r.err = err
			return r
		}
		if ev.HasToken {
			r.tokens = append(r.tokens, ev.Token)
			r.outs = append(r.outs, ev.Out)
		}
		if ev.Finish != "" {
			r.finish, r.info = ev.Finish, ev.Info
		}
	}
}

// expected runs the fake model alone over prompt.
func expected(prompt []int32, maxNew, stopAfter int) ([]int32, string) {
	hist := slices.Clone(prompt)
	var out []int32
	for len(out) < maxNew {
		tok := nextToken(hist)
		hist = append(hist, tok)
		out = append(out, tok)
		if stopAfter > 0 && len(out) >= stopAfter {
			return out, FinishStop
		}
	}
	return out, FinishLength
}

func prompt(seed, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*31 + i*7) % 1000)
	}
	return p
}

type genCase struct {
	prompt            []int32
	maxNew, stopAfter int
}

func genCases(n int) []genCase {
	cs := make([]genCase, n)
	for i := range cs {
		cs[i] = genCase{prompt: prompt(i, 1+(i*13)%40), maxNew: 4 + (i*7)%20}
		if i%3 == 0 {
			cs[i].stopAfter = 2 + i%5
		}
	}
	return cs
}

func runGen(t *testing.T, s *Scheduler, model string, cs []genCase, stagger time.Duration) []genResult {
	t.Helper()
	res := make([]genResult, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		st, err := s.Generate(context.Background(), GenRequest{
			Model: model, Client: fmt.Sprint("c", i%3), Prompt: c.prompt, MaxNewTokens: c.maxNew,
			State: &genState{stopAfter: c.stopAfter},
		})
		if err != nil {
			t.Fatalf("Generate %d: %v", i, err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); res[i] = collect(st) }()
		time.Sleep(stagger)
	}
	waitGroup(t, &wg)
	return res
}

func waitGroup(t *testing.T, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("streams did not end")
	}
}

func checkGen(t *testing.T, cs []genCase, res []genResult) {
	t.Helper()
	for i, c := range cs {
		want, finish := expected(c.prompt, c.maxNew, c.stopAfter)
		r := res[i]
		if r.err != nil {
			t.Errorf("sequence %d: %v", i, r.err)
			continue
		}
		if !slices.Equal(r.tokens, want) || r.finish != finish {
			t.Errorf("sequence %d: tokens %v finish %q, want %v %q", i, r.tokens, r.finish, want, finish)
		}
		if r.info == nil || r.info.GeneratedTokens != len(want) || r.info.PromptTokens != len(c.prompt) {
			t.Errorf("sequence %d: info %+v", i, r.info)
		}
	}
}

func TestGenerateBatchedEqualsAlone(t *testing.T) {
	tests := []struct {
		name    string
		opts    GenOptions
		blocks  int
		stagger time.Duration
	}{
		{"one at a time", GenOptions{MaxRunning: 1, MaxStepTokens: 64}, 64, 0},
		{"continuous, whole prompts", GenOptions{MaxRunning: 8, MaxStepTokens: 256}, 256, 0},
		{"continuous, chunked prefill", GenOptions{MaxRunning: 6, MaxStepTokens: 24, MaxChunk: 8}, 256, 0},
		{"staggered arrivals", GenOptions{MaxRunning: 4, MaxStepTokens: 32, MaxChunk: 16}, 256, time.Millisecond},
		{"cache too small: preemption", GenOptions{MaxRunning: 8, MaxStepTokens: 64, MaxChunk: 16}, 12, 0},
		{"chunks cut on blocks", GenOptions{MaxRunning: 6, MaxStepTokens: 22, MaxChunk: 10, ChunkAlign: 4}, 256, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f := newFakeGen(4, tc.blocks)
			if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, tc.opts, f); err != nil {
				t.Fatal(err)
			}
			cs := genCases(12)
			res := runGen(t, s, "llm", cs, tc.stagger)
			checkGen(t, cs, res)
			f.check(t)
			waitFor(t, "every block freed", func() bool { return f.blocksUsed() == 0 })
			f.mu.Lock()
			defer f.mu.Unlock()
			most := 0
			for i, ids := range f.steps {
				most = max(most, len(ids))
				if len(ids) > tc.opts.MaxRunning || f.tokens[i] > tc.opts.MaxStepTokens {
					t.Errorf("step %d: %d sequences, %d tokens; limits %d and %d", i, len(ids), f.tokens[i], tc.opts.MaxRunning, tc.opts.MaxStepTokens)
				}
			}
			// A chunk cut short of its prompt ends on the last block
			// boundary it crosses, where the next starts and the prefix
			// cache can map blocks (a chunk of a token or two, all a full
			// step leaves, may cross none).
			if a := tc.opts.ChunkAlign; a > 1 {
				aligned := 0
				for _, c := range f.cuts {
					if c[1]%a == 0 {
						aligned++
					} else if c[1]/a*a > c[0] {
						t.Errorf("a chunk cut short runs from %d to %d, past the block boundary at %d", c[0], c[1], c[1]/a*a)
					}
				}
				if aligned == 0 {
					t.Errorf("no chunk of %d cut short ended on a block", len(f.cuts))
				}
			}
			if tc.opts.MaxRunning > 1 && tc.stagger == 0 && most < 2 {
				t.Errorf("no step ran more than one sequence")
			}
			if tc.blocks < 20 {
				var pre int
				for _, r := range res {
					if r.info != nil {
						pre += r.info.Preemptions
					}
				}
				if pre == 0 {
					t.Error("a cache of 12 blocks preempted nothing")
				}
				t.Logf("%d preemptions; at most %d of %d blocks used", pre, f.maxUsed, tc.blocks)
			}
		})
	}
}

// TestGenerateJoinsAndLeavesBetweenSteps: a short sequence submitted while a
// long one runs joins at the next step and leaves at the step it finishes;
// the long one neither waits for it nor is delayed to its end.
func TestGenerateJoinsAndLeavesBetweenSteps(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFakeGen(16, 64)
	gate := make(chan struct{})
	f.hold = gate
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 64}, f); err != nil {
		t.Fatal(err)
	}
	long, err := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(1, 5), MaxNewTokens: 20, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // three steps of the long one alone
		gate <- struct{}{}
	}
	short, err := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(2, 3), MaxNewTokens: 2, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	close(gate)
	rl, rs := collect(long), collect(short)
	if rl.err != nil || rs.err != nil {
		t.Fatal(rl.err, rs.err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var joined, after int
	shortDone := -1
	for i, ids := range f.steps {
		if slices.Contains(ids, short.Seq()) {
			if !slices.Contains(ids, long.Seq()) {
				t.Errorf("step %d ran the short sequence without the running long one", i)
			}
			joined++
			shortDone = i
		} else if shortDone >= 0 {
			after++
		}
	}
	if joined != 2 {
		t.Errorf("the short sequence (2 tokens) took part in %d steps, want 2", joined)
	}
	if after == 0 {
		t.Error("the long sequence did not go on alone after the short one left")
	}
	if len(rl.tokens) != 20 {
		t.Errorf("long sequence: %d tokens", len(rl.tokens))
	}
}

func TestGenerateCancelAndDeadlineFreeBlocks(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFakeGen(4, 1024) // room for 1000 tokens each: the length limit is 1000 steps (a second or more) away
	gate := make(chan struct{})
	f.hold = gate
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 64}, f); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancelled, err := s.Generate(ctx, GenRequest{Model: "llm", Prompt: prompt(1, 9), MaxNewTokens: 1000, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	timed, err := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(2, 9), MaxNewTokens: 1000,
		Deadline: deadline, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	stop := feedSteps(gate)
	first, err := cancelled.Recv()
	if err != nil || !first.HasToken {
		t.Fatalf("first event %+v, %v", first, err)
	}
	cancel()
	rc := collect(cancelled)
	if !errors.Is(rc.err, context.Canceled) {
		t.Errorf("cancelled stream: %v", rc.err)
	}
	// The timed sequence's first token, then no step until its deadline has
	// passed (a lower bound on the clock, never a race): the next step
	// finishes it, whatever the machine's speed.
	tfirst, err := timed.Recv()
	if err != nil || !tfirst.HasToken {
		t.Fatalf("the timed sequence's first event %+v, %v", tfirst, err)
	}
	stop()
	time.Sleep(time.Until(deadline))
	defer feedSteps(gate)()
	rt := collect(timed)
	if rt.err != nil || rt.finish != FinishDeadline || rt.info == nil {
		t.Errorf("deadline stream: %d tokens after the first, finish %q, err %v", len(rt.tokens), rt.finish, rt.err)
	}
	waitFor(t, "blocks freed", func() bool { return f.blocksUsed() == 0 })
	f.check(t)
}

// TestGenerateEndWaitsForItsStep: a deadline ends a sequence while a step
// holds it, but Recv gives the Finish event only after the step: its caller
// flushes the sequence's state (an llm.Sequence's held-back text) on it, and
// the step may still be sampling it. A cancellation's error comes at once:
// nothing is flushed on it.
func TestGenerateEndWaitsForItsStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(s *Scheduler, st *GenStream, cancel func())
		held bool // Recv waits for the step
		want func(r genResult) bool
	}{
		{"cancelled", func(_ *Scheduler, _ *GenStream, cancel func()) { cancel() }, false,
			func(r genResult) bool { return errors.Is(r.err, context.Canceled) }},
		// What the deadline's timer does, without a race against the plan.
		{"deadline", func(s *Scheduler, st *GenStream, _ func()) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.finishSeqLocked(st.seq, nil, FinishDeadline, "")
		}, true, func(r genResult) bool { return r.err == nil && r.finish == FinishDeadline }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, Options{})
			f, gate := addHeldGen(t, s, 1024, GenOptions{MaxRunning: 4, MaxStepTokens: 64})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := s.Generate(ctx, GenRequest{Model: "llm", Prompt: prompt(1, 9), MaxNewTokens: 1000, State: &genState{}})
			if err != nil {
				t.Fatal(err)
			}
			<-f.entered // the first step holds the sequence
			tc.end(s, st, cancel)
			waitFor(t, "the sequence ended", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return st.seq.finished
			})
			var r genResult
			if !tc.held {
				r = collect(st)
			} else {
				s.mu.Lock()
				ev, err, ok := st.nextLocked()
				s.mu.Unlock()
				if ok {
					t.Fatalf("Recv would give %+v, %v while the step holds the sequence", ev, err)
				}
			}
			gate <- struct{}{}
			if tc.held {
				r = collect(st)
			}
			if !tc.want(r) {
				t.Errorf("finish %q, err %v", r.finish, r.err)
			}
			f.check(t)
		})
	}
}

func TestGenerateQueueBoundAndFairness(t *testing.T) {
	s := newTestScheduler(t, Options{MaxQueueItems: 4})
	f := newFakeGen(4, 64)
	gate := make(chan struct{})
	f.hold = gate
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 1, MaxStepTokens: 64}, f); err != nil {
		t.Fatal(err)
	}
	var streams []*GenStream
	var order []string
	gen := func(client string, seed int) error {
		st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: client, Prompt: prompt(seed, 3), MaxNewTokens: 3, State: &genState{}})
		if err == nil {
			streams = append(streams, st)
			order = append(order, client)
		}
		return err
	}
	// Client a's first sequence runs (held at the gate), two more wait:
	// its share, half the queue. Its next is refused though the queue has
	// room, which b's and c's sequences then fill.
	var full *QueueFullError
	for i := range 3 {
		if err := gen("a", i); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			waitFor(t, "the first sequence admitted", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return s.queued == 0
			})
		}
	}
	if err := gen("a", 3); !errors.As(err, &full) || full.Client != "a" || full.Limit != 2 || full.RetryAfter <= 0 {
		t.Fatalf("client a's third waiting sequence: %v, want a QueueFullError for its share of 2", err)
	}
	for i, c := range []string{"b", "c"} {
		if err := gen(c, 9+i); err != nil {
			t.Fatal(err)
		}
	}
	if err := gen("d", 11); !errors.As(err, &full) || full.Client != "" || full.RetryAfter <= 0 {
		t.Fatalf("client d's sequence with the queue full: %v, want a QueueFullError with a retry hint", err)
	}
	close(gate)
	for _, st := range streams {
		if r := collect(st); r.err != nil {
			t.Fatal(r.err)
		}
	}
	// Admission order from the steps: b must not wait for all of a's.
	f.mu.Lock()
	defer f.mu.Unlock()
	var admitted []uint64
	for _, ids := range f.steps {
		if id := ids[0]; !slices.Contains(admitted, id) {
			admitted = append(admitted, id)
		}
	}
	bID := streams[3].Seq()
	if i := slices.Index(admitted, bID); i < 0 || i > 2 {
		t.Errorf("client b's sequence was admitted %d-th (%v); token fairness should take it by the third", i+1, admitted)
	}
}

func TestGenerateFailover(t *testing.T) {
	s := newTestScheduler(t, Options{UnhealthyAfter: 1, ProbeInterval: time.Hour})
	bad := newFakeGen(4, 64)
	bad.fail = func(int) error { return errors.New("device lost") }
	if err := s.AddGenReplica("llm", Device{ID: "gpu:0", Type: "gpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 64}, bad); err != nil {
		t.Fatal(err)
	}
	good := newFakeGen(4, 64)
	gate := make(chan struct{})
	good.hold = gate
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 64}, good); err != nil {
		t.Fatal(err)
	}
	// Pinned to the failing device: no other replica may retry it.
	pinned, err := s.Generate(context.Background(), GenRequest{Model: "llm", DeviceID: "gpu:0", Prompt: prompt(1, 4), MaxNewTokens: 3, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(pinned); !errors.Is(r.err, ErrBackend) {
		t.Fatalf("pinned to the failing device: %v, want ErrBackend", r.err)
	}
	close(gate)
	cs := genCases(4)
	res := runGen(t, s, "llm", cs, 0)
	checkGen(t, cs, res)
	for i, r := range res {
		if r.info != nil && r.info.DeviceID != "cpu:0" {
			t.Errorf("sequence %d finished on %s", i, r.info.DeviceID)
		}
	}
	waitFor(t, "blocks freed on both", func() bool { return bad.blocksUsed() == 0 && good.blocksUsed() == 0 })
}

func TestGenerateDrainAndClose(t *testing.T) {
	s := New(Options{})
	f := newFakeGen(4, 64)
	gate := make(chan struct{})
	f.hold = gate
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 1, MaxStepTokens: 64}, f); err != nil {
		t.Fatal(err)
	}
	a, _ := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(1, 3), MaxNewTokens: 3, State: &genState{}})
	b, _ := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(2, 3), MaxNewTokens: 3, State: &genState{}})
	drained := make(chan error, 1)
	go func() { drained <- s.Drain(context.Background()) }()
	waitFor(t, "draining", s.Draining)
	if _, err := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(3, 3), MaxNewTokens: 3}); !errors.Is(err, ErrDraining) {
		t.Errorf("Generate while draining: %v", err)
	}
	close(gate)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	for _, st := range []*GenStream{a, b} {
		if r := collect(st); r.err != nil || len(r.tokens) != 3 {
			t.Errorf("accepted before the drain: %v, %d tokens", r.err, len(r.tokens))
		}
	}
	s.Close()

	// Close answers what is still running or waiting.
	s2 := New(Options{})
	f2 := newFakeGen(4, 64)
	f2.hold = make(chan struct{})
	if err := s2.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 1, MaxStepTokens: 64}, f2); err != nil {
		t.Fatal(err)
	}
	c, _ := s2.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(1, 3), MaxNewTokens: 3, State: &genState{}})
	d, _ := s2.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(2, 3), MaxNewTokens: 3, State: &genState{}})
	s2.Close()
	for _, st := range []*GenStream{c, d} {
		if r := collect(st); !errors.Is(r.err, ErrDraining) {
			t.Errorf("after Close: %v, want ErrDraining", r.err)
		}
	}
	if f2.blocksUsed() != 0 {
		t.Errorf("%d blocks held after Close", f2.blocksUsed())
	}
}

func TestGenerateKinds(t *testing.T) {
	s := newTestScheduler(t, Options{})
	mustAdd(t, s, "enc", Device{ID: "cpu:0", Type: "cpu"}, 4, newFake("cpu:0"))
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 1, MaxStepTokens: 8}, newFakeGen(4, 8)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Generate(context.Background(), GenRequest{Model: "enc", Prompt: []int32{1}, MaxNewTokens: 1}); !errors.Is(err, ErrWrongKind) {
		t.Errorf("Generate on an encoder: %v", err)
	}
	if _, err := s.Submit(context.Background(), Request{Model: "llm", Inputs: []any{1}}); !errors.Is(err, ErrWrongKind) {
		t.Errorf("Submit on a generator: %v", err)
	}
	if err := s.AddReplica("llm", Device{ID: "cpu:1", Type: "cpu"}, 4, newFake("cpu:1")); !errors.Is(err, ErrWrongKind) {
		t.Errorf("batch replica of a generator: %v", err)
	}
	if _, err := s.Generate(context.Background(), GenRequest{Model: "llm", MaxNewTokens: 1}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("empty prompt: %v", err)
	}
	if _, err := s.Generate(context.Background(), GenRequest{Model: "nope", Prompt: []int32{1}, MaxNewTokens: 1}); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("unknown model: %v", err)
	}
}

// TestGenerateCancelWhenAloneFreesAtOnce: a caller that goes while its
// sequence is the only one running frees the sequence's blocks and leaves the
// running gauge at once, though no step follows to notice it.
func TestGenerateCancelWhenAloneFreesAtOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newTestScheduler(t, Options{Registerer: reg})
	f := newFakeGen(4, 64)
	gate := make(chan struct{})
	f.hold = gate
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 64}, f); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := s.Generate(ctx, GenRequest{Model: "llm", Prompt: prompt(1, 9), MaxNewTokens: 1000, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	defer feedSteps(gate)()
	if ev, err := st.Recv(); err != nil || !ev.HasToken {
		t.Fatalf("first event %+v, %v", ev, err)
	}
	running := func() float64 {
		return value(t, reg, "brokerd_generation_running_sequences", "model", "llm", "device", "cpu:0")
	}
	waitFor(t, "the sequence counted as running", func() bool { return running() == 1 })
	cancel()
	waitFor(t, "blocks freed", func() bool { return f.blocksUsed() == 0 })
	waitFor(t, "the running gauge back to 0", func() bool { return running() == 0 })
}

// feedSteps lets the fake executor's steps through gate one at a time, a
// millisecond apart, until the returned func is called.
func feedSteps(gate chan<- struct{}) (stop func()) {
	feed := make(chan struct{})
	go func() {
		for {
			select {
			case gate <- struct{}{}:
				time.Sleep(time.Millisecond)
			case <-feed:
				return
			}
		}
	}()
	return func() { close(feed) }
}

// TestGenerateExecutorEnds: an executor's End finishes a sequence at that
// step without a token (a constraint's dead end), with End as its reason;
// its blocks are freed and the sequences beside it run on unchanged.
func TestGenerateExecutorEnds(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFakeGen(4, 64)
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 64}, f); err != nil {
		t.Fatal(err)
	}
	cs := genCases(3)
	ends := []int{3, 0, 1}
	res := make([]genResult, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		c.stopAfter = 0
		cs[i] = c
		st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Client: "c", Prompt: c.prompt, MaxNewTokens: c.maxNew,
			State: &genState{endAt: ends[i]}})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); res[i] = collect(st) }()
	}
	waitGroup(t, &wg)
	for i, c := range cs {
		want, finish := expected(c.prompt, c.maxNew, 0)
		if ends[i] > 0 {
			want, finish = want[:ends[i]-1], "dead-end"
		}
		r := res[i]
		if r.err != nil || !slices.Equal(r.tokens, want) || r.finish != finish {
			t.Errorf("sequence %d: tokens %v finish %q err %v, want %v %q", i, r.tokens, r.finish, r.err, want, finish)
		}
		if r.info == nil || r.info.GeneratedTokens != len(want) {
			t.Errorf("sequence %d: info %+v, want %d generated", i, r.info, len(want))
		}
	}
	f.check(t)
	waitFor(t, "every block freed", func() bool { return f.blocksUsed() == 0 })
}

// TestGeneratePendingSitsOut: a sequence its executor answers Pending
// runs in no step until Pending closes, while the others run on; then it
// runs its last token again (the fake checks every position) and
// generates what it would have; a deferred sequence whose caller leaves
// frees its cache. The deferral shows in the metrics and Stats.
func TestGeneratePendingSitsOut(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newTestScheduler(t, Options{Registerer: reg})
	f := newFakeGen(4, 64)
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 32}, f); err != nil {
		t.Fatal(err)
	}
	ready, never := make(chan struct{}), make(chan struct{})
	defer close(never)
	gen := func(ctx context.Context, seed, n, maxNew int, pending chan struct{}) *GenStream {
		st, err := s.Generate(ctx, GenRequest{Model: "llm", Prompt: prompt(seed, n), MaxNewTokens: maxNew, State: &genState{pending: pending}})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	ctx, cancel := context.WithCancel(context.Background())
	put, gone := gen(context.Background(), 1, 6, 5, ready), gen(ctx, 3, 9, 5, never)
	other := collect(gen(context.Background(), 2, 3, 12, nil))
	if want, _ := expected(prompt(2, 3), 12, 0); !slices.Equal(other.tokens, want) {
		t.Errorf("the sequence beside deferred ones: %v, want %v", other.tokens, want)
	}
	// The deferred ones each ran once: their prompt, answered Pending.
	f.mu.Lock()
	for _, id := range []uint64{put.Seq(), gone.Seq()} {
		n := 0
		for _, step := range f.steps {
			if slices.Contains(step, id) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("sequence %d ran in %d steps while its executor was not ready, want 1", id, n)
		}
	}
	f.mu.Unlock()
	close(ready)
	r := collect(put)
	if want, finish := expected(prompt(1, 6), 5, 0); !slices.Equal(r.tokens, want) || r.finish != finish || r.info.GeneratedTokens != 5 {
		t.Errorf("deferred sequence: %v %q (info %+v), want %v %q", r.tokens, r.finish, r.info, want, finish)
	}
	cancel()
	if r := collect(gone); !errors.Is(r.err, context.Canceled) {
		t.Errorf("a deferred sequence whose caller left: %v", r.err)
	}
	if err := s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "blocks freed", func() bool { return f.blocksUsed() == 0 })
	f.check(t)
	if m := value(t, reg, "brokerd_generation_deferred_samples_total", "model", "llm", "device", "cpu:0"); m != 2 {
		t.Errorf("deferred samples metric %g, want 2", m)
	}
	for _, row := range s.Stats("llm") {
		if row.Gen.DeferredSamples != 2 {
			t.Errorf("stats row %q: %d deferred samples, want 2", row.DeviceID, row.Gen.DeferredSamples)
		}
	}
}

// TestGenerateCountsCachedPrompt: a sequence's cached prompt tokens are what
// the executor reported of its prompt chunks, not of its decode steps.
func TestGenerateCountsCachedPrompt(t *testing.T) {
	s := newTestScheduler(t, Options{})
	f := newFakeGen(16, 64)
	f.cachedEach = 1 // one token of every item, decode steps' too
	if err := s.AddGenReplica("llm", Device{ID: "cpu:0", Type: "cpu"}, GenOptions{MaxRunning: 4, MaxStepTokens: 64, MaxChunk: 4}, f); err != nil {
		t.Fatal(err)
	}
	st, err := s.Generate(context.Background(), GenRequest{Model: "llm", Prompt: prompt(1, 10), MaxNewTokens: 6, State: &genState{}})
	if err != nil {
		t.Fatal(err)
	}
	r := collect(st)
	if r.err != nil {
		t.Fatal(r.err)
	}
	// Chunks of 4, 4 and 2 tokens: one each.
	if r.info == nil || r.info.CachedPromptTokens != 3 || r.info.PromptTokens != 10 {
		t.Errorf("info %+v, want 3 of 10 prompt tokens cached", r.info)
	}
}
