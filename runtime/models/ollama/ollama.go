// Package ollama reads Ollama's model store, read-only: the manifests
// under manifests/<host>/<namespace>/<model>/<tag> and the blobs they name
// (blobs/sha256-<hex>): a model's GGUF file, its params (default options),
// system prompt, Go text/template, licenses and messages. Models are named
// as Ollama names them (qwen2.5:0.5b, myuser/mymodel:latest,
// hf.co/org/repo:Q4_K_M) and looked up in every form Ollama accepts.
//
// The store is data, not trusted code: every file is read only if it is a
// regular file inside the store, the small ones up to a limit, their JSON
// strictly, and every blob's digest and size are checked against the
// manifest (the small layers' contents when read, the GGUF's with Verify,
// before first use). A manifest that cannot be used is that model's error,
// never the store's.
package ollama

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/brokerd/brokerd/runtime/models"
)

// Errors. ErrInvalid, ErrUnsupported and ErrCorrupt are model errors: they
// match models.ErrInvalidModel (INVALID_ARGUMENT at the edge, the
// model's problem, not the daemon's).
var (
	// ErrNotFound: no manifest has the name (or it is no Ollama name).
	ErrNotFound = errors.New("not in the Ollama store")
	// ErrInvalid: a manifest or a blob it names cannot be used (missing,
	// not a regular file, too large, a link out of the store, malformed,
	// a digest or size that does not match).
	ErrInvalid = models.InvalidModelKind("invalid Ollama model")
	// ErrUnsupported: a well-formed model brokerd does not serve (a cloud
	// model, Ollama's safetensors format, a LoRA adapter).
	ErrUnsupported = models.InvalidModelKind("unsupported Ollama model")
	// ErrCorrupt: a blob's sha256 is not its digest.
	ErrCorrupt = models.InvalidModelKind("corrupt Ollama blob")
)

// Layer media types (Ollama's server/images.go).
const (
	MediaModel     = "application/vnd.ollama.image.model"
	MediaParams    = "application/vnd.ollama.image.params"
	MediaTemplate  = "application/vnd.ollama.image.template"
	MediaPrompt    = "application/vnd.ollama.image.prompt" // the template's old name
	MediaSystem    = "application/vnd.ollama.image.system"
	MediaLicense   = "application/vnd.ollama.image.license"
	MediaMessages  = "application/vnd.ollama.image.messages"
	MediaAdapter   = "application/vnd.ollama.image.adapter"
	MediaProjector = "application/vnd.ollama.image.projector"
	MediaTensor    = "application/vnd.ollama.image.tensor" // Ollama's safetensors models: one layer a tensor
)

// Limits bound what the store's files may make the reader read and hold.
// A zero field takes its default.
type Limits struct {
	// ManifestBytes is the largest manifest read (default 1 MiB; Ollama's
	// are under 2 KiB).
	ManifestBytes int64
	// LayerBytes is the largest params, template, system, license,
	// messages or config blob read (default 1 MiB).
	LayerBytes int64
	// ModelBytes bounds all of one model's small layers together (default
	// 4 MiB).
	ModelBytes int64
	// Manifests is the most manifests List reads (default 4096); past it
	// List ends with an entry saying so.
	Manifests int
}

// Defaults of Limits.
const (
	DefaultManifestBytes = 1 << 20
	DefaultLayerBytes    = 1 << 20
	DefaultModelBytes    = 4 << 20
	DefaultManifests     = 4096
)

func (l Limits) withDefaults() (Limits, error) {
	if l.ManifestBytes < 0 || l.LayerBytes < 0 || l.ModelBytes < 0 || l.Manifests < 0 {
		return l, fmt.Errorf("ollama: negative limits %+v", l)
	}
	if l.ManifestBytes == 0 {
		l.ManifestBytes = DefaultManifestBytes
	}
	if l.LayerBytes == 0 {
		l.LayerBytes = DefaultLayerBytes
	}
	if l.ModelBytes == 0 {
		l.ModelBytes = DefaultModelBytes
	}
	if l.Manifests == 0 {
		l.Manifests = DefaultManifests
	}
	return l, nil
}

// Store is an Ollama model store opened read-only. It is safe for
// concurrent use; it reads the disk on every List and Lookup (Ollama may
// pull or remove models meanwhile), and remembers only which GGUF blobs
// Verify has verified.
type Store struct {
	dir  string // as given
	root string // its links resolved
	lim  Limits

	mu       sync.Mutex
	verified map[blobKey]struct{}
	inflight map[string]*verification // by path
}

// Open opens the store in dir (Ollama's OLLAMA_MODELS, ~/.ollama/models by
// default: the directory holding manifests/ and blobs/). An empty store,
// or one with no manifests/ yet, is fine; a dir that is not a directory,
// or Ollama's home (~/.ollama, whose models/ is the store), is an error.
func Open(dir string, lim Limits) (*Store, error) {
	lim, err := lim.withDefaults()
	if err != nil {
		return nil, err
	}
	if dir == "" {
		return nil, errors.New("ollama: no store directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("ollama: store %s: %w", dir, err)
	}
	root, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("ollama: store %s: %w", dir, err)
	}
	st, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("ollama: store %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("ollama: store %s is not a directory", dir)
	}
	if !exists(filepath.Join(root, "manifests")) && !exists(filepath.Join(root, "blobs")) && exists(filepath.Join(root, "models", "manifests")) {
		return nil, fmt.Errorf("ollama: %s holds no manifests/ but models/manifests/: the store is %s", dir, filepath.Join(dir, "models"))
	}
	return &Store{dir: abs, root: root, lim: lim, verified: map[blobKey]struct{}{}, inflight: map[string]*verification{}}, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Dir is the store's directory as given to Open, made absolute.
func (s *Store) Dir() string { return s.dir }

// Model is one manifest of the store, read.
type Model struct {
	// Name is the name as Ollama shows it (Ref.Short()): qwen2.5:0.5b,
	// myuser/mymodel:latest, hf.co/org/repo:Q4_K_M. For a manifest whose
	// path is no Ollama name, its path under manifests/ (and Err says so).
	Name string
	// Ref is the name's parts (zero when the path is no name).
	Ref Name
	// Manifest is the manifest file's path; ManifestDigest the hex sha256
	// of its bytes, Ollama's model ID (the digest of /api/tags, the ID of
	// `ollama list`); ModTime its modification time (Ollama's
	// modified_at).
	Manifest       string
	ManifestDigest string
	ModTime        time.Time

	// Path is the GGUF blob (the model layer), Size its bytes as the
	// manifest states them and the blob is, Digest "sha256:<hex>". The
	// blob's contents are checked by Verify.
	Path   string
	Size   int64
	Digest string

	// Details are the config blob's descriptions (empty without one).
	Details Details
	// Params is the params layer (nothing set without one).
	Params Params
	// System is the system prompt layer ("" without one).
	System string
	// Template is the template layer, Ollama's Go text/template kept as
	// text ("" without one, where Ollama uses "{{ .Prompt }}"): for a
	// GGUF with no tokenizer.chat_template.
	Template string
	// License holds the license layers' texts.
	License []string
	// Messages are the messages layer's (a Modelfile's MESSAGE lines): a
	// conversation Ollama puts before a chat's.
	Messages []Message
	// Projectors are the projector layers (a vision model's image
	// encoder), stated and checked but not read.
	Projectors []Blob

	// Err is why the model cannot be used (ErrInvalid, ErrUnsupported),
	// naming the file; the fields above are what could be read.
	Err error
}

// Details are Ollama's descriptions of a model (its config blob).
type Details struct {
	Format            string   // model_format: gguf
	Family            string   // model_family: llama, qwen2, ...
	Families          []string // model_families
	ParameterSize     string   // model_type: 494.03M
	QuantizationLevel string   // file_type: Q4_K_M
}

// Message is one message of a messages layer.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Blob is a layer's blob.
type Blob struct {
	Path   string
	Size   int64
	Digest string // sha256:<hex>
}

// manifest is Ollama's manifest (Docker's image manifest v2).
type manifest struct {
	SchemaVersion int     `json:"schemaVersion"`
	MediaType     string  `json:"mediaType"`
	Config        layer   `json:"config"`
	Layers        []layer `json:"layers"`
}

type layer struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	From      string `json:"from"`
	Name      string `json:"name"`
}

// config is the config blob (Ollama's model.ConfigV2), the fields read.
type config struct {
	ModelFormat   string   `json:"model_format"`
	ModelFamily   string   `json:"model_family"`
	ModelFamilies []string `json:"model_families"`
	ModelType     string   `json:"model_type"`
	FileType      string   `json:"file_type"`
	RemoteHost    string   `json:"remote_host"`
	RemoteModel   string   `json:"remote_model"`
}

// maxLicenses bounds a manifest's license layers.
const maxLicenses = 16

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// modelError is a model's error: the kind's words, the model's name, then
// what is wrong (naming the file).
type modelError struct {
	name string
	err  error
}

func (e *modelError) Error() string {
	msg := e.err.Error()
	for _, k := range []error{ErrInvalid, ErrUnsupported, ErrCorrupt} {
		if w := k.Error() + ": "; strings.HasPrefix(msg, w) {
			return w + e.name + ": " + msg[len(w):]
		}
	}
	return e.name + ": " + msg
}

func (e *modelError) Unwrap() error { return e.err }

func (m *Model) fail(err error) Model {
	m.Err = &modelError{name: m.Name, err: err}
	return *m
}

// Lookup reads the model of a name in any form Ollama accepts (qwen2.5 is
// qwen2.5:latest; library/qwen2.5:0.5b; registry.ollama.ai/library/
// qwen2.5:0.5b; myuser/mymodel; hf.co/org/repo:Q4_K_M), ignoring case
// where the exact name is not there, as Ollama matches names. The error is
// ErrNotFound when no manifest has the name, else the model's Err (the
// Model returned with it).
func (s *Store) Lookup(name string) (Model, error) {
	n, err := ParseName(name)
	if err != nil {
		return Model{}, err
	}
	path := filepath.Join(s.root, "manifests", n.filepath())
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		found, err := s.foldLookup(n)
		if err != nil {
			return Model{}, err
		}
		n, path = found, filepath.Join(s.root, "manifests", found.filepath())
	}
	m := s.load(n, path)
	return m, m.Err
}

// foldLookup finds the one manifest whose name equals n ignoring case.
func (s *Store) foldLookup(n Name) (Name, error) {
	notFound := fmt.Errorf("%w: %s", ErrNotFound, n.Short())
	dirs := []string{filepath.Join(s.root, "manifests")}
	var names [][]string
	names = append(names, nil)
	for _, want := range []string{n.Host, n.Namespace, n.Model, n.Tag} {
		var nextDirs []string
		var nextNames [][]string
		for i, d := range dirs {
			if _, err := s.inside(d); err != nil {
				continue
			}
			des, err := readDir(d, s.lim.Manifests+1)
			if err != nil {
				continue
			}
			for _, de := range des {
				if strings.EqualFold(de.Name(), want) {
					nextDirs = append(nextDirs, filepath.Join(d, de.Name()))
					nextNames = append(nextNames, append(slices.Clone(names[i]), de.Name()))
				}
			}
		}
		dirs, names = nextDirs, nextNames
	}
	switch len(dirs) {
	case 0:
		return Name{}, notFound
	case 1:
		p := names[0]
		return Name{Host: p[0], Namespace: p[1], Model: p[2], Tag: p[3]}, nil
	}
	var all []string
	for _, p := range names {
		all = append(all, Name{Host: p[0], Namespace: p[1], Model: p[2], Tag: p[3]}.Short())
	}
	return Name{}, fmt.Errorf("%w: %s matches %d models ignoring case (%s): name one exactly", ErrNotFound, n.Short(), len(all), strings.Join(all, ", "))
}

// List reads every manifest of the store, sorted by name; one that
// cannot be used is listed with its Err. Files and directories whose names
// start with a dot are skipped.
func (s *Store) List() []Model {
	var out []Model
	base := filepath.Join(s.root, "manifests")
	if _, err := os.Lstat(base); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	count := 0
	full := false
	var walk func(dir string, parts []string)
	walk = func(dir string, parts []string) {
		if full {
			return
		}
		relName := strings.Join(parts, "/")
		if relName == "" {
			relName = "manifests"
		}
		bad := func(err error) {
			m := Model{Name: relName, Manifest: dir}
			out = append(out, m.fail(err))
		}
		if _, err := s.inside(dir); err != nil {
			bad(err)
			return
		}
		des, err := readDir(dir, s.lim.Manifests+1)
		if err != nil {
			bad(fmt.Errorf("%w: %s: %s", ErrInvalid, s.rel(dir), errText(err)))
			return
		}
		for _, de := range des {
			if strings.HasPrefix(de.Name(), ".") {
				continue
			}
			path := filepath.Join(dir, de.Name())
			p := append(slices.Clone(parts), de.Name())
			st, err := os.Stat(path) // links followed: walk and load check where they lead
			isDir := err == nil && st.IsDir()
			if len(p) < 4 {
				switch {
				case isDir:
					walk(path, p)
					if full {
						return
					}
				case de.Type()&fs.ModeSymlink != 0:
					// A dangling link, a loop, or a link out of the store.
					if _, err := s.inside(path); err != nil {
						m := Model{Name: strings.Join(p, "/"), Manifest: path}
						out = append(out, m.fail(err))
					}
				}
				continue // files above the manifests' depth are not manifests
			}
			if isDir {
				continue // Ollama reads the files four deep only
			}
			if count++; count > s.lim.Manifests {
				full = true
				m := Model{Name: "manifests", Manifest: base}
				out = append(out, m.fail(fmt.Errorf("%w: more than %d manifests: the rest are not listed", ErrInvalid, s.lim.Manifests)))
				return
			}
			n := Name{Host: p[0], Namespace: p[1], Model: p[2], Tag: p[3]}
			if err := n.check(); err != nil {
				m := Model{Name: strings.Join(p, "/"), Manifest: path}
				out = append(out, m.fail(fmt.Errorf("%w: %s is no Ollama model name: %w", ErrInvalid, s.rel(path), err)))
				continue
			}
			out = append(out, s.load(n, path))
		}
	}
	walk(base, nil)
	slices.SortStableFunc(out, func(a, b Model) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// readDir reads at most max entries of dir, sorted by name.
func readDir(dir string, max int) ([]fs.DirEntry, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("not a directory (%s)", st.Mode().Type())
	}
	des, err := f.ReadDir(max)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	slices.SortFunc(des, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return des, nil
}

// load reads the manifest at path, named n.
func (s *Store) load(n Name, path string) Model {
	m := Model{Name: n.Short(), Ref: n, Manifest: path}
	b, st, err := s.readFile(path, s.lim.ManifestBytes)
	if err != nil {
		return m.fail(err)
	}
	m.ModTime = st.ModTime()
	sum := sha256.Sum256(b)
	m.ManifestDigest = hex.EncodeToString(sum[:])
	mf, err := parseManifest(b)
	if err != nil {
		return m.fail(fmt.Errorf("%w: %s: %w", ErrInvalid, s.rel(path), err))
	}
	budget := s.lim.ModelBytes
	small := func(l layer, what string) ([]byte, error) {
		limit := min(s.lim.LayerBytes, budget)
		if l.Size > limit && budget < s.lim.LayerBytes {
			return nil, fmt.Errorf("%w: the %s layer %s is %d bytes, more than the %d left of the %d all of a model's small layers may be", ErrInvalid, what, blobName(l.Digest), l.Size, limit, s.lim.ModelBytes)
		}
		if l.Size > limit {
			return nil, fmt.Errorf("%w: the %s layer %s is %d bytes, more than the %d it may be", ErrInvalid, what, blobName(l.Digest), l.Size, limit)
		}
		b, err := s.blob(l, limit)
		if err != nil {
			return nil, err
		}
		budget -= int64(len(b))
		return b, nil
	}
	text := func(l layer, what string) (string, error) {
		b, err := small(l, what)
		if err != nil {
			return "", err
		}
		if !utf8.Valid(b) {
			return "", fmt.Errorf("%w: the %s layer %s is not UTF-8 text", ErrInvalid, what, blobName(l.Digest))
		}
		return string(b), nil
	}

	if mf.Config.Digest != "" {
		b, err := small(mf.Config, "config")
		if err != nil {
			return m.fail(err)
		}
		var c config
		if err := strictJSON(b, &c); err != nil {
			return m.fail(fmt.Errorf("%w: the config %s: %w", ErrInvalid, blobName(mf.Config.Digest), err))
		}
		m.Details = Details{Format: c.ModelFormat, Family: c.ModelFamily, Families: c.ModelFamilies, ParameterSize: c.ModelType, QuantizationLevel: c.FileType}
		if c.RemoteHost != "" || c.RemoteModel != "" {
			return m.fail(fmt.Errorf("%w: a cloud model (served by %s), with no weights in the store", ErrUnsupported, cmpOr(c.RemoteHost, "a remote host")))
		}
		if c.ModelFormat != "" && !strings.EqualFold(c.ModelFormat, "gguf") {
			return m.fail(fmt.Errorf("%w: model_format %q: brokerd reads Ollama's GGUF models", ErrUnsupported, c.ModelFormat))
		}
	}

	seen := map[string]bool{}
	tensors := 0
	for _, l := range mf.Layers {
		switch l.MediaType {
		case MediaModel, MediaParams, MediaTemplate, MediaPrompt, MediaSystem, MediaMessages:
			kind := l.MediaType
			if kind == MediaPrompt {
				kind = MediaTemplate
			}
			if seen[kind] {
				return m.fail(fmt.Errorf("%w: %s: two %s layers", ErrInvalid, s.rel(path), strings.TrimPrefix(kind, "application/vnd.ollama.image.")))
			}
			seen[kind] = true
		}
		switch l.MediaType {
		case MediaModel:
			real, err := s.checkBlob(l)
			if err != nil {
				return m.fail(err)
			}
			m.Path, m.Size, m.Digest = real, l.Size, l.Digest
		case MediaProjector:
			real, err := s.checkBlob(l)
			if err != nil {
				return m.fail(err)
			}
			m.Projectors = append(m.Projectors, Blob{Path: real, Size: l.Size, Digest: l.Digest})
		case MediaAdapter:
			return m.fail(fmt.Errorf("%w: a LoRA adapter layer (%s), which brokerd does not apply", ErrUnsupported, blobName(l.Digest)))
		case MediaParams:
			b, err := small(l, "params")
			if err != nil {
				return m.fail(err)
			}
			if m.Params, err = parseParams(b); err != nil {
				return m.fail(fmt.Errorf("%w: the params layer %s: %w", ErrInvalid, blobName(l.Digest), err))
			}
		case MediaTemplate, MediaPrompt:
			if m.Template, err = text(l, "template"); err != nil {
				return m.fail(err)
			}
		case MediaSystem:
			if m.System, err = text(l, "system"); err != nil {
				return m.fail(err)
			}
		case MediaLicense:
			if len(m.License) == maxLicenses {
				return m.fail(fmt.Errorf("%w: %s: more than %d license layers", ErrInvalid, s.rel(path), maxLicenses))
			}
			t, err := text(l, "license")
			if err != nil {
				return m.fail(err)
			}
			m.License = append(m.License, t)
		case MediaMessages:
			b, err := small(l, "messages")
			if err != nil {
				return m.fail(err)
			}
			if err := strictJSON(b, &m.Messages); err != nil {
				return m.fail(fmt.Errorf("%w: the messages layer %s: %w", ErrInvalid, blobName(l.Digest), err))
			}
			for _, msg := range m.Messages {
				if !utf8.ValidString(msg.Role) || !utf8.ValidString(msg.Content) {
					return m.fail(fmt.Errorf("%w: the messages layer %s is not UTF-8 text", ErrInvalid, blobName(l.Digest)))
				}
			}
		case MediaTensor:
			tensors++
		}
	}
	if m.Path == "" {
		if tensors > 0 {
			return m.fail(fmt.Errorf("%w: %d safetensors tensor layers and no GGUF (Ollama's safetensors format): brokerd reads Ollama's GGUF models", ErrUnsupported, tensors))
		}
		return m.fail(fmt.Errorf("%w: %s has no model layer (%s)", ErrInvalid, s.rel(path), MediaModel))
	}
	return m
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// parseManifest reads a manifest and checks every layer's digest and size.
func parseManifest(b []byte) (manifest, error) {
	var mf manifest
	if err := strictJSON(b, &mf); err != nil {
		return manifest{}, err
	}
	if mf.SchemaVersion != 2 {
		return manifest{}, fmt.Errorf("schemaVersion %d: want 2", mf.SchemaVersion)
	}
	check := func(what string, l layer) error {
		if !digestRE.MatchString(l.Digest) {
			return fmt.Errorf("%s: digest %s: want sha256: and 64 lowercase hex digits", what, strconvQuote(l.Digest))
		}
		if l.Size < 0 {
			return fmt.Errorf("%s %s: size %d", what, l.Digest, l.Size)
		}
		return nil
	}
	if mf.Config.Digest != "" || mf.Config.Size != 0 {
		if err := check("config", mf.Config); err != nil {
			return manifest{}, err
		}
	}
	for i, l := range mf.Layers {
		if err := check(fmt.Sprintf("layer %d (%s)", i, strconvQuote(l.MediaType)), l); err != nil {
			return manifest{}, err
		}
	}
	return mf, nil
}

func strconvQuote(s string) string { return fmt.Sprintf("%q", clip([]byte(s))) }

// blobName is a digest's blob, as messages name it.
func blobName(digest string) string { return "blobs/" + strings.Replace(digest, ":", "-", 1) }

// blobPath is a (checked) digest's blob.
func (s *Store) blobPath(digest string) string {
	return filepath.Join(s.root, "blobs", strings.Replace(digest, ":", "-", 1))
}

// checkBlob checks that l's blob is a regular file inside the store of
// l's size, and returns its real path.
func (s *Store) checkBlob(l layer) (string, error) {
	p := s.blobPath(l.Digest)
	real, err := s.inside(p)
	if err != nil {
		return "", err
	}
	st, err := s.stat(real, -1)
	if err != nil {
		return "", err
	}
	if st.Size() != l.Size {
		why := ""
		if st.Size() < l.Size {
			why = " (a partial download?)"
		}
		return "", fmt.Errorf("%w: %s is %d bytes, the manifest says %d%s", ErrInvalid, blobName(l.Digest), st.Size(), l.Size, why)
	}
	return real, nil
}

// blob reads l's blob (at most limit bytes), checking its size and
// sha256.
func (s *Store) blob(l layer, limit int64) ([]byte, error) {
	b, _, err := s.readFile(s.blobPath(l.Digest), limit)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != l.Size {
		return nil, fmt.Errorf("%w: %s is %d bytes, the manifest says %d", ErrInvalid, blobName(l.Digest), len(b), l.Size)
	}
	if got := sha256.Sum256(b); "sha256:"+hex.EncodeToString(got[:]) != l.Digest {
		return nil, fmt.Errorf("%w: %s has sha256 %x, not its name's", ErrCorrupt, blobName(l.Digest), got)
	}
	return b, nil
}
