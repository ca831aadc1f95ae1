package onednn

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
)

// relaid is a copy of weights of type q (n rows of k) in x16Type's layout.
func relaid(t *testing.T, q quant.Type, w []byte, n, k int) []byte {
	t.Helper()
	p := bytes.Clone(w)
	if err := x16Relayout(q, unsafe.Pointer(&p[0]), int64(n), int64(k), true, 3); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestX16Relayout: for each type, the relayout moves the bytes (a changed layout), back
// gives the weights bit for bit, a row read from the tiles is ggml's
// dequantized row, and sizes that are not whole tiles or blocks (or rows
// outside the table) are refused with the weights untouched.
func TestX16Relayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 16))
	for _, q := range x16Types {
		in, _ := q.Info()
		bk := in.BlockElems
		for _, c := range []struct{ n, k int }{{16, bk}, {48, 3 * bk}, {32, 1024}} {
			w := randQuantWeights(rng, q, c.n, c.k)
			p := relaid(t, q, w, c.n, c.k)
			if bytes.Equal(p, w) {
				t.Fatalf("%v %dx%d: the relayout changed nothing", q, c.n, c.k)
			}
			// Block 0 of row 1: its scale after row 0's (Q6_K's d ends
			// its block).
			dAt := 0
			if q == quant.Q6_K {
				dAt = 208
			}
			if p[2] != w[c.k/bk*in.BlockBytes+dAt] {
				t.Fatalf("%v %dx%d: row 1's first scale is not where the layout puts it", q, c.n, c.k)
			}
			// Each row read from the tiles is ggml's row (a gather from a
			// relaid table).
			want := make([]float32, c.n*c.k)
			if err := quant.Dequantize(q, w, want); err != nil {
				t.Fatal(err)
			}
			row := make([]float32, c.k)
			for id := range c.n {
				if err := x16Row(q, unsafe.Pointer(&p[0]), int64(c.n), int64(c.k), int64(id), unsafe.Pointer(&row[0])); err != nil {
					t.Fatal(err)
				}
				for e, v := range row {
					if math.Float32bits(v) != math.Float32bits(want[id*c.k+e]) {
						t.Fatalf("%v %dx%d: row %d [%d] read relaid = %g, ggml's %g", q, c.n, c.k, id, e, v, want[id*c.k+e])
					}
				}
			}
			for _, id := range []int64{-1, int64(c.n)} {
				if err := x16Row(q, unsafe.Pointer(&p[0]), int64(c.n), int64(c.k), id, unsafe.Pointer(&row[0])); !errors.Is(err, errQgemmSize) {
					t.Errorf("%v: row %d of %d: %v, want a size error", q, id, c.n, err)
				}
			}
			back := bytes.Clone(p)
			if err := x16Relayout(q, unsafe.Pointer(&back[0]), int64(c.n), int64(c.k), false, 2); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, w) {
				t.Fatalf("%v %dx%d: relaid and back differs from the weights", q, c.n, c.k)
			}
		}
		w := randQuantWeights(rng, q, 24, 2*bk)
		orig := bytes.Clone(w)
		for _, c := range []struct{ n, k int }{{24, 2 * bk}, {16, bk / 2}, {16, 3 * bk / 2}, {0, 2 * bk}, {16, 0}, {-16, 2 * bk}} {
			if err := x16Relayout(q, unsafe.Pointer(&w[0]), int64(c.n), int64(c.k), true, 2); !errors.Is(err, errQgemmSize) {
				t.Errorf("%v %d rows of %d: %v, want a size error", q, c.n, c.k, err)
			}
		}
		if !bytes.Equal(w, orig) {
			t.Errorf("%v: a refused relayout changed the weights", q)
		}
	}
	w := randQuantWeights(rng, quant.F16, 16, 256)
	if err := x16Relayout(quant.F16, unsafe.Pointer(&w[0]), 16, 256, true, 1); !errors.Is(err, quant.ErrUnsupported) {
		t.Errorf("F16: %v, want unsupported", err)
	}
}

// TestQgemmX16: products by relaid weights of each type, every variant
// this CPU has, 1 to 33 rows (every row count of the VNNI kernel's tile, and
// several groups), 1 to 8 threads, within TestQgemmMatchesFloat64's bounds
// of the float64 products by the original weights; one call's parts as
// the single calls bit for bit, with biases and strides (Q5_1: fifth bits
// and mins); rows that are not
// whole tiles refused.
func TestQgemmX16(t *testing.T) {
	for _, q := range x16Types {
		ks := []int{32, 288, 1024}
		if in, _ := q.Info(); in.BlockElems == 256 {
			ks = []int{256, 768}
		}
		for _, k := range ks {
			rng := rand.New(rand.NewPCG(16, uint64(k)+uint64(q)<<16))
			const n = 48
			w := randQuantWeights(rng, q, n, k)
			p := relaid(t, q, w, n, k)
			for _, m := range []int{1, 2, 3, 5, 8, 15, 16, 17, 33} {
				x := randActs(rng, m, k)
				ref := newQgemmRef(t, q, w, n, k, x, m)
				for _, v := range append(qgemmISAsHere(), isaAuto) {
					for _, threads := range []int{1, 3, 8} {
						y := make([]float32, m*n)
						if err := qgemm(x16Type(q), p, n, k, x, m, y, n, v, threads); err != nil {
							t.Fatalf("%v k=%d m=%d %v: %v", q, k, m, v, err)
						}
						for i, got := range y {
							if de, tolE, df, tolF := ref.bounds(q, k, i, got); !(de <= tolE) || !(df <= tolF) {
								t.Fatalf("%v k=%d m=%d %v threads=%d: y[%d][%d] = %g; Σw·xhat = %g (off %g, bound %g), Σw·x = %g (off %g, bound %g)",
									q, k, m, v, threads, i/n, i%n, got, ref.exact[i], de, tolE, ref.float[i], df, tolF)
							}
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
		ws[i] = relaid(t, quant.Q5_1, randQuantWeights(rng, quant.Q5_1, n, k), n, k)
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
				if err := qgemmParts(x16Type(quant.Q5_1), parts, k, unsafe.Pointer(&x[0]), int64(m), v, threads, nil, 0); err != nil {
					t.Fatalf("m=%d %v threads=%d: %v", m, v, threads, err)
				}
				for i, n := range ns {
					want := make([]float32, m*n)
					if err := qgemm(x16Type(quant.Q5_1), ws[i], n, k, x, m, want, n, v, 1); err != nil {
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
	if err := qgemm(x16Type(quant.Q8_0), w, 24, k, make([]float32, k), 1, y, 24, isaAuto, 1); !errors.Is(err, errQgemmSize) {
		t.Errorf("24 relaid rows: %v, want a size error", err)
	}
	if slices.ContainsFunc(y, func(v float32) bool { return v != 42 }) {
		t.Error("a refused call wrote an output")
	}
}

// TestX16ThroughRun: on a CPU with AVX-512 VNNI, a Q8_0 matmul weight of
// whole tiles is relaid on its first product and multiplied as x16Type's
// (bit-identical to the kernel on the relaid bytes, plus the bias), for
// prefill's rows as for decode's; a gather reads a relaid table (alone,
// and tied to a matmul in one graph) and leaves it relaid; CopyOut and
// CopyInRaw see GGUF's layout again, and after CopyOut the weight stays in
// it; Options.NoX16 keeps every weight as stored.
func TestX16ThroughRun(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{ID: "cpu:0", Threads: 2})
	if !d.x16 {
		t.Skipf("qgemm runs %v here: the relayout is for AVX-512 VNNI (TestQgemmX16 covers its portable kernel)", qgemmISA())
	}
	// On a CPU with AMX the weights are relaid only with Options.AMXRelaid.
	d.amxX16 = d.qAMXRows != 0
	rng := rand.New(rand.NewPCG(16, 3))
	const n, k = 48, 256
	newWeight := func(dev runtime.Device) (runtime.Buffer, []byte) {
		w := randQuantWeights(rng, quant.Q8_0, n, k)
		wb, err := dev.Alloc(runtime.Q8_0, n, k)
		if err != nil {
			t.Fatal(err)
		}
		if err := dev.(runtime.RawDevice).CopyInRaw(t.Context(), wb, 0, w); err != nil {
			t.Fatal(err)
		}
		return wb, w
	}
	bias := randActs(rng, 1, n)
	bb := upload(t, d, runtime.F32, bias, n)
	// product runs y = x·Wᵀ + bias on dev for m rows and returns y and x.
	product := func(dev runtime.Device, wb runtime.Buffer, m int) ([]float32, []float32) {
		x := randActs(rng, m, k)
		xb := upload(t, dev, runtime.F32, x, m, k)
		defer dev.Free(xb)
		bb := upload(t, dev, runtime.F32, bias, n)
		defer dev.Free(bb)
		yb, err := dev.Alloc(runtime.F32, m, n)
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Free(yb)
		g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"x", "w", "b"}, Out: "y", TransB: true}}}
		if err := dev.Run(t.Context(), g, map[string]runtime.Buffer{"x": xb, "w": wb, "b": bb, "y": yb}); err != nil {
			t.Fatal(err)
		}
		y := make([]float32, m*n)
		if err := dev.CopyOut(t.Context(), y, yb); err != nil {
			t.Fatal(err)
		}
		return y, x
	}
	// kernel is the product by qgemm on w as type q, plus the bias.
	kernel := func(q quant.Type, w []byte, x []float32, m int) []float32 {
		y := make([]float32, m*n)
		if err := qgemm(q, w, n, k, x, m, y, n, isaAuto, d.threads); err != nil {
			t.Fatal(err)
		}
		for i := range y {
			y[i] += bias[i%n]
		}
		return y
	}
	isX16 := func(b runtime.Buffer) bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return b.(*buffer).x16
	}

	wb, w := newWeight(d)
	for _, m := range []int{1, 3, 16, 20} {
		y, x := product(d, wb, m)
		if !isX16(wb) {
			t.Fatalf("m=%d: the weight was not relaid", m)
		}
		if !slices.Equal(y, kernel(x16Type(quant.Q8_0), relaid(t, quant.Q8_0, w, n, k), x, m)) {
			t.Fatalf("m=%d: Run differs from the relaid kernel plus the bias", m)
		}
	}
	// Prefill's rows take the same kernel (no dequantized slices).
	d.qPrefillRows = 4
	const m = 5
	y, x := product(d, wb, m)
	d.qPrefillRows = defaultQPrefillRows
	if !slices.Equal(y, kernel(x16Type(quant.Q8_0), relaid(t, quant.Q8_0, w, n, k), x, m)) {
		t.Fatal("prefill rows: Run differs from the relaid kernel plus the bias")
	}
	// With AMX, from qamxX16Rows rows qamx multiplies the relaid weights:
	// its panels are GGUF's (TestQamxPanelX16), so the product is qamx's on
	// the weights as stored, bit for bit.
	if d.qAMXRows != 0 {
		const m = qamxX16Rows + 8
		y, x := product(d, wb, m)
		want := make([]float32, m*n)
		if err := qamxSlices(quant.Q8_0, w, n, k, x, m, want, n, d.threads, 0); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			want[i] += bias[i%n]
		}
		if !isX16(wb) || !slices.Equal(y, want) {
			t.Fatalf("%d rows on AMX: relaid %v, or Run differs from qamx on the weights as stored plus the bias", m, isX16(wb))
		}
	}
	wf := make([]float32, n*k)
	if err := quant.Dequantize(quant.Q8_0, w, wf); err != nil {
		t.Fatal(err)
	}
	// CopyOut dequantizes GGUF's layout, and the weight stays in it.
	got := make([]float32, n*k)
	if err := d.CopyOut(t.Context(), got, wb); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, wf) {
		t.Fatal("CopyOut of a relaid weight differs from its dequantized bytes")
	}
	if y, x := product(d, wb, 1); isX16(wb) || !slices.Equal(y, kernel(quant.Q8_0, w, x, 1)) {
		t.Fatalf("after CopyOut: relaid %v, or the product differs from Q8_0's kernel", isX16(wb))
	}

	// A gather reads a relaid table from its tiles, and the table stays
	// relaid: alone, and in one graph with the matmul it feeds (a tied
	// embedding: the gathered rows times the table).
	wb2, w2 := newWeight(d)
	product(d, wb2, 1)
	if !isX16(wb2) {
		t.Fatal("the second weight was not relaid")
	}
	wf2 := make([]float32, n*k)
	if err := quant.Dequantize(quant.Q8_0, w2, wf2); err != nil {
		t.Fatal(err)
	}
	idx, err := d.Alloc(runtime.I32, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.CopyInInt32(t.Context(), idx, []int32{17, 2}); err != nil {
		t.Fatal(err)
	}
	ob, err := d.Alloc(runtime.F32, 2, k)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := d.Alloc(runtime.F32, 2, n)
	if err != nil {
		t.Fatal(err)
	}
	wantRows := append(slices.Clone(wf2[17*k:18*k]), wf2[2*k:3*k]...)
	gather := runtime.Op{Kind: runtime.OpGather, In: []string{"w", "i"}, Out: "o"}
	for _, g := range []*runtime.Graph{
		{Ops: []runtime.Op{gather}},
		{Ops: []runtime.Op{gather, {Kind: runtime.OpMatMul, In: []string{"o", "w"}, Out: "l", TransB: true}}},
	} {
		bind := map[string]runtime.Buffer{"w": wb2, "i": idx, "o": ob}
		if len(g.Ops) == 2 {
			bind["l"] = lb
		}
		if err := d.Run(t.Context(), g, bind); err != nil {
			t.Fatal(err)
		}
		if !isX16(wb2) {
			t.Fatalf("%d ops: the gather put the table back in GGUF's layout", len(g.Ops))
		}
		rows := make([]float32, 2*k)
		if err := d.CopyOut(t.Context(), rows, ob); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(rows, wantRows) {
			t.Fatalf("%d ops: a gather from a relaid table differs from its dequantized rows", len(g.Ops))
		}
		if len(g.Ops) == 2 {
			logits := make([]float32, 2*n)
			if err := d.CopyOut(t.Context(), logits, lb); err != nil {
				t.Fatal(err)
			}
			want := make([]float32, 2*n)
			if err := qgemm(x16Type(quant.Q8_0), relaid(t, quant.Q8_0, w2, n, k), n, k, rows, 2, want, n, isaAuto, d.threads); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(logits, want) {
				t.Fatal("the tied matmul differs from the relaid kernel on the gathered rows")
			}
		}
	}

	// CopyInRaw over a relaid weight: later products use the new bytes.
	wb3, _ := newWeight(d)
	product(d, wb3, 1)
	w3 := randQuantWeights(rng, quant.Q8_0, n, k)
	if err := d.CopyInRaw(t.Context(), wb3, 0, w3[:len(w3)/2]); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyInRaw(t.Context(), wb3, int64(len(w3)/2), w3[len(w3)/2:]); err != nil {
		t.Fatal(err)
	}
	if y, x := product(d, wb3, 2); !slices.Equal(y, kernel(x16Type(quant.Q8_0), relaid(t, quant.Q8_0, w3, n, k), x, 2)) {
		t.Fatal("after CopyInRaw: the product differs from the kernel on the new bytes")
	}
	for _, b := range []runtime.Buffer{wb, wb2, wb3, bb, idx, ob, lb} {
		d.Free(b)
	}

	// NoX16: the weight stays as stored.
	dev, err := New(Options{NoX16: true}).Open(t.Context(), runtime.DeviceSpec{ID: "cpu:0", Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	wb4, w4 := newWeight(dev)
	y4, x4 := product(dev, wb4, 3)
	if isX16(wb4) || !slices.Equal(y4, kernel(quant.Q8_0, w4, x4, 3)) {
		t.Fatal("with NoX16: the weight was relaid, or the product differs from Q8_0's kernel")
	}
}

// TestQamxPanelX16: qamx's panels of relaid weights (what its tile unit
// multiplies on an AMX CPU) are, bf16 for bf16, its panels of the same
// weights in GGUF's layout, whole or filled a few rows' share at a time
// as its overlapped passes fill them; k of an odd number of blocks
// included (a last unit of one block). The decoders need AVX512-BF16,
// not AMX, so this runs on any CPU with it.
func TestQamxPanelX16(t *testing.T) {
	for _, q := range x16Types {
		if !qamxSupports(x16Type(q)) {
			continue // Q6_K relaid: qgemm's kernel at every row count
		}
		ks := []int{32, 96, 1024}
		if in, _ := q.Info(); in.BlockElems == 256 {
			ks = []int{256, 768}
		}
		for _, k := range ks {
			rng := rand.New(rand.NewPCG(17, uint64(k)+uint64(q)<<16))
			const n = 48
			w := randQuantWeights(rng, q, n, k)
			p := relaid(t, q, w, n, k)
			for panel := range n / 16 {
				want, err := qamxPanel(q, w, n, k, panel, 1)
				if errors.Is(err, errNoAMX) {
					t.Skip("this CPU lacks AVX512-BF16, which qamx's decoders use")
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, steps := range []int{1, 3, 16} {
					got, err := qamxPanel(x16Type(q), p, n, k, panel, steps)
					if err != nil {
						t.Fatal(err)
					}
					for i := range got {
						if got[i] != want[i] {
							t.Fatalf("%v k=%d panel %d, %d steps: row %d [%d] = %#04x relaid, %#04x in GGUF's layout",
								q, k, panel, steps, i/k, i%k, got[i], want[i])
						}
					}
				}
			}
		}
		in, _ := q.Info()
		w := relaid(t, q, randQuantWeights(rand.New(rand.NewPCG(17, 1)), q, 32, in.BlockElems), 32, in.BlockElems)
		if _, err := qamxPanel(x16Type(q), w[:len(w)/2], 16, in.BlockElems, 0, 1); err != nil && !errors.Is(err, errNoAMX) {
			t.Errorf("%v: a 16-row panel: %v", q, err)
		}
		if _, err := qamxPanel(x16Type(q), w[:len(w)/32*24], 24, in.BlockElems, 0, 1); !errors.Is(err, errQgemmSize) && !errors.Is(err, errNoAMX) {
			t.Errorf("%v relaid: 24 rows (not whole tiles): %v, want a size error", q, err)
		}
	}
}

// BenchmarkQamxPanel times qamx's panel decoding alone (the part of its
// prefill the vector units do) for a matrix in GGUF's layout and relaid:
// all its panels, one thread.
func BenchmarkQamxPanel(b *testing.B) {
	for _, c := range []struct {
		q    quant.Type
		n, k int
	}{{quant.Q8_0, 4864, 896}, {quant.Q5_0, 896, 4864}, {quant.Q4_K, 2816, 1024}} {
		rng := rand.New(rand.NewPCG(1, 2))
		w := randQuantWeights(rng, c.q, c.n, c.k)
		p := bytes.Clone(w)
		if err := x16Relayout(c.q, unsafe.Pointer(&p[0]), int64(c.n), int64(c.k), true, 1); err != nil {
			b.Fatal(err)
		}
		for _, l := range []struct {
			name string
			q    quant.Type
			w    []byte
		}{{"gguf", c.q, w}, {"relaid", x16Type(c.q), p}} {
			b.Run(fmt.Sprintf("%v/%dx%d/%s", c.q, c.n, c.k, l.name), func(b *testing.B) {
				for b.Loop() {
					for panel := range c.n / 16 {
						if _, err := qamxPanel(l.q, l.w, c.n, c.k, panel, 1); err != nil {
							b.Skip(err)
						}
					}
				}
				b.ReportMetric(float64(c.n*c.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gweights/s")
			})
		}
	}
}

// BenchmarkX16Relayout times the relayout a weight takes at load (the
// warm-up's first product), one thread, for each relaid type: bytes of
// weights relaid a second.
func BenchmarkX16Relayout(b *testing.B) {
	const n, k = 2816, 1024
	for _, q := range x16Types {
		w := randQuantWeights(rand.New(rand.NewPCG(1, 3)), q, n, k)
		b.Run(q.String(), func(b *testing.B) {
			for b.Loop() {
				if err := x16Relayout(q, unsafe.Pointer(&w[0]), n, k, true, 1); err != nil {
					b.Fatal(err)
				}
				if err := x16Relayout(q, unsafe.Pointer(&w[0]), n, k, false, 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(2*float64(len(w))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}
