package lifecycle

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// A model repository made by the tests (DIR/NAME/VERSION/), as server's
// tests make it.

// mlpRef is an MLP written to the repository, kept for the reference
// forward pass: linear → relu → linear.
type mlpRef struct {
	in, hidden, out int
	w1, b1, w2, b2  []float32 // PyTorch Linear layout: w [out, in]
}

func randTensor(r *rand.Rand, scale float64, shape ...int) models.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return models.Tensor{Shape: shape, Data: v}
}

func writeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func versionDir(t testing.TB, repo, name string, version int64) string {
	t.Helper()
	dir := filepath.Join(repo, name, strconv.FormatInt(version, 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// writeMLP writes a random MLP with the given widths as NAME/VERSION.
func writeMLP(t testing.TB, repo, name string, version int64, seed uint64, in, hidden, out int) *mlpRef {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	dir := versionDir(t, repo, name, version)
	w := map[string]models.Tensor{
		"fc1.weight": randTensor(r, 1/math.Sqrt(float64(in)), hidden, in),
		"fc1.bias":   randTensor(r, 0.1, hidden),
		"fc2.weight": randTensor(r, 1/math.Sqrt(float64(hidden)), out, hidden),
		"fc2.bias":   randTensor(r, 0.1, out),
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), w, "F32"); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(dir, "model.json"), map[string]any{
		"kind":    "mlp",
		"inputs":  []any{map[string]any{"name": "input", "dims": []int{in}}},
		"outputs": []any{map[string]any{"name": "output"}},
		"layers": []any{
			map[string]any{"type": "linear", "weight": "fc1.weight", "bias": "fc1.bias"},
			map[string]any{"type": "relu"},
			map[string]any{"type": "linear", "weight": "fc2.weight", "bias": "fc2.bias"},
		},
	})
	return &mlpRef{in: in, hidden: hidden, out: out,
		w1: w["fc1.weight"].Data, b1: w["fc1.bias"].Data, w2: w["fc2.weight"].Data, b2: w["fc2.bias"].Data}
}

// forward is the float64 reference of one row, with plain loops.
func (m *mlpRef) forward(x []float32) []float64 {
	h := make([]float64, m.hidden)
	for o := range m.hidden {
		s := float64(m.b1[o])
		for i := range m.in {
			s += float64(m.w1[o*m.in+i]) * float64(x[i])
		}
		h[o] = math.Max(s, 0)
	}
	y := make([]float64, m.out)
	for o := range m.out {
		s := float64(m.b2[o])
		for i := range m.hidden {
			s += float64(m.w2[o*m.hidden+i]) * h[i]
		}
		y[o] = s
	}
	return y
}
