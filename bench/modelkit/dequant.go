package modelkit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/brokerd/brokerd/runtime/gguf"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/quant"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// WriteDequantized writes the weights of the GGUF file at path, which
// WriteGGUF or WriteGGUFQuantized wrote from the checkpoint in from, back
// as a Hugging Face checkpoint in out: model.safetensors in float32,
// decoded by runtime/quant (what brokerd gives a device that cannot hold
// the blocks: ggml's own to_float, bit for bit) under from's tensor names
// and shapes, with from's config.json (torch_dtype float32),
// generation_config.json and tokenizer files. A reference such as
// transformers then runs exactly the weights brokerd runs from the file.
// It returns how many tensors the file stores in each ggml type.
func WriteDequantized(path, from, out string) (map[string]int, error) {
	var cfg struct {
		Architectures []string `json:"architectures"`
		Layers        int      `json:"num_hidden_layers"`
		Heads         int      `json:"num_attention_heads"`
		KVHeads       int      `json:"num_key_value_heads"`
		Tied          bool     `json:"tie_word_embeddings"`
	}
	rawCfg, err := os.ReadFile(filepath.Join(from, "config.json"))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(rawCfg, &cfg); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	if len(cfg.Architectures) != 1 {
		return nil, fmt.Errorf("config.json: architectures %v", cfg.Architectures)
	}
	a, ok := ggufArch[cfg.Architectures[0]]
	if !ok {
		return nil, fmt.Errorf("architecture %s: no GGUF mapping", cfg.Architectures[0])
	}
	st, err := safetensors.Open(filepath.Join(from, "model.safetensors"))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	f, err := gguf.Open(path, gguf.Limits{})
	if err != nil {
		return nil, err
	}
	defer f.Close()

	types := map[string]int{}
	w := map[string]models.Tensor{}
	for _, n := range ggufNames(a.name, cfg.Layers, cfg.Heads, cfg.KVHeads, cfg.Tied) {
		info, ok := st.Info(n.hf)
		if !ok {
			continue
		}
		t, ok := f.Tensor(n.name)
		if !ok {
			return nil, fmt.Errorf("%s: no tensor %s (for %s)", path, n.name, n.hf)
		}
		if t.Elements() != int64(info.NumElements()) {
			return nil, fmt.Errorf("%s: %s has %d elements, the checkpoint's %s %d", path, n.name, t.Elements(), n.hf, info.NumElements())
		}
		data, err := f.TensorData(t)
		if err != nil {
			return nil, err
		}
		x := make([]float32, t.Elements())
		if err := quant.Dequantize(quant.Type(t.Type), data, x); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, n.name, err)
		}
		if n.permute > 0 {
			permuteRope(x, n.permute, len(x)/info.Shape[0], true)
		}
		w[n.hf] = models.Tensor{Shape: slices.Clone(info.Shape), Data: x}
		types[quant.Type(t.Type).String()]++
	}
	if len(w) != len(st.Names()) || len(w) != len(f.Tensors) {
		return nil, fmt.Errorf("%s: mapped %d tensors; the checkpoint has %d, the file %d", path, len(w), len(st.Names()), len(f.Tensors))
	}

	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	var c map[string]any
	if err := json.Unmarshal(rawCfg, &c); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	c["torch_dtype"] = "float32"
	if err := writeJSON(filepath.Join(out, "config.json"), c); err != nil {
		return nil, err
	}
	for _, name := range []string{"generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(from, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
			return nil, err
		}
	}
	if err := safetensors.Write(filepath.Join(out, "model.safetensors"), w, "F32"); err != nil {
		return nil, err
	}
	return types, nil
}
