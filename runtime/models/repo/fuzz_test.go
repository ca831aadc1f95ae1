package repo

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime/gguf"
)

// FuzzConfigJSON inspects and loads a model whose config.json is arbitrary
// bytes (next to a real BERT's weights and tokenizer, or a tiny Llama's
// weights): every outcome is a model or an ErrInvalid error, never a panic
// or an allocation sized by the file.
func FuzzConfigJSON(f *testing.F) {
	good, _ := json.Marshal(newBERTFixture(9).config)
	f.Add(good, false)
	f.Add([]byte(`{"architectures":["BertModel"],"num_hidden_layers":10000000,"hidden_size":64}`), false)
	f.Add([]byte(`{"architectures":["LlamaForCausalLM"],"vocab_size":64,"hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":48,"max_position_embeddings":128}`), true)
	f.Add([]byte(`{"architectures":["Qwen3ForCausalLM"],"vocab_size":1e12}`), true)
	f.Add([]byte(`{"architectures":["LlamaForCausalLM"],"num_attention_heads":0,"hidden_size":32}`), true)
	f.Add([]byte(`[]`), false)
	root := f.TempDir()
	bertDir := filepath.Join(root, "bert", "1")
	newBERTFixture(9).write(&testing.T{}, bertDir)
	llmDir := filepath.Join(root, "llm", "1")
	tinyLlama(&testing.T{}, llmDir, 1, nil)
	r, err := Open(root, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, config []byte, asLLM bool) {
		name, dir := "bert", bertDir
		if asLLM {
			name, dir = "llm", llmDir
		}
		path := filepath.Join(dir, FileConfig)
		old, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		defer os.WriteFile(path, old, 0o644)
		if err := os.WriteFile(path, config, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, e := range r.List() {
			for _, err := range e.Errs {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("List: an error that is not ErrInvalid: %v", err)
				}
			}
		}
		if _, err := r.Load(context.Background(), name, 1); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("Load: an error that is not ErrInvalid: %v", err)
		}
	})
}

// FuzzGGUFModel inspects and loads a version directory whose one .gguf
// file is arbitrary bytes, seeded with a valid tiny Qwen3 in F16 and in
// Q8_0 (so the fuzzer mutates real metadata: heads, lengths, the
// tokenizer's arrays, the chat template, tensor dims): every outcome is a
// model or an ErrInvalid or gguf error, never a panic.
func FuzzGGUFModel(f *testing.F) {
	root := f.TempDir()
	tok := filepath.Join(root, "tok")
	st := filepath.Join(root, "st", "1")
	gg := filepath.Join(root, "gg", "1")
	for _, d := range []string{tok, st, gg} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := modelkit.WriteByteTokenizer(tok, "{% for m in messages %}{{ m.content }}{% endfor %}"); err != nil {
		f.Fatal(err)
	}
	if _, err := modelkit.WriteLLM(st, modelkit.LLM{Arch: "qwen3", Layers: 1, Hidden: 32, Heads: 2, KVHeads: 1,
		Intermediate: 32, MaxPositions: 64, DType: "f32", Seed: 3, TokenizerDir: tok}); err != nil {
		f.Fatal(err)
	}
	for _, dt := range []string{"f16", "q8_0"} {
		p := filepath.Join(root, dt+".gguf")
		if _, err := modelkit.WriteGGUF(st, p, dt); err != nil {
			f.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	r, err := Open(root, nil)
	if err != nil {
		f.Fatal(err)
	}
	file := filepath.Join(gg, "model.gguf")
	if err := os.Rename(filepath.Join(root, "q8_0.gguf"), file); err != nil {
		f.Fatal(err)
	}
	if l, err := r.Load(context.Background(), "gg", 1); err != nil || l.LLM == nil {
		f.Fatalf("the seed does not load as an LLM: %v", err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		// (A loaded model's mapping is released when it is collected.)
		_, err := r.Load(context.Background(), "gg", 1)
		if err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, gguf.ErrInvalid) && !errors.Is(err, gguf.ErrUnsupportedType) {
			t.Fatalf("Load: an error that is neither ErrInvalid nor a gguf refusal: %v", err)
		}
	})
}
