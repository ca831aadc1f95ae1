package repo

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/gguf"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
	"github.com/brokerd/brokerd/runtime/quant"
)

// A version directory holding one *.gguf file (llama.cpp's and Ollama's
// model file) and neither config.json nor model.json is a decoder LLM:
// its hyper-parameters, tokenizer and chat template come from the file's
// metadata, its weights from its tensors. Architectures llama (Mistral-
// style llama files too), qwen2 and qwen3.
//
// The weights are dequantized to float32 at load (exactly as ggml does,
// runtime/quant), so every type below serves today; keeping them
// quantized in memory, with kernels for them, is the next step of issue
// 21.

// ggufTypes are the tensor types read: every type of llama.cpp's and
// Ollama's Q4_K_M, Q5_K_M, Q6_K and Q8_0 files, and the float ones.
var ggufTypes = []gguf.Type{gguf.F32, gguf.F16, gguf.BF16, gguf.Q8_0, gguf.Q4_0, gguf.Q4_1, gguf.Q5_0, gguf.Q5_1, gguf.Q4_K, gguf.Q5_K, gguf.Q6_K}

// ggufArchitectures maps general.architecture to the engine's.
var ggufArchitectures = map[string]string{"llama": llm.ArchLlama, "qwen2": llm.ArchQwen2, "qwen3": llm.ArchQwen3}

// ggufFile returns the one *.gguf file of dir ("" when none).
func ggufFile(dir string) (string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return "", nil
	}
	var found []string
	for _, de := range des {
		if strings.EqualFold(filepath.Ext(de.Name()), ".gguf") && !strings.HasPrefix(de.Name(), ".") {
			found = append(found, de.Name())
		}
	}
	switch len(found) {
	case 0:
		return "", nil
	case 1:
		return filepath.Join(dir, found[0]), nil
	}
	return "", fmt.Errorf("%w: %s holds %d .gguf files (%s): keep one per version directory", ErrInvalid, dir, len(found), strings.Join(found, ", "))
}

// ggufPlan is a checked GGUF version: the open file and what its metadata
// says.
type ggufPlan struct {
	path        string
	file        *gguf.File
	arch        string // general.architecture
	heads, kv   int
	vocab       bpe.Vocab
	ropeFactors []float32 // Llama 3's rope_freqs.weight (nil: none)
	fileType    string
}

// inspectGGUF opens a version's GGUF file and checks its metadata against
// the same limits as config.json, without reading its tensors.
func (p *plan) inspectGGUF(path string) (*llmPlan, error) {
	if _, err := p.r.regular(path, 0); err != nil {
		return nil, err
	}
	real, err := p.r.inside(path)
	if err != nil {
		return nil, err
	}
	return p.inspectGGUFAt(path, real)
}

// inspectGGUFAt is inspectGGUF of a file already checked to be a regular
// file where it may be read (real, named path in errors). The header is
// read through the file's mapping (see loadGGUF).
func (p *plan) inspectGGUFAt(path, real string) (lp *llmPlan, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer faultAsError(path, &err)
	f, err := gguf.Open(real, gguf.Limits{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	gp := &ggufPlan{path: path, file: f}
	cfg, err := gp.config()
	if err != nil {
		f.Close()
		return nil, invalid(models.ErrInvalidConfig, fmt.Errorf("%s: %w", path, err))
	}
	raw, err := json.Marshal(cfg)
	if err == nil {
		lp = &llmPlan{gguf: gp}
		err = json.Unmarshal(raw, &lp.config)
	}
	if err != nil {
		f.Close()
		return nil, invalid(models.ErrInvalidConfig, fmt.Errorf("%s: %w", path, err))
	}
	if err := checkSizes(lp.config, path); err != nil {
		f.Close()
		return nil, err
	}
	if err := lp.config.Check(); err != nil {
		f.Close()
		return nil, invalid(models.ErrInvalidConfig, fmt.Errorf("%s: %w", path, err))
	}
	if gp.vocab, err = gp.tokenizer(); err != nil {
		f.Close()
		return nil, invalid(models.ErrInvalidTokenizer, fmt.Errorf("%s: %w", path, err))
	}
	if n := len(gp.vocab.Tokens); n > lp.config.VocabSize {
		// Its tokenizer would give ids the model has no embedding for
		// (llama.cpp refuses the file too: its token_embd's shape is not
		// the vocabulary's).
		f.Close()
		return nil, invalid(models.ErrInvalidTokenizer, fmt.Errorf("%s: tokenizer.ggml.tokens has %d tokens but token_embd.weight %d rows", path, n, lp.config.VocabSize))
	}
	if ids := endOfGeneration(gp.vocab); len(ids) > 0 {
		if lp.config.EOSTokenID, err = json.Marshal(ids); err != nil {
			f.Close()
			return nil, err
		}
	}
	if lp.generation, err = ggufGeneration(f); err != nil {
		f.Close()
		return nil, err
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if !slices.Contains(ggufTypes, t.Type) {
			f.Close()
			return nil, fmt.Errorf("%w: %s: tensor %s is %s: supported are %v", errInvalidGGUF, path, t.Name, t.Type, ggufTypes)
		}
		hf, ok := ggufName(t.Name)
		if !ok && t.Name != "rope_freqs.weight" {
			f.Close()
			return nil, fmt.Errorf("%w: %s: tensor %s is not one of a %s model", errInvalidGGUF, path, t.Name, gp.arch)
		}
		// Checked before anything is read: the tensors that are not kept as
		// stored are dequantized to float32 at load (7× a Q4 tensor's bytes).
		if want := ggufShape(hf, lp.config); ok && want == nil {
			f.Close()
			return nil, fmt.Errorf("%w: %s: tensor %s is of no layer of this %d-layer %s model", errInvalidGGUF, path, t.Name, lp.config.NumHiddenLayers, gp.arch)
		} else if ok && !slices.Equal(ggufDims(t), want) {
			f.Close()
			return nil, fmt.Errorf("%w: %s: tensor %s is %v, want %v for this %s model", errInvalidGGUF, path, t.Name, ggufDims(t), want, gp.arch)
		}
	}
	return lp, nil
}

// ggufDims is t's shape, the outer dimension first (GGUF lists the
// contiguous one first).
func ggufDims(t *gguf.Tensor) []int {
	shape := make([]int, len(t.Dims))
	for j, d := range t.Dims {
		shape[len(shape)-1-j] = int(d)
	}
	return shape
}

// ggufShape is the shape the engine wants for the tensor of Hugging Face
// name hf, from the model's config (nil: one of no layer the config has).
func ggufShape(hf string, c llm.Config) []int {
	h, inter, vocab := c.HiddenSize, c.IntermediateSize, c.VocabSize
	d := c.HeadDim
	if d == 0 && c.NumAttentionHeads > 0 {
		d = h / c.NumAttentionHeads
	}
	qd, kd := c.NumAttentionHeads*d, c.NumKeyValueHeads*d
	switch hf {
	case "model.embed_tokens.weight", "lm_head.weight":
		return []int{vocab, h}
	case "model.norm.weight":
		return []int{h}
	}
	rest, ok := strings.CutPrefix(hf, "model.layers.")
	if !ok {
		return nil
	}
	layer, name, _ := strings.Cut(rest, ".")
	if l, err := strconv.Atoi(layer); err != nil || l >= c.NumHiddenLayers {
		return nil
	}
	return map[string][]int{
		"input_layernorm.weight": {h}, "post_attention_layernorm.weight": {h},
		"self_attn.q_proj.weight": {qd, h}, "self_attn.k_proj.weight": {kd, h}, "self_attn.v_proj.weight": {kd, h},
		"self_attn.o_proj.weight": {h, qd}, "self_attn.q_proj.bias": {qd}, "self_attn.k_proj.bias": {kd},
		"self_attn.v_proj.bias": {kd}, "self_attn.q_norm.weight": {d}, "self_attn.k_norm.weight": {d},
		"mlp.gate_proj.weight": {inter, h}, "mlp.up_proj.weight": {inter, h}, "mlp.down_proj.weight": {h, inter},
	}[name]
}

// ggufGeneration is a GGUF model's sampling defaults, as the
// generation_config.json the engine takes them from: llama.cpp's own
// (llama-server samples at temperature 0.8, top_k 40, top_p 0.95, min_p
// 0.05, which its users get when they set none), under the file's
// general.sampling.* keys (its authors' recommendation, which llama.cpp
// reads too). A key out of its range is left out, as llama.cpp would
// not apply it. (An Ollama model's params replace these: ollama.go.)
func ggufGeneration(f *gguf.File) ([]byte, error) {
	g := map[string]any{"do_sample": true, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
	for _, k := range []struct {
		key, name string
		check     func(v float64) llm.Sampling
	}{
		{"general.sampling.temp", "temperature", func(v float64) llm.Sampling { return llm.Sampling{Temperature: float32(v)} }},
		{"general.sampling.top_p", "top_p", func(v float64) llm.Sampling { return llm.Sampling{TopP: float32(v)} }},
		{"general.sampling.min_p", "min_p", func(v float64) llm.Sampling { return llm.Sampling{MinP: float32(v)} }},
		{"general.sampling.penalty_repeat", "repetition_penalty", func(v float64) llm.Sampling { return llm.Sampling{RepetitionPenalty: float32(v)} }},
	} {
		if v, ok := f.Float(k.key); ok && !math.IsNaN(v) && k.check(v).Validate() == nil {
			g[k.name] = v
		}
	}
	if v, ok := f.Uint("general.sampling.top_k"); ok && v <= math.MaxInt32 && (llm.Sampling{TopK: int(v)}).Validate() == nil {
		g["top_k"] = v
	}
	return json.Marshal(g)
}

// errInvalidGGUF: a GGUF file is malformed, or holds what the engine does
// not run (gguf.ErrInvalid's words).
var errInvalidGGUF = gguf.ErrInvalid

// config writes the metadata as the config.json the engine reads, so that
// both formats go through one set of checks.
func (gp *ggufPlan) config() (map[string]any, error) {
	f := gp.file
	arch, _ := f.String("general.architecture")
	hfArch, ok := ggufArchitectures[arch]
	if !ok {
		return nil, fmt.Errorf("general.architecture %q: want llama, qwen2 or qwen3", arch)
	}
	gp.arch = arch
	if ft, ok := f.Uint("general.file_type"); ok {
		gp.fileType = fileTypeName(ft)
	}
	num := func(key string, def int64) (int, error) {
		v, ok := f.Uint(arch + "." + key)
		if !ok {
			if def >= 0 {
				return int(def), nil
			}
			return 0, fmt.Errorf("%s.%s is missing", arch, key)
		}
		if v > math.MaxInt32 {
			return 0, fmt.Errorf("%s.%s is %d: out of range", arch, key, v)
		}
		return int(v), nil
	}
	var err error
	var hidden, layers, inter, ctx, headDim int
	for _, k := range []struct {
		key string
		dst *int
		def int64
	}{
		{"embedding_length", &hidden, -1}, {"block_count", &layers, -1}, {"feed_forward_length", &inter, -1},
		{"context_length", &ctx, -1}, {"attention.head_count", &gp.heads, -1}, {"attention.head_count_kv", &gp.kv, 0},
		{"attention.key_length", &headDim, 0},
	} {
		if *k.dst, err = num(k.key, k.def); err != nil {
			return nil, err
		}
	}
	if gp.kv == 0 {
		gp.kv = gp.heads
	}
	emb, ok := f.Tensor("token_embd.weight")
	if !ok || len(emb.Dims) != 2 {
		return nil, fmt.Errorf("token_embd.weight is missing or not a matrix")
	}
	vocab := emb.Dims[1]
	if vocab <= 0 || vocab > math.MaxInt32 {
		return nil, fmt.Errorf("token_embd.weight has %d rows", vocab)
	}
	cfg := map[string]any{
		"architectures": []string{hfArch}, "vocab_size": vocab, "hidden_size": hidden,
		"num_hidden_layers": layers, "intermediate_size": inter, "max_position_embeddings": ctx,
		"num_attention_heads": gp.heads, "num_key_value_heads": gp.kv,
	}
	if headDim > 0 {
		cfg["head_dim"] = headDim
	}
	for _, k := range []struct{ key, name string }{
		{arch + ".attention.layer_norm_rms_epsilon", "rms_norm_eps"},
		{arch + ".rope.freq_base", "rope_theta"},
	} {
		x, ok := f.Float(k.key)
		if !ok {
			continue
		}
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("%s is %g", k.key, x)
		}
		cfg[k.name] = x
	}
	if typ, ok := f.String(arch + ".rope.scaling.type"); ok && typ != "none" && typ != "" {
		return nil, fmt.Errorf("%s.rope.scaling.type %q is not supported", arch, typ)
	}
	_, untied := f.Tensor("output.weight")
	cfg["tie_word_embeddings"] = !untied
	if arch == "llama" {
		_, bias := f.Tensor("blk.0.attn_q.bias")
		cfg["attention_bias"] = bias
	}
	if rf, ok := f.Tensor("rope_freqs.weight"); ok {
		// Llama 3's rope scaling: llama.cpp's converter stores the
		// factors it computed, one per rotated pair.
		if rf.Type != gguf.F32 || len(rf.Dims) != 1 {
			return nil, fmt.Errorf("rope_freqs.weight is %s %v: want a f32 vector", rf.Type, rf.Dims)
		}
		data, err := f.TensorData(rf)
		if err != nil {
			return nil, err
		}
		gp.ropeFactors = make([]float32, rf.Dims[0])
		if err := quant.Dequantize(quant.F32, data, gp.ropeFactors); err != nil {
			return nil, fmt.Errorf("rope_freqs.weight: %w", err)
		}
	}
	return cfg, nil
}

// tokenizer reads tokenizer.ggml.* and tokenizer.chat_template.
func (gp *ggufPlan) tokenizer() (bpe.Vocab, error) {
	f := gp.file
	v := bpe.Vocab{BOS: -1, EOS: -1, PAD: -1, UNK: -1}
	v.Model, _ = f.String("tokenizer.ggml.model")
	v.Pre, _ = f.String("tokenizer.ggml.pre")
	var ok bool
	if v.Tokens, ok = f.Strings("tokenizer.ggml.tokens"); !ok {
		return v, fmt.Errorf("tokenizer.ggml.tokens is missing")
	}
	if types, ok := f.Ints("tokenizer.ggml.token_type"); ok {
		v.Types = make([]int32, len(types))
		for i, t := range types {
			if t < math.MinInt32 || t > math.MaxInt32 {
				return v, fmt.Errorf("tokenizer.ggml.token_type %d is %d", i, t)
			}
			v.Types[i] = int32(t)
		}
	}
	v.Merges, _ = f.Strings("tokenizer.ggml.merges")
	id := func(key string) (int32, error) {
		n, ok := f.Uint("tokenizer.ggml." + key)
		if !ok {
			return -1, nil
		}
		if n >= uint64(len(v.Tokens)) {
			return -1, fmt.Errorf("tokenizer.ggml.%s %d is outside the vocabulary of %d", key, n, len(v.Tokens))
		}
		return int32(n), nil
	}
	var err error
	for _, k := range []struct {
		key string
		dst *int32
	}{{"bos_token_id", &v.BOS}, {"eos_token_id", &v.EOS}, {"padding_token_id", &v.PAD}, {"unknown_token_id", &v.UNK}} {
		if *k.dst, err = id(k.key); err != nil {
			return v, err
		}
	}
	for _, key := range []string{"eot_token_id", "eom_token_id"} {
		n, err := id(key)
		if err != nil {
			return v, err
		}
		if n >= 0 {
			v.EOT = append(v.EOT, n)
		}
	}
	// llama.cpp's defaults when the file does not say: Llama 3's
	// tokenizer adds <|begin_of_text|>, Qwen's adds nothing.
	v.AddBOS = v.Pre == "llama-bpe" || v.Pre == "llama3" || v.Pre == "llama-v3"
	if b, ok := f.Bool("tokenizer.ggml.add_bos_token"); ok {
		v.AddBOS = b
	}
	v.AddEOS, _ = f.Bool("tokenizer.ggml.add_eos_token")
	v.ChatTemplate, _ = f.String("tokenizer.chat_template")
	return v, nil
}

// endOfGeneration are the ids a GGUF model's generation ends at, as
// llama.cpp's special_eog_ids: the file's eos, eot and eom ids, and the
// tokens whose text names an end. A file names one id (Qwen's <|im_end|>,
// a Llama 3 instruct's <|eot_id|>) while the model may end with another
// (<|endoftext|>, <|end_of_text|>, <|eom_id|>), which Hugging Face's
// generation_config.json lists beside it; llama.cpp also ends at Qwen's
// fill-in-the-middle separators.
func endOfGeneration(v bpe.Vocab) []int32 {
	var ids []int32
	if v.EOS >= 0 {
		ids = append(ids, v.EOS)
	}
	ids = append(ids, v.EOT...)
	for id, s := range v.Tokens {
		if slices.Contains(eogTexts, s) {
			ids = append(ids, int32(id))
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(ids)))
}

// eogTexts are the texts of llama.cpp's end-of-generation tokens
// (llama-vocab.cpp) for the vocabularies of the architectures served.
var eogTexts = []string{
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
	"<EOT>", "_<EOT>", "<|end_of_text|>",
	"<|fim_pad|>", "<|fim_repo|>", "<|repo_name|>", "<|file_sep|>",
}

// ggufNames maps llama.cpp's tensor names to Hugging Face's (the engine's
// input names).
var (
	ggufLayer      = regexp.MustCompile(`^blk\.(\d{1,4})\.([a-z_]+)\.(weight|bias)$`)
	ggufLayerNames = map[string]string{
		"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
		"attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
		"attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
		"ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
	}
	ggufTopNames = map[string]string{
		"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight",
	}
)

func ggufName(name string) (string, bool) {
	if hf, ok := ggufTopNames[name]; ok {
		return hf, true
	}
	m := ggufLayer.FindStringSubmatch(name)
	if m == nil {
		return "", false
	}
	hf, ok := ggufLayerNames[m[2]]
	if !ok {
		return "", false
	}
	return "model.layers." + m[1] + "." + hf + "." + m[3], true
}

// loadGGUF reads the tensors of a checked GGUF version under their Hugging
// Face names: block-quantized matrices as stored, slices of the file's
// mapping (the model then owns the file: see loadLLMWith), the rest
// dequantized to float32.
func (r *Repo) loadGGUF(ctx context.Context, gp *ggufPlan, name string) (weights map[string]models.Tensor, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer faultAsError(gp.path, &err)
	f := gp.file
	order := make([]*gguf.Tensor, 0, len(f.Tensors))
	for i := range f.Tensors {
		order = append(order, &f.Tensors[i])
	}
	slices.SortFunc(order, func(a, b *gguf.Tensor) int { return cmp.Compare(a.Offset, b.Offset) })
	weights = make(map[string]models.Tensor, len(order))
	var done int64
	for i, t := range order {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hf, ok := ggufName(t.Name)
		if !ok {
			continue // rope_freqs.weight: read with the metadata
		}
		shape := make([]int, len(t.Dims))
		n := int64(1)
		for j, d := range t.Dims { // GGUF lists the contiguous dimension first
			shape[len(shape)-1-j] = int(d)
			n *= d
		}
		data, err := f.TensorData(t)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: tensor %s: %w", errInvalidGGUF, gp.path, t.Name, err)
		}
		// Llama's q and k rows: llama.cpp's converter interleaves their
		// rotated halves; the engine rotates halves.
		heads := 0
		if gp.arch == "llama" {
			switch {
			case strings.HasSuffix(hf, "q_proj.weight"), strings.HasSuffix(hf, "q_proj.bias"):
				heads = gp.heads
			case strings.HasSuffix(hf, "k_proj.weight"), strings.HasSuffix(hf, "k_proj.bias"):
				heads = gp.kv
			}
		}
		var w models.Tensor
		if dt, ok := runtime.FromGGML(quant.Type(t.Type)); ok && len(shape) == 2 {
			// Kept as stored, in the mapping: the device copies it (or
			// dequantizes it for a device that cannot hold it).
			if want := dt.Bytes(n); want != int64(len(data)) {
				return nil, fmt.Errorf("%w: %s: tensor %s (%s) holds %d bytes, want %d", errInvalidGGUF, gp.path, t.Name, t.Type, len(data), want)
			}
			if heads > 0 {
				// Rows move whole: permute a copy of the stored rows.
				if data, err = unpermuteRope(data, heads, shape[0]); err != nil {
					return nil, invalid(models.ErrInvalidWeights, fmt.Errorf("%s: tensor %s: %w", gp.path, t.Name, err))
				}
			}
			w = models.Tensor{Shape: shape, Stored: dt, Raw: [][]byte{data}}
		} else {
			x := make([]float32, n)
			if err := quant.Dequantize(quant.Type(t.Type), data, x); err != nil {
				return nil, fmt.Errorf("%w: %s: tensor %s (%s): %w", errInvalidGGUF, gp.path, t.Name, t.Type, err)
			}
			if heads > 0 {
				if x, err = unpermuteRope(x, heads, shape[0]); err != nil {
					return nil, invalid(models.ErrInvalidWeights, fmt.Errorf("%s: tensor %s: %w", gp.path, t.Name, err))
				}
			}
			w = models.Tensor{Shape: shape, Data: x}
		}
		weights[hf] = w
		done += t.Size
		if (i+1)%64 == 0 {
			r.log.Info("reading GGUF tensors", zap.String("model", name), zap.Int("tensors", i+1),
				zap.Int("of", len(order)), zap.Int64("bytes", done))
		}
	}
	return weights, nil
}

// faultAsError, deferred under debug.SetPanicOnFault, turns a fault on a
// GGUF file's mapping into the read's error: a file truncated while it is
// read faults past its new end, and that must fail the load, not the
// process.
func faultAsError(path string, err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: %s changed while it was read: %v", errInvalidGGUF, path, r)
	}
}

// unpermuteRope undoes convert_hf_to_gguf.py's permute of a Llama q or k
// projection of rows rows (a matrix of any element type, rows whole, or a
// bias): within each head of d rows, row 2j+half came from row
// half*d/2+j. It returns a permuted copy.
func unpermuteRope[E any](x []E, heads, rows int) ([]E, error) {
	if heads <= 0 || rows <= 0 || rows%heads != 0 || (rows/heads)%2 != 0 || len(x)%rows != 0 {
		return nil, fmt.Errorf("%d rows do not split into %d heads of an even size", rows, heads)
	}
	cols := len(x) / rows
	d := rows / heads
	out := make([]E, len(x))
	for h := range heads {
		for half := range 2 {
			for j := range d / 2 {
				to := (h*d + half*d/2 + j) * cols
				from := (h*d + 2*j + half) * cols
				copy(out[to:to+cols], x[from:from+cols])
			}
		}
	}
	return out, nil
}

// fileTypeName is general.file_type's name (llama.cpp's llama_ftype), as
// Ollama shows a model's quantization.
func fileTypeName(ft uint64) string {
	names := map[uint64]string{
		0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
		12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
	}
	if n, ok := names[ft]; ok {
		return n
	}
	return "file type " + strconv.FormatUint(ft, 10)
}
