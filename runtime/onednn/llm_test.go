package onednn

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime"
)

// float64 references of the decoder-LLM ops.

func refRMSNorm(x []float64, n int, w []float64, eps float64) []float64 {
	out := make([]float64, len(x))
	for r := 0; r < len(x)/n; r++ {
		var ss float64
		for _, e := range x[r*n : (r+1)*n] {
			ss += e * e
		}
		inv := 1 / math.Sqrt(ss/float64(n)+eps)
		for j := 0; j < n; j++ {
			out[r*n+j] = x[r*n+j] * inv * w[j]
		}
	}
	return out
}

func refSiLU(x float64) float64 { return x / (1 + math.Exp(-x)) }

// refSwiGLU: rows of [gate | up] (2·inter wide) → silu(gate)·up.
func refSwiGLU(x []float64, inter int) []float64 {
	rows := len(x) / (2 * inter)
	out := make([]float64, rows*inter)
	for r := 0; r < rows; r++ {
		for j := 0; j < inter; j++ {
			out[r*inter+j] = refSiLU(x[r*2*inter+j]) * x[r*2*inter+inter+j]
		}
	}
	return out
}

// refRoPE: rotate-half over x [t,h,d]; the angle is rounded to f32 as the
// contract (and HF) computes it, everything else is float64.
func refRoPE(x []float64, t, h, d int, pos []int32, invFreq []float32) []float64 {
	out := make([]float64, len(x))
	half := d / 2
	for ti := 0; ti < t; ti++ {
		for hi := 0; hi < h; hi++ {
			o := (ti*h + hi) * d
			for i := 0; i < half; i++ {
				ang := float64(float32(pos[ti]) * invFreq[i])
				c, s := math.Cos(ang), math.Sin(ang)
				a, b := x[o+i], x[o+i+half]
				out[o+i] = a*c - b*s
				out[o+i+half] = b*c + a*s
			}
		}
	}
	return out
}

// refKVWrite copies rows of x (row elements each) into cache slots.
func refKVWrite(cache, x []float64, slots []int32, row int) {
	for i, s := range slots {
		if s >= 0 {
			copy(cache[int(s)*row:(int(s)+1)*row], x[i*row:(i+1)*row])
		}
	}
}

// paged describes a paged-attention problem.
type paged struct {
	t, hq, hkv, d, nblocks, bs, maxb int
	table, seq, pos                  []int32
}

func refPagedAttention(q, kc, vc []float64, p paged, scale float64) []float64 {
	out := make([]float64, p.t*p.hq*p.d)
	group := p.hq / p.hkv
	for ti := 0; ti < p.t; ti++ {
		row := p.table[int(p.seq[ti])*p.maxb:]
		n := int(p.pos[ti]) + 1
		for h := 0; h < p.hq; h++ {
			g := h / group
			qv := q[(ti*p.hq+h)*p.d:][:p.d]
			sc := make([]float64, n)
			mx := math.Inf(-1)
			off := func(j int) int { return ((int(row[j/p.bs])*p.bs+j%p.bs)*p.hkv + g) * p.d }
			for j := 0; j < n; j++ {
				var s float64
				for i, e := range qv {
					s += e * kc[off(j)+i]
				}
				sc[j] = s * scale
				mx = math.Max(mx, sc[j])
			}
			var sum float64
			for j := range sc {
				sc[j] = math.Exp(sc[j] - mx)
				sum += sc[j]
			}
			o := out[(ti*p.hq+h)*p.d:][:p.d]
			for j := 0; j < n; j++ {
				for i := range o {
					o[i] += sc[j] / sum * vc[off(j)+i]
				}
			}
		}
	}
	return out
}

// operands converts v to the type the device holds it as (bf16-rounded for
// bf16), as float64: the reference's inputs.
func operands(v []float32, dt runtime.DType) []float64 {
	if dt == runtime.BF16 {
		return roundBF16(v)
	}
	return to64(v)
}

// needBF16 skips a bf16 case on a CPU without bf16.
func needBF16(t *testing.T, d *Device, dt runtime.DType) {
	t.Helper()
	if dt == runtime.BF16 && d.BF16() != nil {
		t.Skipf("bf16 unsupported on this CPU: %v", d.BF16())
	}
}

func tolFor(dt runtime.DType) float64 {
	if dt == runtime.BF16 {
		return tolBF16
	}
	return tolF32
}

// runTyped runs g with ins (float ones stored as dt) and an output of type
// dt; the rest as runGraph.
func runTyped(t *testing.T, d *Device, g *runtime.Graph, ins []input, dt runtime.DType, out string, outShape []int) []float32 {
	t.Helper()
	ctx := t.Context()
	bind := map[string]runtime.Buffer{}
	defer func() {
		for _, b := range bind {
			d.Free(b)
		}
	}()
	alloc := func(name string, dt runtime.DType, shape []int) runtime.Buffer {
		b, err := d.Alloc(dt, shape...)
		if err != nil {
			t.Fatalf("alloc %q: %v", name, err)
		}
		bind[name] = b
		return b
	}
	for _, in := range ins {
		b := alloc(in.name, in.dt, in.shape)
		var err error
		if in.dt == runtime.I32 {
			err = d.CopyInInt32(ctx, b, in.i)
		} else {
			err = d.CopyIn(ctx, b, in.f)
		}
		if err != nil {
			t.Fatalf("copy in %q: %v", in.name, err)
		}
	}
	ob := alloc(out, dt, outShape)
	if err := d.Run(ctx, g, bind); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, prod(outShape))
	if err := d.CopyOut(ctx, got, ob); err != nil {
		t.Fatal(err)
	}
	return got
}

var floatTypes = []runtime.DType{runtime.F32, runtime.BF16}

func TestRMSNorm(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		shape []int
		eps   float32
	}{
		{[]int{1, 1}, 1e-6},
		{[]int{3, 17}, 1e-5},
		{[]int{5, 896}, 1e-6},
		{[]int{2, 1500}, 1e-6},  // longer than the kernel's chunk
		{[]int{4, 3, 64}, 1e-6}, // Qwen3's per-head q/k norm: [T,H,D], weight [D]
		{[]int{40, 1024}, 1e-6}, // rows on the device's threads
		{[]int{2, 8}, 0},
	}
	for _, dt := range floatTypes {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/%v/eps=%g", dt, tc.shape, tc.eps), func(t *testing.T) {
				needBF16(t, d, dt)
				n := tc.shape[len(tc.shape)-1]
				x, w := randVec(r, prod(tc.shape)), randVec(r, n)
				g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpRMSNorm, In: []string{"x", "w"}, Out: "y", Eps: tc.eps}}}
				got := runTyped(t, d, g, []input{{name: "x", dt: dt, shape: tc.shape, f: x}, f32In("w", w, n)}, dt, "y", tc.shape)
				checkClose(t, got, refRMSNorm(operands(x, dt), n, to64(w), float64(tc.eps)), tolFor(dt))
			})
		}
	}
}

func TestSiLU(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	for _, shape := range [][]int{{1}, {7, 13}, {64, 4864}} {
		t.Run(fmt.Sprint(shape), func(t *testing.T) {
			x := randVec(r, prod(shape))
			for i := range x {
				x[i] *= 8 // reach both tails of the sigmoid
			}
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpSiLU, In: []string{"x"}, Out: "y"}}}
			got := runTyped(t, d, g, []input{f32In("x", x, shape...)}, runtime.F32, "y", shape)
			want := make([]float64, len(x))
			for i, e := range x {
				want[i] = refSiLU(float64(e))
			}
			checkClose(t, got, want, tolF32)
		})
	}
}

func TestSwiGLU(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	for _, dt := range floatTypes {
		for _, shape := range [][]int{{1, 2}, {5, 34}, {3, 2, 2 * 1100}, {16, 2 * 4864}} {
			t.Run(fmt.Sprintf("%s/%v", dt, shape), func(t *testing.T) {
				needBF16(t, d, dt)
				x := randVec(r, prod(shape))
				for i := range x {
					x[i] *= 6
				}
				outShape := slices.Clone(shape)
				outShape[len(outShape)-1] /= 2
				g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpSwiGLU, In: []string{"x"}, Out: "y"}}}
				got := runTyped(t, d, g, []input{{name: "x", dt: dt, shape: shape, f: x}}, dt, "y", outShape)
				checkClose(t, got, refSwiGLU(operands(x, dt), outShape[len(outShape)-1]), tolFor(dt))
			})
		}
	}
}

// invFreq is the default RoPE frequencies θ^(−2i/D), rounded to f32.
func invFreq(d int, theta float64) []float32 {
	out := make([]float32, d/2)
	for i := range out {
		out[i] = float32(1 / math.Pow(theta, float64(2*i)/float64(d)))
	}
	return out
}

func TestRoPE(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct{ t, h, d int }{{1, 1, 2}, {3, 2, 8}, {7, 14, 64}, {5, 2, 128}, {40, 16, 64}}
	for _, dt := range floatTypes {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/%dx%dx%d", dt, tc.t, tc.h, tc.d), func(t *testing.T) {
				needBF16(t, d, dt)
				x := randVec(r, tc.t*tc.h*tc.d)
				pos := make([]int32, tc.t)
				for i := range pos {
					pos[i] = int32(r.IntN(40000)) // far positions: large angles
				}
				pos[0] = 0
				freq := invFreq(tc.d, 1e6)
				shape := []int{tc.t, tc.h, tc.d}
				g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpRoPE, In: []string{"x", "pos", "f"}, Out: "y"}}}
				ins := []input{{name: "x", dt: dt, shape: shape, f: x}, {name: "pos", dt: runtime.I32, shape: shape[:1], i: pos},
					f32In("f", freq, tc.d/2)}
				got := runTyped(t, d, g, ins, dt, "y", shape)
				checkClose(t, got, refRoPE(operands(x, dt), tc.t, tc.h, tc.d, pos, freq), tolFor(dt))
			})
		}
	}
}

// TestRoPETables: a run computes each rotation table once and reuses it
// for every OpRoPE of the same positions and frequencies (a decoder's q
// and k in every layer), keeps tables of other frequencies apart, and
// takes frequencies an earlier op computed. The four rotations are
// summed, each against its own reference.
func TestRoPETables(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	const tn, h, dim = 9, 3, 16
	shape := []int{tn, h, dim}
	x, x2 := randVec(r, tn*h*dim), randVec(r, tn*h*dim)
	pos := make([]int32, tn)
	for i := range pos {
		pos[i] = int32(r.IntN(5000))
	}
	f, g := invFreq(dim, 1e4), invFreq(dim, 5e5)
	graph := &runtime.Graph{Ops: []runtime.Op{
		{Kind: runtime.OpRoPE, In: []string{"x", "pos", "f"}, Out: "y1"},
		{Kind: runtime.OpRoPE, In: []string{"x2", "pos", "f"}, Out: "y2"},
		{Kind: runtime.OpRoPE, In: []string{"x", "pos", "g"}, Out: "y3"},
		{Kind: runtime.OpAdd, In: []string{"f", "f"}, Out: "f2"},
		{Kind: runtime.OpRoPE, In: []string{"x", "pos", "f2"}, Out: "y4"},
		{Kind: runtime.OpAdd, In: []string{"y1", "y2"}, Out: "s12"},
		{Kind: runtime.OpAdd, In: []string{"y3", "y4"}, Out: "s34"},
		{Kind: runtime.OpAdd, In: []string{"s12", "s34"}, Out: "y"},
	}}
	ins := []input{{name: "x", dt: runtime.F32, shape: shape, f: x}, {name: "x2", dt: runtime.F32, shape: shape, f: x2},
		{name: "pos", dt: runtime.I32, shape: shape[:1], i: pos}, f32In("f", f, dim/2), f32In("g", g, dim/2)}
	got := runTyped(t, d, graph, ins, runtime.F32, "y", shape)
	f2 := make([]float32, len(f))
	for i := range f {
		f2[i] = f[i] + f[i]
	}
	want := make([]float64, len(x))
	for _, part := range [][]float64{refRoPE(to64(x), tn, h, dim, pos, f), refRoPE(to64(x2), tn, h, dim, pos, f),
		refRoPE(to64(x), tn, h, dim, pos, g), refRoPE(to64(x), tn, h, dim, pos, f2)} {
		for i, v := range part {
			want[i] += v
		}
	}
	checkClose(t, got, want, tolF32)
}

// BenchmarkRoPEPrefill is the 48 RoPE ops of a 512-token prefill step at
// Qwen2.5-0.5B's heads (14 query and 2 kv heads of 64, 24 layers) in one
// run, as the decoder's graph has them: one rotation table serves all.
func BenchmarkRoPEPrefill(b *testing.B) {
	d := openTest(b, runtime.DeviceSpec{Threads: *benchThreads})
	const tn, dim = 512, 64
	var ops []runtime.Op
	var ins []input
	for l := range 24 {
		for _, c := range []struct {
			name string
			h    int
		}{{"q", 14}, {"k", 2}} {
			out := fmt.Sprintf("%s%d", c.name, l)
			ops = append(ops, runtime.Op{Kind: runtime.OpRoPE, In: []string{c.name, "pos", "f"}, Out: out})
			ins = append(ins, input{name: out, dt: runtime.F32, shape: []int{tn, c.h, dim}, f: make([]float32, tn*c.h*dim)})
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	pos := make([]int32, tn)
	for i := range pos {
		pos[i] = int32(i)
	}
	ins = append(ins, input{name: "q", dt: runtime.F32, shape: []int{tn, 14, dim}, f: randVec(r, tn*14*dim)},
		input{name: "k", dt: runtime.F32, shape: []int{tn, 2, dim}, f: randVec(r, tn*2*dim)},
		input{name: "pos", dt: runtime.I32, shape: []int{tn}, i: pos}, f32In("f", invFreq(dim, 1e6), dim/2))
	benchRun(b, d, ops, ins)
}

// BenchmarkRMSNormPrefill is the 49 RMSNorm ops of a 512-token prefill
// step at Qwen2.5-0.5B's width (896, 24 layers and the final norm) in one
// run.
func BenchmarkRMSNormPrefill(b *testing.B) {
	d := openTest(b, runtime.DeviceSpec{Threads: *benchThreads})
	const tn, n = 512, 896
	r := rand.New(rand.NewPCG(1, 2))
	ins := []input{{name: "x", dt: runtime.F32, shape: []int{tn, n}, f: randVec(r, tn*n)}, f32In("w", randVec(r, n), n)}
	var ops []runtime.Op
	for l := range 49 {
		out := fmt.Sprintf("y%d", l)
		ops = append(ops, runtime.Op{Kind: runtime.OpRMSNorm, In: []string{"x", "w"}, Out: out, Eps: 1e-6})
		ins = append(ins, input{name: out, dt: runtime.F32, shape: []int{tn, n}, f: make([]float32, tn*n)})
	}
	benchRun(b, d, ops, ins)
}

// attnCase is one step of a paged cache: S sequences, each with ctx[s]
// positions already cached and add[s] new tokens this step (1 is a decode
// step, more a prefill chunk), flattened into T tokens plus pad padding
// tokens (negative slots), over blocks in random order.
type attnCase struct {
	hq, hkv, d, bs int
	ctx, add       []int
	pad            int
}

// attnProblem is an attnCase's random inputs.
type attnProblem struct {
	paged
	q, k, v, kc, vc []float32 // new keys/values [T,Hkv,D]; caches before the step
	slots           []int32
}

func newAttnProblem(r *rand.Rand, c attnCase) attnProblem {
	s := len(c.ctx)
	maxb := 0
	for i := range c.ctx {
		maxb = max(maxb, (c.ctx[i]+c.add[i]+c.bs-1)/c.bs)
	}
	maxb++ // an unused column, as a real table has
	nblocks := s*maxb + 1
	perm := r.Perm(nblocks)
	p := attnProblem{paged: paged{hq: c.hq, hkv: c.hkv, d: c.d, nblocks: nblocks, bs: c.bs, maxb: maxb}}
	p.table = make([]int32, s*maxb)
	for i := range p.table {
		p.table[i] = int32(perm[i])
	}
	for si := range c.ctx {
		for j := 0; j < c.add[si]; j++ {
			pos := c.ctx[si] + j
			p.seq = append(p.seq, int32(si))
			p.pos = append(p.pos, int32(pos))
			p.slots = append(p.slots, p.table[si*maxb+pos/c.bs]*int32(c.bs)+int32(pos%c.bs))
		}
	}
	for i := 0; i < c.pad; i++ { // padding: attends to sequence 0's first position, writes nothing
		at := r.IntN(len(p.seq) + 1)
		p.seq = slices.Insert(p.seq, at, 0)
		p.pos = slices.Insert(p.pos, at, 0)
		p.slots = slices.Insert(p.slots, at, -1-int32(r.IntN(3)))
	}
	p.t = len(p.seq)
	p.q = randVec(r, p.t*c.hq*c.d)
	p.k = randVec(r, p.t*c.hkv*c.d)
	p.v = randVec(r, p.t*c.hkv*c.d)
	p.kc = randVec(r, nblocks*c.bs*c.hkv*c.d)
	p.vc = randVec(r, nblocks*c.bs*c.hkv*c.d)
	for i := range p.q {
		p.q[i] *= 3 // peaked softmax
	}
	return p
}

func attnGraph(scale float32) *runtime.Graph {
	return &runtime.Graph{Ops: []runtime.Op{
		{Kind: runtime.OpKVWrite, In: []string{"k", "slots"}, Out: "kc"},
		{Kind: runtime.OpKVWrite, In: []string{"v", "slots"}, Out: "vc"},
		{Kind: runtime.OpPagedAttention, In: []string{"q", "kc", "vc", "table", "seq", "pos"}, Out: "y", Scale: scale},
	}}
}

// attnRun binds p's buffers (float ones as dt), runs g and returns the
// output and the caches after the run.
func attnRun(t *testing.T, d *Device, g *runtime.Graph, p attnProblem, dt runtime.DType) (y, kc, vc []float32, err error) {
	t.Helper()
	return attnRunKV(t, d, g, p, dt, dt)
}

// attnRunKV is attnRun with caches of type kv: dt's, f16, or Q8_0 or Q4_0 (their
// contents before the run quantized as OpKVWrite would; read back
// dequantized).
func attnRunKV(t *testing.T, d *Device, g *runtime.Graph, p attnProblem, dt, kv runtime.DType) (y, kc, vc []float32, err error) {
	t.Helper()
	ctx := t.Context()
	cache := []int{p.nblocks, p.bs, p.hkv, p.d}
	ins := []input{
		{name: "q", dt: dt, shape: []int{p.t, p.hq, p.d}, f: p.q},
		{name: "k", dt: dt, shape: []int{p.t, p.hkv, p.d}, f: p.k},
		{name: "v", dt: dt, shape: []int{p.t, p.hkv, p.d}, f: p.v},
		{name: "table", dt: runtime.I32, shape: []int{len(p.table) / p.maxb, p.maxb}, i: p.table},
		{name: "seq", dt: runtime.I32, shape: []int{p.t}, i: p.seq},
		{name: "pos", dt: runtime.I32, shape: []int{p.t}, i: p.pos},
		{name: "slots", dt: runtime.I32, shape: []int{p.t}, i: p.slots},
		{name: "y", dt: dt, shape: []int{p.t, p.hq, p.d}, f: make([]float32, p.t*p.hq*p.d)},
	}
	bind := map[string]runtime.Buffer{}
	defer func() {
		for _, b := range bind {
			d.Free(b)
		}
	}()
	if !kv.Quantized() {
		ins = append(ins, input{name: "kc", dt: kv, shape: cache, f: p.kc}, input{name: "vc", dt: kv, shape: cache, f: p.vc})
	}
	if err := bindInputs(ctx, d, ins, bind); err != nil {
		t.Fatal(err)
	}
	if kv.Quantized() {
		for name, v := range map[string][]float32{"kc": p.kc, "vc": p.vc} {
			b, err := d.Alloc(kv, cache...)
			if err != nil {
				t.Fatal(err)
			}
			bind[name] = b
			if err := d.CopyInRaw(ctx, b, 0, quantKV(kv, v, false)); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = d.Run(ctx, g, bind)
	out := func(name string) []float32 {
		v := make([]float32, prod(bind[name].Shape()))
		if err := d.CopyOut(ctx, v, bind[name]); err != nil {
			t.Fatal(err)
		}
		return v
	}
	return out("y"), out("kc"), out("vc"), err
}

func TestPagedAttention(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	tests := []struct {
		name string
		attnCase
		scale float32
	}{
		{"one token", attnCase{hq: 1, hkv: 1, d: 4, bs: 1, ctx: []int{0}, add: []int{1}}, 0},
		{"decode gqa2 bs16", attnCase{hq: 4, hkv: 2, d: 16, bs: 16, ctx: []int{40, 3, 16}, add: []int{1, 1, 1}}, 0},
		{"prefill chunk and decodes gqa7 bs16", attnCase{hq: 14, hkv: 2, d: 64, bs: 16, ctx: []int{0, 70, 15, 33}, add: []int{20, 1, 5, 1}, pad: 3}, 0},
		{"bs1 mha ragged", attnCase{hq: 3, hkv: 3, d: 8, bs: 1, ctx: []int{5, 0, 9}, add: []int{2, 7, 1}, pad: 1}, 0.3},
		{"odd block size gqa2", attnCase{hq: 8, hkv: 4, d: 32, bs: 3, ctx: []int{10, 2}, add: []int{4, 9}}, 0},
		{"gqa7 one kv head long", attnCase{hq: 7, hkv: 1, d: 128, bs: 16, ctx: []int{300}, add: []int{2}}, 0},
		// The group kernel (AVX-512, decode steps of groups under 8, head
		// dims in 16s up to 128): partial and whole key tiles, llama's heads.
		{"decodes gqa4 d64", attnCase{hq: 16, hkv: 4, d: 64, bs: 16, ctx: []int{0, 15, 16, 47, 130}, add: []int{1, 1, 1, 1, 1}}, 0},
		{"decodes gqa4 d128 bs5", attnCase{hq: 8, hkv: 2, d: 128, bs: 5, ctx: []int{33, 64}, add: []int{1, 1}}, 0},
		{"decodes gqa1 d32", attnCase{hq: 3, hkv: 3, d: 32, bs: 16, ctx: []int{17, 2}, add: []int{1, 1}}, 0},
		// The group kernel is compiled once per group size.
		{"decodes group 3 d32", attnCase{hq: 6, hkv: 2, d: 32, bs: 16, ctx: []int{40, 0}, add: []int{1, 1}}, 0},
		{"decodes group 5 d64", attnCase{hq: 10, hkv: 2, d: 64, bs: 16, ctx: []int{33, 17}, add: []int{1, 1}}, 0},
		{"decodes group 6 d128", attnCase{hq: 6, hkv: 1, d: 128, bs: 16, ctx: []int{50}, add: []int{1}}, 0},
		{"decodes group 8 d64", attnCase{hq: 16, hkv: 2, d: 64, bs: 16, ctx: []int{70, 5}, add: []int{1, 1}}, 0},
		// Contexts past a part (BD_FA_PART, 512 positions): merged parts.
		{"decode long context gqa7", attnCase{hq: 14, hkv: 2, d: 64, bs: 16, ctx: []int{1300}, add: []int{1}}, 0},
		{"decodes at the part boundaries", attnCase{hq: 4, hkv: 1, d: 32, bs: 16, ctx: []int{511, 512, 1023}, add: []int{1, 1, 1}}, 0},
		{"group above the kernel's 16", attnCase{hq: 20, hkv: 1, d: 8, bs: 16, ctx: []int{17}, add: []int{3}}, 0},
		// The row kernel (AVX-512, head dims in 16s): many keys tiles,
		// causal tails, blocks cut at sequence ends and at 16 rows.
		{"long prefill gqa4", attnCase{hq: 8, hkv: 2, d: 64, bs: 16, ctx: []int{0, 37}, add: []int{150, 41}}, 0},
		{"prefill mha bs4", attnCase{hq: 2, hkv: 2, d: 16, bs: 4, ctx: []int{3, 0}, add: []int{40, 1}, pad: 2}, 0},
		{"prefill group 24", attnCase{hq: 24, hkv: 1, d: 32, bs: 16, ctx: []int{20}, add: []int{5}}, 0.5},
	}
	for _, dt := range floatTypes {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/%s", dt, tc.name), func(t *testing.T) {
				needBF16(t, d, dt)
				p := newAttnProblem(r, tc.attnCase)
				y, kc, vc, err := attnRun(t, d, attnGraph(tc.scale), p, dt)
				if err != nil {
					t.Fatal(err)
				}
				row := p.hkv * p.d
				wantK, wantV := operands(p.kc, dt), operands(p.vc, dt)
				refKVWrite(wantK, operands(p.k, dt), p.slots, row)
				refKVWrite(wantV, operands(p.v, dt), p.slots, row)
				// The cache write is a copy: exact.
				for name, c := range map[string][2]any{"kc": {kc, wantK}, "vc": {vc, wantV}} {
					got, want := c[0].([]float32), c[1].([]float64)
					for i := range got {
						if float64(got[i]) != want[i] {
							t.Fatalf("%s[%d] = %g, want %g", name, i, got[i], want[i])
						}
					}
				}
				scale := float64(tc.scale)
				if scale == 0 {
					scale = 1 / math.Sqrt(float64(p.d))
				}
				checkClose(t, y, refPagedAttention(operands(p.q, dt), wantK, wantV, p.paged, scale), tolFor(dt))
			})
		}
	}
}

// TestPagedAttentionDecodeParts: a decode step of few tokens with long
// contexts runs their parts on several threads (decode_parts in
// dnnl_ops.c) and merges them in order; the outputs are bit-identical to
// one thread's, which runs each token's parts one after another, so a
// token's result does not depend on its step's other tokens; on the f32
// and (BF16Products on a bf16 cache) the bf16 group kernels, with caches of
// Q's type, of Q8_0, of Q4_0 and of f16.
func TestPagedAttentionDecodeParts(t *testing.T) {
	r := newRand(t)
	one := openTest(t, runtime.DeviceSpec{Threads: 1})
	four := openTest(t, runtime.DeviceSpec{Threads: 4})
	for _, c := range []attnCase{
		{hq: 14, hkv: 2, d: 64, bs: 16, ctx: []int{1300}, add: []int{1}},
		{hq: 4, hkv: 1, d: 32, bs: 16, ctx: []int{600, 2000, 40}, add: []int{1, 1, 1}},
		{hq: 8, hkv: 2, d: 128, bs: 5, ctx: []int{1024}, add: []int{1}},
	} {
		p := newAttnProblem(r, c)
		for _, dt := range floatTypes {
			needBF16(t, one, dt)
			for _, kv := range []runtime.DType{dt, runtime.Q8_0, runtime.Q4_0, runtime.F16} {
				for _, bf16 := range []bool{false, true} { // with a bf16 or block cache, the bf16 group kernel
					g := attnGraph(0)
					g.Ops[2].BF16Products = bf16
					y1, _, _, err := attnRunKV(t, one, g, p, dt, kv)
					if err != nil {
						t.Fatal(err)
					}
					y4, _, _, err := attnRunKV(t, four, g, p, dt, kv)
					if err != nil {
						t.Fatal(err)
					}
					for i := range y1 {
						if math.Float32bits(y1[i]) != math.Float32bits(y4[i]) {
							t.Fatalf("%+v %s, %s cache, BF16Products %v: y[%d] = %g on four threads, %g on one", c, dt, kv, bf16, i, y4[i], y1[i])
						}
					}
				}
			}
		}
	}
}

// TestPagedAttentionBF16Products runs the op with BF16Products, which on
// a CPU with AMX sends blocks of 16 to 64 query rows (prefill chunks) to
// attend_amx.c with bf16 products, and on a CPU with AVX512-BF16 sends the
// rest of a bf16 cache's work to the bf16 row and group kernels (head
// dims that divide by 32); what is left goes to the f32 kernels. Against the
// float64 reference: head dims 32 to 256, groups 1 to 64, block sizes
// that split the 32-position passes, decode steps and padding in the same
// step, contexts of several 512-position parts (one sequence: spread
// over the threads and merged; two: one a thread), and a thread count
// that shrinks the blocks. Where a bf16 kernel runs, the output must
// differ from the f32 op's (bf16 rounding), which says it ran.
func TestPagedAttentionBF16Products(t *testing.T) {
	tests := []struct {
		name    string
		threads int
		attnCase
		amx bool // the case has a block the tiles take
	}{
		{"qwen heads prefill and decodes", 0, attnCase{hq: 14, hkv: 2, d: 64, bs: 16, ctx: []int{0, 70, 15, 33}, add: []int{100, 1, 5, 1}, pad: 3}, true},
		{"llama heads long prefill", 0, attnCase{hq: 16, hkv: 4, d: 64, bs: 16, ctx: []int{0}, add: []int{150}}, true},
		{"d128 bs5 chunk after context", 0, attnCase{hq: 8, hkv: 2, d: 128, bs: 5, ctx: []int{37}, add: []int{40}}, true},
		{"mha d32 bs3", 0, attnCase{hq: 3, hkv: 3, d: 32, bs: 3, ctx: []int{0, 4}, add: []int{50, 1}}, true},
		{"d256 group 2", 0, attnCase{hq: 4, hkv: 2, d: 256, bs: 16, ctx: []int{10}, add: []int{33}}, true},
		{"group 64 one token a block", 0, attnCase{hq: 64, hkv: 1, d: 32, bs: 16, ctx: []int{5}, add: []int{3}}, true},
		{"group 20", 0, attnCase{hq: 20, hkv: 1, d: 64, bs: 16, ctx: []int{17}, add: []int{7}}, true},
		{"seven threads shrink the blocks", 7, attnCase{hq: 14, hkv: 2, d: 64, bs: 16, ctx: []int{0, 3}, add: []int{60, 30}}, true},
		{"decodes only", 0, attnCase{hq: 14, hkv: 2, d: 64, bs: 16, ctx: []int{40, 3}, add: []int{1, 1}}, false},
		{"decodes d128 group 4, odd tail", 0, attnCase{hq: 8, hkv: 2, d: 128, bs: 5, ctx: []int{36, 0}, add: []int{1, 1}}, false},
		{"one long decode in parts", 0, attnCase{hq: 14, hkv: 2, d: 64, bs: 16, ctx: []int{1500}, add: []int{1}}, false},
		{"two long decodes", 0, attnCase{hq: 4, hkv: 1, d: 32, bs: 7, ctx: []int{1100, 530}, add: []int{1, 1}}, false},
		{"long decodes beside a prefill", 0, attnCase{hq: 4, hkv: 1, d: 32, bs: 7, ctx: []int{1100, 0, 530}, add: []int{1, 20, 1}}, true},
		{"decodes group 8 take the row kernel", 0, attnCase{hq: 16, hkv: 2, d: 64, bs: 16, ctx: []int{40}, add: []int{1}}, false},
		{"d48 stays f32", 0, attnCase{hq: 4, hkv: 1, d: 48, bs: 16, ctx: []int{0}, add: []int{20}}, false},
		{"d48 decode stays f32", 0, attnCase{hq: 4, hkv: 1, d: 48, bs: 16, ctx: []int{20}, add: []int{1}}, false},
	}
	devs := map[int]*Device{}
	for _, tc := range tests {
		if devs[tc.threads] == nil {
			devs[tc.threads] = openTest(t, runtime.DeviceSpec{Threads: tc.threads})
		}
	}
	for _, dt := range floatTypes {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/%s", dt, tc.name), func(t *testing.T) {
				d := devs[tc.threads]
				needBF16(t, d, dt)
				p := newAttnProblem(newRand(t), tc.attnCase)
				g := attnGraph(0)
				g.Ops[2].BF16Products = true
				y, kc, vc, err := attnRun(t, d, g, p, dt)
				if err != nil {
					t.Fatal(err)
				}
				scale := 1 / math.Sqrt(float64(p.d))
				checkClose(t, y, refPagedAttention(operands(p.q, dt), to64(kc), to64(vc), p.paged, scale), tolBF16)
				plain, _, _, err := attnRun(t, d, attnGraph(0), p, dt)
				if err != nil {
					t.Fatal(err)
				}
				bf16 := tc.amx && qamxAvailable() || dt == runtime.BF16 && avx512BF16() && tc.d%32 == 0
				if same := slices.Equal(y, plain); same == bf16 {
					t.Errorf("output equal to the f32 op's: %v; want %v (AMX here: %v, AVX512-BF16: %v)", same, !bf16, qamxAvailable(), avx512BF16())
				}
			})
		}
	}
}

// TestPagedAttentionNaN: a NaN in one token's query makes that token's
// output NaN and leaves the others finite, on the prefill kernel (a
// 20-token chunk, blocks of rows) and the decode one (one token a
// sequence), f32 and bf16: the vector exp keeps NaN as expf does.
func TestPagedAttentionNaN(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	p := newAttnProblem(r, attnCase{hq: 8, hkv: 2, d: 64, bs: 16, ctx: []int{0, 30}, add: []int{20, 1}})
	bad := 5 // a token of the prefill chunk
	for i := range p.d {
		p.q[(bad*p.hq+1)*p.d+i] = float32(math.NaN())
	}
	// With bf16, the chunk's blocks run on AMX tiles where the CPU has
	// them, and a bf16 cache's work on the bf16 kernels where it has
	// AVX512-BF16.
	for _, dt := range floatTypes {
		if dt == runtime.BF16 && d.BF16() != nil {
			continue
		}
		for _, bf16 := range []bool{false, true} {
			g := attnGraph(0)
			g.Ops[2].BF16Products = bf16
			y, _, _, err := attnRun(t, d, g, p, dt)
			if err != nil {
				t.Fatal(err)
			}
			for ti := range p.t {
				for h := range p.hq {
					v := y[(ti*p.hq+h)*p.d]
					if want := ti == bad && h == 1; math.IsNaN(float64(v)) != want {
						t.Errorf("%s, BF16Products %v: token %d head %d: output %g, want NaN %v", dt, bf16, ti, h, v, want)
					}
				}
			}
		}
	}
}

// TestPagedAttentionBadIndices checks that out-of-range slots, sequence
// indices, positions and block ids fail the run with ErrInvalidGraph.
func TestPagedAttentionBadIndices(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	c := attnCase{hq: 2, hkv: 1, d: 4, bs: 4, ctx: []int{3, 6}, add: []int{1, 2}}
	tests := []struct {
		name  string
		spoil func(p *attnProblem)
		want  string
	}{
		{"slot past the cache", func(p *attnProblem) { p.slots[1] = int32(p.nblocks * p.bs) }, "outside the cache's"},
		{"sequence index", func(p *attnProblem) { p.seq[0] = 2 }, "sequence index 2 is outside"},
		{"negative position", func(p *attnProblem) { p.pos[2] = -1 }, "position -1"},
		{"position past the table", func(p *attnProblem) { p.pos[0] = int32(p.maxb * p.bs) }, "past the"},
		{"block id", func(p *attnProblem) { p.table[0] = int32(p.nblocks) }, "names a block outside"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newAttnProblem(r, c)
			tc.spoil(&p)
			_, kc, _, err := attnRun(t, d, attnGraph(0), p, runtime.F32)
			if !errors.Is(err, runtime.ErrInvalidGraph) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalidGraph with %q", err, tc.want)
			}
			if tc.name == "slot past the cache" && !slices.Equal(kc, p.kc) {
				t.Error("the cache changed although the write was refused")
			}
		})
	}
}

var benchThreads = flag.Int("onednn.threads", 0, "the attention benchmarks' device threads; 0 means the adapter's choice")

// BenchmarkPagedAttentionDecode is one decode step of 16 sequences with 512
// cached positions each, at Qwen2.5-0.5B's heads (14 query, 2 kv, D 64),
// reporting the rate the kernel reads the K and V cache: a decode step is
// bound by that read, so GB/s against the machine's memory bandwidth says
// how close to the limit it runs. Blocks are shuffled, as a long-running
// server's are.
func BenchmarkPagedAttentionDecode(b *testing.B) {
	const plain, bf16 = attnPlain, attnBF16
	runAttentionBenches(b, []attnBenchCase{
		{"gqa7", attnBench{seqs: 16, tokens: 1, ctx: 512, hq: 14, hkv: 2, dim: 64}, plain | bf16},
		{"gqa4", attnBench{seqs: 16, tokens: 1, ctx: 512, hq: 16, hkv: 4, dim: 64}, plain | bf16},
		// One stream, as a quantized model's graph asks for it.
		{"gqa7-1seq", attnBench{seqs: 1, tokens: 1, ctx: 512, hq: 14, hkv: 2, dim: 64}, bf16},
		// A long context: its parts of 512 positions spread over the
		// threads where the kv heads alone would not use them all.
		{"gqa7-1seq-4096", attnBench{seqs: 1, tokens: 1, ctx: 4096, hq: 14, hkv: 2, dim: 64}, plain | bf16},
		{"mqa4-1seq-4096", attnBench{seqs: 1, tokens: 1, ctx: 4096, hq: 4, hkv: 1, dim: 64}, plain},
		// Llama 3.1 8B's and Qwen3-8B's heads (32 query, 8 kv, D 128).
		{"gqa4-d128", attnBench{seqs: 16, tokens: 1, ctx: 512, hq: 32, hkv: 8, dim: 128}, plain | bf16},
	})
}

// BenchmarkPagedAttentionPrefill is one 512-token prefill of one sequence
// at llama1024's heads (16 query, 4 kv, D 64) and at Qwen2.5-0.5B's: the
// causal attention of a prompt, bound by arithmetic, not by the cache read.
func BenchmarkPagedAttentionPrefill(b *testing.B) {
	const both = attnPlain | attnBF16
	runAttentionBenches(b, []attnBenchCase{
		{"gqa4", attnBench{seqs: 1, tokens: 512, ctx: 512, hq: 16, hkv: 4, dim: 64}, both},
		{"gqa7", attnBench{seqs: 1, tokens: 512, ctx: 512, hq: 14, hkv: 2, dim: 64}, both},
		// A 512-token chunk after 1536 positions of context: a long
		// prompt's last chunk.
		{"gqa7-ctx2048", attnBench{seqs: 1, tokens: 512, ctx: 2048, hq: 14, hkv: 2, dim: 64}, both},
	})
}

// attnBenchCase is a benchmark of the op without BF16Products (attnPlain,
// named name) and with it (attnBF16, name-bf16products): AMX tiles for
// blocks of 16 query rows where the CPU has them (attend_amx.c), else for
// a bf16 cache the bf16 row and group kernels where it has AVX512-BF16.
type attnBenchCase struct {
	name string
	c    attnBench
	ops  int
}

const attnPlain, attnBF16 = 1, 2 // attnBenchCase.ops

func runAttentionBenches(b *testing.B, cases []attnBenchCase) {
	for _, tc := range cases {
		if tc.ops&attnPlain != 0 {
			b.Run(tc.name, func(b *testing.B) { benchAttention(b, tc.c) })
		}
		if tc.ops&attnBF16 != 0 {
			c := tc.c
			c.bf16Products = true
			b.Run(tc.name+"-bf16products", func(b *testing.B) { benchAttention(b, c) })
		}
	}
}

// attnBench is a step of seqs sequences of ctx positions each, of which
// the last tokens are the step's queries.
type attnBench struct {
	seqs, tokens, ctx, hq, hkv, dim int
	bf16Products                    bool
}

// benchAttention runs c with Q and the cache in f32, in bf16, and (Q f32)
// with an f16, a Q8_0 and a Q4_0 cache, each a sub-benchmark named for the cache's type.
func benchAttention(b *testing.B, c attnBench) {
	for _, kv := range []runtime.DType{runtime.F32, runtime.BF16, runtime.F16, runtime.Q8_0, runtime.Q4_0} {
		b.Run(kv.String(), func(b *testing.B) {
			d := openTest(b, runtime.DeviceSpec{Threads: *benchThreads})
			if kv == runtime.BF16 && d.BF16() != nil {
				b.Skipf("bf16 unsupported: %v", d.BF16())
			}
			dt := kv // Q's and the output's type
			if runtime.KVStoreType(kv) {
				dt = runtime.F32
			}
			const bs = 16
			r := rand.New(rand.NewPCG(1, 2))
			maxb := (c.ctx + bs - 1) / bs
			nblocks := c.seqs * maxb
			perm := r.Perm(nblocks)
			t := c.seqs * c.tokens
			table, seq, pos := make([]int32, nblocks), make([]int32, t), make([]int32, t)
			for i := range table {
				table[i] = int32(perm[i])
			}
			for i := range seq {
				seq[i], pos[i] = int32(i/c.tokens), int32(c.ctx-c.tokens+i%c.tokens)
			}
			cache := []int{nblocks, bs, c.hkv, c.dim}
			ins := []input{
				{name: "q", dt: dt, shape: []int{t, c.hq, c.dim}, f: randVec(r, t*c.hq*c.dim)},
				{name: "table", dt: runtime.I32, shape: []int{c.seqs, maxb}, i: table},
				{name: "seq", dt: runtime.I32, shape: []int{t}, i: seq},
				{name: "pos", dt: runtime.I32, shape: []int{t}, i: pos},
				{name: "y", dt: dt, shape: []int{t, c.hq, c.dim}, f: make([]float32, t*c.hq*c.dim)},
			}
			kvs := []input{{name: "kc", dt: kv, shape: cache, f: randVec(r, prod(cache))},
				{name: "vc", dt: kv, shape: cache, f: randVec(r, prod(cache))}}
			if !kv.Quantized() {
				ins = append(ins, kvs...)
			}
			bind := map[string]runtime.Buffer{}
			if err := bindInputs(b.Context(), d, ins, bind); err != nil {
				b.Fatal(err)
			}
			if kv.Quantized() {
				for _, in := range kvs {
					buf, err := d.Alloc(kv, cache...)
					if err != nil {
						b.Fatal(err)
					}
					if err := d.CopyInRaw(b.Context(), buf, 0, quantKV(kv, in.f, true)); err != nil {
						b.Fatal(err)
					}
					bind[in.name] = buf
				}
			}
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpPagedAttention, In: []string{"q", "kc", "vc", "table", "seq", "pos"}, Out: "y",
				BF16Products: c.bf16Products}}}
			bytes := float64(2 * kv.Bytes(int64(c.seqs*c.ctx*c.hkv*c.dim))) // K and V rows read once per step
			b.SetBytes(int64(bytes))
			b.ResetTimer()
			for b.Loop() {
				if err := d.Run(b.Context(), g, bind); err != nil {
					b.Fatal(err)
				}
			}
			if c.tokens == 1 {
				b.ReportMetric(bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			} else {
				// Causal QKᵀ and PV: 4·D flops per (query head, key seen).
				var flops float64
				for _, p := range pos {
					flops += 4 * float64(c.hq*c.dim) * float64(p+1)
				}
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			}
		})
	}
}

// TestKVCachePersistsAcrossRuns prefills a prompt in one Run and decodes
// the next token in another over the same bound cache buffers, as a model
// does: the second Run must see what the first wrote.
func TestKVCachePersistsAcrossRuns(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	ctx := t.Context()
	const prompt, hq, hkv, dim, bs, nblocks = 24, 4, 2, 16, 8, 5
	table := []int32{3, 0, 4, 1} // blocks out of order; room for 32 positions
	cache := []int{nblocks, bs, hkv, dim}
	alloc := func(dt runtime.DType, shape ...int) runtime.Buffer {
		b, err := d.Alloc(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Free(b) })
		return b
	}
	kc, vc, tb := alloc(runtime.F32, cache...), alloc(runtime.F32, cache...), alloc(runtime.I32, 1, len(table))
	zeros := make([]float32, prod(cache))
	if err := errors.Join(d.CopyIn(ctx, kc, zeros), d.CopyIn(ctx, vc, zeros), d.CopyInInt32(ctx, tb, table)); err != nil {
		t.Fatal(err)
	}
	allK, allV := make([]float64, prod(cache)), make([]float64, prod(cache))
	step := func(first, n int) ([]float32, []float64) {
		q, k, v := randVec(r, n*hq*dim), randVec(r, n*hkv*dim), randVec(r, n*hkv*dim)
		seq, pos, slots := make([]int32, n), make([]int32, n), make([]int32, n)
		for i := range pos {
			pos[i] = int32(first + i)
			slots[i] = table[(first+i)/bs]*bs + int32((first+i)%bs)
		}
		bind := map[string]runtime.Buffer{"kc": kc, "vc": vc, "table": tb}
		for name, in := range map[string]input{
			"q": {dt: runtime.F32, shape: []int{n, hq, dim}, f: q}, "k": {dt: runtime.F32, shape: []int{n, hkv, dim}, f: k},
			"v": {dt: runtime.F32, shape: []int{n, hkv, dim}, f: v}, "seq": {dt: runtime.I32, shape: []int{n}, i: seq},
			"pos": {dt: runtime.I32, shape: []int{n}, i: pos}, "slots": {dt: runtime.I32, shape: []int{n}, i: slots},
		} {
			b := alloc(in.dt, in.shape...)
			var err error
			if in.dt == runtime.I32 {
				err = d.CopyInInt32(ctx, b, in.i)
			} else {
				err = d.CopyIn(ctx, b, in.f)
			}
			if err != nil {
				t.Fatal(err)
			}
			bind[name] = b
		}
		y := alloc(runtime.F32, n, hq, dim)
		bind["y"] = y
		if err := d.Run(ctx, attnGraph(0), bind); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, n*hq*dim)
		if err := d.CopyOut(ctx, got, y); err != nil {
			t.Fatal(err)
		}
		refKVWrite(allK, to64(k), slots, hkv*dim)
		refKVWrite(allV, to64(v), slots, hkv*dim)
		p := paged{t: n, hq: hq, hkv: hkv, d: dim, nblocks: nblocks, bs: bs, maxb: len(table), table: table, seq: seq, pos: pos}
		return got, refPagedAttention(to64(q), allK, allV, p, 1/math.Sqrt(dim))
	}
	got, want := step(0, prompt)
	checkClose(t, got, want, tolF32)
	for i := 0; i < 3; i++ { // decode steps, the first opening a new block (24 = 3·8)
		got, want = step(prompt+i, 1)
		checkClose(t, got, want, tolF32)
	}
}

// TestKVWrite writes rows into a cache by slot, negative slots skipped, on
// one and three threads, below and above bd_kv_write's threshold for
// threads (256 KiB of rows), with rows that name one slot twice or three
// times: the last of them must be what the cache holds, as a serial loop
// leaves it.
func TestKVWrite(t *testing.T) {
	for _, threads := range []int{1, 3} {
		d := openTest(t, runtime.DeviceSpec{Threads: threads})
		for _, c := range []struct {
			rows, hkv, dim, slots int
		}{{9, 2, 8, 40}, {700, 2, 64, 1000}, {600, 1, 1024, 700}} {
			t.Run(fmt.Sprintf("threads=%d/rows=%d/row=%d", threads, c.rows, c.hkv*c.dim), func(t *testing.T) {
				r := newRand(t)
				row := c.hkv * c.dim
				x, cache := randVec(r, c.rows*row), randVec(r, c.slots*row)
				slots := make([]int32, c.rows)
				for i := range slots {
					slots[i] = int32(r.IntN(c.slots)) // many repeats
				}
				slots[0], slots[c.rows/2], slots[c.rows-1] = -1, slots[1], slots[1]
				want := slices.Clone(cache)
				for i, s := range slots {
					if s >= 0 {
						copy(want[int(s)*row:], x[i*row:(i+1)*row])
					}
				}
				ctx := t.Context()
				bufs := map[string]runtime.Buffer{}
				for name, v := range map[string][]float32{"x": x, "kc": cache} {
					shape := []int{c.rows, c.hkv, c.dim}
					if name == "kc" {
						shape = []int{c.slots, 1, c.hkv, c.dim}
					}
					b, err := d.Alloc(runtime.F32, shape...)
					if err != nil {
						t.Fatal(err)
					}
					defer d.Free(b)
					if err := d.CopyIn(ctx, b, v); err != nil {
						t.Fatal(err)
					}
					bufs[name] = b
				}
				sb, err := d.Alloc(runtime.I32, c.rows)
				if err != nil {
					t.Fatal(err)
				}
				defer d.Free(sb)
				if err := d.CopyInInt32(ctx, sb, slots); err != nil {
					t.Fatal(err)
				}
				bufs["slots"] = sb
				g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpKVWrite, In: []string{"x", "slots"}, Out: "kc"}}}
				if err := d.Run(ctx, g, bufs); err != nil {
					t.Fatal(err)
				}
				got := make([]float32, len(cache))
				if err := d.CopyOut(ctx, got, bufs["kc"]); err != nil {
					t.Fatal(err)
				}
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("slot %d element %d: %g, want %g", i/row, i%row, got[i], want[i])
					}
				}
			})
		}
	}
}
