package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brokerd/brokerd/bench/modelkit"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestOllamaStoreServes: a Q8_0 GGUF in an Ollama store (--ollama-models)
// is listed under its Ollama name, loads by any of Ollama's forms of it,
// and serves Generate over gRPC, /api/chat and /api/tags of the Ollama
// API and /v1/chat/completions of the OpenAI one (issue 21 item 5).
// writeTinyGGUF writes a tiny random llama (a byte tokenizer, ChatML) as a
// GGUF of file type quant and returns its path.
func writeTinyGGUF(t *testing.T, quant string) string {
	t.Helper()
	return writeTinyGGUFHeads(t, quant, 0)
}

// writeTinyGGUFHeads is writeTinyGGUF with heads of headDim (0: 16).
func writeTinyGGUFHeads(t *testing.T, quant string, headDim int) string {
	t.Helper()
	src := t.TempDir()
	if err := modelkit.WriteByteTokenizer(src, chatMLTemplate); err != nil {
		t.Fatal(err)
	}
	st := t.TempDir()
	if _, err := modelkit.WriteLLM(st, modelkit.LLM{Arch: "llama", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, HeadDim: headDim, Intermediate: 96,
		MaxPositions: 256, DType: "f32", Seed: 5, TokenizerDir: src}); err != nil {
		t.Fatal(err)
	}
	gguf := filepath.Join(t.TempDir(), "m.gguf")
	if _, err := modelkit.WriteGGUF(st, gguf, quant); err != nil {
		t.Fatal(err)
	}
	return gguf
}

func TestOllamaStoreServes(t *testing.T) {
	cfg := httpTestConfig(t)
	store := t.TempDir()
	cfg.OllamaModels = store
	gguf := writeTinyGGUF(t, "q8_0")
	if err := modelkit.WriteOllamaModel(store, "tiny", "0.5b", gguf, modelkit.OllamaModel{
		Params: `{"temperature": 0, "num_ctx": 128}`, System: "Be brief.", Family: "llama", FileType: "Q8_0"}); err != nil {
		t.Fatal(err)
	}
	// The same GGUF as a repository version directory.
	repoGGUF := filepath.Join(cfg.ModelRepo, "tiny-gguf", "1", "m.gguf")
	if err := os.MkdirAll(filepath.Dir(repoGGUF), 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(gguf); err != nil || os.WriteFile(repoGGUF, b, 0o644) != nil {
		t.Fatalf("copying the GGUF: %v", err)
	}
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)

	ms, err := c.ListModels(ctx, &brokerv1.ListModelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, m := range ms.GetModels() {
		if m.GetName() == "tiny:0.5b" && m.GetState() == brokerv1.ModelState_MODEL_STATE_AVAILABLE {
			listed = true
			if st, _ := os.Stat(gguf); m.GetQuantization() != "Q8_0" || m.GetFormat() != "gguf" || m.GetFileBytes() != uint64(st.Size()) || m.GetContextLength() != 128 {
				t.Errorf("details of tiny:0.5b from its manifest: %v", m)
			}
			// The GGUF's Jinja template is the one rendered, not Ollama's
			// default for a manifest without a template layer.
			if m.GetTemplate() != chatMLTemplate || m.GetSystem() != "Be brief." || len(m.GetParameters()) != 2 {
				t.Errorf("tiny:0.5b's template, system and parameters: %q %q %v", m.GetTemplate(), m.GetSystem(), m.GetParameters())
			}
		}
	}
	if !listed {
		t.Fatalf("tiny:0.5b is not listed as available: %v", ms.GetModels())
	}
	lr, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "library/tiny:0.5b"})
	if err != nil || lr.GetModel().GetName() != "tiny:0.5b" {
		t.Fatalf("LoadModel(library/tiny:0.5b): %v %v; want it served as tiny:0.5b", lr, err)
	}
	gs, err := c.Generate(ctx, &brokerv1.GenerateRequest{Model: "tiny:0.5b", Prompts: []string{"hello"},
		Sampling: &brokerv1.SamplingParams{MaxTokens: 8, IgnoreEos: true}})
	if err != nil {
		t.Fatal(err)
	}
	tokens := 0
	for {
		m, err := gs.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, dl := range m.GetDeltas() {
			tokens += len(dl.GetTokenIds())
		}
	}
	if tokens != 8 {
		t.Errorf("Generate gave %d tokens, want 8", tokens)
	}
	// The system layer opens a conversation that brings no system message.
	promptTokens := func(msgs ...*brokerv1.ChatMessage) int32 {
		t.Helper()
		st, err := c.Chat(ctx, &brokerv1.ChatRequest{Model: "tiny:0.5b", Conversations: []*brokerv1.Conversation{{Messages: msgs}},
			Sampling: &brokerv1.SamplingParams{MaxTokens: 1}})
		if err != nil {
			t.Fatal(err)
		}
		var n int32
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return n
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range m.GetResults() {
				n = r.GetUsage().GetPromptTokens()
			}
		}
	}
	user := &brokerv1.ChatMessage{Role: "user", Content: "hi"}
	implicit := promptTokens(user)
	explicit := promptTokens(&brokerv1.ChatMessage{Role: "system", Content: "Be brief."}, user)
	other := promptTokens(&brokerv1.ChatMessage{Role: "system", Content: "Be long-winded."}, user)
	if implicit != explicit || other == explicit {
		t.Errorf("prompt tokens: %d with no system message, %d with the model's, %d with another: want the model's applied", implicit, explicit, other)
	}
	base := "http://" + d.addrs.HTTP
	for path, body := range map[string]string{
		"/api/chat":            `{"model": "tiny:0.5b", "stream": false, "options": {"num_predict": 4}, "messages": [{"role": "user", "content": "hi"}]}`,
		"/v1/chat/completions": `{"model": "tiny:0.5b", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}`,
	} {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("POST %s: %d %s", path, resp.StatusCode, b)
		}
	}
	resp, err := http.Get(base + "/api/tags")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"name":"tiny:0.5b"`) {
		t.Errorf("/api/tags does not show tiny:0.5b: %s", b)
	}
	// modified_at is the manifest's time, not now; digest the manifest's
	// sha256, as Ollama lists them.
	var tags struct {
		Models []struct {
			Name       string `json:"name"`
			ModifiedAt string `json:"modified_at"`
			Digest     string `json:"digest"`
		} `json:"models"`
	}
	if err := json.Unmarshal(b, &tags); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(store, "manifests", "registry.ollama.ai", "library", "tiny", "0.5b")
	mfInfo, err := os.Stat(manifest)
	if err != nil {
		t.Fatal(err)
	}
	listed = false
	for _, m := range tags.Models {
		if m.Name != "tiny:0.5b" {
			continue
		}
		listed = true
		if m.ModifiedAt != mfInfo.ModTime().UTC().Format(time.RFC3339Nano) {
			t.Errorf("/api/tags modified_at %s, the manifest's time is %s", m.ModifiedAt, mfInfo.ModTime().UTC().Format(time.RFC3339Nano))
		}
		if want := fileSHA256(t, manifest); m.Digest != want {
			t.Errorf("/api/tags digest %q, the manifest's sha256 is %s", m.Digest, want)
		}
	}
	if !listed {
		t.Error("/api/tags does not list tiny:0.5b")
	}

	// /api/show gives the template brokerd renders (the GGUF's Jinja one),
	// the system layer, the params as Ollama prints them, and a Modelfile
	// FROM the blob.
	blob := "blobs/sha256-" + fileSHA256(t, gguf) // relative: data-plane clients see it
	show := apiShow(t, base, "tiny:0.5b")
	if show.Template != chatMLTemplate || show.System != "Be brief." {
		t.Errorf("/api/show tiny:0.5b: template %q system %q; want the GGUF's Jinja template and the system layer", show.Template, show.System)
	}
	if want := "temperature                    0\nnum_ctx                        128"; show.Parameters != want {
		t.Errorf("/api/show tiny:0.5b parameters:\n%s\nwant\n%s", show.Parameters, want)
	}
	if want := "# Modelfile generated by \"ollama show\"\n# To build a new Modelfile based on this, replace FROM with:\n# FROM tiny:0.5b\n\n" +
		"FROM " + blob + "\nTEMPLATE \"" + chatMLTemplate + "\"\nSYSTEM Be brief.\nPARAMETER temperature 0\nPARAMETER num_ctx 128\n"; show.Modelfile != want {
		t.Errorf("/api/show tiny:0.5b modelfile:\n%s\nwant\n%s", show.Modelfile, want)
	}
	// A repository GGUF: its Jinja template, FROM its file in the
	// repository, no defaults.
	show = apiShow(t, base, "tiny-gguf")
	if show.Template != chatMLTemplate || show.System != "" || show.Parameters != "" || !strings.Contains(show.Modelfile, "\nFROM tiny-gguf/1/m.gguf\n") {
		t.Errorf("/api/show tiny-gguf: %+v; want its Jinja template, FROM tiny-gguf/1/m.gguf", show)
	}
}

// ollamaShow is /api/show's answer, the fields brokerd fills from the
// model's files.
type ollamaShow struct {
	Modelfile  string `json:"modelfile"`
	Parameters string `json:"parameters"`
	Template   string `json:"template"`
	System     string `json:"system"`
}

// apiShow posts /api/show for model.
func apiShow(t *testing.T, base, model string) ollamaShow {
	t.Helper()
	resp, err := http.Post(base+"/api/show", "application/json", strings.NewReader(`{"model": "`+model+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out ollamaShow
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil {
		t.Fatalf("/api/show %s: %d %s", model, resp.StatusCode, b)
	}
	return out
}

// fileSHA256 is the hex sha256 of a file, an Ollama blob's name.
func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
