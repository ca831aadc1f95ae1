package llm

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
)

// KindLLM is the model kind of decoder LLMs in the repository.
const KindLLM models.Kind = "llm"

// Message is one turn of a conversation: system, user, assistant or tool;
// an assistant turn may carry its thinking (Reasoning) and its calls of
// tools (ToolCalls); a tool turn carries a call's result in Content and
// the call's id in ToolCallID. It is the template's own type (the
// tokenizer package is the lower one: it imports nothing of the engine),
// so a conversation goes from the edge to the template without a copy.
type Message = bpe.Message

// ToolCall is an assistant turn's call of a function: its arguments are a
// JSON object's text (a template sees them as a mapping).
type ToolCall = bpe.ToolCall

// ChatOptions are a render's inputs besides the messages.
type ChatOptions struct {
	// AddGenerationPrompt ends the text where the assistant's reply begins.
	AddGenerationPrompt bool
	// Vars are more template variables (enable_thinking, a request's
	// chat_template_kwargs); the caller keeps them off the template's own
	// inputs (messages, add_generation_prompt, bos_token, eos_token, tools).
	Vars map[string]any
	// Tools are the functions the model may call, each a JSON object as
	// OpenAI's API has it ({"type": "function", "function": {"name",
	// "description", "parameters"}}), the template's tools (nil: none).
	Tools []json.RawMessage
}

// Tokenizer is what a model needs of its tokenizer: prompts to ids (with
// the special tokens its post-processor adds when addSpecial), and a
// streaming detokeniser per sequence.
type Tokenizer interface {
	// Encode may stop once it has more than maxTokens ids (0: no bound),
	// saying so with truncated: a prompt that long is refused anyway.
	Encode(text string, addSpecial bool, maxTokens int) (ids []int32, truncated bool, err error)
	NewDetokenizer() Detokenizer
	// TokenBytes is what a token decodes to by itself (special tokens
	// included; nil for an id outside the vocabulary): logprobs' text.
	TokenBytes(id int32) []byte
}

// EndTokenizer is a Tokenizer that names ids ending generation
// (tokenizer_config.json's eos_token): a model stops at them besides its
// config's, as vLLM stops at its tokenizer's eos_token_id.
type EndTokenizer interface {
	EOSIDs() []int32
}

// ChatTemplate renders a conversation as the model's prompt text. A
// template is code from a model file: Render runs it under bounds and
// stops when ctx ends.
type ChatTemplate interface {
	Render(ctx context.Context, messages []Message, opts ChatOptions) (string, error)
}

// ModelOptions name a model and its host-side parts.
type ModelOptions struct {
	Name    string
	Version int64
	// Tokenizer and Chat may be nil: then the model takes token ids only
	// (Encode and RenderChat fail) and sequences carry no text.
	Tokenizer Tokenizer
	Chat      ChatTemplate
	// GenerationConfig is generation_config.json (nil: none): its EOS ids
	// join config.json's, and its sampling values become the defaults.
	GenerationConfig []byte
	// BaseBatch is the model's base running set (the batch plan scales it
	// per device type); models.DefaultBaseBatch when 0.
	BaseBatch int
	// DefaultStop are the stop strings of a request that sets none, and
	// SystemPrompt the system message a conversation without one starts
	// with: an Ollama model's params and system layers.
	DefaultStop  []string
	SystemPrompt string
	// RopeFreqFactors divide the RoPE frequencies, one per rotated pair
	// (nil: none): Llama 3's rope scaling as a GGUF file stores it
	// (rope_freqs.weight, computed by llama.cpp's converter), instead of
	// config.json's rope_scaling.
	RopeFreqFactors []float32
	// DropPages, when set, is called after each engine has copied the
	// weights in: block-quantized weights may lie in a file's mapping,
	// whose pages it drops from the process's resident set (the device
	// holds its own copy; a later engine faults them back in).
	DropPages func()
	// MaxContext caps the context length below max_position_embeddings
	// (0: no cap): Llama 3.2's 131072 positions would make placement admit
	// a KV cache of gigabytes for one full-length sequence.
	MaxContext int
	// GrammarCacheBytes bounds the compiled grammars of constrained
	// sequences kept for reuse (DefaultGrammarCacheBytes when 0), and
	// GrammarLimits bound each one's cost (grammar.DefaultLimits where 0).
	GrammarCacheBytes int64
	GrammarLimits     grammar.Limits
}

// Model is a decoder LLM loaded on the host: its shape, its weights in the
// engine's layout, and the host-side parts sequences need. It is placed on
// devices with NewEngine.
type Model struct {
	opts     ModelOptions
	arch     string
	spec     netSpec
	weights  map[string]models.Tensor // engine names (graph.go)
	eos      []int32
	defaults Sampling
	maxNew   int          // generation_config's max_new_tokens (0: none)
	scratch  *ScratchPool // sampling buffers its sequences borrow per step
	gram     grammarState // constraints' vocabulary and compiled grammars
}

// NewModel checks config (config.json) and weights (Hugging Face names:
// model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...;
// gate_proj and up_proj, or gate_up_proj fused) and returns the model.
func NewModel(config []byte, weights map[string]models.Tensor, opts ModelOptions) (*Model, error) {
	c, err := DecodeConfig(config)
	if err != nil {
		return nil, fmt.Errorf("llm %q: %w", opts.Name, err)
	}
	return NewModelFromConfig(c, weights, opts)
}

// NewModelFromConfig is NewModel over a decoded config.json.
func NewModelFromConfig(c Config, weights map[string]models.Tensor, opts ModelOptions) (*Model, error) {
	spec, eos, arch, err := c.spec()
	if err != nil {
		return nil, fmt.Errorf("llm %q: %w", opts.Name, err)
	}
	if f := opts.RopeFreqFactors; f != nil {
		if len(f) != len(spec.InvFreq) {
			return nil, fmt.Errorf("%w: llm %q: %d RoPE frequency factors for %d rotated pairs", models.ErrInvalidConfig, opts.Name, len(f), len(spec.InvFreq))
		}
		inv := slices.Clone(spec.InvFreq)
		for i, x := range f {
			inv[i] /= x
			if !(x > 0) || math.IsInf(float64(inv[i]), 0) || !(inv[i] > 0) {
				return nil, fmt.Errorf("%w: llm %q: RoPE frequency factor %d is %g", models.ErrInvalidConfig, opts.Name, i, x)
			}
		}
		spec.InvFreq = inv
	}
	w, err := engineWeights(spec, weights)
	if err != nil {
		return nil, fmt.Errorf("llm %q: %w", opts.Name, err)
	}
	if opts.BaseBatch <= 0 {
		opts.BaseBatch = models.DefaultBaseBatch
	}
	if opts.MaxContext < 0 {
		return nil, fmt.Errorf("%w: llm %q: max context %d", models.ErrInvalidInput, opts.Name, opts.MaxContext)
	}
	if opts.MaxContext > 0 && opts.MaxContext < spec.Context {
		spec.Context = opts.MaxContext
	}
	m := &Model{opts: opts, arch: arch, spec: spec, weights: w, eos: eos, scratch: NewScratchPool(spec.Vocab)}
	if opts.GenerationConfig != nil {
		if err := m.generationConfig(opts.GenerationConfig); err != nil {
			return nil, fmt.Errorf("llm %q: %w", opts.Name, err)
		}
	}
	if opts.DefaultStop != nil {
		m.defaults.Stop = slices.Clone(opts.DefaultStop)
		if err := m.defaults.Validate(); err != nil {
			return nil, fmt.Errorf("%w: llm %q: default stop strings: %w", models.ErrInvalidConfig, opts.Name, err)
		}
	}
	if et, ok := opts.Tokenizer.(EndTokenizer); ok {
		// A tokenizer larger than the model's vocabulary (padded tables
		// differ) may name ids the model never samples: those are left.
		for _, id := range et.EOSIDs() {
			if id >= 0 && int(id) < spec.Vocab && !slices.Contains(m.eos, id) {
				m.eos = append(m.eos, id)
			}
		}
		slices.Sort(m.eos)
	}
	for _, id := range m.eos {
		if id < 0 || int(id) >= spec.Vocab {
			return nil, fmt.Errorf("%w: llm %q: eos_token_id %d (config.json or generation_config.json) outside the vocabulary of %d", models.ErrInvalidConfig, opts.Name, id, spec.Vocab)
		}
	}
	return m, nil
}

// generationConfig reads generation_config.json's EOS ids and sampling
// defaults (do_sample false means greedy whatever the other values say).
func (m *Model) generationConfig(raw []byte) error {
	var g struct {
		EOSTokenID        json.RawMessage `json:"eos_token_id"`
		DoSample          *bool           `json:"do_sample"`
		Temperature       *float32        `json:"temperature"`
		TopP              *float32        `json:"top_p"`
		TopK              *int            `json:"top_k"`
		MinP              *float32        `json:"min_p"`
		RepetitionPenalty *float32        `json:"repetition_penalty"`
		MaxNewTokens      *int            `json:"max_new_tokens"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		return fmt.Errorf("%w: generation_config.json: %w", models.ErrInvalidGenerationConfig, err)
	}
	ids, err := tokenIDs(g.EOSTokenID)
	if err != nil {
		return fmt.Errorf("%w: generation_config.json: eos_token_id: %w", models.ErrInvalidGenerationConfig, err)
	}
	m.eos = slices.Compact(slices.Sorted(slices.Values(append(m.eos, ids...))))
	d := Sampling{}
	if g.DoSample != nil && *g.DoSample {
		d.Temperature = 1
		if g.Temperature != nil {
			d.Temperature = *g.Temperature
		}
		if g.TopP != nil {
			d.TopP = *g.TopP
		}
		if g.TopK != nil {
			d.TopK = *g.TopK
		}
		if g.MinP != nil {
			d.MinP = *g.MinP
		}
	}
	if g.RepetitionPenalty != nil {
		d.RepetitionPenalty = *g.RepetitionPenalty
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%w: generation_config.json: %w", models.ErrInvalidGenerationConfig, err)
	}
	m.defaults = d
	if g.MaxNewTokens != nil && *g.MaxNewTokens > 0 {
		m.maxNew = *g.MaxNewTokens
	}
	return nil
}

// ContextLength is the most tokens a sequence holds, prompt and output.
func (m *Model) ContextLength() int { return m.spec.Context }

// VocabSize is the number of token ids.
func (m *Model) VocabSize() int { return m.spec.Vocab }

// EOS returns the end-of-sequence ids.
func (m *Model) EOS() []int32 { return slices.Clone(m.eos) }

// DefaultSampling is generation_config.json's sampling (greedy without it).
func (m *Model) DefaultSampling() Sampling { return m.defaults }

// Arch is config.json's architecture (ArchLlama, ArchQwen2, ArchQwen3).
func (m *Model) Arch() string { return m.arch }

// SystemPrompt is the system message of a conversation that has none
// ("": none).
func (m *Model) SystemPrompt() string { return m.opts.SystemPrompt }

// DefaultMaxTokens bounds the output of a request that sets no bound:
// generation_config.json's max_new_tokens, as vLLM takes it, or 0 when it
// has none: then a sequence runs to a stop or to the end of its context,
// as Ollama's and OpenAI's do.
func (m *Model) DefaultMaxTokens() int { return m.maxNew }

// Info describes the model for the server and the lifecycle.
func (m *Model) Info() models.Info {
	return models.Info{
		Name: m.opts.Name, Version: m.opts.Version, Kind: KindLLM,
		Inputs:    []models.TensorSpec{{Name: "prompt", DType: "BYTES", Shape: []int64{-1}}},
		Outputs:   []models.TensorSpec{{Name: "text", DType: "BYTES", Shape: []int64{-1}}},
		BaseBatch: m.opts.BaseBatch, MaxSeqLen: m.spec.Context, Dim: m.spec.Vocab,
	}
}

// Encode tokenises a prompt, with the tokenizer's special tokens (BOS)
// when addSpecial. It tokenises no further than the context: a text
// longer than that is refused after context+1 tokens, whatever its size.
func (m *Model) Encode(text string, addSpecial bool) ([]int32, error) {
	if m.opts.Tokenizer == nil {
		return nil, fmt.Errorf("%w: llm %q has no tokenizer", models.ErrInvalidInput, m.opts.Name)
	}
	ids, truncated, err := m.opts.Tokenizer.Encode(text, addSpecial, m.spec.Context)
	if err != nil {
		return nil, fmt.Errorf("%w: llm %q: encode: %w", models.ErrInvalidInput, m.opts.Name, err)
	}
	if truncated {
		return nil, fmt.Errorf("%w: the prompt is over %d tokens, the context of llm %q", models.ErrInvalidInput, m.spec.Context, m.opts.Name)
	}
	return ids, nil
}

// TokenBytes is what token id decodes to by itself (nil without a
// tokenizer): the text of logprobs' tokens, which may be part of a UTF-8
// character.
func (m *Model) TokenBytes(id int32) []byte {
	if m.opts.Tokenizer == nil {
		return nil
	}
	return m.opts.Tokenizer.TokenBytes(id)
}

// RenderChat renders messages with the model's chat template.
func (m *Model) RenderChat(ctx context.Context, messages []Message, opts ChatOptions) (string, error) {
	if m.opts.Chat == nil {
		return "", fmt.Errorf("%w: llm %q has no chat template", models.ErrInvalidInput, m.opts.Name)
	}
	s, err := m.opts.Chat.Render(ctx, messages, opts)
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("llm %q: chat template: %w", m.opts.Name, ctx.Err())
		}
		return "", fmt.Errorf("%w: llm %q: chat template: %w", models.ErrInvalidInput, m.opts.Name, err)
	}
	return s, nil
}

// NewSequence validates params and returns the state of one sequence
// continuing prompt: the SeqStep.State of its steps. A constraint is
// compiled without a deadline: a request's should use NewSequenceContext.
func (m *Model) NewSequence(params Sampling, prompt []int32) (*Sequence, error) {
	return m.NewSequenceContext(context.Background(), params, prompt)
}

// NewSequenceContext is NewSequence compiling params.Constraint (or
// taking it from the model's cache) under ctx: its errors wrap
// grammar.ErrInvalidGrammar, ErrUnsupportedSchema or ErrGrammarTooLarge.
func (m *Model) NewSequenceContext(ctx context.Context, params Sampling, prompt []int32) (*Sequence, error) {
	if len(prompt) == 0 {
		return nil, fmt.Errorf("%w: empty prompt", models.ErrInvalidInput)
	}
	if len(prompt) >= m.spec.Context {
		return nil, fmt.Errorf("%w: prompt of %d tokens leaves no room in a context of %d", models.ErrInvalidInput, len(prompt), m.spec.Context)
	}
	for i, id := range prompt {
		if id < 0 || int(id) >= m.spec.Vocab {
			return nil, fmt.Errorf("%w: prompt token %d is id %d, outside the vocabulary of %d", models.ErrInvalidInput, i, id, m.spec.Vocab)
		}
	}
	for _, id := range params.StopTokenIDs {
		if id < 0 || int(id) >= m.spec.Vocab {
			return nil, fmt.Errorf("%w: stop token id %d outside the vocabulary of %d", ErrInvalidSampling, id, m.spec.Vocab)
		}
	}
	if t := params.ThinkFirst; t != nil && (int(t.Open) >= m.spec.Vocab || int(t.Close) >= m.spec.Vocab) {
		return nil, fmt.Errorf("%w: thinking tokens %d and %d outside the vocabulary of %d", ErrInvalidSampling, t.Open, t.Close, m.spec.Vocab)
	}
	var detok Detokenizer
	if m.opts.Tokenizer != nil {
		detok = m.opts.Tokenizer.NewDetokenizer()
	}
	s, err := newSequence(params, prompt, m.spec.Vocab, m.eos, detok)
	if err != nil {
		return nil, err
	}
	s.scratch = m.scratch
	if params.Constraint != nil {
		if s.con, err = m.compileConstraint(ctx, params.Constraint); err != nil {
			return nil, err
		}
		if t := params.ThinkFirst; t != nil {
			s.con.think, s.con.phase = *t, mayThink
			if t.InBlock {
				s.con.phase = inThink
			}
		}
	}
	return s, nil
}

// NewEngine uploads the weights to dev (matmul weights in the device's
// compute type) and allocates a KV cache of opts.CacheBytes.
func (m *Model) NewEngine(ctx context.Context, dev runtime.Device, opts EngineOptions) (*Engine, error) {
	e, err := newEngine(ctx, dev, m.spec, m.weights, opts)
	if m.opts.DropPages != nil {
		m.opts.DropPages()
	}
	if err != nil {
		return nil, fmt.Errorf("llm %q: %w", m.opts.Name, err)
	}
	return e, nil
}

// Quantized lists the block types the model's weights are stored in
// (none for a float checkpoint).
func (m *Model) Quantized() []runtime.DType {
	seen := map[runtime.DType]bool{}
	for _, t := range m.weights {
		if t.Quantized() {
			seen[t.Stored] = true
		}
	}
	out := make([]runtime.DType, 0, len(seen))
	for _, dt := range runtime.QuantizedTypes() {
		if seen[dt] {
			out = append(out, dt)
		}
	}
	return out
}

// WeightBytes is the device memory of the weights when matmuls run in dt
// (F32 or BF16) on a device that holds block-quantized weights as stored
// (the CPU): what NewEngine allocates there besides the cache.
func (m *Model) WeightBytes(dt runtime.DType) int64 {
	return m.weightBytes(dt, func(runtime.DType) bool { return true })
}

// WeightBytesOn is WeightBytes on dev, which may hold none of the block
// types (PJRT): those weights are counted dequantized to their float type.
func (m *Model) WeightBytesOn(dev runtime.Device, dt runtime.DType) int64 {
	return m.weightBytes(dt, func(q runtime.DType) bool { return runtime.HoldsQuantized(dev, q) })
}

func (m *Model) weightBytes(dt runtime.DType, holds func(runtime.DType) bool) int64 {
	var n int64
	for name, t := range m.weights {
		if name == wLMHead && m.spec.Tied {
			continue // shares the embedding table's buffer
		}
		if t.Quantized() && holds(t.Stored) {
			n += (t.Stored.Bytes(int64(t.Elements())) + 63) / 64 * 64
			continue
		}
		edt := runtime.F32
		if matmulWeight(name) {
			edt = dt
		}
		n += alignedBytes(edt, t.Shape)
	}
	return n
}

// KVCacheDType is the type an engine on dev holds its KV cache in when
// EngineOptions.KVDType leaves it to the engine: bf16 where dev keeps the
// matrices block-quantized or computes in bf16, else f32 (kvCacheDType).
func (m *Model) KVCacheDType(dev runtime.Device) runtime.DType { return kvCacheDType(dev, m.weights) }

// CheckKVDType says whether an engine on dev can hold this model's KV
// cache in kv (EngineOptions.KVDType): an f16, q8_0 or q4_0 cache needs a device that
// holds block-quantized buffers (the CPU) and head dims divisible by 32.
func (m *Model) CheckKVDType(dev runtime.Device, kv runtime.DType) error {
	return m.spec.checkKVDType(dev, kv)
}

// CacheBlockBytes is the device memory of one KV-cache block of blockSize
// tokens (DefaultBlockSize when 0) over all layers, K and V, in type kv
// (KVCacheDType's where 0).
func (m *Model) CacheBlockBytes(dev runtime.Device, kv runtime.DType, blockSize int) int64 {
	if blockSize <= 0 {
		blockSize = DefaultBlockSize
	}
	if kv == 0 {
		kv = m.KVCacheDType(dev)
	}
	return m.spec.cacheBlockBytes(blockSize, kv)
}

// StepBytes bounds the device memory one step of maxStepTokens rows from
// maxSeqs sequences holds besides weights and cache: its inputs, the
// intermediates alive at once, and the logits of every sequence sampling.
func (m *Model) StepBytes(dt runtime.DType, maxStepTokens, maxSeqs int) int64 {
	s := m.spec
	t := int64(max(maxStepTokens, 1))
	qkv := int64((s.Heads + 2*s.KVHeads) * s.HeadDim)
	// The residual, a normed copy and its operand copy, q/k/v with their
	// rotated copies, the attention output, gate_up and its product.
	perRow := 3*int64(s.Hidden) + 2*qkv + int64(s.Heads*s.HeadDim) + 3*int64(s.Inter)
	if dt == runtime.BF16 {
		perRow += int64(s.Hidden+s.Inter+s.Heads*s.HeadDim) / 2
	}
	maxBlks := int64((s.Context + DefaultBlockSize - 1) / DefaultBlockSize)
	inputs := 5*t + int64(maxSeqs)*maxBlks + int64(maxSeqs)
	return (t*perRow+int64(maxSeqs)*(int64(s.Vocab)+int64(s.Hidden)))*4 + inputs*4 + 64*64
}

func alignedBytes(dt runtime.DType, shape []int) int64 {
	n := int64(dt.Size())
	for _, d := range shape {
		n *= int64(d)
	}
	return (n + 63) / 64 * 64
}
