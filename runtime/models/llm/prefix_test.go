package llm

import (
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/brokerd/brokerd/scheduler"
)

// sharedPrompts are prompts with a common 14-token prefix (a system
// prompt) and distinct suffixes.
func sharedPrompts(v, n int) [][]int32 {
	sys := prompt(14, 42, v)
	out := make([][]int32, n)
	for i := range out {
		out[i] = append(slices.Clone(sys), prompt(2+i%5, int32(i), v)...)
	}
	return out
}

// TestPrefixCache runs sequences sharing a prefix in a mix where later ones
// map the earlier ones' blocks: their logits must be bit-identical to each
// sequence run alone without the cache, fewer rows must be computed, and
// every block must come back.
func TestPrefixCache(t *testing.T) {
	for name, open := range testDevices(t) {
		t.Run(name, func(t *testing.T) {
			s := tinyNet("llama")
			prompts := sharedPrompts(s.Vocab, 5)
			params := []Sampling{{}, {Temperature: 0.7, Seed: 3, Seeded: true}}
			var alone []*job
			for i, p := range prompts {
				e := newTestEngine(t, open(t), s, 4, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4, DisablePrefixCache: true})
				j := &job{seq: 1, prompt: p, gen: 6, chunk: len(p), params: params[i%2]}
				simulate(t, e, []*job{j})
				alone = append(alone, j)
			}
			e := newTestEngine(t, open(t), s, 4, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4})
			var mix []*job
			for i, p := range prompts {
				// The first prefills alone; the others join later in chunks
				// that start and end off the block boundaries too.
				mix = append(mix, &job{seq: uint64(10 + i), prompt: p, gen: 6, join: 3 * min(i, 1) * (1 + i%2), chunk: []int{len(p), 8, 5, 16, 3}[i], params: params[i%2]})
			}
			simulate(t, e, mix)
			for i := range mix {
				if !slices.Equal(mix[i].out, alone[i].out) {
					t.Fatalf("sequence %d: %v with shared blocks, %v alone", i, mix[i].out, alone[i].out)
				}
				for k := range alone[i].logits {
					for v, x := range alone[i].logits[k] {
						if math.Float32bits(x) != math.Float32bits(mix[i].logits[k][v]) {
							t.Fatalf("sequence %d token %d: logit %d %g shared, %g alone", i, k, v, mix[i].logits[k][v], x)
						}
					}
				}
			}
			st := e.Stats()
			if st.CachedTokens == 0 {
				t.Errorf("no prefix block was shared: %+v", st)
			}
			t.Logf("%+v", st)
			if used, _ := e.CacheBlocks(); used != 0 {
				t.Errorf("%d blocks held after every sequence ended", used)
			}
			// A second round finds the released prefix blocks still cached.
			again := &job{seq: 99, prompt: prompts[0], gen: 6, chunk: 32, params: params[0]}
			simulate(t, e, []*job{again})
			if !slices.Equal(again.out, alone[0].out) {
				t.Errorf("second round: %v, alone %v", again.out, alone[0].out)
			}
			if got := e.Stats().CachedTokens - st.CachedTokens; got < 12 {
				t.Errorf("second round shared %d tokens, want the prefix's 3 full blocks", got)
			}
		})
	}
}

// TestPrefixCacheEviction fills the cache so that idle cached blocks must
// be evicted for new sequences, and checks that the accounting stays
// exact: available blocks include idle ones, and eviction unregisters them.
func TestPrefixCacheEviction(t *testing.T) {
	p := newBlockPool(6, 2, 10, true)
	toks := []int32{1, 2, 3, 4, 5}
	if !p.reserve(1, 5) {
		t.Fatal("reserve 1")
	}
	p.startStep()
	if _, _, skip, _ := p.begin(1, 0, toks, true); skip != 0 {
		t.Fatalf("skip %d on an empty cache", skip)
	}
	p.commit(1, 0, toks)
	p.release(1) // two registered blocks go idle, one plain block is freed
	if used, _ := p.used(); used != 0 || len(p.idle) != 2 || len(p.free) != 4 {
		t.Fatalf("after release: used %d, idle %d, free %d", used, len(p.idle), len(p.free))
	}
	// Sequence 2 shares both registered blocks.
	if !p.reserve(2, 5) {
		t.Fatal("reserve 2")
	}
	p.startStep()
	blocks, filled, skip, _ := p.begin(2, 0, toks, true)
	if skip != 4 || filled != 4 || len(p.idle) != 0 {
		t.Fatalf("shared: skip %d filled %d idle %d, blocks %v", skip, filled, len(p.idle), blocks)
	}
	p.commit(2, 4, toks[4:])
	p.release(2)
	// Sequence 3 needs all six blocks: both idle cached ones are evicted.
	if !p.reserve(3, 12) {
		t.Fatal("reserve 3: idle blocks must count as available")
	}
	if len(p.cached) != 0 || len(p.idle) != 0 {
		t.Fatalf("after eviction: %d cached, %d idle", len(p.cached), len(p.idle))
	}
	p.startStep()
	if _, _, skip, _ := p.begin(3, 0, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, true); skip != 0 {
		t.Fatalf("evicted blocks were shared (skip %d)", skip)
	}
	p.release(3)
	if used, total := p.used(); used != 0 || total != 6 {
		t.Fatalf("used %d of %d", used, total)
	}
}

// TestPrefixCacheUnderScheduler runs a council round (prompts sharing a
// system prompt) through the scheduler twice, with preemptions, and checks
// every sequence's tokens against it alone.
func TestPrefixCacheUnderScheduler(t *testing.T) {
	s := tinyNet("qwen2")
	prompts := sharedPrompts(s.Vocab, 8)
	var want [][]int32
	for _, p := range prompts {
		e := newTestEngine(t, &goDevice{}, s, 6, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4, DisablePrefixCache: true})
		j := &job{seq: 1, prompt: p, gen: 7, chunk: len(p)}
		simulate(t, e, []*job{j})
		want = append(want, j.out)
	}
	dev := openDecoderCPU(t, 0)
	perBlock := int64(2 * s.Layers * 4 * s.KVHeads * s.HeadDim * 4)
	e := newTestEngine(t, dev, s, 6, EngineOptions{CacheBytes: 22 * perBlock, BlockSize: 4})
	sch := scheduler.New(scheduler.Options{})
	defer sch.Close()
	exec := &gatedExecutor{genExecutor: genExecutor{e: e}}
	if err := sch.AddGenReplica("m", scheduler.Device{ID: "cpu:0", Type: "cpu"},
		scheduler.GenOptions{MaxRunning: 6, MaxStepTokens: 24, MaxChunk: 9}, exec); err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		// Each round is submitted whole before its first step, as the
		// council submits a round in one call.
		gate := make(chan struct{})
		exec.setGate(gate)
		streams := make([]*scheduler.GenStream, len(prompts))
		for i, p := range prompts {
			seq, _ := newSequence(Sampling{}, p, s.Vocab, nil, nil)
			var err error
			if streams[i], err = sch.Generate(context.Background(), scheduler.GenRequest{Model: "m", Prompt: p, MaxNewTokens: 7, State: seq}); err != nil {
				t.Fatal(err)
			}
		}
		close(gate)
		var wg sync.WaitGroup
		for i := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var got []int32
				for {
					ev, err := streams[i].Recv()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						t.Error(err)
						return
					}
					if ev.HasToken {
						got = append(got, ev.Token)
					}
				}
				if !slices.Equal(got, want[i]) {
					t.Errorf("round %d sequence %d: %v, alone %v", round, i, got, want[i])
				}
			}()
		}
		wg.Wait()
	}
	if err := sch.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := e.Stats()
	t.Logf("%+v", st)
	if st.CachedTokens < int64(len(prompts)*12) {
		t.Errorf("%d tokens shared over two rounds of %d prompts with a 3-block prefix", st.CachedTokens, len(prompts))
	}
	if used, _ := e.CacheBlocks(); used != 0 {
		t.Errorf("%d blocks held after the drain", used)
	}
}

// gatedExecutor is genExecutor whose gate changes between rounds.
type gatedExecutor struct {
	genExecutor
	mu sync.Mutex
	g  <-chan struct{}
}

func (x *gatedExecutor) setGate(g <-chan struct{}) {
	x.mu.Lock()
	x.g = g
	x.mu.Unlock()
}

func (x *gatedExecutor) Step(ctx context.Context, items []scheduler.StepItem) ([]scheduler.StepResult, error) {
	x.mu.Lock()
	g := x.g
	x.mu.Unlock()
	if g != nil {
		<-g
	}
	return x.genExecutor.Step(ctx, items)
}

// TestPrefixSharedWithinStep: sequences that start in the same step with
// the same prompt (n choices of one prompt, a council's round) prefill it
// once: the later ones map the blocks the first writes in that step. Their
// logits are bit-identical to each run alone.
func TestPrefixSharedWithinStep(t *testing.T) {
	for name, open := range testDevices(t) {
		t.Run(name, func(t *testing.T) {
			s := tinyNet("qwen2")
			shared := sharedPrompts(s.Vocab, 1)[0] // 14 + 2 tokens: 4 blocks of 4
			prompts := [][]int32{shared, shared, shared, append(slices.Clone(shared[:14]), 7, 8, 9)}
			chunks := []int{16, 16, 8, 17}
			params := Sampling{Temperature: 0.7, Seed: 3, Seeded: true}
			var alone []*job
			for _, p := range prompts {
				e := newTestEngine(t, open(t), s, 4, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4, DisablePrefixCache: true})
				j := &job{seq: 1, prompt: p, gen: 5, chunk: len(p), params: params}
				simulate(t, e, []*job{j})
				alone = append(alone, j)
			}
			e := newTestEngine(t, open(t), s, 4, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4})
			var mix []*job
			for i, p := range prompts {
				mix = append(mix, &job{seq: uint64(10 + i), prompt: p, gen: 5, chunk: chunks[i], params: params})
			}
			simulate(t, e, mix)
			for i := range mix {
				for k := range alone[i].logits {
					for v, x := range alone[i].logits[k] {
						if math.Float32bits(x) != math.Float32bits(mix[i].logits[k][v]) {
							t.Fatalf("sequence %d token %d: logit %d %g shared, %g alone", i, k, v, mix[i].logits[k][v], x)
						}
					}
				}
			}
			// The second and third copies map all 4 blocks but the last
			// one's last row (it samples): 12 and 8 + 4; the fourth maps
			// the 3 blocks of the common 14-token prefix: 12.
			if got := e.Stats().CachedTokens; got != 12+8+4+12 {
				t.Errorf("%d prompt tokens shared, want %d", got, 12+8+4+12)
			}
			if used, _ := e.CacheBlocks(); used != 0 {
				t.Errorf("%d blocks held after every sequence ended", used)
			}
		})
	}
}

// TestStepReportsCached: Step says of each item how many of its tokens the
// prefix cache held (what a request's usage reports as cached prompt
// tokens), and the counts add up to the engine's.
func TestStepReportsCached(t *testing.T) {
	for name, open := range testDevices(t) {
		t.Run(name, func(t *testing.T) {
			s := tinyNet("llama")
			e := newTestEngine(t, open(t), s, 4, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4})
			p := prompt(14, 5, s.Vocab) // three full blocks and two tokens
			ctx := context.Background()
			run := func(seq uint64, chunks ...int) []int {
				t.Helper()
				st, err := newSequence(Sampling{}, p, s.Vocab, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !e.Reserve(seq, len(p)+1) {
					t.Fatal("no cache")
				}
				var cached []int
				pos := 0
				for _, n := range chunks {
					res, err := e.Step(ctx, []SeqStep{{Seq: seq, State: st, Tokens: p[pos : pos+n], Pos: pos, Sample: pos+n == len(p)}})
					if err != nil {
						t.Fatal(err)
					}
					cached = append(cached, res[0].Cached)
					pos += n
				}
				return cached
			}
			before := e.Stats().CachedTokens
			if got := run(1, 14); !slices.Equal(got, []int{0}) {
				t.Errorf("the first sequence: cached %v, want [0]", got)
			}
			// The same prompt while the first holds its blocks, in two
			// chunks: each maps its whole blocks, 12 tokens in all.
			got := run(2, 8, 6)
			if !slices.Equal(got, []int{8, 4}) {
				t.Errorf("the second sequence: cached %v per chunk, want [8 4]", got)
			}
			if d := e.Stats().CachedTokens - before; d != 12 {
				t.Errorf("the engine counted %d cached tokens, the items 12", d)
			}
		})
	}
}
