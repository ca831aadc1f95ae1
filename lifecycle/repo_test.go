package lifecycle

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime/models"
)

// A model repository made by the tests (DIR/NAME/VERSION/), with
// bench/modelkit's writers as the daemon's tests make it.

// mlpRef is an MLP written to the repository, kept for the reference
// forward pass (modelkit.MLP.Forward).
type mlpRef struct {
	out int
	m   modelkit.MLP
	w   map[string]models.Tensor
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
	m := modelkit.MLP{In: in, Hidden: hidden, Out: out, Seed: seed}
	w, err := modelkit.WriteMLP(versionDir(t, repo, name, version), m)
	if err != nil {
		t.Fatal(err)
	}
	return &mlpRef{out: out, m: m, w: w}
}

// forward is the float64 reference of one row.
func (m *mlpRef) forward(x []float32) []float64 { return m.m.Forward(m.w, x) }
