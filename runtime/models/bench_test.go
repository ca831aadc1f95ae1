package models

import (
	"errors"
	"fmt"
	"math/rand/v2"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
)

// benchConfig is issue 4's benchmark BERT: 4 layers, hidden 256, 4 heads,
// intermediate 1024, BERT's vocabulary size.
func benchConfig() BERTConfig {
	return BERTConfig{
		VocabSize: 30522, HiddenSize: 256, NumHiddenLayers: 4, NumAttentionHeads: 4, IntermediateSize: 1024,
		HiddenAct: "gelu", MaxPositionEmbeddings: 512, TypeVocabSize: 2, LayerNormEps: 1e-12,
	}
}

// forwardFLOPs counts the matmul FLOPs of an encoder forward pass over b
// sequences of s tokens: per layer the QKV, attention-output and FFN
// matmuls, 2·tokens·(4H² + 2H·I), and the attention's QKᵀ and P·V,
// 4·b·s²·H.
func forwardFLOPs(cfg BERTConfig, b, s int) float64 {
	h, in := float64(cfg.HiddenSize), float64(cfg.IntermediateSize)
	tokens := float64(b * s)
	perLayer := 2*tokens*(4*h*h+2*h*in) + 4*float64(b)*float64(s)*float64(s)*h
	return float64(cfg.NumHiddenLayers) * perLayer
}

// matmulPeak is the adapter's matmul rate on dev for inputs of type dt (f32
// or bf16, accumulating into f32): a 1024³ OpMatMul through Run, after a
// warm-up run, in GFLOP/s; the best of several rounds, since a peak is what
// the machine can do when nothing else competes for its cores.
func matmulPeak(b *testing.B, dev runtime.Device, dt runtime.DType) float64 {
	b.Helper()
	const n, rounds, iters = 1024, 5, 4
	r := rand.New(rand.NewPCG(1, 2))
	bind := map[string]runtime.Buffer{}
	defer func() {
		for _, buf := range bind {
			dev.Free(buf)
		}
	}()
	for _, name := range []string{"a", "w", "y"} {
		t := dt
		if name == "y" {
			t = runtime.F32
		}
		buf, err := dev.Alloc(t, n, n)
		if err != nil {
			b.Fatal(err)
		}
		bind[name] = buf
		if name != "y" {
			if err := dev.CopyIn(b.Context(), buf, randTensor(r, 1, n, n).Data); err != nil {
				b.Fatal(err)
			}
		}
	}
	g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"a", "w"}, Out: "y"}}}
	if err := dev.Run(b.Context(), g, bind); err != nil {
		b.Fatal(err)
	}
	best := 0.0
	for range rounds {
		start := time.Now()
		for range iters {
			if err := dev.Run(b.Context(), g, bind); err != nil {
				b.Fatal(err)
			}
		}
		best = max(best, 2*n*n*n*iters/time.Since(start).Seconds()/1e9)
	}
	return best
}

// BenchmarkBERT: items/s of the benchmark BERT at batch 1, 8 and 32 for
// 16- and 128-token sequences, computing in f32 and (on CPUs that have it)
// bf16; the forward pass's achieved GFLOP/s over the adapter's measured
// 1024³ matmul rate in the same dtype and run (peak-ratio); and for bf16 its
// items/s over f32's for the same case in the same run (over-f32).
func BenchmarkBERT(b *testing.B) {
	cfg := benchConfig()
	r := rand.New(rand.NewPCG(30, 30))
	m, err := NewBERT(cfg, randomBERT(r, cfg, 0), nil, BERTOptions{Name: "bench", Pooling: PoolingMean})
	if err != nil {
		b.Fatal(err)
	}
	f32Rate := map[string]float64{} // case → f32 items/s
	for _, dt := range []runtime.DType{runtime.F32, runtime.BF16} {
		dev, err := onednn.New(onednn.Options{}).Open(b.Context(), runtime.DeviceSpec{Threads: goruntime.NumCPU(), DType: dt})
		if err != nil {
			if dt == runtime.BF16 && errors.Is(err, runtime.ErrUnsupported) {
				b.Logf("bf16 skipped: %v", err)
				continue
			}
			b.Fatal(err)
		}
		benchBERTOn(b, m, cfg, dev, dt, r, f32Rate)
		dev.Close()
	}
}

func benchBERTOn(b *testing.B, m Model, cfg BERTConfig, dev runtime.Device, dt runtime.DType, r *rand.Rand, f32Rate map[string]float64) {
	peak := matmulPeak(b, dev, dt)
	b.Logf("adapter %s matmul 1024³ (best round): %.1f GFLOP/s on %d threads", dt, peak, goruntime.NumCPU())
	rep, err := m.NewReplica(b.Context(), dev, 32)
	if err != nil {
		b.Fatal(err)
	}
	defer rep.Close()
	for _, seq := range []int{16, 128} {
		for _, batch := range []int{1, 8, 32} {
			name := fmt.Sprintf("seq=%d/batch=%d", seq, batch)
			b.Run(fmt.Sprintf("%s/%s", dt, name), func(b *testing.B) {
				items := make([]any, batch)
				for i := range items {
					items[i] = randomItem(r, cfg.VocabSize, seq, false, true)
				}
				// Warm-up: creates this shape's primitives.
				if _, err := rep.Execute(b.Context(), items); err != nil {
					b.Fatal(err)
				}
				fastest := time.Duration(1<<63 - 1)
				for b.Loop() {
					start := time.Now()
					if _, err := rep.Execute(b.Context(), items); err != nil {
						b.Fatal(err)
					}
					fastest = min(fastest, time.Since(start))
				}
				secs := b.Elapsed().Seconds() / float64(b.N)
				gflops := forwardFLOPs(cfg, batch, seq) / secs / 1e9
				rate := float64(batch) / secs
				b.ReportMetric(rate, "items/s")
				b.ReportMetric(gflops, "GFLOP/s")
				b.ReportMetric(gflops/peak, "peak-ratio")
				// The fastest iteration against the best matmul round: the
				// ratio without other processes' share of a small machine.
				b.ReportMetric(forwardFLOPs(cfg, batch, seq)/fastest.Seconds()/1e9/peak, "best-peak-ratio")
				if dt == runtime.F32 {
					f32Rate[name] = rate
				} else if f := f32Rate[name]; f > 0 {
					b.ReportMetric(rate/f, "over-f32")
				}
			})
		}
	}
}
