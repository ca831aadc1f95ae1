package quant_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/brokerd/brokerd/runtime/quant"
	"github.com/brokerd/brokerd/runtime/quant/ggmlref"
)

// weights fills n values of one of the test distributions.
func weights(rng *rand.Rand, kind string, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	scale := func(s float64) {
		for i := range x {
			x[i] = float32(float64(x[i]) * s)
		}
	}
	switch kind {
	case "normal":
	case "large": // scales near the top of f16 (65504) and past it
		scale(3e4)
	case "huge": // past f16 and bf16's useful range: infinite scales
		scale(1e36)
	case "tiny": // f16 subnormal scales
		scale(1e-6)
	case "subnormal": // scales that flush to f16 zero
		scale(1e-30)
	case "mixed":
		// each 32-element group gets its own magnitude, from 1e-8 to 1e4,
		// with zero groups, constant groups, one-outlier groups and
		// positive-only groups (the min of Q4_1/Q5_1/K-quants).
		for g := 0; g < n/32; g++ {
			grp := x[g*32 : g*32+32]
			s := float32(math.Pow(10, -8+12*rng.Float64()))
			switch rng.IntN(6) {
			case 0:
				clear(grp)
			case 1:
				for i := range grp {
					grp[i] = s
				}
			case 2:
				clear(grp)
				grp[rng.IntN(32)] = -s
			case 3:
				for i := range grp {
					grp[i] = float32(math.Abs(float64(grp[i]))) * s
				}
			default:
				for i := range grp {
					grp[i] *= s
				}
			}
		}
	case "zero":
		clear(x)
	case "zeroblocks": // every other 256-element super-block zero
		for i := range x {
			if (i/256)%2 == 0 {
				x[i] = 0
			}
		}
	case "integers": // small integers, exact in every type's grid for some
		for i := range x {
			x[i] = float32(rng.IntN(31) - 15)
		}
	default:
		panic(kind)
	}
	return x
}

var kinds = []string{"normal", "large", "huge", "tiny", "subnormal", "mixed", "zero", "zeroblocks", "integers"}

// compareBits fails t on the first few elements whose bits differ.
func compareBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	bad := 0
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			if bad < 5 {
				t.Errorf("%s: element %d is %g (%#08x), ggml gives %g (%#08x)", what, i,
					got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d elements differ", what, bad, len(got))
	}
}

// TestTable: the block table agrees with ggml's type traits.
func TestTable(t *testing.T) {
	lib := ggmlref.Find(t)
	for _, typ := range quant.Types() {
		in, ok := typ.Info()
		if !ok {
			t.Fatalf("%v: no info", typ)
		}
		tr, err := lib.Traits(uint32(typ))
		if err != nil {
			t.Fatal(err)
		}
		if in.Name != tr.Name || int64(in.BlockElems) != tr.BlockElems || int64(in.BlockBytes) != tr.BlockBytes || in.Quantized != tr.Quantized {
			t.Errorf("%v: %+v, ggml says %+v", typ, in, tr)
		}
		if typ.String() != tr.Name {
			t.Errorf("type %d: String %q, ggml says %q", uint32(typ), typ.String(), tr.Name)
		}
	}
}

// TestDequantizeMatchesGGML quantizes random weights with
// ggml_quantize_chunk, decodes them with ggml's to_float and with
// Dequantize, and requires the same bits: every type, several seeds, rows of
// 256 and 4096, and weights from zero blocks to magnitudes past f16's range.
func TestDequantizeMatchesGGML(t *testing.T) {
	lib := ggmlref.Find(t)
	t.Logf("ggml %s (commit %s) from %s", lib.Version, lib.Commit, lib.Path)
	shapes := []struct{ rows, perRow int }{{4, 256}, {2, 4096}}
	for _, typ := range quant.Types() {
		t.Run(typ.String(), func(t *testing.T) {
			var checked int
			for seed := uint64(1); seed <= 3; seed++ {
				for _, sh := range shapes {
					for _, kind := range kinds {
						rng := rand.New(rand.NewPCG(seed, uint64(typ)<<32|uint64(sh.perRow)))
						x := weights(rng, kind, sh.rows*sh.perRow)
						what := fmt.Sprintf("%v seed %d %dx%d %s", typ, seed, sh.rows, sh.perRow, kind)
						q, err := lib.Quantize(uint32(typ), x, sh.rows, sh.perRow)
						if err != nil {
							t.Fatalf("%s: %v", what, err)
						}
						rb, err := quant.RowBytes(typ, int64(sh.perRow))
						if err != nil {
							t.Fatal(err)
						}
						if int64(len(q)) != rb*int64(sh.rows) {
							t.Fatalf("%s: ggml wrote %d bytes, RowBytes says %d a row", what, len(q), rb)
						}
						want, err := lib.ToFloat(uint32(typ), q, len(x))
						if err != nil {
							t.Fatalf("%s: %v", what, err)
						}
						got := make([]float32, len(x))
						for i := range got {
							got[i] = float32(math.NaN()) // nothing may be left unwritten
						}
						if err := quant.Dequantize(typ, q, got); err != nil {
							t.Fatalf("%s: %v", what, err)
						}
						compareBits(t, what, got, want)
						// Row by row gives the same as the whole.
						row := make([]float32, sh.perRow)
						for r := 0; r < sh.rows; r++ {
							if err := quant.Dequantize(typ, q[int64(r)*rb:int64(r+1)*rb], row); err != nil {
								t.Fatal(err)
							}
							compareBits(t, what+fmt.Sprintf(" row %d", r), row, want[r*sh.perRow:(r+1)*sh.perRow])
						}
						checked += len(x)
					}
				}
			}
			t.Logf("%v: %d elements bit-identical", typ, checked)
		})
	}
}

// TestDequantizeRandomBytesMatchesGGML decodes random bytes (any scale bits:
// NaN, infinite, subnormal and negative scales, every 6-bit scale and min,
// every high bit) with both decoders: the same bits. Random bytes reach what
// ggml's quantizer never writes.
func TestDequantizeRandomBytesMatchesGGML(t *testing.T) {
	lib := ggmlref.Find(t)
	for _, typ := range quant.Types() {
		in, _ := typ.Info()
		rng := rand.New(rand.NewPCG(7, uint64(typ)))
		for _, blocks := range []int{1, 3, 64} {
			for rep := 0; rep < 20; rep++ {
				src := make([]byte, blocks*in.BlockBytes)
				for i := range src {
					src[i] = byte(rng.Uint32())
				}
				n := blocks * in.BlockElems
				want, err := lib.ToFloat(uint32(typ), src, n)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]float32, n)
				if err := quant.Dequantize(typ, src, got); err != nil {
					t.Fatal(err)
				}
				compareBits(t, fmt.Sprintf("%v random %d blocks rep %d", typ, blocks, rep), got, want)
			}
		}
	}
}

// TestF16ToF32AllBits: every one of the 65536 halves converts as ggml's
// F16 to_float does, NaNs included; BF16 likewise.
func TestF16ToF32AllBits(t *testing.T) {
	lib := ggmlref.Find(t)
	src := make([]byte, 2<<16)
	for h := 0; h < 1<<16; h++ {
		src[2*h], src[2*h+1] = byte(h), byte(h>>8)
	}
	for _, typ := range []quant.Type{quant.F16, quant.BF16} {
		want, err := lib.ToFloat(uint32(typ), src, 1<<16)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, 1<<16)
		for h := range got {
			if typ == quant.F16 {
				got[h] = quant.F16ToF32(uint16(h))
			} else {
				got[h] = quant.BF16ToF32(uint16(h))
			}
		}
		compareBits(t, typ.String()+" all bits", got, want)
	}
}

// TestDequantizeRefusesBadLengths: lengths that are not whole blocks, or
// bytes that do not match the elements, are errors wrapping ErrLength (an
// unknown type ErrUnsupported), never a panic.
func TestDequantizeRefusesBadLengths(t *testing.T) {
	for _, typ := range quant.Types() {
		in, _ := typ.Info()
		be, bb := in.BlockElems, in.BlockBytes
		cases := []struct {
			src, dst int
		}{
			{bb - 1, be},         // short
			{bb + 1, be},         // long
			{0, be},              // nothing
			{bb, 0},              // bytes for no elements
			{2 * bb, be},         // two blocks for one
			{bb, 2 * be},         // one block for two
			{bb * 3, 3*be - 1},   // elements not whole blocks
			{bb*3 - 1, 3*be - 1}, // both off
		}
		if be > 1 {
			cases = append(cases, struct{ src, dst int }{bb, be + 1}, struct{ src, dst int }{0, 1})
		}
		for _, c := range cases {
			err := quant.Dequantize(typ, make([]byte, c.src), make([]float32, c.dst))
			if !errors.Is(err, quant.ErrLength) {
				t.Errorf("%v: %d bytes into %d elements: %v, want ErrLength", typ, c.src, c.dst, err)
			}
		}
		if err := quant.Dequantize(typ, nil, nil); err != nil {
			t.Errorf("%v: nothing into nothing: %v", typ, err)
		}
		if err := quant.Dequantize(typ, make([]byte, 5*bb), make([]float32, 5*be)); err != nil {
			t.Errorf("%v: five blocks: %v", typ, err)
		}
	}
	for _, typ := range []quant.Type{4, 5, 9, 10, 11, 15, 16, 29, 31, 39, 1 << 31} {
		if err := quant.Dequantize(typ, make([]byte, 64), make([]float32, 32)); !errors.Is(err, quant.ErrUnsupported) {
			t.Errorf("%v: %v, want ErrUnsupported", typ, err)
		}
		if _, err := quant.RowBytes(typ, 32); !errors.Is(err, quant.ErrUnsupported) {
			t.Errorf("RowBytes %v: %v, want ErrUnsupported", typ, err)
		}
		if _, ok := typ.Info(); ok {
			t.Errorf("%v: Info known", typ)
		}
	}
}

func TestRowBytes(t *testing.T) {
	for _, c := range []struct {
		typ  quant.Type
		n    int64
		want int64
	}{
		{quant.F32, 4096, 16384}, {quant.F16, 3, 6}, {quant.BF16, 0, 0},
		{quant.Q4_0, 4096, 2304}, {quant.Q4_1, 32, 20}, {quant.Q5_0, 64, 44}, {quant.Q5_1, 32, 24},
		{quant.Q8_0, 4096, 4352}, {quant.Q4_K, 4096, 2304}, {quant.Q5_K, 256, 176}, {quant.Q6_K, 4096, 3360},
		{quant.Q8_0, 32 * (math.MaxInt64 / 34), 34 * (math.MaxInt64 / 34)},
		{quant.Q4_K, math.MaxInt64 / 256 * 256, math.MaxInt64 / 256 * 144},
	} {
		got, err := quant.RowBytes(c.typ, c.n)
		if err != nil || got != c.want {
			t.Errorf("RowBytes(%v, %d) = %d, %v; want %d", c.typ, c.n, got, err, c.want)
		}
	}
	for _, c := range []struct {
		typ quant.Type
		n   int64
	}{
		{quant.Q4_0, 31}, {quant.Q4_K, 4096 + 32}, {quant.F32, -1}, {quant.Q6_K, -256},
		{quant.F32, math.MaxInt64}, {quant.F32, math.MaxInt64/4 + 1}, {quant.Q8_0, math.MaxInt64 - 31},
	} {
		if got, err := quant.RowBytes(c.typ, c.n); !errors.Is(err, quant.ErrLength) {
			t.Errorf("RowBytes(%v, %d) = %d, %v; want ErrLength", c.typ, c.n, got, err)
		}
	}
}

// FuzzDequantize: any bytes, any type number, any element count: no panic,
// an error exactly when the lengths do not match, and where they do, ggml's
// bits.
func FuzzDequantize(f *testing.F) {
	lib := ggmlref.Find(f)
	f.Add(uint32(quant.Q4_K), uint16(256), make([]byte, 144))
	f.Add(uint32(quant.Q6_K), uint16(256), []byte{0xff, 0x7c, 1, 2, 3})
	f.Add(uint32(quant.Q8_0), uint16(31), make([]byte, 34))
	f.Add(uint32(quant.F16), uint16(3), []byte{0x01, 0x7c, 0x00, 0xfe, 0xff, 0x03})
	f.Add(uint32(quant.Q5_1), uint16(64), make([]byte, 48))
	f.Add(uint32(11), uint16(256), make([]byte, 110))
	f.Fuzz(func(t *testing.T, typ uint32, n uint16, src []byte) {
		qt := quant.Type(typ)
		// Most fuzzed numbers are no type: fold them onto the known ones,
		// keeping a few unknown ones.
		if typ > 40 {
			qt = quant.Types()[typ%uint32(len(quant.Types()))]
		}
		dst := make([]float32, n)
		err := quant.Dequantize(qt, src, dst)
		in, known := qt.Info()
		if !known {
			if !errors.Is(err, quant.ErrUnsupported) {
				t.Fatalf("%v: %v, want ErrUnsupported", qt, err)
			}
			return
		}
		fits := int(n)%in.BlockElems == 0 && len(src) == int(n)/in.BlockElems*in.BlockBytes
		if fits != (err == nil) {
			t.Fatalf("%v: %d bytes into %d elements: %v", qt, len(src), n, err)
		}
		if err != nil {
			if !errors.Is(err, quant.ErrLength) {
				t.Fatalf("%v: %v does not wrap ErrLength", qt, err)
			}
			return
		}
		want, err := lib.ToFloat(uint32(qt), src, int(n))
		if err != nil {
			t.Fatal(err)
		}
		compareBits(t, qt.String(), dst, want)
	})
}

// BenchmarkDequantize: a 4096×4096 matrix's worth of rows, reported as
// output elements per second (b.SetBytes counts the float32 written).
func BenchmarkDequantize(b *testing.B) {
	const n = 1 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	for _, typ := range quant.Types() {
		in, _ := typ.Info()
		src := make([]byte, n/in.BlockElems*in.BlockBytes)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		dst := make([]float32, n)
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				if err := quant.Dequantize(typ, src, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
