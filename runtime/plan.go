package runtime

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// TensorType is the element type and shape of a named value of a graph.
type TensorType struct {
	DType DType
	Shape []int
}

// NumElements is the product of the dimensions.
func (t TensorType) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Last is the size of the last dimension.
func (t TensorType) Last() int { return t.Shape[len(t.Shape)-1] }

func (t TensorType) String() string { return shapeString(t.Shape) + " " + t.DType.String() }

func shapeString(shape []int) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func typeList(ts []TensorType) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.String()
	}
	return strings.Join(parts, ", ")
}

// String is the op's name in error messages: "matmul", "layer-norm".
func (k OpKind) String() string {
	switch k {
	case OpMatMul:
		return "matmul"
	case OpBatchMatMul:
		return "batch-matmul"
	case OpAdd:
		return "add"
	case OpLayerNorm:
		return "layer-norm"
	case OpSoftmax:
		return "softmax"
	case OpGELU:
		return "gelu"
	case OpReLU:
		return "relu"
	case OpTanh:
		return "tanh"
	case OpGather:
		return "gather"
	case OpMaskedMeanPool:
		return "masked-mean-pool"
	case OpL2Normalize:
		return "l2-normalize"
	case OpPermute:
		return "permute"
	case OpReshape:
		return "reshape"
	case OpMaskedSoftmax:
		return "masked-softmax"
	case OpConvert:
		return "convert"
	case OpRMSNorm:
		return "rms-norm"
	case OpSiLU:
		return "silu"
	case OpSwiGLU:
		return "swiglu"
	case OpRoPE:
		return "rope"
	case OpKVWrite:
		return "kv-write"
	case OpPagedAttention:
		return "paged-attention"
	case OpAttention:
		return "attention"
	}
	return fmt.Sprintf("op-kind(%d)", uint8(k))
}

// MaxPermuteDims bounds OpPermute's rank on every adapter, so a graph valid
// on one device is valid on the others (oneDNN's limit is 12; more than 6
// has no use in these models).
const MaxPermuteDims = 6

// MaxHeadDim bounds the head dimension D of OpRoPE and OpPagedAttention:
// kernels keep a head's rotation table and accumulators on the stack.
const MaxHeadDim = 1024

// Step is one validated op of a graph with the types and shapes of its
// operands. Index is the op's position in Graph.Ops.
type Step struct {
	Index int
	Op    Op
	In    []TensorType
	Out   TensorType
}

// String names the op and its operand shapes for error messages.
func (s Step) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "op %d (%s", s.Index, s.Op.Kind)
	for i, t := range s.In {
		sep := ", "
		if i == 0 {
			sep = " "
		}
		b.WriteString(sep + t.String())
	}
	if s.Op.TransB {
		b.WriteString(", transB")
	}
	fmt.Fprintf(&b, " -> %s)", s.Out)
	return b.String()
}

// Plan is a validated graph: its steps in order, the bound names it reads
// (Inputs) and writes (Outputs), both sorted, the intermediates no binding
// holds (Temps, in the order their ops write them), and the type of every
// value it reads or writes.
type Plan struct {
	Steps   []Step
	Inputs  []string
	Outputs []string
	Temps   []string
	Types   map[string]TensorType
}

// PlanGraph checks g against the types and shapes of the bound values and
// infers the type and shape of every value, with the rules every adapter
// shares, so that nothing malformed reaches a backend: a graph valid on one
// device is valid on the others. Every name is written by at most one op and
// cannot be read before it is written; a bound name that no op writes is an
// input. Errors wrap ErrInvalidGraph. Adapters add their own checks (types
// a device cannot hold, a graph with no output) on top.
func PlanGraph(g *Graph, bound map[string]TensorType) (*Plan, error) {
	if g == nil || len(g.Ops) == 0 {
		return nil, fmt.Errorf("%w: empty graph", ErrInvalidGraph)
	}
	writer := map[string]int{}
	for i, op := range g.Ops {
		if op.Out == "" {
			return nil, fmt.Errorf("%w: op %d (%s) has no output name", ErrInvalidGraph, i, op.Kind)
		}
		if j, ok := writer[op.Out]; ok {
			return nil, fmt.Errorf("%w: op %d (%s) writes %q, already written by op %d", ErrInvalidGraph, i, op.Kind, op.Out, j)
		}
		writer[op.Out] = i
	}
	p := &Plan{Types: map[string]TensorType{}}
	for name, t := range bound {
		if _, written := writer[name]; !written {
			p.Types[name] = t
		}
	}
	read := map[string]bool{}
	for i, op := range g.Ops {
		in := make([]TensorType, len(op.In))
		for j, name := range op.In {
			t, ok := p.Types[name]
			if !ok {
				if w, written := writer[name]; written {
					return nil, fmt.Errorf("%w: op %d (%s) reads %q before op %d writes it", ErrInvalidGraph, i, op.Kind, name, w)
				}
				return nil, fmt.Errorf("%w: op %d (%s) reads %q, which is neither bound nor written by an op", ErrInvalidGraph, i, op.Kind, name)
			}
			if _, written := writer[name]; !written {
				read[name] = true
			}
			in[j] = t
		}
		var out TensorType
		var err error
		if op.Kind == OpKVWrite {
			// The cache is the op's output and also what it updates: its type
			// comes from the binding, and its old contents are an input.
			cache, ok := bound[op.Out]
			if !ok {
				return nil, fmt.Errorf("%w: op %d (%s) %s: the cache %q must be a bound buffer", ErrInvalidGraph, i, op.Kind, typeList(in), op.Out)
			}
			out, err = inferKVWrite(op, in, cache)
			read[op.Out] = true
		} else {
			out, err = inferOp(op, in)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: op %d (%s) %s: %s", ErrInvalidGraph, i, op.Kind, typeList(in), err)
		}
		if b, ok := bound[op.Out]; ok {
			if b.DType != out.DType || !slices.Equal(b.Shape, out.Shape) {
				return nil, fmt.Errorf("%w: op %d (%s) %s: output %q is bound to %s, want %s", ErrInvalidGraph, i, op.Kind, typeList(in), op.Out, b, out)
			}
			p.Outputs = append(p.Outputs, op.Out)
		} else {
			p.Temps = append(p.Temps, op.Out)
		}
		p.Types[op.Out] = out
		p.Steps = append(p.Steps, Step{Index: i, Op: op, In: in, Out: out})
	}
	for name := range read {
		if _, written := writer[name]; written && g.Ops[writer[name]].Kind != OpKVWrite {
			continue
		}
		p.Inputs = append(p.Inputs, name)
	}
	slices.Sort(p.Inputs)
	slices.Sort(p.Outputs)
	return p, nil
}

// opInputs is each op's least and most inputs.
var opInputs = map[OpKind][2]int{
	OpMatMul: {2, 4}, OpBatchMatMul: {2, 2}, OpAdd: {2, 2},
	OpLayerNorm: {3, 3}, OpSoftmax: {1, 1}, OpGELU: {1, 1},
	OpReLU: {1, 1}, OpTanh: {1, 1}, OpGather: {2, 2},
	OpMaskedMeanPool: {2, 2}, OpL2Normalize: {1, 1},
	OpPermute: {1, 1}, OpReshape: {1, 1}, OpMaskedSoftmax: {2, 2},
	OpConvert: {1, 1}, OpRMSNorm: {2, 2}, OpSiLU: {1, 1},
	OpSwiGLU: {1, 1}, OpRoPE: {3, 3}, OpPagedAttention: {6, 6},
	OpAttention: {2, 2},
}

// inferOp checks one op's operands and returns its output's type and shape.
func inferOp(op Op, in []TensorType) (TensorType, error) {
	n, ok := opInputs[op.Kind]
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
	case op.Act != ActNone && op.Kind != OpMatMul:
		return TensorType{}, fmt.Errorf("Act is only for matmul")
	case op.Act > ActSwiGLU:
		return TensorType{}, fmt.Errorf("unknown activation %d", uint8(op.Act))
	case op.TransB && op.Kind != OpMatMul && op.Kind != OpBatchMatMul:
		return TensorType{}, fmt.Errorf("TransB is only for matmul and batch-matmul")
	case op.Scale != 0 && op.Kind != OpBatchMatMul && op.Kind != OpPagedAttention && op.Kind != OpAttention:
		return TensorType{}, fmt.Errorf("Scale is only for batch-matmul, paged-attention and attention")
	case op.Heads != 0 && op.Kind != OpAttention:
		return TensorType{}, fmt.Errorf("Heads is only for attention")
	case op.Eps != 0 && op.Kind != OpLayerNorm && op.Kind != OpRMSNorm:
		return TensorType{}, fmt.Errorf("Eps is only for layer-norm and rms-norm")
	case op.Perm != nil && op.Kind != OpPermute:
		return TensorType{}, fmt.Errorf("Perm is only for permute")
	case op.Shape != nil && op.Kind != OpPermute && op.Kind != OpReshape:
		return TensorType{}, fmt.Errorf("Shape is only for permute and reshape")
	case op.BF16Products && op.Kind != OpPagedAttention:
		return TensorType{}, fmt.Errorf("BF16Products is only for paged-attention")
	case op.DType != 0 && op.Kind != OpConvert && op.Kind != OpMatMul && op.Kind != OpBatchMatMul && op.Kind != OpAttention:
		return TensorType{}, fmt.Errorf("DType is only for convert, matmul, batch-matmul and attention")
	}
	for i, t := range in {
		if len(t.Shape) == 0 {
			return TensorType{}, fmt.Errorf("In[%d] has no dimensions", i)
		}
		// Block-quantized values are weights: a matmul's (transposed) In[1]
		// or a gather's table, whose rows are whole blocks; or a Q8_0 or
		// Q4_0 KV cache.
		if t.DType.Quantized() {
			cache := op.Kind == OpPagedAttention && (i == 1 || i == 2) // its case checks type and shape
			weight := (op.Kind == OpMatMul && i == 1 && op.TransB) || (op.Kind == OpGather && i == 0)
			if !weight && !cache {
				return TensorType{}, fmt.Errorf("In[%d] is %s: a block type is only a transposed matmul weight, a gather table or a KV cache", i, t.DType)
			}
			if weight && (len(t.Shape) != 2 || t.Shape[1]%t.DType.BlockElems() != 0) {
				return TensorType{}, fmt.Errorf("In[%d] is %s %s: rows must be whole blocks of %d", i, shapeString(t.Shape), t.DType, t.DType.BlockElems())
			}
		}
		for _, d := range t.Shape {
			if d <= 0 {
				return TensorType{}, fmt.Errorf("In[%d] has shape %s", i, shapeString(t.Shape))
			}
		}
	}
	f32 := func(idx ...int) error {
		for _, i := range idx {
			if in[i].DType != F32 {
				return fmt.Errorf("In[%d] is %s, want f32", i, in[i].DType)
			}
		}
		return nil
	}
	mask := func(m TensorType, want []int) error {
		if m.DType != F32 && m.DType != I32 {
			return fmt.Errorf("mask is %s, want f32 or i32", m.DType)
		}
		if !slices.Equal(m.Shape, want) {
			return fmt.Errorf("mask is %s, want %s", shapeString(m.Shape), shapeString(want))
		}
		return nil
	}

	switch op.Kind {
	case OpMatMul:
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
		if w.DType.Quantized() && (op.Act != ActNone && op.Act != ActSwiGLU || len(in) == 4) {
			return TensorType{}, fmt.Errorf("a matmul with %s weights takes a bias or SwiGLU but no other activation or residual", w.DType)
		}
		if op.Act == ActSwiGLU && (!w.DType.Quantized() || len(in) != 2) {
			return TensorType{}, fmt.Errorf("SwiGLU is only for a matmul with block-quantized weights and no bias")
		}
		kw, nn := w.Shape[0], w.Shape[1]
		if op.TransB {
			nn, kw = w.Shape[0], w.Shape[1]
		}
		if kw != a.Last() {
			return TensorType{}, fmt.Errorf("inner dimensions differ: In[0] has K=%d, In[1] has K=%d", a.Last(), kw)
		}
		if len(in) >= 3 {
			if err := f32(2); err != nil {
				return TensorType{}, err
			}
			if len(in[2].Shape) != 1 || in[2].Shape[0] != nn {
				return TensorType{}, fmt.Errorf("bias is %s, want [%d]", shapeString(in[2].Shape), nn)
			}
		}
		dt, err := productType(op, a)
		if err != nil {
			return TensorType{}, err
		}
		if op.Act == ActSwiGLU {
			if nn%2 != 0 {
				return TensorType{}, fmt.Errorf("SwiGLU needs an even number of columns, not %d", nn)
			}
			nn /= 2
		}
		out := append(slices.Clone(a.Shape[:len(a.Shape)-1]), nn)
		if len(in) == 4 {
			if err := f32(3); err != nil {
				return TensorType{}, err
			}
			if !slices.Equal(in[3].Shape, out) {
				return TensorType{}, fmt.Errorf("residual is %s, want the output's %s", shapeString(in[3].Shape), shapeString(out))
			}
			if dt != F32 {
				return TensorType{}, fmt.Errorf("a matmul with a residual writes f32, not %s", dt)
			}
		}
		return TensorType{dt, out}, nil

	case OpBatchMatMul:
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
		if kw != a.Last() {
			return TensorType{}, fmt.Errorf("inner dimensions differ: In[0] has K=%d, In[1] has K=%d", a.Last(), kw)
		}
		dt, err := productType(op, a)
		if err != nil {
			return TensorType{}, err
		}
		return TensorType{dt, append(slices.Clone(a.Shape[:r-1]), nn)}, nil

	case OpAdd:
		if err := f32(0, 1); err != nil {
			return TensorType{}, err
		}
		a, b := in[0], in[1]
		if !slices.Equal(a.Shape, b.Shape) && !(len(b.Shape) == 1 && b.Shape[0] == a.Last()) {
			return TensorType{}, fmt.Errorf("In[1] must be %s or [%d]", shapeString(a.Shape), a.Last())
		}
		return TensorType{F32, slices.Clone(a.Shape)}, nil

	case OpLayerNorm:
		if err := f32(0, 1, 2); err != nil {
			return TensorType{}, err
		}
		nn := in[0].Last()
		for i := 1; i < 3; i++ {
			if len(in[i].Shape) != 1 || in[i].Shape[0] != nn {
				return TensorType{}, fmt.Errorf("In[%d] is %s, want [%d]", i, shapeString(in[i].Shape), nn)
			}
		}
		if !(op.Eps >= 0) {
			return TensorType{}, fmt.Errorf("Eps %g is negative", op.Eps)
		}
		return TensorType{F32, slices.Clone(in[0].Shape)}, nil

	case OpRMSNorm:
		if err := floatType(in[0]); err != nil {
			return TensorType{}, err
		}
		if err := f32(1); err != nil {
			return TensorType{}, err
		}
		if len(in[1].Shape) != 1 || in[1].Shape[0] != in[0].Last() {
			return TensorType{}, fmt.Errorf("weight is %s, want [%d]", shapeString(in[1].Shape), in[0].Last())
		}
		if !(op.Eps >= 0) {
			return TensorType{}, fmt.Errorf("Eps %g is negative", op.Eps)
		}
		return TensorType{in[0].DType, slices.Clone(in[0].Shape)}, nil

	case OpSwiGLU:
		if err := floatType(in[0]); err != nil {
			return TensorType{}, err
		}
		if in[0].Last()%2 != 0 {
			return TensorType{}, fmt.Errorf("last dimension %d is not [gate | up], an even size", in[0].Last())
		}
		out := slices.Clone(in[0].Shape)
		out[len(out)-1] /= 2
		return TensorType{in[0].DType, out}, nil

	case OpRoPE:
		x := in[0]
		if err := floatType(x); err != nil {
			return TensorType{}, err
		}
		if len(x.Shape) != 3 {
			return TensorType{}, fmt.Errorf("In[0] must be 3-D [T,H,D]")
		}
		d := x.Shape[2]
		if d%2 != 0 || d > MaxHeadDim {
			return TensorType{}, fmt.Errorf("head dimension %d: want even and at most %d", d, MaxHeadDim)
		}
		if in[1].DType != I32 || !slices.Equal(in[1].Shape, x.Shape[:1]) {
			return TensorType{}, fmt.Errorf("positions are %s, want [%d] i32", in[1], x.Shape[0])
		}
		if in[2].DType != F32 || !slices.Equal(in[2].Shape, []int{d / 2}) {
			return TensorType{}, fmt.Errorf("inv_freq is %s, want [%d] f32", in[2], d/2)
		}
		return TensorType{x.DType, slices.Clone(x.Shape)}, nil

	case OpPagedAttention:
		q, kc, vc, table, seq, pos := in[0], in[1], in[2], in[3], in[4], in[5]
		if err := floatType(q); err != nil {
			return TensorType{}, err
		}
		if len(q.Shape) != 3 {
			return TensorType{}, fmt.Errorf("Q must be 3-D [T,Hq,D]")
		}
		t, hq, d := q.Shape[0], q.Shape[1], q.Shape[2]
		if d > MaxHeadDim {
			return TensorType{}, fmt.Errorf("head dimension %d: at most %d", d, MaxHeadDim)
		}
		if !KVCacheType(kc.DType) {
			return TensorType{}, fmt.Errorf("Kcache is %s, want f32, bf16, f16, q8_0 or q4_0", kc.DType)
		}
		if kc.DType.Quantized() && d%32 != 0 {
			return TensorType{}, fmt.Errorf("a %s cache holds whole blocks of 32: head dimension %d", kc.DType, d)
		}
		if len(kc.Shape) != 4 || kc.Shape[3] != d {
			return TensorType{}, fmt.Errorf("Kcache must be [NumBlocks,BlockSize,Hkv,%d]", d)
		}
		if vc.DType != kc.DType || !slices.Equal(vc.Shape, kc.Shape) {
			return TensorType{}, fmt.Errorf("Vcache is %s, want %s like Kcache", vc, kc)
		}
		if hkv := kc.Shape[2]; hq%hkv != 0 {
			return TensorType{}, fmt.Errorf("%d query heads are not a multiple of %d kv heads", hq, hkv)
		}
		if table.DType != I32 || len(table.Shape) != 2 {
			return TensorType{}, fmt.Errorf("block table is %s, want [S,MaxBlocksPerSeq] i32", table)
		}
		for i, v := range []TensorType{seq, pos} {
			if v.DType != I32 || !slices.Equal(v.Shape, []int{t}) {
				return TensorType{}, fmt.Errorf("In[%d] is %s, want [%d] i32", i+4, v, t)
			}
		}
		if !(op.Scale >= 0) || math.IsInf(float64(op.Scale), 0) {
			return TensorType{}, fmt.Errorf("Scale %g: want finite, not negative", op.Scale)
		}
		return TensorType{q.DType, slices.Clone(q.Shape)}, nil

	case OpSoftmax, OpGELU, OpReLU, OpTanh, OpL2Normalize, OpSiLU:
		if err := f32(0); err != nil {
			return TensorType{}, err
		}
		return TensorType{F32, slices.Clone(in[0].Shape)}, nil

	case OpGather:
		table, idx := in[0], in[1]
		if !table.DType.Quantized() {
			if err := floatType(table); err != nil {
				return TensorType{}, err
			}
		}
		if len(table.Shape) != 2 {
			return TensorType{}, fmt.Errorf("table must be 2-D [V,D]")
		}
		if idx.DType != I32 {
			return TensorType{}, fmt.Errorf("indices are %s, want i32", idx.DType)
		}
		dt := table.DType
		if dt.Quantized() {
			dt = F32 // rows are dequantized as they are gathered
		}
		return TensorType{dt, append(slices.Clone(idx.Shape), table.Shape[1])}, nil

	case OpMaskedMeanPool:
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
		return TensorType{F32, []int{x.Shape[0], x.Shape[2]}}, nil

	case OpPermute:
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
		if len(view) > MaxPermuteDims {
			return TensorType{}, fmt.Errorf("%d dimensions, at most %d", len(view), MaxPermuteDims)
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

	case OpReshape:
		if err := floatType(in[0]); err != nil {
			return TensorType{}, err
		}
		if op.Shape == nil {
			return TensorType{}, fmt.Errorf("no Shape")
		}
		out, err := resolveShape(op.Shape, in[0])
		if err != nil {
			return TensorType{}, err
		}
		return TensorType{in[0].DType, out}, nil

	case OpMaskedSoftmax:
		x := in[0]
		if err := f32(0); err != nil {
			return TensorType{}, err
		}
		if len(x.Shape) < 2 {
			return TensorType{}, fmt.Errorf("In[0] must have at least 2 dimensions [B,...,N]")
		}
		if err := mask(in[1], []int{x.Shape[0], x.Last()}); err != nil {
			return TensorType{}, err
		}
		return TensorType{F32, slices.Clone(x.Shape)}, nil

	case OpAttention:
		x := in[0]
		if err := floatType(x); err != nil {
			return TensorType{}, err
		}
		if len(x.Shape) != 3 {
			return TensorType{}, fmt.Errorf("In[0] must be [B,S,3·H·D]")
		}
		if op.Heads <= 0 || x.Last()%(3*op.Heads) != 0 {
			return TensorType{}, fmt.Errorf("In[0]'s last dimension %d is not 3·Heads·D for Heads %d", x.Last(), op.Heads)
		}
		if err := mask(in[1], x.Shape[:2]); err != nil {
			return TensorType{}, err
		}
		dt, err := productType(op, x)
		if err != nil {
			return TensorType{}, err
		}
		return TensorType{dt, []int{x.Shape[0], x.Shape[1], x.Last() / 3}}, nil

	case OpConvert:
		if err := floatType(in[0]); err != nil {
			return TensorType{}, err
		}
		if op.DType != F32 && op.DType != BF16 {
			return TensorType{}, fmt.Errorf("DType %s: want f32 or bf16", op.DType)
		}
		return TensorType{op.DType, slices.Clone(in[0].Shape)}, nil
	}
	return TensorType{}, fmt.Errorf("unknown op kind %d", uint8(op.Kind))
}

// inferKVWrite checks OpKVWrite's operands against the bound cache and
// returns the cache's type, which the op writes in place.
func inferKVWrite(op Op, in []TensorType, cache TensorType) (TensorType, error) {
	if len(in) != 2 {
		return TensorType{}, fmt.Errorf("takes 2 inputs, got %d", len(in))
	}
	if op.Act != ActNone || op.TransB || op.Eps != 0 || op.Scale != 0 || op.Perm != nil || op.Shape != nil || op.DType != 0 {
		return TensorType{}, fmt.Errorf("takes no Act, TransB, Eps, Scale, Perm, Shape or DType")
	}
	x, slots := in[0], in[1]
	if err := floatType(x); err != nil {
		return TensorType{}, err
	}
	if len(x.Shape) != 3 {
		return TensorType{}, fmt.Errorf("In[0] must be 3-D [T,Hkv,D]")
	}
	if len(cache.Shape) != 4 || !slices.Equal(cache.Shape[2:], x.Shape[1:]) || (cache.DType != x.DType && !KVStoreType(cache.DType)) {
		return TensorType{}, fmt.Errorf("cache is %s, want [NumBlocks,BlockSize,%d,%d] %s, f16, q8_0 or q4_0", cache, x.Shape[1], x.Shape[2], x.DType)
	}
	if cache.DType.Quantized() && x.Shape[2]%32 != 0 {
		return TensorType{}, fmt.Errorf("a %s cache holds whole blocks of 32: head dimension %d", cache.DType, x.Shape[2])
	}
	if slots.DType != I32 || !slices.Equal(slots.Shape, x.Shape[:1]) {
		return TensorType{}, fmt.Errorf("slots are %s, want [%d] i32", slots, x.Shape[0])
	}
	return TensorType{cache.DType, slices.Clone(cache.Shape)}, nil
}

// matmulTypes allows f32 or bf16 operands, the same type on both sides,
// or f32 activations against block-quantized weights.
func matmulTypes(a, w TensorType) error {
	if a.DType != F32 && a.DType != BF16 {
		return fmt.Errorf("In[0] is %s, want f32 or bf16", a.DType)
	}
	if w.DType.Quantized() {
		if a.DType != F32 {
			return fmt.Errorf("In[1] is %s: block-quantized weights take f32 activations, not %s", w.DType, a.DType)
		}
		return nil
	}
	if w.DType != a.DType {
		return fmt.Errorf("In[1] is %s and In[0] %s: both must be the same type", w.DType, a.DType)
	}
	return nil
}

// productType is a matmul's output type: f32 unless op.DType asks for bf16,
// which needs bf16 operands.
func productType(op Op, a TensorType) (DType, error) {
	switch {
	case op.DType == 0 || op.DType == F32:
		return F32, nil
	case op.DType == BF16 && a.DType == BF16:
		return BF16, nil
	case op.DType == BF16:
		return 0, fmt.Errorf("a bf16 product needs bf16 operands, not %s", a.DType)
	}
	return 0, fmt.Errorf("DType %s: a product is f32 or bf16", op.DType)
}

// floatType allows f32 or bf16 data (ops that move values without arithmetic).
func floatType(t TensorType) error {
	if t.DType != F32 && t.DType != BF16 {
		return fmt.Errorf("In[0] is %s, want f32 or bf16", t.DType)
	}
	return nil
}

// resolveShape fills in a reshape's one -1 dimension from t's element count
// and checks that the result is a view of t.
func resolveShape(shape []int, t TensorType) ([]int, error) {
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
		if t.NumElements()%known != 0 {
			return nil, fmt.Errorf("Shape %v does not divide %d elements", shape, t.NumElements())
		}
		out[free] = t.NumElements() / known
	}
	if err := sameCount(out, t); err != nil {
		return nil, err
	}
	return out, nil
}

// sameCount checks that shape is a view of t: at least one dimension, all
// positive, the same element count.
func sameCount(shape []int, t TensorType) error {
	n, err := Elements(shape)
	if err != nil {
		return fmt.Errorf("Shape %v: %w", shape, err)
	}
	if n != t.NumElements() {
		return fmt.Errorf("Shape %v has %d elements, In[0] %d", shape, n, t.NumElements())
	}
	return nil
}

// Elements is the element count of shape, refusing no dimensions, a
// dimension that is not positive and a count that would overflow: the
// planner's check of a reshape, and the adapters' of an allocation.
func Elements(shape []int) (int, error) {
	if len(shape) == 0 {
		return 0, errors.New("no dimensions")
	}
	n := 1
	for i, s := range shape {
		if s <= 0 {
			return 0, fmt.Errorf("dimension %d is %d", i, s)
		}
		if n > (1<<62)/s {
			return 0, errors.New("too many elements")
		}
		n *= s
	}
	return n, nil
}
