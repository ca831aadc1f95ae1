package llm

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/brokerd/brokerd/runtime/models"
)

// Config is the part of a Hugging Face config.json of LlamaForCausalLM,
// Qwen2ForCausalLM or Qwen3ForCausalLM the engine needs. It is decoded
// once: the repository bounds its sizes before anything uses them, then
// Check and NewModelFromConfig take it.
type Config struct {
	Architectures         []string        `json:"architectures"`
	VocabSize             int             `json:"vocab_size"`
	HiddenSize            int             `json:"hidden_size"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      int             `json:"num_key_value_heads"`
	HeadDim               int             `json:"head_dim"`
	IntermediateSize      int             `json:"intermediate_size"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	RMSNormEps            float64         `json:"rms_norm_eps"`
	RopeTheta             float64         `json:"rope_theta"`
	RopeScaling           *RopeScaling    `json:"rope_scaling"`
	TieWordEmbeddings     bool            `json:"tie_word_embeddings"`
	HiddenAct             string          `json:"hidden_act"`
	AttentionBias         *bool           `json:"attention_bias"`
	UseSlidingWindow      bool            `json:"use_sliding_window"`
	EOSTokenID            json.RawMessage `json:"eos_token_id"` // an id or a list
	// QuantizationConfig marks weights quantized by a method the engine
	// does not run (AWQ, GPTQ, bitsandbytes, fp8): loading them as if
	// they were plain floats would serve garbage.
	QuantizationConfig json.RawMessage `json:"quantization_config"`
}

// RopeScaling is config.json's rope_scaling.
type RopeScaling struct {
	RopeType                      string  `json:"rope_type"`
	Type                          string  `json:"type"` // older spelling
	Factor                        float64 `json:"factor"`
	LowFreqFactor                 float64 `json:"low_freq_factor"`
	HighFreqFactor                float64 `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings float64 `json:"original_max_position_embeddings"`
}

// Bounds of config.json's float hyper-parameters (published models: eps 1e-6
// to 1e-5, rope_theta 1e4 to about 4e9 for the longest contexts, llama3
// factor 8 to 32 over 8192 positions).
const (
	minRMSNormEps    = 1e-12
	maxRMSNormEps    = 0.1
	maxRopeTheta     = 1e12
	maxRopeFactor    = 1024.0
	maxRopePositions = 1 << 22
)

// Architectures the engine runs.
const (
	ArchLlama = "LlamaForCausalLM"
	ArchQwen2 = "Qwen2ForCausalLM"
	ArchQwen3 = "Qwen3ForCausalLM"
)

// DecodeConfig decodes config.json (errors wrap models.ErrInvalidConfig).
func DecodeConfig(raw []byte) (Config, error) {
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return Config{}, fmt.Errorf("%w: config.json: %w", models.ErrInvalidConfig, err)
	}
	return c, nil
}

// Check reports whether c describes a model the engine runs, naming the
// field that does not (errors wrap models.ErrInvalidConfig).
func (c Config) Check() error {
	_, _, _, err := c.spec()
	return err
}

// parseConfig reads config.json into the engine's spec and the EOS ids it
// names. Errors wrap models.ErrInvalidConfig and name the field.
func parseConfig(raw []byte) (netSpec, []int32, string, error) {
	c, err := DecodeConfig(raw)
	if err != nil {
		return netSpec{}, nil, "", err
	}
	return c.spec()
}

// spec is c as the engine's spec, the EOS ids it names and its
// architecture.
func (c Config) spec() (netSpec, []int32, string, error) {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: config.json: %s", models.ErrInvalidConfig, fmt.Sprintf(f, a...))
	}
	if len(c.Architectures) != 1 {
		return netSpec{}, nil, "", bad("architectures %v: want one of %s, %s, %s", c.Architectures, ArchLlama, ArchQwen2, ArchQwen3)
	}
	if q := c.QuantizationConfig; len(q) > 0 && string(q) != "null" {
		var m struct {
			Method string `json:"quant_method"`
			Bits   any    `json:"bits"`
		}
		_ = json.Unmarshal(q, &m)
		if m.Method == "" {
			m.Method = "unnamed"
		}
		return netSpec{}, nil, "", bad("quantization_config names quantization method %q: quantized safetensors (AWQ, GPTQ, bitsandbytes, fp8, …) are not supported; "+
			"use the model's f32, f16 or bf16 safetensors, or a GGUF file of it (Q8_0, Q4_K_M, …)", m.Method)
	}
	arch := c.Architectures[0]
	s := netSpec{
		Vocab: c.VocabSize, Hidden: c.HiddenSize, Layers: c.NumHiddenLayers, Heads: c.NumAttentionHeads,
		KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim, Inter: c.IntermediateSize,
		Context: c.MaxPositionEmbeddings, Eps: float32(c.RMSNormEps), Tied: c.TieWordEmbeddings,
	}
	if s.KVHeads == 0 {
		s.KVHeads = s.Heads
	}
	if s.HeadDim == 0 && s.Heads > 0 {
		if s.Hidden%s.Heads != 0 {
			return netSpec{}, nil, "", bad("hidden_size %d is not a multiple of num_attention_heads %d", s.Hidden, s.Heads)
		}
		s.HeadDim = s.Hidden / s.Heads
	}
	switch arch {
	case ArchLlama:
		s.QKVBias = c.AttentionBias != nil && *c.AttentionBias
	case ArchQwen2:
		s.QKVBias = true // Qwen2's q, k and v projections always have biases
		if c.UseSlidingWindow {
			return netSpec{}, nil, "", bad("use_sliding_window is true: sliding-window attention is not supported")
		}
	case ArchQwen3:
		s.QKNorm = true
		s.QKVBias = c.AttentionBias != nil && *c.AttentionBias
		if c.UseSlidingWindow {
			return netSpec{}, nil, "", bad("use_sliding_window is true: sliding-window attention is not supported")
		}
	default:
		return netSpec{}, nil, "", bad("architectures %q: want %s, %s or %s", arch, ArchLlama, ArchQwen2, ArchQwen3)
	}
	if c.HiddenAct != "" && c.HiddenAct != "silu" {
		return netSpec{}, nil, "", bad("hidden_act %q: only silu is supported", c.HiddenAct)
	}
	// The float hyper-parameters are bounded like the sizes: a finite value
	// far outside what any model uses (rope_theta 1.7e308) loaded and gave
	// NaN logits. The bounds are wide around the published models' values.
	if c.RMSNormEps == 0 {
		s.Eps = 1e-6
	} else if !(c.RMSNormEps >= minRMSNormEps && c.RMSNormEps <= maxRMSNormEps) {
		return netSpec{}, nil, "", bad("rms_norm_eps %g: want %g to %g", c.RMSNormEps, minRMSNormEps, maxRMSNormEps)
	}
	theta := c.RopeTheta
	if theta == 0 {
		theta = 10000
	}
	if !(theta > 1 && theta <= maxRopeTheta) {
		return netSpec{}, nil, "", bad("rope_theta %g: want more than 1, at most %g", theta, maxRopeTheta)
	}
	var scale *ropeScaling
	if r := c.RopeScaling; r != nil {
		typ := r.RopeType
		if typ == "" {
			typ = r.Type
		}
		switch typ {
		case "default", "":
		case "llama3":
			if !(r.Factor >= 1 && r.Factor <= maxRopeFactor) || !(r.LowFreqFactor > 0) || !(r.HighFreqFactor > r.LowFreqFactor && r.HighFreqFactor <= maxRopeFactor) ||
				!(r.OriginalMaxPositionEmbeddings >= 1 && r.OriginalMaxPositionEmbeddings <= maxRopePositions) {
				return netSpec{}, nil, "", bad("rope_scaling %+v: llama3 needs 1 ≤ factor ≤ %g, 0 < low_freq_factor < high_freq_factor ≤ %g, 1 ≤ original_max_position_embeddings ≤ %d",
					*r, maxRopeFactor, maxRopeFactor, maxRopePositions)
			}
			scale = &ropeScaling{Factor: r.Factor, LowFreqFactor: r.LowFreqFactor, HighFreqFactor: r.HighFreqFactor, OriginalMaxPositions: r.OriginalMaxPositionEmbeddings}
		default:
			return netSpec{}, nil, "", bad("rope_scaling type %q: only llama3 is supported", typ)
		}
	}
	if s.HeadDim > 0 && s.HeadDim%2 == 0 {
		s.InvFreq = ropeFreqs(s.HeadDim, theta, scale)
		for i, f := range s.InvFreq {
			if !(f > 0) || math.IsInf(float64(f), 0) {
				return netSpec{}, nil, "", bad("rope_theta %g and rope_scaling give RoPE frequency %d of %g", theta, i, f)
			}
		}
	}
	if err := s.check(); err != nil {
		return netSpec{}, nil, "", bad("%v", err)
	}
	eos, err := tokenIDs(c.EOSTokenID)
	if err != nil {
		return netSpec{}, nil, "", bad("eos_token_id: %v", err)
	}
	return s, eos, arch, nil
}

// tokenIDs reads an id or a list of ids (generation_config.json and
// config.json spell eos_token_id both ways); null or absent is none.
func tokenIDs(raw json.RawMessage) ([]int32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one int32
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int32{one}, nil
	}
	var many []int32
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, err
	}
	return slices.Compact(slices.Sorted(slices.Values(many))), nil
}
