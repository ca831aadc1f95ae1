package llm

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
)

func openCPU(t testing.TB, dt runtime.DType) runtime.Device {
	t.Helper()
	dev, err := onednn.New(onednn.Options{}).Open(context.Background(), runtime.DeviceSpec{ID: "cpu:0", DType: dt})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

func newTestEngine(t testing.TB, dev runtime.Device, s netSpec, seed uint64, opts EngineOptions) *Engine {
	t.Helper()
	w, err := engineWeights(s, randomCheckpoint(s, seed))
	if err != nil {
		t.Fatal(err)
	}
	e, err := newEngine(context.Background(), dev, s, w, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// job is one sequence of a simulated schedule: it joins at step join,
// prefills its prompt in chunks of chunk tokens, then decodes until it has
// gen tokens.
type job struct {
	seq    uint64
	prompt []int32
	gen    int
	join   int
	chunk  int
	params Sampling

	state  *Sequence
	done   int   // prompt tokens in the cache
	out    []int32
	logits [][]float32 // the logits each token was sampled from
}

// simulate runs jobs through e as the scheduler would (each step: every
// joined sequence's next chunk or decode token) and releases each one's
// cache when it ends.
func simulate(t *testing.T, e *Engine, jobs []*job) {
	t.Helper()
	ctx := context.Background()
	for _, j := range jobs {
		var err error
		if j.state, err = newSequence(j.params, j.prompt, e.spec.Vocab, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	for step := 0; ; step++ {
		var items []StepItem
		var owners []*job
		left := false
		for _, j := range jobs {
			if len(j.out) >= j.gen {
				continue
			}
			left = true
			if step < j.join {
				continue
			}
			it := StepItem{Seq: j.seq, State: j.state}
			if j.done < len(j.prompt) {
				n := min(j.chunk, len(j.prompt)-j.done)
				it.Tokens, it.Pos = j.prompt[j.done:j.done+n], j.done
				it.Sample = j.done+n == len(j.prompt)
			} else {
				it.Tokens, it.Pos, it.Sample = j.out[len(j.out)-1:], len(j.prompt)+len(j.out)-1, true
			}
			if !e.Reserve(j.seq, it.Pos+len(it.Tokens)) {
				t.Fatalf("step %d: no cache for sequence %d", step, j.seq)
			}
			items = append(items, it)
			owners = append(owners, j)
		}
		if !left {
			return
		}
		if len(items) == 0 {
			continue
		}
		logits, err := e.stepLogits(ctx, items)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		res, err := e.sample(items, logits)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		v, r := e.spec.Vocab, 0
		for i, it := range items {
			j := owners[i]
			if !it.Sample {
				j.done += len(it.Tokens)
				continue
			}
			j.done = len(j.prompt)
			j.out = append(j.out, res[i].Token)
			j.logits = append(j.logits, slices.Clone(logits[r*v:(r+1)*v]))
			r++
			if len(j.out) >= j.gen {
				e.Release(j.seq)
			}
		}
	}
}

func prompt(n int, seed int32, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = (seed*31 + int32(i)*17 + int32(i*i)) % int32(vocab)
	}
	return p
}

func argmax(x []float64) int32 {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return int32(b)
}

// TestEngineMatchesReference checks the engine's logits against the
// float64 forward pass at every generated position, and its greedy tokens
// against the reference's, for each architecture, prefilling in chunks.
func TestEngineMatchesReference(t *testing.T) {
	for _, arch := range []string{"llama", "qwen2", "qwen3"} {
		t.Run(arch, func(t *testing.T) {
			s := tinyNet(arch)
			var dev runtime.Device = &goDevice{}
			e := newTestEngine(t, dev, s, 7, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4})
			j := &job{seq: 1, prompt: prompt(13, 3, s.Vocab), gen: 10, chunk: 5}
			simulate(t, e, []*job{j})
			w := randomCheckpoint(s, 7)
			full := append(slices.Clone(j.prompt), j.out...)
			ref := refForward(s, w, full[:len(full)-1])
			worst := 0.0
			for i, got := range j.logits {
				want := ref[len(j.prompt)-1+i]
				scale := 0.0
				for _, v := range want {
					scale = math.Max(scale, math.Abs(v))
				}
				for k, v := range want {
					worst = math.Max(worst, math.Abs(float64(got[k])-v)/scale)
				}
				if tok := argmax(want); tok != j.out[i] {
					t.Errorf("token %d: engine %d, reference %d", i, j.out[i], tok)
				}
			}
			t.Logf("%s: worst logit error %.2g of the largest logit over %d positions", arch, worst, len(j.logits))
			if worst > 1e-4 {
				t.Errorf("worst relative logit error %g > 1e-4", worst)
			}
			if used, _ := e.CacheBlocks(); used != 0 {
				t.Errorf("%d blocks held after release", used)
			}
		})
	}
}
