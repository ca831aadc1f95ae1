// Package modelkit writes small random-weight models into a brokerd model
// repository, in the layouts brokerd reads: Hugging Face BERT encoders and
// classifiers, decoder LLMs (Llama, Qwen2, Qwen3) and brokerd's own MLP
// format. The weights are random but scaled like trained ones, so every
// forward pass stays finite: they are for first runs, tests and benchmarks,
// where the shapes and the plumbing matter, not the answers. bench/mkmodels,
// bench/mkbert and bench/mkllm are its commands.
package modelkit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/zstd"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// LLM is a decoder checkpoint's architecture and sizes.
type LLM struct {
	// Arch is llama, qwen2 or qwen3.
	Arch                                    string
	Layers, Hidden, Heads, KVHeads, HeadDim int // HeadDim 0: Hidden/Heads
	Intermediate                            int
	Vocab                                   int // 0: the tokenizer's, else 32000
	MaxPositions                            int // 0: 4096
	Tied                                    bool
	// DType is the stored dtype: f32, f16 or bf16 (default bf16).
	DType string
	// Shards above 1 split the weights with model.safetensors.index.json.
	Shards int
	Seed   uint64
	// TokenizerDir holds tokenizer.json and tokenizer_config.json (either
	// may be .zst-compressed) to copy beside the weights; the checkpoint
	// takes its vocabulary size and EOS id from them.
	TokenizerDir string
	ropeTheta    float64
	eos          []int
}

// Archs maps the names WriteLLM takes to Hugging Face architectures.
var Archs = map[string]string{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

// WriteLLM writes s as a Hugging Face directory dir: config.json,
// model.safetensors (or shards and their index), generation_config.json and
// the tokenizer files. It returns the number of parameters.
func WriteLLM(dir string, s LLM) (int, error) {
	arch := Archs[s.Arch]
	switch {
	case arch == "":
		return 0, fmt.Errorf("arch %q: want llama, qwen2 or qwen3", s.Arch)
	case s.Layers <= 0 || s.Hidden <= 0 || s.Intermediate <= 0:
		return 0, errors.New("layers, hidden and intermediate must be positive")
	case s.Heads <= 0 || s.KVHeads <= 0 || s.Heads%s.KVHeads != 0:
		return 0, fmt.Errorf("heads %d must be a positive multiple of kv heads %d", s.Heads, s.KVHeads)
	}
	s.Arch = arch
	s.Shards = max(s.Shards, 1)
	var stDType string
	switch s.DType {
	case "f32":
		stDType = "F32"
	case "f16":
		stDType = "F16"
	case "bf16", "":
		stDType = "BF16"
	default:
		return 0, fmt.Errorf("dtype %q: want f32, f16 or bf16", s.DType)
	}
	if s.HeadDim == 0 {
		s.HeadDim = s.Hidden / s.Heads
	}
	if s.MaxPositions == 0 {
		s.MaxPositions = 4096
	}
	s.ropeTheta, s.eos = 1e6, []int{2}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	if s.TokenizerDir != "" {
		n, eos, err := copyTokenizer(s.TokenizerDir, dir)
		if err != nil {
			return 0, err
		}
		if s.Vocab == 0 {
			s.Vocab = n
		}
		if len(eos) > 0 {
			s.eos = eos
		}
	}
	if s.Vocab == 0 {
		s.Vocab = 32000
	}
	if err := writeJSON(filepath.Join(dir, "config.json"), config(s)); err != nil {
		return 0, err
	}
	if err := writeJSON(filepath.Join(dir, "generation_config.json"), map[string]any{"eos_token_id": s.eos, "do_sample": false}); err != nil {
		return 0, err
	}
	w := weights(s, rand.New(rand.NewPCG(s.Seed, 17)))
	if s.Shards == 1 {
		if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), w, stDType); err != nil {
			return 0, err
		}
	} else if err := writeShards(dir, w, stDType, s.Shards); err != nil {
		return 0, err
	}
	var params int
	for _, t := range w {
		params += len(t.Data)
	}
	return params, nil
}

func config(s LLM) map[string]any {
	c := map[string]any{
		"architectures": []string{s.Arch}, "vocab_size": s.Vocab, "hidden_size": s.Hidden,
		"num_hidden_layers": s.Layers, "num_attention_heads": s.Heads, "num_key_value_heads": s.KVHeads,
		"intermediate_size": s.Intermediate, "max_position_embeddings": s.MaxPositions, "rms_norm_eps": 1e-6,
		"rope_theta": s.ropeTheta, "hidden_act": "silu", "tie_word_embeddings": s.Tied, "eos_token_id": s.eos,
		"torch_dtype": "bfloat16",
	}
	if s.Arch == Archs["qwen3"] || s.HeadDim != s.Hidden/s.Heads {
		c["head_dim"] = s.HeadDim
	}
	return c
}

// weights are the Hugging Face tensors, normal with a 1/sqrt(fan-in) scale
// (norm weights near 1), so a forward pass stays finite at any depth.
func weights(s LLM, rng *rand.Rand) map[string]models.Tensor {
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
	h, q, kv := s.Hidden, s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	w := map[string]models.Tensor{
		"model.embed_tokens.weight": rnd(1, s.Vocab, h),
		"model.norm.weight":         norm(h),
	}
	if !s.Tied {
		w["lm_head.weight"] = rnd(1/math.Sqrt(float64(h)), s.Vocab, h)
	}
	for l := range s.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		w[p+"self_attn.q_proj.weight"] = rnd(1/math.Sqrt(float64(h)), q, h)
		w[p+"self_attn.k_proj.weight"] = rnd(1/math.Sqrt(float64(h)), kv, h)
		w[p+"self_attn.v_proj.weight"] = rnd(1/math.Sqrt(float64(h)), kv, h)
		w[p+"self_attn.o_proj.weight"] = rnd(1/math.Sqrt(float64(q)), h, q)
		w[p+"mlp.gate_proj.weight"] = rnd(1/math.Sqrt(float64(h)), s.Intermediate, h)
		w[p+"mlp.up_proj.weight"] = rnd(1/math.Sqrt(float64(h)), s.Intermediate, h)
		w[p+"mlp.down_proj.weight"] = rnd(1/math.Sqrt(float64(s.Intermediate)), h, s.Intermediate)
		w[p+"input_layernorm.weight"] = norm(h)
		w[p+"post_attention_layernorm.weight"] = norm(h)
		if s.Arch == Archs["qwen2"] {
			w[p+"self_attn.q_proj.bias"] = rnd(0.02, q)
			w[p+"self_attn.k_proj.bias"] = rnd(0.02, kv)
			w[p+"self_attn.v_proj.bias"] = rnd(0.02, kv)
		}
		if s.Arch == Archs["qwen3"] {
			w[p+"self_attn.q_norm.weight"] = norm(s.HeadDim)
			w[p+"self_attn.k_norm.weight"] = norm(s.HeadDim)
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
	raw, err := readMaybeZst(filepath.Join(from, "tokenizer.json"))
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
	if cfg, err := readMaybeZst(filepath.Join(from, "tokenizer_config.json")); err == nil {
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

// readMaybeZst reads path, or path.zst decompressed when only that exists
// (the repository keeps its tokenizer test files compressed).
func readMaybeZst(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return b, err
	}
	z, zerr := os.ReadFile(path + ".zst")
	if zerr != nil {
		return nil, err
	}
	d, zerr := zstd.NewReader(bytes.NewReader(z))
	if zerr != nil {
		return nil, zerr
	}
	defer d.Close()
	return io.ReadAll(d)
}
