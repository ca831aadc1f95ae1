package onednn

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/brokerd/brokerd/runtime"
)

var seedFlag = flag.Uint64("onednn.seed", 0, "seed for the random test inputs; 0 means the current time")

// Tolerances on relErr (norm-wise relative error against the float64
// reference).
const (
	tolF32  = 1e-5
	tolBF16 = 1e-2
)

// newRand returns a generator seeded from the clock (or -onednn.seed), and
// logs the seed so a failure can be reproduced.
func newRand(t testing.TB) *rand.Rand {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("random inputs from seed %d (rerun with -onednn.seed=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, 0x6f6e65646e6e))
}

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = r.Float32()*2 - 1
	}
	return v
}

func to64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, e := range v {
		out[i] = float64(e)
	}
	return out
}

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func openTest(t testing.TB, spec runtime.DeviceSpec) *Device {
	t.Helper()
	dev, err := New(Options{}).Open(t.Context(), spec)
	if err != nil {
		t.Fatalf("Open(%+v): %v", spec, err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev.(*Device)
}

// input is a named graph input and its values (f for float types, i for I32).
type input struct {
	name  string
	dt    runtime.DType
	shape []int
	f     []float32
	i     []int32
}

func f32In(name string, v []float32, shape ...int) input {
	return input{name: name, dt: runtime.F32, shape: shape, f: v}
}

// runGraph binds the inputs and an f32 output of outShape, runs g, and
// returns the output. Every buffer is freed before it returns. It reports
// failures as errors, so goroutines other than the test's may call it.
func runGraph(t testing.TB, d *Device, g *runtime.Graph, ins []input, out string, outShape []int) ([]float32, error) {
	ctx := t.Context()
	bind := map[string]runtime.Buffer{}
	defer func() {
		for _, b := range bind {
			d.Free(b)
		}
	}()
	if err := bindInputs(ctx, d, ins, bind); err != nil {
		return nil, err
	}
	ob, err := d.Alloc(runtime.F32, outShape...)
	if err != nil {
		return nil, err
	}
	bind[out] = ob
	if err := d.Run(ctx, g, bind); err != nil {
		return nil, err
	}
	got := make([]float32, prod(outShape))
	if err := d.CopyOut(ctx, got, ob); err != nil {
		return nil, fmt.Errorf("copy out: %w", err)
	}
	return got, nil
}

// bindInputs allocates ins on d and copies their values in, adding them
// to bind (the caller frees them, also after an error).
func bindInputs(ctx context.Context, d *Device, ins []input, bind map[string]runtime.Buffer) error {
	for _, in := range ins {
		b, err := d.Alloc(in.dt, in.shape...)
		if err != nil {
			return fmt.Errorf("alloc %q: %w", in.name, err)
		}
		bind[in.name] = b
		if in.dt == runtime.I32 {
			err = d.CopyInInt32(ctx, b, in.i)
		} else {
			err = d.CopyIn(ctx, b, in.f)
		}
		if err != nil {
			return fmt.Errorf("copy in %q: %w", in.name, err)
		}
	}
	return nil
}

// benchRun binds ins and runs a graph of ops on d once a benchmark loop.
func benchRun(b *testing.B, d *Device, ops []runtime.Op, ins []input) {
	bind := map[string]runtime.Buffer{}
	if err := bindInputs(b.Context(), d, ins, bind); err != nil {
		b.Fatal(err)
	}
	g := &runtime.Graph{Ops: ops}
	for b.Loop() {
		if err := d.Run(b.Context(), g, bind); err != nil {
			b.Fatal(err)
		}
	}
}

func checkClose(t testing.TB, got []float32, want []float64, tol float64) {
	t.Helper()
	if e := relErr(got, want); !(e <= tol) {
		n := min(len(got), len(want), 4)
		t.Errorf("relative error %.3g > %.0e; first values got %v want %v", e, tol, got[:n], want[:n])
	}
}

// checkCloseAct is checkClose at tolF32 for an f32 op with activation
// act. oneDNN's erf-form GELU carries an absolute error of up to about
// 2e-7 (seen near x = 0 and in the negative tail, where
// Φ(x) = (1 + erf(x/√2))/2 cancels), so a step whose outputs are all small
// failed the relative check (1.3e-5 on TestMatMul's [1]x17x3, seed
// 1795719070369331872): with GELU, outputs that miss it pass when each is
// within tolF32 of itself plus 1e-6.
func checkCloseAct(t testing.TB, got []float32, want []float64, act runtime.Activation) {
	t.Helper()
	if e := relErr(got, want); act != runtime.ActGELU || e <= tolF32 {
		checkClose(t, got, want, tolF32)
		return
	}
	if len(got) != len(want) {
		t.Fatalf("%d outputs, want %d", len(got), len(want))
	}
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= tolF32*math.Abs(want[i])+1e-6) {
			t.Errorf("y[%d] = %g, want %g: off %g", i, got[i], want[i], d)
		}
	}
}

var actNames = map[runtime.Activation]string{
	runtime.ActNone: "none", runtime.ActReLU: "relu", runtime.ActGELU: "gelu", runtime.ActTanh: "tanh",
}

func TestMatMul(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	// lead is In[0]'s leading dimensions (flattened to M); sizes cover 1, odd
	// sizes and sizes that are not a multiple of 16 in every position.
	shapes := []struct {
		lead []int
		k, n int
	}{
		{[]int{1}, 1, 1},
		{[]int{1}, 17, 3},
		{[]int{3}, 100, 17},
		{[]int{17}, 3, 64},
		{[]int{64}, 64, 100},
		{[]int{100}, 17, 1},
		{[]int{100}, 100, 100},
		{[]int{2, 5}, 17, 3}, // 3-D input
	}
	for _, sh := range shapes {
		for _, act := range []runtime.Activation{runtime.ActNone, runtime.ActReLU, runtime.ActGELU, runtime.ActTanh} {
			for _, transB := range []bool{false, true} {
				for _, bias := range []bool{false, true} {
					name := fmt.Sprintf("%vx%dx%d/%s/transB=%v/bias=%v", sh.lead, sh.k, sh.n, actNames[act], transB, bias)
					t.Run(name, func(t *testing.T) {
						m := prod(sh.lead)
						a := randVec(r, m*sh.k)
						w := randVec(r, sh.k*sh.n)
						wShape := []int{sh.k, sh.n}
						if transB {
							wShape = []int{sh.n, sh.k}
						}
						ins := []input{f32In("a", a, append(clone(sh.lead), sh.k)...), f32In("w", w, wShape...)}
						op := runtime.Op{Kind: runtime.OpMatMul, In: []string{"a", "w"}, Out: "y", Act: act, TransB: transB}
						var bv []float64
						if bias {
							b := randVec(r, sh.n)
							bv = to64(b)
							ins = append(ins, f32In("b", b, sh.n))
							op.In = append(op.In, "b")
						}
						got, err := runGraph(t, d, &runtime.Graph{Ops: []runtime.Op{op}}, ins, "y", append(clone(sh.lead), sh.n))
						if err != nil {
							t.Fatal(err)
						}
						want := refMatMul(to64(a), m, sh.k, to64(w), sh.n, transB, bv, act)
						checkCloseAct(t, got, want, act)
					})
				}
			}
		}
	}
}

func TestBatchMatMul(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		lead    []int // batch dimensions
		m, k, n int
		transB  bool
		scale   float32
	}{
		{[]int{1}, 1, 1, 1, false, 0},
		{[]int{3}, 17, 3, 64, false, 0.125},
		{[]int{2}, 100, 17, 3, true, 0.5},
		{[]int{5}, 1, 64, 17, true, 0},
		{[]int{2, 3}, 17, 100, 17, true, 0.25}, // [B,H,S,D] attention scores
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/%dx%dx%d/transB=%v/scale=%g", tt.lead, tt.m, tt.k, tt.n, tt.transB, tt.scale), func(t *testing.T) {
			batch := prod(tt.lead)
			a := randVec(r, batch*tt.m*tt.k)
			w := randVec(r, batch*tt.k*tt.n)
			wShape := append(clone(tt.lead), tt.k, tt.n)
			if tt.transB {
				wShape = append(clone(tt.lead), tt.n, tt.k)
			}
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpBatchMatMul, In: []string{"a", "w"}, Out: "y", TransB: tt.transB, Scale: tt.scale}}}
			got, err := runGraph(t, d, g, []input{f32In("a", a, append(clone(tt.lead), tt.m, tt.k)...), f32In("w", w, wShape...)},
				"y", append(clone(tt.lead), tt.m, tt.n))
			if err != nil {
				t.Fatal(err)
			}
			scale := float64(tt.scale)
			if scale == 0 {
				scale = 1
			}
			checkClose(t, got, refBatchMatMul(to64(a), batch, tt.m, tt.k, to64(w), tt.n, tt.transB, scale), tolF32)
		})
	}
}

func TestAdd(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		shape []int
		bcast bool
	}{
		{[]int{1}, false},
		{[]int{1, 1}, true},
		{[]int{3, 17}, false},
		{[]int{3, 17}, true},
		{[]int{64, 100}, true},
		{[]int{2, 5, 17}, false},
		{[]int{2, 5, 17}, true},
		{[]int{300, 1001}, false}, // bd_add in chunks on the device's threads, the last one short
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/bcast=%v", tt.shape, tt.bcast), func(t *testing.T) {
			n := tt.shape[len(tt.shape)-1]
			a := randVec(r, prod(tt.shape))
			bShape := tt.shape
			if tt.bcast {
				bShape = []int{n}
			}
			b := randVec(r, prod(bShape))
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpAdd, In: []string{"a", "b"}, Out: "y"}}}
			got, err := runGraph(t, d, g, []input{f32In("a", a, tt.shape...), f32In("b", b, bShape...)}, "y", tt.shape)
			if err != nil {
				t.Fatal(err)
			}
			checkClose(t, got, refAdd(to64(a), to64(b), n), tolF32)
		})
	}
}

func TestLayerNorm(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		shape []int
		eps   float32
	}{
		{[]int{1, 3}, 1e-5},
		{[]int{3, 17}, 1e-12},
		{[]int{64, 100}, 1e-5},
		{[]int{2, 5, 17}, 1e-6},
		{[]int{100, 64}, 1e-5},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/eps=%g", tt.shape, tt.eps), func(t *testing.T) {
			n := tt.shape[len(tt.shape)-1]
			x := randVec(r, prod(tt.shape))
			gamma, beta := randVec(r, n), randVec(r, n)
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpLayerNorm, In: []string{"x", "g", "b"}, Out: "y", Eps: tt.eps}}}
			got, err := runGraph(t, d, g, []input{f32In("x", x, tt.shape...), f32In("g", gamma, n), f32In("b", beta, n)}, "y", tt.shape)
			if err != nil {
				t.Fatal(err)
			}
			checkClose(t, got, refLayerNorm(to64(x), n, to64(gamma), to64(beta), float64(tt.eps)), tolF32)
		})
	}
}

func TestSoftmax(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	for _, shape := range [][]int{{1}, {1, 1}, {3, 17}, {64, 100}, {2, 5, 17}, {17, 1000}} {
		t.Run(fmt.Sprint(shape), func(t *testing.T) {
			x := randVec(r, prod(shape))
			for i := range x {
				x[i] *= 8 // a wider range, so that max-subtraction matters
			}
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpSoftmax, In: []string{"x"}, Out: "y"}}}
			got, err := runGraph(t, d, g, []input{f32In("x", x, shape...)}, "y", shape)
			if err != nil {
				t.Fatal(err)
			}
			checkClose(t, got, refSoftmax(to64(x), shape[len(shape)-1]), tolF32)
		})
	}
}

func TestPointwise(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	kinds := []struct {
		kind runtime.OpKind
		act  runtime.Activation
	}{
		{runtime.OpGELU, runtime.ActGELU},
		{runtime.OpReLU, runtime.ActReLU},
		{runtime.OpTanh, runtime.ActTanh},
	}
	for _, k := range kinds {
		for _, shape := range [][]int{{1}, {17}, {3, 100}, {2, 5, 17}, {64, 1000}} {
			t.Run(fmt.Sprintf("%s/%v", k.kind, shape), func(t *testing.T) {
				x := randVec(r, prod(shape))
				for i := range x {
					x[i] *= 4
				}
				g := &runtime.Graph{Ops: []runtime.Op{{Kind: k.kind, In: []string{"x"}, Out: "y"}}}
				got, err := runGraph(t, d, g, []input{f32In("x", x, shape...)}, "y", shape)
				if err != nil {
					t.Fatal(err)
				}
				// Relative to the input's scale: a single output near zero
				// (GELU far left of 0) carries fp32's absolute error of
				// about 1e-7·|x|, which is no fault of the op.
				want := refPointwise(to64(x), k.act)
				var num, den float64
				for i := range got {
					d := float64(got[i]) - want[i]
					num += d * d
					den += max(want[i]*want[i], float64(x[i])*float64(x[i]))
				}
				if e := math.Sqrt(num / den); !(e <= tolF32) {
					t.Errorf("error relative to the input scale %.3g > %.0e", e, tolF32)
				}
			})
		}
	}
}

func TestGather(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		name     string
		v, dim   int
		idxShape []int
		bad      int32 // written at a random position when non-zero
	}{
		{"one", 1, 1, []int{1}, 0},
		{"odd", 17, 3, []int{5}, 0},
		{"2-D indices", 100, 64, []int{3, 17}, 0},
		{"large", 1000, 384, []int{64, 16}, 0},
		{"index = V", 17, 3, []int{5}, 17},
		{"negative index", 17, 3, []int{2, 3}, -1},
		{"huge index", 5, 4, []int{1}, math.MaxInt32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table := randVec(r, tt.v*tt.dim)
			idx := make([]int32, prod(tt.idxShape))
			for i := range idx {
				idx[i] = int32(r.IntN(tt.v))
			}
			if tt.bad != 0 {
				idx[r.IntN(len(idx))] = tt.bad
			}
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpGather, In: []string{"t", "i"}, Out: "y"}}}
			ins := []input{f32In("t", table, tt.v, tt.dim), {name: "i", dt: runtime.I32, shape: tt.idxShape, i: idx}}
			got, err := runGraph(t, d, g, ins, "y", append(clone(tt.idxShape), tt.dim))
			if tt.bad != 0 {
				if !errors.Is(err, runtime.ErrInvalidGraph) || !strings.Contains(err.Error(), fmt.Sprintf("index %d", tt.bad)) {
					t.Fatalf("err = %v, want ErrInvalidGraph naming index %d", err, tt.bad)
				}
				t.Logf("error as expected: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkClose(t, got, refGather(to64(table), tt.dim, idx), 0) // a copy: exact
		})
	}
}

func TestMaskedMeanPool(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		b, s, dim int
		maskType  runtime.DType
	}{
		{1, 1, 1, runtime.F32},
		{3, 17, 5, runtime.F32},
		{4, 100, 64, runtime.I32},
		{2, 64, 384, runtime.F32},
		{5, 3, 17, runtime.I32},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%dx%dx%d/mask=%s", tt.b, tt.s, tt.dim, tt.maskType), func(t *testing.T) {
			x := randVec(r, tt.b*tt.s*tt.dim)
			mask := make([]float64, tt.b*tt.s)
			for i := range mask {
				if r.IntN(3) > 0 {
					mask[i] = 1
				}
			}
			// Row 0 keeps nothing: its mean must be exactly zeros.
			zeroRow := tt.b > 1 || tt.s == 1
			if zeroRow {
				for si := 0; si < tt.s; si++ {
					mask[si] = 0
				}
			}
			maskIn := input{name: "m", dt: tt.maskType, shape: []int{tt.b, tt.s}}
			for _, m := range mask {
				maskIn.f = append(maskIn.f, float32(m))
				maskIn.i = append(maskIn.i, int32(m))
			}
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMaskedMeanPool, In: []string{"x", "m"}, Out: "y"}}}
			got, err := runGraph(t, d, g, []input{f32In("x", x, tt.b, tt.s, tt.dim), maskIn}, "y", []int{tt.b, tt.dim})
			if err != nil {
				t.Fatal(err)
			}
			if zeroRow {
				for j, v := range got[:tt.dim] {
					if v != 0 {
						t.Fatalf("all-zero mask row: y[0][%d] = %g, want 0", j, v)
					}
				}
			}
			checkClose(t, got, refMeanPool(to64(x), tt.b, tt.s, tt.dim, mask), tolF32)
		})
	}
}

func TestL2Normalize(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	for _, shape := range [][]int{{1}, {1, 1}, {3, 17}, {64, 384}, {2, 5, 100}} {
		t.Run(fmt.Sprint(shape), func(t *testing.T) {
			x := randVec(r, prod(shape))
			dim := shape[len(shape)-1]
			rows := len(x) / dim
			if rows > 1 {
				clear(x[dim : 2*dim]) // a zero row stays zero
			}
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpL2Normalize, In: []string{"x"}, Out: "y"}}}
			got, err := runGraph(t, d, g, []input{f32In("x", x, shape...)}, "y", shape)
			if err != nil {
				t.Fatal(err)
			}
			if rows > 1 {
				for j, v := range got[dim : 2*dim] {
					if v != 0 {
						t.Fatalf("zero row: y[1][%d] = %g, want 0", j, v)
					}
				}
			}
			checkClose(t, got, refL2Normalize(to64(x), dim), tolF32)
		})
	}
}

// encoderGraph is matmul → add → layer-norm → gelu → softmax, the end-to-end
// graph; x [b,s,k], w [n,k] (PyTorch layout), bias, residual r [b,s,n].
func encoderGraph() *runtime.Graph {
	return &runtime.Graph{Ops: []runtime.Op{
		{Kind: runtime.OpMatMul, In: []string{"x", "w", "bias"}, Out: "h", TransB: true},
		{Kind: runtime.OpAdd, In: []string{"h", "res"}, Out: "h2"},
		{Kind: runtime.OpLayerNorm, In: []string{"h2", "gamma", "beta"}, Out: "ln", Eps: 1e-5},
		{Kind: runtime.OpGELU, In: []string{"ln"}, Out: "act"},
		{Kind: runtime.OpSoftmax, In: []string{"act"}, Out: "y"},
	}}
}

type encoderCase struct {
	b, s, k, n int
	ins        []input
	want       []float64
}

func newEncoderCase(r *rand.Rand, b, s, k, n int) encoderCase {
	x, w, bias := randVec(r, b*s*k), randVec(r, n*k), randVec(r, n)
	res, gamma, beta := randVec(r, b*s*n), randVec(r, n), randVec(r, n)
	h := refMatMul(to64(x), b*s, k, to64(w), n, true, to64(bias), runtime.ActNone)
	h = refAdd(h, to64(res), n)
	h = refLayerNorm(h, n, to64(gamma), to64(beta), 1e-5)
	h = refPointwise(h, runtime.ActGELU)
	return encoderCase{b: b, s: s, k: k, n: n, want: refSoftmax(h, n), ins: []input{
		f32In("x", x, b, s, k), f32In("w", w, n, k), f32In("bias", bias, n),
		f32In("res", res, b, s, n), f32In("gamma", gamma, n), f32In("beta", beta, n),
	}}
}

func TestGraphEndToEnd(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	for _, sh := range [][4]int{{1, 1, 1, 1}, {2, 3, 17, 64}, {4, 17, 100, 3}, {3, 64, 64, 100}} {
		t.Run(fmt.Sprint(sh), func(t *testing.T) {
			c := newEncoderCase(r, sh[0], sh[1], sh[2], sh[3])
			got, err := runGraph(t, d, encoderGraph(), c.ins, "y", []int{c.b, c.s, c.n})
			if err != nil {
				t.Fatal(err)
			}
			checkClose(t, got, c.want, tolF32)
		})
	}
}

func TestPermute(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		name  string
		shape []int // In[0]'s shape
		view  []int // Op.Shape; nil: the shape
		perm  []int
	}{
		{"identity", []int{3, 5}, nil, []int{0, 1}},
		{"one element", []int{1}, nil, []int{0}},
		{"transpose", []int{17, 3}, nil, []int{1, 0}},
		{"rotate 3-D", []int{2, 3, 4}, nil, []int{2, 0, 1}},
		{"split heads", []int{2, 5, 12}, []int{2, 5, 3, 4}, []int{0, 2, 1, 3}},
		{"merge heads", []int{2, 3, 5, 4}, nil, []int{0, 2, 1, 3}},
		{"bert-base heads", []int{3, 17, 768}, []int{3, 17, 12, 64}, []int{0, 2, 1, 3}},
		{"5-D", []int{2, 3, 4, 5, 6}, nil, []int{4, 2, 0, 3, 1}},
		{"view flattens", []int{4, 6}, []int{24}, []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := randVec(r, prod(tt.shape))
			view := tt.view
			if view == nil {
				view = tt.shape
			}
			out := make([]int, len(tt.perm))
			for i, p := range tt.perm {
				out[i] = view[p]
			}
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpPermute, In: []string{"x"}, Out: "y", Shape: tt.view, Perm: tt.perm}}}
			got, err := runGraph(t, d, g, []input{f32In("x", x, tt.shape...)}, "y", out)
			if err != nil {
				t.Fatal(err)
			}
			checkClose(t, got, refPermute(to64(x), view, tt.perm), 0) // a copy: exact
		})
	}
}

func TestReshape(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		shape, to, want []int
	}{
		{[]int{1}, []int{1, 1}, []int{1, 1}},
		{[]int{2, 3, 4}, []int{6, 4}, []int{6, 4}},
		{[]int{2, 3, 4}, []int{-1}, []int{24}},
		{[]int{4, 17, 2, 32}, []int{4, 17, -1}, []int{4, 17, 64}},
		{[]int{512, 1024}, []int{1024, -1}, []int{1024, 512}}, // several parallel chunks
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v->%v", tt.shape, tt.to), func(t *testing.T) {
			x := randVec(r, prod(tt.shape))
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpReshape, In: []string{"x"}, Out: "y", Shape: tt.to}}}
			got, err := runGraph(t, d, g, []input{f32In("x", x, tt.shape...)}, "y", tt.want)
			if err != nil {
				t.Fatal(err)
			}
			checkClose(t, got, to64(x), 0)
		})
	}
}

// TestReshapeIntermediate reshapes intermediates: t1, read again later,
// is copied (were its buffer taken over, t2's release after op 2 would
// hand it to t4, which overwrites t1 before op 5 reads it); t3, read by
// nothing after its reshape, has its buffer taken over.
func TestReshapeIntermediate(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	x := randVec(newRand(t), 4*6)
	g := &runtime.Graph{Ops: []runtime.Op{
		{Kind: runtime.OpReLU, In: []string{"x"}, Out: "t1"},
		{Kind: runtime.OpReshape, In: []string{"t1"}, Out: "t2", Shape: []int{24}},
		{Kind: runtime.OpTanh, In: []string{"t2"}, Out: "t3"},
		{Kind: runtime.OpTanh, In: []string{"x"}, Out: "t4"},
		{Kind: runtime.OpReshape, In: []string{"t3"}, Out: "t5", Shape: []int{4, 6}},
		{Kind: runtime.OpAdd, In: []string{"t1", "t5"}, Out: "t6"},
		{Kind: runtime.OpAdd, In: []string{"t6", "t4"}, Out: "y"},
	}}
	want := make([]float64, len(x))
	for i, v := range x {
		r := math.Max(float64(v), 0)
		want[i] = r + math.Tanh(r) + math.Tanh(float64(v))
	}
	for range 3 { // later runs reuse pooled buffers
		got, err := runGraph(t, d, g, []input{f32In("x", x, 4, 6)}, "y", []int{4, 6})
		if err != nil {
			t.Fatal(err)
		}
		checkClose(t, got, want, tolF32)
	}
}

func TestMaskedSoftmax(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		shape    []int // [B,...,N]
		maskType runtime.DType
		allOff   bool // batch element 0 keeps nothing
	}{
		{[]int{1, 1}, runtime.F32, false},
		{[]int{3, 17}, runtime.F32, false},
		{[]int{2, 4, 16, 16}, runtime.F32, false}, // [B,H,S,S] attention scores
		{[]int{3, 2, 5, 24}, runtime.I32, true},
		{[]int{4, 12, 64, 64}, runtime.I32, false},
		{[]int{2, 7, 1000}, runtime.F32, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/mask=%s/allOff=%v", tt.shape, tt.maskType, tt.allOff), func(t *testing.T) {
			b, n := tt.shape[0], tt.shape[len(tt.shape)-1]
			x := randVec(r, prod(tt.shape))
			for i := range x {
				x[i] *= 8
			}
			mask := make([]float64, b*n)
			for bi := 0; bi < b; bi++ {
				// Padding at the end, as in a batch, and a random hole.
				keep := 1 + r.IntN(n)
				for j := 0; j < keep; j++ {
					mask[bi*n+j] = 1
				}
				if keep > 2 {
					mask[bi*n+r.IntN(keep)] = 0
				}
			}
			if tt.allOff {
				clear(mask[:n])
			}
			maskIn := input{name: "m", dt: tt.maskType, shape: []int{b, n}}
			for _, m := range mask {
				maskIn.f = append(maskIn.f, float32(m))
				maskIn.i = append(maskIn.i, int32(m))
			}
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMaskedSoftmax, In: []string{"x", "m"}, Out: "y"}}}
			got, err := runGraph(t, d, g, []input{f32In("x", x, tt.shape...), maskIn}, "y", tt.shape)
			if err != nil {
				t.Fatal(err)
			}
			want := refMaskedSoftmax(to64(x), b, n, mask)
			per := len(x) / n / b
			for i, v := range got {
				bi := i / n / per
				if mask[bi*n+i%n] == 0 && !(tt.allOff && bi == 0) && v != 0 {
					t.Fatalf("masked position %d has probability %g, want exactly 0", i, v)
				}
			}
			checkClose(t, got, want, tolF32)
		})
	}
}

func TestConvert(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	x := randVec(r, 3*1000)
	t.Run("f32 to f32", func(t *testing.T) {
		g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpConvert, In: []string{"x"}, Out: "y", DType: runtime.F32}}}
		got, err := runGraph(t, d, g, []input{f32In("x", x, 3, 1000)}, "y", []int{3, 1000})
		if err != nil {
			t.Fatal(err)
		}
		checkClose(t, got, to64(x), 0)
	})
	t.Run("f32 to bf16 and back", func(t *testing.T) {
		g := &runtime.Graph{Ops: []runtime.Op{
			{Kind: runtime.OpConvert, In: []string{"x"}, Out: "h", DType: runtime.BF16},
			{Kind: runtime.OpConvert, In: []string{"h"}, Out: "y", DType: runtime.F32},
		}}
		got, err := runGraph(t, d, g, []input{f32In("x", x, 3, 1000)}, "y", []int{3, 1000})
		if reason := d.BF16(); reason != nil {
			// The bf16 intermediate cannot be allocated: the run says why.
			if !errors.Is(err, runtime.ErrUnsupported) {
				t.Fatalf("err = %v, want ErrUnsupported on a CPU without bf16", err)
			}
			t.Skipf("bf16 unsupported on this CPU: %v", reason)
		}
		if err != nil {
			t.Fatal(err)
		}
		// Round to nearest even keeps 8 significant bits: the unit roundoff,
		// and so the bound on the relative error, is 2⁻⁸.
		for i, v := range got {
			if e := math.Abs(float64(v)-float64(x[i])) / math.Abs(float64(x[i])); e > 1.0/256 {
				t.Fatalf("y[%d] = %g from %g: relative error %.3g > 2^-8", i, v, x[i], e)
			}
		}
	})
}

// TestAttentionGraph is one attention head block as BERT runs it: heads
// split with OpPermute, scores with a scaled batch matmul, the padding
// masked out, context merged back with OpPermute and OpReshape.
func TestAttentionGraph(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	const b, s, nh, hd = 3, 8, 2, 4
	h := nh * hd
	q, k, v := randVec(r, b*s*h), randVec(r, b*s*h), randVec(r, b*s*h)
	mask := make([]float64, b*s)
	lens := []int{8, 3, 5}
	for bi, n := range lens {
		for j := 0; j < n; j++ {
			mask[bi*s+j] = 1
		}
	}
	maskF := make([]float32, len(mask))
	for i, m := range mask {
		maskF[i] = float32(m)
	}
	scale := float32(1 / math.Sqrt(hd))
	split := func(name string) runtime.Op {
		return runtime.Op{Kind: runtime.OpPermute, In: []string{name}, Out: name + "h", Shape: []int{b, s, nh, hd}, Perm: []int{0, 2, 1, 3}}
	}
	g := &runtime.Graph{Ops: []runtime.Op{
		split("q"), split("k"), split("v"),
		{Kind: runtime.OpBatchMatMul, In: []string{"qh", "kh"}, Out: "sc", TransB: true, Scale: scale},
		{Kind: runtime.OpMaskedSoftmax, In: []string{"sc", "m"}, Out: "p"},
		{Kind: runtime.OpBatchMatMul, In: []string{"p", "vh"}, Out: "c"},
		{Kind: runtime.OpPermute, In: []string{"c"}, Out: "cm", Perm: []int{0, 2, 1, 3}},
		{Kind: runtime.OpReshape, In: []string{"cm"}, Out: "y", Shape: []int{b, s, h}},
	}}
	got, err := runGraph(t, d, g, []input{f32In("q", q, b, s, h), f32In("k", k, b, s, h), f32In("v", v, b, s, h), f32In("m", maskF, b, s)}, "y", []int{b, s, h})
	if err != nil {
		t.Fatal(err)
	}
	qkv := [3][]float32{q, k, v}
	at := func(bi, tok, part, hi, e int) float64 { return float64(qkv[part][(bi*s+tok)*h+hi*hd+e]) }
	checkClose(t, got, refAttention(at, b, s, nh, hd, float64(scale), mask), tolF32)
}

// refAttention is multi-head attention in plain float64 loops: at(b, token,
// part, head, e) reads element e of the query (part 0), key (1) or value
// (2) of a head; the result is [B,S,H·D] with the heads merged.
func refAttention(at func(bi, tok, part, hi, e int) float64, b, s, nh, hd int, scale float64, mask []float64) []float64 {
	h := nh * hd
	out := make([]float64, b*s*h)
	for bi := 0; bi < b; bi++ {
		for hi := 0; hi < nh; hi++ {
			for i := 0; i < s; i++ {
				sc := make([]float64, s)
				for j := 0; j < s; j++ {
					for e := 0; e < hd; e++ {
						sc[j] += at(bi, i, 0, hi, e) * at(bi, j, 1, hi, e)
					}
					sc[j] *= scale
				}
				p := refMaskedSoftmax(sc, 1, s, mask[bi*s:(bi+1)*s])
				for e := 0; e < hd; e++ {
					var acc float64
					for j := 0; j < s; j++ {
						acc += p[j] * at(bi, j, 2, hi, e)
					}
					out[(bi*s+i)*h+hi*hd+e] = acc
				}
			}
		}
	}
	return out
}

// TestFusedAttention: OpAttention over a fused q|k|v projection against
// plain float64 loops, in f32 and bf16 (bf16 operands, and a bf16 output),
// with f32 and i32 masks, padded sequences and a batch element whose keys
// are all masked (uniform attention, as OpMaskedSoftmax gives).
func TestFusedAttention(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		b, s, nh, hd int
		dt, out      runtime.DType
		maskType     runtime.DType
		lens         []int
	}{
		{1, 1, 1, 4, runtime.F32, runtime.F32, runtime.F32, []int{1}},
		{3, 8, 2, 4, runtime.F32, runtime.F32, runtime.F32, []int{8, 3, 5}},
		{2, 16, 12, 32, runtime.F32, runtime.F32, runtime.I32, []int{16, 0}},
		{2, 33, 4, 16, runtime.BF16, runtime.F32, runtime.F32, []int{33, 20}},
		{2, 9, 3, 8, runtime.BF16, runtime.BF16, runtime.I32, []int{2, 9}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("b%d s%d h%d d%d %s to %s mask %s", tt.b, tt.s, tt.nh, tt.hd, tt.dt, tt.out, tt.maskType), func(t *testing.T) {
			if tt.dt == runtime.BF16 {
				if reason := d.BF16(); reason != nil {
					t.Skipf("bf16 unsupported on this CPU: %v", reason)
				}
			}
			b, s, nh, hd := tt.b, tt.s, tt.nh, tt.hd
			h := nh * hd
			qkv := randVec(r, b*s*3*h)
			for i := range qkv {
				qkv[i] *= 2
			}
			mask := make([]float64, b*s)
			maskIn := input{name: "m", dt: tt.maskType, shape: []int{b, s}}
			for bi, n := range tt.lens {
				for j := 0; j < n; j++ {
					mask[bi*s+j] = 1
				}
			}
			for _, m := range mask {
				maskIn.f = append(maskIn.f, float32(m))
				maskIn.i = append(maskIn.i, int32(m))
			}
			ops := []runtime.Op{}
			src := "x"
			if tt.dt == runtime.BF16 {
				ops = append(ops, runtime.Op{Kind: runtime.OpConvert, In: []string{"x"}, Out: "xb", DType: runtime.BF16})
				src = "xb"
			}
			att := runtime.Op{Kind: runtime.OpAttention, In: []string{src, "m"}, Out: "a", Heads: nh}
			if tt.out == runtime.BF16 {
				att.DType = runtime.BF16
			}
			ops = append(ops, att, runtime.Op{Kind: runtime.OpConvert, In: []string{"a"}, Out: "y", DType: runtime.F32})
			g := &runtime.Graph{Ops: ops}
			got, err := runGraph(t, d, g, []input{f32In("x", qkv, b, s, 3*h), maskIn}, "y", []int{b, s, h})
			if err != nil {
				t.Fatal(err)
			}
			at := func(bi, tok, part, hi, e int) float64 { return float64(qkv[(bi*s+tok)*3*h+part*h+hi*hd+e]) }
			want := refAttention(at, b, s, nh, hd, 1/math.Sqrt(float64(hd)), mask)
			tol := tolF32
			if tt.dt == runtime.BF16 {
				tol = tolBF16
			}
			checkClose(t, got, want, tol)
		})
	}
}

// TestPlanCache: a graph run again reuses its checked plan, and the same
// graph bound to other shapes, or to other names, is planned for them, not
// run on the old plan.
func TestPlanCache(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpAdd, In: []string{"a", "b"}, Out: "y"}}}
	for i, rows := range []int{2, 2, 5, 2, 2} {
		a, b := randVec(r, rows*3), randVec(r, rows*3)
		ins := []input{f32In("a", a, rows, 3), f32In("b", b, rows, 3)}
		if i == 4 { // a binding the graph does not read: planned aside
			ins = append(ins, f32In("c", a[:1], 1, 1))
		}
		got, err := runGraph(t, d, g, ins, "y", []int{rows, 3})
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float64, len(a))
		for i := range a {
			want[i] = float64(a[i]) + float64(b[i])
		}
		checkClose(t, got, want, 1e-7)
	}
	if n, hits, _ := d.plans.stats(); n != 1 || hits != 4 {
		t.Fatalf("plan cache: %d entries, %d hits; want 1 entry and 4 hits (the 5-row run and the extra binding planned aside)", n, hits)
	}
}

// TestMatMulResidual: a matmul with a bias, an activation and a residual
// added after it (In[3]), with the weights packed and not.
func TestMatMulResidual(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	for _, sh := range []struct{ m, k, n int }{{1, 1, 1}, {16, 384, 384}, {37, 100, 17}, {128, 64, 100}} {
		for _, act := range []runtime.Activation{runtime.ActNone, runtime.ActGELU} {
			t.Run(fmt.Sprintf("%dx%dx%d/%s", sh.m, sh.k, sh.n, actNames[act]), func(t *testing.T) {
				a, w, b, res := randVec(r, sh.m*sh.k), randVec(r, sh.n*sh.k), randVec(r, sh.n), randVec(r, sh.m*sh.n)
				op := runtime.Op{Kind: runtime.OpMatMul, In: []string{"a", "w", "b", "r"}, Out: "y", Act: act, TransB: true}
				ins := []input{f32In("a", a, sh.m, sh.k), f32In("w", w, sh.n, sh.k), f32In("b", b, sh.n), f32In("r", res, sh.m, sh.n)}
				got, err := runGraph(t, d, &runtime.Graph{Ops: []runtime.Op{op}}, ins, "y", []int{sh.m, sh.n})
				if err != nil {
					t.Fatal(err)
				}
				want := refMatMul(to64(a), sh.m, sh.k, to64(w), sh.n, true, to64(b), act)
				for i := range want {
					want[i] += float64(res[i])
				}
				checkCloseAct(t, got, want, act)
			})
		}
	}
}
