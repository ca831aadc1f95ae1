package onednn

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/brokerd/brokerd/runtime/quant"
)

func needAMX(t testing.TB) {
	t.Helper()
	if !qamxAvailable() {
		t.Skip("this CPU or kernel gives the process no AMX-BF16 tiles")
	}
}

// qamxGamma bounds qamx's relative error against Σ|w·x|: the bf16 rounding
// of each dequantized weight and of each activation (bf16 keeps 8
// significant bits: 2^-8 each, so 2^-7 and a second-order term for their
// product), the decoders' f32 arithmetic, and the f32 sums of the tile
// unit and the panel's k/32 strips.
func qamxGamma(k int) float64 { return 0x1p-7 + 0x1p-15 + float64(k/16+16)*0x1p-23 }

// TestQamxMatchesFloat64: every weight type, k of one to several blocks,
// m across the 16-row tiles and the 64-row passes (1, 5, 16, 17, 67, 130),
// 37 weight rows (a partial panel), 1 to 3 threads: Y within qamxGamma of
// the float64 product of quant.Dequantize's weights and the activations.
func TestQamxMatchesFloat64(t *testing.T) {
	needAMX(t)
	for _, typ := range qgemmTypes {
		in, _ := typ.Info()
		ks := []int{32, 288, 1024}
		if in.BlockElems == quant.QK_K {
			ks = []int{256, 768}
		}
		if !qamxSupports(typ) {
			t.Fatalf("%v: qamx has no decoder", typ)
		}
		worst := 0.0
		for _, k := range ks {
			rng := rand.New(rand.NewPCG(uint64(typ)+100, uint64(k)))
			const n = 37
			w := randQuantWeights(rng, typ, n, k)
			wf := make([]float32, n*k)
			if err := quant.Dequantize(typ, w, wf); err != nil {
				t.Fatal(err)
			}
			for _, m := range []int{1, 5, 16, 17, 67, 130} {
				x := randActs(rng, m, k)
				for _, threads := range []int{1, 2, 3} {
					y := make([]float32, m*n)
					if err := qamxSlices(typ, w, n, k, x, m, y, n, threads); err != nil {
						t.Fatalf("%v k=%d m=%d: %v", typ, k, m, err)
					}
					for i := range m {
						for j := range n {
							var f, mag float64
							for l := range k {
								p := float64(wf[j*k+l]) * float64(x[i*k+l])
								f += p
								mag += math.Abs(p)
							}
							tol := qamxGamma(k)*mag + 1e-30
							if d := math.Abs(float64(y[i*n+j]) - f); !(d <= tol) {
								t.Fatalf("%v k=%d m=%d threads=%d: y[%d][%d] = %g, want %g (off %g, bound %g)",
									typ, k, m, threads, i, j, y[i*n+j], f, d, tol)
							} else if tol > 0 {
								worst = max(worst, d/tol)
							}
						}
					}
				}
			}
		}
		t.Logf("%v: worst output used %.3g of the bound", typ, worst)
	}
}

// TestQamxStride: rows of y past n_out are left as they were.
func TestQamxStride(t *testing.T) {
	needAMX(t)
	const n, k, m, ldy = 40, 512, 19, 45
	rng := rand.New(rand.NewPCG(9, 9))
	w := randQuantWeights(rng, quant.Q4_K, n, k)
	x := randActs(rng, m, k)
	y := make([]float32, (m-1)*ldy+n)
	for i := range y {
		y[i] = 42
	}
	if err := qamxSlices(quant.Q4_K, w, n, k, x, m, y, ldy, 2); err != nil {
		t.Fatal(err)
	}
	for i := range m {
		for j := n; j < ldy && i*ldy+j < len(y); j++ {
			if y[i*ldy+j] != 42 {
				t.Fatalf("y[%d][%d] past n_out was written", i, j)
			}
		}
		for j := range n {
			if y[i*ldy+j] == 42 {
				t.Fatalf("y[%d][%d] not written", i, j)
			}
		}
	}
}

// TestQamxNonFinite: a row of X holding an infinity or a NaN gives a
// non-finite row of Y; the finite rows stay finite.
func TestQamxNonFinite(t *testing.T) {
	needAMX(t)
	for _, typ := range []quant.Type{quant.Q4_K, quant.Q8_0, quant.Q6_K} {
		const k, n, m = 512, 20, 3
		rng := rand.New(rand.NewPCG(5, uint64(typ)))
		w := randQuantWeights(rng, typ, n, k)
		x := randActs(rng, m, k)
		x[k+100] = float32(math.Inf(-1))
		x[2*k+k-1] = float32(math.NaN())
		y := make([]float32, m*n)
		if err := qamxSlices(typ, w, n, k, x, m, y, n, 1); err != nil {
			t.Fatal(err)
		}
		for j := range n {
			if math.IsNaN(float64(y[j])) || math.IsInf(float64(y[j]), 0) {
				t.Errorf("%v: row 0 (finite) gave %g", typ, y[j])
			}
			if !math.IsNaN(float64(y[2*n+j])) {
				t.Errorf("%v: the row with a NaN gave %g", typ, y[2*n+j])
			}
		}
	}
}

// TestQamxRefuses: sizes that do not fit are refused before memory is
// touched (nil pointers with hostile sizes would crash the test).
func TestQamxRefuses(t *testing.T) {
	for _, c := range []struct {
		name         string
		typ          quant.Type
		wBytes, n, k int64
		m, ldy       int64
		threads      int
	}{
		{"k not whole blocks", quant.Q4_K, 144, 1, 128, 1, 1, 1},
		{"k not a multiple of 32", quant.F16, 2 * 48, 1, 48, 1, 1, 1},
		{"w bytes short", quant.Q8_0, 33, 1, 32, 1, 1, 1},
		{"w bytes long", quant.Q8_0, 35, 1, 32, 1, 1, 1},
		{"ldy < n", quant.Q8_0, 68, 2, 32, 1, 1, 1},
		{"n = 0", quant.Q8_0, 0, 0, 32, 1, 1, 1},
		{"m = 0", quant.Q8_0, 34, 1, 32, 0, 1, 1},
		{"huge m", quant.Q8_0, 34, 1, 32, 1 << 50, 1, 1},
		{"huge k", quant.Q8_0, 34, 1, 1 << 50, 1, 1, 1},
		{"m times k past the limit", quant.Q8_0, 34, 1, 1 << 32, 1 << 32, 1, 1},
		{"overflowing ldy", quant.Q8_0, 34, 1, 32, 1 << 30, 1 << 40, 1},
		{"no threads", quant.Q8_0, 34, 1, 32, 1, 1, 0},
		{"unknown type", quant.Type(99), 34, 1, 32, 1, 1, 1},
	} {
		err := qamx(c.typ, nil, c.wBytes, c.n, c.k, nil, c.m, nil, c.ldy, c.threads, nil, 0)
		if err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	for _, c := range [][3]int64{{1 << 32, 1 << 32, 1}, {1 << 40, 1, 1}, {32, 1 << 40, 1}, {32, 1, 0}, {33, 1, 1}} {
		if got := qamxWorkBytes(quant.Q8_0, c[0], c[1], int(c[2])); got >= 0 {
			t.Errorf("work bytes for k=%d m=%d threads=%d: %d, want a refusal", c[0], c[1], c[2], got)
		}
	}
	if got := qamxWorkBytes(quant.Q4_K, 1024, 16, 2); got < 16*1024*2 {
		t.Errorf("work bytes for 16 rows of 1024: %d", got)
	}
}
