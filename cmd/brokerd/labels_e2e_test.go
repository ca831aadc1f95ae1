package main_test

import (
	"cmp"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/bench/modelkit"
)

// TestClassifierLabelsE2E: a classifier with id2label, served by brokerd:
// brokerctl infer prints each text's classes by label, highest first, as
// the softmax of the logits it also prints; infer --json names the
// columns; models --wide and models --json list the labels.
func TestClassifierLabelsE2E(t *testing.T) {
	labels := []string{"negative", "neutral", "positive"}
	repo := t.TempDir()
	if err := modelkit.WriteBERT(filepath.Join(repo, "sentiment", "1"), modelkit.BERT{Layers: 1, Hidden: 32, Heads: 2, Intermediate: 64,
		Labels: labels, Seed: 5}); err != nil {
		t.Fatal(err)
	}
	b := startBrokerd(t, "--model-repo", repo, "--load-models", "sentiment")
	texts := filepath.Join(t.TempDir(), "texts.json")
	if err := os.WriteFile(texts, []byte(`{"datatype": "BYTES", "data": ["a fine day", "the worst of all", "so so"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		stdout, stderr, code := brokerctl(t, b.socket, args...)
		if code != 0 {
			t.Fatalf("brokerctl %s: exit %d\n%s", strings.Join(args, " "), code, stderr)
		}
		return stdout
	}

	// The logits, through --json, with their labels.
	var doc struct {
		Outputs []struct {
			Name   string      `json:"name"`
			Data   [][]float64 `json:"data"`
			Labels []string    `json:"labels"`
		} `json:"outputs"`
	}
	out := run("infer", "sentiment", "--input", "text=@"+texts, "--json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Outputs) != 1 || len(doc.Outputs[0].Data) != 3 {
		t.Fatalf("infer --json: %v\n%s", err, out)
	}
	if o := doc.Outputs[0]; o.Name != "logits" || !slices.Equal(o.Labels, labels) {
		t.Errorf("infer --json output %s labels %q, want logits labelled %q", o.Name, o.Labels, labels)
	}

	// The text form: each row's labels ordered by the softmax of its logits.
	out = run("infer", "sentiment", "--input", "text=@"+texts)
	if !strings.Contains(out, "classes of logits (softmax), highest first:\n") {
		t.Fatalf("infer prints no classes:\n%s", out)
	}
	for r, row := range doc.Outputs[0].Data {
		logits := make([]float64, len(row))
		for i, l := range row {
			logits[i] = float64(float32(l)) // the FP32 value brokerctl computes from
		}
		order := []int{0, 1, 2}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(logits[b], logits[a]) })
		var sum float64
		for _, l := range logits {
			sum += math.Exp(l)
		}
		want := "  [" + strconv.Itoa(r) + "]"
		for _, i := range order {
			want += " " + labels[i] + " " + strconv.FormatFloat(math.Exp(logits[i])/sum, 'f', 4, 64) + " "
		}
		want = strings.TrimSuffix(want, " ") + "\n"
		if !strings.Contains(out, want) {
			t.Errorf("row %d (logits %v): output lacks %q:\n%s", r, logits, want, out)
		}
	}

	if out := run("models", "--wide"); !strings.Contains(out, "negative,neutral,positive") || !strings.Contains(out, "LABELS") {
		t.Errorf("models --wide lists no labels:\n%s", out)
	}
	type model struct {
		Name   string   `json:"name"`
		Labels []string `json:"labels"`
	}
	var list struct {
		Models []model `json:"models"`
	}
	out = run("models", "--json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("models --json: %v\n%s", err, out)
	}
	i := slices.IndexFunc(list.Models, func(m model) bool { return m.Name == "sentiment" })
	if i < 0 || !slices.Equal(list.Models[i].Labels, labels) {
		t.Errorf("models --json: sentiment's labels missing:\n%s", out)
	}
}
