package models

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"

	"github.com/brokerd/brokerd/runtime"
)

// BERTConfig is the part of a Hugging Face BERT config.json the forward pass
// needs; the JSON tags are config.json's keys.
type BERTConfig struct {
	VocabSize             int     `json:"vocab_size"`
	HiddenSize            int     `json:"hidden_size"`
	NumHiddenLayers       int     `json:"num_hidden_layers"`
	NumAttentionHeads     int     `json:"num_attention_heads"`
	IntermediateSize      int     `json:"intermediate_size"`
	HiddenAct             string  `json:"hidden_act"` // "gelu" (erf) or "relu"; "" means gelu
	MaxPositionEmbeddings int     `json:"max_position_embeddings"`
	TypeVocabSize         int     `json:"type_vocab_size"` // 2 when 0
	LayerNormEps          float64 `json:"layer_norm_eps"`  // 1e-12 when 0
	// ID2Label names the classifier's outputs: {"0": "negative", ...}.
	ID2Label map[string]string `json:"id2label,omitempty"`
}

// Pooling modes (BERTOptions.Pooling).
const (
	PoolingMean = "mean" // mean of the last hidden states over the real tokens
	PoolingCLS  = "cls"  // the last hidden state of the first token ([CLS])
)

// BERTOptions say how a BERT checkpoint is served.
type BERTOptions struct {
	Name    string
	Version int64
	// Kind is KindBERT (an encoder: a pooled, optionally normalised vector)
	// or KindBERTClassifier (pooler dense+tanh on [CLS], then the classifier:
	// logits). KindBERT when empty.
	Kind Kind
	// Pooling is PoolingMean or PoolingCLS for encoders (mean when empty).
	Pooling string
	// Normalize makes every embedding L2-normalised, whatever the request
	// asks (the checkpoint's sentence-transformers pipeline ends with a
	// Normalize module).
	Normalize bool
	// BaseBatch is the model's base batch (DefaultBaseBatch when 0).
	BaseBatch int
	// MaxBatchTokens bounds one batch's tokens (DefaultMaxBatchTokens when 0).
	MaxBatchTokens int
}

// Tokenizer turns text (and an optional second segment; "" for none) into
// token ids with the special tokens and their token type ids. With truncate
// it cuts the sequence to maxLen tokens; without, a longer one is an error.
type Tokenizer interface {
	// EncodeTruncated returns the ids and token type ids, and whether the
	// text had more than maxLen tokens and was cut.
	EncodeTruncated(ctx context.Context, text, pair string, maxLen int, truncate bool) (ids, typeIDs []int32, truncated bool, err error)
}

// BERT is a BERT-family encoder or sequence classifier. It implements Model;
// its payloads are TextInput, built with Tokenize.
type BERT struct {
	cfg     BERTConfig
	opts    BERTOptions
	tok     Tokenizer
	weights map[string]Tensor // canonical names
	mm      map[string]bool   // matmul weights: bf16 on bf16 devices
	labels  []string
	nLabels int
	act     runtime.Activation
	eps     float32
}

var _ Model = (*BERT)(nil)

// Canonical weight names (BertModel's, without the "bert." prefix).
const (
	wWord     = "embeddings.word_embeddings.weight"
	wPos      = "embeddings.position_embeddings.weight"
	wType     = "embeddings.token_type_embeddings.weight"
	wEmbLNW   = "embeddings.LayerNorm.weight"
	wEmbLNB   = "embeddings.LayerNorm.bias"
	wPoolerW  = "pooler.dense.weight"
	wPoolerB  = "pooler.dense.bias"
	wClassW   = "classifier.weight"
	wClassB   = "classifier.bias"
	layerName = "encoder.layer.%d."
)

// Per-layer weight names, after the "encoder.layer.N." prefix.
const (
	lQW = "attention.self.query.weight"
	lQB = "attention.self.query.bias"
	lKW = "attention.self.key.weight"
	lKB = "attention.self.key.bias"
	lVW = "attention.self.value.weight"
	lVB = "attention.self.value.bias"
	// The q, k and v projections stacked into one [3H,H] matmul (and
	// [3H] bias) at load, which OpAttention reads heads from in place.
	lQKVW  = "attention.self.qkv.weight"
	lQKVB  = "attention.self.qkv.bias"
	lAOW   = "attention.output.dense.weight"
	lAOB   = "attention.output.dense.bias"
	lAOLNW = "attention.output.LayerNorm.weight"
	lAOLNB = "attention.output.LayerNorm.bias"
	lIW    = "intermediate.dense.weight"
	lIB    = "intermediate.dense.bias"
	lOW    = "output.dense.weight"
	lOB    = "output.dense.bias"
	lOLNW  = "output.LayerNorm.weight"
	lOLNB  = "output.LayerNorm.bias"
)

// NewBERT checks cfg and weights (canonical names; a "bert." prefix is also
// accepted) and returns the model. tok builds payloads in Tokenize; it may
// be nil when payloads are built from token ids. Weights the model does not
// use (pooler of an encoder, MLM heads) are dropped.
func NewBERT(cfg BERTConfig, weights map[string]Tensor, tok Tokenizer, opts BERTOptions) (Model, error) {
	m, err := newBERT(cfg, weights, tok, opts)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func newBERT(cfg BERTConfig, weights map[string]Tensor, tok Tokenizer, opts BERTOptions) (*BERT, error) {
	if opts.Kind == "" {
		opts.Kind = KindBERT
	}
	if opts.Pooling == "" {
		opts.Pooling = PoolingMean
	}
	if opts.BaseBatch <= 0 {
		opts.BaseBatch = DefaultBaseBatch
	}
	if opts.MaxBatchTokens <= 0 {
		opts.MaxBatchTokens = DefaultMaxBatchTokens
	}
	if cfg.TypeVocabSize == 0 {
		cfg.TypeVocabSize = 2
	}
	if cfg.LayerNormEps == 0 {
		cfg.LayerNormEps = 1e-12
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: bert %q: %s", ErrInvalidInput, opts.Name, fmt.Sprintf(format, a...))
	}
	switch opts.Kind {
	case KindBERT, KindBERTClassifier:
	default:
		return nil, bad("kind %q is not a BERT kind", opts.Kind)
	}
	if opts.Pooling != PoolingMean && opts.Pooling != PoolingCLS {
		return nil, bad("pooling %q: want mean or cls", opts.Pooling)
	}
	for _, f := range []struct {
		name string
		v    int
	}{
		{"vocab_size", cfg.VocabSize}, {"hidden_size", cfg.HiddenSize}, {"num_hidden_layers", cfg.NumHiddenLayers},
		{"num_attention_heads", cfg.NumAttentionHeads}, {"intermediate_size", cfg.IntermediateSize},
		{"max_position_embeddings", cfg.MaxPositionEmbeddings}, {"type_vocab_size", cfg.TypeVocabSize},
	} {
		if f.v <= 0 {
			return nil, bad("config %s is %d", f.name, f.v)
		}
	}
	if cfg.HiddenSize%cfg.NumAttentionHeads != 0 {
		return nil, bad("hidden_size %d is not a multiple of num_attention_heads %d", cfg.HiddenSize, cfg.NumAttentionHeads)
	}
	if !(cfg.LayerNormEps > 0) || cfg.LayerNormEps > 1 {
		return nil, bad("layer_norm_eps %g", cfg.LayerNormEps)
	}
	m := &BERT{cfg: cfg, opts: opts, tok: tok, weights: map[string]Tensor{}, mm: map[string]bool{}, eps: float32(cfg.LayerNormEps)}
	switch cfg.HiddenAct {
	case "", "gelu":
		m.act = runtime.ActGELU
	case "relu":
		m.act = runtime.ActReLU
	default:
		return nil, bad("hidden_act %q is not supported (gelu, relu)", cfg.HiddenAct)
	}

	h, inter := cfg.HiddenSize, cfg.IntermediateSize
	use := func(name string, matmul bool, shape ...int) error {
		t, ok := weights[name]
		if !ok {
			t, ok = weights["bert."+name]
		}
		if !ok {
			return bad("weight %q is missing", name)
		}
		if err := checkTensor(map[string]Tensor{name: t}, name, shape...); err != nil {
			return fmt.Errorf("bert %q: %w", opts.Name, err)
		}
		m.weights[name] = t
		m.mm[name] = matmul
		return nil
	}
	type want struct {
		name   string
		matmul bool
		shape  []int
	}
	wants := []want{
		{wWord, false, []int{cfg.VocabSize, h}},
		{wPos, false, []int{cfg.MaxPositionEmbeddings, h}},
		{wType, false, []int{cfg.TypeVocabSize, h}},
		{wEmbLNW, false, []int{h}}, {wEmbLNB, false, []int{h}},
	}
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		p := fmt.Sprintf(layerName, l)
		wants = append(wants,
			want{p + lQW, true, []int{h, h}}, want{p + lQB, false, []int{h}},
			want{p + lKW, true, []int{h, h}}, want{p + lKB, false, []int{h}},
			want{p + lVW, true, []int{h, h}}, want{p + lVB, false, []int{h}},
			want{p + lAOW, true, []int{h, h}}, want{p + lAOB, false, []int{h}},
			want{p + lAOLNW, false, []int{h}}, want{p + lAOLNB, false, []int{h}},
			want{p + lIW, true, []int{inter, h}}, want{p + lIB, false, []int{inter}},
			want{p + lOW, true, []int{h, inter}}, want{p + lOB, false, []int{h}},
			want{p + lOLNW, false, []int{h}}, want{p + lOLNB, false, []int{h}},
		)
	}
	if opts.Kind == KindBERTClassifier {
		cw, ok := weights[wClassW]
		if !ok {
			cw, ok = weights["bert."+wClassW]
		}
		if !ok || len(cw.Shape) != 2 || cw.Shape[0] <= 0 {
			return nil, bad("classifier: weight %q is missing or not 2-D [labels,%d]", wClassW, h)
		}
		m.nLabels = cw.Shape[0]
		wants = append(wants,
			want{wPoolerW, true, []int{h, h}}, want{wPoolerB, false, []int{h}},
			want{wClassW, true, []int{m.nLabels, h}}, want{wClassB, false, []int{m.nLabels}},
		)
		m.labels = labels(cfg.ID2Label, m.nLabels)
	}
	for _, w := range wants {
		if err := use(w.name, w.matmul, w.shape...); err != nil {
			return nil, err
		}
	}
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		p := fmt.Sprintf(layerName, l)
		m.weights[p+lQKVW] = stack(h, m.weights[p+lQW], m.weights[p+lKW], m.weights[p+lVW])
		m.weights[p+lQKVB] = stack(1, m.weights[p+lQB], m.weights[p+lKB], m.weights[p+lVB])
		m.mm[p+lQKVW] = true
		for _, name := range []string{lQW, lKW, lVW, lQB, lKB, lVB} {
			delete(m.weights, p+name)
			delete(m.mm, p+name)
		}
	}
	return m, nil
}

// stack concatenates row-major tensors of cols columns along their rows.
func stack(cols int, ts ...Tensor) Tensor {
	var data []float32
	for _, t := range ts {
		data = append(data, t.Data...)
	}
	if cols == 1 {
		return Tensor{Shape: []int{len(data)}, Data: data}
	}
	return Tensor{Shape: []int{len(data) / cols, cols}, Data: data}
}

// labels orders id2label by id; nil unless it names exactly ids 0..n-1.
func labels(id2label map[string]string, n int) []string {
	if len(id2label) != n {
		return nil
	}
	out := make([]string, n)
	for k, v := range id2label {
		i, err := strconv.Atoi(k)
		if err != nil || i < 0 || i >= n || out[i] != "" {
			return nil
		}
		out[i] = v
	}
	return out
}

// Info describes the model: text in (BYTES), an embedding or logits out.
func (m *BERT) Info() Info {
	out := TensorSpec{Name: "embedding", DType: "FP32", Shape: []int64{-1, int64(m.cfg.HiddenSize)}}
	dim := m.cfg.HiddenSize
	if m.opts.Kind == KindBERTClassifier {
		out = TensorSpec{Name: "logits", DType: "FP32", Shape: []int64{-1, int64(m.nLabels)}}
		dim = m.nLabels
	}
	return Info{
		Name: m.opts.Name, Version: m.opts.Version, Kind: m.opts.Kind,
		Inputs:         []TensorSpec{{Name: "text", DType: "BYTES", Shape: []int64{-1}}},
		Outputs:        []TensorSpec{out},
		BaseBatch:      m.opts.BaseBatch,
		MaxBatchTokens: m.opts.MaxBatchTokens,
		MaxSeqLen:      m.cfg.MaxPositionEmbeddings,
		Dim:            dim,
		Labels:         append([]string(nil), m.labels...),
	}
}

// Config returns the model's configuration, defaults filled in.
func (m *BERT) Config() BERTConfig { return m.cfg }

// Options returns the model's options, defaults filled in.
func (m *BERT) Options() BERTOptions { return m.opts }

// Cost is a TextInput's token count (at least 1), so that batches respect
// MaxBatchTokens; 1 for anything else.
func (m *BERT) Cost(payload any) int {
	switch p := payload.(type) {
	case TextInput:
		return max(len(p.IDs), 1)
	case *TextInput:
		if p != nil {
			return max(len(p.IDs), 1)
		}
	}
	return 1
}

// Tokenize builds the payload for text (and pair, "" for none) with the
// model's tokenizer: truncated to MaxSeqLen tokens with truncate, an
// ErrInvalidInput error when longer without. The embedding is normalised
// when normalize is set or the model always normalises
// (BERTOptions.Normalize).
func (m *BERT) Tokenize(ctx context.Context, text, pair string, truncate, normalize bool) (TextInput, error) {
	if m.tok == nil {
		return TextInput{}, fmt.Errorf("bert %q: no tokenizer", m.opts.Name)
	}
	ids, types, cut, err := m.tok.EncodeTruncated(ctx, text, pair, m.cfg.MaxPositionEmbeddings, truncate)
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return TextInput{}, fmt.Errorf("bert %q: tokenize: %w", m.opts.Name, err)
	}
	if err != nil {
		return TextInput{}, fmt.Errorf("%w: bert %q: tokenize: %w", ErrInvalidInput, m.opts.Name, err)
	}
	in := TextInput{IDs: ids, TypeIDs: types, Normalize: normalize || m.opts.Normalize, Truncated: cut}
	if err := m.check(in); err != nil {
		return TextInput{}, fmt.Errorf("bert %q: tokenize: %w", m.opts.Name, err)
	}
	return in, nil
}

// check validates a payload against the vocabulary and the position table.
func (m *BERT) check(in TextInput) error {
	n := len(in.IDs)
	if n == 0 {
		return fmt.Errorf("%w: no tokens", ErrInvalidInput)
	}
	if n > m.cfg.MaxPositionEmbeddings {
		return fmt.Errorf("%w: %d tokens, at most %d", ErrInvalidInput, n, m.cfg.MaxPositionEmbeddings)
	}
	if in.TypeIDs != nil && len(in.TypeIDs) != n {
		return fmt.Errorf("%w: %d token type ids for %d tokens", ErrInvalidInput, len(in.TypeIDs), n)
	}
	for i, id := range in.IDs {
		if id < 0 || int(id) >= m.cfg.VocabSize {
			return fmt.Errorf("%w: token %d is id %d, outside the vocabulary of %d", ErrInvalidInput, i, id, m.cfg.VocabSize)
		}
	}
	for i, t := range in.TypeIDs {
		if t < 0 || int(t) >= m.cfg.TypeVocabSize {
			return fmt.Errorf("%w: token %d has type id %d, want below %d", ErrInvalidInput, i, t, m.cfg.TypeVocabSize)
		}
	}
	return nil
}

// MemoryBytes is the weights (matmul weights in dt) plus one run's buffers
// for maxBatch sequences of MaxSeqLen tokens. oneDNN's own scratchpad is
// not in it.
func (m *BERT) MemoryBytes(dt runtime.DType, maxBatch int) int64 {
	if dt != runtime.BF16 {
		dt = runtime.F32
	}
	b, s := max(maxBatch, 1), m.cfg.MaxPositionEmbeddings
	// A packed run of full-length sequences holds the most at once.
	ws := max(m.graph(dt, b, s, 0, true).workspace(), m.graph(dt, b, s, b*s, true).workspace())
	return weightBytes(m.weights, m.mm, dt) + ws
}

// Buffer names of the BERT graph's inputs and outputs.
const (
	bIDs    = "ids"    // I32 [B,S] token ids, 0 on padding; packed: [T]
	bTypes  = "types"  // I32 [B,S] token type ids; packed: [T]
	bPos    = "pos"    // I32 [B,S] position ids 0..S-1; packed: [T]
	bMask   = "mask"   // F32 [B,S] 1 on tokens, 0 on padding
	bCLS    = "cls"    // F32 [B,S] 1 on the first token only: pools the [CLS] row
	bToPad  = "topad"  // packed: I32 [B,S] the packed row of each padded position (0 on padding)
	bPack   = "pack"   // packed: I32 [T] the padded position of each packed row
	bPooled = "pooled" // F32 [B,H] encoder output
	bNormed = "normed" // F32 [B,H] pooled, L2-normalised
	bLogits = "logits" // F32 [B,L] classifier output
)

// graph builds the forward pass for b sequences of s tokens (padding
// included); with normalize it also writes the normalised embedding.
//
// With tokens > 0 the graph is packed: the token-wise layers (embeddings,
// projections, feed-forward, layer norms, residuals) run on a [tokens,H]
// matrix of the real tokens only, and only attention and pooling see the
// padded [b,s] layout, reached by gathering rows through bToPad and back
// through bPack. Short texts of mixed lengths waste a fifth or more of a
// padded batch's work on padding; the gathers cost a few row copies.
func (m *BERT) graph(dt runtime.DType, b, s, tokens int, normalize bool) *builder {
	cfg := m.cfg
	h, nh := cfg.HiddenSize, cfg.NumAttentionHeads
	g := newBuilder(dt)
	w := func(name string) string {
		wdt := runtime.F32
		if m.mm[name] {
			wdt = dt
		}
		return g.param(name, wdt, m.weights[name].Shape)
	}
	tokShape := []int{b, s} // the token-wise layers' leading dimensions
	if tokens > 0 {
		tokShape = []int{tokens}
	}
	ids := g.input(bIDs, runtime.I32, tokShape...)
	types := g.input(bTypes, runtime.I32, tokShape...)
	pos := g.input(bPos, runtime.I32, tokShape...)
	mask := g.input(bMask, runtime.F32, b, s)
	bsh := append(slices.Clone(tokShape), h)
	op := func(kind runtime.OpKind, in ...string) runtime.Op { return runtime.Op{Kind: kind, In: in} }
	addOp := func(x, y string) string { return g.add(op(runtime.OpAdd, x, y), runtime.F32, bsh) }
	ln := func(x, gamma, beta string) string {
		o := op(runtime.OpLayerNorm, x, w(gamma), w(beta))
		o.Eps = m.eps
		return g.add(o, runtime.F32, bsh)
	}
	// padded returns token-wise x as [B,S,H]; unpack takes [B,S,H] back.
	padded, unpack := func(x string) string { return x }, func(x string) string { return x }
	if tokens > 0 {
		toPad := g.input(bToPad, runtime.I32, b, s)
		pack := g.input(bPack, runtime.I32, tokens)
		padded = func(x string) string {
			return g.add(op(runtime.OpGather, x, toPad), g.dtype(x), []int{b, s, h})
		}
		unpack = func(x string) string {
			flat := g.add(runtime.Op{Kind: runtime.OpReshape, In: []string{x}, Shape: []int{b * s, h}}, g.dtype(x), []int{b * s, h})
			return g.add(op(runtime.OpGather, flat, pack), g.dtype(x), bsh)
		}
	}

	// Embeddings: word + position + token type, then layer norm.
	we := g.add(op(runtime.OpGather, w(wWord), ids), runtime.F32, bsh)
	pe := g.add(op(runtime.OpGather, w(wPos), pos), runtime.F32, bsh)
	te := g.add(op(runtime.OpGather, w(wType), types), runtime.F32, bsh)
	x := ln(addOp(addOp(we, pe), te), wEmbLNW, wEmbLNB)

	// The fused q|k|v projection and the attention context only feed
	// matmuls: in bf16 mode they are written in bf16 (operandLinear,
	// ctxType), which saves a conversion pass over each.
	ctxType := dt
	if ctxType != runtime.BF16 {
		ctxType = runtime.F32
	}
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		p := fmt.Sprintf(layerName, l)
		qkv := padded(g.operandLinear(x, w(p+lQKVW), w(p+lQKVB), runtime.ActNone))
		merged := g.add(runtime.Op{Kind: runtime.OpAttention, In: []string{qkv, mask}, Heads: nh, DType: productDType(ctxType)},
			ctxType, []int{b, s, h})
		if tokens > 0 {
			merged = unpack(merged)
		}
		// The residual adds ride on the output projections (OpMatMul's In[3]).
		x1 := ln(g.residualLinear(merged, w(p+lAOW), w(p+lAOB), x), p+lAOLNW, p+lAOLNB)
		inter := g.operandLinear(x1, w(p+lIW), w(p+lIB), m.act)
		x = ln(g.residualLinear(inter, w(p+lOW), w(p+lOB), x1), p+lOLNW, p+lOLNB)
	}

	// Pooling. The [CLS] row is a masked mean over a mask that keeps only
	// position 0: exactly that row.
	poolMask := mask
	if m.opts.Kind == KindBERTClassifier || m.opts.Pooling == PoolingCLS {
		poolMask = g.input(bCLS, runtime.F32, b, s)
	}
	x = padded(x)
	if m.opts.Kind == KindBERTClassifier {
		cls := g.add(op(runtime.OpMaskedMeanPool, x, poolMask), runtime.F32, []int{b, h})
		pooled := g.linear(cls, w(wPoolerW), w(wPoolerB), runtime.ActTanh)
		g.linear(pooled, w(wClassW), w(wClassB), runtime.ActNone)
		g.outputLast(bLogits)
		return g
	}
	o := op(runtime.OpMaskedMeanPool, x, poolMask)
	o.Out = bPooled
	g.add(o, runtime.F32, []int{b, h})
	g.output(bPooled)
	if normalize {
		o := op(runtime.OpL2Normalize, bPooled)
		o.Out = bNormed
		g.add(o, runtime.F32, []int{b, h})
		g.output(bNormed)
	}
	return g
}

// NewReplica uploads the weights to dev. On a device computing in bf16 the
// matmul weights are stored in bf16 and every matmul (attention included)
// runs on bf16 operands; where the device cannot, the error wraps
// runtime.ErrUnsupported.
func (m *BERT) NewReplica(ctx context.Context, dev runtime.Device, maxBatch int) (Replica, error) {
	dt := computeType(dev)
	res, err := upload(ctx, dev, dt, m.weights, m.mm)
	if err != nil {
		return nil, fmt.Errorf("bert %q: replica (%s matmuls): %w", m.opts.Name, dt, err)
	}
	maxBatch = max(maxBatch, 1)
	return &bertReplica{m: m, res: res, maxBatch: maxBatch, pad: newPadPlan(dev, maxBatch, m.cfg.MaxPositionEmbeddings)}, nil
}

type bertReplica struct {
	m        *BERT
	res      *resident
	maxBatch int
	pad      padPlan

	// Built graphs by shape: building one and (on the device) planning it
	// cost as much as a small forward pass. Padding to buckets keeps the
	// shapes few; the map is emptied when it reaches maxGraphs.
	mu     sync.Mutex
	graphs map[graphKey]builtGraph
}

const maxGraphs = 64

type graphKey struct {
	b, s, tokens int
	normalize    bool
}

type builtGraph struct {
	b *builder
	g *runtime.Graph
}

// graph returns the cached graph for the shape, building it on a miss. The
// same *runtime.Graph is returned each time, so a device may cache its
// plan too; neither is ever changed.
func (r *bertReplica) graph(k graphKey) builtGraph {
	r.mu.Lock()
	defer r.mu.Unlock()
	if bg, ok := r.graphs[k]; ok {
		return bg
	}
	if r.graphs == nil || len(r.graphs) >= maxGraphs {
		r.graphs = map[graphKey]builtGraph{}
	}
	b := r.m.graph(r.res.dt, k.b, k.s, k.tokens, k.normalize)
	bg := builtGraph{b: b, g: &runtime.Graph{Ops: b.ops}}
	r.graphs[k] = bg
	return bg
}

// WarmUp encodes one one-token text and drops the result, so that the
// device packs the matmul weights into its kernels' layout before a
// request waits on it (runtime/onednn packs them on their first product,
// whatever its shape, and keeps them so): about 60 ms for a 12 MB f32
// BERT on two cores.
func (r *bertReplica) WarmUp(ctx context.Context) error {
	_, err := r.Execute(ctx, []any{TextInput{IDs: []int32{0}}})
	return err
}

func (r *bertReplica) Close() error {
	r.res.close()
	return nil
}

// Execute encodes (or classifies) TextInput payloads. Sequences are sorted
// by length and run in batches of at most maxBatch. On a device without
// buckets (oneDNN) a batch of mixed lengths runs packed (see graph), its
// attention padded to the longest sequence rounded up to a multiple of
// seqStep; on a device with buckets (PJRT) every layer is padded to the next
// sequence bucket, with rows of padding up to the next batch bucket.
// Padding is masked out of attention and pooling, and padded rows are not
// read back, so an item's output does not depend on the others.
func (r *bertReplica) Execute(ctx context.Context, inputs []any) ([]any, error) {
	m := r.m
	items := make([]TextInput, len(inputs))
	for i, in := range inputs {
		switch x := in.(type) {
		case TextInput:
			items[i] = x
		case *TextInput:
			if x == nil {
				return nil, fmt.Errorf("%w: bert %q: input %d is a nil *TextInput", ErrInvalidInput, m.opts.Name, i)
			}
			items[i] = *x
		default:
			return nil, fmt.Errorf("%w: bert %q: input %d is %T, want models.TextInput", ErrInvalidInput, m.opts.Name, i, in)
		}
		if err := m.check(items[i]); err != nil {
			return nil, fmt.Errorf("bert %q: input %d: %w", m.opts.Name, i, err)
		}
	}
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	// Similar lengths together waste less on padding.
	sort.SliceStable(order, func(a, b int) bool { return len(items[order[a]].IDs) < len(items[order[b]].IDs) })

	r.res.mu.RLock()
	defer r.res.mu.RUnlock()
	if r.res.bufs == nil {
		return nil, ErrClosed
	}
	out := make([]any, len(items))
	for start := 0; start < len(order); start += r.maxBatch {
		idx := order[start:min(start+r.maxBatch, len(order))]
		batch := make([]TextInput, len(idx))
		for i, j := range idx {
			batch[i] = items[j]
		}
		vecs, err := r.batch(ctx, batch)
		if err != nil {
			return nil, fmt.Errorf("bert %q on %s: %w", m.opts.Name, r.res.dev.ID(), err)
		}
		for i, j := range idx {
			out[j] = Output{Values: vecs[i]}
		}
	}
	return out, nil
}

// batch runs one padded batch and returns each item's vector.
func (r *bertReplica) batch(ctx context.Context, items []TextInput) ([][]float32, error) {
	m, dev := r.m, r.res.dev
	n := len(items)
	longest := 0
	normalize := false
	for _, it := range items {
		longest = max(longest, len(it.IDs))
		normalize = normalize || it.Normalize
	}
	// Rows past n are padding: zero ids and an all-zero mask, which the
	// masked softmax and pooling take without NaNs; they are never read.
	b, s := r.pad.rows(n), r.pad.seqLen(longest)
	tokens := 0
	if r.pad.packs() {
		for _, it := range items {
			tokens += len(it.IDs)
		}
		// Equal lengths leave nothing to save: the gathers would be
		// pure cost.
		if tokens = r.pad.tokenRows(tokens); tokens >= b*s {
			tokens = 0
		}
	}
	bg := r.graph(graphKey{b, s, tokens, normalize})
	g := bg.b
	in := newBERTInputs(items, b, s, tokens)

	io := map[string]runtime.Buffer{}
	defer func() {
		for _, buf := range io {
			dev.Free(buf)
		}
	}()
	for name := range g.bound {
		v := g.vals[name]
		buf, err := dev.Alloc(v.dt, v.shape...)
		if err != nil {
			return nil, err
		}
		io[name] = buf
	}
	var err error
	for name, vals := range map[string][]int32{bIDs: in.ids, bTypes: in.types, bPos: in.pos, bToPad: in.toPad, bPack: in.pack} {
		if _, ok := io[name]; ok && err == nil {
			err = dev.CopyInInt32(ctx, io[name], vals)
		}
	}
	for name, vals := range map[string][]float32{bMask: in.mask, bCLS: in.cls} {
		if _, ok := io[name]; ok && err == nil {
			err = dev.CopyIn(ctx, io[name], vals)
		}
	}
	if err != nil {
		return nil, err
	}
	if err := r.res.run(ctx, bg.g, io); err != nil {
		return nil, err
	}

	read := func(name string) ([]float32, int, error) {
		v := g.vals[name]
		buf := make([]float32, v.shape[0]*v.shape[1])
		return buf, v.shape[1], dev.CopyOut(ctx, buf, io[name])
	}
	if m.opts.Kind == KindBERTClassifier {
		logits, width, err := read(bLogits)
		if err != nil {
			return nil, err
		}
		return split(logits, n, width), nil
	}
	pooled, width, err := read(bPooled)
	if err != nil {
		return nil, err
	}
	vecs := split(pooled, n, width)
	if normalize {
		normed, _, err := read(bNormed)
		if err != nil {
			return nil, err
		}
		for i, it := range items {
			if it.Normalize {
				vecs[i] = normed[i*width : (i+1)*width : (i+1)*width]
			}
		}
	}
	return vecs, nil
}

// bertInputs are one batch's host inputs: padded [b,s] ids, types and
// positions, or with tokens > 0 packed [tokens] ones with the maps between
// the two layouts; the [b,s] masks either way.
type bertInputs struct {
	ids, types, pos []int32
	toPad, pack     []int32
	mask, cls       []float32
}

func newBERTInputs(items []TextInput, b, s, tokens int) bertInputs {
	in := bertInputs{mask: make([]float32, b*s), cls: make([]float32, b*s)}
	rows := b * s
	if tokens > 0 {
		rows = tokens
		// Padded positions read packed row 0 (any real row would do: the
		// mask hides them from attention and pooling). Packed rows past
		// the real tokens (the row count's rounding) read position 0.
		in.toPad, in.pack = make([]int32, b*s), make([]int32, tokens)
	}
	in.ids, in.types, in.pos = make([]int32, rows), make([]int32, rows), make([]int32, rows)
	if tokens == 0 {
		for i := range rows {
			in.pos[i] = int32(i % s)
		}
	}
	next := 0 // packed rows used
	for i, it := range items {
		at := i * s
		if tokens > 0 {
			at = next
		}
		copy(in.ids[at:], it.IDs)
		copy(in.types[at:], it.TypeIDs)
		for j := range it.IDs {
			in.mask[i*s+j] = 1
			if tokens > 0 {
				in.pos[at+j] = int32(j)
				in.toPad[i*s+j] = int32(at + j)
				in.pack[at+j] = int32(i*s + j)
			}
		}
		in.cls[i*s] = 1
		next += len(it.IDs)
	}
	return in
}

// split returns the first rows rows of v, rows of n values: the real items
// of a batch that may have padded rows after them.
func split(v []float32, rows, n int) [][]float32 {
	out := make([][]float32, rows)
	for i := range out {
		out[i] = slices.Clip(v[i*n : (i+1)*n])
	}
	return out
}
