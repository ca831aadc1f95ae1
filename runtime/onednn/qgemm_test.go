package onednn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
	"github.com/brokerd/brokerd/runtime/quant/ggmlref"
)

// qgemmTypes are the weight types bd_qgemm has kernels for: the block types
// (activations quantized to int8) and the 16-bit floats (activations as
// they are).
var qgemmTypes = []quant.Type{quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q8_0, quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.F16, quant.BF16}

func isFloatType(t quant.Type) bool { return t == quant.F16 || t == quant.BF16 }

// qgemmISAsHere lists the qgemm.c variants this CPU runs.
func qgemmISAsHere() []isa {
	out := []isa{isaBase}
	for _, v := range []isa{isaAVX2, isaAVX512} {
		if v <= qgemmISA() {
			out = append(out, v)
		}
	}
	return out
}

// halves are each type's f16 fields (scales and mins) in a block, and
// quants the byte range of its quantized values (qs, qh).
var qgemmLayout = map[quant.Type]struct {
	halves     []int
	quants     [2]int
	blockBytes int
}{
	quant.Q4_0: {[]int{0}, [2]int{2, 18}, 18},
	quant.Q4_1: {[]int{0, 2}, [2]int{4, 20}, 20},
	quant.Q5_0: {[]int{0}, [2]int{2, 22}, 22},
	quant.Q5_1: {[]int{0, 2}, [2]int{4, 24}, 24},
	quant.Q8_0: {[]int{0}, [2]int{2, 34}, 34},
	quant.Q4_K: {[]int{0, 2}, [2]int{16, 144}, 144},
	quant.Q5_K: {[]int{0, 2}, [2]int{16, 176}, 176},
	quant.Q6_K: {[]int{208}, [2]int{0, 192}, 210},
}

// randHalf is a finite f16 for a block scale: mostly 2^-7 … 2^-2 of either
// sign, sometimes zero or subnormal.
func randHalf(rng *rand.Rand) uint16 {
	sign := uint16(rng.IntN(2)) << 15
	switch rng.IntN(16) {
	case 0:
		return sign
	case 1:
		return sign | uint16(rng.IntN(1024))
	}
	return sign | uint16(8+rng.IntN(6))<<10 | uint16(rng.IntN(1024))
}

// randQuantWeights is rows x k weights of type t: every quantized value,
// 6-bit scale and min and Q6_K int8 scale random (all of their bit
// patterns occur), block scales from randHalf. Any such block is one a
// file may hold; a kernel must get each right.
func randQuantWeights(rng *rand.Rand, t quant.Type, rows, k int) []byte {
	in, _ := t.Info()
	if isFloatType(t) {
		// finite 16-bit floats over a wide range: 2^-24 … 2^7 in f16, 2^-40 … 2^7 in bf16
		w := make([]byte, 2*rows*k)
		for i := 0; i < len(w); i += 2 {
			var h uint16
			if t == quant.F16 {
				h = uint16(rng.IntN(2))<<15 | uint16(rng.IntN(23))<<10 | uint16(rng.IntN(1024))
			} else {
				h = uint16(rng.IntN(2))<<15 | uint16(87+rng.IntN(47))<<7 | uint16(rng.IntN(128))
			}
			w[i], w[i+1] = byte(h), byte(h>>8)
		}
		return w
	}
	l := qgemmLayout[t]
	w := make([]byte, rows*k/in.BlockElems*in.BlockBytes)
	for i := range w {
		w[i] = byte(rng.Uint32())
	}
	for b := 0; b < len(w); b += in.BlockBytes {
		for _, o := range l.halves {
			h := randHalf(rng)
			w[b+o], w[b+o+1] = byte(h), byte(h>>8)
		}
	}
	return w
}

// randActs is m x k activations: normal values with some outliers (x30),
// an all-zero block now and then, and a zero row.
func randActs(rng *rand.Rand, m, k int) []float32 {
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
		if rng.IntN(64) == 0 {
			x[i] *= 30
		}
	}
	for b := 0; b+32 <= len(x); b += 32 {
		if rng.IntN(23) == 0 {
			clear(x[b : b+32])
		}
	}
	if m > 2 {
		clear(x[k : 2*k])
	}
	return x
}

// quantActsRef is bd_qgemm's activation quantization in Go (qgemm.c's
// header comment): per block of blk elements d = amax/127 and
// q = round-half-even(x * (127/amax)) in f32. xhat = d*q; half is d/2 plus
// the rounding of d and of x*id (4 ulp of amax): |x - xhat| <= half.
func quantActsRef(x []float32, blk int) (xhat, half []float64) {
	xhat, half = make([]float64, len(x)), make([]float64, len(x)/blk)
	for b := 0; b < len(x); b += blk {
		var amax float32
		for _, v := range x[b : b+blk] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var id float32
		if amax != 0 {
			id = 127 / amax
		}
		for i, v := range x[b : b+blk] {
			p := v * id
			xhat[b+i] = float64(d) * math.RoundToEven(float64(float32(p)))
		}
		half[b/blk] = float64(d)/2 + 4*float64(amax)*0x1p-24
	}
	return xhat, half
}

// qgemmRef holds, for Y = X·Wᵀ, the float64 products and their bounds:
//   - exact[i][j] = Σ w·xhat, with the weights as quant.Dequantize gives
//     them and X quantized as bd_qgemm does;
//   - float[i][j] = Σ w·x, the product with X itself;
//   - mag[i][j] = Σ (|w - o| + |o|)·|xhat|, o being the block's offset
//     (its dequantized value with every quant zero): the magnitude of the
//     two sums the kernel forms, Σ a·v·x and Σ o·x, which its f32
//     arithmetic rounds;
//   - qerr[i][j] = Σ |w|·half, the most the activations' quantization can
//     move the product.
type qgemmRef struct {
	exact, float, mag, qerr []float64
}

// bounds is output i's distance from the float64 product with the
// activations as quantized (de) and as given (df), and their bounds.
func (r qgemmRef) bounds(typ quant.Type, k, i int, got float32) (de, tolE, df, tolF float64) {
	g := float64(got)
	tolE = qgemmGamma(typ, k) * r.mag[i]
	tolF = tolE + r.qerr[i]
	return math.Abs(g - r.exact[i]), tolE, math.Abs(g - r.float[i]), tolF
}

func newQgemmRef(t *testing.T, typ quant.Type, w []byte, n, k int, x []float32, m int) qgemmRef {
	t.Helper()
	in, _ := typ.Info()
	wf := make([]float32, n*k)
	if err := quant.Dequantize(typ, w, wf); err != nil {
		t.Fatal(err)
	}
	// o: the blocks with their quants zeroed (none for the float types).
	of := make([]float32, n*k)
	blk := 32
	if in.BlockElems == quant.QK_K {
		blk = quant.QK_K
	}
	var xhat, half []float64
	if isFloatType(typ) {
		// X is used as it is: no quantization error
		blk = 1
		xhat, half = make([]float64, len(x)), make([]float64, len(x))
		for i, v := range x {
			xhat[i] = float64(v)
		}
	} else {
		l := qgemmLayout[typ]
		z := append([]byte(nil), w...)
		for b := 0; b < len(z); b += in.BlockBytes {
			clear(z[b+l.quants[0] : b+l.quants[1]])
		}
		if err := quant.Dequantize(typ, z, of); err != nil {
			t.Fatal(err)
		}
		xhat, half = quantActsRef(x, blk)
	}
	ref := qgemmRef{make([]float64, m*n), make([]float64, m*n), make([]float64, m*n), make([]float64, m*n)}
	for i := range m {
		for j := range n {
			var e, f, g, q float64
			wr, or, xr, hr := wf[j*k:(j+1)*k], of[j*k:(j+1)*k], x[i*k:(i+1)*k], xhat[i*k:(i+1)*k]
			for l := range k {
				wv, ov := float64(wr[l]), float64(or[l])
				e += wv * hr[l]
				f += wv * float64(xr[l])
				g += (math.Abs(wv-ov) + math.Abs(ov)) * math.Abs(hr[l])
				q += math.Abs(wv) * half[(i*k+l)/blk]
			}
			ref.exact[i*n+j], ref.float[i*n+j], ref.mag[i*n+j], ref.qerr[i*n+j] = e, f, g, q
		}
	}
	return ref
}

// qgemmGamma is the relative rounding bound of the kernels' f32 sums over
// k elements of type t. For the block types each lane of an accumulator
// adds one term per block (k/32 blocks at most), each term carries two or
// three roundings (the int sum's conversion, the scale products), and the
// lanes, the offsets' sum and the two sums meet in a few more additions:
// (k/32 + 8) units of 2^-24, doubled for the second-order terms and the
// blocks' own f32 roundings in quant.Dequantize. For F16 and BF16 a lane
// adds one product per 8 elements and a scalar tail under 16 follows:
// (k/8 + 24) units, doubled.
func qgemmGamma(t quant.Type, k int) float64 {
	if isFloatType(t) {
		return float64(k/8+24) * 0x1p-23
	}
	return float64(k/32+8) * 0x1p-23
}

// TestQgemmMatchesFloat64: every weight type, every variant this CPU has,
// m in {1, 3, 16, 67}, 1 to 3 and 8 threads (more than its tasks), random blocks (randQuantWeights):
// Y is within qgemmGamma·mag of the float64 product of quant.Dequantize's
// weights and the activations quantized as bd_qgemm quantizes them (so
// the integer sums and scales are exact up to f32 rounding), and within
// that plus qerr of the float64 product with the float activations:
// qerr = Σ_blocks (d/2)·Σ|w| bounds what int8 activations can cost (a
// rounding of at most d/2 per element), the tolerance llama.cpp's
// test-quantize-fns states only as one constant (MAX_DOT_PRODUCT_ERROR
// 0.02 on its synthetic data). The test logs how much of each bound the
// worst output used.
func TestQgemmMatchesFloat64(t *testing.T) {
	t.Logf("variants here: %v (auto picks %v)", qgemmISAsHere(), qgemmISA())
	for _, typ := range qgemmTypes {
		in, _ := typ.Info()
		ks := []int{32, 288, 1024}
		switch {
		case in.BlockElems == quant.QK_K:
			ks = []int{256, 768}
		case isFloatType(typ):
			ks = []int{7, 64, 333}
		}
		worstExact, worstFloat := 0.0, 0.0
		for _, k := range ks {
			rng := rand.New(rand.NewPCG(uint64(typ), uint64(k)))
			const n = 37
			w := randQuantWeights(rng, typ, n, k)
			for _, m := range []int{1, 3, 16, 67} {
				x := randActs(rng, m, k)
				ref := newQgemmRef(t, typ, w, n, k, x, m)
				for _, v := range append(qgemmISAsHere(), isaAuto) {
					for _, threads := range []int{1, 2, 3, 8} {
						y := make([]float32, m*n)
						if err := qgemm(typ, w, n, k, x, m, y, n, v, threads); err != nil {
							t.Fatalf("%v k=%d m=%d %v: %v", typ, k, m, v, err)
						}
						for i, got := range y {
							de, tolE, df, tolF := ref.bounds(typ, k, i, got)
							if !(de <= tolE) || !(df <= tolF) {
								t.Fatalf("%v k=%d m=%d %v threads=%d: y[%d][%d] = %g; Σw·xhat = %g (off %g, bound %g), Σw·x = %g (off %g, bound %g)",
									typ, k, m, v, threads, i/n, i%n, got, ref.exact[i], de, tolE, ref.float[i], df, tolF)
							}
							if tolE > 0 {
								worstExact = max(worstExact, de/tolE)
							}
							if tolF > 0 {
								worstFloat = max(worstFloat, df/tolF)
							}
						}
					}
				}
			}
		}
		t.Logf("%v: worst output used %.3g of the rounding bound and %.3g of the quantization bound", typ, worstExact, worstFloat)
	}
}

// TestQgemmGGMLWeights: weights quantized by ggml itself (llama.cpp's
// ggml_quantize_chunk through runtime/quant/ggmlref, as a GGUF file holds
// them) from normal weights with some large ones, against the same two
// float64 products and bounds as TestQgemmMatchesFloat64, every variant.
func TestQgemmGGMLWeights(t *testing.T) {
	lib := ggmlref.Find(t)
	for _, typ := range qgemmTypes {
		if isFloatType(typ) {
			continue
		}
		const n, k = 24, 768
		rng := rand.New(rand.NewPCG(21, uint64(typ)))
		src := make([]float32, n*k)
		for i := range src {
			src[i] = float32(rng.NormFloat64() * 0.02)
			if rng.IntN(200) == 0 {
				src[i] *= 40
			}
		}
		w, err := lib.Quantize(uint32(typ), src, n, k)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []int{1, 5, 16} {
			x := randActs(rng, m, k)
			ref := newQgemmRef(t, typ, w, n, k, x, m)
			for _, v := range qgemmISAsHere() {
				y := make([]float32, m*n)
				if err := qgemm(typ, w, n, k, x, m, y, n, v, 2); err != nil {
					t.Fatal(err)
				}
				for i, got := range y {
					g := float64(got)
					tolE := qgemmGamma(typ, k) * ref.mag[i]
					if de, df := math.Abs(g-ref.exact[i]), math.Abs(g-ref.float[i]); !(de <= tolE) || !(df <= tolE+ref.qerr[i]) {
						t.Fatalf("%v m=%d %v: y[%d][%d] = %g; Σw·xhat = %g (off %g, bound %g), Σw·x = %g (off %g, bound %g)",
							typ, m, v, i/n, i%n, g, ref.exact[i], de, tolE, ref.float[i], df, tolE+ref.qerr[i])
					}
				}
			}
		}
	}
}

// TestQgemmTiles: a weight matrix past one L2 tile (512 KiB), rows of X
// past one register group, three threads, an output stride wider than
// n_out: the same products, and the columns past n_out untouched.
func TestQgemmTiles(t *testing.T) {
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q6_K, quant.BF16} {
		const n, k, m, ldy = 700, 1024, 13, 709
		rng := rand.New(rand.NewPCG(3, uint64(typ)))
		w := randQuantWeights(rng, typ, n, k)
		x := randActs(rng, m, k)
		ref := newQgemmRef(t, typ, w, n, k, x, m)
		for _, v := range qgemmISAsHere() {
			y := make([]float32, (m-1)*ldy+n)
			for i := range y {
				y[i] = 42
			}
			if err := qgemm(typ, w, n, k, x, m, y, ldy, v, 3); err != nil {
				t.Fatal(err)
			}
			for i := range m {
				for j := range ldy {
					if i*ldy+j >= len(y) {
						break
					}
					got := float64(y[i*ldy+j])
					if j >= n {
						if got != 42 {
							t.Fatalf("%v %v: y[%d][%d] past n_out was written", typ, v, i, j)
						}
						continue
					}
					e := ref.exact[i*n+j]
					if d := math.Abs(got - e); !(d <= qgemmGamma(typ, k)*ref.mag[i*n+j]) {
						t.Fatalf("%v %v: y[%d][%d] = %g, want %g (off %g)", typ, v, i, j, got, e, d)
					}
				}
			}
		}
	}
}

// TestQgemmNonFinite: a row of X holding an infinity or a NaN is a row of
// NaN in Y; the other rows are unaffected.
func TestQgemmNonFinite(t *testing.T) {
	for _, typ := range qgemmTypes {
		in, _ := typ.Info()
		k, n, m := 512, 20, 3
		rng := rand.New(rand.NewPCG(5, uint64(typ)))
		w := randQuantWeights(rng, typ, n, k)
		x := randActs(rng, m, k)
		x[k+100] = float32(math.Inf(-1))
		x[2*k+k-1] = float32(math.NaN())
		for _, v := range qgemmISAsHere() {
			y := make([]float32, m*n)
			if err := qgemm(typ, w, n, k, x, m, y, n, v, 1); err != nil {
				t.Fatal(err)
			}
			for j := range n {
				if math.IsNaN(float64(y[j])) || math.IsInf(float64(y[j]), 0) {
					t.Errorf("%v %v: row 0 (finite) gave %g", typ, v, y[j])
				}
				if isFloatType(typ) { // X as it is: an infinity may stay one
					if !math.IsNaN(float64(y[2*n+j])) || !math.IsNaN(float64(y[n+j])) && !math.IsInf(float64(y[n+j]), 0) {
						t.Errorf("%v %v: rows with inf/NaN gave %g, %g", typ, v, y[n+j], y[2*n+j])
					}
					continue
				}
				if !math.IsNaN(float64(y[n+j])) || !math.IsNaN(float64(y[2*n+j])) {
					t.Errorf("%v %v (blocks of %d): rows with inf/NaN gave %g, %g", typ, v, in.BlockElems, y[n+j], y[2*n+j])
				}
			}
		}
	}
}

// TestQgemmRefuses: sizes that do not fit are refused before anything is
// read or written: C is handed nil pointers with the hostile sizes (a
// touch would crash the test), and through the slice wrapper the output
// keeps its sentinel. Unknown types and variants this CPU lacks too.
func TestQgemmRefuses(t *testing.T) {
	const big = int64(1) << 62
	for _, typ := range qgemmTypes {
		in, _ := typ.Info()
		be, bb := int64(in.BlockElems), int64(in.BlockBytes)
		row := bb // one block a row
		cases := []struct {
			name                 string
			wBytes, n, k, m, ldy int64
			threads              int
		}{
			{"k not whole blocks", row, 1, be + 1, 1, 1, 1},
			{"k one short", row, 1, be - 1, 1, 1, 1},
			{"k zero", 0, 1, 0, 1, 1, 1},
			{"k negative", row, 1, -be, 1, 1, 1},
			{"n zero", 0, 0, be, 1, 1, 1},
			{"n negative", -row, -1, be, 1, 1, 1},
			{"m zero", row, 1, be, 0, 1, 1},
			{"m negative", row, 1, be, -1, 1, 1},
			{"w one byte short", row - 1, 1, be, 1, 1, 1},
			{"w one byte long", row + 1, 1, be, 1, 1, 1},
			{"w a row short", row, 2, be, 1, 2, 1},
			{"ldy below n", 2 * row, 2, be, 2, 1, 1},
			{"ldy zero", row, 1, be, 2, 0, 1},
			{"threads zero", row, 1, be, 1, 1, 0},
			{"threads negative", row, 1, be, 1, 1, -4},
			{"k huge", big / be * bb, 1, big, 1, 1, 1},
			{"n huge", big * bb, big, be, 1, big, 1},
			{"m huge", row, 1, be, big, 1, 1},
			{"m*ldy overflows", row, 1, be, 1 << 32, 1 << 32, 1},
			{"w bytes overflow", int64(math.MaxInt64), 1 << 39, be << 20, 1, 1 << 39, 1},
		}
		for _, c := range cases {
			err := qgemmC(typ, nil, c.wBytes, c.n, c.k, nil, c.m, nil, c.ldy, isaAuto, c.threads)
			if !errors.Is(err, errQgemmSize) {
				t.Errorf("%v %s: %v, want a size error", typ, c.name, err)
			}
		}
		// Through the slice wrapper: short slices are refused, and a
		// refused call leaves y alone.
		w := make([]byte, 2*row)
		x := make([]float32, 2*be)
		y := []float32{42, 42, 42, 42}
		for _, c := range []struct {
			name string
			err  error
		}{
			{"x short", qgemm(typ, w, 2, int(be), x[:2*be-1], 2, y, 2, isaAuto, 1)},
			{"y short", qgemm(typ, w, 2, int(be), x, 2, y[:3], 2, isaAuto, 1)},
			{"w short", qgemm(typ, w[:2*row-1], 2, int(be), x, 2, y, 2, isaAuto, 1)},
			{"k odd", qgemm(typ, w, 2, int(be)+2, x, 1, y, 2, isaAuto, 1)},
			{"m zero", qgemm(typ, w, 2, int(be), x, 0, y, 2, isaAuto, 1)},
			{"m negative", qgemm(typ, w, 2, int(be), x, -1, y, 2, isaAuto, 1)},
		} {
			if !errors.Is(c.err, errQgemmSize) {
				t.Errorf("%v %s: %v, want a size error", typ, c.name, c.err)
			}
		}
		for i, v := range y {
			if v != 42 {
				t.Fatalf("%v: a refused call wrote y[%d]", typ, i)
			}
		}
		if err := qgemm(typ, w, 2, int(be), x, 2, y, 2, isa(7), 1); err == nil {
			t.Errorf("%v: variant 7 accepted", typ)
		}
		if qgemmISA() < isaAVX512 {
			if err := qgemm(typ, w, 2, int(be), x, 2, y, 2, isaAVX512, 1); err == nil {
				t.Errorf("%v: the avx512 variant ran on a CPU without it", typ)
			}
		}
	}
	for _, typ := range []quant.Type{quant.F32, 4, 5, 9, 10, 11, 15, 31, 1 << 20, math.MaxUint32} {
		err := qgemmC(typ, nil, 34, 1, 32, nil, 1, nil, 1, isaAuto, 1)
		if !errors.Is(err, quant.ErrUnsupported) {
			t.Errorf("%v: %v, want ErrUnsupported", typ, err)
		}
	}
}

// TestQgemmMulti: bd_qgemm_multi's products of several matrices by one x
// (x quantized once, their rows shared among the threads as one matrix's,
// each part into its own y with its own stride and bias) are
// bit-identical to separate bd_qgemm calls with the bias added after, for
// every type, variant and thread count; columns past a part's n are not
// written. A call with one bad part is refused before anything is
// written.
func TestQgemmMulti(t *testing.T) {
	for _, typ := range qgemmTypes {
		in, _ := typ.Info()
		k := max(2*in.BlockElems, 64)
		rng := rand.New(rand.NewPCG(5, uint64(typ)))
		ns := []int{37, 16, 5} // rows that do not split evenly between threads
		ws := make([][]byte, len(ns))
		biases := make([][]float32, len(ns))
		for i, n := range ns {
			ws[i] = randQuantWeights(rng, typ, n, k)
			if i != 1 { // the middle part has no bias
				biases[i] = randActs(rng, 1, n)
			}
		}
		for _, m := range []int{1, 3, 16} {
			x := randActs(rng, m, k)
			for _, v := range append(qgemmISAsHere(), isaAuto) {
				for _, threads := range []int{1, 2, 3, 8} {
					var parts []qpart
					ys := make([][]float32, len(ns))
					for i, n := range ns {
						ldy := n + 3
						ys[i] = slices.Repeat([]float32{42}, m*ldy)
						p := qpart{w: unsafe.Pointer(&ws[i][0]), wBytes: int64(len(ws[i])), n: int64(n), y: unsafe.Pointer(&ys[i][0]), ldy: int64(ldy)}
						if biases[i] != nil {
							p.bias = unsafe.Pointer(&biases[i][0])
						}
						parts = append(parts, p)
					}
					if err := qgemmParts(typ, parts, int64(k), unsafe.Pointer(&x[0]), int64(m), v, threads, nil, 0); err != nil {
						t.Fatalf("%v m=%d %v threads=%d: %v", typ, m, v, threads, err)
					}
					for i, n := range ns {
						want := make([]float32, m*n)
						if err := qgemm(typ, ws[i], n, k, x, m, want, n, v, threads); err != nil {
							t.Fatal(err)
						}
						ldy := n + 3
						for r := range m {
							for j := range ldy {
								got := ys[i][r*ldy+j]
								w := float32(42)
								if j < n {
									w = want[r*n+j]
									if biases[i] != nil {
										w += biases[i][j]
									}
								}
								if math.Float32bits(got) != math.Float32bits(w) {
									t.Fatalf("%v m=%d %v threads=%d: part %d y[%d][%d] = %g, want %g", typ, m, v, threads, i, r, j, got, w)
								}
							}
						}
					}
				}
			}
		}
		// One part a byte short: nothing written to any part.
		x := randActs(rng, 1, k)
		y0, y1 := slices.Repeat([]float32{42}, ns[0]), slices.Repeat([]float32{42}, ns[1])
		parts := []qpart{
			{w: unsafe.Pointer(&ws[0][0]), wBytes: int64(len(ws[0])), n: int64(ns[0]), y: unsafe.Pointer(&y0[0]), ldy: int64(ns[0])},
			{w: unsafe.Pointer(&ws[1][0]), wBytes: int64(len(ws[1])) - 1, n: int64(ns[1]), y: unsafe.Pointer(&y1[0]), ldy: int64(ns[1])},
		}
		if err := qgemmParts(typ, parts, int64(k), unsafe.Pointer(&x[0]), 1, isaAuto, 2, nil, 0); !errors.Is(err, errQgemmSize) {
			t.Errorf("%v: a short part: %v, want a size error", typ, err)
		}
		if slices.ContainsFunc(append(y0, y1...), func(v float32) bool { return v != 42 }) {
			t.Errorf("%v: a refused call wrote an output", typ)
		}
	}
	if err := qgemmParts(quant.Q8_0, make([]qpart, 9), 32, nil, 1, isaAuto, 1, nil, 0); !errors.Is(err, errQgemmSize) {
		t.Errorf("9 parts: %v, want a size error", err)
	}
}

// TestQgemmWorkBytes: the scratch size is what the activations' groups
// take in the larger of the variants' layouts, and sizes bd_qgemm refuses
// get a negative answer.
func TestQgemmWorkBytes(t *testing.T) {
	for _, c := range []struct {
		typ  quant.Type
		k, m int64
		want int64
	}{
		{quant.Q4_0, 32, 1, 64 + 2*8*4},             // one block of one row: a pair's 64 bytes, d and s padded to 8 blocks
		{quant.Q8_0, 4864, 3, 152*3*32 + 2*3*152*4}, // a group of 3
		{quant.Q4_0, 32, 16, 4 * (4*64 + 2*4*8*4)},  // four groups of 4 (AVX2); two of 8 take as much
		{quant.Q4_K, 256, 2, 512 + 32 + 256 + 2*32},
		{quant.Q6_K, 4864, 1, 19 * (256 + 32 + 256 + 32)},
		{quant.Q4_0, 33, 1, -2},
		{quant.Q4_K, 0, 1, -2},
		{quant.F32, 32, 1, -1},
	} {
		if got := qgemmWorkBytes(c.typ, c.k, c.m); got != c.want {
			t.Errorf("%v k=%d m=%d: %d, want %d", c.typ, c.k, c.m, got, c.want)
		}
	}
}

// benchQgemmShapes are Qwen2.5-0.5B's matmul shapes (k -> n_out): the MLP's
// up and down projections and the tied output; the K types, whose blocks
// of 256 do not divide 896, take Llama 3.2 1B's MLP instead.
func benchQgemmShapes(typ quant.Type) [][2]int {
	in, _ := typ.Info()
	if in.BlockElems == quant.QK_K {
		return [][2]int{{2048, 8192}, {8192, 2048}, {4864, 896}}
	}
	return [][2]int{{896, 4864}, {4864, 896}, {896, 151936}}
}

// BenchmarkQgemmDecode: m = 1 (one decode step), 1 and 2 threads, reporting
// the weights streamed (MB/s of the quantized bytes) and that rate over the
// host's read bandwidth with as many threads (bw_frac). Each op reads the
// next of copies of W that together pass 1 GiB, so the weights come from
// memory, not from a last-level cache that could hold one matrix. bw_frac
// comes from rounds after the timed loop that alternate 50 ms of the
// kernel with a 1 GiB read (readBandwidth's), best of five each, so both
// see the same load on a shared machine.
func BenchmarkQgemmDecode(b *testing.B) {
	for _, typ := range qgemmTypes {
		for _, s := range benchQgemmShapes(typ) {
			k, n := s[0], s[1]
			rng := rand.New(rand.NewPCG(7, uint64(n)))
			w := randQuantWeights(rng, typ, n, k)
			copies := make([][]byte, max(1, (1<<30+len(w)-1)/len(w)))
			for i := range copies {
				copies[i] = append([]byte(nil), w...)
			}
			x := randActs(rng, 1, k)
			y := make([]float32, n)
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("%v/%dx%d/t%d", typ, k, n, threads), func(b *testing.B) {
					b.SetBytes(int64(len(w)))
					i := 0
					run := func() {
						if err := qgemm(typ, copies[i%len(copies)], n, k, x, 1, y, n, isaAuto, threads); err != nil {
							b.Fatal(err)
						}
						i++
					}
					for b.Loop() {
						run()
					}
					kern, bw := 0.0, 0.0
					for range 5 {
						t, ops := time.Now(), 0
						for ; time.Since(t) < 50*time.Millisecond; ops++ {
							run()
						}
						kern = max(kern, float64(len(w))*float64(ops)/time.Since(t).Seconds())
						bw = max(bw, readOnce(threads))
					}
					b.ReportMetric(kern/1e9, "best_GB/s")
					b.ReportMetric(bw/1e9, "read_GB/s")
					b.ReportMetric(kern/bw, "bw_frac")
				})
			}
		}
	}
}

// BenchmarkQgemmPrefill: m = 512 (a prompt's prefill), GFLOP/s (2·m·n·k).
func BenchmarkQgemmPrefill(b *testing.B) {
	const m = 512
	for _, typ := range qgemmTypes {
		for _, s := range benchQgemmShapes(typ)[:2] {
			k, n := s[0], s[1]
			rng := rand.New(rand.NewPCG(8, uint64(n)))
			w := randQuantWeights(rng, typ, n, k)
			x := randActs(rng, m, k)
			y := make([]float32, m*n)
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("%v/%dx%d/t%d", typ, k, n, threads), func(b *testing.B) {
					for b.Loop() {
						if err := qgemm(typ, w, n, k, x, m, y, n, isaAuto, threads); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(2*m*float64(n)*float64(k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// readOnce is the host's read bandwidth with threads threads: a 1 GiB
// buffer (past any last-level cache; 512 MiB partly fits in some) read once
// by bd_qgemm_read_sum's 256-bit loads, bytes per second. (The scalar Go
// loop of bench/benchkit's ReadBandwidth reads about 60% of this on a
// 2-core Xeon: it measures the loop, not the memory.)
func readOnce(threads int) float64 {
	if readBuf == nil {
		readBuf = make([]byte, 1<<30)
		for i := range readBuf {
			readBuf[i] = byte(i)
		}
	}
	t := time.Now()
	readSink += readSum(readBuf, threads)
	return float64(len(readBuf)) / time.Since(t).Seconds()
}

// readBuf is readOnce's buffer, allocated once.
var readBuf []byte

// readSink keeps readBandwidth's sums alive.
var readSink uint64

// BenchmarkQgemmPrefillOneDNN is the other road for a prefill: the same
// shapes (m = 512) as oneDNN matmuls on f32 or bf16 weights (DirectMatMul;
// bf16 runs on AMX where the CPU has it), the GFLOP/s a quantized model
// would reach by dequantizing a weight matrix first (that cost not
// counted: BenchmarkDequantizeRow has it).
func BenchmarkQgemmPrefillOneDNN(b *testing.B) {
	const m = 512
	for _, s := range [][2]int{{896, 4864}, {4864, 896}, {2048, 8192}, {8192, 2048}} {
		k, n := s[0], s[1]
		for _, dt := range []runtime.DType{runtime.F32, runtime.BF16} {
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("%v/%dx%d/t%d", dt, k, n, threads), func(b *testing.B) {
					el, err := DirectMatMul(m, n, k, b.N, threads, dt)
					if err != nil {
						b.Skip(err)
					}
					b.ReportMetric(2*m*float64(n)*float64(k)*float64(b.N)/el.Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}
