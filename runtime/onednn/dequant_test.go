package onednn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/brokerd/brokerd/runtime/quant"
)

// isasHere lists the dequant.c variants this CPU can run.
func isasHere() []isa {
	out := []isa{isaBase}
	for _, v := range []isa{isaAVX2, isaAVX512} {
		if v <= dequantISA() {
			out = append(out, v)
		}
	}
	return out
}

// TestDequantizeRowMatchesQuant: dequant.c gives runtime/quant's bits (which
// are ggml's, runtime/quant's tests check that against libggml-base.so) for
// every type and every instruction-set variant this CPU has, on random
// bytes: any scale bits (NaN, infinite, subnormal, negative), every 6-bit
// scale and min, every high bit, and block counts that do not fill a vector.
func TestDequantizeRowMatchesQuant(t *testing.T) {
	t.Logf("variants here: %v (auto picks %v)", isasHere(), dequantISA())
	for _, typ := range quant.Types() {
		in, _ := typ.Info()
		rng := rand.New(rand.NewPCG(11, uint64(typ)))
		for _, blocks := range []int{1, 2, 3, 7, 16, 33, 256} {
			src := make([]byte, blocks*in.BlockBytes)
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			if blocks == 2 {
				clear(src) // all-zero blocks: signed zeros must match too
			}
			n := blocks * in.BlockElems
			want := make([]float32, n)
			if err := quant.Dequantize(typ, src, want); err != nil {
				t.Fatal(err)
			}
			for _, v := range append(isasHere(), isaAuto) {
				got := make([]float32, n)
				if err := dequantizeRow(typ, src, got, v); err != nil {
					t.Fatalf("%v %v: %v", typ, v, err)
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%v %v, %d blocks: element %d is %#08x, runtime/quant gives %#08x",
							typ, v, blocks, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
					}
				}
			}
		}
	}
}

// TestDequantizeRowF16AllBits: every half, through the F16 row of each
// variant (the vector form of ggml's conversion), as runtime/quant.
func TestDequantizeRowF16AllBits(t *testing.T) {
	src := make([]byte, 2<<16)
	for h := 0; h < 1<<16; h++ {
		src[2*h], src[2*h+1] = byte(h), byte(h>>8)
	}
	for _, v := range isasHere() {
		got := make([]float32, 1<<16)
		if err := dequantizeRow(quant.F16, src, got, v); err != nil {
			t.Fatal(err)
		}
		for h := range got {
			if w := quant.F16ToF32(uint16(h)); math.Float32bits(got[h]) != math.Float32bits(w) {
				t.Fatalf("%v: half %#04x is %#08x, runtime/quant gives %#08x", v, h, math.Float32bits(got[h]), math.Float32bits(w))
			}
		}
	}
}

// TestDequantizeRowRefuses: bad lengths and unknown types are errors that
// write nothing; a variant the CPU lacks is an error.
func TestDequantizeRowRefuses(t *testing.T) {
	for _, typ := range quant.Types() {
		in, _ := typ.Info()
		for _, c := range []struct{ src, dst int }{
			{in.BlockBytes - 1, in.BlockElems}, {in.BlockBytes + 1, in.BlockElems}, {0, in.BlockElems},
			{in.BlockBytes, 0}, {2 * in.BlockBytes, in.BlockElems}, {3 * in.BlockBytes, 3*in.BlockElems - 1},
		} {
			dst := make([]float32, c.dst)
			for i := range dst {
				dst[i] = 42
			}
			err := dequantizeRow(typ, make([]byte, c.src), dst, isaAuto)
			if !errors.Is(err, quant.ErrLength) {
				t.Errorf("%v: %d bytes into %d elements: %v, want ErrLength", typ, c.src, c.dst, err)
			}
			for i := range dst {
				if dst[i] != 42 {
					t.Fatalf("%v: a refused call wrote element %d", typ, i)
				}
			}
		}
		if err := dequantizeRow(typ, nil, nil, isaAuto); err != nil {
			t.Errorf("%v: nothing: %v", typ, err)
		}
	}
	for _, typ := range []quant.Type{4, 9, 10, 11, 15, 31, 1 << 20, math.MaxUint32} {
		if err := dequantizeRow(typ, make([]byte, 64), make([]float32, 32), isaAuto); !errors.Is(err, quant.ErrUnsupported) {
			t.Errorf("%v: %v, want ErrUnsupported", typ, err)
		}
	}
	if dequantISA() < isaAVX512 {
		if err := dequantizeRow(quant.Q8_0, make([]byte, 34), make([]float32, 32), isaAVX512); err == nil {
			t.Error("avx512 variant ran on a CPU without it")
		}
	}
	if err := dequantizeRow(quant.Q8_0, make([]byte, 34), make([]float32, 32), isa(7)); err == nil {
		t.Error("variant 7 accepted")
	}
}

// BenchmarkDequantizeRow: 1 Mi elements of each type, dequant.c (each
// variant) against runtime/quant; SetBytes counts the f32 written.
func BenchmarkDequantizeRow(b *testing.B) {
	const n = 1 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	for _, typ := range quant.Types() {
		in, _ := typ.Info()
		src := make([]byte, n/in.BlockElems*in.BlockBytes)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		dst := make([]float32, n)
		b.Run(typ.String()+"/go", func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				if err := quant.Dequantize(typ, src, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, v := range isasHere() {
			b.Run(fmt.Sprintf("%v/c-%v", typ, v), func(b *testing.B) {
				b.SetBytes(4 * n)
				for b.Loop() {
					if err := dequantizeRow(typ, src, dst, v); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
