package repo

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/tokenizer"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// stModule is an entry of sentence-transformers' modules.json.
type stModule struct {
	Path string `json:"path"`
	Type string `json:"type"`
}

// stPooling is sentence-transformers' Pooling config (1_Pooling/config.json).
type stPooling struct {
	CLS          bool `json:"pooling_mode_cls_token"`
	Mean         bool `json:"pooling_mode_mean_tokens"`
	Max          bool `json:"pooling_mode_max_tokens"`
	MeanSqrtLen  bool `json:"pooling_mode_mean_sqrt_len_tokens"`
	WeightedMean bool `json:"pooling_mode_weightedmean_tokens"`
	LastToken    bool `json:"pooling_mode_lasttoken"`
}

func (p *plan) inspectBERT(bj brokerdJSON) error {
	cfgPath := filepath.Join(p.dir, FileConfig)
	var cj configJSON
	found, err := p.readJSON(FileConfig, &cj, false)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: %s is missing", ErrInvalid, cfgPath)
	}
	bad := func(path, format string, a ...any) error { // a configuration file
		return fmt.Errorf("%w: %s: %s", models.ErrInvalidConfig, path, fmt.Sprintf(format, a...))
	}
	if cj.ModelType != "" && cj.ModelType != "bert" {
		return bad(cfgPath, "model_type %q is not supported (bert)", cj.ModelType)
	}
	if cj.PositionEmbeddingType != "" && cj.PositionEmbeddingType != "absolute" {
		return bad(cfgPath, "position_embedding_type %q is not supported (absolute)", cj.PositionEmbeddingType)
	}
	classifier := false
	for _, a := range cj.Architectures {
		if strings.HasSuffix(a, "ForSequenceClassification") {
			classifier = true
		}
	}
	if p.kind == "" {
		p.kind = models.KindBERT
		if classifier {
			p.kind = models.KindBERTClassifier
		}
	}
	cfg := cj.BERTConfig
	if cfg.TypeVocabSize == 0 {
		cfg.TypeVocabSize = 2
	}
	if cfg.LayerNormEps == 0 {
		cfg.LayerNormEps = 1e-12
	}
	for _, f := range []struct {
		key    string
		v, max int
	}{
		{"vocab_size", cfg.VocabSize, maxVocab}, {"hidden_size", cfg.HiddenSize, maxHidden}, {"num_hidden_layers", cfg.NumHiddenLayers, maxLayers},
		{"num_attention_heads", cfg.NumAttentionHeads, maxHeads}, {"intermediate_size", cfg.IntermediateSize, maxInter},
		{"max_position_embeddings", cfg.MaxPositionEmbeddings, maxPositions}, {"type_vocab_size", cfg.TypeVocabSize, maxTypeVocab},
	} {
		if err := bounded(cfgPath, f.key, f.v, f.max); err != nil {
			return err
		}
	}
	if cj.NumLabels < 0 || cj.NumLabels > maxLabels || len(cfg.ID2Label) > maxLabels {
		return bad(cfgPath, "num_labels %d (id2label %d): want at most %d", cj.NumLabels, len(cfg.ID2Label), maxLabels)
	}
	if cfg.HiddenSize%cfg.NumAttentionHeads != 0 {
		return bad(cfgPath, "hidden_size %d is not a multiple of num_attention_heads %d", cfg.HiddenSize, cfg.NumAttentionHeads)
	}
	switch cfg.HiddenAct {
	case "", "gelu", "relu":
	default:
		return bad(cfgPath, "hidden_act %q is not supported (gelu, relu)", cfg.HiddenAct)
	}

	opts := models.BERTOptions{Kind: p.kind, BaseBatch: bj.BaseBatch, MaxBatchTokens: bj.MaxBatchTokens}
	if p.kind == models.KindBERT {
		if err := p.pooling(&opts, bj); err != nil {
			return err
		}
	} else if bj.Pooling != "" || bj.Normalize != nil {
		return bad(filepath.Join(p.dir, FileBrokerd), "pooling and normalize apply to kind bert, not %s", p.kind)
	}

	tokPath := filepath.Join(p.dir, FileTokenizer)
	if !exists(p.dir, FileTokenizer) {
		return fmt.Errorf("%w: %s is missing", models.ErrInvalidTokenizer, tokPath)
	}
	if _, err := p.r.regular(tokPath, maxTokenizerBytes); err != nil {
		return err
	}
	tok, err := tokenizer.Load(tokPath)
	if err != nil {
		return invalid(models.ErrInvalidTokenizer, err)
	}
	if tok.VocabSize() > cfg.VocabSize {
		return fmt.Errorf("%w: %s: token ids reach %d but config.json's vocab_size is %d", models.ErrInvalidTokenizer, tokPath, tok.VocabSize()-1, cfg.VocabSize)
	}

	if err := p.openWeights(); err != nil {
		return err
	}
	// The sizes must fit the weights on disk before per-layer structures
	// are built from them.
	h, l, inter := int64(cfg.HiddenSize), int64(cfg.NumHiddenLayers), int64(cfg.IntermediateSize)
	params := int64(cfg.VocabSize+cfg.MaxPositionEmbeddings+cfg.TypeVocabSize)*h + l*(4*h*h+2*h*inter)
	if size := p.st.Size(); params*minParamBytes > size {
		return bad(cfgPath, "its sizes imply %d parameters, at least %d bytes, but %s is %d bytes", params, params*minParamBytes, FileWeights, size)
	}
	if err := p.bertTensors(cfg, &cj); err != nil {
		return err
	}
	p.bert = &cfg
	p.bertOpts = opts
	p.tok = tok
	return nil
}

// pooling sets an encoder's pooling and normalisation: brokerd.json first,
// then the sentence-transformers modules, else mean pooling without
// normalisation (what sentence-transformers gives a plain BERT checkpoint).
func (p *plan) pooling(opts *models.BERTOptions, bj brokerdJSON) error {
	opts.Pooling = models.PoolingMean
	var mods []stModule
	found, err := p.readJSON(FileSTModules, &mods, false)
	if err != nil {
		return err
	}
	poolDir := ""
	if found {
		for _, m := range mods {
			switch m.Type {
			case "sentence_transformers.models.Pooling":
				poolDir = m.Path
			case "sentence_transformers.models.Normalize":
				opts.Normalize = true
			}
		}
	} else if exists(p.dir, filepath.Join("1_Pooling", "config.json")) {
		poolDir = "1_Pooling"
	}
	if poolDir != "" {
		if !filepath.IsLocal(poolDir) {
			return fmt.Errorf("%w: %s: pooling module path %q is outside the model directory", models.ErrInvalidConfig, filepath.Join(p.dir, FileSTModules), poolDir)
		}
		path := filepath.Join(p.dir, poolDir, "config.json")
		var sp stPooling
		found, err := p.readJSON(filepath.Join(poolDir, "config.json"), &sp, false)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w: %s is missing", models.ErrInvalidConfig, path)
		}
		switch {
		case sp.Max || sp.MeanSqrtLen || sp.WeightedMean || sp.LastToken || sp.CLS == sp.Mean:
			return fmt.Errorf("%w: %s: pooling mode not supported: want exactly one of pooling_mode_cls_token and pooling_mode_mean_tokens", models.ErrInvalidConfig, path)
		case sp.CLS:
			opts.Pooling = models.PoolingCLS
		default:
			opts.Pooling = models.PoolingMean
		}
	}
	switch bj.Pooling {
	case "":
	case models.PoolingMean, models.PoolingCLS:
		opts.Pooling = bj.Pooling
	default:
		return fmt.Errorf("%w: %s: pooling %q (mean, cls)", models.ErrInvalidConfig, filepath.Join(p.dir, FileBrokerd), bj.Pooling)
	}
	if bj.Normalize != nil {
		opts.Normalize = *bj.Normalize
	}
	return nil
}

// canonical maps a checkpoint's tensor name to BertModel's: without the
// "bert." prefix of BertFor* checkpoints, LayerNorm gamma/beta (TF-era
// names) as weight/bias.
func canonical(name string) string {
	name = strings.TrimPrefix(name, "bert.")
	if strings.Contains(name, "LayerNorm.") {
		if s, ok := strings.CutSuffix(name, ".gamma"); ok {
			name = s + ".weight"
		} else if s, ok := strings.CutSuffix(name, ".beta"); ok {
			name = s + ".bias"
		}
	}
	return name
}

// bertTensors finds every tensor the model needs, checks its shape against
// the configuration and records its name in the file.
func (p *plan) bertTensors(cfg models.BERTConfig, cj *configJSON) error {
	byCanon := map[string]string{}
	for _, n := range p.st.Names() {
		c := canonical(n)
		if prev, dup := byCanon[c]; dup {
			return fmt.Errorf("%w: %s: tensors %q and %q are both %q", safetensors.ErrInvalid, p.st.Path(), prev, n, c)
		}
		byCanon[c] = n
	}
	need := func(canon string, shape ...int) error {
		file, ok := byCanon[canon]
		if !ok {
			return fmt.Errorf("%w: %s: tensor %q is missing (also looked for bert.%s)", safetensors.ErrInvalid, p.st.Path(), canon, canon)
		}
		return p.want(canon, file, shape)
	}
	h, inter := cfg.HiddenSize, cfg.IntermediateSize
	type w struct {
		name  string
		shape []int
	}
	ws := []w{
		{"embeddings.word_embeddings.weight", []int{cfg.VocabSize, h}},
		{"embeddings.position_embeddings.weight", []int{cfg.MaxPositionEmbeddings, h}},
		{"embeddings.token_type_embeddings.weight", []int{cfg.TypeVocabSize, h}},
		{"embeddings.LayerNorm.weight", []int{h}},
		{"embeddings.LayerNorm.bias", []int{h}},
	}
	for l := range cfg.NumHiddenLayers {
		pre := fmt.Sprintf("encoder.layer.%d.", l)
		ws = append(ws,
			w{pre + "attention.self.query.weight", []int{h, h}}, w{pre + "attention.self.query.bias", []int{h}},
			w{pre + "attention.self.key.weight", []int{h, h}}, w{pre + "attention.self.key.bias", []int{h}},
			w{pre + "attention.self.value.weight", []int{h, h}}, w{pre + "attention.self.value.bias", []int{h}},
			w{pre + "attention.output.dense.weight", []int{h, h}}, w{pre + "attention.output.dense.bias", []int{h}},
			w{pre + "attention.output.LayerNorm.weight", []int{h}}, w{pre + "attention.output.LayerNorm.bias", []int{h}},
			w{pre + "intermediate.dense.weight", []int{inter, h}}, w{pre + "intermediate.dense.bias", []int{inter}},
			w{pre + "output.dense.weight", []int{h, inter}}, w{pre + "output.dense.bias", []int{h}},
			w{pre + "output.LayerNorm.weight", []int{h}}, w{pre + "output.LayerNorm.bias", []int{h}},
		)
	}
	if p.kind == models.KindBERTClassifier {
		labels := cj.NumLabels
		if labels == 0 {
			labels = len(cfg.ID2Label)
		}
		if file, ok := byCanon["classifier.weight"]; ok && labels == 0 {
			if ti, _ := p.st.Info(file); len(ti.Shape) == 2 {
				labels = ti.Shape[0] // neither num_labels nor id2label: trust the head
			}
		}
		if labels <= 0 {
			return fmt.Errorf("%w: %s: a classifier needs num_labels or id2label", models.ErrInvalidConfig, filepath.Join(p.dir, FileConfig))
		}
		ws = append(ws,
			w{"pooler.dense.weight", []int{h, h}}, w{"pooler.dense.bias", []int{h}},
			w{"classifier.weight", []int{labels, h}}, w{"classifier.bias", []int{labels}},
		)
	}
	for _, x := range ws {
		if err := need(x.name, x.shape...); err != nil {
			return err
		}
	}
	return nil
}
