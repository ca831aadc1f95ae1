package llm

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
)

// configJSON is a config.json for arch with tinyNet(arch)'s shape.
func configJSON(t *testing.T, arch string, edit func(map[string]any)) []byte {
	t.Helper()
	s := tinyNet(arch)
	c := map[string]any{
		"vocab_size": s.Vocab, "hidden_size": s.Hidden, "num_hidden_layers": s.Layers,
		"num_attention_heads": s.Heads, "num_key_value_heads": s.KVHeads, "intermediate_size": s.Inter,
		"max_position_embeddings": s.Context, "rms_norm_eps": 1e-6, "tie_word_embeddings": s.Tied,
		"hidden_act": "silu", "eos_token_id": 2,
	}
	switch arch {
	case "llama":
		c["architectures"] = []string{ArchLlama}
		c["rope_theta"] = 500000.0
		c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
		c["eos_token_id"] = []int{2, 3}
	case "qwen2":
		c["architectures"] = []string{ArchQwen2}
		c["rope_theta"] = 10000.0
		c["use_sliding_window"] = false
	case "qwen3":
		c["architectures"] = []string{ArchQwen3}
		c["rope_theta"] = 1000000.0
		c["head_dim"] = s.HeadDim
	}
	if edit != nil {
		edit(c)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseConfig(t *testing.T) {
	for _, arch := range []string{"llama", "qwen2", "qwen3"} {
		got, eos, _, err := parseConfig(configJSON(t, arch, nil))
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		want := tinyNet(arch)
		if got.Vocab != want.Vocab || got.HeadDim != want.HeadDim || got.QKVBias != want.QKVBias || got.QKNorm != want.QKNorm ||
			got.Tied != want.Tied || got.KVHeads != want.KVHeads || !slices.Equal(got.InvFreq, want.InvFreq) {
			t.Errorf("%s: spec %+v, want %+v", arch, got, want)
		}
		if arch == "llama" && !slices.Equal(eos, []int32{2, 3}) || arch != "llama" && !slices.Equal(eos, []int32{2}) {
			t.Errorf("%s: eos %v", arch, eos)
		}
	}
	for _, tc := range []struct {
		name, arch, field string
		edit              func(map[string]any)
	}{
		{"unknown architecture", "llama", "architectures", func(c map[string]any) { c["architectures"] = []string{"GPT2LMHeadModel"} }},
		{"sliding window", "qwen2", "use_sliding_window", func(c map[string]any) { c["use_sliding_window"] = true }},
		{"activation", "llama", "hidden_act", func(c map[string]any) { c["hidden_act"] = "gelu" }},
		{"rope type", "llama", "rope_scaling", func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 4.0} }},
		{"gqa", "llama", "num_key_value_heads", func(c map[string]any) { c["num_key_value_heads"] = 3 }},
		{"no layers", "qwen3", "num_hidden_layers", func(c map[string]any) { c["num_hidden_layers"] = 0 }},
		{"eos", "qwen3", "eos_token_id", func(c map[string]any) { c["eos_token_id"] = "x" }},
		// Finite floats far out of range: rope_theta 1.7e308 loaded and
		// gave NaN logits.
		{"rope_theta 1.7e308", "llama", "rope_theta", func(c map[string]any) { c["rope_theta"] = 1.7e308 }},
		{"rope_theta 1e13", "qwen3", "rope_theta", func(c map[string]any) { c["rope_theta"] = 1e13 }},
		{"rope_theta negative", "llama", "rope_theta", func(c map[string]any) { c["rope_theta"] = -10000.0 }},
		{"rms_norm_eps negative", "llama", "rms_norm_eps", func(c map[string]any) { c["rms_norm_eps"] = -1e-6 }},
		{"rms_norm_eps 1e300", "qwen2", "rms_norm_eps", func(c map[string]any) { c["rms_norm_eps"] = 1e300 }},
		{"rms_norm_eps 1e-300", "qwen3", "rms_norm_eps", func(c map[string]any) { c["rms_norm_eps"] = 1e-300 }},
		{"rope factor 1e308", "llama", "rope_scaling", func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 1e308, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
		}},
		{"rope high_freq_factor 1e308", "llama", "rope_scaling", func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 1e308, "original_max_position_embeddings": 8192}
		}},
		{"rope original positions 1e308", "llama", "rope_scaling", func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1e308}
		}},
		// Quantized safetensors load as if their packed ints were floats
		// unless refused: each method named.
		{"awq", "llama", `quantization method "awq"`, func(c map[string]any) {
			c["quantization_config"] = map[string]any{"quant_method": "awq", "bits": 4, "group_size": 128}
		}},
		{"gptq", "qwen2", `quantization method "gptq"`, func(c map[string]any) {
			c["quantization_config"] = map[string]any{"quant_method": "gptq", "bits": 4}
		}},
		{"bitsandbytes", "qwen3", `quantization method "bitsandbytes"`, func(c map[string]any) {
			c["quantization_config"] = map[string]any{"quant_method": "bitsandbytes", "load_in_4bit": true}
		}},
		{"fp8", "llama", `quantization method "fp8"`, func(c map[string]any) {
			c["quantization_config"] = map[string]any{"quant_method": "fp8", "activation_scheme": "dynamic"}
		}},
		{"unnamed", "llama", "quantization_config", func(c map[string]any) { c["quantization_config"] = map[string]any{"bits": 8} }},
	} {
		_, _, _, err := parseConfig(configJSON(t, tc.arch, tc.edit))
		if !errors.Is(err, models.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want ErrInvalidConfig naming %s", tc.name, err, tc.field)
		}
	}
	// The bounds are wide around what models publish.
	for _, edit := range []func(map[string]any){
		func(c map[string]any) { c["rope_theta"] = 3580165449.0 }, // a 1M-context Llama 3 fine-tune
		func(c map[string]any) { c["rms_norm_eps"] = 1e-12 },
		func(c map[string]any) {
			c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
		},
	} {
		if _, _, _, err := parseConfig(configJSON(t, "llama", edit)); err != nil {
			t.Errorf("a published value refused: %v", err)
		}
	}
}

// TestLlama3RopeScaling checks the three regimes of Llama 3's frequency
// scaling (transformers' _compute_llama3_parameters) for Llama 3.2's values:
// head_dim 64, rope_theta 500000, factor 32, low 1, high 4, original 8192.
func TestLlama3RopeScaling(t *testing.T) {
	f := ropeFreqs(64, 500000, &ropeScaling{Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192})
	// Wavelengths below 8192/4 keep their frequency, those above 8192 are
	// divided by 32, and those between are interpolated smoothly.
	for i, v := range f {
		base := 1 / math.Pow(500000, float64(2*i)/64)
		wave := 2 * math.Pi / base
		ratio := base / float64(v)
		switch {
		case wave < 2048:
			if math.Abs(ratio-1) > 1e-6 {
				t.Errorf("freq %d (wave %.0f) scaled by %g, want 1", i, wave, ratio)
			}
		case wave > 8192:
			if math.Abs(ratio-32) > 1e-4 {
				t.Errorf("freq %d (wave %.0f) scaled by %g, want 32", i, wave, ratio)
			}
		default:
			if ratio <= 1 || ratio >= 32 {
				t.Errorf("freq %d (wave %.0f) scaled by %g, want between", i, wave, ratio)
			}
		}
	}
	// Frequencies never increase along the head dimension.
	for i := 1; i < len(f); i++ {
		if f[i] > f[i-1] {
			t.Fatalf("freq %d %g > freq %d %g", i, f[i], i-1, f[i-1])
		}
	}
}

func TestModel(t *testing.T) {
	ctx := context.Background()
	s := tinyNet("qwen3")
	gen := []byte(`{"eos_token_id": [5, 2], "do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_new_tokens": 77}`)
	m, err := NewModel(configJSON(t, "qwen3", nil), randomCheckpoint(s, 3), ModelOptions{Name: "q", GenerationConfig: gen})
	if err != nil {
		t.Fatal(err)
	}
	if d := m.DefaultSampling(); d.Temperature != 0.7 || d.TopP != 0.8 || d.TopK != 20 {
		t.Errorf("defaults %+v", d)
	}
	if m.DefaultMaxTokens() != 77 || !slices.Equal(m.EOS(), []int32{2, 5}) || m.ContextLength() != s.Context {
		t.Errorf("max tokens %d, eos %v, context %d", m.DefaultMaxTokens(), m.EOS(), m.ContextLength())
	}
	if info := m.Info(); info.Kind != KindLLM || info.Name != "q" || info.MaxSeqLen != s.Context {
		t.Errorf("info %+v", info)
	}
	for _, p := range [][]int32{nil, make([]int32, s.Context), {int32(s.Vocab)}} {
		if _, err := m.NewSequence(Sampling{}, p); !errors.Is(err, models.ErrInvalidInput) {
			t.Errorf("prompt of %d tokens: %v", len(p), err)
		}
	}
	if _, err := m.NewSequence(Sampling{StopTokenIDs: []int32{-1}}, []int32{1}); !errors.Is(err, models.ErrInvalidInput) {
		t.Errorf("stop id -1: %v", err)
	}
	if _, err := m.Encode("x", true); !errors.Is(err, models.ErrInvalidInput) {
		t.Errorf("Encode without a tokenizer: %v", err)
	}
	// Fused gate_up weights load the same model.
	w := randomCheckpoint(s, 3)
	for l := range s.Layers {
		p := "model.layers." + string(rune('0'+l)) + ".mlp."
		g, u := w[p+"gate_proj.weight"], w[p+"up_proj.weight"]
		w[p+"gate_up_proj.weight"] = models.Tensor{Shape: []int{2 * s.Inter, s.Hidden}, Data: append(slices.Clone(g.Data), u.Data...)}
		delete(w, p+"gate_proj.weight")
		delete(w, p+"up_proj.weight")
	}
	fused, err := NewModel(configJSON(t, "qwen3", nil), w, ModelOptions{Name: "q"})
	if err != nil {
		t.Fatal(err)
	}
	want := refForward(s, randomCheckpoint(s, 3), prompt(6, 1, s.Vocab))
	for _, mm := range []*Model{m, fused} {
		e, err := mm.NewEngine(ctx, &goDevice{}, EngineOptions{CacheBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if !e.Reserve(1, 6) {
			t.Fatal("reserve")
		}
		seq, _ := mm.NewSequence(Sampling{}, prompt(6, 1, s.Vocab))
		res, err := e.Step(ctx, []SeqStep{{Seq: 1, State: seq, Tokens: prompt(6, 1, s.Vocab), Sample: true}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Token != argmax(want[5]) {
			t.Errorf("token %d, reference %d", res[0].Token, argmax(want[5]))
		}
		e.Close()
	}
	// MaxContext caps the context: prompts, engines and Full follow it.
	capped, err := NewModel(configJSON(t, "qwen3", nil), randomCheckpoint(s, 3), ModelOptions{MaxContext: 20})
	if err != nil {
		t.Fatal(err)
	}
	if capped.ContextLength() != 20 {
		t.Fatalf("context %d, want 20", capped.ContextLength())
	}
	if _, err := capped.NewSequence(Sampling{}, prompt(20, 1, s.Vocab)); !errors.Is(err, models.ErrInvalidInput) {
		t.Errorf("a 20-token prompt in a context of 20: %v", err)
	}
	ce, err := capped.NewEngine(ctx, &goDevice{}, EngineOptions{CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer ce.Close()
	if ce.Reserve(1, 21) || !ce.Reserve(1, 19) {
		t.Error("reservations past the capped context")
	}
	cs, _ := capped.NewSequence(Sampling{}, prompt(19, 1, s.Vocab))
	res, err := ce.Step(ctx, []SeqStep{{Seq: 1, State: cs, Tokens: prompt(19, 1, s.Vocab), Sample: true}})
	if err != nil || !res[0].Full {
		t.Errorf("token at the capped context's last position: %+v, %v", res, err)
	}
	// A missing weight is named.
	delete(w, "model.layers.1.self_attn.k_norm.weight")
	if _, err := NewModel(configJSON(t, "qwen3", nil), w, ModelOptions{}); !errors.Is(err, models.ErrInvalidWeights) || !strings.Contains(err.Error(), "k_norm") {
		t.Errorf("missing k_norm: %v", err)
	}
}

// TestPublishedConfigs parses config.json files of the families served,
// with the fields as the Hub publishes them (extra fields included), and
// checks what the engine derives from them.
func TestPublishedConfigs(t *testing.T) {
	for _, tc := range []struct {
		name, json         string
		headDim, kv        int
		bias, qkNorm, tied bool
		eos                []int32
		scaled             bool // Llama 3 rope scaling
		context            int
	}{
		{"Qwen2.5-0.5B-Instruct", `{"architectures":["Qwen2ForCausalLM"],"attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151645,"hidden_act":"silu","hidden_size":896,"initializer_range":0.02,"intermediate_size":4864,"max_position_embeddings":32768,"max_window_layers":21,"model_type":"qwen2","num_attention_heads":14,"num_hidden_layers":24,"num_key_value_heads":2,"rms_norm_eps":1e-06,"rope_theta":1000000.0,"sliding_window":32768,"tie_word_embeddings":true,"torch_dtype":"bfloat16","transformers_version":"4.43.1","use_cache":true,"use_sliding_window":false,"vocab_size":151936}`,
			64, 2, true, false, true, []int32{151645}, false, 32768},
		{"Llama-3.2-1B-Instruct", `{"architectures":["LlamaForCausalLM"],"attention_bias":false,"attention_dropout":0.0,"bos_token_id":128000,"eos_token_id":[128001,128008,128009],"head_dim":64,"hidden_act":"silu","hidden_size":2048,"initializer_range":0.02,"intermediate_size":8192,"max_position_embeddings":131072,"mlp_bias":false,"model_type":"llama","num_attention_heads":32,"num_hidden_layers":16,"num_key_value_heads":8,"pretraining_tp":1,"rms_norm_eps":1e-05,"rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,"tie_word_embeddings":true,"torch_dtype":"bfloat16","use_cache":true,"vocab_size":128256}`,
			64, 8, false, false, true, []int32{128001, 128008, 128009}, true, 131072},
		{"Qwen3-0.6B", `{"architectures":["Qwen3ForCausalLM"],"attention_bias":false,"attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151645,"head_dim":128,"hidden_act":"silu","hidden_size":1024,"initializer_range":0.02,"intermediate_size":3072,"max_position_embeddings":40960,"max_window_layers":28,"model_type":"qwen3","num_attention_heads":16,"num_hidden_layers":28,"num_key_value_heads":8,"rms_norm_eps":1e-06,"rope_scaling":null,"rope_theta":1000000,"sliding_window":null,"tie_word_embeddings":true,"torch_dtype":"bfloat16","transformers_version":"4.51.0","use_cache":true,"use_sliding_window":false,"vocab_size":151936}`,
			128, 8, false, true, true, []int32{151645}, false, 40960},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, eos, _, err := parseConfig([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			if s.HeadDim != tc.headDim || s.KVHeads != tc.kv || s.QKVBias != tc.bias || s.QKNorm != tc.qkNorm || s.Tied != tc.tied ||
				!slices.Equal(eos, tc.eos) || s.Context != tc.context || len(s.InvFreq) != tc.headDim/2 {
				t.Fatalf("spec %+v, eos %v", s, eos)
			}
			// Scaling divides the lowest frequency by the factor.
			plain := ropeFreqs(s.HeadDim, map[bool]float64{true: 500000, false: 1000000}[tc.scaled], nil)
			last := len(plain) - 1
			if scaled := math.Abs(float64(plain[last]/s.InvFreq[last])-32) < 1e-3; scaled != tc.scaled {
				t.Errorf("lowest frequency %g, unscaled %g", s.InvFreq[last], plain[last])
			}
		})
	}
}

// TestRopeFreqFactors: a GGUF file's rope_freqs.weight divides the RoPE
// frequencies config.json implies; a wrong count or a factor that is not a
// finite positive number is refused.
func TestRopeFreqFactors(t *testing.T) {
	s := tinyNet("llama")
	base, err := NewModel(configJSON(t, "llama", nil), randomCheckpoint(s, 3), ModelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := make([]float32, len(s.InvFreq))
	for i := range f {
		f[i] = float32(1 + i%3)
	}
	scaled, err := NewModel(configJSON(t, "llama", nil), randomCheckpoint(s, 3), ModelOptions{RopeFreqFactors: f})
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range scaled.spec.InvFreq {
		if want := base.spec.InvFreq[i] / f[i]; x != want {
			t.Fatalf("frequency %d is %g, want %g", i, x, want)
		}
	}
	for _, bad := range [][]float32{f[1:], append(slices.Clone(f[1:]), 0), append(slices.Clone(f[1:]), float32(math.Inf(1))), append(slices.Clone(f[1:]), float32(math.NaN()))} {
		if _, err := NewModel(configJSON(t, "llama", nil), randomCheckpoint(s, 3), ModelOptions{RopeFreqFactors: bad}); !errors.Is(err, models.ErrInvalidConfig) {
			t.Errorf("factors %v: %v, want ErrInvalidConfig", bad, err)
		}
	}
}
