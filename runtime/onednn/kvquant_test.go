package onednn

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
	"github.com/brokerd/brokerd/runtime/quant/ggmlref"
)

// kvTypes are the types a KV cache is converted into as it is written.
var kvTypes = []runtime.DType{runtime.Q8_0, runtime.Q4_0, runtime.F16}

// kvGGML is ggml's type of a kvTypes entry.
func kvGGML(kt runtime.DType) quant.Type {
	if kt == runtime.F16 {
		return quant.F16
	}
	q, _ := kt.GGML()
	return q
}

// kvRows are rows of 32-value blocks made to reach the quantizers' edges,
// then random ones of several magnitudes.
func kvRows(r *rand.Rand) []float32 {
	var x []float32
	block := func(f func(j int) float32) {
		for j := range 32 {
			x = append(x, f(j))
		}
	}
	// amax 127, so d = 1 and x·(1/d) is x: halves are ties, which ggml's
	// roundf rounds away from zero (not to even).
	block(func(j int) float32 {
		if j == 0 {
			return 127
		}
		return float32(j%8) - 3.5 + float32(j/8)*0.25
	})
	block(func(j int) float32 { return -float32(j) - 0.5 })
	block(func(int) float32 { return 0 })
	block(func(j int) float32 { return float32(j-16) * 1e-42 })                       // d subnormal in f32, 0 in f16, 1/d infinite
	block(func(j int) float32 { return float32(j-16) * 3e-6 })                        // d subnormal in f16
	block(func(j int) float32 { return float32(j+1) * 1e6 })                          // d past f16's largest
	block(func(j int) float32 { return float32(math.Copysign(1, float64(j%2)-0.5)) }) // ±1
	// Q4_0: max -8, so d = 1 and x/d + 8.5 lands on whole numbers and
	// halves, where the truncation decides; max +8 (d = -1), whose -8 gives
	// 16.5, clamped to 15; the largest magnitude twice with opposite signs
	// (the first one is max); Q8_0 meets them too.
	block(func(j int) float32 { return float32(j)*0.5 - 8 })
	block(func(j int) float32 { return 8 - float32(j)*0.5 })
	block(func(j int) float32 { return []float32{0.25, 3, -3, 1.125}[j%4] })
	block(func(j int) float32 { return []float32{-3, 0.75, 3, -1.5}[j%4] })
	for _, scale := range []float64{1, 0.01, 40, 1e-4} {
		for range 6 {
			block(func(int) float32 { return float32(r.NormFloat64() * scale) })
		}
	}
	return x
}

// TestQuantKVMatchesGGML: a Q8_0, Q4_0 or f16 cache's rows are quantized
// or converted (kvquant.c, portable and AVX-512 forms) to the bits of
// ggml's own quantize_row_q8_0_ref, quantize_row_q4_0_ref and
// fp32-to-fp16 conversion (ggml_quantize_chunk), edges included (f16: past
// its largest, subnormal, under its smallest); a block holding an infinity
// or NaN, where ggml's result is arbitrary, gets d = NaN and reads back as
// NaN (f16 keeps each value as it is).
func TestQuantKVMatchesGGML(t *testing.T) {
	for _, kt := range kvTypes {
		t.Run(kt.String(), func(t *testing.T) { testQuantKV(t, kt) })
	}
}

func testQuantKV(t *testing.T, kt runtime.DType) {
	lib := ggmlref.Find(t)
	typ := kvGGML(kt)
	bb := int(kt.Bytes(32))
	x := kvRows(newRand(t))
	want, err := lib.Quantize(uint32(typ), x, 1, len(x))
	if err != nil {
		t.Fatal(err)
	}
	for _, vec := range []bool{false, true} {
		got := quantKV(kt, x, vec)
		for b := 0; b < len(x)/32; b++ {
			if g, w := got[bb*b:bb*b+bb], want[bb*b:bb*b+bb]; !bytes.Equal(g, w) {
				t.Errorf("vector %v: block %d (%v…): % x, ggml % x", vec, b, x[32*b:32*b+4], g, w)
			}
		}
	}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		blk := make([]float32, 32)
		for j := range blk {
			blk[j] = float32(j)
		}
		blk[7] = bad
		for _, vec := range []bool{false, true} {
			got := quantKV(kt, blk, vec)
			out := make([]float32, 32)
			if err := quant.Dequantize(typ, got, out); err != nil {
				t.Fatal(err)
			}
			if kt == runtime.F16 {
				if g := out[7]; math.IsNaN(float64(bad)) != math.IsNaN(float64(g)) || !math.IsNaN(float64(bad)) && g != bad || out[6] != 6 {
					t.Fatalf("vector %v, f16 of a row holding %g: %g there, %g beside it", vec, bad, g, out[6])
				}
				continue
			}
			for j, v := range out {
				if !math.IsNaN(float64(v)) {
					t.Fatalf("vector %v, a block holding %g: value %d reads back %g, want NaN", vec, bad, j, v)
				}
			}
		}
	}
}

// TestKVWriteQuantized: OpKVWrite into a Q8_0, Q4_0 or f16 cache writes each
// row (f32 or bf16) as the quantizer above, the last of rows naming one
// slot winning, on one thread and on several (rows in runs of slots a
// thread), and leaves the other slots' bytes as they were.
func TestKVWriteQuantized(t *testing.T) {
	for _, threads := range []int{1, 3} {
		d := openTest(t, runtime.DeviceSpec{Threads: threads})
		for _, tc := range []struct{ dt, kt runtime.DType }{
			{runtime.F32, runtime.Q8_0}, {runtime.BF16, runtime.Q8_0}, {runtime.F32, runtime.Q4_0}, {runtime.BF16, runtime.Q4_0},
			{runtime.F32, runtime.F16}, {runtime.BF16, runtime.F16},
		} {
			dt, kt := tc.dt, tc.kt
			for _, c := range []struct {
				rows, hkv, dim, slots int
			}{{9, 2, 32, 40}, {700, 2, 64, 1000}, {600, 1, 1024, 700}} {
				t.Run(fmt.Sprintf("threads=%d/%s-to-%s/rows=%d/row=%d", threads, dt, kt, c.rows, c.hkv*c.dim), func(t *testing.T) {
					needBF16(t, d, dt)
					r := newRand(t)
					ctx := t.Context()
					row := c.hkv * c.dim
					rb := int(kt.Bytes(int64(row)))
					x := randVec(r, c.rows*row)
					for i := range x {
						x[i] *= float32(1 + i/row%5*10) // rows of several magnitudes
					}
					beforeVals := randVec(r, c.slots*row)
					before := quantKV(kt, beforeVals, false)
					slots := make([]int32, c.rows)
					for i := range slots {
						slots[i] = int32(r.IntN(c.slots))
					}
					slots[0], slots[c.rows/2], slots[c.rows-1] = -1, slots[1], slots[1]
					held := make([]float32, len(x)) // x as the device holds it
					for i, v := range operands(x, dt) {
						held[i] = float32(v)
					}
					want := slices.Clone(before)
					for i, s := range slots {
						if s >= 0 {
							copy(want[int(s)*rb:], quantKV(kt, held[i*row:(i+1)*row], false))
						}
					}
					xb, err := d.Alloc(dt, c.rows, c.hkv, c.dim)
					if err != nil {
						t.Fatal(err)
					}
					defer d.Free(xb)
					if err := d.CopyIn(ctx, xb, x); err != nil {
						t.Fatal(err)
					}
					kc, err := d.Alloc(kt, c.slots, 1, c.hkv, c.dim)
					if err != nil {
						t.Fatal(err)
					}
					defer d.Free(kc)
					if kt == runtime.F16 { // CopyIn converts as the write does
						err = d.CopyIn(ctx, kc, beforeVals)
					} else {
						err = d.CopyInRaw(ctx, kc, 0, before)
					}
					if err != nil {
						t.Fatal(err)
					}
					sb, err := d.Alloc(runtime.I32, c.rows)
					if err != nil {
						t.Fatal(err)
					}
					defer d.Free(sb)
					if err := d.CopyInInt32(ctx, sb, slots); err != nil {
						t.Fatal(err)
					}
					g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpKVWrite, In: []string{"x", "slots"}, Out: "kc"}}}
					if err := d.Run(ctx, g, map[string]runtime.Buffer{"x": xb, "slots": sb, "kc": kc}); err != nil {
						t.Fatal(err)
					}
					got := unsafe.Slice((*byte)(kc.(*buffer).ptr), len(before))
					for s := range c.slots {
						if g, w := got[s*rb:(s+1)*rb], want[s*rb:(s+1)*rb]; !bytes.Equal(g, w) {
							t.Fatalf("slot %d: % x…, want % x…", s, g[:8], w[:8])
						}
					}
				})
			}
		}
	}
}

// TestPagedAttentionQuantizedCache: a Q8_0, Q4_0 or f16 cache
// (--kv-cache-dtype q8_0, q4_0, f16). Its rows
// widen to f32 exactly, so against the float64 reference on the cache as
// it reads back after the step, the output is as close as an f32 cache's,
// on every kernel: the group kernel and its parts over threads, the row
// kernel, attend_body (heads over 128 dims); Q in f32 and bf16. The step's
// rows land in the cache quantized (TestKVWriteQuantized holds the bits). With
// BF16Products, on a CPU with AVX512-BF16, the bf16 row and group kernels
// read each tile rounded to bf16: within the bf16 bound, and different
// from the f32 kernels' output, except where attend_body takes the work
// (f32Only). On a CPU with AMX, blocks of 16 or more query rows (the
// prefill chunks) take attend_amx.c, which reads the block rows itself.
func TestPagedAttentionQuantizedCache(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	tests := []struct {
		name string
		attnCase
		f32Only bool
	}{
		{"prefill chunk and decodes gqa7", attnCase{hq: 14, hkv: 2, d: 64, bs: 16, ctx: []int{0, 70, 15, 33}, add: []int{20, 1, 5, 1}, pad: 3}, false},
		{"decodes gqa4 d128 bs5", attnCase{hq: 8, hkv: 2, d: 128, bs: 5, ctx: []int{33, 64}, add: []int{1, 1}}, false},
		{"decode long context gqa7", attnCase{hq: 14, hkv: 2, d: 64, bs: 16, ctx: []int{1300}, add: []int{1}}, false},
		{"long prefill gqa4", attnCase{hq: 8, hkv: 2, d: 64, bs: 16, ctx: []int{0, 37}, add: []int{150, 41}}, false},
		{"prefill group 24 d32", attnCase{hq: 24, hkv: 1, d: 32, bs: 16, ctx: []int{20}, add: []int{5}}, false},
		{"mha d32 bs3", attnCase{hq: 3, hkv: 3, d: 32, bs: 3, ctx: []int{0, 4}, add: []int{50, 1}}, false},
		{"decodes d256 group 2", attnCase{hq: 4, hkv: 2, d: 256, bs: 16, ctx: []int{40, 7}, add: []int{1, 1}}, true},
		// f16 alone: heads of 40 (no blocks; attend_body, and the write's
		// scalar tail) and of 48 (the f32 kernels, 16 at a time).
		{"f16 chunk and decode d40", attnCase{hq: 3, hkv: 1, d: 40, bs: 16, ctx: []int{0, 20}, add: []int{20, 1}}, true},
		{"f16 chunk and decode d48", attnCase{hq: 6, hkv: 2, d: 48, bs: 16, ctx: []int{0, 30}, add: []int{24, 1}}, true},
	}
	for _, kt := range kvTypes {
		typ := kvGGML(kt)
		dequant := func(b []byte) []float64 {
			v := make([]float32, len(b)/int(kt.Bytes(32))*32)
			if kt == runtime.F16 {
				v = make([]float32, len(b)/2)
			}
			if err := quant.Dequantize(typ, b, v); err != nil {
				t.Fatal(err)
			}
			return to64(v)
		}
		for _, dt := range floatTypes {
			for _, tc := range tests {
				if tc.d%32 != 0 && kt != runtime.F16 {
					continue // the block types need heads of whole blocks
				}
				t.Run(fmt.Sprintf("%s/%s/%s", kt, dt, tc.name), func(t *testing.T) {
					needBF16(t, d, dt)
					p := newAttnProblem(newRand(t), tc.attnCase)
					y, kc, vc, err := attnRunKV(t, d, attnGraph(0), p, dt, kt)
					if err != nil {
						t.Fatal(err)
					}
					row := p.hkv * p.d
					for name, c := range map[string][3][]float32{"kc": {kc, p.kc, p.k}, "vc": {vc, p.vc, p.v}} {
						want := dequant(quantKV(kt, c[1], false))
						for i, s := range p.slots {
							if s >= 0 {
								held := make([]float32, row)
								for j, v := range operands(c[2][i*row:(i+1)*row], dt) {
									held[j] = float32(v)
								}
								copy(want[int(s)*row:], dequant(quantKV(kt, held, false)))
							}
						}
						for i, got := range c[0] {
							if float64(got) != want[i] {
								t.Fatalf("%s[%d] = %g, want %g", name, i, got, want[i])
							}
						}
					}
					scale := 1 / math.Sqrt(float64(p.d))
					checkClose(t, y, refPagedAttention(operands(p.q, dt), to64(kc), to64(vc), p.paged, scale), tolFor(dt))
					g := attnGraph(0)
					g.Ops[2].BF16Products = true
					yb, kb, vb, err := attnRunKV(t, d, g, p, dt, kt)
					if err != nil {
						t.Fatal(err)
					}
					checkClose(t, yb, refPagedAttention(operands(p.q, dt), to64(kb), to64(vb), p.paged, scale), tolBF16)
					bf16 := avx512BF16() && !tc.f32Only
					if same := slices.Equal(y, yb); same == bf16 {
						t.Errorf("BF16Products left the output as it was: %v; want %v (AVX512-BF16 here: %v)", same, !bf16, avx512BF16())
					}
				})
			}
		}
	}
}

// TestKVQLd16: the AMX attention's loader (bd_kvq_ld16) widens 16 values
// of an f16, Q8_0 or Q4_0 row, from either half of a block, to the
// decoders' values exactly; it runs on any CPU with AVX-512, so the tests hold it
// where no AMX kernel would run it.
func TestKVQLd16(t *testing.T) {
	x := kvRows(newRand(t))[:8*32]
	for _, kt := range kvTypes {
		typ := kvGGML(kt)
		b := quantKV(kt, x, false)
		want := make([]float32, len(x))
		if err := quant.Dequantize(typ, b, want); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ off, n int }{{0, len(x)}, {16, 32}, {48, 112}, {240, 16}} {
			got, ok := kvqLd16Row(kt, b, c.off, c.n)
			if !ok {
				t.Skip("no AVX-512 here")
			}
			for i, v := range got {
				if w := want[c.off+i]; math.Float32bits(v) != math.Float32bits(w) {
					t.Fatalf("%s from %d: value %d is %g, want %g", kt, c.off, c.off+i, v, w)
				}
			}
		}
	}
}
