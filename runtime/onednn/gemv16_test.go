package onednn

import (
	"fmt"
	"testing"

	"github.com/brokerd/brokerd/runtime"
)

// TestGemv16 checks bf16-weight products on both sides of gemv16Rows (one
// row on gemv_bf16.c or bd_qgemm, more on oneDNN with row-major weights),
// and with the bound raised every row count of the row kernels (1 to 8,
// and groups of 8 after), with f32 and bf16 outputs, a bias and a
// residual, against float64 on the operands as the device holds them.
func TestGemv16(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	if reason := d.BF16(); reason != nil {
		t.Skipf("bf16 unsupported on this CPU: %v", reason)
	}
	r := newRand(t)
	const k, n = 70, 37
	for _, bound := range []int{defaultGemv16Rows, 18} {
		d.gemv16Rows = bound
		// The planner's rules: bf16 weights take bf16 activations; a residual
		// is f32 and so is the output then.
		for _, out := range floatTypes {
			for _, m := range []int{1, 2, 3, 4, 5, 8, 9, 16, 17, 40} {
				for _, ins := range [][]string{{"a", "w"}, {"a", "w", "b"}, {"a", "w", "b", "r"}} {
					if len(ins) == 4 && out == runtime.BF16 {
						continue
					}
					t.Run(fmt.Sprintf("bound=%d/out=%s/m=%d/%d-inputs", bound, out, m, len(ins)), func(t *testing.T) {
						a, w, b, res := randVec(r, m*k), randVec(r, n*k), randVec(r, n), randVec(r, m*n)
						op := runtime.Op{Kind: runtime.OpMatMul, In: ins, Out: "y", TransB: true}
						if out == runtime.BF16 {
							op.DType = runtime.BF16
						}
						inputs := []input{
							{name: "a", dt: runtime.BF16, shape: []int{m, k}, f: a},
							{name: "w", dt: runtime.BF16, shape: []int{n, k}, f: w},
							f32In("b", b, n),
							f32In("r", res, m, n),
						}[:len(ins)]
						got := runTyped(t, d, &runtime.Graph{Ops: []runtime.Op{op}}, inputs, out, "y", []int{m, n})
						var bias []float64
						if len(ins) >= 3 {
							bias = to64(b)
						}
						want := refMatMul(roundBF16(a), m, k, roundBF16(w), n, true, bias, runtime.ActNone)
						if len(ins) == 4 {
							for i, v := range res {
								want[i] += float64(v)
							}
						}
						tol := 1e-5
						if out == runtime.BF16 {
							tol = tolBF16
						}
						checkClose(t, got, want, tol)
					})
				}
			}
		}
	}
}

// TestGemv16Threads runs bd_gemv_bf16's threaded split with more threads
// than W's rows give work to (37 rows: two parts of at least 16): the idle
// threads must write nothing, the others every row.
func TestGemv16Threads(t *testing.T) {
	for _, threads := range []int{2, 3, 8} {
		d := openTest(t, runtime.DeviceSpec{Threads: threads})
		if reason := d.BF16(); reason != nil {
			t.Skipf("bf16 unsupported on this CPU: %v", reason)
		}
		r := newRand(t)
		const k, n, m = 256, 37, 40 // m·n·k past bd_gemv_bf16's threshold for threads
		d.gemv16Rows = m + 1
		a, w := randVec(r, m*k), randVec(r, n*k)
		op := runtime.Op{Kind: runtime.OpMatMul, In: []string{"a", "w"}, Out: "y", TransB: true}
		got := runTyped(t, d, &runtime.Graph{Ops: []runtime.Op{op}}, []input{
			{name: "a", dt: runtime.BF16, shape: []int{m, k}, f: a},
			{name: "w", dt: runtime.BF16, shape: []int{n, k}, f: w},
		}, runtime.F32, "y", []int{m, n})
		checkClose(t, got, refMatMul(roundBF16(a), m, k, roundBF16(w), n, true, nil, runtime.ActNone), 1e-5)
	}
}

// TestGemv16WeightsStayRowMajor runs one bound bf16 weight buffer through
// a prefill-sized product, a decode-sized one and the prefill again: the
// weights must read the same each time (oneDNN must not have packed them
// under bd_qgemm).
func TestGemv16WeightsStayRowMajor(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	if reason := d.BF16(); reason != nil {
		t.Skipf("bf16 unsupported on this CPU: %v", reason)
	}
	r := newRand(t)
	ctx := t.Context()
	const k, n = 64, 48
	wv := randVec(r, n*k)
	w, err := d.Alloc(runtime.BF16, n, k)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(w)
	if err := d.CopyIn(ctx, w, wv); err != nil {
		t.Fatal(err)
	}
	g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"a", "w"}, Out: "y", TransB: true}}}
	for _, m := range []int{64, 1, 64, 3} {
		a := randVec(r, m*k)
		ab, err := d.Alloc(runtime.BF16, m, k)
		if err != nil {
			t.Fatal(err)
		}
		yb, err := d.Alloc(runtime.F32, m, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.CopyIn(ctx, ab, a); err != nil {
			t.Fatal(err)
		}
		if err := d.Run(ctx, g, map[string]runtime.Buffer{"a": ab, "w": w, "y": yb}); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, m*n)
		if err := d.CopyOut(ctx, got, yb); err != nil {
			t.Fatal(err)
		}
		d.Free(ab)
		d.Free(yb)
		checkClose(t, got, refMatMul(roundBF16(a), m, k, roundBF16(wv), n, true, nil, runtime.ActNone), 1e-5)
	}
}
