package ollama

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime/models"
)

// A store laid out as Ollama lays it out: blobs/sha256-<hex> and
// manifests/<host>/<namespace>/<model>/<tag>, written the way Ollama's
// manifest.WriteManifest and NewLayer write them.

const (
	dockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
	dockerConfig   = "application/vnd.docker.container.image.v1+json"
)

// ollamaTemplate is Qwen2.5's template as Ollama ships it (shortened).
const ollamaTemplate = `{{- if .Messages }}
{{- if or .System .Tools }}<|im_start|>system
{{- if .System }}
{{ .System }}
{{- end }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
<|im_start|>{{ .Role }}
{{ .Content }}{{ if not $last }}<|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_end|>
<|im_start|>assistant
{{ end }}
{{- end }}
{{- else }}
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ end }}{{ .Response }}{{ if .Response }}<|im_end|>{{ end }}`

const ollamaSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

const ollamaParams = `{"repeat_penalty":1,"stop":["<|im_start|>","<|im_end|>"],"temperature":0.6,"top_k":20,"top_p":0.95,"num_ctx":4096,"seed":-1,"min_p":0,"mirostat":0}`

type store struct {
	t   testing.TB
	dir string
}

func newStore(t testing.TB) *store {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"manifests", "blobs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &store{t: t, dir: dir}
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// blob writes b as a blob and returns its layer.
func (s *store) blob(mediaType string, b []byte) layer {
	s.t.Helper()
	d := digestOf(b)
	if err := os.WriteFile(s.blobPath(d), b, 0o644); err != nil {
		s.t.Fatal(err)
	}
	return layer{MediaType: mediaType, Digest: d, Size: int64(len(b))}
}

func (s *store) blobPath(digest string) string {
	return filepath.Join(s.dir, "blobs", strings.Replace(digest, ":", "-", 1))
}

// config writes a config blob as Ollama writes it.
func (s *store) config(format, family, size, quant string) layer {
	c := map[string]any{"model_format": format, "model_family": family, "model_families": []string{family},
		"model_type": size, "file_type": quant, "architecture": "amd64", "os": "linux",
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{}}}
	b, _ := json.Marshal(c)
	return s.blob(dockerConfig, b)
}

// manifest writes the manifest of name (host/namespace/model/tag) and
// returns its path.
func (s *store) manifest(name string, config layer, layers ...layer) string {
	s.t.Helper()
	m := manifest{SchemaVersion: 2, MediaType: dockerManifest, Config: config, Layers: layers}
	b, err := json.Marshal(m)
	if err != nil {
		s.t.Fatal(err)
	}
	return s.raw(name, b)
}

// raw writes bytes as the manifest of name.
func (s *store) raw(name string, b []byte) string {
	s.t.Helper()
	p := filepath.Join(s.dir, "manifests", filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		s.t.Fatal(err)
	}
	return p
}

func (s *store) open(lim Limits) *Store {
	s.t.Helper()
	st, err := Open(s.dir, lim)
	if err != nil {
		s.t.Fatal(err)
	}
	return st
}

var (
	ggufOnce  sync.Once
	ggufBytes []byte
	ggufErr   error
)

// tinyGGUF is a small Qwen2 GGUF (random weights) written by modelkit.
func tinyGGUF(t testing.TB) []byte {
	t.Helper()
	ggufOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ollama-gguf")
		if err != nil {
			ggufErr = err
			return
		}
		defer os.RemoveAll(dir)
		tok, st := filepath.Join(dir, "tok"), filepath.Join(dir, "st")
		for _, d := range []string{tok, st} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				ggufErr = err
				return
			}
		}
		if ggufErr = modelkit.WriteByteTokenizer(tok, "{% for m in messages %}{{ m.content }}{% endfor %}"); ggufErr != nil {
			return
		}
		if _, ggufErr = modelkit.WriteLLM(st, modelkit.LLM{Arch: "qwen2", Layers: 1, Hidden: 32, Heads: 2, KVHeads: 1, Intermediate: 48,
			MaxPositions: 128, DType: "f32", Seed: 3, TokenizerDir: tok}); ggufErr != nil {
			return
		}
		path := filepath.Join(dir, "model.gguf")
		if _, ggufErr = modelkit.WriteGGUF(st, path, "f16"); ggufErr != nil {
			return
		}
		ggufBytes, ggufErr = os.ReadFile(path)
	})
	if ggufErr != nil {
		t.Fatal(ggufErr)
	}
	return ggufBytes
}

// fullModel writes qwen2.5:0.5b as Ollama pulls it: config, GGUF,
// template, system, license and params.
func (s *store) fullModel(name string, gguf []byte) (path string, model layer) {
	s.t.Helper()
	model = s.blob(MediaModel, gguf)
	path = s.manifest(name, s.config("gguf", "qwen2", "494.03M", "Q4_K_M"),
		model,
		s.blob(MediaTemplate, []byte(ollamaTemplate)),
		s.blob(MediaSystem, []byte(ollamaSystem)),
		s.blob(MediaLicense, []byte("Apache License\nVersion 2.0, January 2004\n")),
		s.blob(MediaParams, []byte(ollamaParams)),
	)
	return path, model
}

// checkModelError checks that err is a model error of kind whose message
// holds want and never the store's directory.
func checkModelError(t *testing.T, s *store, err error, kind error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v: %q", kind, want)
	}
	if !errors.Is(err, kind) {
		t.Errorf("error %q is not %v", err, kind)
	}
	if kind != ErrNotFound && !errors.Is(err, models.ErrInvalidModel) {
		t.Errorf("error %q is not models.ErrInvalidModel", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if strings.Contains(err.Error(), s.dir) || strings.Contains(err.Error(), os.TempDir()) {
		t.Errorf("error %q names the store's directory", err)
	}
}
