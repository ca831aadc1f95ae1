package repo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/tokenizer"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// brokerdJSON is the optional brokerd.json of a version directory.
type brokerdJSON struct {
	Kind           models.Kind `json:"kind"`
	Pooling        string      `json:"pooling"`
	Normalize      *bool       `json:"normalize"`
	BaseBatch      int         `json:"base_batch"`
	MaxBatchTokens int         `json:"max_batch_tokens"`
}

// mlpJSON is an mlp model's model.json.
type mlpJSON struct {
	Kind   models.Kind `json:"kind"`
	Inputs []struct {
		Name string `json:"name"`
		Dims []int  `json:"dims"`
	} `json:"inputs"`
	Outputs []struct {
		Name string `json:"name"`
	} `json:"outputs"`
	Layers    []models.MLPLayer `json:"layers"`
	BaseBatch int               `json:"base_batch"`
	Labels    []string          `json:"labels"`
}

// configJSON is the part of a Hugging Face config.json read besides
// models.BERTConfig's fields.
type configJSON struct {
	models.BERTConfig
	ModelType             string   `json:"model_type"`
	Architectures         []string `json:"architectures"`
	NumLabels             int      `json:"num_labels"`
	PositionEmbeddingType string   `json:"position_embedding_type"`
}

// plan is a checked version directory, its safetensors file open (header
// read) and the tensors to load, canonical name → name in the file.
type plan struct {
	r        *Repo
	dir      string
	kind     models.Kind
	mlp      *models.MLPSpec
	bert     *models.BERTConfig
	bertOpts models.BERTOptions
	tok      *tokenizer.Tokenizer
	st       *safetensors.File
	tensors  map[string]string
	llm      *llmPlan // a decoder LLM (its weights may be sharded: no st)
}

// close releases the open safetensors or GGUF file, if any.
func (p *plan) close() {
	if p.st != nil {
		_ = p.st.Close()
	}
	if p.llm != nil && p.llm.gguf != nil && p.llm.gguf.file != nil {
		_ = p.llm.gguf.file.Close()
	}
}

// inspect checks a version directory without reading the weights. On
// success the caller closes p.st.
func (r *Repo) inspect(name string, version int64) (*plan, error) {
	dir := filepath.Join(r.dir, name, strconv.FormatInt(version, 10))
	p := &plan{r: r, dir: dir}
	var bj brokerdJSON
	if _, err := p.readJSON(FileBrokerd, &bj, true); err != nil {
		return nil, err
	}
	var err error
	p.kind = bj.Kind
	var ggufPath string
	if p.kind == "" {
		switch {
		case exists(dir, FileMLPSpec):
			p.kind = models.KindMLP
		case exists(dir, FileConfig):
			p.kind = "" // from config.json's architectures, below
		default:
			if ggufPath, err = ggufFile(dir); err != nil {
				return nil, err
			}
			if ggufPath == "" {
				return nil, fmt.Errorf("%w: %s: no %s (mlp), %s (bert, llm) or .gguf file (llm)", ErrInvalid, dir, FileMLPSpec, FileConfig)
			}
			p.kind = llm.KindLLM
		}
	}
	if p.kind == "" && isLLM(p.configArchitectures()) {
		p.kind = llm.KindLLM
	}
	switch p.kind {
	case models.KindMLP:
		err = p.inspectMLP(bj)
	case "", models.KindBERT, models.KindBERTClassifier:
		err = p.inspectBERT(bj)
	case llm.KindLLM:
		if ggufPath != "" {
			p.llm, err = p.inspectGGUF(ggufPath)
		} else {
			p.llm, err = p.inspectLLM()
		}
	default:
		err = fmt.Errorf("%w: %s: unknown kind %q (mlp, bert, bert-classifier, llm)", models.ErrInvalidConfig, filepath.Join(dir, FileBrokerd), p.kind)
	}
	if err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// readJSON decodes dir/file into v. A missing file is (false, nil) when
// optional; strict refuses unknown fields (brokerd's own files, where a
// typo should not pass silently).
func (p *plan) readJSON(file string, v any, strict bool) (bool, error) {
	path := filepath.Join(p.dir, file)
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	b, err := p.r.readFile(path, maxJSONBytes)
	if err != nil {
		return true, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return true, fmt.Errorf("%w: %s: %v", kindOf(file), path, err)
	}
	return true, nil
}

// exists reports whether dir holds an entry named file, whatever it is: the
// reads that follow say what is wrong with one that is not a regular file.
func exists(dir, file string) bool {
	_, err := os.Lstat(filepath.Join(dir, file))
	return err == nil
}

// openWeights opens model.safetensors, saying what to do about the formats
// that are not read.
func (p *plan) openWeights() error {
	path := filepath.Join(p.dir, FileWeights)
	if !exists(p.dir, FileWeights) {
		switch {
		case exists(p.dir, fileShardsIndex):
			return fmt.Errorf("%w: %s: sharded checkpoints (%s) are not supported; merge the shards into one %s", ErrInvalid, p.dir, fileShardsIndex, FileWeights)
		case exists(p.dir, fileTorch):
			return fmt.Errorf("%w: %s: %s (pickle) is not loaded; convert it to %s", ErrInvalid, p.dir, fileTorch, FileWeights)
		}
		return fmt.Errorf("%w: %s is missing", ErrInvalid, path)
	}
	if _, err := p.r.regular(path, 0); err != nil {
		return err
	}
	st, err := safetensors.Open(path)
	if err != nil {
		return err
	}
	p.st = st
	p.tensors = map[string]string{}
	return nil
}

// want records that canonical tensor canon, stored as file, is needed with
// the given shape (nil: any), and checks its header entry.
func (p *plan) want(canon, file string, shape []int) error {
	ti, ok := p.st.Info(file)
	if !ok {
		return fmt.Errorf("%w: %s: tensor %q is missing", safetensors.ErrInvalid, p.st.Path(), file)
	}
	switch ti.DType {
	case "F32", "F16", "BF16", "F64":
	default:
		return fmt.Errorf("%w: %s: tensor %q has dtype %s, want F32, F16 or BF16", safetensors.ErrInvalid, p.st.Path(), file, ti.DType)
	}
	if shape != nil && !equalShape(ti.Shape, shape) {
		return fmt.Errorf("%w: %s: tensor %q has shape %v, want %v", safetensors.ErrInvalid, p.st.Path(), file, ti.Shape, shape)
	}
	p.tensors[canon] = file
	return nil
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (p *plan) inspectMLP(bj brokerdJSON) error {
	path := filepath.Join(p.dir, FileMLPSpec)
	var mj mlpJSON
	found, err := p.readJSON(FileMLPSpec, &mj, true)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: %s is missing", ErrInvalid, path)
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", models.ErrInvalidConfig, path, fmt.Sprintf(format, a...))
	}
	if mj.Kind != "" && mj.Kind != models.KindMLP {
		return bad("kind %q, want mlp", mj.Kind)
	}
	if len(mj.Inputs) != 1 {
		return bad("%d inputs, want 1", len(mj.Inputs))
	}
	in := mj.Inputs[0]
	if len(in.Dims) != 1 || in.Dims[0] <= 0 {
		return bad("input %q: dims %v, want [width] (the batch dimension is implicit)", in.Name, in.Dims)
	}
	if len(mj.Outputs) > 1 {
		return bad("%d outputs, want 1", len(mj.Outputs))
	}
	if len(mj.Layers) == 0 {
		return bad("no layers")
	}
	spec := &models.MLPSpec{Input: in.Name, InputDim: in.Dims[0], Layers: mj.Layers, BaseBatch: mj.BaseBatch, Labels: mj.Labels}
	if len(mj.Outputs) == 1 {
		spec.Output = mj.Outputs[0].Name
	}
	if bj.BaseBatch > 0 {
		spec.BaseBatch = bj.BaseBatch
	}
	if err := p.openWeights(); err != nil {
		return err
	}
	// Check the chain of widths on the header, so that List reports a bad
	// model without reading its weights.
	width := in.Dims[0]
	for i, l := range mj.Layers {
		switch l.Type {
		case models.LayerLinear:
			if l.Weight == "" {
				return bad("layer %d (linear): no weight", i)
			}
			ti, ok := p.st.Info(l.Weight)
			if !ok {
				return fmt.Errorf("%w: %s: tensor %q (layer %d) is missing", safetensors.ErrInvalid, p.st.Path(), l.Weight, i)
			}
			if len(ti.Shape) != 2 {
				return fmt.Errorf("%w: %s: tensor %q (layer %d, linear) has shape %v, want [out, %d]", safetensors.ErrInvalid, p.st.Path(), l.Weight, i, ti.Shape, width)
			}
			out := ti.Shape[0]
			if err := p.want(l.Weight, l.Weight, []int{out, width}); err != nil {
				return err
			}
			if l.Bias != "" {
				if err := p.want(l.Bias, l.Bias, []int{out}); err != nil {
					return err
				}
			}
			width = out
		case models.LayerLayerNorm:
			if l.Weight == "" || l.Bias == "" {
				return bad("layer %d (layernorm): needs weight and bias", i)
			}
			if !(l.Eps >= 0) {
				return bad("layer %d (layernorm): eps %g", i, l.Eps)
			}
			if err := p.want(l.Weight, l.Weight, []int{width}); err != nil {
				return err
			}
			if err := p.want(l.Bias, l.Bias, []int{width}); err != nil {
				return err
			}
		case models.LayerReLU, models.LayerGELU, models.LayerTanh, models.LayerSoftmax:
			if l.Weight != "" || l.Bias != "" {
				return bad("layer %d (%s) takes no weights", i, l.Type)
			}
		default:
			return bad("layer %d: unknown type %q (linear, relu, gelu, tanh, layernorm, softmax)", i, l.Type)
		}
	}
	if len(mj.Labels) > 0 && len(mj.Labels) != width {
		return bad("%d labels for an output of width %d", len(mj.Labels), width)
	}
	p.mlp = spec
	return nil
}
