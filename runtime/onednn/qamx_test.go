package onednn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

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

// qamxGuarded runs qamx with scratch of exactly qamxWorkBytes from Go
// memory, followed by guard bytes, and fails the test if the kernel wrote
// past its scratch.
func qamxGuarded(t *testing.T, typ quant.Type, w []byte, n, k int, x []float32, m int, y []float32, threads, flags int) {
	t.Helper()
	need := qamxWorkBytes(typ, int64(k), int64(m), threads)
	if need < 0 {
		t.Fatalf("%v k=%d m=%d: work bytes %d", typ, k, m, need)
	}
	const guard = 4096
	buf := make([]byte, need+guard+64)
	off := int((64 - uintptr(unsafe.Pointer(&buf[0]))%64) % 64)
	work := buf[off : off+int(need)+guard]
	for i := need; i < int64(len(work)); i++ {
		work[i] = 0xa5
	}
	err := qamx(typ, unsafe.Pointer(&w[0]), int64(len(w)), int64(n), int64(k), unsafe.Pointer(&x[0]), int64(m),
		unsafe.Pointer(&y[0]), int64(n), threads, flags, unsafe.Pointer(&work[0]), need)
	if err != nil {
		t.Fatalf("%v k=%d m=%d threads=%d: %v", typ, k, m, threads, err)
	}
	for i := need; i < int64(len(work)); i++ {
		if work[i] != 0xa5 {
			t.Fatalf("%v k=%d m=%d threads=%d flags=%d: scratch byte %d past the %d asked for was written", typ, k, m, threads, flags, i-need, need)
		}
	}
}

// TestQamxMatchesFloat64: every weight type on bf16 panels (AMX-INT8 has
// its own test below), k of one to several blocks,
// m across the 16-row tiles and the 64-row passes (1, 5, 16, 17, 67, 130),
// 37 weight rows (a partial panel), 1, 2, 3 and 8 threads (8: more than the
// three panels, so some threads get none): Y within qamxGamma of
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
				for _, threads := range []int{1, 2, 3, 8} {
					y := make([]float32, m*n)
					qamxGuarded(t, typ, w, n, k, x, m, y, threads, qamxNoInt8)
					worst = max(worst, qamxWithinBound(t, fmt.Sprintf("%v k=%d m=%d threads=%d", typ, k, m, threads), wf, x, y, m, n, k))
				}
			}
		}
		t.Logf("%v: worst output used %.3g of the bound", typ, worst)
	}
}

// qamxWithinBound fails the test unless every y[i][j] is within
// qamxGamma(k) of the float64 product of row i of x and row j of the
// dequantized weights wf, and returns the largest share of the bound used.
func qamxWithinBound(t *testing.T, what string, wf, x, y []float32, m, n, k int) float64 {
	t.Helper()
	worst := 0.0
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
				t.Fatalf("%s: y[%d][%d] = %g, want %g (off %g, bound %g)", what, i, j, y[i*n+j], f, d, tol)
			} else if tol > 0 {
				worst = max(worst, d/tol)
			}
		}
	}
	return worst
}

// TestQamxGroups runs the bf16 path where a thread's panels come in
// several chunks and groups (qa_pass_group: 20 panels, groups of up to 8,
// k in chunks of 8 strips with a partial last one), and where tasks are
// groups over slices of X's rows (X past the L2, or too few panels for
// more than one a task), against float64.
func TestQamxGroups(t *testing.T) {
	needAMX(t)
	for _, c := range []struct {
		typ     quant.Type
		k, n, m int
	}{
		{quant.Q8_0, 1056, 16*19 + 3, 67}, {quant.Q4_K, 2304, 16*19 + 3, 67},
		// X past QA_X_L2 and too few panels for a group a thread: slices
		// of 64 rows, the last one 86.
		{quant.Q8_0, 4864, 37, 150}, {quant.Q4_K, 4864, 37, 150},
		// X past QA_X_L2 with fewer rows than a slice: one slice of all.
		{quant.Q8_0, 16384, 37, 48},
		// One panel a chunk from 2 threads (8 panels, the last partial):
		// chunks of four panels over slices of 64 rows, the last 108; at
		// 128 rows and 8 threads, chunks of two.
		{quant.Q8_0, 896, 16*7 + 5, 300}, {quant.Q4_K, 1024, 16*7 + 5, 128},
	} {
		rng := rand.New(rand.NewPCG(uint64(c.typ), uint64(c.k)))
		n, m := c.n, c.m
		w := randQuantWeights(rng, c.typ, n, c.k)
		wf := make([]float32, n*c.k)
		if err := quant.Dequantize(c.typ, w, wf); err != nil {
			t.Fatal(err)
		}
		x := randActs(rng, m, c.k)
		for _, threads := range []int{1, 2, 3, 8} {
			y := make([]float32, m*n)
			qamxGuarded(t, c.typ, w, n, c.k, x, m, y, threads, qamxNoInt8)
			qamxWithinBound(t, fmt.Sprintf("%v k=%d threads=%d", c.typ, c.k, threads), wf, x, y, m, n, c.k)
		}
	}
}

// TestQamxStride: rows of y past n_out are left as they were, on bf16
// panels (Q4_K) and on AMX-INT8 (Q8_0 with 13 rows, where the CPU has it).
func TestQamxStride(t *testing.T) {
	needAMX(t)
	for _, c := range []struct {
		typ quant.Type
		m   int
	}{{quant.Q4_K, 19}, {quant.Q8_0, 13}} {
		const n, k, ldy = 40, 512, 45
		m := c.m
		rng := rand.New(rand.NewPCG(9, 9))
		w := randQuantWeights(rng, c.typ, n, k)
		x := randActs(rng, m, k)
		y := make([]float32, (m-1)*ldy+n)
		for i := range y {
			y[i] = 42
		}
		if err := qamxSlices(c.typ, w, n, k, x, m, y, ldy, 2, 0); err != nil {
			t.Fatal(err)
		}
		for i := range m {
			for j := n; j < ldy && i*ldy+j < len(y); j++ {
				if y[i*ldy+j] != 42 {
					t.Fatalf("%v: y[%d][%d] past n_out was written", c.typ, i, j)
				}
			}
			for j := range n {
				if y[i*ldy+j] == 42 {
					t.Fatalf("%v: y[%d][%d] not written", c.typ, i, j)
				}
			}
		}
	}
}

// TestQamxInt8MatchesFloat64: Q8_0 on AMX-INT8, k from one block to 32
// (the four-block groups and the blocks left over), 16 and 37 weight rows
// (a whole and a partial panel), m up to 16, 1 to 3 and 8 threads. The
// activations are quantized as bd_qgemm quantizes them, so the bounds are
// TestQgemmMatchesFloat64's: within qgemmGamma·mag of the float64 product
// with the quantized activations, and within that plus qerr of the
// product with X itself.
func TestQamxInt8MatchesFloat64(t *testing.T) {
	needAMX(t)
	if !qamxInt8(quant.Q8_0, 16) {
		t.Skip("this CPU has no AMX-INT8")
	}
	for _, m := range []int{0, 17} {
		if qamxInt8(quant.Q8_0, int64(m)) {
			t.Errorf("AMX-INT8 claims %d rows", m)
		}
	}
	if qamxInt8(quant.Q4_K, 16) {
		t.Error("AMX-INT8 claims Q4_K")
	}
	worstExact, worstFloat := 0.0, 0.0
	for _, k := range []int{32, 96, 128, 288, 1024} {
		for _, n := range []int{16, 37} {
			rng := rand.New(rand.NewPCG(uint64(n), uint64(k)))
			w := randQuantWeights(rng, quant.Q8_0, n, k)
			for _, m := range []int{1, 5, 13, 16} {
				x := randActs(rng, m, k)
				ref := newQgemmRef(t, quant.Q8_0, w, n, k, x, m)
				for _, threads := range []int{1, 2, 3, 8} {
					y := make([]float32, m*n)
					qamxGuarded(t, quant.Q8_0, w, n, k, x, m, y, threads, 0)
					g := qgemmGamma(quant.Q8_0, k)
					for i := range y {
						tol := g*ref.mag[i] + 1e-30
						d := math.Abs(float64(y[i]) - ref.exact[i])
						df := math.Abs(float64(y[i]) - ref.float[i])
						if !(d <= tol) || !(df <= tol+ref.qerr[i]) {
							t.Fatalf("k=%d n=%d m=%d threads=%d: y[%d][%d] = %g; Σw·xhat = %g (off %g, bound %g), Σw·x = %g (off %g, bound %g)",
								k, n, m, threads, i/n, i%n, y[i], ref.exact[i], d, tol, ref.float[i], df, tol+ref.qerr[i])
						}
						worstExact = max(worstExact, d/tol)
						if ref.qerr[i] > 0 {
							worstFloat = max(worstFloat, df/(tol+ref.qerr[i]))
						}
					}
				}
			}
		}
	}
	t.Logf("worst output used %.3g of the rounding bound and %.3g of the quantization bound", worstExact, worstFloat)
}

// TestQamxNonFinite: a row of X holding an infinity or a NaN gives a
// non-finite row of Y, and (Q8_0) a weight block whose scale is an
// infinity a non-finite column; the finite rows stay finite. Q8_0 runs on
// AMX-INT8 (where the CPU has it) and on bf16 panels.
func TestQamxNonFinite(t *testing.T) {
	needAMX(t)
	for _, c := range []struct {
		typ   quant.Type
		flags int
	}{{quant.Q4_K, 0}, {quant.Q8_0, 0}, {quant.Q8_0, qamxNoInt8}, {quant.Q6_K, 0}} {
		typ := c.typ
		const k, n, m = 512, 20, 3
		rng := rand.New(rand.NewPCG(5, uint64(typ)))
		w := randQuantWeights(rng, typ, n, k)
		if typ == quant.Q8_0 {
			// weight row 7's second block: d = +Inf (f16 0x7c00)
			w[7*(k/32)*34+34], w[7*(k/32)*34+35] = 0x00, 0x7c
		}
		x := randActs(rng, m, k)
		x[k+100] = float32(math.Inf(-1))
		x[2*k+k-1] = float32(math.NaN())
		y := make([]float32, m*n)
		if err := qamxSlices(typ, w, n, k, x, m, y, n, 1, c.flags); err != nil {
			t.Fatal(err)
		}
		for j := range n {
			bad := math.IsNaN(float64(y[j])) || math.IsInf(float64(y[j]), 0)
			if typ == quant.Q8_0 && j == 7 {
				if !bad {
					t.Errorf("%v flags %d: the column of an infinite weight scale gave %g", typ, c.flags, y[j])
				}
			} else if bad {
				t.Errorf("%v flags %d: row 0 (finite) gave %g", typ, c.flags, y[j])
			}
			if !math.IsNaN(float64(y[2*n+j])) {
				t.Errorf("%v flags %d: the row with a NaN gave %g", typ, c.flags, y[2*n+j])
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
		err := qamx(c.typ, nil, c.wBytes, c.n, c.k, nil, c.m, nil, c.ldy, c.threads, 0, nil, 0)
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
