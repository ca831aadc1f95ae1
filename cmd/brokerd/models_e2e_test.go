package main_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// e2eMLP is a random mlp (linear → tanh) written as DIR/NAME/VERSION/, with
// a float64 reference of its forward pass.
type e2eMLP struct {
	in, out int
	w, b    []float32
}

func writeE2EMLP(t *testing.T, repo, name string, version int, in, out int) *e2eMLP {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(version), 1))
	m := &e2eMLP{in: in, out: out, w: make([]float32, in*out), b: make([]float32, out)}
	for i := range m.w {
		m.w[i] = float32(r.NormFloat64() / math.Sqrt(float64(in)))
	}
	for i := range m.b {
		m.b[i] = float32(r.NormFloat64() * 0.1)
	}
	dir := filepath.Join(repo, name, fmt.Sprint(version))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), map[string]models.Tensor{
		"fc.weight": {Shape: []int{out, in}, Data: m.w}, "fc.bias": {Shape: []int{out}, Data: m.b},
	}, "F32"); err != nil {
		t.Fatal(err)
	}
	spec := `{"kind": "mlp", "inputs": [{"name": "input", "dims": [` + fmt.Sprint(in) + `]}], "outputs": [{"name": "output"}],
  "layers": [{"type": "linear", "weight": "fc.weight", "bias": "fc.bias"}, {"type": "tanh"}]}`
	if err := os.WriteFile(filepath.Join(dir, "model.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *e2eMLP) forward(x []float64) []float64 {
	y := make([]float64, m.out)
	for o := range m.out {
		s := float64(m.b[o])
		for i := range m.in {
			s += float64(m.w[o*m.in+i]) * x[i]
		}
		y[o] = math.Tanh(s)
	}
	return y
}

func TestBrokerctlModelCommands(t *testing.T) {
	repo := t.TempDir()
	ref := writeE2EMLP(t, repo, "scorer", 1, 3, 2)
	b := startBrokerd(t, "--model-repo", repo)
	rows := [][]float64{{1, 2, 3}, {-0.5, 0.25, 0}}
	input := filepath.Join(t.TempDir(), "input.json")
	doc, _ := json.Marshal(map[string]any{"shape": []int{2, 3}, "datatype": "FP32", "data": rows})
	if err := os.WriteFile(input, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(t.TempDir(), "plain.json")
	if err := os.WriteFile(plain, []byte(`[[1, 2, 3], [-0.5, 0.25, 0]]`), 0o644); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		args     []string
		wantCode int
		want     []string
	}{
		{[]string{"models"}, 0, []string{"NAME", "nbmf-hash-v1", "scorer", "mlp", "available"}},
		{[]string{"infer", "scorer", "--input", "input=@" + input}, 1, []string{"FAILED_PRECONDITION", "not loaded"}},
		{[]string{"load", "scorer"}, 0, []string{"scorer version 1 ready on cpu:0"}},
		{[]string{"load", "scorer"}, 0, []string{"scorer version 1 ready on cpu:0", "unchanged: already served from these files"}},
		{[]string{"models", "--wide"}, 0, []string{"scorer", "ready", "cpu:0", "input:FP32[-1,3]", "output:FP32[-1,2]"}},
		{[]string{"infer", "scorer", "--input", "input=@" + plain}, 0, []string{"output FP32 [2 2]", "execution: model scorer v1, device cpu:0"}},
		{[]string{"infer", "scorer", "--input", "input=[[1, 2]]"}, 1, []string{"INVALID_ARGUMENT", `input "input": shape [1, 2]: dimension 1 is 2, want 3`}},
		{[]string{"infer", "scorer", "--input", "x=@" + input}, 1, []string{"INVALID_ARGUMENT", `input "x" is not an input of model scorer`}},
		{[]string{"infer", "scorer", "--input", "input=[[1, 2], [3]]"}, 2, []string{"ragged"}},
		{[]string{"bench", "--model", "scorer", "--concurrency", "2", "--duration", "300ms", "--warmup", "0", "--items-per-request", "4"}, 0,
			[]string{"model scorer, Infer, 4 item(s)/request"}},
		{[]string{"unload", "scorer"}, 0, []string{"scorer version 1 unloaded"}},
		{[]string{"unload", "scorer"}, 1, []string{"FAILED_PRECONDITION"}},
		{[]string{"load", "nope"}, 1, []string{"NOT_FOUND"}},
	}
	for _, s := range steps {
		name := strings.Join(s.args, " ")
		ok := t.Run(name, func(t *testing.T) {
			stdout, stderr, code := brokerctl(t, b.socket, s.args...)
			if code != s.wantCode {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, s.wantCode, stdout, stderr)
			}
			text := stdout
			if code != 0 {
				text = stderr
			}
			for _, w := range s.want {
				if !strings.Contains(text, w) {
					t.Errorf("output lacks %q:\n%s", w, text)
				}
			}
		})
		if !ok && s.wantCode == 0 {
			return
		}
		if s.args[0] == "load" && s.wantCode == 0 {
			// Values, through --json, against the float64 reference.
			stdout, stderr, code := brokerctl(t, b.socket, "infer", "scorer", "--input", "input=@"+input, "--json")
			if code != 0 {
				t.Fatalf("infer --json: exit %d: %s", code, stderr)
			}
			var got struct {
				Model   string `json:"model"`
				Outputs []struct {
					Name     string      `json:"name"`
					Shape    []int64     `json:"shape"`
					Datatype string      `json:"datatype"`
					Data     [][]float64 `json:"data"`
				} `json:"outputs"`
			}
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatalf("infer --json is not the documented document: %v\n%s", err, stdout)
			}
			if got.Model != "scorer" || len(got.Outputs) != 1 || got.Outputs[0].Name != "output" || got.Outputs[0].Datatype != "FP32" {
				t.Fatalf("infer --json = %s", stdout)
			}
			for i, row := range rows {
				for j, want := range ref.forward(row) {
					if g := got.Outputs[0].Data[i][j]; math.Abs(g-want) > 1e-5 {
						t.Errorf("row %d col %d: %g, want %g", i, j, g, want)
					}
				}
			}
		}
	}
}

// TestFirstModels follows the README's "Your first models": mkmodels (what
// make models runs) writes the four models, and every command it prints
// next works, as printed, from the repository root with the examples/ files.
func TestFirstModels(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	mk := exec.Command(filepath.Join(binDir, "mkmodels"), "-repo", repo)
	mk.Dir = root
	out, err := mk.CombinedOutput()
	if err != nil {
		t.Fatalf("mkmodels: %v\n%s", err, out)
	}
	var commands []string
	for _, line := range strings.Split(string(out), "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "bin/brokerctl ") {
			commands = append(commands, l)
		}
	}
	if len(commands) < 5 {
		t.Fatalf("mkmodels printed %d commands to try:\n%s", len(commands), out)
	}
	b := startBrokerd(t, "--model-repo", repo)
	wants := map[string][]string{
		"models":    {"bert-mini", "sentiment", "mlp", "qwen-tiny", "available"},
		"bert-mini": {"128d", "sha256:", "batch 5"},
		"sentiment": {"logits FP32 [3 2]", "classes of logits (softmax), highest first:", "  [2] "},
		"mlp ":      {"output FP32 [2 3]"},
		"qwen-tiny": {"24 tokens"},
	}
	for _, c := range commands {
		// As printed, but with a deadline far from the work's: brokerctl's
		// default 10 s was once too short for a load beside a busy tenant.
		sh := exec.Command("sh", "-c", strings.ReplaceAll(c, "bin/brokerctl", filepath.Join(binDir, "brokerctl")+" --timeout 5m"))
		sh.Dir = root
		sh.Env = hostEnv("BROKERD_SOCKET=" + b.socket)
		got, err := sh.CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v\n%s", c, err, got)
			continue
		}
		for key, want := range wants {
			if !strings.Contains(c, key) {
				continue
			}
			for _, w := range want {
				if !strings.Contains(string(got), w) {
					t.Errorf("%s: output lacks %q:\n%s", c, w, got)
				}
			}
		}
	}
}
