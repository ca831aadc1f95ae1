package lifecycle

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/brokerd/brokerd/bench/modelkit"
)

// A model repository made by the tests (DIR/NAME/VERSION/), with
// bench/modelkit's writers as the daemon's tests make it.

// mlpRef is an MLP written to the repository, kept for the reference
// forward pass: linear → relu → linear.
type mlpRef struct {
	in, hidden, out int
	w1, b1, w2, b2  []float32 // PyTorch Linear layout: w [out, in]
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
	w, err := modelkit.WriteMLP(versionDir(t, repo, name, version), modelkit.MLP{In: in, Hidden: hidden, Out: out, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
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
