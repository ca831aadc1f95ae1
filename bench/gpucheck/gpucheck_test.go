package main

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// steps are bench/gpu_check.sh's steps, in order.
var steps = []string{"facts", "nvidia-compare", "pjrt-devices", "against-cpu", "bert-fixture", "bert-throughput", "llm-greedy", "gguf-greedy", "llm-throughput"}

type checkResults struct {
	CPUMode bool `json:"cpu_mode"`
	Steps   []struct {
		Name, Status, Key string
		Seconds           int
	} `json:"steps"`
}

// runCheck runs bench/gpu_check.sh into a new directory with env added and
// returns the directory, the parsed results.json and the exit error.
func runCheck(t *testing.T, env ...string) (string, checkResults, error) {
	t.Helper()
	out := t.TempDir()
	cmd := exec.Command("bash", "gpu_check.sh", out)
	cmd.Dir = ".."
	cmd.Env = append(append(os.Environ(), "GPU_CHECK_CPU=1"), env...)
	b, err := cmd.CombinedOutput()
	t.Logf("gpu_check.sh:\n%s", b)
	var res checkResults
	raw, rerr := os.ReadFile(filepath.Join(out, "results.json"))
	if rerr != nil {
		t.Fatalf("no results.json: %v", rerr)
	}
	if jerr := json.Unmarshal(raw, &res); jerr != nil {
		t.Fatalf("results.json: %v", jerr)
	}
	summary, serr := os.ReadFile(filepath.Join(out, "summary.md"))
	if serr != nil {
		t.Fatalf("no summary.md: %v", serr)
	}
	// One line per step, in order, with a status, its seconds and a key.
	line := regexp.MustCompile(`(?m)^- \*\*([a-z-]+)\*\* (PASS|FAIL|SKIP|TIMEOUT) \(\d+ s\): (.*)$`)
	ms := line.FindAllStringSubmatch(string(summary), -1)
	if len(ms) != len(steps) || len(res.Steps) != len(steps) {
		t.Fatalf("summary has %d step lines and results.json %d steps, want %d:\n%s", len(ms), len(res.Steps), len(steps), summary)
	}
	for i, m := range ms {
		if m[1] != steps[i] || res.Steps[i].Name != steps[i] || m[2] != res.Steps[i].Status {
			t.Errorf("step %d: summary %s %s, results.json %s %s, want %s", i, m[1], m[2], res.Steps[i].Name, res.Steps[i].Status, steps[i])
		}
		if strings.TrimSpace(res.Steps[i].Key) == "" {
			t.Errorf("step %s has no key figures", steps[i])
		}
	}
	if !strings.HasPrefix(string(summary), "# brokerd GPU check\n") || !res.CPUMode {
		t.Errorf("summary header or cpu_mode wrong:\n%s", summary)
	}
	return out, res, err
}

// TestCPUMode builds the bundle as make gpu-bundle does (gzip instead of
// xz and only the binaries the CPU mode runs, for time) and runs bench/gpu_check.sh with GPU_CHECK_CPU=1: the
// bundle unpacks and its binaries find their libraries; brokerd, on the
// CPU adapter, serves a random Qwen2 checkpoint that gpucheck's greedy
// request and brokerctl bench --generate reach, and its Q4_K_M GGUF
// (kept quantized); the GPU steps say SKIP; the
// summary, results.json and logs.tar.gz have their shape. Where torch is
// installed, brokerd's greedy tokens must also match bench/peers/
// llm_torch.py's (transformers's where that is installed too).
func TestCPUMode(t *testing.T) {
	needTools(t)
	goTool := os.Getenv("GO")
	if goTool == "" {
		goTool = "go"
	}
	bundleDir := t.TempDir()
	build := exec.Command("bash", "gpu_bundle.sh", bundleDir)
	build.Dir = ".."
	build.Env = append(os.Environ(), "GPU_BUNDLE_COMPRESS=gz", "GPU_BUNDLE_MINIMAL=1", "GO="+goTool)
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("gpu_bundle.sh: %v\n%s", err, b)
	}
	out, res, err := runCheck(t, "GPU_BUNDLE="+filepath.Join(bundleDir, "bundle.tar.gz"))
	if err != nil {
		t.Errorf("gpu_check.sh in CPU mode: %v (a step failed)", err)
	}
	torch := exec.Command("python3", "-c", "import torch").Run() == nil
	ggml := haveGGML()
	for _, s := range res.Steps {
		want := "SKIP"
		switch s.Name {
		case "facts":
			want = "PASS"
		case "llm-greedy":
			if torch {
				want = "PASS"
			}
			if !strings.Contains(s.Key, "brokerd on cpu:0: 4 prompts x 8 tokens") {
				t.Errorf("llm-greedy key %q: want brokerd's tokens on cpu:0", s.Key)
			}
		case "gguf-greedy":
			// SKIP in CPU mode (no transformers comparison); the key says
			// what brokerd did with the quantized file, or that the
			// bundle has no libggml-base.so to write it with.
			wants := []string{"Q4_K_M GGUF of", "brokerd on cpu:0: 4 prompts x 8 tokens", "kept quantized", "CPU adapter (quantized kernels", "4/4 prompts' tokens agree"}
			if !ggml {
				wants = []string{"no libggml-base.so"}
			}
			for _, w := range wants {
				if !strings.Contains(s.Key, w) {
					t.Errorf("gguf-greedy key %q lacks %q", s.Key, w)
				}
			}
		case "llm-throughput":
			for _, w := range []string{"1 seq: brokerd", "2 seq: brokerd"} {
				if !strings.Contains(s.Key, w) {
					t.Errorf("llm-throughput key %q lacks %q", s.Key, w)
				}
			}
		case "bert-fixture":
			if exec.Command("python3", "-c", "import torch, transformers").Run() == nil {
				want = "PASS"
			}
		}
		if s.Status != want {
			t.Errorf("step %s: %s (%s), want %s", s.Name, s.Status, s.Key, want)
		}
	}
	// The greedy request's record: every prompt tokenized, answered in
	// full, brokerd's prompt count equal to the tokenizer's.
	raw := fileInTarGz(t, filepath.Join(out, "logs.tar.gz"), "logs/llm-brokerd.json")
	var got Result
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if got.DeviceID != "cpu:0" || len(got.Prompts) != len(Prompts) || len(got.Tokens) != len(Prompts) || len(got.Problems) != 0 {
		t.Fatalf("llm-brokerd.json: device %s, %d prompts, %d answers, problems %v", got.DeviceID, len(got.Prompts), len(got.Tokens), got.Problems)
	}
	for i, p := range got.Prompts {
		if len(p.IDs) == 0 || int(p.UsageTokens) != len(p.IDs) || len(got.Tokens[i]) != got.MaxTokens || len(got.Gaps[i]) != got.MaxTokens {
			t.Errorf("prompt %d: %d ids (brokerd counted %d), %d tokens, %d gaps, want %d", i, len(p.IDs), p.UsageTokens, len(got.Tokens[i]), len(got.Gaps[i]), got.MaxTokens)
		}
	}
}

// TestNoBundle: without a bundle the facts step fails and says so, the
// steps that need its binaries fail or skip, the summary keeps its shape
// and the exit status is 1.
func TestNoBundle(t *testing.T) {
	needTools(t)
	_, res, err := runCheck(t, "GPU_BUNDLE="+filepath.Join(t.TempDir(), "absent.tar.gz"))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("exit: %v, want status 1", err)
	}
	if s := res.Steps[0]; s.Status != "FAIL" || !strings.Contains(s.Key, "NO BUNDLE") {
		t.Errorf("facts: %s %q, want FAIL naming the missing bundle", s.Status, s.Key)
	}
	if s := res.Steps[len(res.Steps)-1]; s.Status != "FAIL" || !strings.Contains(s.Key, "mkllm") {
		t.Errorf("llm-throughput: %s %q, want FAIL for the missing checkpoint", s.Status, s.Key)
	}
}

// TestOutOfBudget: a step the budget cannot hold is not started; its line
// says why, and that is no failure.
func TestOutOfBudget(t *testing.T) {
	needTools(t)
	_, res, err := runCheck(t, "GPU_BUNDLE="+filepath.Join(t.TempDir(), "absent.tar.gz"), "GPU_CHECK_BUDGET=10")
	if err != nil {
		t.Errorf("exit: %v, want 0", err)
	}
	for _, s := range res.Steps {
		if s.Status != "SKIP" || !strings.Contains(s.Key, "out of the time budget") {
			t.Errorf("step %s: %s %q, want SKIP for the budget", s.Name, s.Status, s.Key)
		}
	}
}

// haveGGML says whether gpu_bundle.sh finds a libggml-base.so to carry
// (it looks where this does).
func haveGGML() bool {
	for _, p := range []string{
		os.Getenv("BROKERD_GGML_LIB"),
		"../peers/llamacpp/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so",
		"../../runtime/quant/ggmlref/testdata/npm/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so",
	} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

func needTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"bash", "python3", "timeout", "tar", "ldd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: %v", tool, err)
		}
	}
}

func fileInTarGz(t *testing.T, path, name string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s has no %s", path, name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}
