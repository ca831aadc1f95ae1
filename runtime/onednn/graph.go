package onednn

import (
	"fmt"
	"strings"

	"github.com/brokerd/brokerd/runtime"
)

// tensor is the type and shape of a named value of a graph.
type tensor struct {
	dt    runtime.DType
	shape []int
}

func (t tensor) numel() int {
	n := 1
	for _, d := range t.shape {
		n *= d
	}
	return n
}

// last is the size of the last dimension.
func (t tensor) last() int { return t.shape[len(t.shape)-1] }

func (t tensor) String() string { return shapeString(t.shape) + " " + t.dt.String() }

func shapeString(shape []int) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func opName(k runtime.OpKind) string {
	switch k {
	case runtime.OpMatMul:
		return "matmul"
	case runtime.OpBatchMatMul:
		return "batch-matmul"
	case runtime.OpAdd:
		return "add"
	case runtime.OpLayerNorm:
		return "layer-norm"
	case runtime.OpSoftmax:
		return "softmax"
	case runtime.OpGELU:
		return "gelu"
	case runtime.OpReLU:
		return "relu"
	case runtime.OpTanh:
		return "tanh"
	case runtime.OpGather:
		return "gather"
	case runtime.OpMaskedMeanPool:
		return "masked-mean-pool"
	case runtime.OpL2Normalize:
		return "l2-normalize"
	case runtime.OpPermute:
		return "permute"
	case runtime.OpReshape:
		return "reshape"
	case runtime.OpMaskedSoftmax:
		return "masked-softmax"
	case runtime.OpConvert:
		return "convert"
	}
	return fmt.Sprintf("op-kind(%d)", uint8(k))
}

// step is one validated op with the types and shapes of its operands.
type step struct {
	index int
	op    runtime.Op
	in    []tensor
	out   tensor
}

// String names the op and its operand shapes for error messages.
func (s *step) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "op %d (%s", s.index, opName(s.op.Kind))
	for i, t := range s.in {
		sep := ", "
		if i == 0 {
			sep = " "
		}
		b.WriteString(sep + t.String())
	}
	if s.op.TransB {
		b.WriteString(", transB")
	}
	fmt.Fprintf(&b, " -> %s)", s.out)
	return b.String()
}

// plan is a validated graph: its steps in order and the intermediates the
// device allocates for the run.
type plan struct {
	steps []step
	temps []string
	types map[string]tensor
}

// planGraph checks g against the types and shapes of the bound buffers and
// infers the shape of every value, so that nothing malformed reaches C.
// Every name is written by at most one op and cannot be read before it is
// written; a bound name that no op writes is an input.
func planGraph(g *runtime.Graph, bound map[string]tensor) (*plan, error) {
	if g == nil || len(g.Ops) == 0 {
		return nil, fmt.Errorf("%w: empty graph", runtime.ErrInvalidGraph)
	}
	writer := map[string]int{}
	for i, op := range g.Ops {
		if op.Out == "" {
			return nil, fmt.Errorf("%w: op %d (%s) has no output name", runtime.ErrInvalidGraph, i, opName(op.Kind))
		}
		if j, ok := writer[op.Out]; ok {
			return nil, fmt.Errorf("%w: op %d (%s) writes %q, already written by op %d", runtime.ErrInvalidGraph, i, opName(op.Kind), op.Out, j)
		}
		writer[op.Out] = i
	}
	p := &plan{types: map[string]tensor{}}
	for name, t := range bound {
		if _, written := writer[name]; !written {
			p.types[name] = t
		}
	}
	for i, op := range g.Ops {
		in := make([]tensor, len(op.In))
		for j, name := range op.In {
			t, ok := p.types[name]
			if !ok {
				if w, written := writer[name]; written {
					return nil, fmt.Errorf("%w: op %d (%s) reads %q before op %d writes it", runtime.ErrInvalidGraph, i, opName(op.Kind), name, w)
				}
				return nil, fmt.Errorf("%w: op %d (%s) reads %q, which is neither bound nor written by an op", runtime.ErrInvalidGraph, i, opName(op.Kind), name)
			}
			in[j] = t
		}
		out, err := inferOp(op, in)
		if err != nil {
			return nil, fmt.Errorf("%w: op %d (%s) %s: %s", runtime.ErrInvalidGraph, i, opName(op.Kind), tensorList(in), err)
		}
		if b, ok := bound[op.Out]; ok {
			if b.dt != out.dt || !equalShape(b.shape, out.shape) {
				return nil, fmt.Errorf("%w: op %d (%s) %s: output %q is bound to %s, want %s", runtime.ErrInvalidGraph, i, opName(op.Kind), tensorList(in), op.Out, b, out)
			}
		} else {
			p.temps = append(p.temps, op.Out)
		}
		p.types[op.Out] = out
		p.steps = append(p.steps, step{index: i, op: op, in: in, out: out})
	}
	return p, nil
}

func tensorList(ts []tensor) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.String()
	}
	return strings.Join(parts, ", ")
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// inferOp checks one op's operands and returns its output's type and shape.
func inferOp(op runtime.Op, in []tensor) (tensor, error) {
	want := map[runtime.OpKind][2]int{ // min, max inputs
		runtime.OpMatMul: {2, 3}, runtime.OpBatchMatMul: {2, 2}, runtime.OpAdd: {2, 2},
		runtime.OpLayerNorm: {3, 3}, runtime.OpSoftmax: {1, 1}, runtime.OpGELU: {1, 1},
		runtime.OpReLU: {1, 1}, runtime.OpTanh: {1, 1}, runtime.OpGather: {2, 2},
		runtime.OpMaskedMeanPool: {2, 2}, runtime.OpL2Normalize: {1, 1},
		runtime.OpPermute: {1, 1}, runtime.OpReshape: {1, 1}, runtime.OpMaskedSoftmax: {2, 2},
		runtime.OpConvert: {1, 1},
	}
	n, ok := want[op.Kind]
	if !ok {
		return tensor{}, fmt.Errorf("unknown op kind %d", uint8(op.Kind))
	}
	if len(in) < n[0] || len(in) > n[1] {
		if n[0] == n[1] {
			return tensor{}, fmt.Errorf("takes %d inputs, got %d", n[0], len(in))
		}
		return tensor{}, fmt.Errorf("takes %d to %d inputs, got %d", n[0], n[1], len(in))
	}
	// A field an op does not use is rejected rather than ignored: an
	// activation or scale silently dropped would be a wrong answer.
	if op.Act != runtime.ActNone && op.Kind != runtime.OpMatMul {
		return tensor{}, fmt.Errorf("Act is only for matmul")
	}
	if op.Act > runtime.ActTanh {
		return tensor{}, fmt.Errorf("unknown activation %d", uint8(op.Act))
	}
	if op.TransB && op.Kind != runtime.OpMatMul && op.Kind != runtime.OpBatchMatMul {
		return tensor{}, fmt.Errorf("TransB is only for matmul and batch-matmul")
	}
	if op.Scale != 0 && op.Kind != runtime.OpBatchMatMul {
		return tensor{}, fmt.Errorf("Scale is only for batch-matmul")
	}
	if op.Eps != 0 && op.Kind != runtime.OpLayerNorm {
		return tensor{}, fmt.Errorf("Eps is only for layer-norm")
	}
	if op.Perm != nil && op.Kind != runtime.OpPermute {
		return tensor{}, fmt.Errorf("Perm is only for permute")
	}
	if op.Shape != nil && op.Kind != runtime.OpPermute && op.Kind != runtime.OpReshape {
		return tensor{}, fmt.Errorf("Shape is only for permute and reshape")
	}
	if op.DType != 0 && op.Kind != runtime.OpConvert {
		return tensor{}, fmt.Errorf("DType is only for convert")
	}
	for i, t := range in {
		if len(t.shape) == 0 {
			return tensor{}, fmt.Errorf("In[%d] has no dimensions", i)
		}
	}
	f32 := func(idx ...int) error {
		for _, i := range idx {
			if in[i].dt != runtime.F32 {
				return fmt.Errorf("In[%d] is %s, want f32", i, in[i].dt)
			}
		}
		return nil
	}

	switch op.Kind {
	case runtime.OpMatMul:
		a, w := in[0], in[1]
		if len(a.shape) < 2 {
			return tensor{}, fmt.Errorf("In[0] must have at least 2 dimensions")
		}
		if len(w.shape) != 2 {
			return tensor{}, fmt.Errorf("In[1] must be 2-D")
		}
		if err := matmulTypes(a, w); err != nil {
			return tensor{}, err
		}
		k := a.last()
		kw, nn := w.shape[0], w.shape[1]
		if op.TransB {
			nn, kw = w.shape[0], w.shape[1]
		}
		if kw != k {
			return tensor{}, fmt.Errorf("inner dimensions differ: In[0] has K=%d, In[1] has K=%d", k, kw)
		}
		if len(in) == 3 {
			if err := f32(2); err != nil {
				return tensor{}, err
			}
			if len(in[2].shape) != 1 || in[2].shape[0] != nn {
				return tensor{}, fmt.Errorf("bias is %s, want [%d]", shapeString(in[2].shape), nn)
			}
		}
		return tensor{runtime.F32, append(clone(a.shape[:len(a.shape)-1]), nn)}, nil

	case runtime.OpBatchMatMul:
		a, w := in[0], in[1]
		r := len(a.shape)
		if r < 3 {
			return tensor{}, fmt.Errorf("In[0] must have at least 3 dimensions")
		}
		if len(w.shape) != r || !equalShape(a.shape[:r-2], w.shape[:r-2]) {
			return tensor{}, fmt.Errorf("batch dimensions differ")
		}
		if err := matmulTypes(a, w); err != nil {
			return tensor{}, err
		}
		k := a.last()
		kw, nn := w.shape[r-2], w.shape[r-1]
		if op.TransB {
			nn, kw = w.shape[r-2], w.shape[r-1]
		}
		if kw != k {
			return tensor{}, fmt.Errorf("inner dimensions differ: In[0] has K=%d, In[1] has K=%d", k, kw)
		}
		return tensor{runtime.F32, append(clone(a.shape[:r-1]), nn)}, nil

	case runtime.OpAdd:
		if err := f32(0, 1); err != nil {
			return tensor{}, err
		}
		a, b := in[0], in[1]
		if !equalShape(a.shape, b.shape) && !(len(b.shape) == 1 && b.shape[0] == a.last()) {
			return tensor{}, fmt.Errorf("In[1] must be %s or [%d]", shapeString(a.shape), a.last())
		}
		return tensor{runtime.F32, clone(a.shape)}, nil

	case runtime.OpLayerNorm:
		if err := f32(0, 1, 2); err != nil {
			return tensor{}, err
		}
		nn := in[0].last()
		for i := 1; i < 3; i++ {
			if len(in[i].shape) != 1 || in[i].shape[0] != nn {
				return tensor{}, fmt.Errorf("In[%d] is %s, want [%d]", i, shapeString(in[i].shape), nn)
			}
		}
		if !(op.Eps >= 0) {
			return tensor{}, fmt.Errorf("Eps %g is negative", op.Eps)
		}
		return tensor{runtime.F32, clone(in[0].shape)}, nil

	case runtime.OpSoftmax, runtime.OpGELU, runtime.OpReLU, runtime.OpTanh, runtime.OpL2Normalize:
		if err := f32(0); err != nil {
			return tensor{}, err
		}
		return tensor{runtime.F32, clone(in[0].shape)}, nil

	case runtime.OpGather:
		table, idx := in[0], in[1]
		if err := f32(0); err != nil {
			return tensor{}, err
		}
		if len(table.shape) != 2 {
			return tensor{}, fmt.Errorf("table must be 2-D [V,D]")
		}
		if idx.dt != runtime.I32 {
			return tensor{}, fmt.Errorf("indices are %s, want i32", idx.dt)
		}
		return tensor{runtime.F32, append(clone(idx.shape), table.shape[1])}, nil

	case runtime.OpMaskedMeanPool:
		x, mask := in[0], in[1]
		if err := f32(0); err != nil {
			return tensor{}, err
		}
		if len(x.shape) != 3 {
			return tensor{}, fmt.Errorf("In[0] must be 3-D [B,S,D]")
		}
		if mask.dt != runtime.F32 && mask.dt != runtime.I32 {
			return tensor{}, fmt.Errorf("mask is %s, want f32 or i32", mask.dt)
		}
		if !equalShape(mask.shape, x.shape[:2]) {
			return tensor{}, fmt.Errorf("mask is %s, want %s", shapeString(mask.shape), shapeString(x.shape[:2]))
		}
		return tensor{runtime.F32, []int{x.shape[0], x.shape[2]}}, nil

	case runtime.OpPermute:
		if err := floatType(in[0]); err != nil {
			return tensor{}, err
		}
		view := in[0].shape
		if op.Shape != nil {
			if err := sameCount(op.Shape, in[0]); err != nil {
				return tensor{}, err
			}
			view = op.Shape
		}
		if len(view) > maxPermuteDims {
			return tensor{}, fmt.Errorf("%d dimensions, at most %d", len(view), maxPermuteDims)
		}
		if len(op.Perm) != len(view) {
			return tensor{}, fmt.Errorf("Perm %v has %d entries for %d dimensions", op.Perm, len(op.Perm), len(view))
		}
		seen := make([]bool, len(view))
		out := make([]int, len(view))
		for i, p := range op.Perm {
			if p < 0 || p >= len(view) || seen[p] {
				return tensor{}, fmt.Errorf("Perm %v is not a permutation of 0..%d", op.Perm, len(view)-1)
			}
			seen[p] = true
			out[i] = view[p]
		}
		return tensor{in[0].dt, out}, nil

	case runtime.OpReshape:
		if err := floatType(in[0]); err != nil {
			return tensor{}, err
		}
		if op.Shape == nil {
			return tensor{}, fmt.Errorf("no Shape")
		}
		out := clone(op.Shape)
		free, known := -1, 1
		for i, d := range out {
			switch {
			case d == -1 && free < 0:
				free = i
			case d > 0:
				known *= d
			default:
				return tensor{}, fmt.Errorf("Shape %v: dimension %d is %d", op.Shape, i, d)
			}
		}
		if free >= 0 {
			if in[0].numel()%known != 0 {
				return tensor{}, fmt.Errorf("Shape %v does not divide %d elements", op.Shape, in[0].numel())
			}
			out[free] = in[0].numel() / known
		}
		if err := sameCount(out, in[0]); err != nil {
			return tensor{}, err
		}
		return tensor{in[0].dt, out}, nil

	case runtime.OpMaskedSoftmax:
		x, mask := in[0], in[1]
		if err := f32(0); err != nil {
			return tensor{}, err
		}
		if len(x.shape) < 2 {
			return tensor{}, fmt.Errorf("In[0] must have at least 2 dimensions [B,...,N]")
		}
		if mask.dt != runtime.F32 && mask.dt != runtime.I32 {
			return tensor{}, fmt.Errorf("mask is %s, want f32 or i32", mask.dt)
		}
		if want := []int{x.shape[0], x.last()}; !equalShape(mask.shape, want) {
			return tensor{}, fmt.Errorf("mask is %s, want %s", shapeString(mask.shape), shapeString(want))
		}
		return tensor{runtime.F32, clone(x.shape)}, nil

	case runtime.OpConvert:
		if err := floatType(in[0]); err != nil {
			return tensor{}, err
		}
		if op.DType != runtime.F32 && op.DType != runtime.BF16 {
			return tensor{}, fmt.Errorf("DType %s: want f32 or bf16", op.DType)
		}
		return tensor{op.DType, clone(in[0].shape)}, nil
	}
	return tensor{}, fmt.Errorf("unknown op kind %d", uint8(op.Kind))
}

// matmulTypes allows f32 or bf16 operands, the same type on both sides.
func matmulTypes(a, w tensor) error {
	if a.dt != runtime.F32 && a.dt != runtime.BF16 {
		return fmt.Errorf("In[0] is %s, want f32 or bf16", a.dt)
	}
	if w.dt != a.dt {
		return fmt.Errorf("In[1] is %s and In[0] %s: both must be the same type", w.dt, a.dt)
	}
	return nil
}

// maxPermuteDims bounds OpPermute's rank (oneDNN's limit is 12; more than
// 6 has no use in these models).
const maxPermuteDims = 6

// floatType allows f32 or bf16 data (ops that move values without arithmetic).
func floatType(t tensor) error {
	if t.dt != runtime.F32 && t.dt != runtime.BF16 {
		return fmt.Errorf("In[0] is %s, want f32 or bf16", t.dt)
	}
	return nil
}

// sameCount checks that shape is a view of t: positive dimensions, the same
// element count.
func sameCount(shape []int, t tensor) error {
	n, err := elements(shape)
	if err != nil {
		return fmt.Errorf("Shape %v: %w", shape, err)
	}
	if n != t.numel() {
		return fmt.Errorf("Shape %v has %d elements, In[0] %d", shape, n, t.numel())
	}
	return nil
}

func clone(s []int) []int { return append([]int(nil), s...) }
