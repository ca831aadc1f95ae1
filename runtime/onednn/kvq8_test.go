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

// q8Rows are rows of 32-value blocks made to reach the quantizer's edges,
// then random ones of several magnitudes.
func q8Rows(r *rand.Rand) []float32 {
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
	for _, scale := range []float64{1, 0.01, 40, 1e-4} {
		for range 6 {
			block(func(int) float32 { return float32(r.NormFloat64() * scale) })
		}
	}
	return x
}

// TestQuantQ8_0MatchesGGML: a Q8_0 cache's rows are quantized (kvq8.c,
// portable and AVX-512 forms) to the bits of ggml's own
// quantize_row_q8_0_ref (ggml_quantize_chunk), edges included; a block
// holding an infinity or NaN, where ggml's result is arbitrary, gets d =
// NaN and reads back as NaN.
func TestQuantQ8_0MatchesGGML(t *testing.T) {
	lib := ggmlref.Find(t)
	typ, _ := runtime.Q8_0.GGML()
	x := q8Rows(newRand(t))
	want, err := lib.Quantize(uint32(typ), x, 1, len(x))
	if err != nil {
		t.Fatal(err)
	}
	for _, vec := range []bool{false, true} {
		got := quantQ8_0(x, vec)
		for b := 0; b < len(x)/32; b++ {
			if g, w := got[34*b:34*b+34], want[34*b:34*b+34]; !bytes.Equal(g, w) {
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
			got := quantQ8_0(blk, vec)
			out := make([]float32, 32)
			if err := quant.Dequantize(typ, got, out); err != nil {
				t.Fatal(err)
			}
			for j, v := range out {
				if !math.IsNaN(float64(v)) {
					t.Fatalf("vector %v, a block holding %g: value %d reads back %g, want NaN", vec, bad, j, v)
				}
			}
		}
	}
}

// TestKVWriteQ8_0: OpKVWrite into a Q8_0 cache writes each row (f32 or
// bf16) as the quantizer above, the last of rows naming one slot winning,
// on one thread and on several (rows in runs of slots a thread), and
// leaves the other slots' bytes as they were.
func TestKVWriteQ8_0(t *testing.T) {
	for _, threads := range []int{1, 3} {
		d := openTest(t, runtime.DeviceSpec{Threads: threads})
		for _, dt := range floatTypes {
			for _, c := range []struct {
				rows, hkv, dim, slots int
			}{{9, 2, 32, 40}, {700, 2, 64, 1000}, {600, 1, 1024, 700}} {
				t.Run(fmt.Sprintf("threads=%d/%s/rows=%d/row=%d", threads, dt, c.rows, c.hkv*c.dim), func(t *testing.T) {
					needBF16(t, d, dt)
					r := newRand(t)
					ctx := t.Context()
					row := c.hkv * c.dim
					rb := row / 32 * 34
					x := randVec(r, c.rows*row)
					for i := range x {
						x[i] *= float32(1 + i/row%5*10) // rows of several magnitudes
					}
					before := quantQ8_0(randVec(r, c.slots*row), false)
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
							copy(want[int(s)*rb:], quantQ8_0(held[i*row:(i+1)*row], false))
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
					kc, err := d.Alloc(runtime.Q8_0, c.slots, 1, c.hkv, c.dim)
					if err != nil {
						t.Fatal(err)
					}
					defer d.Free(kc)
					if err := d.CopyInRaw(ctx, kc, 0, before); err != nil {
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

// TestPagedAttentionQ8_0: a Q8_0 cache (--kv-cache-dtype q8_0). Its rows
// widen to f32 exactly, so against the float64 reference on the cache as
// it reads back after the step, the output is as close as an f32 cache's,
// on every kernel: the group kernel and its parts over threads, the row
// kernel, attend_body (heads over 128 dims); Q in f32 and bf16. The step's
// rows land in the cache quantized (TestKVWriteQ8_0 holds the bits). With
// BF16Products, on a CPU with AVX512-BF16, the bf16 row and group kernels
// read each tile rounded to bf16: within the bf16 bound, and different
// from the f32 kernels' output, except where attend_body takes the work
// (f32Only). On a CPU with AMX, blocks of 16 or more query rows (the
// prefill chunks) take attend_amx.c, which reads the Q8_0 rows itself.
func TestPagedAttentionQ8_0(t *testing.T) {
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
	}
	typ, _ := runtime.Q8_0.GGML()
	dequant := func(b []byte) []float64 {
		v := make([]float32, len(b)/34*32)
		if err := quant.Dequantize(typ, b, v); err != nil {
			t.Fatal(err)
		}
		return to64(v)
	}
	for _, dt := range floatTypes {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/%s", dt, tc.name), func(t *testing.T) {
				needBF16(t, d, dt)
				p := newAttnProblem(newRand(t), tc.attnCase)
				y, kc, vc, err := attnRunKV(t, d, attnGraph(0), p, dt, runtime.Q8_0)
				if err != nil {
					t.Fatal(err)
				}
				row := p.hkv * p.d
				for name, c := range map[string][3][]float32{"kc": {kc, p.kc, p.k}, "vc": {vc, p.vc, p.v}} {
					want := dequant(quantQ8_0(c[1], false))
					for i, s := range p.slots {
						if s >= 0 {
							held := make([]float32, row)
							for j, v := range operands(c[2][i*row:(i+1)*row], dt) {
								held[j] = float32(v)
							}
							copy(want[int(s)*row:], dequant(quantQ8_0(held, false)))
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
				yb, kb, vb, err := attnRunKV(t, d, g, p, dt, runtime.Q8_0)
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
