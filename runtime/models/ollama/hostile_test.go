package ollama

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const badPath = "registry.ollama.ai/library/bad/latest"

// hex64 is a well-formed digest no blob has.
var hex64 = strings.Repeat("ab", 32)

// TestHostileManifests: a manifest or blob that cannot be used is that
// model's error, of its kind, naming the file relative to the store (never
// the store's directory), in List and Lookup alike, while the store's other
// models list as they are; nothing hangs on a FIFO, follows a link out of
// the store, or reads past a limit.
func TestHostileManifests(t *testing.T) {
	model := func(s *store) layer { return s.blob(MediaModel, []byte("GGUF weights")) }
	withLayers := func(mut func(s *store, ls []layer) []layer) func(s *store) string {
		return func(s *store) string {
			s.manifest(badPath, s.config("gguf", "qwen2", "1M", "Q8_0"), mut(s, []layer{model(s)})...)
			return "bad"
		}
	}
	rawManifest := func(b []byte) func(s *store) string {
		return func(s *store) string { s.raw(badPath, b); return "bad" }
	}
	manifestJSON := func(edit func(m map[string]any)) func(s *store) string {
		return func(s *store) string {
			l := model(s)
			m := map[string]any{"schemaVersion": 2, "mediaType": dockerManifest,
				"config": map[string]any{"mediaType": dockerConfig, "digest": "", "size": 0},
				"layers": []any{map[string]any{"mediaType": l.MediaType, "digest": l.Digest, "size": l.Size}}}
			edit(m)
			b, _ := json.Marshal(m)
			s.raw(badPath, b)
			return "bad"
		}
	}
	setDigest := func(d string) func(s *store) string {
		return manifestJSON(func(m map[string]any) { m["layers"].([]any)[0].(map[string]any)["digest"] = d })
	}
	outside := func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), "secret")
		if err := os.WriteFile(p, []byte("GGUF weights"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mib := 1 << 20

	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, s *store) string // returns the name to look up ("" to skip Lookup)
		kind  error
		want  string
	}{
		{"huge manifest", func(t *testing.T, s *store) string {
			return rawManifest(append([]byte(`{"schemaVersion":2}`), make([]byte, mib)...))(s)
		}, ErrInvalid, "more than the 1048576 it may be"},
		{"deep JSON", func(t *testing.T, s *store) string {
			return rawManifest([]byte(`{"schemaVersion":2,"layers":` + strings.Repeat("[", 200000) + strings.Repeat("]", 200000) + "}"))(s)
		}, ErrInvalid, "nested more than 64 deep"},
		{"deep JSON, truncated", func(t *testing.T, s *store) string {
			return rawManifest([]byte(strings.Repeat(`{"a":`, 50)))(s)
		}, ErrInvalid, "truncated JSON"},
		{"key twice", func(t *testing.T, s *store) string {
			return rawManifest([]byte(`{"schemaVersion":2,"layers":[],"layers":[]}`))(s)
		}, ErrInvalid, `key "layers" twice`},
		{"data after", func(t *testing.T, s *store) string {
			return rawManifest([]byte(`{"schemaVersion":2,"layers":[]} {}`))(s)
		}, ErrInvalid, "data after the value"},
		{"empty", func(t *testing.T, s *store) string { return rawManifest(nil)(s) }, ErrInvalid, "empty"},
		{"array", func(t *testing.T, s *store) string { return rawManifest([]byte(`[]`))(s) }, ErrInvalid, "is a JSON array, not an object"},
		{"null", func(t *testing.T, s *store) string { return rawManifest([]byte(`null`))(s) }, ErrInvalid, "schemaVersion 0: want 2"},
		{"binary", func(t *testing.T, s *store) string { return rawManifest([]byte("\x00\xff GGUF"))(s) }, ErrInvalid, "malformed JSON"},
		{"schema 1", func(t *testing.T, s *store) string {
			return manifestJSON(func(m map[string]any) { m["schemaVersion"] = 1 })(s)
		}, ErrInvalid, "schemaVersion 1: want 2"},
		{"size a string", func(t *testing.T, s *store) string {
			return manifestJSON(func(m map[string]any) { m["layers"].([]any)[0].(map[string]any)["size"] = "12" })(s)
		}, ErrInvalid, `"layers.size" is a JSON string, not an integer`},
		{"layers an object", func(t *testing.T, s *store) string {
			return manifestJSON(func(m map[string]any) { m["layers"] = map[string]any{} })(s)
		}, ErrInvalid, `"layers" is a JSON object, not an array`},
		{"digest not hex", func(t *testing.T, s *store) string { return setDigest("sha256:xyz")(s) }, ErrInvalid, "want sha256: and 64 lowercase hex"},
		{"digest short", func(t *testing.T, s *store) string { return setDigest("sha256:" + hex64[:63])(s) }, ErrInvalid, "want sha256: and 64"},
		{"digest long", func(t *testing.T, s *store) string { return setDigest("sha256:" + hex64 + "0")(s) }, ErrInvalid, "want sha256: and 64"},
		{"digest upper", func(t *testing.T, s *store) string { return setDigest("sha256:" + strings.ToUpper(hex64))(s) }, ErrInvalid, "lowercase"},
		{"digest path", func(t *testing.T, s *store) string { return setDigest("sha256:../../../../etc/passwd")(s) }, ErrInvalid, "want sha256:"},
		{"digest dash", func(t *testing.T, s *store) string { return setDigest("sha256-" + hex64)(s) }, ErrInvalid, "want sha256:"},
		{"digest md5", func(t *testing.T, s *store) string { return setDigest("md5:" + hex64[:32])(s) }, ErrInvalid, "want sha256:"},
		{"digest empty", func(t *testing.T, s *store) string { return setDigest("")(s) }, ErrInvalid, `digest "": want sha256:`},
		{"digest newline", func(t *testing.T, s *store) string { return setDigest("sha256:" + hex64 + "\n")(s) }, ErrInvalid, "want sha256:"},
		{"config digest", func(t *testing.T, s *store) string {
			return manifestJSON(func(m map[string]any) { m["config"] = map[string]any{"digest": "sha256:/etc/passwd", "size": 3} })(s)
		}, ErrInvalid, "config: digest"},
		{"negative size", func(t *testing.T, s *store) string {
			return manifestJSON(func(m map[string]any) { m["layers"].([]any)[0].(map[string]any)["size"] = -1 })(s)
		}, ErrInvalid, "size -1"},
		{"missing blob", func(t *testing.T, s *store) string { return setDigest("sha256:" + hex64)(s) }, ErrInvalid, "blobs/sha256-" + hex64 + " is missing"},
		{"missing config", func(t *testing.T, s *store) string {
			s.manifest(badPath, layer{MediaType: dockerConfig, Digest: "sha256:" + hex64, Size: 10}, model(s))
			return "bad"
		}, ErrInvalid, "blobs/sha256-" + hex64 + " is missing"},
		{"missing params", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				return append(ls, layer{MediaType: MediaParams, Digest: "sha256:" + hex64, Size: 2})
			})(s)
		}, ErrInvalid, "blobs/sha256-" + hex64 + " is missing"},
		{"blob larger than stated", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer { ls[0].Size--; return ls })(s)
		}, ErrInvalid, "is 12 bytes, the manifest says 11"},
		{"blob smaller than stated", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer { ls[0].Size = 1 << 40; return ls })(s)
		}, ErrInvalid, "is 12 bytes, the manifest says 1099511627776 (a partial download?)"},
		{"params size", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				p := s.blob(MediaParams, []byte(`{"top_k":1}`))
				p.Size = 3
				return append(ls, p)
			})(s)
		}, ErrInvalid, "is 11 bytes, the manifest says 3"},
		{"params stated huge", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				p := s.blob(MediaParams, []byte(`{"top_k":1}`))
				p.Size = 1 << 40
				return append(ls, p)
			})(s)
		}, ErrInvalid, "the params layer blobs/sha256-"},
		{"two models", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer { return append(ls, s.blob(MediaModel, []byte("second"))) })(s)
		}, ErrInvalid, "two model layers"},
		{"two templates", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				return append(ls, s.blob(MediaTemplate, []byte("a")), s.blob(MediaPrompt, []byte("b")))
			})(s)
		}, ErrInvalid, "two template layers"},
		{"no model", func(t *testing.T, s *store) string {
			s.manifest(badPath, layer{}, s.blob(MediaSystem, []byte("hi")))
			return "bad"
		}, ErrInvalid, "has no model layer"},
		{"adapter", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer { return append(ls, s.blob(MediaAdapter, []byte("lora"))) })(s)
		}, ErrUnsupported, "LoRA adapter"},
		{"cloud", func(t *testing.T, s *store) string {
			b, _ := json.Marshal(map[string]any{"model_format": "", "remote_host": "https://ollama.com:443", "remote_model": "gpt-oss:20b"})
			s.manifest(badPath, s.blob(dockerConfig, b))
			return "bad"
		}, ErrUnsupported, "a cloud model (served by https://ollama.com:443)"},
		{"safetensors format", func(t *testing.T, s *store) string {
			s.manifest(badPath, s.config("safetensors", "qwen3", "8B", "bf16"), s.blob(MediaTensor, []byte("t")))
			return "bad"
		}, ErrUnsupported, `model_format "safetensors"`},
		{"tensor layers", func(t *testing.T, s *store) string {
			s.manifest(badPath, layer{}, s.blob(MediaTensor, []byte("t1")), s.blob(MediaTensor, []byte("t2")))
			return "bad"
		}, ErrUnsupported, "2 safetensors tensor layers"},
		{"config malformed", func(t *testing.T, s *store) string {
			s.manifest(badPath, s.blob(dockerConfig, []byte(`{"model_format":1}`)), model(s))
			return "bad"
		}, ErrInvalid, `"model_format" is a JSON number, not a string`},
		{"params malformed", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				return append(ls, s.blob(MediaParams, []byte(`{"num_ctx":"big"}`)))
			})(s)
		}, ErrInvalid, "the params layer blobs/sha256-"},
		{"params corrupt", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				p := s.blob(MediaParams, []byte(`{"top_k":1}`))
				if err := os.WriteFile(s.blobPath(p.Digest), []byte(`{"top_k":9}`), 0o644); err != nil {
					t.Fatal(err)
				}
				return append(ls, p)
			})(s)
		}, ErrCorrupt, "not its name's"},
		{"template not UTF-8", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				return append(ls, s.blob(MediaTemplate, []byte("{{ .Prompt }}\xff")))
			})(s)
		}, ErrInvalid, "the template layer blobs/sha256-"},
		{"system too large", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				return append(ls, s.blob(MediaSystem, []byte(strings.Repeat("x", mib+1))))
			})(s)
		}, ErrInvalid, "is 1048577 bytes, more than the 1048576 it may be"},
		{"licenses past the model's budget", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				l := s.blob(MediaLicense, []byte(strings.Repeat("x", mib)))
				return append(ls, l, l, l, l, l)
			})(s)
		}, ErrInvalid, "is 1048576 bytes, more than the 1048389 left of the 4194304 all of a model's small layers may be"},
		{"too many licenses", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				for range maxLicenses + 1 {
					ls = append(ls, s.blob(MediaLicense, []byte("MIT")))
				}
				return ls
			})(s)
		}, ErrInvalid, "more than 16 license layers"},
		{"messages malformed", func(t *testing.T, s *store) string {
			return withLayers(func(s *store, ls []layer) []layer {
				return append(ls, s.blob(MediaMessages, []byte(`{"role":"user"}`)))
			})(s)
		}, ErrInvalid, "the messages layer"},
		{"blob links out", func(t *testing.T, s *store) string {
			secret := outside(t)
			d := digestOf([]byte("GGUF weights"))
			if err := os.Symlink(secret, s.blobPath(d)); err != nil {
				t.Fatal(err)
			}
			s.manifest(badPath, layer{}, layer{MediaType: MediaModel, Digest: d, Size: 12})
			return "bad"
		}, ErrInvalid, "links outside the store"},
		{"blobs/ links out", func(t *testing.T, s *store) string {
			other := t.TempDir()
			old := filepath.Join(s.dir, "blobs")
			if err := os.Rename(old, filepath.Join(other, "blobs")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(other, "blobs"), old); err != nil {
				t.Fatal(err)
			}
			s.manifest(badPath, layer{}, model(s))
			return "bad"
		}, ErrInvalid, "links outside the store"},
		{"blob FIFO", func(t *testing.T, s *store) string {
			d := "sha256:" + hex64
			if err := syscall.Mkfifo(s.blobPath(d), 0o644); err != nil {
				t.Fatal(err)
			}
			s.manifest(badPath, layer{}, layer{MediaType: MediaModel, Digest: d, Size: 12})
			return "bad"
		}, ErrInvalid, "is not a regular file (p"},
		{"params FIFO", func(t *testing.T, s *store) string {
			d := "sha256:" + hex64
			if err := syscall.Mkfifo(s.blobPath(d), 0o644); err != nil {
				t.Fatal(err)
			}
			return withLayers(func(s *store, ls []layer) []layer {
				return append(ls, layer{MediaType: MediaParams, Digest: d, Size: 2})
			})(s)
		}, ErrInvalid, "is not a regular file"},
		{"blob a directory", func(t *testing.T, s *store) string {
			d := "sha256:" + hex64
			if err := os.Mkdir(s.blobPath(d), 0o755); err != nil {
				t.Fatal(err)
			}
			s.manifest(badPath, layer{}, layer{MediaType: MediaModel, Digest: d, Size: 12})
			return "bad"
		}, ErrInvalid, "is not a regular file (d"},
		{"manifest FIFO", func(t *testing.T, s *store) string {
			p := filepath.Join(s.dir, "manifests", filepath.FromSlash(badPath))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
			return "bad"
		}, ErrInvalid, "manifests/" + badPath + " is not a regular file"},
		{"manifest links out", func(t *testing.T, s *store) string {
			other := newStore(t)
			other.manifest(badPath, layer{}, other.blob(MediaModel, []byte("x")))
			p := filepath.Join(s.dir, "manifests", filepath.FromSlash(badPath))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(other.dir, "manifests", filepath.FromSlash(badPath)), p); err != nil {
				t.Fatal(err)
			}
			return "bad"
		}, ErrInvalid, "links outside the store"},
		{"manifest dangling", func(t *testing.T, s *store) string {
			p := filepath.Join(s.dir, "manifests", filepath.FromSlash(badPath))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(s.dir, "nowhere"), p); err != nil {
				t.Fatal(err)
			}
			return "bad"
		}, ErrInvalid, "is missing"},
		{"manifest loop", func(t *testing.T, s *store) string {
			p := filepath.Join(s.dir, "manifests", filepath.FromSlash(badPath))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(p, p); err != nil {
				t.Fatal(err)
			}
			return "bad"
		}, ErrInvalid, "too many links"},
		{"namespace links out", func(t *testing.T, s *store) string {
			other := newStore(t)
			other.manifest("registry.ollama.ai/evil/bad/latest", layer{}, other.blob(MediaModel, []byte("x")))
			if err := os.Symlink(filepath.Join(other.dir, "manifests", "registry.ollama.ai", "evil"), filepath.Join(s.dir, "manifests", "registry.ollama.ai", "evil")); err != nil {
				t.Fatal(err)
			}
			return "evil/bad"
		}, ErrInvalid, "links outside the store"},
		{"no Ollama name", func(t *testing.T, s *store) string {
			s.manifest("registry.ollama.ai/library/bad name/latest", layer{}, model(s))
			return ""
		}, ErrInvalid, "manifests/registry.ollama.ai/library/bad name/latest is no Ollama model name: the model \"bad name\" holds ' '"},
		{"dotted namespace", func(t *testing.T, s *store) string {
			s.manifest("registry.ollama.ai/my.user/m/latest", layer{}, model(s))
			return ""
		}, ErrInvalid, "is no Ollama model name: the namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			s.manifest("registry.ollama.ai/library/good/latest", layer{}, s.blob(MediaModel, []byte("good GGUF")))
			lookup := tc.setup(t, s)
			st := s.open(Limits{})
			list := st.List()
			var bad []Model
			good := false
			for _, m := range list {
				if m.Name == "good:latest" && m.Err == nil {
					good = true
				} else {
					bad = append(bad, m)
				}
			}
			if !good && tc.name != "blobs/ links out" {
				t.Errorf("the good model is not listed: %+v", list)
			}
			if tc.name == "blobs/ links out" {
				bad = bad[:1]
			}
			if len(bad) != 1 {
				t.Fatalf("listed %d bad models, want 1: %+v", len(bad), bad)
			}
			checkModelError(t, s, bad[0].Err, tc.kind, tc.want)
			if lookup == "" {
				return
			}
			m, err := st.Lookup(lookup)
			checkModelError(t, s, err, tc.kind, tc.want)
			if m.Err != err {
				t.Errorf("Lookup: error %v, model's %v", err, m.Err)
			}
			if bad[0].Name == m.Name && err.Error() != bad[0].Err.Error() {
				t.Errorf("Lookup: %v, List: %v", err, bad[0].Err)
			}
			if !strings.HasPrefix(err.Error(), fmt.Sprintf("%v: %s: ", tc.kind, m.Name)) {
				t.Errorf("error %q does not lead with its kind and the model's name %s", err, m.Name)
			}
		})
	}
}

// TestLinksInside: links that stay inside the store are followed (a blob
// linked to another blob, a namespace directory linked to another).
func TestLinksInside(t *testing.T) {
	s := newStore(t)
	real := s.blob(MediaModel, []byte("GGUF weights"))
	other := "sha256:" + hex64
	if err := os.Symlink(filepath.Base(s.blobPath(real.Digest)), s.blobPath(other)); err != nil {
		t.Fatal(err)
	}
	s.manifest("registry.ollama.ai/library/m/latest", layer{}, layer{MediaType: MediaModel, Digest: other, Size: 12})
	if err := os.Symlink("library", filepath.Join(s.dir, "manifests", "registry.ollama.ai", "alias")); err != nil {
		t.Fatal(err)
	}
	st := s.open(Limits{})
	for _, name := range []string{"m", "alias/m"} {
		m, err := st.Lookup(name)
		if err != nil || m.Path != s.blobPath(real.Digest) {
			t.Errorf("Lookup(%q) = %s, %v", name, m.Path, err)
		}
	}
	if l := st.List(); len(l) != 2 || l[0].Name != "alias/m:latest" || l[1].Name != "m:latest" || l[0].Err != nil {
		t.Errorf("list %+v", l)
	}
}
