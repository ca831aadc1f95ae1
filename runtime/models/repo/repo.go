// Package repo is brokerd's model repository: a directory with one
// subdirectory per model and numbered version directories inside
// (DIR/NAME/VERSION/). It finds models and versions, checks them, and loads
// a version's weights, configuration and tokenizer into a Loaded, from which
// Model builds the runtime model. The layout and the files of each kind are
// described in README.md beside this file.
package repo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/ollama"
	"github.com/brokerd/brokerd/runtime/models/tokenizer"
)

// ErrNotFound means no such model or version in the repository (NOT_FOUND at
// the edge).
var ErrNotFound = errors.New("model not found")

// ErrInvalid means a model's files are not usable (INVALID_ARGUMENT at the
// edge). It is models.ErrInvalidModel: every error of a kind that says what
// is wrong (models.ErrInvalidConfig, ErrInvalidTokenizer, ...,
// safetensors.ErrInvalid; errors.go) matches it, and the model's layout
// (a file missing, not regular, too large, a link out of the repository or
// in a loop) is ErrInvalid itself, "invalid model".
var ErrInvalid = models.ErrInvalidModel

// Files of a version directory.
const (
	FileBrokerd     = "brokerd.json"      // optional overrides, any kind
	FileMLPSpec     = "model.json"        // mlp
	FileWeights     = "model.safetensors" // all kinds
	FileConfig      = "config.json"       // bert, bert-classifier (Hugging Face)
	FileTokenizer   = "tokenizer.json"    // bert, bert-classifier (Hugging Face)
	FileSTModules   = "modules.json"      // sentence-transformers pipeline
	fileShardsIndex = "model.safetensors.index.json"
	fileTorch       = "pytorch_model.bin"
)

// Repo is a model repository. It holds no state besides its directory and
// reads the disk on every call, so models added or changed on disk are seen
// by the next List or Load. Safe for concurrent use.
type Repo struct {
	dir        string
	root       string // dir with its links resolved: files must stay inside it
	log        *zap.Logger
	tokenizers TokenizerLoader // LLM tokenizers; nil: LLMs load without one
	maxContext int             // caps LLMs' context below max_position_embeddings; 0: none
	ollama     *ollama.Store   // Ollama's store, served beside the repository (nil: none)

	ggufTemplatesMu sync.Mutex
	ggufTemplates   map[string]string // store blobs' chat templates (ollamaTemplate)

	// listMu serialises List, which keeps in listed its inspections by
	// "name/version" while the version's files are unchanged (their
	// fingerprint). List is called for every request naming a model not
	// loaded, and inspecting a GGUF parses its whole header (a
	// vocabulary: megabytes): a burst of such requests waits for one
	// inspection instead of making one each.
	listMu sync.Mutex
	listed map[string]listedVersion
}

// listedVersion is what List found of a version whose files had
// fingerprint fp.
type listedVersion struct {
	fp      string
	kind    models.Kind
	details Details
	err     error
}

// WithMaxContext caps decoder LLMs' context length (tokens): Llama 3.2
// states 131072 positions, whose KV cache for one sequence would take
// gigabytes.
func WithMaxContext(n int) Option { return func(r *Repo) { r.maxContext = n } }

// Option configures Open.
type Option func(*Repo)

// WithTokenizerLoader reads decoder LLMs' tokenizers and chat templates.
func WithTokenizerLoader(l TokenizerLoader) Option { return func(r *Repo) { r.tokenizers = l } }

// Open returns the repository at dir, which must be a directory.
func Open(dir string, log *zap.Logger, opts ...Option) (*Repo, error) {
	if log == nil {
		log = zap.NewNop()
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("model repository: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("model repository %s is not a directory", dir)
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("model repository: %w", err)
	}
	r := &Repo{dir: dir, root: root, log: log}
	for _, o := range opts {
		o(r)
	}
	return r, nil
}

// Dir is the repository's directory.
func (r *Repo) Dir() string { return r.dir }

// Entry is one model of the repository as List sees it.
type Entry struct {
	Name string
	// Kind is the kind of the highest version that checks ("" when none).
	Kind models.Kind
	// Versions are the numbered version directories, ascending.
	Versions []int64
	// Errs holds, for each version that does not check, the reason. Checking
	// reads the configuration, the tokenizer and the safetensors header, not
	// the weights.
	Errs map[int64]error
	// Err is why the whole model cannot load (its directory links outside
	// the repository); nil otherwise.
	Err error
	// Details describe the highest version that checks (zero when none).
	Details Details
}

// Details describe a model's files, as Ollama's /api/tags and /api/show
// and `brokerctl models` show them.
type Details struct {
	// Format is "gguf" or "safetensors" (empty for brokerd's own kinds).
	Format string
	// Family is the architecture: llama, qwen2, qwen3, bert, ...
	Family string
	// Parameters counts the weights' elements (a GGUF's tensors; a
	// safetensors LLM's from its config).
	Parameters int64
	// ParameterSize is Parameters as Ollama writes it ("494.03M"), or
	// an Ollama store's own.
	ParameterSize string
	// Quantization is the file's type (Q4_K_M, Q8_0, F16, BF16, F32).
	Quantization string
	// FileBytes is the size of the weight files.
	FileBytes int64
	// ContextLength is the positions the model states.
	ContextLength int
	// ChatTemplate is the chat template the model renders: a GGUF's Jinja
	// tokenizer.chat_template; for an Ollama store model without one, its
	// template layer (a Go text/template; "" for other models).
	ChatTemplate string
	// System is a store model's system layer, Params its params layer
	// (Ollama's /api/show and Modelfile print them).
	System string
	Params []Param
	// File is the weights' file a Modelfile's FROM names, relative as
	// errors name files (data-plane clients see it): a GGUF version's file
	// under the repository, a store model's blob under the store
	// (blobs/sha256-<hex>); "" otherwise.
	File string
	// ModTime is when the version's files last changed.
	ModTime time.Time
	// Digest identifies the version's files (Ollama's /api/tags digest):
	// a store model's manifest digest (hex sha256 of the manifest, as
	// Ollama lists it); else the version's fingerprint (a hash of its
	// files' paths, sizes and modification times, not of their contents).
	Digest string
}

// Param is one default option of a model: a name (stop, temperature,
// ...) and its value as JSON.
type Param struct{ Name, Value string }

// parameterSize writes a count as Ollama does (its format.HumanNumber).
func parameterSize(n int64) string {
	switch {
	case n >= 1e9:
		return strconv.FormatFloat(float64(n)/1e9, 'f', 1, 64) + "B"
	case n >= 1e6:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 2, 64) + "M"
	case n >= 1e3:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 2, 64) + "K"
	}
	return strconv.FormatInt(n, 10)
}

// details describes a checked version's files.
func (p *plan) details() Details {
	if p.llm == nil {
		return Details{ModTime: newestFile(p.dir)}
	}
	lp := p.llm
	d := Details{Format: "safetensors", ContextLength: lp.config.MaxPositionEmbeddings, Parameters: configParams(lp.config)}
	if len(lp.config.Architectures) == 1 {
		for g, hf := range ggufArchitectures {
			if hf == lp.config.Architectures[0] {
				d.Family = g
			}
		}
	}
	if gp := lp.gguf; gp != nil {
		d.Format, d.Quantization, d.FileBytes, d.ChatTemplate = "gguf", gp.fileType, gp.file.Size, gp.vocab.ChatTemplate
		if rel, err := filepath.Rel(p.r.dir, gp.path); err == nil && filepath.IsLocal(rel) {
			d.File = rel
		}
		d.Parameters = 0
		for i := range gp.file.Tensors {
			d.Parameters += gp.file.Tensors[i].Elements()
		}
	} else {
		for _, s := range lp.shards {
			if st, err := os.Stat(s); err == nil {
				d.FileBytes += st.Size()
			}
		}
	}
	d.ParameterSize = parameterSize(d.Parameters)
	d.ModTime = newestFile(p.dir)
	return d
}

// newestFile is the latest modification time of dir's files (zero when
// none can be read).
func newestFile(dir string) time.Time {
	var t time.Time
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		if info, err := de.Info(); err == nil && info.ModTime().After(t) {
			t = info.ModTime()
		}
	}
	return t
}

// Loadable lists the versions without an error, ascending.
func (e Entry) Loadable() []int64 {
	var out []int64
	for _, v := range e.Versions {
		if e.Errs[v] == nil {
			out = append(out, v)
		}
	}
	return out
}

// List returns the models of the repository, sorted by name. Hidden entries
// and plain files are skipped.
func (r *Repo) List() []Entry {
	des, err := os.ReadDir(r.dir)
	if err != nil {
		r.log.Warn("cannot read the model repository", zap.String("dir", r.dir), zap.Error(err))
		return nil
	}
	r.listMu.Lock()
	defer r.listMu.Unlock()
	prev, seen := r.listed, map[string]listedVersion{}
	var out []Entry
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if err := r.modelDir(name); err != nil {
			if de.Type()&os.ModeSymlink != 0 {
				// A link is listed with why it is not loaded, not hidden.
				out = append(out, Entry{Name: name, Err: r.relative(err)})
			}
			continue
		}
		e := Entry{Name: name, Versions: r.versions(name)}
		for i := len(e.Versions) - 1; i >= 0; i-- {
			v := e.Versions[i]
			key := name + "/" + strconv.FormatInt(v, 10)
			lv := r.listVersion(name, v, prev[key])
			if lv.fp != "" {
				seen[key] = lv
			}
			if lv.err != nil {
				if e.Errs == nil {
					e.Errs = map[int64]error{}
				}
				e.Errs[v] = lv.err
				continue
			}
			if e.Kind == "" {
				e.Kind, e.Details = lv.kind, lv.details
			}
		}
		out = append(out, e)
	}
	r.listed = seen
	taken := map[string]bool{}
	for _, e := range out {
		taken[e.Name] = true
	}
	return append(out, r.ollamaEntries(taken)...)
}

// listVersion inspects a version for List, or returns what was found
// before (was) if its files' fingerprint is the same. The fingerprint is
// taken first: files changed while they are inspected are inspected again
// next time. A version whose fingerprint cannot be taken is not kept.
func (r *Repo) listVersion(name string, v int64, was listedVersion) listedVersion {
	fp, err := r.fingerprintOf(name, v)
	if err != nil {
		fp = ""
	}
	if fp != "" && fp == was.fp {
		return was
	}
	lv := listedVersion{fp: fp}
	p, err := r.inspect(name, v)
	if err != nil {
		lv.err = r.relative(err)
		return lv
	}
	lv.kind, lv.details = p.kind, p.details()
	lv.details.Digest = fp // the fingerprint is the digest (none when it could not be taken)
	p.close()
	return lv
}

// versions lists the numbered (positive integer) subdirectories of a model.
func (r *Repo) versions(name string) []int64 {
	des, err := os.ReadDir(filepath.Join(r.dir, name))
	if err != nil {
		return nil
	}
	var vs []int64
	for _, de := range des {
		v, err := strconv.ParseInt(de.Name(), 10, 64)
		if err != nil || v <= 0 || !de.IsDir() || strconv.FormatInt(v, 10) != de.Name() {
			continue
		}
		vs = append(vs, v)
	}
	slices.Sort(vs)
	return vs
}

// Loaded is a version read from disk: what the model constructors need.
type Loaded struct {
	Name    string
	Version int64
	Kind    models.Kind
	Dir     string // the version directory
	// Fingerprint identifies the files as they were when the load began
	// (Repo.Fingerprint).
	Fingerprint string
	// MLP is the spec of an mlp model (nil otherwise).
	MLP *models.MLPSpec
	// BERT and BERTOptions describe a bert or bert-classifier model.
	BERT        *models.BERTConfig
	BERTOptions models.BERTOptions
	// Tokenizer is the text models' tokenizer (nil for mlp).
	Tokenizer *tokenizer.Tokenizer
	// Weights are float32 tensors under their canonical names: the names of
	// the MLP spec; for BERT, BertModel's names without the "bert." prefix
	// and with LayerNorm gamma/beta renamed weight/bias.
	Weights map[string]models.Tensor
	// Skipped holds the higher versions a Load of version 0 passed over,
	// with the reason.
	Skipped map[int64]error
	// LLM is a decoder LLM (kind llm), served through generation rather
	// than Model.
	LLM *llm.Model
}

// Model builds the runtime model (models.NewMLP or models.NewBERT).
func (l *Loaded) Model() (models.Model, error) {
	var (
		m   models.Model
		err error
	)
	switch l.Kind {
	case models.KindMLP:
		m, err = models.NewMLP(*l.MLP, l.Weights)
	case models.KindBERT, models.KindBERTClassifier:
		m, err = models.NewBERT(*l.BERT, l.Weights, l.Tokenizer, l.BERTOptions)
	case llm.KindLLM:
		return nil, fmt.Errorf("%w: %s: a decoder LLM is served by generation (Loaded.LLM), not as a batch model", ErrInvalid, l.Dir)
	default:
		return nil, fmt.Errorf("%w: %s: kind %q", ErrInvalid, l.Dir, l.Kind)
	}
	if err != nil {
		switch {
		case errors.Is(err, ErrInvalid):
			return nil, invalid("", fmt.Errorf("%s: %w", l.Dir, err))
		case errors.Is(err, models.ErrInvalidInput):
			// The constructors' checks of the weights against the spec.
			return nil, invalid(models.ErrInvalidWeights, fmt.Errorf("%s: %w", l.Dir, err))
		}
		return nil, fmt.Errorf("%s: %w", l.Dir, err)
	}
	return m, nil
}

// Load reads a version of a model: version 0 means the highest one that
// loads, falling back past broken versions (each logged and kept in
// Loaded.Skipped).
func (r *Repo) Load(ctx context.Context, name string, version int64) (*Loaded, error) {
	l, err := r.loadAny(ctx, name, version)
	return l, r.relative(err)
}

func (r *Repo) loadAny(ctx context.Context, name string, version int64) (*Loaded, error) {
	if m, ok := r.ollamaModel(name); ok {
		return r.loadOllama(ctx, m, version)
	}
	if !validName(name) {
		return nil, fmt.Errorf("%w: name %q: want a plain directory name (no separators, not hidden)", ErrInvalid, name)
	}
	if version < 0 {
		return nil, fmt.Errorf("%w: model %q: version %d: want 0 (the highest loadable) or a version number", ErrInvalid, name, version)
	}
	if err := r.modelDir(name); err != nil {
		return nil, err
	}
	vs := r.versions(name)
	if version > 0 {
		if !slices.Contains(vs, version) {
			return nil, fmt.Errorf("%w: model %q has no version %d (versions %v)", ErrNotFound, name, version, vs)
		}
		return r.load(ctx, name, version)
	}
	if len(vs) == 0 {
		return nil, fmt.Errorf("%w: model %q has no numbered version directory", ErrNotFound, name)
	}
	skipped := map[int64]error{}
	var errs []error
	for i := len(vs) - 1; i >= 0; i-- {
		l, err := r.load(ctx, name, vs[i])
		if err == nil {
			if len(skipped) > 0 {
				l.Skipped = skipped
			}
			return l, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		r.log.Warn("model version does not load; trying the one below",
			zap.String("model", name), zap.Int64("version", vs[i]), zap.Error(err))
		skipped[vs[i]] = err
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("model %q: no version loads: %w", name, errors.Join(errs...))
}

// modelDir checks that name is a directory of the repository: a link to a
// directory inside it is one, a link out of it is ErrInvalid (List and Load
// agree on this).
func (r *Repo) modelDir(name string) error {
	path := filepath.Join(r.dir, name)
	if _, err := os.Lstat(path); err != nil {
		return fmt.Errorf("%w: %q is not in the repository", ErrNotFound, name)
	}
	real, err := r.inside(path)
	if err != nil {
		if isNotExist(err) { // a dangling link
			return fmt.Errorf("%w: %q is not in the repository", ErrNotFound, name)
		}
		return fmt.Errorf("model %q: %w", name, err)
	}
	st, err := os.Stat(real)
	if err != nil || !st.IsDir() {
		return fmt.Errorf("%w: %q is not a model directory of the repository", ErrNotFound, name)
	}
	return nil
}

// validName accepts a plain directory name: no separators, no "..", not hidden.
func validName(name string) bool {
	return name != "" && filepath.IsLocal(name) && !strings.ContainsAny(name, `/\`) && !strings.HasPrefix(name, ".")
}

func (r *Repo) load(ctx context.Context, name string, version int64) (*Loaded, error) {
	// Taken before anything is read: files rewritten during the load make
	// the next reload see a change.
	fp, err := r.Fingerprint(name, version)
	if err != nil {
		return nil, err
	}
	p, err := r.inspect(name, version)
	if err != nil {
		return nil, err
	}
	defer p.close()
	if p.llm != nil {
		l, err := r.loadLLM(ctx, p, p.llm, name, version)
		if l != nil {
			l.Fingerprint = fp
		}
		return l, err
	}
	l := &Loaded{
		Name: name, Version: version, Kind: p.kind, Dir: p.dir, Fingerprint: fp,
		MLP: p.mlp, BERT: p.bert, BERTOptions: p.bertOpts, Tokenizer: p.tok,
		Weights: make(map[string]models.Tensor, len(p.tensors)),
	}
	if l.MLP != nil {
		l.MLP.Name, l.MLP.Version = name, version
	}
	if l.BERT != nil {
		l.BERTOptions.Name, l.BERTOptions.Version = name, version
	}
	// Read in file order: sequential reads of a large file.
	order := make([]string, 0, len(p.tensors))
	for canon := range p.tensors {
		order = append(order, canon)
	}
	slices.SortFunc(order, func(a, b string) int {
		ia, _ := p.st.Info(p.tensors[a])
		ib, _ := p.st.Info(p.tensors[b])
		return cmp.Compare(ia.Offsets[0], ib.Offsets[0])
	})
	for _, canon := range order {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t, err := p.st.Float32(p.tensors[canon])
		if err != nil {
			return nil, err
		}
		l.Weights[canon] = t
	}
	r.log.Info("model version loaded", zap.String("model", name), zap.Int64("version", version),
		zap.String("kind", string(p.kind)), zap.Int("tensors", len(l.Weights)))
	return l, nil
}
