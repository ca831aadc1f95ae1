package ollama

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brokerd/brokerd/runtime/gguf"
)

func ptr[T any](v T) *T { return &v }

// TestList: every manifest of a store is listed under the name Ollama
// shows, with its GGUF blob, config, params, system, template, license,
// manifest digest and time; the GGUF opens and verifies.
func TestList(t *testing.T) {
	s := newStore(t)
	g := tinyGGUF(t)
	qwen, model := s.fullModel("registry.ollama.ai/library/qwen2.5/0.5b", g)
	s.fullModel("registry.ollama.ai/library/qwen2.5/latest", g)
	s.manifest("registry.ollama.ai/myuser/mymodel/latest", s.config("gguf", "llama", "1B", "Q8_0"), s.blob(MediaModel, []byte("GGUF another")))
	s.manifest("hf.co/org/repo/Q4_K_M", layer{}, s.blob(MediaModel, []byte("GGUF from hf")))
	s.manifest("localhost:5000/team/m/v1.2", layer{}, s.blob(MediaModel, []byte("GGUF from a private registry")))
	s.manifest("registry.ollama.ai/library/prompted/latest", layer{}, s.blob(MediaModel, []byte("GGUF")), s.blob(MediaPrompt, []byte("{{ .Prompt }}")),
		s.blob(MediaMessages, []byte(`[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]`)))
	// Not manifests: dot files, files above four deep, directories four deep.
	if err := os.WriteFile(filepath.Join(s.dir, "manifests", ".DS_Store"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "manifests", "registry.ollama.ai", "stray"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "manifests", "registry.ollama.ai", "library", "dir", "tagdir", "deeper"), 0o755); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	if err := os.Chtimes(qwen, mtime, mtime); err != nil {
		t.Fatal(err)
	}

	st := s.open(Limits{})
	list := st.List()
	var names []string
	for _, m := range list {
		names = append(names, m.Name)
		if m.Err != nil {
			t.Errorf("%s: %v", m.Name, m.Err)
		}
	}
	want := []string{"hf.co/org/repo:Q4_K_M", "localhost:5000/team/m:v1.2", "myuser/mymodel:latest", "prompted:latest", "qwen2.5:0.5b", "qwen2.5:latest"}
	if !slices.Equal(names, want) {
		t.Fatalf("names %q, want %q", names, want)
	}

	m := list[4]
	raw, err := os.ReadFile(qwen)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if m.Ref != (Name{"registry.ollama.ai", "library", "qwen2.5", "0.5b"}) || m.Manifest != qwen || m.ManifestDigest != hex.EncodeToString(sum[:]) || !m.ModTime.Equal(mtime) {
		t.Errorf("name %+v manifest %s digest %s time %v", m.Ref, m.Manifest, m.ManifestDigest, m.ModTime)
	}
	if m.Path != s.blobPath(model.Digest) && !strings.HasSuffix(m.Path, filepath.Base(s.blobPath(model.Digest))) || m.Size != int64(len(g)) || m.Digest != model.Digest {
		t.Errorf("blob %s %d %s, want %s %d %s", m.Path, m.Size, m.Digest, s.blobPath(model.Digest), len(g), model.Digest)
	}
	if m.System != ollamaSystem || m.Template != ollamaTemplate || len(m.License) != 1 || !strings.HasPrefix(m.License[0], "Apache") {
		t.Errorf("system %q template %q license %q", m.System, m.Template, m.License)
	}
	wantDetails := Details{Format: "gguf", Family: "qwen2", Families: []string{"qwen2"}, ParameterSize: "494.03M", QuantizationLevel: "Q4_K_M"}
	if !reflect.DeepEqual(m.Details, wantDetails) {
		t.Errorf("details %+v, want %+v", m.Details, wantDetails)
	}
	wantParams := Params{Stop: []string{"<|im_start|>", "<|im_end|>"}, Temperature: ptr[float32](0.6), TopK: ptr(20), TopP: ptr[float32](0.95),
		MinP: ptr[float32](0), RepeatPenalty: ptr[float32](1), NumCtx: ptr(4096), Seed: ptr[int64](-1), Ignored: []string{"mirostat"}}
	if !reflect.DeepEqual(m.Params, wantParams) {
		t.Errorf("params %+v, want %+v", m.Params, wantParams)
	}
	f, err := gguf.Open(m.Path, gguf.Limits{})
	if err != nil {
		t.Fatalf("the GGUF blob does not open: %v", err)
	}
	if arch, _ := f.String("general.architecture"); arch != "qwen2" {
		t.Errorf("architecture %q", arch)
	}
	f.Close()
	if err := st.Verify(context.Background(), m, nil); err != nil {
		t.Errorf("Verify: %v", err)
	}

	p := list[3]
	if p.Template != "{{ .Prompt }}" || !reflect.DeepEqual(p.Messages, []Message{{"user", "hi"}, {"assistant", "hello"}}) {
		t.Errorf("prompt layer %q, messages %+v", p.Template, p.Messages)
	}
	if d := list[2].Details; d.Family != "llama" || d.QuantizationLevel != "Q8_0" {
		t.Errorf("myuser/mymodel details %+v", d)
	}
	if h := list[0]; h.Ref != (Name{"hf.co", "org", "repo", "Q4_K_M"}) || h.Template != "" || h.Params.Stop != nil {
		t.Errorf("hf.co model %+v", h)
	}
}

// TestLookup: every form of a name Ollama accepts finds its model;
// names not there or not Ollama's are ErrNotFound.
func TestLookup(t *testing.T) {
	s := newStore(t)
	g := []byte("GGUF stand-in")
	s.fullModel("registry.ollama.ai/library/qwen2.5/0.5b", g)
	s.fullModel("registry.ollama.ai/library/qwen2.5/latest", g)
	s.manifest("registry.ollama.ai/myuser/mymodel/latest", layer{}, s.blob(MediaModel, []byte("mine")))
	s.manifest("hf.co/org/repo/Q4_K_M", layer{}, s.blob(MediaModel, []byte("hf")))
	s.manifest("hf.co/Org/Repo/q8_0", layer{}, s.blob(MediaModel, []byte("hf8")))
	s.manifest("hf.co/org/twice/Tag", layer{}, s.blob(MediaModel, []byte("t1")))
	s.manifest("hf.co/org/twice/TAG", layer{}, s.blob(MediaModel, []byte("t2")))
	st := s.open(Limits{})
	for _, tc := range []struct{ in, want string }{
		{"qwen2.5", "qwen2.5:latest"},
		{"qwen2.5:latest", "qwen2.5:latest"},
		{"qwen2.5:0.5b", "qwen2.5:0.5b"},
		{"library/qwen2.5:0.5b", "qwen2.5:0.5b"},
		{"library/qwen2.5", "qwen2.5:latest"},
		{"registry.ollama.ai/library/qwen2.5:0.5b", "qwen2.5:0.5b"},
		{"https://registry.ollama.ai/library/qwen2.5:0.5b", "qwen2.5:0.5b"},
		{"Qwen2.5:0.5B", "qwen2.5:0.5b"}, // ignoring case, as Ollama matches
		{"REGISTRY.OLLAMA.AI/Library/QWEN2.5", "qwen2.5:latest"},
		{"myuser/mymodel", "myuser/mymodel:latest"},
		{"registry.ollama.ai/myuser/mymodel:latest", "myuser/mymodel:latest"},
		{"hf.co/org/repo:Q4_K_M", "hf.co/org/repo:Q4_K_M"},
		{"hf.co/org/repo:q4_k_m", "hf.co/org/repo:Q4_K_M"},
		{"hf.co/org/repo:Q8_0", "hf.co/Org/Repo:q8_0"},
		{"hf.co/org/twice:Tag", "hf.co/org/twice:Tag"}, // exact first
	} {
		m, err := st.Lookup(tc.in)
		if err != nil || m.Name != tc.want {
			t.Errorf("Lookup(%q) = %q, %v; want %q", tc.in, m.Name, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"qwen3", "qwen3:latest"},
		{"qwen2.5:7b", "qwen2.5:7b"},
		{"myuser/qwen2.5:0.5b", "myuser/qwen2.5:0.5b"},
		{"hf.co/org/repo", "hf.co/org/repo:latest"},
		{"hf.co/org/twice:tag", "matches 2 models ignoring case"},
		{"", "model is empty"},
		{"../../etc/passwd", "is not an Ollama model name"},
		{"qwen2.5:../../x", "is not an Ollama model name"},
		{"a/b/c/d:e", "is not an Ollama model name"},
		{"qwen2.5:", "tag after : is empty"},
		{"/qwen2.5", "is not an Ollama model name"},
		{"//qwen2.5", "is not an Ollama model name"},
		{"my.user/m", "namespace"},
		{"qwen2.5@sha256:abc", "is not an Ollama model name"},
		{"blobs", "blobs:latest"},
	} {
		m, err := st.Lookup(tc.in)
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), tc.want) || m.Name != "" {
			t.Errorf("Lookup(%q) = %q, %v; want ErrNotFound saying %q", tc.in, m.Name, err, tc.want)
		}
	}
}

// TestParseName: Ollama's name forms and their parts, Short and String.
func TestParseName(t *testing.T) {
	for _, tc := range []struct {
		in          string
		want        Name
		short, full string
	}{
		{"qwen2.5", Name{DefaultHost, DefaultNamespace, "qwen2.5", "latest"}, "qwen2.5:latest", "registry.ollama.ai/library/qwen2.5:latest"},
		{"qwen2.5:0.5b", Name{DefaultHost, DefaultNamespace, "qwen2.5", "0.5b"}, "qwen2.5:0.5b", ""},
		{"myuser/mymodel", Name{DefaultHost, "myuser", "mymodel", "latest"}, "myuser/mymodel:latest", ""},
		{"hf.co/org/repo:Q4_K_M", Name{"hf.co", "org", "repo", "Q4_K_M"}, "hf.co/org/repo:Q4_K_M", "hf.co/org/repo:Q4_K_M"},
		{"hf.co/library/repo", Name{"hf.co", "library", "repo", "latest"}, "hf.co/library/repo:latest", ""},
		{"localhost:5000/ns/m", Name{"localhost:5000", "ns", "m", "latest"}, "localhost:5000/ns/m:latest", ""},
		{"localhost:5000/ns/m:t", Name{"localhost:5000", "ns", "m", "t"}, "localhost:5000/ns/m:t", ""},
		{"http://localhost:5000/ns/m:t", Name{"localhost:5000", "ns", "m", "t"}, "localhost:5000/ns/m:t", ""},
		{"Registry.Ollama.AI/Library/M", Name{"Registry.Ollama.AI", "Library", "M", "latest"}, "M:latest", ""},
		{"_x/_y:_z", Name{DefaultHost, "_x", "_y", "_z"}, "_x/_y:_z", ""},
	} {
		n, err := ParseName(tc.in)
		if err != nil || n != tc.want {
			t.Errorf("ParseName(%q) = %+v, %v; want %+v", tc.in, n, err, tc.want)
			continue
		}
		if n.Short() != tc.short {
			t.Errorf("%q: Short %q, want %q", tc.in, n.Short(), tc.short)
		}
		if tc.full != "" && n.String() != tc.full {
			t.Errorf("%q: String %q, want %q", tc.in, n.String(), tc.full)
		}
		if back, err := ParseName(n.Short()); err != nil || !back.EqualFold(n) {
			t.Errorf("%q: Short %q parses to %+v, %v", tc.in, n.Short(), back, err)
		}
	}
	long := strings.Repeat("a", 81)
	for _, in := range []string{"", ":", "a:", ":a", "a/", "/a", "a//b", "-a", ".a", "a b", "a/b/c/d/e", "ns.x/m", "m:t:u", "h/n/m:t/u",
		"a\x00b", "é", long, long + "/m", "m:" + long, strings.Repeat("h", 351) + "/n/m", "../m", "m/..", "./m", "h/../m"} {
		if n, err := ParseName(in); err == nil {
			t.Errorf("ParseName(%q) = %+v, want an error", in, n)
		} else if !errors.Is(err, ErrNotFound) {
			t.Errorf("ParseName(%q): %v is not ErrNotFound", in, err)
		}
	}
}

// TestOpen: the store must be a directory; Ollama's home (its models/ is
// the store) is refused saying so; an empty directory is an empty store.
func TestOpen(t *testing.T) {
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, "models", "manifests"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(home, Limits{}); err == nil || !strings.Contains(err.Error(), "models") {
		t.Errorf("Open(~/.ollama) = %v, want an error pointing at models/", err)
	}
	st, err := Open(filepath.Join(home, "models"), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if l := st.List(); len(l) != 0 {
		t.Errorf("empty store lists %v", l)
	}
	empty, err := Open(t.TempDir(), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if l := empty.List(); len(l) != 0 {
		t.Errorf("store with no manifests/ lists %v", l)
	}
	if _, err := empty.Lookup("qwen2.5"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup in an empty store: %v", err)
	}
	file := filepath.Join(home, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"", file, filepath.Join(home, "missing")} {
		if _, err := Open(dir, Limits{}); err == nil {
			t.Errorf("Open(%q) succeeded", dir)
		}
	}
	if _, err := Open(home+"/models", Limits{ManifestBytes: -1}); err == nil {
		t.Error("negative limits accepted")
	}
	// A store reached through a link is fine (~/.ollama/models -> /data).
	link := filepath.Join(t.TempDir(), "models")
	if err := os.Symlink(filepath.Join(home, "models"), link); err != nil {
		t.Fatal(err)
	}
	s := &store{t: t, dir: filepath.Join(home, "models")}
	if err := os.MkdirAll(filepath.Join(s.dir, "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.manifest("registry.ollama.ai/library/m/latest", layer{}, s.blob(MediaModel, []byte("g")))
	viaLink, err := Open(link, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := viaLink.Lookup("m"); err != nil || m.Size != 1 {
		t.Errorf("through a link: %+v, %v", m, err)
	}
}

// TestListLimit: past Limits.Manifests, List ends with an entry saying so.
func TestListLimit(t *testing.T) {
	s := newStore(t)
	for _, tag := range []string{"a", "b", "c"} {
		s.manifest("registry.ollama.ai/library/m/"+tag, layer{}, s.blob(MediaModel, []byte(tag)))
	}
	list := s.open(Limits{Manifests: 2}).List()
	if len(list) != 3 || list[0].Name != "m:a" || list[0].Err != nil || list[1].Name != "m:b" || list[1].Err != nil || list[2].Name != "manifests" {
		t.Fatalf("list %+v", list)
	}
	checkModelError(t, s, list[2].Err, ErrInvalid, "more than 2 manifests")
}

// TestParams: a params layer's options typed as Ollama types them.
func TestParams(t *testing.T) {
	good := []struct {
		in   string
		want Params
	}{
		{`{}`, Params{}},
		{`{"stop":["a","b"],"temperature":0.7,"top_k":40,"top_p":0.9,"min_p":0.05,"num_ctx":8192,"repeat_penalty":1.1,
			"presence_penalty":0.5,"frequency_penalty":-0.5,"seed":42,"num_predict":-1,"typical_p":1,"repeat_last_n":64,"num_keep":4,
			"num_batch":512,"num_gpu":99,"main_gpu":0,"num_thread":8,"use_mmap":false,"draft_num_predict":3}`,
			Params{Stop: []string{"a", "b"}, Temperature: ptr[float32](0.7), TopK: ptr(40), TopP: ptr[float32](0.9), MinP: ptr[float32](0.05),
				NumCtx: ptr(8192), RepeatPenalty: ptr[float32](1.1), PresencePenalty: ptr[float32](0.5), FrequencyPenalty: ptr[float32](-0.5),
				Seed: ptr[int64](42), NumPredict: ptr(-1), TypicalP: ptr[float32](1), RepeatLastN: ptr(64), NumKeep: ptr(4), NumBatch: ptr(512),
				NumGPU: ptr(99), MainGPU: ptr(0), NumThread: ptr(8), UseMMap: ptr(false), DraftNumPredict: ptr(3)}},
		{`{"num_ctx":4096.0,"top_k":4e1,"seed":9007199254740993}`, Params{NumCtx: ptr(4096), TopK: ptr(40), Seed: ptr[int64](9007199254740993)}},
		{`{"temperature":null,"stop":null}`, Params{}},
		{`{"stop":[]}`, Params{Stop: []string{}}},
		{`{"tfs_z":1,"penalize_newline":true,"mirostat_eta":0.1,"zzz":{}}`, Params{Ignored: []string{"mirostat_eta", "penalize_newline", "tfs_z", "zzz"}}},
	}
	for _, tc := range good {
		p, err := parseParams([]byte(tc.in))
		if err != nil || !reflect.DeepEqual(p, tc.want) {
			t.Errorf("parseParams(%s) = %+v, %v; want %+v", tc.in, p, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{`[]`, "is a JSON array"},
		{`null`, "not a JSON object"},
		{`"x"`, "string"},
		{`{"top_k":"40"}`, "top_k"},
		{`{"top_k":40.5}`, "want an integer"},
		{`{"num_ctx":1e10}`, "want an integer"},
		{`{"num_ctx":99999999999}`, "want -2147483648 to 2147483647"},
		{`{"seed":1e30}`, "seed"},
		{`{"temperature":"hot"}`, "temperature"},
		{`{"temperature":1e39}`, "float32's range"},
		{`{"temperature":true}`, "temperature"},
		{`{"stop":"<|im_end|>"}`, "array of strings"},
		{`{"stop":[1]}`, "array of strings"},
		{`{"use_mmap":1}`, "true or false"},
		{`{"top_k":1,"top_k":2}`, "twice"},
		{`{"stop":[` + strings.Repeat(`"x",`, maxStops) + `"y"]}`, "at most 256"},
		{`{} {}`, "data after"},
		{`{"a":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, "nested"},
	} {
		if p, err := parseParams([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseParams(%s) = %+v, %v; want an error saying %q", tc.in, p, err, tc.want)
		}
	}
}
