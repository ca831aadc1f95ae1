package llm

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/quant"
)

// quantNet is tinyNet with rows of whole Q8_0 blocks (32): hidden 64,
// q 64 wide, intermediate 96.
func quantNet(arch string) netSpec {
	s := tinyNet(arch)
	s.Hidden, s.Inter, s.Heads, s.KVHeads, s.HeadDim = 64, 96, 4, 2, 16
	s.InvFreq = ropeFreqs(s.HeadDim, 10000, nil)
	return s
}

// toQ8_0 stores x (rows of whole blocks) as Q8_0 blocks the way ggml's
// reference quantizer does (d = amax/127, q = round(x/d)), the scale
// truncated to f16: any valid block will do, since the tests compare
// against the blocks' own dequantized values.
func toQ8_0(x []float32) []byte {
	out := make([]byte, 0, len(x)/32*34)
	for b := 0; b < len(x); b += 32 {
		amax := 0.0
		for _, v := range x[b : b+32] {
			amax = math.Max(amax, math.Abs(float64(v)))
		}
		d := amax / 127
		bits := math.Float32bits(float32(d))
		h := uint16(bits>>16) & 0x8000
		if e := int(bits>>23&0xff) - 127 + 15; e > 0 && e < 31 {
			h |= uint16(e)<<10 | uint16(bits&0x7fffff>>13)
		}
		out = append(out, byte(h), byte(h>>8))
		dh := float64(quant.F16ToF32(h))
		for _, v := range x[b : b+32] {
			q := 0.0
			if dh > 0 {
				q = math.Round(float64(v) / dh)
			}
			out = append(out, byte(int8(max(-127, min(127, q)))))
		}
	}
	return out
}

// quantCheckpoint is w with every matrix stored as Q8_0, and the same
// checkpoint holding those blocks' values as floats.
func quantCheckpoint(t *testing.T, w map[string]models.Tensor) (q, deq map[string]models.Tensor) {
	t.Helper()
	q, deq = map[string]models.Tensor{}, map[string]models.Tensor{}
	for name, x := range w {
		if len(x.Shape) != 2 || x.Shape[1]%32 != 0 {
			q[name], deq[name] = x, x
			continue
		}
		qt := models.Tensor{Shape: x.Shape, Stored: runtime.Q8_0, Raw: [][]byte{toQ8_0(x.Data)}}
		v, err := qt.Float32()
		if err != nil {
			t.Fatal(err)
		}
		q[name], deq[name] = qt, models.Tensor{Shape: x.Shape, Data: v}
	}
	return q, deq
}

// TestQuantizedEngine: a checkpoint whose matrices are Q8_0 runs on the
// oneDNN CPU device with the blocks held as stored (qgemm.c: its logits
// within int8 activations' rounding of a float64 forward pass over the
// blocks' values, in f32 and in bf16 compute), and on a device that
// cannot hold them (the Go device, standing in for PJRT) dequantized at
// upload, where they match that forward pass as a float checkpoint does.
// The device holds the stored bytes: its memory is WeightBytes plus the
// cache, and WeightBytesOn counts the dequantized copy where it is one.
func TestQuantizedEngine(t *testing.T) {
	devices := []struct {
		name string
		open func(t *testing.T) runtime.Device
		raw  bool
		tol  float64
	}{
		{"go", func(*testing.T) runtime.Device { return &goDevice{} }, false, 1e-4},
		// The CPU holds the cache in bf16 for block-quantized weights
		// (kvCacheDType): 0.017 at worst here, against 0.013 with an f32
		// cache (2 Zen 4 cores), so a bound of bf16 products.
		{"onednn", func(t *testing.T) runtime.Device { return openCPU(t, runtime.F32) }, true, 3e-2},
		{"onednn-bf16", func(t *testing.T) runtime.Device { return openCPU(t, runtime.BF16) }, true, 4e-2},
	}
	for _, arch := range []string{"llama", "qwen2", "qwen3"} {
		for _, d := range devices {
			t.Run(arch+"/"+d.name, func(t *testing.T) {
				s := quantNet(arch)
				qw, deq := quantCheckpoint(t, randomCheckpoint(s, 11))
				ew, err := engineWeights(s, qw)
				if err != nil {
					t.Fatal(err)
				}
				if !ew[lw(0, lGateUp)].Quantized() || len(ew[lw(0, lGateUp)].Raw) != 2 {
					t.Fatalf("gate_up is not the two stored pieces: %+v", ew[lw(0, lGateUp)].Stored)
				}
				dev := d.open(t)
				e, err := newEngine(context.Background(), dev, s, ew, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				m := &Model{spec: s, weights: ew}
				if got := e.resident[lw(1, lDown)].DType(); (got == runtime.Q8_0) != d.raw {
					t.Fatalf("down_proj held as %v on %s", got, d.name)
				}
				if d.raw {
					var bytes uint64
					seen := map[runtime.Buffer]bool{}
					for n, b := range e.resident {
						if !seen[b] && n != lw(0, lKCache) && n != lw(0, lVCache) && n != lw(1, lKCache) && n != lw(1, lVCache) {
							bytes += uint64(b.Bytes())
						}
						seen[b] = true
					}
					if want := m.WeightBytes(e.mmDT); int64(bytes) != want {
						t.Errorf("weights hold %d bytes on the device, WeightBytes says %d", bytes, want)
					}
					if m.WeightBytesOn(&goDevice{}, e.mmDT) <= m.WeightBytes(e.mmDT) {
						t.Error("WeightBytesOn a device without block types does not count the dequantized copy")
					}
				}
				// Chunks of 5 rows (qgemm.c), and a 70-row prefill, which
				// on a CPU with AMX runs qamx.c, gate_up with its SwiGLU.
				for _, j := range []*job{{seq: 1, prompt: prompt(13, 3, s.Vocab), gen: 8, chunk: 5},
					{seq: 2, prompt: prompt(70, 4, s.Vocab), gen: 2, chunk: 70}} {
					simulate(t, e, []*job{j})
					full := append(slices.Clone(j.prompt), j.out...)
					ref := refForward(s, deq, full[:len(full)-1])
					worst := 0.0
					for i, got := range j.logits {
						worst = math.Max(worst, logitError(got, ref[len(j.prompt)-1+i]))
					}
					t.Logf("%d-token prompt in chunks of %d: worst logit error %.2g of the largest logit over %d positions",
						len(j.prompt), j.chunk, worst, len(j.logits))
					if worst > d.tol {
						t.Errorf("%d-token prompt: worst relative logit error %g > %g", len(j.prompt), worst, d.tol)
					}
				}
			})
		}
	}
}

// TestKVCacheDType: an engine holds its cache in bf16 where the device
// keeps the matrices block-quantized (oneDNN) or computes in bf16, in f32
// for a float checkpoint in f32 or a device that dequantizes them (the Go
// device, standing in for PJRT), and as EngineOptions.KVDType says when set;
// the step's attention allows bf16 products for quantized weights and bf16
// compute; CacheBlockBytes
// counts what the engine allocates, so a cache of the same bytes holds
// twice the blocks in bf16. Greedy decoding with a bf16 cache stays within
// the quantized engine's bound of the float64 forward pass (TestQuantizedEngine
// runs with it).
func TestKVCacheDType(t *testing.T) {
	s := quantNet("qwen2")
	qw, _ := quantCheckpoint(t, randomCheckpoint(s, 3))
	quantized, err := engineWeights(s, qw)
	if err != nil {
		t.Fatal(err)
	}
	float, err := engineWeights(s, randomCheckpoint(s, 3))
	if err != nil {
		t.Fatal(err)
	}
	cpu := openCPU(t, runtime.F32)
	type kvCase struct {
		name    string
		dev     runtime.Device
		weights map[string]models.Tensor
		opt     runtime.DType
		want    runtime.DType
		bf16p   bool // the attention may round its products to bf16
	}
	var bf16Cases []kvCase // where the CPU computes in bf16
	if cpu16, err := openCPUMaybe(runtime.BF16); err == nil {
		t.Cleanup(func() { cpu16.Close() })
		bf16Cases = []kvCase{
			{"float computed in bf16", cpu16, float, 0, runtime.BF16, true},
			{"float computed in bf16, f32 asked", cpu16, float, runtime.F32, runtime.F32, true},
		}
	}
	for _, c := range append([]kvCase{
		{"quantized on the CPU", cpu, quantized, 0, runtime.BF16, true},
		{"quantized on the CPU, f32 asked", cpu, quantized, runtime.F32, runtime.F32, true},
		{"float on the CPU", cpu, float, 0, runtime.F32, false},
		{"float on the CPU, bf16 asked", cpu, float, runtime.BF16, runtime.BF16, false},
		{"quantized, dequantized at upload", &goDevice{}, quantized, 0, runtime.F32, false},
	}, bf16Cases...) {
		t.Run(c.name, func(t *testing.T) {
			const cacheBytes = 1 << 20
			e, err := newEngine(context.Background(), c.dev, s, c.weights, EngineOptions{CacheBytes: cacheBytes, BlockSize: 4, KVDType: c.opt})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if got := e.resident[lw(0, lKCache)].DType(); got != c.want {
				t.Fatalf("cache of %v, want %v", got, c.want)
			}
			n := 0
			for _, op := range stepGraph(e.spec, e.mmDT, e.opts.KVDType, e.quant, stepShape{T: 1, S: 1, R: 1}).Ops {
				if op.Kind == runtime.OpPagedAttention {
					n++
					if op.BF16Products != c.bf16p {
						t.Errorf("attention's BF16Products %v, want %v", op.BF16Products, c.bf16p)
					}
				}
			}
			if n != s.Layers {
				t.Errorf("%d attention ops, want %d", n, s.Layers)
			}
			m := &Model{spec: s, weights: c.weights}
			perBlock := m.CacheBlockBytes(c.dev, c.opt, 4)
			if _, total := e.CacheBlocks(); int64(total) != cacheBytes/perBlock {
				t.Errorf("%d blocks, CacheBlockBytes gives %d of %d bytes", total, cacheBytes/perBlock, perBlock)
			}
			j := &job{seq: 1, prompt: prompt(9, 1, s.Vocab), gen: 6, chunk: 4}
			simulate(t, e, []*job{j})
			if len(j.out) != 6 {
				t.Fatalf("%d tokens", len(j.out))
			}
		})
	}
	if _, err := newEngine(context.Background(), cpu, s, quantized, EngineOptions{CacheBytes: 1 << 20, KVDType: runtime.I32}); !errors.Is(err, runtime.ErrUnsupported) {
		t.Errorf("an I32 cache: %v", err)
	}
}

// TestKVCacheQuantized: asked for a q8_0, q4_0 or f16 cache
// (--kv-cache-dtype), an engine on the CPU holds ggml's Q8_0 or Q4_0
// blocks along each head, 34 or 18 bytes a 32 values, or f16 values, so
// CacheBlockBytes is 17/32, 9/32 or all of a bf16 cache's and a cache of
// the same bytes holds that many blocks; its logits, for quantized and
// float weights, stay near the float64 forward pass (q8_0 and f16 with
// quantized weights: within the bound TestQuantizedEngine holds the bf16
// cache to; q4_0's 16 levels a block cost more). A device that holds none
// of these types (the Go device, standing in for PJRT) refuses each, heads
// not divisible by 32 the block types, and CheckKVDType says so first.
func TestKVCacheQuantized(t *testing.T) {
	for _, c := range []struct {
		kt         runtime.DType
		num        int64   // CacheBlockBytes over bf16's, in 32nds
		qtol, ftol float64 // logit bounds with quantized and float weights; at worst here (2 Zen 4 cores) 0.016 and 0.0032 (q8_0), 0.046 and 0.035 (q4_0), 0.017 and 8.9e-05 (f16, whose float bound a bf16 cache would not meet)
	}{{runtime.Q8_0, 17, 3e-2, 1e-2}, {runtime.Q4_0, 9, 8e-2, 8e-2}, {runtime.F16, 32, 3e-2, 1e-3}} {
		t.Run(c.kt.String(), func(t *testing.T) { testKVCacheQuantized(t, c.kt, c.num, c.qtol, c.ftol) })
	}
}

func testKVCacheQuantized(t *testing.T, kt runtime.DType, num int64, qtol, ftol float64) {
	s := quantNet("qwen2")
	s.HeadDim = 32
	s.InvFreq = ropeFreqs(s.HeadDim, 10000, nil)
	ck := randomCheckpoint(s, 5)
	qw, deq := quantCheckpoint(t, ck)
	cpu := openCPU(t, runtime.F32)
	for _, c := range []struct {
		name      string
		ckpt, ref map[string]models.Tensor
		tol       float64
	}{{"quantized", qw, deq, qtol}, {"float", ck, ck, ftol}} {
		t.Run(c.name, func(t *testing.T) {
			ew, err := engineWeights(s, c.ckpt)
			if err != nil {
				t.Fatal(err)
			}
			m := &Model{spec: s, weights: ew}
			if err := m.CheckKVDType(cpu, kt); err != nil {
				t.Fatal(err)
			}
			const cacheBytes = 1 << 20
			e, err := newEngine(context.Background(), cpu, s, ew, EngineOptions{CacheBytes: cacheBytes, BlockSize: 4, KVDType: kt})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if got := e.resident[lw(1, lVCache)].DType(); got != kt {
				t.Fatalf("cache of %v", got)
			}
			perBlock := m.CacheBlockBytes(cpu, kt, 4)
			if bf := m.CacheBlockBytes(cpu, runtime.BF16, 4); perBlock*32 != bf*num {
				t.Errorf("a %s block is %d bytes, a bf16 one %d: want %d/32 of it", kt, perBlock, bf, num)
			}
			if _, total := e.CacheBlocks(); int64(total) != cacheBytes/perBlock {
				t.Errorf("%d blocks, CacheBlockBytes gives %d of %d bytes", total, cacheBytes/perBlock, perBlock)
			}
			for _, j := range []*job{{seq: 1, prompt: prompt(13, 3, s.Vocab), gen: 8, chunk: 5},
				{seq: 2, prompt: prompt(70, 4, s.Vocab), gen: 2, chunk: 70}} {
				simulate(t, e, []*job{j})
				full := append(slices.Clone(j.prompt), j.out...)
				ref := refForward(s, c.ref, full[:len(full)-1])
				worst := 0.0
				for i, got := range j.logits {
					worst = math.Max(worst, logitError(got, ref[len(j.prompt)-1+i]))
				}
				t.Logf("%d-token prompt in chunks of %d: worst logit error %.2g of the largest logit", len(j.prompt), j.chunk, worst)
				if worst > c.tol {
					t.Errorf("%d-token prompt: worst relative logit error %g > %g", len(j.prompt), worst, c.tol)
				}
			}
		})
	}
	ew, err := engineWeights(s, qw)
	if err != nil {
		t.Fatal(err)
	}
	narrow := quantNet("qwen2") // heads of 16
	nw, err := engineWeights(narrow, randomCheckpoint(narrow, 5))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		dev  runtime.Device
		spec netSpec
		w    map[string]models.Tensor
	}{{"go device", &goDevice{}, s, ew}, {"heads of 16", cpu, narrow, nw}} {
		if kt == runtime.F16 && c.dev == cpu {
			continue // f16 rows need no blocks
		}
		m := &Model{spec: c.spec, weights: c.w}
		if err := m.CheckKVDType(c.dev, kt); !errors.Is(err, runtime.ErrUnsupported) {
			t.Errorf("%s: CheckKVDType: %v", c.name, err)
		}
		if _, err := newEngine(context.Background(), c.dev, c.spec, c.w, EngineOptions{CacheBytes: 1 << 20, KVDType: kt}); !errors.Is(err, runtime.ErrUnsupported) {
			t.Errorf("%s: an engine with a %s cache: %v", c.name, kt, err)
		}
	}
}
