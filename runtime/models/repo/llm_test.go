package repo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// tinyLlama writes a random Llama checkpoint in the Hugging Face layout
// (shards > 1: sharded with the index).
func tinyLlama(t *testing.T, dir string, shards int, edit func(map[string]any)) {
	t.Helper()
	const v, h, layers, heads, kv, inter = 64, 32, 2, 4, 2, 48
	d := h / heads
	rng := rand.New(rand.NewPCG(1, 2))
	w := map[string]models.Tensor{
		"model.embed_tokens.weight": randTensor(rng, v, h),
		"model.norm.weight":         randTensor(rng, h),
		"lm_head.weight":            randTensor(rng, v, h),
	}
	for l := range layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		w[p+"self_attn.q_proj.weight"] = randTensor(rng, heads*d, h)
		w[p+"self_attn.k_proj.weight"] = randTensor(rng, kv*d, h)
		w[p+"self_attn.v_proj.weight"] = randTensor(rng, kv*d, h)
		w[p+"self_attn.o_proj.weight"] = randTensor(rng, h, heads*d)
		w[p+"mlp.gate_proj.weight"] = randTensor(rng, inter, h)
		w[p+"mlp.up_proj.weight"] = randTensor(rng, inter, h)
		w[p+"mlp.down_proj.weight"] = randTensor(rng, h, inter)
		w[p+"input_layernorm.weight"] = randTensor(rng, h)
		w[p+"post_attention_layernorm.weight"] = randTensor(rng, h)
	}
	cfg := map[string]any{
		"architectures": []string{llm.ArchLlama}, "model_type": "llama", "vocab_size": v, "hidden_size": h,
		"num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": inter,
		"max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
		"tie_word_embeddings": false, "eos_token_id": 2,
	}
	if edit != nil {
		edit(cfg)
	}
	writeFile(t, filepath.Join(dir, FileConfig), cfg)
	writeFile(t, filepath.Join(dir, FileGenerationConfig), map[string]any{"eos_token_id": []int{2, 3}, "do_sample": true, "temperature": 0.7})
	if shards <= 1 {
		if err := safetensors.Write(filepath.Join(dir, FileWeights), w, "BF16"); err != nil {
			t.Fatal(err)
		}
		return
	}
	parts := make([]map[string]models.Tensor, shards)
	index := map[string]string{}
	i := 0
	for name, tn := range w {
		k := i % shards
		if parts[k] == nil {
			parts[k] = map[string]models.Tensor{}
		}
		parts[k][name] = tn
		index[name] = fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, shards)
		i++
	}
	for k, part := range parts {
		if err := safetensors.Write(filepath.Join(dir, fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, shards)), part, "F32"); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, fileShardsIndex), map[string]any{"metadata": map[string]any{}, "weight_map": index})
}

func TestLLMVersions(t *testing.T) {
	root := t.TempDir()
	tinyLlama(t, filepath.Join(root, "one", "1"), 1, nil)
	tinyLlama(t, filepath.Join(root, "sharded", "1"), 3, nil)
	r := openRepo(t, root)
	for _, e := range r.List() {
		if e.Kind != llm.KindLLM || len(e.Errs) != 0 {
			t.Errorf("List: %+v", e)
		}
	}
	for _, name := range []string{"one", "sharded"} {
		l, err := r.Load(context.Background(), name, 0)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if l.LLM == nil || l.Kind != llm.KindLLM || l.LLM.Arch() != llm.ArchLlama || l.LLM.ContextLength() != 128 {
			t.Errorf("%s: loaded %+v", name, l)
		}
		if eos := l.LLM.EOS(); len(eos) != 2 {
			t.Errorf("%s: EOS ids %v, want config's and generation_config's (2, 3)", name, eos)
		}
		if _, err := l.Model(); err == nil {
			t.Errorf("%s: a generator built as a batch model", name)
		}
	}
}

func TestLLMRejects(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"layers beyond the weights", func(t *testing.T, dir string) {
			tinyLlama(t, dir, 1, func(c map[string]any) { c["num_hidden_layers"] = 1000 })
		}, "imply"},
		{"layers beyond the bound", func(t *testing.T, dir string) {
			tinyLlama(t, dir, 1, func(c map[string]any) { c["num_hidden_layers"] = 10_000_000 })
		}, "num_hidden_layers"},
		{"sliding window", func(t *testing.T, dir string) {
			tinyLlama(t, dir, 1, func(c map[string]any) { c["architectures"] = []string{llm.ArchQwen2}; c["use_sliding_window"] = true })
		}, "use_sliding_window"},
		{"shard outside the directory", func(t *testing.T, dir string) {
			tinyLlama(t, dir, 2, nil)
			writeFile(t, filepath.Join(dir, fileShardsIndex), map[string]any{"weight_map": map[string]string{"x": "../../etc/passwd"}})
		}, "not a file name"},
		{"missing shard", func(t *testing.T, dir string) {
			tinyLlama(t, dir, 2, nil)
			if err := os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors")); err != nil {
				t.Fatal(err)
			}
		}, "model-00002-of-00002"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, filepath.Join(root, "m", "1"))
			r := openRepo(t, root)
			e := r.List()[0]
			if e.Errs[1] == nil || !strings.Contains(e.Errs[1].Error(), tc.want) {
				t.Errorf("List: %v, want %q", e.Errs[1], tc.want)
			}
			if _, err := r.Load(context.Background(), "m", 1); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load: %v, want ErrInvalid saying %q", err, tc.want)
			}
		})
	}
}
