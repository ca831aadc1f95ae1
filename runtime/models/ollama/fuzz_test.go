package ollama

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
)

// FuzzManifest reads a store whose manifest is arbitrary bytes, beside
// blobs that exist (a model, a config, params, template, system, license,
// messages): every outcome is a model whose GGUF blob is a regular file of
// the stated size inside the store, or a model error (matching
// models.ErrInvalidModel) that does not name the store's directory; List
// and Lookup agree; nothing panics or reads past a limit.
func FuzzManifest(f *testing.F) {
	s := newStore(f)
	model := s.blob(MediaModel, []byte("GGUF fuzzed weights"))
	cfg := s.config("gguf", "qwen2", "1M", "Q8_0")
	params := s.blob(MediaParams, []byte(ollamaParams))
	tmpl := s.blob(MediaTemplate, []byte(ollamaTemplate))
	sys := s.blob(MediaSystem, []byte(ollamaSystem))
	lic := s.blob(MediaLicense, []byte("MIT"))
	msgs := s.blob(MediaMessages, []byte(`[{"role":"user","content":"hi"}]`))
	seed := func(config layer, layers ...layer) []byte {
		b, _ := json.Marshal(manifest{SchemaVersion: 2, MediaType: dockerManifest, Config: config, Layers: layers})
		return b
	}
	f.Add(seed(cfg, model, params, tmpl, sys, lic, msgs))
	f.Add(seed(layer{}, model))
	f.Add(seed(cfg, model, model))
	f.Add(seed(cfg, params))
	f.Add(seed(cfg, layer{MediaType: MediaModel, Digest: model.Digest, Size: model.Size + 1}))
	f.Add(seed(cfg, layer{MediaType: MediaModel, Digest: "sha256:" + hex64, Size: 1}))
	f.Add(seed(cfg, layer{MediaType: MediaModel, Digest: "sha256:../../blobs", Size: 1}))
	f.Add(seed(cfg, model, layer{MediaType: MediaAdapter, Digest: lic.Digest, Size: lic.Size}))
	f.Add(seed(cfg, model, layer{MediaType: MediaParams, Digest: tmpl.Digest, Size: tmpl.Size}))
	f.Add([]byte(`{"schemaVersion":2,"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"` + model.Digest + `","size":19}],"layers":[]}`))
	f.Add([]byte(`{"schemaVersion":2,"layers":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`))
	f.Add([]byte(`{"schemaVersion":2.5}`))
	f.Add([]byte(`[]`))
	f.Add([]byte{})
	st := s.open(Limits{})
	path := filepath.Join(s.dir, "manifests", "registry.ollama.ai", "library", "fuzz", "latest")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := st.Lookup("fuzz")
		if m.Name != "fuzz:latest" || m.Err != err {
			t.Fatalf("Lookup: %+v, %v", m, err)
		}
		list := st.List()
		if len(list) != 1 || list[0].Name != m.Name || (list[0].Err == nil) != (err == nil) || err != nil && list[0].Err.Error() != err.Error() {
			t.Fatalf("List %+v, Lookup %+v", list, m)
		}
		if err != nil {
			if !errors.Is(err, models.ErrInvalidModel) {
				t.Fatalf("error %v is not a model error", err)
			}
			if strings.Contains(err.Error(), s.dir) {
				t.Fatalf("error %q names the store", err)
			}
			return
		}
		fi, err := os.Lstat(m.Path)
		if err != nil || !fi.Mode().IsRegular() || fi.Size() != m.Size || !digestRE.MatchString(m.Digest) ||
			!strings.HasPrefix(m.Path, filepath.Join(s.dir, "blobs")+string(filepath.Separator)) {
			t.Fatalf("model %+v: blob %v, %v", m, fi, err)
		}
		if m.Digest != model.Digest {
			t.Fatalf("model layer %s, the store has one model blob %s", m.Digest, model.Digest)
		}
	})
}

// FuzzParseName: a name that parses has parts Ollama accepts, its
// manifest path stays four deep under manifests/, and its short and full
// forms parse back to it.
func FuzzParseName(f *testing.F) {
	for _, s := range []string{"qwen2.5", "qwen2.5:0.5b", "library/qwen2.5", "registry.ollama.ai/library/qwen2.5:0.5b", "hf.co/org/repo:Q4_K_M",
		"https://localhost:5000/a/b:c", "../x", "a/../b", "a:b:c", "a//b", "", ":", "x/y/z/w"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseName(s)
		if err != nil {
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("ParseName(%q): %v", s, err)
			}
			return
		}
		if err := n.check(); err != nil {
			t.Fatalf("ParseName(%q) = %+v: %v", s, n, err)
		}
		p := n.filepath()
		if filepath.IsAbs(p) || strings.Count(p, string(filepath.Separator)) != 3 || filepath.Clean(p) != p {
			t.Fatalf("ParseName(%q): path %q", s, p)
		}
		for _, part := range strings.Split(p, string(filepath.Separator)) {
			if part == "." || part == ".." || part == "" {
				t.Fatalf("ParseName(%q): path %q", s, p)
			}
		}
		if back, err := ParseName(n.String()); err != nil || back != n {
			t.Fatalf("ParseName(%q) = %+v; its String %q parses to %+v, %v", s, n, n.String(), back, err)
		}
		if back, err := ParseName(n.Short()); err != nil || !back.EqualFold(n) {
			t.Fatalf("ParseName(%q) = %+v; its Short %q parses to %+v, %v", s, n, n.Short(), back, err)
		}
	})
}

// FuzzParams: a params layer is typed or refused, never a panic.
func FuzzParams(f *testing.F) {
	f.Add([]byte(ollamaParams))
	f.Add([]byte(`{"num_ctx":4096.0,"seed":-1,"stop":[],"use_mmap":true}`))
	f.Add([]byte(`{"top_k":1e400}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseParams(b)
		if err != nil {
			return
		}
		if len(p.Stop) > maxStops {
			t.Fatalf("%d stops", len(p.Stop))
		}
	})
}
