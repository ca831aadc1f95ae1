package modelkit

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// MLP is a two-layer perceptron: In inputs, a ReLU hidden layer, Out outputs.
type MLP struct {
	In, Hidden, Out int
	Seed            uint64
}

// WriteMLP writes m in brokerd's MLP format into dir: model.safetensors
// (fc1 and fc2 weights and biases) and model.json naming the layers. It
// returns the weights, so a test can compute the expected outputs.
func WriteMLP(dir string, m MLP) (map[string]models.Tensor, error) {
	if m.In <= 0 || m.Hidden <= 0 || m.Out <= 0 {
		return nil, errors.New("in, hidden and out must be positive")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(m.Seed, 7))
	rnd := func(scale float64, shape ...int) models.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		t := models.Tensor{Shape: shape, Data: make([]float32, n)}
		for i := range t.Data {
			t.Data[i] = float32(r.NormFloat64() * scale)
		}
		return t
	}
	w := map[string]models.Tensor{
		"fc1.weight": rnd(1/math.Sqrt(float64(m.In)), m.Hidden, m.In),
		"fc1.bias":   rnd(0.1, m.Hidden),
		"fc2.weight": rnd(1/math.Sqrt(float64(m.Hidden)), m.Out, m.Hidden),
		"fc2.bias":   rnd(0.1, m.Out),
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), w, "F32"); err != nil {
		return nil, err
	}
	return w, writeJSON(filepath.Join(dir, "model.json"), map[string]any{
		"kind":    "mlp",
		"inputs":  []any{map[string]any{"name": "input", "dims": []int{m.In}}},
		"outputs": []any{map[string]any{"name": "output"}},
		"layers": []any{
			map[string]any{"type": "linear", "weight": "fc1.weight", "bias": "fc1.bias"},
			map[string]any{"type": "relu"},
			map[string]any{"type": "linear", "weight": "fc2.weight", "bias": "fc2.bias"},
		},
	})
}

// Forward is the float64 reference of one input row through the MLP whose
// weights WriteMLP returned (w): linear → ReLU → linear, in plain loops,
// for tests to hold the served outputs to.
func (m MLP) Forward(w map[string]models.Tensor, x []float32) []float64 {
	w1, b1, w2, b2 := w["fc1.weight"].Data, w["fc1.bias"].Data, w["fc2.weight"].Data, w["fc2.bias"].Data
	h := make([]float64, m.Hidden)
	for o := range m.Hidden {
		s := float64(b1[o])
		for i := range m.In {
			s += float64(w1[o*m.In+i]) * float64(x[i])
		}
		h[o] = math.Max(s, 0)
	}
	y := make([]float64, m.Out)
	for o := range m.Out {
		s := float64(b2[o])
		for i := range m.Hidden {
			s += float64(w2[o*m.Hidden+i]) * h[i]
		}
		y[o] = s
	}
	return y
}
