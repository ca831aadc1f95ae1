package models

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime"
)

func randTensor(r *rand.Rand, scale float64, shape ...int) Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	t := Tensor{Shape: shape, Data: make([]float32, n)}
	for i := range t.Data {
		t.Data[i] = float32(r.NormFloat64() * scale)
	}
	return t
}

// refMLP runs one row through spec's layers in float64.
func refMLP(spec MLPSpec, w map[string]Tensor, row []float32) []float64 {
	x := [][]float64{make([]float64, len(row))}
	for i, v := range row {
		x[0][i] = float64(v)
	}
	for _, l := range spec.Layers {
		switch l.Type {
		case LayerLinear:
			var bias []float32
			if l.Bias != "" {
				bias = w[l.Bias].Data
			}
			x = refLinear(x, w[l.Weight].Data, bias, w[l.Weight].Shape[0])
		case LayerReLU:
			x = refApply(x, func(v float64) float64 { return math.Max(v, 0) })
		case LayerGELU:
			x = refApply(x, refGELU)
		case LayerTanh:
			x = refApply(x, math.Tanh)
		case LayerLayerNorm:
			eps := float64(l.Eps)
			if eps == 0 {
				eps = 1e-5
			}
			x = refLN(x, w[l.Weight].Data, w[l.Bias].Data, eps)
		case LayerSoftmax:
			x = refSoftmaxRows(x)
		}
	}
	return x[0]
}

func TestMLPMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(20, 20))
	w := map[string]Tensor{
		"l1.w": randTensor(r, 0.3, 32, 12), "l1.b": randTensor(r, 0.1, 32),
		"l2.w": randTensor(r, 0.2, 24, 32), "l2.b": randTensor(r, 0.1, 24),
		"l3.w": randTensor(r, 0.2, 16, 24),
		"l4.w": randTensor(r, 0.3, 5, 16), "l4.b": randTensor(r, 0.1, 5),
		"ln.g": randTensor(r, 1, 24), "ln.b": randTensor(r, 0.1, 24),
		"ln0.g": randTensor(r, 1, 12), "ln0.b": randTensor(r, 0.1, 12),
		"unused": randTensor(r, 1, 3),
	}
	lin := func(wn, bn string) MLPLayer { return MLPLayer{Type: LayerLinear, Weight: wn, Bias: bn} }
	tests := []struct {
		name   string
		layers []MLPLayer
	}{
		{"every layer type", []MLPLayer{
			{Type: LayerLayerNorm, Weight: "ln0.g", Bias: "ln0.b", Eps: 1e-6}, // first: on the input
			lin("l1.w", "l1.b"), {Type: LayerReLU}, // fused
			lin("l2.w", "l2.b"),
			{Type: LayerLayerNorm, Weight: "ln.g", Bias: "ln.b"},
			{Type: LayerGELU},                  // standalone
			lin("l3.w", ""), {Type: LayerTanh}, // no bias, fused tanh
			lin("l4.w", "l4.b"), {Type: LayerSoftmax},
		}},
		{"activation first", []MLPLayer{{Type: LayerTanh}, lin("l1.w", "l1.b"), {Type: LayerGELU}, {Type: LayerReLU}}},
		{"one linear", []MLPLayer{lin("l1.w", "")}},
	}
	dev := openDevice(t, runtime.DeviceSpec{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := MLPSpec{Name: "m", InputDim: 12, Layers: tt.layers}
			m, err := NewMLP(spec, w)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := m.NewReplica(t.Context(), dev, 4) // 7 rows: two batches
			if err != nil {
				t.Fatal(err)
			}
			defer rep.Close()
			rows := make([]any, 7)
			for i := range rows {
				rows[i] = RowInput{Values: randTensor(r, 1, 12).Data}
			}
			out, err := rep.Execute(t.Context(), rows)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range out {
				want := refMLP(spec, w, rows[i].(RowInput).Values)
				got := o.(Output).Values
				if len(got) != m.Info().Dim {
					t.Fatalf("row %d: %d values, Info says %d", i, len(got), m.Info().Dim)
				}
				if e := relErr(got, want); !(e < tolF32) {
					t.Errorf("row %d: relative error %.3g ≥ %g; got %v want %v", i, e, tolF32, got, want)
				}
			}
			if mb := m.MemoryBytes(runtime.F32, 4); mb <= 0 {
				t.Errorf("MemoryBytes = %d", mb)
			}
		})
	}
}

func TestMLPInfo(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 21))
	w := map[string]Tensor{"w": randTensor(r, 1, 3, 4)}
	m, err := NewMLP(MLPSpec{Name: "m", Version: 3, InputDim: 4, Layers: []MLPLayer{{Type: LayerLinear, Weight: "w"}, {Type: LayerSoftmax}},
		Labels: []string{"a", "b", "c"}}, w)
	if err != nil {
		t.Fatal(err)
	}
	info := m.Info()
	if info.Kind != KindMLP || info.Dim != 3 || info.Version != 3 || info.Inputs[0].Name != "input" || info.Outputs[0].Name != "output" ||
		info.Inputs[0].Shape[1] != 4 || info.Outputs[0].Shape[1] != 3 || info.BaseBatch != DefaultBaseBatch || len(info.Labels) != 3 {
		t.Errorf("info %+v", info)
	}
	if c := m.Cost(RowInput{}); c != 1 {
		t.Errorf("Cost = %d, want 1", c)
	}
}

func TestNewMLPErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(22, 22))
	w := map[string]Tensor{"w": randTensor(r, 1, 3, 4), "b": randTensor(r, 1, 3), "g": randTensor(r, 1, 4), "short": {Shape: []int{3}, Data: []float32{1}}}
	tests := []struct {
		name string
		spec MLPSpec
		want string
	}{
		{"no layers", MLPSpec{InputDim: 4}, "no layers"},
		{"no input", MLPSpec{Layers: []MLPLayer{{Type: LayerReLU}}}, "input_dim 0"},
		{"unknown layer", MLPSpec{InputDim: 4, Layers: []MLPLayer{{Type: "conv"}}}, `unknown type "conv"`},
		{"missing weight", MLPSpec{InputDim: 4, Layers: []MLPLayer{{Type: LayerLinear, Weight: "nope"}}}, `"nope" is missing`},
		{"width mismatch", MLPSpec{InputDim: 5, Layers: []MLPLayer{{Type: LayerLinear, Weight: "w"}}}, "is [3 4], want [3 5]"},
		{"bias shape", MLPSpec{InputDim: 4, Layers: []MLPLayer{{Type: LayerLinear, Weight: "w", Bias: "g"}}}, "is [4], want [3]"},
		{"short data", MLPSpec{InputDim: 4, Layers: []MLPLayer{{Type: LayerLinear, Weight: "w", Bias: "short"}}}, "1 values for shape [3]"},
		{"layernorm width", MLPSpec{InputDim: 4, Layers: []MLPLayer{{Type: LayerLinear, Weight: "w"}, {Type: LayerLayerNorm, Weight: "g", Bias: "g"}}}, "want [3]"},
		{"layernorm eps", MLPSpec{InputDim: 4, Layers: []MLPLayer{{Type: LayerLayerNorm, Weight: "g", Bias: "g", Eps: -1}}}, "eps -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewMLP(tt.spec, w)
			if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidInput containing %q", err, tt.want)
			}
		})
	}
}

func TestMLPExecuteErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 23))
	m, err := NewMLP(MLPSpec{InputDim: 4, Layers: []MLPLayer{{Type: LayerLinear, Weight: "w"}}}, map[string]Tensor{"w": randTensor(r, 1, 3, 4)})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := m.NewReplica(t.Context(), openDevice(t, runtime.DeviceSpec{}), 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		in   any
		want string
	}{
		{"wrong type", TextInput{}, "want models.RowInput"},
		{"wrong width", RowInput{Values: []float32{1, 2}}, "2 values, want 4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := rep.Execute(t.Context(), []any{tt.in})
			if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidInput containing %q", err, tt.want)
			}
		})
	}
	rep.Close()
	if _, err := rep.Execute(t.Context(), []any{RowInput{Values: make([]float32, 4)}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: err = %v, want ErrClosed", err)
	}
}
