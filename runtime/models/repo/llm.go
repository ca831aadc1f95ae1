package repo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/brokerd/brokerd/runtime/gguf"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// Decoder LLMs (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) as
// Hugging Face downloads them: config.json, model.safetensors or shards
// with model.safetensors.index.json, generation_config.json, and the
// tokenizer files, which the repository's TokenizerLoader reads.

// Files of an LLM version directory besides config.json and the weights.
const (
	FileGenerationConfig = "generation_config.json"
	FileTokenizerConfig  = "tokenizer_config.json"
	maxShards            = 1024
)

// TokenizerLoader reads an LLM's tokenizer and chat template from its
// version directory, with readFile (which refuses files that are not
// regular or lie outside the repository, and bounds their size). ctx is
// the load's: checking a chat template runs it.
type TokenizerLoader func(ctx context.Context, dir string, readFile func(path string, limit int64) ([]byte, error)) (llm.Tokenizer, llm.ChatTemplate, error)

// isLLM reports whether config.json names an architecture served as a
// generator.
func isLLM(archs []string) bool {
	for _, a := range archs {
		switch a {
		case llm.ArchLlama, llm.ArchQwen2, llm.ArchQwen3:
			return true
		}
	}
	return false
}

// configParams is the parameter count config.json's sizes imply (a lower
// bound: norms left out).
func configParams(c llm.Config) int64 {
	h, l, inter, v := int64(c.HiddenSize), int64(c.NumHiddenLayers), int64(c.IntermediateSize), int64(c.VocabSize)
	hd := int64(c.HeadDim)
	if hd == 0 && c.NumAttentionHeads > 0 {
		hd = h / int64(c.NumAttentionHeads)
	}
	kv := int64(max(c.NumKeyValueHeads, 1))
	attn := h*int64(c.NumAttentionHeads)*hd*2 + 2*h*kv*hd
	p := v*h + l*(attn+3*h*inter)
	if !c.TieWordEmbeddings {
		p += v * h
	}
	return p
}

// checkSizes bounds config.json's sizes before anything uses them.
func checkSizes(c llm.Config, path string) error {
	for _, f := range []struct {
		key    string
		v, max int
	}{
		{"vocab_size", c.VocabSize, maxVocab}, {"hidden_size", c.HiddenSize, maxHidden},
		{"num_hidden_layers", c.NumHiddenLayers, maxLayers}, {"num_attention_heads", c.NumAttentionHeads, maxHeads},
		{"intermediate_size", c.IntermediateSize, maxInter}, {"max_position_embeddings", c.MaxPositionEmbeddings, maxPositions},
	} {
		if err := bounded(path, f.key, f.v, f.max); err != nil {
			return err
		}
	}
	if c.NumKeyValueHeads < 0 || c.NumKeyValueHeads > maxHeads || c.HeadDim < 0 || c.HeadDim > maxHidden {
		return fmt.Errorf("%w: %s: num_key_value_heads %d or head_dim %d out of range", models.ErrInvalidConfig, path, c.NumKeyValueHeads, c.HeadDim)
	}
	return nil
}

// llmPlan is a checked LLM version: its config and its weight files.
type llmPlan struct {
	config     llm.Config // decoded once; its sizes bounded (checkSizes)
	generation []byte
	shards     []string  // weight files, in order
	gguf       *ggufPlan // or the GGUF file holding everything
	// stop and system are an Ollama model's default stop strings and
	// system prompt; chat, when set, makes its chat template from the
	// GGUF's (nil: none): its template and messages layers (ollama.go).
	stop   []string
	system string
	chat   func(ctx context.Context, gguf llm.ChatTemplate) (llm.ChatTemplate, error)
}

// inspectLLM checks an LLM version without reading its weights: the
// config's sizes against limits and against the bytes of the weight files,
// every file regular and inside the repository.
func (p *plan) inspectLLM() (*llmPlan, error) {
	cfgPath := filepath.Join(p.dir, FileConfig)
	raw, err := p.r.readFile(cfgPath, maxJSONBytes)
	if err != nil {
		return nil, err
	}
	lp := &llmPlan{}
	if err := json.Unmarshal(raw, &lp.config); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", models.ErrInvalidConfig, cfgPath, err)
	}
	if err := checkSizes(lp.config, cfgPath); err != nil {
		return nil, err
	}
	if err := lp.config.Check(); err != nil { // its messages name config.json
		return nil, invalid(models.ErrInvalidConfig, fmt.Errorf("%s: %w", p.dir, err))
	}
	if exists(p.dir, FileGenerationConfig) {
		if lp.generation, err = p.r.readFile(filepath.Join(p.dir, FileGenerationConfig), maxJSONBytes); err != nil {
			return nil, err
		}
	}
	switch {
	case exists(p.dir, FileWeights):
		lp.shards = []string{filepath.Join(p.dir, FileWeights)}
	case exists(p.dir, fileShardsIndex):
		if lp.shards, err = p.shardFiles(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: %s: no %s or %s", ErrInvalid, p.dir, FileWeights, fileShardsIndex)
	}
	var total int64
	for _, s := range lp.shards {
		n, err := p.r.regular(s, 0)
		if err != nil {
			return nil, err
		}
		total += n
	}
	if need := configParams(lp.config) * minParamBytes; need > total {
		return nil, fmt.Errorf("%w: %s: its sizes imply %d parameters, at least %d bytes, but the weights are %d bytes",
			models.ErrInvalidConfig, cfgPath, configParams(lp.config), need, total)
	}
	return lp, nil
}

// shardFiles reads model.safetensors.index.json's weight_map: the shard
// files, each a plain name in the version directory.
func (p *plan) shardFiles() ([]string, error) {
	path := filepath.Join(p.dir, fileShardsIndex)
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if _, err := p.readJSON(fileShardsIndex, &idx, false); err != nil {
		return nil, err
	}
	var files []string
	for _, f := range idx.WeightMap {
		if f == "" || f != filepath.Base(f) || strings.HasPrefix(f, ".") {
			return nil, fmt.Errorf("%w: %s: shard %q is not a file name of the version directory", errInvalidShardIndex, path, f)
		}
		if !slices.Contains(files, f) {
			files = append(files, f)
		}
		if len(files) > maxShards {
			return nil, fmt.Errorf("%w: %s: more than %d shards", errInvalidShardIndex, path, maxShards)
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: %s: weight_map is empty", errInvalidShardIndex, path)
	}
	slices.Sort(files)
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = filepath.Join(p.dir, f)
	}
	return out, nil
}

// loadLLM reads a checked LLM version into its model.
func (r *Repo) loadLLM(ctx context.Context, p *plan, lp *llmPlan, name string, version int64) (*Loaded, error) {
	return r.loadLLMWith(ctx, p, lp, name, version, r.maxContext)
}

// loadLLMWith is loadLLM with a context cap of its own (0: none).
func (r *Repo) loadLLMWith(ctx context.Context, p *plan, lp *llmPlan, name string, version int64, maxContext int) (*Loaded, error) {
	weights := map[string]models.Tensor{}
	for _, path := range lp.shards {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := readShard(ctx, path, weights); err != nil {
			return nil, err
		}
	}
	opts := llm.ModelOptions{Name: name, Version: version, GenerationConfig: lp.generation, MaxContext: maxContext,
		DefaultStop: lp.stop, SystemPrompt: lp.system}
	if gp := lp.gguf; gp != nil {
		var err error
		if weights, err = r.loadGGUF(ctx, gp, name); err != nil {
			return nil, err
		}
		opts.RopeFreqFactors = gp.ropeFactors
		tok, err := bpe.NewFromVocab(gp.vocab)
		if err == nil {
			opts.Tokenizer, opts.Chat, err = bpeParts(ctx, tok)
		}
		if err != nil {
			return nil, invalid(models.ErrInvalidTokenizer, fmt.Errorf("%s: %w", gp.path, err))
		}
		if lp.chat != nil {
			if opts.Chat, err = lp.chat(ctx, opts.Chat); err != nil {
				return nil, err
			}
		}
	} else if r.tokenizers != nil && exists(p.dir, FileTokenizer) {
		tok, chat, err := r.tokenizers(ctx, p.dir, r.readFile)
		if err != nil {
			kind := models.ErrInvalidTokenizer
			if errors.Is(err, ErrInvalid) {
				kind = "" // the repository's own (a file not regular, too large, ...)
			}
			return nil, invalid(kind, fmt.Errorf("%s: %w", p.dir, err))
		}
		opts.Tokenizer, opts.Chat = tok, chat
	}
	var file *gguf.File
	var m *llm.Model
	var err error
	if gp := lp.gguf; gp != nil {
		// Quantized weights are slices of the file's mapping: the model
		// keeps it, and each engine drops its pages once copied.
		file = gp.file
		opts.DropPages = func() { _ = file.DropPages() }
		m, err = newMappedLLM(gp.path, lp.config, weights, opts)
	} else {
		m, err = llm.NewModelFromConfig(lp.config, weights, opts)
	}
	if err == nil && file != nil {
		lp.gguf.file = nil // the model's now: p.close leaves it
		goruntime.AddCleanup(m, func(f *gguf.File) { _ = f.Close() }, file)
	}
	if err != nil {
		// The config, the generation config or the weights: the error's
		// kind says which.
		if errors.Is(err, ErrInvalid) || errors.Is(err, models.ErrInvalidInput) {
			return nil, invalid("", fmt.Errorf("%s: %w", p.dir, err))
		}
		return nil, fmt.Errorf("%s: %w", p.dir, err)
	}
	return &Loaded{Name: name, Version: version, Kind: llm.KindLLM, Dir: p.dir, LLM: m}, nil
}

// newMappedLLM is llm.NewModelFromConfig over a GGUF file's mapping, whose
// weights it reads (gate and up rows are fused into one copy): a file
// truncated since it was read faults, which must fail the load, not the
// process.
func newMappedLLM(path string, c llm.Config, weights map[string]models.Tensor, opts llm.ModelOptions) (m *llm.Model, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer faultAsError(path, &err)
	return llm.NewModelFromConfig(c, weights, opts)
}

func readShard(ctx context.Context, path string, into map[string]models.Tensor) error {
	st, err := safetensors.Open(path)
	if err != nil {
		return err
	}
	defer st.Close()
	for _, n := range st.Names() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, dup := into[n]; dup {
			return fmt.Errorf("%w: %s: tensor %q is in two shards", safetensors.ErrInvalid, path, n)
		}
		t, err := st.Float32(n)
		if err != nil {
			return err
		}
		into[n] = t
	}
	return nil
}

// configArchitectures reads config.json's architectures (nil when there is
// no readable config.json).
func (p *plan) configArchitectures() []string {
	if !exists(p.dir, FileConfig) {
		return nil
	}
	raw, err := p.r.readFile(filepath.Join(p.dir, FileConfig), maxJSONBytes)
	if err != nil {
		return nil
	}
	var c struct {
		Architectures []string `json:"architectures"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return nil
	}
	return c.Architectures
}
