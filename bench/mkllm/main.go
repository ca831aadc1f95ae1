// Command mkllm writes a random decoder LLM checkpoint (Llama, Qwen2 or
// Qwen3) into a brokerd model repository, in the Hugging Face layout:
// config.json, model.safetensors (or shards with
// model.safetensors.index.json) and generation_config.json, with the
// tokenizer.json and tokenizer_config.json of -tokenizer-dir copied beside
// them. The weights are random (scaled so activations stay finite), for
// benchmarks and tests: the shapes, not the text, are what matter.
//
//	go run ./bench/mkllm -repo /tmp/repo -name qwen-0.5b-shape -arch qwen2 -layers 24 -hidden 896 \
//	    -heads 14 -kv-heads 2 -intermediate 4864 -vocab 151936 -dtype bf16 -tokenizer-dir DIR
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// shape is the checkpoint's architecture and sizes.
type shape struct {
	arch                                    string
	layers, hidden, heads, kvHeads, headDim int
	inter, vocab, positions                 int
	tied                                    bool
	ropeTheta                               float64
	eos                                     []int
}

var archs = map[string]string{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

func main() {
	repo := flag.String("repo", "", "model repository directory (required)")
	name := flag.String("name", "llm-bench", "model name")
	version := flag.Int("version", 1, "model version")
	arch := flag.String("arch", "qwen2", "architecture: llama, qwen2 or qwen3")
	layers := flag.Int("layers", 4, "decoder layers")
	hidden := flag.Int("hidden", 256, "hidden size")
	heads := flag.Int("heads", 4, "attention heads")
	kvHeads := flag.Int("kv-heads", 2, "key/value heads (grouped-query attention)")
	headDim := flag.Int("head-dim", 0, "head dimension (0: hidden/heads; Qwen3 sets it)")
	inter := flag.Int("intermediate", 1024, "intermediate size of the MLP")
	vocab := flag.Int("vocab", 0, "vocabulary size (0: the tokenizer's, else 32000)")
	positions := flag.Int("max-positions", 4096, "max_position_embeddings")
	dtype := flag.String("dtype", "bf16", "stored dtype: f32, f16 or bf16")
	shards := flag.Int("shards", 1, "safetensors files (more than 1: sharded with the index)")
	tied := flag.Bool("tied", false, "tie the embeddings and lm_head")
	seed := flag.Uint64("seed", 1, "random seed of the weights")
	tokDir := flag.String("tokenizer-dir", "", "directory with tokenizer.json and tokenizer_config.json to copy (the checkpoint takes its vocabulary size and EOS ids)")
	flag.Parse()
	s := shape{arch: archs[*arch], layers: *layers, hidden: *hidden, heads: *heads, kvHeads: *kvHeads, headDim: *headDim,
		inter: *inter, vocab: *vocab, positions: *positions, tied: *tied, ropeTheta: 1e6, eos: []int{2}}
	if err := run(*repo, *name, *version, s, *dtype, *shards, *seed, *tokDir); err != nil {
		fmt.Fprintln(os.Stderr, "mkllm:", err)
		os.Exit(1)
	}
}

func run(repo, name string, version int, s shape, dtype string, shards int, seed uint64, tokDir string) error {
	switch {
	case repo == "":
		return errors.New("-repo is required")
	case s.arch == "":
		return errors.New("-arch: want llama, qwen2 or qwen3")
	case s.heads <= 0 || s.kvHeads <= 0 || s.heads%s.kvHeads != 0:
		return fmt.Errorf("-heads %d must be a positive multiple of -kv-heads %d", s.heads, s.kvHeads)
	case shards < 1:
		return errors.New("-shards must be at least 1")
	}
	var stDType string
	switch dtype {
	case "f32":
		stDType = "F32"
	case "f16":
		stDType = "F16"
	case "bf16":
		stDType = "BF16"
	default:
		return fmt.Errorf("-dtype %q: want f32, f16 or bf16", dtype)
	}
	if s.headDim == 0 {
		s.headDim = s.hidden / s.heads
	}
	dir := filepath.Join(repo, name, strconv.Itoa(version))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if tokDir != "" {
		n, eos, err := copyTokenizer(tokDir, dir)
		if err != nil {
			return err
		}
		if s.vocab == 0 {
			s.vocab = n
		}
		if len(eos) > 0 {
			s.eos = eos
		}
	}
	if s.vocab == 0 {
		s.vocab = 32000
	}
	if err := writeJSON(filepath.Join(dir, "config.json"), config(s)); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, "generation_config.json"), map[string]any{"eos_token_id": s.eos, "do_sample": false}); err != nil {
		return err
	}
	w := weights(s, rand.New(rand.NewPCG(seed, 17)))
	if shards == 1 {
		if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), w, stDType); err != nil {
			return err
		}
	} else if err := writeShards(dir, w, stDType, shards); err != nil {
		return err
	}
	var params int
	for _, t := range w {
		params += len(t.Data)
	}
	fmt.Printf("wrote %s: %s, %d layers, hidden %d, %d parameters (%s)\n", dir, s.arch, s.layers, s.hidden, params, stDType)
	return nil
}

func config(s shape) map[string]any {
	c := map[string]any{
		"architectures": []string{s.arch}, "vocab_size": s.vocab, "hidden_size": s.hidden,
		"num_hidden_layers": s.layers, "num_attention_heads": s.heads, "num_key_value_heads": s.kvHeads,
		"intermediate_size": s.inter, "max_position_embeddings": s.positions, "rms_norm_eps": 1e-6,
		"rope_theta": s.ropeTheta, "hidden_act": "silu", "tie_word_embeddings": s.tied, "eos_token_id": s.eos,
		"torch_dtype": "bfloat16",
	}
	if s.arch == archs["qwen3"] {
		c["head_dim"] = s.headDim
	}
	return c
}

// weights are the Hugging Face tensors, normal with a 1/sqrt(fan-in) scale
// (norm weights near 1), so a forward pass stays finite at any depth.
func weights(s shape, rng *rand.Rand) map[string]models.Tensor {
	rnd := func(scale float64, shape ...int) models.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(rng.NormFloat64() * scale)
		}
		return models.Tensor{Shape: shape, Data: data}
	}
	norm := func(n int) models.Tensor {
		t := rnd(0.02, n)
		for i := range t.Data {
			t.Data[i]++
		}
		return t
	}
	h, q, kv := s.hidden, s.heads*s.headDim, s.kvHeads*s.headDim
	w := map[string]models.Tensor{
		"model.embed_tokens.weight": rnd(1, s.vocab, h),
		"model.norm.weight":         norm(h),
	}
	if !s.tied {
		w["lm_head.weight"] = rnd(1/math.Sqrt(float64(h)), s.vocab, h)
	}
	for l := range s.layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		w[p+"self_attn.q_proj.weight"] = rnd(1/math.Sqrt(float64(h)), q, h)
		w[p+"self_attn.k_proj.weight"] = rnd(1/math.Sqrt(float64(h)), kv, h)
		w[p+"self_attn.v_proj.weight"] = rnd(1/math.Sqrt(float64(h)), kv, h)
		w[p+"self_attn.o_proj.weight"] = rnd(1/math.Sqrt(float64(q)), h, q)
		w[p+"mlp.gate_proj.weight"] = rnd(1/math.Sqrt(float64(h)), s.inter, h)
		w[p+"mlp.up_proj.weight"] = rnd(1/math.Sqrt(float64(h)), s.inter, h)
		w[p+"mlp.down_proj.weight"] = rnd(1/math.Sqrt(float64(s.inter)), h, s.inter)
		w[p+"input_layernorm.weight"] = norm(h)
		w[p+"post_attention_layernorm.weight"] = norm(h)
		if s.arch == archs["qwen2"] {
			w[p+"self_attn.q_proj.bias"] = rnd(0.02, q)
			w[p+"self_attn.k_proj.bias"] = rnd(0.02, kv)
			w[p+"self_attn.v_proj.bias"] = rnd(0.02, kv)
		}
		if s.arch == archs["qwen3"] {
			w[p+"self_attn.q_norm.weight"] = norm(s.headDim)
			w[p+"self_attn.k_norm.weight"] = norm(s.headDim)
		}
	}
	return w
}

func writeShards(dir string, w map[string]models.Tensor, dtype string, shards int) error {
	parts := make([]map[string]models.Tensor, shards)
	index := map[string]string{}
	i := 0
	for name, t := range w {
		k := i % shards
		if parts[k] == nil {
			parts[k] = map[string]models.Tensor{}
		}
		parts[k][name] = t
		index[name] = fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, shards)
		i++
	}
	for k, part := range parts {
		if part == nil {
			continue
		}
		if err := safetensors.Write(filepath.Join(dir, fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, shards)), part, dtype); err != nil {
			return err
		}
	}
	return writeJSON(filepath.Join(dir, "model.safetensors.index.json"), map[string]any{"metadata": map[string]any{}, "weight_map": index})
}

// copyTokenizer copies the tokenizer files and returns the vocabulary size
// (model vocab and added tokens) and the EOS ids tokenizer_config names.
func copyTokenizer(from, to string) (int, []int, error) {
	raw, err := os.ReadFile(filepath.Join(from, "tokenizer.json"))
	if err != nil {
		return 0, nil, err
	}
	if err := os.WriteFile(filepath.Join(to, "tokenizer.json"), raw, 0o644); err != nil {
		return 0, nil, err
	}
	var tj struct {
		Model struct {
			Vocab map[string]int `json:"vocab"`
		} `json:"model"`
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(raw, &tj); err != nil {
		return 0, nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	n := 0
	ids := map[string]int{}
	for tok, id := range tj.Model.Vocab {
		n = max(n, id+1)
		ids[tok] = id
	}
	for _, at := range tj.AddedTokens {
		n = max(n, at.ID+1)
		ids[at.Content] = at.ID
	}
	var eos []int
	if cfg, err := os.ReadFile(filepath.Join(from, "tokenizer_config.json")); err == nil {
		if err := os.WriteFile(filepath.Join(to, "tokenizer_config.json"), cfg, 0o644); err != nil {
			return 0, nil, err
		}
		var tc struct {
			EOSToken any `json:"eos_token"`
		}
		if json.Unmarshal(cfg, &tc) == nil {
			name, _ := tc.EOSToken.(string)
			if m, ok := tc.EOSToken.(map[string]any); ok {
				name, _ = m["content"].(string)
			}
			if id, ok := ids[name]; ok {
				eos = append(eos, id)
			}
		}
	}
	return n, eos, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
