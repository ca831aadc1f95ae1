package pjrt

import (
	"fmt"
	"slices"
	"strings"

	"github.com/brokerd/brokerd/runtime"
)

// TensorType is the element type and shape of a graph value.
type TensorType struct {
	DType runtime.DType
	Shape []int
}

func (t TensorType) numel() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

func (t TensorType) last() int { return t.Shape[len(t.Shape)-1] }

func (t TensorType) String() string { return shapeString(t.Shape) + " " + t.DType.String() }

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

// step is one validated op with the types of its operands.
type step struct {
	op  runtime.Op
	in  []TensorType
	out TensorType
}

// plan is a validated graph: its steps in order, the bound names it reads
// (inputs) and the bound names it writes (outputs), both sorted.
type plan struct {
	steps   []step
	inputs  []string
	outputs []string
	types   map[string]TensorType
}

// planGraph checks g against the bound types and infers every value's type,
// with the rules of runtime/adapter.go (the same as runtime/onednn's), so
// a graph that runs on the CPU lowers here and one that does not is refused
// with runtime.ErrInvalidGraph before anything is compiled.
func planGraph(g *runtime.Graph, bound map[string]TensorType) (*plan, error) {
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
	p := &plan{types: map[string]TensorType{}}
	for name, t := range bound {
		if _, written := writer[name]; !written {
			p.types[name] = t
		}
	}
	read := map[string]bool{}
	for i, op := range g.Ops {
		in := make([]TensorType, len(op.In))
		for j, name := range op.In {
			t, ok := p.types[name]
			if !ok {
				if w, written := writer[name]; written {
					return nil, fmt.Errorf("%w: op %d (%s) reads %q before op %d writes it", runtime.ErrInvalidGraph, i, opName(op.Kind), name, w)
				}
				return nil, fmt.Errorf("%w: op %d (%s) reads %q, which is neither bound nor written by an op", runtime.ErrInvalidGraph, i, opName(op.Kind), name)
			}
			if _, written := writer[name]; !written {
				read[name] = true
			}
			in[j] = t
		}
		out, err := inferOp(op, in)
		if err != nil {
			return nil, fmt.Errorf("%w: op %d (%s) %s: %s", runtime.ErrInvalidGraph, i, opName(op.Kind), typeList(in), err)
		}
		if b, ok := bound[op.Out]; ok {
			if b.DType != out.DType || !slices.Equal(b.Shape, out.Shape) {
				return nil, fmt.Errorf("%w: op %d (%s) %s: output %q is bound to %s, want %s", runtime.ErrInvalidGraph, i, opName(op.Kind), typeList(in), op.Out, b, out)
			}
			p.outputs = append(p.outputs, op.Out)
		}
		p.types[op.Out] = out
		p.steps = append(p.steps, step{op: op, in: in, out: out})
	}
	if len(p.outputs) == 0 {
		return nil, fmt.Errorf("%w: no op writes a bound name, so the graph has no output", runtime.ErrInvalidGraph)
	}
	for name := range read {
		p.inputs = append(p.inputs, name)
	}
	slices.Sort(p.inputs)
	slices.Sort(p.outputs)
	return p, nil
}

func typeList(ts []TensorType) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.String()
	}
	return strings.Join(parts, ", ")
}

// maxPermuteDims bounds OpPermute's rank, as runtime/onednn does, so a graph
// valid on one device is valid on the other.
const maxPermuteDims = 6

// inferOp checks one op's operands and returns its output's type.
func inferOp(op runtime.Op, in []TensorType) (TensorType, error) {
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
		return TensorType{}, fmt.Errorf("unknown op kind %d", uint8(op.Kind))
	}
	if len(in) < n[0] || len(in) > n[1] {
		if n[0] == n[1] {
			return TensorType{}, fmt.Errorf("takes %d inputs, got %d", n[0], len(in))
		}
		return TensorType{}, fmt.Errorf("takes %d to %d inputs, got %d", n[0], n[1], len(in))
	}
	// A field an op does not use is refused rather than ignored: an
	// activation or scale silently dropped would be a wrong answer.
	switch {
	case op.Act != runtime.ActNone && op.Kind != runtime.OpMatMul:
		return TensorType{}, fmt.Errorf("Act is only for matmul")
	case op.Act > runtime.ActTanh:
		return TensorType{}, fmt.Errorf("unknown activation %d", uint8(op.Act))
	case op.TransB && op.Kind != runtime.OpMatMul && op.Kind != runtime.OpBatchMatMul:
		return TensorType{}, fmt.Errorf("TransB is only for matmul and batch-matmul")
	case op.Scale != 0 && op.Kind != runtime.OpBatchMatMul:
		return TensorType{}, fmt.Errorf("Scale is only for batch-matmul")
	case op.Eps != 0 && op.Kind != runtime.OpLayerNorm:
		return TensorType{}, fmt.Errorf("Eps is only for layer-norm")
	case op.Perm != nil && op.Kind != runtime.OpPermute:
		return TensorType{}, fmt.Errorf("Perm is only for permute")
	case op.Shape != nil && op.Kind != runtime.OpPermute && op.Kind != runtime.OpReshape:
		return TensorType{}, fmt.Errorf("Shape is only for permute and reshape")
	case op.DType != 0 && op.Kind != runtime.OpConvert:
		return TensorType{}, fmt.Errorf("DType is only for convert")
	}
	for i, t := range in {
		if len(t.Shape) == 0 {
			return TensorType{}, fmt.Errorf("In[%d] has no dimensions", i)
		}
		for _, d := range t.Shape {
			if d <= 0 {
				return TensorType{}, fmt.Errorf("In[%d] has shape %s", i, shapeString(t.Shape))
			}
		}
	}
	f32 := func(idx ...int) error {
		for _, i := range idx {
			if in[i].DType != runtime.F32 {
				return fmt.Errorf("In[%d] is %s, want f32", i, in[i].DType)
			}
		}
		return nil
	}
	mask := func(m TensorType, want []int) error {
		if m.DType != runtime.F32 && m.DType != runtime.I32 {
			return fmt.Errorf("mask is %s, want f32 or i32", m.DType)
		}
		if !slices.Equal(m.Shape, want) {
			return fmt.Errorf("mask is %s, want %s", shapeString(m.Shape), shapeString(want))
		}
		return nil
	}

	switch op.Kind {
	case runtime.OpMatMul:
		a, w := in[0], in[1]
		if len(a.Shape) < 2 {
			return TensorType{}, fmt.Errorf("In[0] must have at least 2 dimensions")
		}
		if len(w.Shape) != 2 {
			return TensorType{}, fmt.Errorf("In[1] must be 2-D")
		}
		if err := matmulTypes(a, w); err != nil {
			return TensorType{}, err
		}
		kw, nn := w.Shape[0], w.Shape[1]
		if op.TransB {
			nn, kw = w.Shape[0], w.Shape[1]
		}
		if kw != a.last() {
			return TensorType{}, fmt.Errorf("inner dimensions differ: In[0] has K=%d, In[1] has K=%d", a.last(), kw)
		}
		if len(in) == 3 {
			if err := f32(2); err != nil {
				return TensorType{}, err
			}
			if len(in[2].Shape) != 1 || in[2].Shape[0] != nn {
				return TensorType{}, fmt.Errorf("bias is %s, want [%d]", shapeString(in[2].Shape), nn)
			}
		}
		return TensorType{runtime.F32, append(slices.Clone(a.Shape[:len(a.Shape)-1]), nn)}, nil

	case runtime.OpBatchMatMul:
		a, w := in[0], in[1]
		r := len(a.Shape)
		if r < 3 {
			return TensorType{}, fmt.Errorf("In[0] must have at least 3 dimensions")
		}
		if len(w.Shape) != r || !slices.Equal(a.Shape[:r-2], w.Shape[:r-2]) {
			return TensorType{}, fmt.Errorf("batch dimensions differ")
		}
		if err := matmulTypes(a, w); err != nil {
			return TensorType{}, err
		}
		kw, nn := w.Shape[r-2], w.Shape[r-1]
		if op.TransB {
			nn, kw = w.Shape[r-2], w.Shape[r-1]
		}
		if kw != a.last() {
			return TensorType{}, fmt.Errorf("inner dimensions differ: In[0] has K=%d, In[1] has K=%d", a.last(), kw)
		}
		return TensorType{runtime.F32, append(slices.Clone(a.Shape[:r-1]), nn)}, nil

	case runtime.OpAdd:
		if err := f32(0, 1); err != nil {
			return TensorType{}, err
		}
		a, b := in[0], in[1]
		if !slices.Equal(a.Shape, b.Shape) && !(len(b.Shape) == 1 && b.Shape[0] == a.last()) {
			return TensorType{}, fmt.Errorf("In[1] must be %s or [%d]", shapeString(a.Shape), a.last())
		}
		return TensorType{runtime.F32, slices.Clone(a.Shape)}, nil

	case runtime.OpLayerNorm:
		if err := f32(0, 1, 2); err != nil {
			return TensorType{}, err
		}
		nn := in[0].last()
		for i := 1; i < 3; i++ {
			if len(in[i].Shape) != 1 || in[i].Shape[0] != nn {
				return TensorType{}, fmt.Errorf("In[%d] is %s, want [%d]", i, shapeString(in[i].Shape), nn)
			}
		}
		if !(op.Eps >= 0) {
			return TensorType{}, fmt.Errorf("Eps %g is negative", op.Eps)
		}
		return TensorType{runtime.F32, slices.Clone(in[0].Shape)}, nil

	case runtime.OpSoftmax, runtime.OpGELU, runtime.OpReLU, runtime.OpTanh, runtime.OpL2Normalize:
		if err := f32(0); err != nil {
			return TensorType{}, err
		}
		return TensorType{runtime.F32, slices.Clone(in[0].Shape)}, nil

	case runtime.OpGather:
		table, idx := in[0], in[1]
		if err := f32(0); err != nil {
			return TensorType{}, err
		}
		if len(table.Shape) != 2 {
			return TensorType{}, fmt.Errorf("table must be 2-D [V,D]")
		}
		if idx.DType != runtime.I32 {
			return TensorType{}, fmt.Errorf("indices are %s, want i32", idx.DType)
		}
		return TensorType{runtime.F32, append(slices.Clone(idx.Shape), table.Shape[1])}, nil

	case runtime.OpMaskedMeanPool:
		x := in[0]
		if err := f32(0); err != nil {
			return TensorType{}, err
		}
		if len(x.Shape) != 3 {
			return TensorType{}, fmt.Errorf("In[0] must be 3-D [B,S,D]")
		}
		if err := mask(in[1], x.Shape[:2]); err != nil {
			return TensorType{}, err
		}
		return TensorType{runtime.F32, []int{x.Shape[0], x.Shape[2]}}, nil

	case runtime.OpPermute:
		if err := floatType(in[0]); err != nil {
			return TensorType{}, err
		}
		view := in[0].Shape
		if op.Shape != nil {
			if err := sameCount(op.Shape, in[0]); err != nil {
				return TensorType{}, err
			}
			view = op.Shape
		}
		if len(view) > maxPermuteDims {
			return TensorType{}, fmt.Errorf("%d dimensions, at most %d", len(view), maxPermuteDims)
		}
		if len(op.Perm) != len(view) {
			return TensorType{}, fmt.Errorf("Perm %v has %d entries for %d dimensions", op.Perm, len(op.Perm), len(view))
		}
		seen := make([]bool, len(view))
		out := make([]int, len(view))
		for i, p := range op.Perm {
			if p < 0 || p >= len(view) || seen[p] {
				return TensorType{}, fmt.Errorf("Perm %v is not a permutation of 0..%d", op.Perm, len(view)-1)
			}
			seen[p] = true
			out[i] = view[p]
		}
		return TensorType{in[0].DType, out}, nil

	case runtime.OpReshape:
		if err := floatType(in[0]); err != nil {
			return TensorType{}, err
		}
		if op.Shape == nil {
			return TensorType{}, fmt.Errorf("no Shape")
		}
		out, err := resolveShape(op.Shape, in[0].numel())
		if err != nil {
			return TensorType{}, err
		}
		return TensorType{in[0].DType, out}, nil

	case runtime.OpMaskedSoftmax:
		x := in[0]
		if err := f32(0); err != nil {
			return TensorType{}, err
		}
		if len(x.Shape) < 2 {
			return TensorType{}, fmt.Errorf("In[0] must have at least 2 dimensions [B,...,N]")
		}
		if err := mask(in[1], []int{x.Shape[0], x.last()}); err != nil {
			return TensorType{}, err
		}
		return TensorType{runtime.F32, slices.Clone(x.Shape)}, nil

	case runtime.OpConvert:
		if err := floatType(in[0]); err != nil {
			return TensorType{}, err
		}
		if op.DType != runtime.F32 && op.DType != runtime.BF16 {
			return TensorType{}, fmt.Errorf("DType %s: want f32 or bf16", op.DType)
		}
		return TensorType{op.DType, slices.Clone(in[0].Shape)}, nil
	}
	return TensorType{}, fmt.Errorf("unknown op kind %d", uint8(op.Kind))
}

// matmulTypes allows f32 or bf16 operands, the same type on both sides.
func matmulTypes(a, w TensorType) error {
	if a.DType != runtime.F32 && a.DType != runtime.BF16 {
		return fmt.Errorf("In[0] is %s, want f32 or bf16", a.DType)
	}
	if w.DType != a.DType {
		return fmt.Errorf("In[1] is %s and In[0] %s: both must be the same type", w.DType, a.DType)
	}
	return nil
}

// floatType allows f32 or bf16 data (ops that move values without arithmetic).
func floatType(t TensorType) error {
	if t.DType != runtime.F32 && t.DType != runtime.BF16 {
		return fmt.Errorf("In[0] is %s, want f32 or bf16", t.DType)
	}
	return nil
}

// sameCount checks that shape is a view of t: positive dimensions, the same
// element count.
func sameCount(shape []int, t TensorType) error {
	n := 1
	for i, d := range shape {
		if d <= 0 {
			return fmt.Errorf("Shape %v: dimension %d is %d", shape, i, d)
		}
		n *= d
	}
	if n != t.numel() {
		return fmt.Errorf("Shape %v has %d elements, In[0] %d", shape, n, t.numel())
	}
	return nil
}

// resolveShape fills in a reshape's one -1 dimension from the element count.
func resolveShape(shape []int, numel int) ([]int, error) {
	out := slices.Clone(shape)
	free, known := -1, 1
	for i, d := range out {
		switch {
		case d == -1 && free < 0:
			free = i
		case d > 0:
			known *= d
		default:
			return nil, fmt.Errorf("Shape %v: dimension %d is %d", shape, i, d)
		}
	}
	if free >= 0 {
		if numel%known != 0 {
			return nil, fmt.Errorf("Shape %v does not divide %d elements", shape, numel)
		}
		out[free] = numel / known
	}
	if n := known * valueAt(out, free); n != numel {
		return nil, fmt.Errorf("Shape %v has %d elements, In[0] %d", shape, n, numel)
	}
	return out, nil
}

// valueAt is s[i], or 1 when i is -1 (no inferred dimension).
func valueAt(s []int, i int) int {
	if i < 0 {
		return 1
	}
	return s[i]
}
