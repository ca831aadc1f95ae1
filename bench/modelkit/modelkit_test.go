package modelkit

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/repo"
)

// TestModelsLoad: each kind modelkit writes is a model the repository
// loads as that kind: decoder LLMs of each architecture (single file and
// sharded, each dtype), a BERT encoder, a BERT classifier with its labels
// and an MLP.
func TestModelsLoad(t *testing.T) {
	root := t.TempDir()
	dir := func(name string) string { return filepath.Join(root, name, "1") }
	llms := []struct {
		arch   string
		shards int
		dtype  string
	}{{"llama", 1, "bf16"}, {"qwen2", 3, "f16"}, {"qwen3", 1, "f32"}}
	for _, c := range llms {
		s := LLM{Arch: c.arch, Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, Intermediate: 96, Vocab: 300, MaxPositions: 256, DType: c.dtype, Shards: c.shards}
		if c.arch == "qwen3" {
			s.HeadDim = 32
		}
		if _, err := WriteLLM(dir(c.arch), s); err != nil {
			t.Fatalf("%s: %v", c.arch, err)
		}
	}
	if err := WriteBERT(dir("encoder"), BERT{Layers: 1, Hidden: 32, Heads: 2, Intermediate: 64}); err != nil {
		t.Fatal(err)
	}
	if err := WriteBERT(dir("classifier"), BERT{Layers: 1, Hidden: 32, Heads: 2, Intermediate: 64, Labels: []string{"negative", "positive"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteMLP(dir("mlp"), MLP{In: 4, Hidden: 8, Out: 3}); err != nil {
		t.Fatal(err)
	}
	r, err := repo.Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	load := func(name string) *repo.Loaded {
		t.Helper()
		l, err := r.Load(context.Background(), name, 1)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return l
	}
	for _, c := range llms {
		l := load(c.arch)
		if l.LLM == nil || l.LLM.Arch() != Archs[c.arch] || fmt.Sprint(l.LLM.EOS()) != "[2]" {
			t.Errorf("%s: %+v", c.arch, l)
		}
	}
	if l := load("encoder"); l.Kind != models.KindBERT || l.BERT == nil {
		t.Errorf("encoder: %+v", l)
	}
	if l := load("classifier"); l.Kind != models.KindBERTClassifier || len(l.BERT.ID2Label) != 2 || l.BERT.ID2Label["1"] != "positive" {
		t.Errorf("classifier: %+v", l)
	}
	if l := load("mlp"); l.Kind != models.KindMLP || l.MLP == nil {
		t.Errorf("mlp: %+v", l)
	}
	if _, err := WriteLLM(dir("bad"), LLM{Arch: "llama", Layers: 1, Hidden: 8, Intermediate: 8, Heads: 3, KVHeads: 2}); err == nil {
		t.Error("heads not a multiple of kv heads was accepted")
	}
}
