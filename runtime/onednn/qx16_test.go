package onednn

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/brokerd/brokerd/runtime/quant"
)

// relaid is a copy of Q8_0 weights (n rows of k) in q8x16's layout.
func relaid(t *testing.T, w []byte, n, k int) []byte {
	t.Helper()
	p := bytes.Clone(w)
	if err := q8x16Relayout(unsafe.Pointer(&p[0]), int64(n), int64(k), true, 3); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestQ8x16Relayout: the relayout moves every byte (a changed layout), back
// gives the weights bit for bit, bd_dequant_rows reads the relaid form as
// ggml reads the original, and sizes that are not whole tiles or blocks
// are refused with the weights untouched.
func TestQ8x16Relayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 16))
	for _, c := range []struct{ n, k int }{{16, 32}, {48, 96}, {32, 1024}} {
		w := randQuantWeights(rng, quant.Q8_0, c.n, c.k)
		p := relaid(t, w, c.n, c.k)
		if bytes.Equal(p, w) {
			t.Fatalf("%dx%d: the relayout changed nothing", c.n, c.k)
		}
		// Block 0 of row 1: its scale after row 0's, its first four quants
		// (XOR 0x80) after row 0's four.
		if p[2] != w[c.k/32*34] || p[32+4] != w[c.k/32*34+2]^0x80 {
			t.Fatalf("%dx%d: row 1's first block is not where the layout puts it", c.n, c.k)
		}
		back := bytes.Clone(p)
		if err := q8x16Relayout(unsafe.Pointer(&back[0]), int64(c.n), int64(c.k), false, 2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, w) {
			t.Fatalf("%dx%d: relaid and back differs from the weights", c.n, c.k)
		}
		want := make([]float32, c.n*c.k)
		if err := quant.Dequantize(quant.Q8_0, w, want); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, c.n*c.k)
		if err := dequantRows(q8x16, p, c.n, c.k, got, 2); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%dx%d: dequantized relaid [%d] = %g, ggml's %g", c.n, c.k, i, got[i], want[i])
			}
		}
	}
	w := randQuantWeights(rng, quant.Q8_0, 24, 64)
	orig := bytes.Clone(w)
	for _, c := range []struct{ n, k int }{{24, 64}, {16, 48}, {0, 64}, {16, 0}, {-16, 64}} {
		if err := q8x16Relayout(unsafe.Pointer(&w[0]), int64(c.n), int64(c.k), true, 2); !errors.Is(err, errQgemmSize) {
			t.Errorf("%d rows of %d: %v, want a size error", c.n, c.k, err)
		}
	}
	if !bytes.Equal(w, orig) {
		t.Error("a refused relayout changed the weights")
	}
	if err := dequantRows(q8x16, w, 8, 64, make([]float32, 8*64), 1); err == nil {
		t.Error("dequantizing 8 relaid rows (not a tile) was not refused")
	}
}

// TestQgemmX16: products by relaid Q8_0 weights, every variant this CPU
// has, 1 to 33 rows (every row count of the VNNI kernel's tile, and
// several groups), 1 to 8 threads, within TestQgemmMatchesFloat64's bounds
// of the float64 products by the original weights; one call's parts as
// the single calls bit for bit, with biases and strides; rows that are not
// whole tiles refused.
func TestQgemmX16(t *testing.T) {
	for _, k := range []int{32, 288, 1024} {
		rng := rand.New(rand.NewPCG(16, uint64(k)))
		const n = 48
		w := randQuantWeights(rng, quant.Q8_0, n, k)
		p := relaid(t, w, n, k)
		for _, m := range []int{1, 2, 3, 5, 8, 15, 16, 17, 33} {
			x := randActs(rng, m, k)
			ref := newQgemmRef(t, quant.Q8_0, w, n, k, x, m)
			for _, v := range append(qgemmISAsHere(), isaAuto) {
				for _, threads := range []int{1, 2, 3, 8} {
					y := make([]float32, m*n)
					if err := qgemm(q8x16, p, n, k, x, m, y, n, v, threads); err != nil {
						t.Fatalf("k=%d m=%d %v: %v", k, m, v, err)
					}
					for i, got := range y {
						g := float64(got)
						tolE := qgemmGamma(quant.Q8_0, k) * ref.mag[i]
						tolF := tolE + ref.qerr[i]
						de, df := math.Abs(g-ref.exact[i]), math.Abs(g-ref.float[i])
						if !(de <= tolE) || !(df <= tolF) {
							t.Fatalf("k=%d m=%d %v threads=%d: y[%d][%d] = %g; Σw·xhat = %g (off %g, bound %g), Σw·x = %g (off %g, bound %g)",
								k, m, v, threads, i/n, i%n, g, ref.exact[i], de, tolE, ref.float[i], df, tolF)
						}
					}
				}
			}
		}
	}

	const k = 96
	rng := rand.New(rand.NewPCG(16, 2))
	ns := []int{48, 16, 32}
	ws := make([][]byte, len(ns))
	biases := make([][]float32, len(ns))
	for i, n := range ns {
		ws[i] = relaid(t, randQuantWeights(rng, quant.Q8_0, n, k), n, k)
		if i != 1 {
			biases[i] = randActs(rng, 1, n)
		}
	}
	for _, m := range []int{1, 4, 20} {
		x := randActs(rng, m, k)
		for _, v := range qgemmISAsHere() {
			for _, threads := range []int{1, 2, 5} {
				var parts []qpart
				ys := make([][]float32, len(ns))
				for i, n := range ns {
					ldy := n + 3
					ys[i] = slices.Repeat([]float32{42}, m*ldy)
					pt := qpart{w: unsafe.Pointer(&ws[i][0]), wBytes: int64(len(ws[i])), n: int64(n), y: unsafe.Pointer(&ys[i][0]), ldy: int64(ldy)}
					if biases[i] != nil {
						pt.bias = unsafe.Pointer(&biases[i][0])
					}
					parts = append(parts, pt)
				}
				if err := qgemmParts(q8x16, parts, k, unsafe.Pointer(&x[0]), int64(m), v, threads, nil, 0); err != nil {
					t.Fatalf("m=%d %v threads=%d: %v", m, v, threads, err)
				}
				for i, n := range ns {
					want := make([]float32, m*n)
					if err := qgemm(q8x16, ws[i], n, k, x, m, want, n, v, 1); err != nil {
						t.Fatal(err)
					}
					ldy := n + 3
					for r := range m {
						for j := range ldy {
							got, w := ys[i][r*ldy+j], float32(42)
							if j < n {
								w = want[r*n+j]
								if biases[i] != nil {
									w += biases[i][j]
								}
							}
							if math.Float32bits(got) != math.Float32bits(w) {
								t.Fatalf("m=%d %v threads=%d: part %d y[%d][%d] = %g, want %g", m, v, threads, i, r, j, got, w)
							}
						}
					}
				}
			}
		}
	}
	w := randQuantWeights(rng, quant.Q8_0, 24, k)
	y := slices.Repeat([]float32{42}, 24)
	if err := qgemm(q8x16, w, 24, k, make([]float32, k), 1, y, 24, isaAuto, 1); !errors.Is(err, errQgemmSize) {
		t.Errorf("24 relaid rows: %v, want a size error", err)
	}
	if slices.ContainsFunc(y, func(v float32) bool { return v != 42 }) {
		t.Error("a refused call wrote an output")
	}
}
