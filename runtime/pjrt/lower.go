package pjrt

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/go-xla/stablehlo"
	"github.com/gomlx/go-xla/types"
	"github.com/gomlx/go-xla/types/shapes"

	"github.com/brokerd/brokerd/runtime"
)

// TensorType is the element type and shape of a graph value; Lower checks
// graphs with runtime.PlanGraph's rules, the same as runtime/onednn's.
type TensorType = runtime.TensorType

// Program is a graph lowered to StableHLO for one set of bound types.
type Program struct {
	// Text is the StableHLO module (MLIR text) that PJRT compiles.
	Text []byte
	// Inputs name the bound buffers passed as main's parameters, in order.
	Inputs []string
	// Outputs name the bound buffers main returns, in order.
	Outputs []string
	// Types are the types of Inputs and Outputs.
	Types map[string]TensorType
}

// LowerOptions change how ops are lowered.
type LowerOptions struct {
	// AllowTF32 lets f32 matmuls run at the backend's default precision
	// (TF32 on NVIDIA GPUs since Ampere, bf16 passes on TPUs). Off, they
	// ask for HIGHEST precision, as the CPU adapter computes, so outputs
	// agree with it to fp32 rounding and the hash encoder's exactness check
	// passes.
	AllowTF32 bool
}

// Lower lowers g, bound to buffers of the given types (inputs, weights and
// the outputs the caller wants, as in runtime.Device.Run), to a StableHLO
// program. It is a pure function of (g, bound, opts): the same arguments
// give the same text, so it is tested without a plugin, and the compile
// cache can key on what it was given. Errors wrap runtime.ErrInvalidGraph.
func Lower(g *runtime.Graph, bound map[string]TensorType, opts LowerOptions) (*Program, error) {
	p, err := runtime.PlanGraph(g, bound)
	if err != nil {
		return nil, err
	}
	if len(p.Outputs) == 0 {
		return nil, fmt.Errorf("%w: no op writes a bound name, so the graph has no output", runtime.ErrInvalidGraph)
	}
	b := stablehlo.New("brokerd_graph")
	fn := b.Main()
	l := &lowering{fn: fn, opts: opts, vals: map[string]*stablehlo.Value{}}
	prog := &Program{Inputs: p.Inputs, Outputs: p.Outputs, Types: map[string]TensorType{}}
	for i, name := range p.Inputs {
		t := p.Types[name]
		// Parameters are numbered: buffer names ("encoder.layer.0.x") are
		// not MLIR identifiers, and sanitising them could make two collide.
		v, err := fn.NamedInput(fmt.Sprintf("in%d", i), shapeOf(t))
		if err != nil {
			return nil, fmt.Errorf("pjrt: lower input %q: %w", name, err)
		}
		l.vals[name] = v
		prog.Types[name] = t
	}
	for i, s := range p.Steps {
		v, err := l.op(s)
		if err != nil {
			return nil, fmt.Errorf("pjrt: lower op %d (%s) %s: %w", i, s.Op.Kind, typeList(s.In), err)
		}
		if got, want := v.Shape(), shapeOf(s.Out); !got.Equal(want) {
			return nil, fmt.Errorf("pjrt: lower op %d (%s): built %s, want %s", i, s.Op.Kind, got, want)
		}
		l.vals[s.Op.Out] = v
	}
	outs := make([]*stablehlo.Value, len(p.Outputs))
	for i, name := range p.Outputs {
		outs[i] = l.vals[name]
		prog.Types[name] = p.Types[name]
	}
	if err := fn.Return(outs...); err != nil {
		return nil, fmt.Errorf("pjrt: lower: return: %w", err)
	}
	if prog.Text, err = b.Build(); err != nil {
		return nil, fmt.Errorf("pjrt: lower: build: %w", err)
	}
	return prog, nil
}

// xlaType maps brokerd's element types to XLA's.
func xlaType(dt runtime.DType) dtypes.DType {
	switch dt {
	case runtime.F32:
		return dtypes.Float32
	case runtime.BF16:
		return dtypes.BFloat16
	case runtime.I32:
		return dtypes.Int32
	}
	return dtypes.InvalidDType
}

func shapeOf(t TensorType) shapes.Shape { return shapes.Make(xlaType(t.DType), t.Shape...) }

func typeList(ts []TensorType) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.String()
	}
	return strings.Join(parts, ", ")
}

// lowering holds the function being built and the value of every name.
type lowering struct {
	fn   *stablehlo.Function
	opts LowerOptions
	vals map[string]*stablehlo.Value
	// Reduction bodies, made once per module.
	sumFn, maxFn *stablehlo.Function
}

func (l *lowering) op(s runtime.Step) (*stablehlo.Value, error) {
	op := s.Op
	x := l.vals[op.In[0]]
	switch op.Kind {
	case runtime.OpMatMul:
		return l.matmul(op, s.In, x, l.vals[op.In[1]])
	case runtime.OpBatchMatMul:
		return l.batchMatMul(op, s.In, x, l.vals[op.In[1]])
	case runtime.OpAdd:
		y := l.vals[op.In[1]]
		if !slices.Equal(s.In[1].Shape, s.In[0].Shape) { // [N] over rows
			var err error
			if y, err = stablehlo.BroadcastInDim(y, x.Shape(), []int{x.Shape().Rank() - 1}); err != nil {
				return nil, err
			}
		}
		return stablehlo.Add(x, y)
	case runtime.OpLayerNorm:
		return l.layerNorm(x, l.vals[op.In[1]], l.vals[op.In[2]], op.Eps)
	case runtime.OpSoftmax:
		return l.softmax(x, nil)
	case runtime.OpMaskedSoftmax:
		return l.softmax(x, l.vals[op.In[1]])
	case runtime.OpGELU:
		return l.activate(x, runtime.ActGELU)
	case runtime.OpReLU:
		return l.activate(x, runtime.ActReLU)
	case runtime.OpTanh:
		return l.activate(x, runtime.ActTanh)
	case runtime.OpGather:
		return l.gather(x, l.vals[op.In[1]])
	case runtime.OpMaskedMeanPool:
		return l.meanPool(x, l.vals[op.In[1]])
	case runtime.OpL2Normalize:
		return l.l2Normalize(x)
	case runtime.OpPermute:
		if op.Shape != nil {
			var err error
			if x, err = stablehlo.Reshape(x, shapes.Make(x.Shape().DType, op.Shape...)); err != nil {
				return nil, err
			}
		}
		return stablehlo.Transpose(x, op.Perm...)
	case runtime.OpReshape:
		return stablehlo.Reshape(x, shapeOf(s.Out))
	case runtime.OpConvert:
		return stablehlo.Convert(x, xlaType(op.DType))
	}
	return nil, fmt.Errorf("unknown op kind %d", uint8(op.Kind))
}

// precision is the dot precision for operands of type dt.
func (l *lowering) precision(dt runtime.DType) types.DotGeneralPrecisionType {
	if dt == runtime.F32 && !l.opts.AllowTF32 {
		return types.DotGeneralPrecisionHighest
	}
	return types.DotGeneralPrecisionDefault
}

// matmul: a [...,K] · w [K,N] (TransB: [N,K]) with the bias added and the
// activation applied, accumulating and returning f32 whatever the operands.
func (l *lowering) matmul(op runtime.Op, in []TensorType, a, w *stablehlo.Value) (*stablehlo.Value, error) {
	rank := a.Shape().Rank()
	wk := 0
	if op.TransB {
		wk = 1
	}
	prec := l.precision(in[0].DType)
	y, err := stablehlo.DotGeneral(a, []int{rank - 1}, nil, w, []int{wk}, nil).
		Precision(prec, prec).OutputDType(dtypes.Float32).Done()
	if err != nil {
		return nil, err
	}
	if len(op.In) == 3 {
		bias, err := stablehlo.BroadcastInDim(l.vals[op.In[2]], y.Shape(), []int{rank - 1})
		if err != nil {
			return nil, err
		}
		if y, err = stablehlo.Add(y, bias); err != nil {
			return nil, err
		}
	}
	if y, err = l.activate(y, op.Act); err != nil {
		return nil, err
	}
	return productOut(op, y)
}

// productOut rounds an f32 product to bf16 once when the op asks for a bf16
// product (runtime.Op.DType).
func productOut(op runtime.Op, y *stablehlo.Value) (*stablehlo.Value, error) {
	if op.DType != runtime.BF16 {
		return y, nil
	}
	return stablehlo.Convert(y, xlaType(runtime.BF16))
}

// batchMatMul: a [B...,M,K] · w [B...,K,N] (TransB: [B...,N,K]) × Scale.
func (l *lowering) batchMatMul(op runtime.Op, in []TensorType, a, w *stablehlo.Value) (*stablehlo.Value, error) {
	rank := a.Shape().Rank()
	batch := make([]int, rank-2)
	for i := range batch {
		batch[i] = i
	}
	wk := rank - 2
	if op.TransB {
		wk = rank - 1
	}
	prec := l.precision(in[0].DType)
	y, err := stablehlo.DotGeneral(a, []int{rank - 1}, batch, w, []int{wk}, batch).
		Precision(prec, prec).OutputDType(dtypes.Float32).Done()
	if err != nil {
		return nil, err
	}
	if op.Scale != 0 && op.Scale != 1 {
		if y, err = l.scale(y, op.Scale); err != nil {
			return nil, err
		}
	}
	return productOut(op, y)
}

// splat is a scalar f32 constant broadcast to like's shape.
func (l *lowering) splat(v float32, like shapes.Shape) (*stablehlo.Value, error) {
	c, err := l.fn.ConstantFromScalar(v)
	if err != nil {
		return nil, err
	}
	return stablehlo.BroadcastInDim(c, shapes.Make(dtypes.Float32, like.Dimensions...), nil)
}

func (l *lowering) scale(x *stablehlo.Value, s float32) (*stablehlo.Value, error) {
	c, err := l.splat(s, x.Shape())
	if err != nil {
		return nil, err
	}
	return stablehlo.Multiply(x, c)
}

// activate applies act: GELU in its erf form, as BERT and the CPU adapter.
func (l *lowering) activate(x *stablehlo.Value, act runtime.Activation) (*stablehlo.Value, error) {
	switch act {
	case runtime.ActNone:
		return x, nil
	case runtime.ActReLU:
		zero, err := l.splat(0, x.Shape())
		if err != nil {
			return nil, err
		}
		return stablehlo.Maximum(x, zero)
	case runtime.ActTanh:
		return stablehlo.Tanh(x)
	case runtime.ActGELU:
		// 0.5·x·(1 + erf(x/√2))
		t, err := l.scale(x, float32(1/math.Sqrt2))
		if err != nil {
			return nil, err
		}
		if t, err = stablehlo.Erf(t); err != nil {
			return nil, err
		}
		one, err := l.splat(1, x.Shape())
		if err != nil {
			return nil, err
		}
		if t, err = stablehlo.Add(t, one); err != nil {
			return nil, err
		}
		if t, err = stablehlo.Multiply(x, t); err != nil {
			return nil, err
		}
		return l.scale(t, 0.5)
	}
	return nil, fmt.Errorf("unknown activation %d", uint8(act))
}

// reducer returns the scalar f32 body of a sum or max reduction.
func (l *lowering) reducer(isMax bool) (*stablehlo.Function, error) {
	cached := &l.sumFn
	if isMax {
		cached = &l.maxFn
	}
	if *cached != nil {
		return *cached, nil
	}
	body := l.fn.Closure()
	scalar := shapes.Make(dtypes.Float32)
	lhs, err := body.NamedInput("lhs", scalar)
	if err != nil {
		return nil, err
	}
	rhs, err := body.NamedInput("rhs", scalar)
	if err != nil {
		return nil, err
	}
	var r *stablehlo.Value
	if isMax {
		r, err = stablehlo.Maximum(lhs, rhs)
	} else {
		r, err = stablehlo.Add(lhs, rhs)
	}
	if err != nil {
		return nil, err
	}
	if err := body.Return(r); err != nil {
		return nil, err
	}
	*cached = body
	return body, nil
}

// reduce sums (or maxes) x over axis, then broadcasts the result back to x's
// shape when keep is set.
func (l *lowering) reduce(x *stablehlo.Value, axis int, isMax, keep bool) (*stablehlo.Value, error) {
	body, err := l.reducer(isMax)
	if err != nil {
		return nil, err
	}
	init := float32(0)
	if isMax {
		init = float32(math.Inf(-1))
	}
	c, err := l.fn.ConstantFromScalar(init)
	if err != nil {
		return nil, err
	}
	r, err := stablehlo.Reduce(x, c, body, axis)
	if err != nil || !keep {
		return r, err
	}
	return l.broadcastBack(r, x.Shape(), axis)
}

// broadcastBack broadcasts r, which is shape with axis removed, to shape.
func (l *lowering) broadcastBack(r *stablehlo.Value, shape shapes.Shape, axis int) (*stablehlo.Value, error) {
	var dims []int
	for i := 0; i < shape.Rank(); i++ {
		if i != axis {
			dims = append(dims, i)
		}
	}
	return stablehlo.BroadcastInDim(r, shapes.Make(r.Shape().DType, shape.Dimensions...), dims)
}

func (l *lowering) layerNorm(x, gamma, beta *stablehlo.Value, eps float32) (*stablehlo.Value, error) {
	last := x.Shape().Rank() - 1
	invN := float32(1 / float64(x.Shape().Dimensions[last]))
	mean, err := l.reduce(x, last, false, true)
	if err != nil {
		return nil, err
	}
	if mean, err = l.scale(mean, invN); err != nil {
		return nil, err
	}
	d, err := stablehlo.Subtract(x, mean)
	if err != nil {
		return nil, err
	}
	sq, err := stablehlo.Multiply(d, d)
	if err != nil {
		return nil, err
	}
	v, err := l.reduce(sq, last, false, true)
	if err != nil {
		return nil, err
	}
	if v, err = l.scale(v, invN); err != nil {
		return nil, err
	}
	e, err := l.splat(eps, x.Shape())
	if err != nil {
		return nil, err
	}
	if v, err = stablehlo.Add(v, e); err != nil {
		return nil, err
	}
	if v, err = stablehlo.Rsqrt(v); err != nil {
		return nil, err
	}
	y, err := stablehlo.Multiply(d, v)
	if err != nil {
		return nil, err
	}
	gb, err := stablehlo.BroadcastInDim(gamma, x.Shape(), []int{last})
	if err != nil {
		return nil, err
	}
	bb, err := stablehlo.BroadcastInDim(beta, x.Shape(), []int{last})
	if err != nil {
		return nil, err
	}
	if y, err = stablehlo.Multiply(y, gb); err != nil {
		return nil, err
	}
	return stablehlo.Add(y, bb)
}

// keepMask turns a mask [B,N] (f32 or i32; non-zero keeps) into a boolean
// broadcast to shape, mapping the mask's axes to shape's axes dims.
func (l *lowering) keepMask(mask *stablehlo.Value, shape shapes.Shape, dims []int) (*stablehlo.Value, error) {
	var zeroVal any = float32(0)
	ct := types.CompareFloat
	if mask.Shape().DType == dtypes.Int32 {
		zeroVal, ct = int32(0), types.CompareSigned
	}
	zero, err := l.fn.ConstantFromScalar(zeroVal)
	if err != nil {
		return nil, err
	}
	zeros, err := stablehlo.BroadcastInDim(zero, mask.Shape(), nil)
	if err != nil {
		return nil, err
	}
	keep, err := stablehlo.Compare(mask, zeros, types.CompareNE, ct)
	if err != nil {
		return nil, err
	}
	return stablehlo.BroadcastInDim(keep, shapes.Make(dtypes.Bool, shape.Dimensions...), dims)
}

// softmax over the last axis; with a mask [B,N], masked positions get 0 and
// a row with none kept gets 1/N everywhere, as runtime/adapter.go says.
func (l *lowering) softmax(x, mask *stablehlo.Value) (*stablehlo.Value, error) {
	shape := x.Shape()
	last := shape.Rank() - 1
	var keep *stablehlo.Value
	var err error
	xm := x
	if mask != nil {
		if keep, err = l.keepMask(mask, shape, []int{0, last}); err != nil {
			return nil, err
		}
		ninf, err := l.splat(float32(math.Inf(-1)), shape)
		if err != nil {
			return nil, err
		}
		if xm, err = stablehlo.Select(keep, x, ninf); err != nil {
			return nil, err
		}
	}
	m, err := l.reduce(xm, last, true, true)
	if err != nil {
		return nil, err
	}
	if mask != nil {
		// A row with nothing kept has max -inf; any finite shift will do,
		// its exponentials are all replaced below.
		zero, err := l.splat(0, shape)
		if err != nil {
			return nil, err
		}
		finite, err := stablehlo.IsFinite(m)
		if err != nil {
			return nil, err
		}
		if m, err = stablehlo.Select(finite, m, zero); err != nil {
			return nil, err
		}
	}
	d, err := stablehlo.Subtract(x, m)
	if err != nil {
		return nil, err
	}
	e, err := stablehlo.Exponential(d)
	if err != nil {
		return nil, err
	}
	if mask != nil {
		zero, err := l.splat(0, shape)
		if err != nil {
			return nil, err
		}
		if e, err = stablehlo.Select(keep, e, zero); err != nil {
			return nil, err
		}
	}
	s, err := l.reduce(e, last, false, true)
	if err != nil {
		return nil, err
	}
	p, err := stablehlo.Divide(e, s)
	if err != nil || mask == nil {
		return p, err
	}
	zero, err := l.splat(0, shape)
	if err != nil {
		return nil, err
	}
	some, err := stablehlo.Compare(s, zero, types.CompareGT, types.CompareFloat)
	if err != nil {
		return nil, err
	}
	uniform, err := l.splat(float32(1/float64(shape.Dimensions[last])), shape)
	if err != nil {
		return nil, err
	}
	return stablehlo.Select(some, p, uniform)
}

// gather reads rows idx of table [V,D]: the output is [idx..., D]. An index
// out of range is clamped by XLA (the models check token ids beforehand).
func (l *lowering) gather(table, idx *stablehlo.Value) (*stablehlo.Value, error) {
	r := idx.Shape().Rank()
	withVec := append(slices.Clone(idx.Shape().Dimensions), 1)
	iv, err := stablehlo.Reshape(idx, shapes.Make(dtypes.Int32, withVec...))
	if err != nil {
		return nil, err
	}
	d := table.Shape().Dimensions[1]
	return stablehlo.Gather(table, iv, r, []int{r}, []int{0}, nil, nil, []int{0}, []int{1, d}, false)
}

// meanPool: x [B,S,D] averaged over the positions whose mask [B,S] is
// non-zero; a row with none kept is zero.
func (l *lowering) meanPool(x, mask *stablehlo.Value) (*stablehlo.Value, error) {
	shape := x.Shape()
	keep, err := l.keepMask(mask, shapes.Make(dtypes.Bool, mask.Shape().Dimensions...), []int{0, 1})
	if err != nil {
		return nil, err
	}
	w, err := stablehlo.Convert(keep, dtypes.Float32) // [B,S] of 0 and 1
	if err != nil {
		return nil, err
	}
	wb, err := stablehlo.BroadcastInDim(w, shape, []int{0, 1})
	if err != nil {
		return nil, err
	}
	xw, err := stablehlo.Multiply(x, wb)
	if err != nil {
		return nil, err
	}
	sum, err := l.reduce(xw, 1, false, false) // [B,D]
	if err != nil {
		return nil, err
	}
	cnt, err := l.reduce(w, 1, false, false) // [B]
	if err != nil {
		return nil, err
	}
	one, err := l.splat(1, cnt.Shape())
	if err != nil {
		return nil, err
	}
	if cnt, err = stablehlo.Maximum(cnt, one); err != nil { // 0/1 for an empty row
		return nil, err
	}
	cb, err := stablehlo.BroadcastInDim(cnt, sum.Shape(), []int{0})
	if err != nil {
		return nil, err
	}
	return stablehlo.Divide(sum, cb)
}

// l2Normalize divides each row (last axis) by its L2 norm; zero rows stay 0.
func (l *lowering) l2Normalize(x *stablehlo.Value) (*stablehlo.Value, error) {
	shape := x.Shape()
	last := shape.Rank() - 1
	sq, err := stablehlo.Multiply(x, x)
	if err != nil {
		return nil, err
	}
	ss, err := l.reduce(sq, last, false, true)
	if err != nil {
		return nil, err
	}
	norm, err := stablehlo.Sqrt(ss)
	if err != nil {
		return nil, err
	}
	q, err := stablehlo.Divide(x, norm)
	if err != nil {
		return nil, err
	}
	zero, err := l.splat(0, shape)
	if err != nil {
		return nil, err
	}
	nonzero, err := stablehlo.Compare(ss, zero, types.CompareGT, types.CompareFloat)
	if err != nil {
		return nil, err
	}
	return stablehlo.Select(nonzero, q, zero)
}
