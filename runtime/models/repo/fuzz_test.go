package repo

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
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
