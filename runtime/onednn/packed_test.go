package onednn

import (
	"slices"
	"testing"

	"github.com/brokerd/brokerd/runtime"
)

// TestPackedWeights: a matmul packs its weights in place into the kernel's
// layout; results match the float64 reference; the buffer reads back
// row-major; another op reading it gets row-major contents, and it stays
// row-major after that; new contents copied in are used; no memory is added.
func TestPackedWeights(t *testing.T) {
	for _, tc := range []struct {
		name    string
		m, k, n int
		packs   bool // the layout fits the weights' allocation
	}{
		{"fits", 16, 64, 128, true},
		{"one row", 1, 128, 64, true},
		{"padded layout falls back", 4, 64, 100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := openTest(t, runtime.DeviceSpec{})
			r := newRand(t)
			ctx := t.Context()
			x, w := randVec(r, tc.m*tc.k), randVec(r, tc.n*tc.k)
			alloc := func(data []float32, shape ...int) runtime.Buffer {
				b, err := d.Alloc(runtime.F32, shape...)
				if err != nil {
					t.Fatal(err)
				}
				if data != nil {
					if err := d.CopyIn(ctx, b, data); err != nil {
						t.Fatal(err)
					}
				}
				return b
			}
			xb, wb, yb := alloc(x, tc.m, tc.k), alloc(w, tc.n, tc.k), alloc(nil, tc.m, tc.n)
			mm := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y", TransB: true}}}
			bind := map[string]runtime.Buffer{"x": xb, "w": wb, "y": yb}
			run := func(want []float64) {
				t.Helper()
				if err := d.Run(ctx, mm, bind); err != nil {
					t.Fatal(err)
				}
				got := make([]float32, tc.m*tc.n)
				if err := d.CopyOut(ctx, got, yb); err != nil {
					t.Fatal(err)
				}
				checkClose(t, got, want, tolF32)
			}
			used := d.MemoryUsed()
			run(refMatMul(to64(x), tc.m, tc.k, to64(w), tc.n, true, nil, runtime.ActNone))
			run(refMatMul(to64(x), tc.m, tc.k, to64(w), tc.n, true, nil, runtime.ActNone))
			d.mu.Lock()
			packed := wb.(*buffer).packed != nil
			d.mu.Unlock()
			if packed != tc.packs {
				t.Fatalf("weights packed: %v, want %v", packed, tc.packs)
			}
			if got := d.MemoryUsed(); got != used {
				t.Errorf("MemoryUsed %d after packing, %d before", got, used)
			}
			// Read back: row-major, as copied in.
			back := make([]float32, len(w))
			if err := d.CopyOut(ctx, back, wb); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(back, w) {
				t.Fatal("weights read back differ from those copied in")
			}
			// Packed again by the matmul, then read by another op: row-major.
			run(refMatMul(to64(x), tc.m, tc.k, to64(w), tc.n, true, nil, runtime.ActNone))
			relu := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpReLU, In: []string{"w"}, Out: "z"}}}
			zb := alloc(nil, tc.n, tc.k)
			if err := d.Run(ctx, relu, map[string]runtime.Buffer{"w": wb, "z": zb}); err != nil {
				t.Fatal(err)
			}
			z := make([]float32, len(w))
			if err := d.CopyOut(ctx, z, zb); err != nil {
				t.Fatal(err)
			}
			checkClose(t, z, refPointwise(to64(w), runtime.ActReLU), 0)
			// Read otherwise once, the weights stay row-major: no rewriting
			// back and forth between runs that use them differently.
			run(refMatMul(to64(x), tc.m, tc.k, to64(w), tc.n, true, nil, runtime.ActNone))
			d.mu.Lock()
			packed = wb.(*buffer).packed != nil
			d.mu.Unlock()
			if packed {
				t.Error("weights packed again after another op read them")
			}
			// New weights copied in are the ones used.
			w2 := randVec(r, len(w))
			if err := d.CopyIn(ctx, wb, w2); err != nil {
				t.Fatal(err)
			}
			run(refMatMul(to64(x), tc.m, tc.k, to64(w2), tc.n, true, nil, runtime.ActNone))
		})
	}
}
