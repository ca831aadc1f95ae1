package llm

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/brokerd/brokerd/runtime/models"
)

// ropeFreqs returns RoPE's inverse frequencies for head_dim d and
// rope_theta, with Llama 3's rope_scaling when factor > 0.
func ropeFreqs(d int, theta float64, scale *ropeScaling) []float32 {
	out := make([]float32, d/2)
	for i := range out {
		f := 1 / math.Pow(theta, float64(2*i)/float64(d))
		if scale != nil && scale.Factor > 0 {
			f = scale.apply(f)
		}
		out[i] = float32(f)
	}
	return out
}

// ropeScaling is Llama 3's rope_scaling ("rope_type": "llama3").
type ropeScaling struct {
	Factor, LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositions                  float64
}

// apply is transformers' _compute_llama3_parameters for one frequency.
func (r *ropeScaling) apply(f float64) float64 {
	lowWave := r.OriginalMaxPositions / r.LowFreqFactor
	highWave := r.OriginalMaxPositions / r.HighFreqFactor
	wave := 2 * math.Pi / f
	switch {
	case wave < highWave:
		return f
	case wave > lowWave:
		return f / r.Factor
	}
	smooth := (r.OriginalMaxPositions/wave - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
	return (1-smooth)*f/r.Factor + smooth*f
}

// engineWeights maps a checkpoint's tensors (Hugging Face names, with or
// without the "model." prefix; gate_proj and up_proj separate or already
// fused as gate_up_proj) onto the engine's resident names, checking every
// shape. Unused tensors (rotary_emb.inv_freq buffers) are ignored.
func engineWeights(s netSpec, hf map[string]models.Tensor) (map[string]models.Tensor, error) {
	get := func(name string, shape ...int) (models.Tensor, error) {
		t, ok := hf[name]
		if !ok {
			t, ok = hf[strings.TrimPrefix(name, "model.")]
		}
		if !ok {
			return models.Tensor{}, fmt.Errorf("%w: weight %q is missing", models.ErrInvalidWeights, name)
		}
		n := 1
		for _, d := range shape {
			n *= d
		}
		if len(t.Shape) != len(shape) || !slices.Equal(t.Shape, shape) {
			return models.Tensor{}, fmt.Errorf("%w: weight %q is %v, want %v", models.ErrInvalidWeights, name, t.Shape, shape)
		}
		if t.Quantized() {
			// The kernels read whole blocks along a row: a file whose
			// rows end inside one (its tensor's bytes may still be whole
			// blocks) is refused here, not at the first step.
			if b := t.Stored.BlockElems(); b > 1 && shape[len(shape)-1]%b != 0 {
				return models.Tensor{}, fmt.Errorf("%w: weight %q is %s with rows of %d values: its blocks hold %d, so rows must be whole blocks", models.ErrInvalidWeights, name, t.Stored, shape[len(shape)-1], b)
			}
			if t.RawBytes() != t.Stored.Bytes(int64(n)) {
				return models.Tensor{}, fmt.Errorf("%w: weight %q holds %d bytes of %s, want %d for %v", models.ErrInvalidWeights, name, t.RawBytes(), t.Stored, t.Stored.Bytes(int64(n)), shape)
			}
		} else if len(t.Data) != n {
			return models.Tensor{}, fmt.Errorf("%w: weight %q has %d values, want %v", models.ErrInvalidWeights, name, len(t.Data), shape)
		}
		return t, nil
	}
	// Only matmul weights and the embedding table stay block-quantized
	// (runtime.Plan allows them nowhere else); a file that quantizes a
	// norm's gain or a bias gets it dequantized.
	float := func(t models.Tensor) (models.Tensor, error) {
		if !t.Quantized() {
			return t, nil
		}
		x, err := t.Float32()
		return models.Tensor{Shape: t.Shape, Data: x}, err
	}
	h, d, inter := s.Hidden, s.HeadDim, s.Inter
	qd, kd := s.Heads*d, s.KVHeads*d
	out := map[string]models.Tensor{wInvFreq: {Shape: []int{d / 2}, Data: s.InvFreq}}
	type want struct {
		hf, name string
		shape    []int
	}
	wants := []want{{"model.embed_tokens.weight", wEmbed, []int{s.Vocab, h}}, {"model.norm.weight", wNorm, []int{h}}}
	if s.Tied {
		out[wLMHead] = hf["model.embed_tokens.weight"] // checked below with the table
		if t, ok := hf["embed_tokens.weight"]; ok {
			out[wLMHead] = t
		}
	} else {
		wants = append(wants, want{"lm_head.weight", wLMHead, []int{s.Vocab, h}})
	}
	for l := range s.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		wants = append(wants,
			want{p + "input_layernorm.weight", lw(l, lLN1), []int{h}},
			want{p + "self_attn.q_proj.weight", lw(l, lWQ), []int{qd, h}},
			want{p + "self_attn.k_proj.weight", lw(l, lWK), []int{kd, h}},
			want{p + "self_attn.v_proj.weight", lw(l, lWV), []int{kd, h}},
			want{p + "self_attn.o_proj.weight", lw(l, lWO), []int{h, qd}},
			want{p + "post_attention_layernorm.weight", lw(l, lLN2), []int{h}},
			want{p + "mlp.down_proj.weight", lw(l, lDown), []int{h, inter}},
		)
		if s.QKVBias {
			wants = append(wants,
				want{p + "self_attn.q_proj.bias", lw(l, lBQ), []int{qd}},
				want{p + "self_attn.k_proj.bias", lw(l, lBK), []int{kd}},
				want{p + "self_attn.v_proj.bias", lw(l, lBV), []int{kd}})
		}
		if s.QKNorm {
			wants = append(wants,
				want{p + "self_attn.q_norm.weight", lw(l, lQNorm), []int{d}},
				want{p + "self_attn.k_norm.weight", lw(l, lKNorm), []int{d}})
		}
		if gu, err := get(p+"mlp.gate_up_proj.weight", 2*inter, h); err == nil {
			out[lw(l, lGateUp)] = gu
		} else {
			g, err := get(p+"mlp.gate_proj.weight", inter, h)
			if err != nil {
				return nil, err
			}
			u, err := get(p+"mlp.up_proj.weight", inter, h)
			if err != nil {
				return nil, err
			}
			// One product for both halves; OpSwiGLU reads [gate|up].
			out[lw(l, lGateUp)], err = fuseRows(g, u)
			if err != nil {
				return nil, fmt.Errorf("layer %d gate and up: %w", l, err)
			}
		}
	}
	for _, w := range wants {
		t, err := get(w.hf, w.shape...)
		if err != nil {
			return nil, err
		}
		if !matmulWeight(w.name) {
			if t, err = float(t); err != nil {
				return nil, fmt.Errorf("weight %q: %w", w.hf, err)
			}
		}
		out[w.name] = t
	}
	return out, nil
}

// fuseRows stacks a's rows over b's: their pieces when both are stored in
// one block type, else their float values.
func fuseRows(a, b models.Tensor) (models.Tensor, error) {
	shape := []int{a.Shape[0] + b.Shape[0], a.Shape[1]}
	if a.Quantized() && a.Stored == b.Stored {
		return models.Tensor{Shape: shape, Stored: a.Stored, Raw: append(slices.Clip(a.Raw), b.Raw...)}, nil
	}
	x, err := a.Float32()
	if err != nil {
		return models.Tensor{}, err
	}
	y, err := b.Float32()
	if err != nil {
		return models.Tensor{}, err
	}
	return models.Tensor{Shape: shape, Data: append(append(make([]float32, 0, len(x)+len(y)), x...), y...)}, nil
}
