package repo

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime/models/ollama"
)

// writeOllamaModel lays out one model in an Ollama store (modelkit's).
func writeOllamaModel(t *testing.T, store, model, tag, gguf string, m modelkit.OllamaModel) {
	t.Helper()
	m.Family, m.FileType = "qwen2", "Q8_0"
	if err := modelkit.WriteOllamaModel(store, model, tag, gguf, m); err != nil {
		t.Fatal(err)
	}
}

// TestOllamaStoreModels: a model of an Ollama store lists and loads under
// its Ollama name (":latest" left out), in every form Ollama accepts; its
// blob is verified before use (a changed byte is refused), its params are
// the model's defaults and its num_ctx caps the context; a repository
// model of the same name wins.
func TestOllamaStoreModels(t *testing.T) {
	dir, store := t.TempDir(), t.TempDir()
	_, gg := ggufPair(t, dir, "qwen2", "q8_0")
	gguf := filepath.Join(gg, "model.gguf")
	writeOllamaModel(t, store, "tiny", "latest", gguf, modelkit.OllamaModel{
		Params: `{"temperature": 0.25, "top_k": 7, "num_ctx": 128, "stop": ["<|im_end|>"]}`, System: "Be brief."})
	writeOllamaModel(t, store, "tiny", "q8", gguf, modelkit.OllamaModel{})
	writeOllamaModel(t, store, "qwen2-st", "latest", gguf, modelkit.OllamaModel{}) // shadowed by the repository's qwen2-st
	s, err := ollama.Open(store, ollama.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(dir, zaptest.NewLogger(t), WithOllamaStore(s))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]Entry{}
	for _, e := range r.List() {
		names[e.Name] = e
	}
	for _, n := range []string{"tiny", "tiny:q8", "qwen2-st", "qwen2-gg"} {
		if _, ok := names[n]; !ok {
			t.Errorf("List has no %s: %v", n, names)
		}
	}
	if e := names["qwen2-st"]; e.Kind != "llm" || len(e.Versions) != 1 || e.Versions[0] != 1 {
		t.Errorf("the repository's qwen2-st: %+v", e)
	}
	for _, alias := range []string{"tiny", "tiny:latest", "library/tiny:latest", "registry.ollama.ai/library/tiny:latest"} {
		if got := r.Canonical(alias); got != "tiny" {
			t.Errorf("Canonical(%s) = %s, want tiny", alias, got)
		}
	}
	ctx := context.Background()
	l, err := r.Load(ctx, "tiny:latest", 0)
	if err != nil {
		t.Fatal(err)
	}
	if l.LLM == nil || l.Name != "tiny" || l.Version != 1 || l.Fingerprint == "" {
		t.Fatalf("loaded %+v", l)
	}
	if d := l.LLM.DefaultSampling(); d.Temperature != 0.25 || d.TopK != 7 || len(d.Stop) != 1 || d.Stop[0] != "<|im_end|>" {
		t.Errorf("default sampling %+v: want the params' temperature 0.25, top_k 7 and stop", d)
	}
	if got := l.LLM.SystemPrompt(); got != "Be brief." {
		t.Errorf("system prompt %q, want the system layer's", got)
	}
	if n := l.LLM.ContextLength(); n != 128 {
		t.Errorf("context %d, want the params' num_ctx 128", n)
	}
	if fp, err := r.Fingerprint("tiny", 1); err != nil || fp != l.Fingerprint {
		t.Errorf("fingerprint %q %v, the load's %q", fp, err, l.Fingerprint)
	}
	// Without params, Ollama's own defaults.
	l8, err := r.Load(ctx, "tiny:q8", 0)
	if err != nil {
		t.Fatal(err)
	}
	if d := l8.LLM.DefaultSampling(); d.Temperature != 0.8 || d.TopK != 40 || d.TopP != 0.9 {
		t.Errorf("default sampling without params %+v: want Ollama's temperature 0.8, top_k 40, top_p 0.9", d)
	}
	if _, err := r.Load(ctx, "tiny", 2); !errors.Is(err, ErrNotFound) {
		t.Errorf("version 2 of a store model: %v", err)
	}

	// One byte changed: the digest no longer holds.
	raw, _ := os.ReadFile(gguf)
	raw[len(raw)-1] ^= 1
	writeOllamaModel(t, store, "bad", "latest", gguf, modelkit.OllamaModel{})
	mf, _ := os.ReadFile(filepath.Join(store, "manifests", "registry.ollama.ai", "library", "bad", "latest"))
	var m struct {
		Layers []struct{ Digest string } `json:"layers"`
	}
	if err := json.Unmarshal(mf, &m); err != nil {
		t.Fatal(err)
	}
	blobPath := filepath.Join(store, "blobs", "sha256-"+m.Layers[0].Digest[len("sha256:"):])
	if err := os.WriteFile(blobPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	// A fresh store: the blob was verified under its old time by the load above.
	s2, _ := ollama.Open(store, ollama.Limits{})
	r2, _ := Open(dir, zaptest.NewLogger(t), WithOllamaStore(s2))
	if _, err := r2.Load(ctx, "bad", 0); !errors.Is(err, ollama.ErrCorrupt) {
		t.Errorf("a blob that is not its digest: %v", err)
	}
}
