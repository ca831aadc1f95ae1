// Package llmtest makes small random decoder checkpoints for the tests of
// the packages above runtime/models/llm (lifecycle, daemon).
package llmtest

import (
	"fmt"
	"math/rand/v2"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
)

// TinyLlama is a random two-layer Llama (hidden 32, 4 heads, 2 KV heads,
// 256 positions, tied embeddings) with vocabulary vocab and EOS id eos:
// its config.json and its weights under Hugging Face's names. The same
// arguments give the same weights.
func TinyLlama(vocab, eos int) (config map[string]any, weights map[string]models.Tensor) {
	const h, layers, heads, kv, inter = 32, 2, 4, 2, 64
	d := h / heads
	rng := rand.New(rand.NewPCG(7, 7))
	rnd := func(shape ...int) models.Tensor {
		n := 1
		for _, s := range shape {
			n *= s
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(rng.NormFloat64() * 0.2)
		}
		return models.Tensor{Shape: shape, Data: data}
	}
	w := map[string]models.Tensor{"model.embed_tokens.weight": rnd(vocab, h), "model.norm.weight": rnd(h)}
	for l := range layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		w[p+"self_attn.q_proj.weight"], w[p+"self_attn.k_proj.weight"] = rnd(heads*d, h), rnd(kv*d, h)
		w[p+"self_attn.v_proj.weight"], w[p+"self_attn.o_proj.weight"] = rnd(kv*d, h), rnd(h, heads*d)
		w[p+"mlp.gate_proj.weight"], w[p+"mlp.up_proj.weight"], w[p+"mlp.down_proj.weight"] = rnd(inter, h), rnd(inter, h), rnd(h, inter)
		w[p+"input_layernorm.weight"], w[p+"post_attention_layernorm.weight"] = rnd(h), rnd(h)
	}
	return map[string]any{
		"architectures": []string{llm.ArchLlama}, "vocab_size": vocab, "hidden_size": h, "num_hidden_layers": layers,
		"num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": inter,
		"max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": true, "eos_token_id": eos,
	}, w
}
