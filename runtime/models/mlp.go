package models

import (
	"context"
	"fmt"

	"github.com/brokerd/brokerd/runtime"
)

// MLP layer types (MLPLayer.Type).
const (
	LayerLinear    = "linear"
	LayerReLU      = "relu"
	LayerGELU      = "gelu" // erf form
	LayerTanh      = "tanh"
	LayerLayerNorm = "layernorm"
	LayerSoftmax   = "softmax"
)

// MLPSpec is an MLP model's definition: the JSON spec of an mlp model
// directory, whose weights come from its model.safetensors.
type MLPSpec struct {
	Name    string `json:"name,omitempty"`
	Version int64  `json:"version,omitempty"`
	// Input and Output name the model's input and output tensors for Infer
	// and KServe ("input" and "output" when empty).
	Input  string `json:"input,omitempty"`
	Output string `json:"output,omitempty"`
	// InputDim is the width of one input row.
	InputDim int        `json:"input_dim"`
	Layers   []MLPLayer `json:"layers"`
	// BaseBatch is the model's base batch (DefaultBaseBatch when 0).
	BaseBatch int `json:"base_batch,omitempty"`
	// Labels name the output columns, when they are classes.
	Labels []string `json:"labels,omitempty"`
}

// MLPLayer is one layer. A linear layer's Weight is a PyTorch Linear weight
// [out,in] and its Bias (optional) [out]; a layernorm's Weight and Bias are
// gamma and beta [width] and Eps its epsilon (1e-5 when 0).
type MLPLayer struct {
	Type   string  `json:"type"`
	Weight string  `json:"weight,omitempty"`
	Bias   string  `json:"bias,omitempty"`
	Eps    float32 `json:"eps,omitempty"`
}

// MLP is a loaded MLP. It implements Model; each RowInput is one row.
type MLP struct {
	spec    MLPSpec
	weights map[string]Tensor
	mm      map[string]bool // linear weights: bf16 on bf16 devices
	outDim  int
}

var _ Model = (*MLP)(nil)

// NewMLP checks spec against weights (every named weight present with a
// shape that chains from InputDim) and returns the model. weights may hold
// tensors the spec does not name; they are not uploaded.
func NewMLP(spec MLPSpec, weights map[string]Tensor) (Model, error) {
	if spec.InputDim <= 0 {
		return nil, fmt.Errorf("%w: mlp %q: input_dim %d", ErrInvalidInput, spec.Name, spec.InputDim)
	}
	if len(spec.Layers) == 0 {
		return nil, fmt.Errorf("%w: mlp %q: no layers", ErrInvalidInput, spec.Name)
	}
	if spec.Input == "" {
		spec.Input = "input"
	}
	if spec.Output == "" {
		spec.Output = "output"
	}
	if spec.BaseBatch <= 0 {
		spec.BaseBatch = DefaultBaseBatch
	}
	m := &MLP{spec: spec, weights: map[string]Tensor{}, mm: map[string]bool{}}
	use := func(name string, shape ...int) error {
		if err := checkTensor(weights, name, shape...); err != nil {
			return err
		}
		m.weights[name] = weights[name]
		return nil
	}
	width := spec.InputDim
	for i, l := range spec.Layers {
		var err error
		switch l.Type {
		case LayerLinear:
			w, ok := weights[l.Weight]
			if !ok || len(w.Shape) != 2 {
				return nil, fmt.Errorf("%w: mlp %q layer %d (linear): weight %q is missing or not 2-D", ErrInvalidInput, spec.Name, i, l.Weight)
			}
			out := w.Shape[0]
			if err = use(l.Weight, out, width); err == nil && l.Bias != "" {
				err = use(l.Bias, out)
			}
			m.mm[l.Weight] = true
			width = out
		case LayerLayerNorm:
			if l.Weight == "" || l.Bias == "" {
				return nil, fmt.Errorf("%w: mlp %q layer %d (layernorm): needs weight and bias", ErrInvalidInput, spec.Name, i)
			}
			if !(l.Eps >= 0) {
				return nil, fmt.Errorf("%w: mlp %q layer %d (layernorm): eps %g", ErrInvalidInput, spec.Name, i, l.Eps)
			}
			if err = use(l.Weight, width); err == nil {
				err = use(l.Bias, width)
			}
		case LayerReLU, LayerGELU, LayerTanh, LayerSoftmax:
		default:
			return nil, fmt.Errorf("%w: mlp %q layer %d: unknown type %q (want linear, relu, gelu, tanh, layernorm or softmax)",
				ErrInvalidInput, spec.Name, i, l.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("mlp %q layer %d (%s): %w", spec.Name, i, l.Type, err)
		}
	}
	m.outDim = width
	return m, nil
}

// Info describes the model: one FP32 input [-1, InputDim], one output.
func (m *MLP) Info() Info {
	return Info{
		Name: m.spec.Name, Version: m.spec.Version, Kind: KindMLP,
		Inputs:    []TensorSpec{{Name: m.spec.Input, DType: "FP32", Shape: []int64{-1, int64(m.spec.InputDim)}}},
		Outputs:   []TensorSpec{{Name: m.spec.Output, DType: "FP32", Shape: []int64{-1, int64(m.outDim)}}},
		BaseBatch: m.spec.BaseBatch,
		Dim:       m.outDim,
		Labels:    append([]string(nil), m.spec.Labels...),
	}
}

// Cost is 1: a row.
func (m *MLP) Cost(any) int { return 1 }

// MemoryBytes is the weights (linear ones in dt) plus one run's buffers for
// maxBatch rows.
func (m *MLP) MemoryBytes(dt runtime.DType, maxBatch int) int64 {
	if dt != runtime.BF16 {
		dt = runtime.F32
	}
	return weightBytes(m.weights, m.mm, dt) + m.graph(dt, max(maxBatch, 1)).workspace()
}

// Buffer names of the MLP graph.
const (
	mlpIn  = "x"
	mlpOut = "y"
)

// graph builds the forward pass for rows rows: an activation that follows
// a linear layer is fused into its matmul.
func (m *MLP) graph(dt runtime.DType, rows int) *builder {
	b := newBuilder(dt)
	x := b.input(mlpIn, runtime.F32, rows, m.spec.InputDim)
	acts := map[string]runtime.Activation{LayerReLU: runtime.ActReLU, LayerGELU: runtime.ActGELU, LayerTanh: runtime.ActTanh}
	kinds := map[string]runtime.OpKind{LayerReLU: runtime.OpReLU, LayerGELU: runtime.OpGELU, LayerTanh: runtime.OpTanh}
	layers := m.spec.Layers
	for i := 0; i < len(layers); i++ {
		l := layers[i]
		switch l.Type {
		case LayerLinear:
			w := b.param(l.Weight, dt, m.weights[l.Weight].Shape)
			bias := ""
			if l.Bias != "" {
				bias = b.param(l.Bias, runtime.F32, m.weights[l.Bias].Shape)
			}
			act := runtime.ActNone
			if i+1 < len(layers) {
				if a, ok := acts[layers[i+1].Type]; ok {
					act = a
					i++
				}
			}
			x = b.linear(x, w, bias, act)
		case LayerReLU, LayerGELU, LayerTanh:
			x = b.add(runtime.Op{Kind: kinds[l.Type], In: []string{x}}, runtime.F32, b.shape(x))
		case LayerLayerNorm:
			g := b.param(l.Weight, runtime.F32, m.weights[l.Weight].Shape)
			be := b.param(l.Bias, runtime.F32, m.weights[l.Bias].Shape)
			eps := l.Eps
			if eps == 0 {
				eps = 1e-5
			}
			x = b.add(runtime.Op{Kind: runtime.OpLayerNorm, In: []string{x, g, be}, Eps: eps}, runtime.F32, b.shape(x))
		case LayerSoftmax:
			x = b.add(runtime.Op{Kind: runtime.OpSoftmax, In: []string{x}}, runtime.F32, b.shape(x))
		}
	}
	b.outputLast(mlpOut)
	return b
}

// NewReplica uploads the weights to dev. On a device computing in bf16 the
// linear weights are stored and multiplied in bf16; where the device cannot,
// the error wraps runtime.ErrUnsupported.
func (m *MLP) NewReplica(ctx context.Context, dev runtime.Device, maxBatch int) (Replica, error) {
	dt := computeType(dev)
	res, err := upload(ctx, dev, dt, m.weights, m.mm)
	if err != nil {
		return nil, fmt.Errorf("mlp %q: replica: %w", m.spec.Name, err)
	}
	maxBatch = max(maxBatch, 1)
	return &mlpReplica{m: m, res: res, maxBatch: maxBatch, pad: newPadPlan(dev, maxBatch, 0)}, nil
}

type mlpReplica struct {
	m        *MLP
	res      *resident
	maxBatch int
	pad      padPlan
}

// WarmUp runs one row of zeros and drops the result, as bertReplica's
// does: the weights are packed at load, not in a request.
func (r *mlpReplica) WarmUp(ctx context.Context) error {
	_, err := r.Execute(ctx, []any{RowInput{Values: make([]float32, r.m.spec.InputDim)}})
	return err
}

func (r *mlpReplica) Close() error {
	r.res.close()
	return nil
}

// Execute runs the rows in batches of at most maxBatch; each input must be
// a RowInput of InputDim values, each output an Output of the output width.
// On a device with buckets (PJRT) a batch is padded with zero rows up to the
// next batch bucket; every layer works row by row, so they change nothing.
func (r *mlpReplica) Execute(ctx context.Context, inputs []any) ([]any, error) {
	dim := r.m.spec.InputDim
	rows := make([][]float32, len(inputs))
	for i, in := range inputs {
		var v []float32
		switch x := in.(type) {
		case RowInput:
			v = x.Values
		case *RowInput:
			if x != nil {
				v = x.Values
			}
		default:
			return nil, fmt.Errorf("%w: mlp %q: input %d is %T, want models.RowInput", ErrInvalidInput, r.m.spec.Name, i, in)
		}
		if len(v) != dim {
			return nil, fmt.Errorf("%w: mlp %q: input %d has %d values, want %d", ErrInvalidInput, r.m.spec.Name, i, len(v), dim)
		}
		rows[i] = v
	}
	r.res.mu.RLock()
	defer r.res.mu.RUnlock()
	if r.res.bufs == nil {
		return nil, ErrClosed
	}
	out := make([]any, 0, len(rows))
	for start := 0; start < len(rows); start += r.maxBatch {
		res, err := r.batch(ctx, rows[start:min(start+r.maxBatch, len(rows))])
		if err != nil {
			return nil, fmt.Errorf("mlp %q on %s: %w", r.m.spec.Name, r.res.dev.ID(), err)
		}
		out = append(out, res...)
	}
	return out, nil
}

func (r *mlpReplica) batch(ctx context.Context, rows [][]float32) ([]any, error) {
	dev := r.res.dev
	n, dim, odim := len(rows), r.m.spec.InputDim, r.m.outDim
	padded := r.pad.rows(n)
	b := r.m.graph(r.res.dt, padded)
	x := make([]float32, padded*dim) // rows past n stay zero
	for i, row := range rows {
		copy(x[i*dim:], row)
	}
	io := map[string]runtime.Buffer{}
	defer func() {
		for _, buf := range io {
			dev.Free(buf)
		}
	}()
	for name, shape := range map[string][]int{mlpIn: {padded, dim}, mlpOut: {padded, odim}} {
		buf, err := dev.Alloc(runtime.F32, shape...)
		if err != nil {
			return nil, err
		}
		io[name] = buf
	}
	if err := dev.CopyIn(ctx, io[mlpIn], x); err != nil {
		return nil, err
	}
	if err := r.res.run(ctx, &runtime.Graph{Ops: b.ops}, io); err != nil {
		return nil, err
	}
	y := make([]float32, padded*odim)
	if err := dev.CopyOut(ctx, y, io[mlpOut]); err != nil {
		return nil, err
	}
	out := make([]any, n)
	for i := range out {
		out[i] = Output{Values: y[i*odim : (i+1)*odim : (i+1)*odim]}
	}
	return out, nil
}
