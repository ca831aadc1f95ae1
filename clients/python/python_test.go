// Package python_test runs the Python client's tests (clients/python/tests)
// with Debian's python3-grpcio, python3-protobuf, python3-numpy and
// python3-zstandard against a real brokerd started here on a Unix socket,
// with a model repository holding an MLP and a small chat model.
package python_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/daemon/daemontest"
)

// python is Debian's interpreter, whose packages the client targets (a
// python3 earlier in PATH, such as a pyenv shim, lacks them).
func python() string {
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	return "python3"
}

func TestPythonClient(t *testing.T) {
	cfg := daemontest.Config(t.TempDir())
	cfg.MetricsListen = "127.0.0.1:0"
	if _, err := modelkit.WriteMLP(filepath.Join(cfg.ModelRepo, "mlp", "1"), modelkit.MLP{In: 4, Hidden: 8, Out: 3, Seed: 5}); err != nil {
		t.Fatal(err)
	}
	labelColumns(t, filepath.Join(cfg.ModelRepo, "mlp", "1", "model.json"), "low", "mid", "high")
	if _, err := modelkit.WriteLLM(filepath.Join(cfg.ModelRepo, "chat", "1"), modelkit.LLM{Arch: "qwen3", Layers: 1, Hidden: 32, Heads: 2,
		KVHeads: 1, HeadDim: 16, Intermediate: 64, DType: "f32", TokenizerDir: "../../runtime/models/tokenizer/bpe/testdata/qwen3"}); err != nil {
		t.Fatal(err)
	}
	addrs := daemontest.Start(t, cfg)

	tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer tcancel()
	cmd := exec.CommandContext(tctx, python(), "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-v")
	cmd.Env = append(os.Environ(), "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1",
		"BROKERD_SOCKET="+cfg.Socket, "BROKERD_ADDR=", "BROKERD_TEST_REPO="+cfg.ModelRepo, "BROKERD_TEST_METRICS=http://"+addrs.Metrics+"/metrics")
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil {
		t.Fatalf("the Python client's tests failed: %v", err)
	}
}

// labelColumns names the output columns of the MLP whose model.json is at
// path (its "labels"), as a classifier's id2label names its classes.
func labelColumns(t *testing.T, path string, labels ...string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	spec["labels"] = labels
	if b, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
