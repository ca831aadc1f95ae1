package llm

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
)

// qwen05 is Qwen2.5-0.5B's shape (context cut to what the benchmark uses).
func qwen05() netSpec {
	return netSpec{Vocab: 151936, Hidden: 896, Layers: 24, Heads: 14, KVHeads: 2, HeadDim: 64, Inter: 4864,
		Context: 1024, Eps: 1e-6, QKVBias: true, Tied: true, InvFreq: ropeFreqs(64, 1000000, nil)}
}

// fastWeights fills the engine's weights for s with small uniform values
// (an xorshift stream: generating 0.5 G normal values would dominate the
// benchmark's setup).
func fastWeights(s netSpec) map[string]models.Tensor {
	x := uint64(88172645463325252)
	fill := func(scale float32, offset float32, shape ...int) models.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			data[i] = offset + scale*(float32(x>>40)/float32(1<<24)-0.5)
		}
		return models.Tensor{Shape: shape, Data: data}
	}
	h, d := s.Hidden, s.HeadDim
	w := map[string]models.Tensor{
		wEmbed: fill(0.1, 0, s.Vocab, h), wNorm: fill(0.1, 1, h),
		wInvFreq: {Shape: []int{d / 2}, Data: s.InvFreq},
	}
	w[wLMHead] = w[wEmbed]
	for l := range s.Layers {
		w[lw(l, lLN1)], w[lw(l, lLN2)] = fill(0.1, 1, h), fill(0.1, 1, h)
		w[lw(l, lWQ)], w[lw(l, lBQ)] = fill(0.05, 0, s.Heads*d, h), fill(0.1, 0, s.Heads*d)
		w[lw(l, lWK)], w[lw(l, lBK)] = fill(0.05, 0, s.KVHeads*d, h), fill(0.1, 0, s.KVHeads*d)
		w[lw(l, lWV)], w[lw(l, lBV)] = fill(0.05, 0, s.KVHeads*d, h), fill(0.1, 0, s.KVHeads*d)
		w[lw(l, lWO)] = fill(0.05, 0, h, s.Heads*d)
		w[lw(l, lGateUp)] = fill(0.05, 0, 2*s.Inter, h)
		w[lw(l, lDown)] = fill(0.03, 0, h, s.Inter)
	}
	return w
}

// memoryBandwidth is a copy of 256 MiB, the best of three, in bytes per
// second (read and written both counted).
func memoryBandwidth() float64 {
	src := make([]byte, 256<<20)
	dst := make([]byte, len(src))
	for i := range src {
		src[i] = byte(i)
	}
	best := time.Duration(1 << 62)
	for range 3 {
		start := time.Now()
		copy(dst, src)
		best = min(best, time.Since(start))
	}
	return 2 * float64(len(src)) / best.Seconds()
}

// BenchmarkDecode measures decode steps of 1, 4 and 16 sequences on a
// model of Qwen2.5-0.5B's shape (LLM_BENCH_SMALL=1: a quarter of its
// layers), with each sequence 64 tokens into its context. It reports
// tokens/s and, for one sequence, the weight bytes read per token over the
// machine's copy bandwidth: the decode's physical limit.
func BenchmarkDecode(b *testing.B) {
	s := benchContext(qwen05())
	if os.Getenv("LLM_BENCH_SMALL") != "" {
		s.Layers = 6
	}
	for _, dt := range []runtime.DType{runtime.F32, runtime.BF16} {
		b.Run(dt.String(), func(b *testing.B) {
			dev := openBenchDevice(b, dt)
			e, err := newEngine(context.Background(), dev, s, fastWeights(s), EngineOptions{CacheBytes: 1 << 30, MaxStepTokens: 1024})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			readBytes := decodeReadBytes(s, e.mmDT)
			bw := memoryBandwidth()
			for _, n := range []int{1, 4, 16} {
				b.Run(fmt.Sprintf("seqs=%d", n), func(b *testing.B) {
					perStep := decodeSteps(b, e, s, n)
					b.ReportMetric(float64(n)/perStep, "tokens/s")
					if n == 1 {
						limit := bw / float64(readBytes)
						b.ReportMetric(float64(readBytes)/1e6, "MB/token")
						b.ReportMetric(bw/1e9, "copyGB/s")
						b.ReportMetric((1/perStep)/limit, "of-bw-limit")
					}
				})
			}
		})
	}
}

// benchContext is s with room for -llm.prompt's prompts and the steps
// after them.
func benchContext(s netSpec) netSpec {
	s.Context = max(s.Context, *benchPrompt+512)
	return s
}

// decodeSteps times decode steps of n sequences, each -llm.prompt (64)
// tokens into its context (prefilled first, and one decode step to create
// the primitives, both untimed), and returns the seconds per step.
func decodeSteps(b *testing.B, e *Engine, s netSpec, n int) float64 {
	ctx := context.Background()
	items := make([]SeqStep, n)
	for i := range items {
		seq := uint64(100*n + i)
		if !e.Reserve(seq, s.Context) {
			b.Fatal("reserve")
		}
		items[i] = SeqStep{Seq: seq, Sample: true}
		items[i].State, _ = newSequence(Sampling{IgnoreEOS: true}, nil, s.Vocab, nil, nil)
	}
	defer func() {
		for _, it := range items {
			e.Release(it.Seq)
		}
	}()
	// The prompts' prefill, a sequence at a time in chunks of up to 512
	// tokens, but for each one's last token: the first step below takes
	// those together and samples.
	for i := range items {
		p := prompt(*benchPrompt, int32(i), s.Vocab)
		for len(p) > 1 {
			it := items[i]
			it.Tokens, it.Sample = p[:min(512, len(p)-1)], false
			if _, err := e.Step(ctx, []SeqStep{it}); err != nil {
				b.Fatal(err)
			}
			items[i].Pos += len(it.Tokens)
			p = p[len(it.Tokens):]
		}
		items[i].Tokens = p
	}
	step := func() {
		res, err := e.Step(ctx, items)
		if err != nil {
			b.Fatal(err)
		}
		for i := range items {
			items[i].Pos += len(items[i].Tokens)
			items[i].Tokens = []int32{res[i].Token}
		}
	}
	step() // the prompts' last tokens
	step() // the first decode creates the primitives
	b.ResetTimer()
	cpu := processCPU()
	for range b.N {
		if items[0].Pos+1 >= s.Context {
			b.Skip("context full")
		}
		step()
	}
	reportCPU(b, cpu, "step")
	return b.Elapsed().Seconds() / float64(b.N)
}

// processCPU is the CPU time the process has used so far. With
// -llm.threads=1 its growth per step measures the step's work even on a
// machine another tenant keeps busy, where the wall time does not (and
// where OpenMP threads spin at barriers waiting for a descheduled peer).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process CPU time per iteration since since.
func reportCPU(b *testing.B, since time.Duration, unit string) {
	b.ReportMetric(float64(processCPU()-since)/1e6/float64(b.N), "cpu-ms/"+unit)
}

// decodeReadBytes is what one decode step must read of the weights: every
// matmul weight (lm_head included) in the operand type dt. Norm gains,
// biases and one embedding row are negligible.
func decodeReadBytes(s netSpec, dt runtime.DType) int64 {
	h, d := int64(s.Hidden), int64(s.HeadDim)
	perLayer := h*int64(s.Heads)*d*2 + h*int64(s.KVHeads)*d*2 + h*int64(s.Inter)*3
	return (int64(s.Layers)*perLayer + int64(s.Vocab)*h) * int64(dt.Size())
}

// llama1024 is a Llama shape whose rows divide by 256, so the K types
// apply to every matrix (Qwen2.5-0.5B's 896 do not).
func llama1024() netSpec {
	return netSpec{Vocab: 32000, Hidden: 1024, Layers: 12, Heads: 16, KVHeads: 4, HeadDim: 64, Inter: 2816,
		Context: 1024, Eps: 1e-5, InvFreq: ropeFreqs(64, 500000, nil)}
}

// quantizeFast stores w's matrices in dt as random valid blocks (random
// quants and sub-block scales, small f16 block scales): the speed of a
// product does not depend on the values, and quantizing 0.5 G values
// properly would dominate the benchmark's setup.
func quantizeFast(w map[string]models.Tensor, dt runtime.DType) map[string]models.Tensor {
	scales := map[runtime.DType][]int{runtime.Q4_0: {0}, runtime.Q4_1: {0, 2}, runtime.Q5_0: {0}, runtime.Q5_1: {0, 2},
		runtime.Q8_0: {0}, runtime.Q4_K: {0, 2}, runtime.Q5_K: {0, 2}, runtime.Q6_K: {208}}[dt]
	q, _ := dt.GGML()
	in, _ := q.Info()
	x := uint64(0x9e3779b97f4a7c15)
	out := map[string]models.Tensor{}
	for name, t := range w {
		if len(t.Shape) != 2 || !matmulWeight(name) || t.Shape[1]%in.BlockElems != 0 {
			out[name] = t
			continue
		}
		raw := make([]byte, dt.Bytes(int64(t.Elements())))
		for i := range raw {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			raw[i] = byte(x >> 56)
		}
		for b := 0; b < len(raw); b += in.BlockBytes {
			for _, o := range scales {
				raw[b+o], raw[b+o+1] = 0x00, 0x20 // f16 2^-7
			}
		}
		out[name] = models.Tensor{Shape: t.Shape, Stored: dt, Raw: [][]byte{raw}}
	}
	return out
}

// BenchmarkDecodeQuantized is BenchmarkDecode with the matrices held
// block-quantized (qgemm.c, and qamx.c for 16 sequences on a CPU with
// AMX): Q8_0 and Q4_0 on Qwen2.5-0.5B's shape, Q4_K, Q5_K, Q6_K and Q8_0 on
// llama1024's. The bandwidth limit counts the stored bytes.
func BenchmarkDecodeQuantized(b *testing.B) {
	for _, c := range []struct {
		shape string
		s     netSpec
		dt    runtime.DType
	}{
		{"qwen0.5b", qwen05(), runtime.Q8_0}, {"qwen0.5b", qwen05(), runtime.Q4_0},
		{"llama1024", llama1024(), runtime.Q4_K}, {"llama1024", llama1024(), runtime.Q5_K}, {"llama1024", llama1024(), runtime.Q6_K}, {"llama1024", llama1024(), runtime.Q8_0},
	} {
		b.Run(c.shape+"/"+c.dt.String(), func(b *testing.B) {
			s := benchContext(c.s)
			if os.Getenv("LLM_BENCH_SMALL") != "" {
				s.Layers = 6
			}
			dev := openBenchDevice(b, runtime.F32)
			w := quantizeFast(fastWeights(s), c.dt)
			e, err := newEngine(context.Background(), dev, s, w, EngineOptions{CacheBytes: 1 << 30, MaxStepTokens: 1024, KVDType: benchKVDType()})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			var readBytes int64
			for n, t := range w {
				if t.Quantized() && n != wEmbed || (n == wEmbed && s.Tied) {
					readBytes += t.Stored.Bytes(int64(t.Elements()))
				}
			}
			bw := memoryBandwidth()
			for _, n := range []int{1, 16} {
				b.Run(fmt.Sprintf("seqs=%d", n), func(b *testing.B) {
					perStep := decodeSteps(b, e, s, n)
					b.ReportMetric(float64(n)/perStep, "tokens/s")
					if n == 1 {
						b.ReportMetric(float64(readBytes)/1e6, "MB/token")
						b.ReportMetric((1/perStep)/(bw/float64(readBytes)), "of-bw-limit")
					}
				})
			}
		})
	}
}

// BenchmarkDecodeFixedCost is a decode step of one sequence on a model of
// Qwen2.5-0.5B's depth and op sequence (24 layers, q/k/v biases, Q8_0
// matrices) with tiny matrices and heads, so that what the step costs
// beyond its arithmetic shows: the graph's few hundred op launches, their
// buffers, the hand-off to the device. On a wide host, where a real
// model's decode step takes a few milliseconds, these costs are a share of
// the single stream's rate (bench/RESULTS.md).
func BenchmarkDecodeFixedCost(b *testing.B) {
	s := benchContext(netSpec{Vocab: 256, Hidden: 64, Layers: 24, Heads: 2, KVHeads: 1, HeadDim: 32, Inter: 64,
		Context: 1024, Eps: 1e-6, QKVBias: true, Tied: true, InvFreq: ropeFreqs(32, 1000000, nil)})
	dev := openBenchDevice(b, runtime.F32)
	e, err := newEngine(context.Background(), dev, s, quantizeFast(fastWeights(s), runtime.Q8_0),
		EngineOptions{CacheBytes: 1 << 28, MaxStepTokens: 1024})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	perStep := decodeSteps(b, e, s, 1)
	b.ReportMetric(perStep*1e6, "us/step")
}

// BenchmarkPrefill512 is one 512-token prefill step of llama1024 with its
// matrices in Q4_K, Q6_K and Q8_0 (qamx.c on a CPU with AMX, else dequantized
// slices through oneDNN; -llm.noamx for the latter), against the same
// shape in bf16 and f32 weights.
func BenchmarkPrefill512(b *testing.B) {
	s := llama1024()
	for _, c := range []struct {
		name string
		dt   runtime.DType // device compute type
		q    runtime.DType // 0: float weights
	}{{"q4_K", runtime.F32, runtime.Q4_K}, {"q6_K", runtime.F32, runtime.Q6_K}, {"q8_0", runtime.F32, runtime.Q8_0}, {"bf16", runtime.BF16, 0}, {"f32", runtime.F32, 0}} {
		b.Run(c.name, func(b *testing.B) {
			dev := openBenchDevice(b, c.dt)
			w := fastWeights(s)
			if c.q != 0 {
				w = quantizeFast(w, c.q)
			}
			e, err := newEngine(context.Background(), dev, s, w, EngineOptions{CacheBytes: 1 << 29, MaxStepTokens: 1024, KVDType: benchKVDType()})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			cpu := processCPU()
			for i := 0; b.Loop(); i++ {
				seq := uint64(i + 1)
				if !e.Reserve(seq, 512) {
					b.Fatal("reserve")
				}
				st, _ := newSequence(Sampling{IgnoreEOS: true}, nil, s.Vocab, nil, nil)
				if _, err := e.Step(ctx, []SeqStep{{Seq: seq, Tokens: prompt(512, int32(i), s.Vocab), Sample: true, State: st}}); err != nil {
					b.Fatal(err)
				}
				e.Release(seq)
			}
			reportCPU(b, cpu, "prefill")
		})
	}
}

// BenchmarkVerifyRows is what speculative decoding costs a step: one
// sequence -llm.prompt (64) tokens into its context runs its token and
// rows-1 guesses, every row sampled (logits and a greedy pick), against
// rows=1, a plain decode step. The step is run at the same position each
// time (nothing committed), so only the rows' count changes. With a
// guess taken with probability a, k guesses give (1-a^(k+1))/(1-a)
// tokens a step: speculation gains where that exceeds the rows' cost
// ratio (bench/RESULTS.md).
func BenchmarkVerifyRows(b *testing.B) {
	for _, c := range []struct {
		shape string
		s     netSpec
		dt    runtime.DType
	}{
		{"qwen0.5b", qwen05(), runtime.Q8_0}, {"qwen0.5b", qwen05(), runtime.Q4_0}, {"llama1024", llama1024(), runtime.Q8_0}, {"llama1024", llama1024(), runtime.Q4_K},
	} {
		b.Run(c.shape+"/"+c.dt.String(), func(b *testing.B) {
			s := benchContext(c.s)
			dev := openBenchDevice(b, runtime.F32)
			e, err := newEngine(context.Background(), dev, s, quantizeFast(fastWeights(s), c.dt), EngineOptions{CacheBytes: 256 << 20, MaxStepTokens: 1024, KVDType: benchKVDType(), MaxDrafts: 16})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			p := prompt(*benchPrompt+16, 1, s.Vocab)
			if !e.Reserve(1, len(p)) {
				b.Fatal("reserve")
			}
			if _, err := e.stepLogits(ctx, []SeqStep{{Seq: 1, Tokens: p[:*benchPrompt]}}); err != nil {
				b.Fatal(err)
			}
			seq, _ := newSequence(Sampling{IgnoreEOS: true}, nil, s.Vocab, nil, nil)
			for _, rows := range []int{1, 2, 3, 5, 9} {
				b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
					items := []SeqStep{{Seq: 1, State: seq, Tokens: p[*benchPrompt : *benchPrompt+rows], Pos: *benchPrompt, Sample: true}}
					drafts := []int{rows - 1}
					run := func() {
						e.mu.Lock()
						logits, _, err := e.stepLogitsLocked(ctx, items, drafts)
						e.mu.Unlock()
						if err != nil {
							b.Fatal(err)
						}
						for r := range rows {
							argmax32(logits[r*s.Vocab : (r+1)*s.Vocab])
						}
						e.logits.Put(&logits)
					}
					run() // the step's primitives
					b.ResetTimer()
					cpu := processCPU()
					for range b.N {
						run()
					}
					reportCPU(b, cpu, "step")
				})
			}
		})
	}
}
