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
	// Aliased maps an input's index to the output it is updated in place
	// as (a KV cache: OpKVWrite writes the buffer it reads). The program
	// says so (tf.aliasing_output), so when the device donates that input
	// XLA writes the output into the input's memory: the cache stays where
	// it is on the device instead of being copied whole every step.
	Aliased map[int]int
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
	prog := &Program{Inputs: p.Inputs, Outputs: p.Outputs, Types: map[string]TensorType{}, Aliased: map[int]int{}}
	for i, name := range p.Inputs {
		t := p.Types[name]
		var attrs map[string]any
		if o := slices.Index(p.Outputs, name); o >= 0 {
			attrs = map[string]any{"tf.aliasing_output": int32(o)}
			prog.Aliased[i] = o
		}
		// Parameters are numbered: buffer names ("encoder.layer.0.x") are
		// not MLIR identifiers, and sanitising them could make two collide.
		v, err := fn.NamedInputWithAttributes(fmt.Sprintf("in%d", i), shapeOf(t), attrs)
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

// zeroProgram is the StableHLO of a program of no inputs whose one output
// is zeros of type t.
func zeroProgram(t TensorType) ([]byte, error) {
	b := stablehlo.New("brokerd_zeros")
	fn := b.Main()
	var scalar any = float32(0)
	if t.DType == runtime.I32 {
		scalar = int32(0)
	}
	z, err := fn.ConstantFromScalar(scalar)
	if err == nil && t.DType == runtime.BF16 {
		z, err = stablehlo.Convert(z, xlaType(runtime.BF16))
	}
	if err == nil {
		z, err = stablehlo.BroadcastInDim(z, shapeOf(t), nil)
	}
	if err == nil {
		err = fn.Return(z)
	}
	if err != nil {
		return nil, fmt.Errorf("pjrt: zeros of %v %s: %w", t.Shape, t.DType, err)
	}
	return b.Build()
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
	case runtime.OpAttention:
		return l.attention(op, s.In, x, l.vals[op.In[1]])
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
	case runtime.OpRMSNorm:
		return l.inF32(x, func(x *stablehlo.Value) (*stablehlo.Value, error) { return l.rmsNorm(x, l.vals[op.In[1]], op.Eps) })
	case runtime.OpSiLU:
		return l.silu(x)
	case runtime.OpSwiGLU:
		return l.inF32(x, l.swiglu)
	case runtime.OpRoPE:
		return l.inF32(x, func(x *stablehlo.Value) (*stablehlo.Value, error) {
			return l.rope(x, l.vals[op.In[1]], l.vals[op.In[2]])
		})
	case runtime.OpKVWrite:
		return l.kvWrite(l.vals[op.Out], x, l.vals[op.In[1]])
	case runtime.OpPagedAttention:
		v := func(i int) *stablehlo.Value { return l.vals[op.In[i]] }
		return l.pagedAttention(x, v(1), v(2), v(3), v(4), v(5), op.Scale)
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
	if len(op.In) >= 3 {
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
	if len(op.In) == 4 {
		if y, err = stablehlo.Add(y, l.vals[op.In[3]]); err != nil {
			return nil, err
		}
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

// attention lowers OpAttention: q, k and v are slices of the fused
// projection read as [B,S,3,H,D]; the two products are dot_generals
// batched over (batch, head), so the heads need no transpose before them,
// only the context one after (XLA fuses it into the reshape's copy).
func (l *lowering) attention(op runtime.Op, in []TensorType, x, mask *stablehlo.Value) (*stablehlo.Value, error) {
	b, n, h := in[0].Shape[0], in[0].Shape[1], op.Heads
	d := in[0].Shape[2] / (3 * h)
	dt := x.Shape().DType
	x5, err := stablehlo.Reshape(x, shapes.Make(dt, b, n, 3, h, d))
	if err != nil {
		return nil, err
	}
	part := func(i int) (*stablehlo.Value, error) {
		v, err := stablehlo.Slice(x5, []int{0, 0, i, 0, 0}, []int{b, n, i + 1, h, d}, []int{1, 1, 1, 1, 1})
		if err != nil {
			return nil, err
		}
		return stablehlo.Reshape(v, shapes.Make(dt, b, n, h, d))
	}
	q, err := part(0)
	if err != nil {
		return nil, err
	}
	k, err := part(1)
	if err != nil {
		return nil, err
	}
	v, err := part(2)
	if err != nil {
		return nil, err
	}
	prec := l.precision(in[0].DType)
	// Scores [B,H,S,T]: batch dimensions b and h, contracting d.
	sc, err := stablehlo.DotGeneral(q, []int{3}, []int{0, 2}, k, []int{3}, []int{0, 2}).
		Precision(prec, prec).OutputDType(dtypes.Float32).Done()
	if err != nil {
		return nil, err
	}
	scale := op.Scale
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(d)))
	}
	if sc, err = l.scale(sc, scale); err != nil {
		return nil, err
	}
	p, err := l.softmax(sc, mask)
	if err != nil {
		return nil, err
	}
	if in[0].DType == runtime.BF16 {
		if p, err = stablehlo.Convert(p, dt); err != nil {
			return nil, err
		}
	}
	// Context [B,H,S,D]: p's batch (0,1) and t (3) against v's (0,2) and t (1).
	c, err := stablehlo.DotGeneral(p, []int{3}, []int{0, 1}, v, []int{1}, []int{0, 2}).
		Precision(prec, prec).OutputDType(dtypes.Float32).Done()
	if err != nil {
		return nil, err
	}
	if c, err = stablehlo.Transpose(c, 0, 2, 1, 3); err != nil {
		return nil, err
	}
	if c, err = stablehlo.Reshape(c, shapes.Make(dtypes.Float32, b, n, h*d)); err != nil {
		return nil, err
	}
	return productOut(op, c)
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

// inF32 applies f to x in f32, converting a bf16 x in and the result back:
// the decoder-LLM ops compute in f32 whatever the storage type.
func (l *lowering) inF32(x *stablehlo.Value, f func(*stablehlo.Value) (*stablehlo.Value, error)) (*stablehlo.Value, error) {
	dt := x.Shape().DType
	if dt == dtypes.Float32 {
		return f(x)
	}
	xf, err := stablehlo.Convert(x, dtypes.Float32)
	if err != nil {
		return nil, err
	}
	y, err := f(xf)
	if err != nil {
		return nil, err
	}
	return stablehlo.Convert(y, dt)
}

// rmsNorm: x / sqrt(mean(x²) + eps) · w over the last axis.
func (l *lowering) rmsNorm(x, w *stablehlo.Value, eps float32) (*stablehlo.Value, error) {
	last := x.Shape().Rank() - 1
	sq, err := stablehlo.Multiply(x, x)
	if err != nil {
		return nil, err
	}
	ms, err := l.reduce(sq, last, false, true)
	if err != nil {
		return nil, err
	}
	if ms, err = l.scale(ms, float32(1/float64(x.Shape().Dimensions[last]))); err != nil {
		return nil, err
	}
	e, err := l.splat(eps, x.Shape())
	if err != nil {
		return nil, err
	}
	if ms, err = stablehlo.Add(ms, e); err != nil {
		return nil, err
	}
	if ms, err = stablehlo.Rsqrt(ms); err != nil {
		return nil, err
	}
	y, err := stablehlo.Multiply(x, ms)
	if err != nil {
		return nil, err
	}
	wb, err := stablehlo.BroadcastInDim(w, y.Shape(), []int{last})
	if err != nil {
		return nil, err
	}
	return stablehlo.Multiply(y, wb)
}

// silu: x·sigmoid(x).
func (l *lowering) silu(x *stablehlo.Value) (*stablehlo.Value, error) {
	s, err := stablehlo.Logistic(x)
	if err != nil {
		return nil, err
	}
	return stablehlo.Multiply(x, s)
}

// lastHalves splits x's last axis into its two halves.
func lastHalves(x *stablehlo.Value) (a, b *stablehlo.Value, err error) {
	dims := x.Shape().Dimensions
	r := len(dims)
	half := dims[r-1] / 2
	starts, mid, limits := make([]int, r), slices.Clone(dims), slices.Clone(dims)
	mid[r-1] = half
	if a, err = stablehlo.Slice(x, starts, mid, nil); err != nil {
		return nil, nil, err
	}
	starts[r-1] = half
	b, err = stablehlo.Slice(x, starts, limits, nil)
	return a, b, err
}

// swiglu: [gate | up] on the last axis → silu(gate)·up.
func (l *lowering) swiglu(x *stablehlo.Value) (*stablehlo.Value, error) {
	gate, up, err := lastHalves(x)
	if err != nil {
		return nil, err
	}
	if gate, err = l.silu(gate); err != nil {
		return nil, err
	}
	return stablehlo.Multiply(gate, up)
}

// rope rotates x [T,H,D] in rotate-half layout by angles float32(pos)·freq
// computed in f32, as runtime.OpRoPE says.
func (l *lowering) rope(x, pos, freq *stablehlo.Value) (*stablehlo.Value, error) {
	dims := x.Shape().Dimensions
	t, half := dims[0], dims[2]/2
	pf, err := stablehlo.Convert(pos, dtypes.Float32)
	if err != nil {
		return nil, err
	}
	table := shapes.Make(dtypes.Float32, t, half)
	pb, err := stablehlo.BroadcastInDim(pf, table, []int{0})
	if err != nil {
		return nil, err
	}
	fb, err := stablehlo.BroadcastInDim(freq, table, []int{1})
	if err != nil {
		return nil, err
	}
	ang, err := stablehlo.Multiply(pb, fb)
	if err != nil {
		return nil, err
	}
	half3 := shapes.Make(dtypes.Float32, t, dims[1], half)
	trig := func(f func(*stablehlo.Value) (*stablehlo.Value, error)) (*stablehlo.Value, error) {
		v, err := f(ang)
		if err != nil {
			return nil, err
		}
		return stablehlo.BroadcastInDim(v, half3, []int{0, 2})
	}
	c, err := trig(stablehlo.Cosine)
	if err != nil {
		return nil, err
	}
	sn, err := trig(stablehlo.Sine)
	if err != nil {
		return nil, err
	}
	a, b, err := lastHalves(x)
	if err != nil {
		return nil, err
	}
	// out = [a·c − b·s | b·c + a·s]
	mul := func(p, q *stablehlo.Value) *stablehlo.Value {
		if err != nil {
			return nil
		}
		var v *stablehlo.Value
		v, err = stablehlo.Multiply(p, q)
		return v
	}
	ac, bs, bc, as := mul(a, c), mul(b, sn), mul(b, c), mul(a, sn)
	if err != nil {
		return nil, err
	}
	ra, err := stablehlo.Subtract(ac, bs)
	if err != nil {
		return nil, err
	}
	rb, err := stablehlo.Add(bc, as)
	if err != nil {
		return nil, err
	}
	return stablehlo.Concatenate(2, ra, rb)
}

// kvWrite scatters rows x [T,Hkv,D] into cache [NB,BS,Hkv,D] at slots [T]
// and returns the updated cache, which the device swaps into the bound
// buffer. XLA skips an update whose index is out of bounds, so negative
// slots write nothing, as the contract says; so does a slot past the cache
// (the CPU adapter refuses it: a device cannot report it without a round
// trip). Which of two rows with one slot wins is unspecified here.
func (l *lowering) kvWrite(cache, x, slots *stablehlo.Value) (*stablehlo.Value, error) {
	cd := cache.Shape().Dimensions
	dt := cache.Shape().DType
	flat, err := stablehlo.Reshape(cache, shapes.Make(dt, cd[0]*cd[1], cd[2], cd[3]))
	if err != nil {
		return nil, err
	}
	idx, err := stablehlo.Reshape(slots, shapes.Make(dtypes.Int32, slots.Shape().Dimensions[0], 1))
	if err != nil {
		return nil, err
	}
	body := l.fn.Closure()
	scalar := shapes.Make(dt)
	if _, err := body.NamedInput("old", scalar); err != nil {
		return nil, err
	}
	nw, err := body.NamedInput("new", scalar)
	if err != nil {
		return nil, err
	}
	if err := body.Return(nw); err != nil {
		return nil, err
	}
	out, err := stablehlo.Scatter(flat, idx, x, []int{1, 2}, []int{0}, nil, nil, []int{0}, 1, false, false, body)
	if err != nil {
		return nil, err
	}
	return stablehlo.Reshape(out, cache.Shape())
}

// pagedAttention lowers runtime.OpPagedAttention with static shapes: each
// token's block-table row gathers its sequence's whole cache window
// [MaxBlocksPerSeq·BlockSize] of K and V, positions past the token's are
// masked (scores to −inf, V rows to 0 so stale cache contents cannot leak a
// NaN through a zero weight), and the grouped heads are batched dot products.
// The gathered window costs T·MaxBlocksPerSeq·BlockSize·Hkv·D elements per
// cache; XLA clamps out-of-range block ids and sequence indices.
func (l *lowering) pagedAttention(q, kc, vc, table, seq, pos *stablehlo.Value, scale float32) (*stablehlo.Value, error) {
	qd, cd := q.Shape().Dimensions, kc.Shape().Dimensions
	t, hq, d := qd[0], qd[1], qd[2]
	bs, hkv := cd[1], cd[2]
	maxb := table.Shape().Dimensions[1]
	n, g := maxb*bs, hq/hkv
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(d)))
	}
	rows, err := l.gather(table, seq) // [T,MaxB] block ids
	if err != nil {
		return nil, err
	}
	ri, err := stablehlo.Reshape(rows, shapes.Make(dtypes.Int32, t, maxb, 1))
	if err != nil {
		return nil, err
	}
	keep, err := l.fn.Iota(shapes.Make(dtypes.Int32, t, n), 1)
	if err != nil {
		return nil, err
	}
	pb, err := stablehlo.BroadcastInDim(pos, keep.Shape(), []int{0})
	if err != nil {
		return nil, err
	}
	if keep, err = stablehlo.Compare(keep, pb, types.CompareLE, types.CompareSigned); err != nil { // [T,N]
		return nil, err
	}
	window := func(c *stablehlo.Value) (*stablehlo.Value, error) { // [T,N,Hkv,D] f32
		w, err := stablehlo.Gather(c, ri, 2, []int{2, 3, 4}, []int{0}, nil, nil, []int{0}, []int{1, bs, hkv, d}, false)
		if err != nil {
			return nil, err
		}
		if w, err = stablehlo.Reshape(w, shapes.Make(c.Shape().DType, t, n, hkv, d)); err != nil {
			return nil, err
		}
		return stablehlo.Convert(w, dtypes.Float32)
	}
	k, err := window(kc)
	if err != nil {
		return nil, err
	}
	v, err := window(vc)
	if err != nil {
		return nil, err
	}
	kv := v.Shape()
	kb, err := stablehlo.BroadcastInDim(keep, shapes.Make(dtypes.Bool, kv.Dimensions...), []int{0, 1})
	if err != nil {
		return nil, err
	}
	zero, err := l.splat(0, kv)
	if err != nil {
		return nil, err
	}
	if v, err = stablehlo.Select(kb, v, zero); err != nil {
		return nil, err
	}
	qf, err := stablehlo.Convert(q, dtypes.Float32)
	if err != nil {
		return nil, err
	}
	if qf, err = stablehlo.Reshape(qf, shapes.Make(dtypes.Float32, t, hkv, g, d)); err != nil {
		return nil, err
	}
	prec := l.precision(runtime.F32)
	// [T,Hkv,G,D] · [T,N,Hkv,D] → [T,Hkv,G,N]
	s, err := stablehlo.DotGeneral(qf, []int{3}, []int{0, 1}, k, []int{3}, []int{0, 2}).
		Precision(prec, prec).OutputDType(dtypes.Float32).Done()
	if err != nil {
		return nil, err
	}
	if s, err = l.scale(s, scale); err != nil {
		return nil, err
	}
	sb, err := stablehlo.BroadcastInDim(keep, shapes.Make(dtypes.Bool, s.Shape().Dimensions...), []int{0, 3})
	if err != nil {
		return nil, err
	}
	ninf, err := l.splat(float32(math.Inf(-1)), s.Shape())
	if err != nil {
		return nil, err
	}
	if s, err = stablehlo.Select(sb, s, ninf); err != nil {
		return nil, err
	}
	p, err := l.softmax(s, nil) // position 0 is always kept: no empty row
	if err != nil {
		return nil, err
	}
	// [T,Hkv,G,N] · [T,N,Hkv,D] → [T,Hkv,G,D]
	o, err := stablehlo.DotGeneral(p, []int{3}, []int{0, 1}, v, []int{1}, []int{0, 2}).
		Precision(prec, prec).OutputDType(dtypes.Float32).Done()
	if err != nil {
		return nil, err
	}
	if o, err = stablehlo.Reshape(o, shapes.Make(dtypes.Float32, t, hq, d)); err != nil {
		return nil, err
	}
	return stablehlo.Convert(o, q.Shape().DType)
}
