package llm

import (
	"context"
	"errors"
	"flag"
	"math"
	"slices"
	"testing"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
)

func openCPU(t testing.TB, dt runtime.DType) runtime.Device {
	t.Helper()
	dev, err := onednn.New(onednn.Options{}).Open(context.Background(), runtime.DeviceSpec{ID: "cpu:0", DType: dt})
	if errors.Is(err, runtime.ErrUnsupported) {
		t.Skipf("this CPU cannot run %s on oneDNN: %v", dt, err)
	}
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
	done   int // prompt tokens in the cache
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
		if j.state != nil {
			continue // made by the test (a constrained one)
		}
		var err error
		if j.state, err = newSequence(j.params, j.prompt, e.spec.Vocab, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	for step := 0; ; step++ {
		var items []SeqStep
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
			it := SeqStep{Seq: j.seq, State: j.state}
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
		masks := e.startMasks(items) // constrained sequences' masks, as Step computes them
		logits, err := e.stepLogits(ctx, items)
		e.waitMasks(masks, 0)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		res, err := e.sample(items, nil, logits, nil)
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
			if res[i].End != "" { // a constraint's dead end: no token
				j.gen = len(j.out)
				e.Release(j.seq)
				r++
				continue
			}
			j.out = append(j.out, res[i].Token)
			j.logits = append(j.logits, slices.Clone(logits[r*v:(r+1)*v]))
			r++
			if res[i].Stop {
				j.gen = len(j.out)
			}
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

// logitError is the largest difference between got and want relative to
// want's largest magnitude.
func logitError(got []float32, want []float64) float64 {
	scale, worst := 0.0, 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(v))
	}
	for k, v := range want {
		worst = math.Max(worst, math.Abs(float64(got[k])-v)/scale)
	}
	return worst
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
// against the reference's, for each architecture, prefilling in chunks. In
// bf16 (weights and matmul operands rounded to 8 bits of mantissa) the
// logits are held to a looser bound and the tokens are not compared.
func TestEngineMatchesReference(t *testing.T) {
	devices := []struct {
		name string
		open func(t *testing.T) runtime.Device
		tol  float64
	}{
		{"go", func(*testing.T) runtime.Device { return &goDevice{} }, 1e-4},
		{"onednn", func(t *testing.T) runtime.Device { return openDecoderCPU(t, runtime.F32) }, 1e-4},
		{"onednn-bf16", func(t *testing.T) runtime.Device { return openDecoderCPU(t, runtime.BF16) }, 3e-2},
	}
	for _, arch := range []string{"llama", "qwen2", "qwen3"} {
		for _, d := range devices {
			t.Run(arch+"/"+d.name, func(t *testing.T) {
				s := tinyNet(arch)
				e := newTestEngine(t, d.open(t), s, 7, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4})
				j := &job{seq: 1, prompt: prompt(13, 3, s.Vocab), gen: 10, chunk: 5}
				simulate(t, e, []*job{j})
				w := randomCheckpoint(s, 7)
				full := append(slices.Clone(j.prompt), j.out...)
				ref := refForward(s, w, full[:len(full)-1])
				worst := 0.0
				for i, got := range j.logits {
					want := ref[len(j.prompt)-1+i]
					worst = math.Max(worst, logitError(got, want))
					if tok := argmax(want); tok != j.out[i] && d.tol <= 1e-4 {
						t.Errorf("token %d: engine %d, reference %d", i, j.out[i], tok)
					}
				}
				t.Logf("worst logit error %.2g of the largest logit over %d positions", worst, len(j.logits))
				if worst > d.tol {
					t.Errorf("worst relative logit error %g > %g", worst, d.tol)
				}
				if used, _ := e.CacheBlocks(); used != 0 {
					t.Errorf("%d blocks held after release", used)
				}
			})
		}
	}
}

// testDevices are the devices the engine tests run on: the pure-Go device,
// the same posing as a device that pads steps to buckets, and oneDNN's CPU
// device once it runs the decoder ops.
func testDevices(t *testing.T) map[string]func(t *testing.T) runtime.Device {
	return map[string]func(t *testing.T) runtime.Device{
		"go":        func(*testing.T) runtime.Device { return &goDevice{} },
		"go-padded": func(*testing.T) runtime.Device { return &goDevice{buckets: []int{1, 2, 4, 8, 16, 32, 64}} },
		"onednn":    func(t *testing.T) runtime.Device { return openDecoderCPU(t, runtime.F32) },
	}
}

// openDecoderCPU opens oneDNN's CPU device computing in dt.
func openDecoderCPU(t *testing.T, dt runtime.DType) runtime.Device {
	t.Helper()
	return openCPU(t, dt)
}

// mixJobs is a schedule where sequence 1 (the one compared) shares steps
// with others that join and leave at different steps, prefilling in chunks.
func mixJobs(v int, params Sampling) []*job {
	return []*job{
		{seq: 1, prompt: prompt(9, 1, v), gen: 12, join: 2, chunk: 4, params: params},
		{seq: 2, prompt: prompt(17, 2, v), gen: 5, join: 0, chunk: 6, params: params},
		{seq: 3, prompt: prompt(3, 3, v), gen: 20, join: 3, chunk: 3, params: params},
		{seq: 4, prompt: prompt(30, 4, v), gen: 2, join: 6, chunk: 7, params: params},
		{seq: 5, prompt: prompt(5, 5, v), gen: 3, join: 9, chunk: 1, params: params},
	}
}

// TestBatchInvariance runs sequence 1 alone (whole prompt in one step) and
// inside a mix: its tokens must be the same and its logits bit-identical,
// greedy and seeded sampling alike.
func TestBatchInvariance(t *testing.T) {
	seeded := Sampling{Temperature: 0.9, TopK: 40, TopP: 0.95, MinP: 0.01, Seed: 42, Seeded: true, RepetitionPenalty: 1.1, FrequencyPenalty: 0.2}
	for name, open := range testDevices(t) {
		for _, tc := range []struct {
			name   string
			params Sampling
		}{{"greedy", Sampling{}}, {"seeded", seeded}} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				s := tinyNet("qwen2")
				e := newTestEngine(t, open(t), s, 11, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4})
				alone := &job{seq: 1, prompt: prompt(9, 1, s.Vocab), gen: 12, chunk: 9, params: tc.params}
				simulate(t, e, []*job{alone})
				mix := mixJobs(s.Vocab, tc.params)
				simulate(t, e, mix)
				if !slices.Equal(alone.out, mix[0].out) {
					t.Fatalf("alone %v, in the mix %v", alone.out, mix[0].out)
				}
				for i := range alone.logits {
					for k, v := range alone.logits[i] {
						if math.Float32bits(v) != math.Float32bits(mix[0].logits[i][k]) {
							t.Fatalf("token %d: logit %d is %g alone, %g in the mix", i, k, v, mix[0].logits[i][k])
						}
					}
				}
				if used, _ := e.CacheBlocks(); used != 0 {
					t.Errorf("%d blocks held after every sequence ended", used)
				}
			})
		}
	}
}

func TestCacheExhaustion(t *testing.T) {
	s := tinyNet("llama")
	perBlock := int64(2 * s.Layers * 4 * s.KVHeads * s.HeadDim * 4)
	e := newTestEngine(t, &goDevice{}, s, 1, EngineOptions{CacheBytes: 5*perBlock + perBlock/2, BlockSize: 4})
	if used, total := e.CacheBlocks(); used != 0 || total != 5 {
		t.Fatalf("blocks %d/%d, want 0/5", used, total)
	}
	steps := []struct {
		op     string
		seq    uint64
		tokens int
		ok     bool
		used   int
	}{
		{"reserve", 1, 9, true, 3},   // 3 blocks
		{"reserve", 1, 12, true, 3},  // still 3
		{"reserve", 2, 9, false, 3},  // needs 3, 2 free
		{"reserve", 2, 8, true, 5},   // 2
		{"reserve", 1, 13, false, 5}, // a 4th block: none free
		{"reserve", 3, 1, false, 5},  // none free
		{"release", 1, 0, true, 2},   // frees 3
		{"reserve", 3, 1, true, 3},   // reuses a freed block
		{"reserve", 4, 81, false, 3}, // beyond the context
		{"release", 2, 0, true, 1},   //
		{"release", 3, 0, true, 0},   //
		{"release", 3, 0, true, 0},   // twice is harmless
		{"reserve", 5, 20, true, 5},  // the whole cache
		{"release", 5, 0, true, 0},   //
		{"reserve", 6, 0, true, 0},   // nothing to hold
		{"release", 99, 0, true, 0},  // unknown
		{"reserve", 7, 80, false, 0}, // the context's 20 blocks, 5 exist
		{"reserve", 8, -1, false, 0}, // nonsense
		{"reserve", 9, 17, true, 5},  //
		{"release", 9, 0, true, 0},   //
		{"reserve", 10, 4, true, 1},  //
		{"release", 10, 0, true, 0},  //
		{"reserve", 11, 5, true, 2},  //
		{"release", 11, 0, true, 0},  //
		{"reserve", 12, 20, true, 5}, //
		{"release", 12, 0, true, 0},  //
	}
	for i, st := range steps {
		ok := true
		if st.op == "reserve" {
			ok = e.Reserve(st.seq, st.tokens)
		} else {
			e.Release(st.seq)
		}
		used, _ := e.CacheBlocks()
		if ok != st.ok || used != st.used {
			t.Fatalf("%d: %s(%d, %d) = %v with %d blocks used, want %v with %d", i, st.op, st.seq, st.tokens, ok, used, st.ok, st.used)
		}
	}
}

var benchThreads = flag.Int("llm.threads", 0, "the benchmarks' device threads; 0 means the adapter's choice")

var benchNoAMX = flag.Bool("llm.noamx", false, "the benchmarks' device keeps quantized products off the AMX tiles (onednn.Options.NoAMX)")

var benchNoX16 = flag.Bool("llm.nox16", false, "the benchmarks' device keeps block-quantized weights in GGUF's layout rather than relaid by 16 rows for the VNNI kernels (onednn.Options.NoX16)")

var benchKVF32 = flag.Bool("llm.kvf32", false, "the quantized benchmarks' engines keep an f32 KV cache where the CPU would hold it in bf16 (EngineOptions.KVDType)")

var benchKV = flag.String("llm.kv", "", "the quantized benchmarks' engines' KV cache: f32, bf16, f16, q8_0 or q4_0 (EngineOptions.KVDType); empty: the engine's choice, or -llm.kvf32's")

// benchKVDType is EngineOptions.KVDType for the quantized benchmarks.
func benchKVDType() runtime.DType {
	if *benchKVF32 {
		return runtime.F32
	}
	return map[string]runtime.DType{"f32": runtime.F32, "bf16": runtime.BF16, "f16": runtime.F16, "q8_0": runtime.Q8_0, "q4_0": runtime.Q4_0}[*benchKV]
}

var benchAMXRelaid = flag.Bool("llm.amxrelaid", false, "the benchmarks' device relays block-quantized weights by 16 rows on a CPU with AMX too (onednn.Options.AMXRelaid)")

var benchPrompt = flag.Int("llm.prompt", 64, "BenchmarkDecode and BenchmarkDecodeQuantized: prompt tokens a sequence, prefilled before the measured steps (the contexts they attend over)")

var benchNoAMXInt8 = flag.Bool("llm.noamxint8", false, "the benchmarks' device keeps Q8_0's products of up to 16 rows on bf16 panels rather than AMX-INT8 (onednn.Options.NoAMXInt8)")

func openBenchDevice(b *testing.B, dt runtime.DType) runtime.Device {
	dev, err := onednn.New(onednn.Options{NoAMX: *benchNoAMX, NoAMXInt8: *benchNoAMXInt8, NoX16: *benchNoX16, AMXRelaid: *benchAMXRelaid}).Open(context.Background(), runtime.DeviceSpec{ID: "cpu:0", DType: dt, Threads: *benchThreads})
	if err != nil {
		b.Skipf("oneDNN %s: %v", dt, err)
	}
	b.Cleanup(func() { dev.Close() })
	return dev
}

func openCPUMaybe(dt runtime.DType) (runtime.Device, error) {
	return onednn.New(onednn.Options{}).Open(context.Background(), runtime.DeviceSpec{ID: "cpu:0", DType: dt})
}

// TestStepIndexChecks feeds the device's paged ops indices outside the
// cache: they must fail the run, not read or write out of bounds.
func TestStepIndexChecks(t *testing.T) {
	ctx := context.Background()
	dev := openDecoderCPU(t, runtime.F32)
	alloc := func(dt runtime.DType, vals []int32, shape ...int) runtime.Buffer {
		b, err := dev.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Free(b) })
		if vals != nil {
			if err := dev.CopyInInt32(ctx, b, vals); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	cache := alloc(runtime.F32, nil, 2, 4, 1, 2) // 2 blocks of 4 slots
	kv := alloc(runtime.F32, nil, 1, 1, 2)
	q := alloc(runtime.F32, nil, 1, 2, 2)
	out := alloc(runtime.F32, nil, 1, 2, 2)
	for _, tc := range []struct {
		name string
		op   runtime.Op
		bind map[string]runtime.Buffer
	}{
		{"slot past the cache", runtime.Op{Kind: runtime.OpKVWrite, In: []string{"kv", "slots"}, Out: "cache"},
			map[string]runtime.Buffer{"kv": kv, "slots": alloc(runtime.I32, []int32{8}, 1), "cache": cache}},
		{"block past the cache", runtime.Op{Kind: runtime.OpPagedAttention, In: []string{"q", "cache", "cache", "bt", "seq", "pos"}, Out: "out"},
			map[string]runtime.Buffer{"q": q, "cache": cache, "bt": alloc(runtime.I32, []int32{2, 0}, 1, 2),
				"seq": alloc(runtime.I32, []int32{0}, 1), "pos": alloc(runtime.I32, []int32{1}, 1), "out": out}},
		{"position past the table", runtime.Op{Kind: runtime.OpPagedAttention, In: []string{"q", "cache", "cache", "bt", "seq", "pos"}, Out: "out"},
			map[string]runtime.Buffer{"q": q, "cache": cache, "bt": alloc(runtime.I32, []int32{0, 1}, 1, 2),
				"seq": alloc(runtime.I32, []int32{0}, 1), "pos": alloc(runtime.I32, []int32{8}, 1), "out": out}},
		{"sequence past the table", runtime.Op{Kind: runtime.OpPagedAttention, In: []string{"q", "cache", "cache", "bt", "seq", "pos"}, Out: "out"},
			map[string]runtime.Buffer{"q": q, "cache": cache, "bt": alloc(runtime.I32, []int32{0, 1}, 1, 2),
				"seq": alloc(runtime.I32, []int32{1}, 1), "pos": alloc(runtime.I32, []int32{0}, 1), "out": out}},
	} {
		err := dev.Run(ctx, &runtime.Graph{Ops: []runtime.Op{tc.op}}, tc.bind)
		if !errors.Is(err, runtime.ErrInvalidGraph) {
			t.Errorf("%s: %v, want ErrInvalidGraph", tc.name, err)
		}
	}
}
