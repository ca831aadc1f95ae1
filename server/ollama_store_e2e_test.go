package server

import (
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
func TestOllamaStoreServes(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.HTTPAllowUnauthenticated = true
	store := t.TempDir()
	cfg.OllamaModels = store
	src := t.TempDir()
	if err := modelkit.WriteByteTokenizer(src, `{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`); err != nil {
		t.Fatal(err)
	}
	st := t.TempDir()
	if _, err := modelkit.WriteLLM(st, modelkit.LLM{Arch: "llama", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, Intermediate: 96,
		MaxPositions: 256, DType: "f32", Seed: 5, TokenizerDir: src}); err != nil {
		t.Fatal(err)
	}
	gguf := filepath.Join(t.TempDir(), "m.gguf")
	if _, err := modelkit.WriteGGUF(st, gguf, "q8_0"); err != nil {
		t.Fatal(err)
	}
	if err := modelkit.WriteOllamaModel(store, "tiny", "0.5b", gguf, modelkit.OllamaModel{
		Params: `{"temperature": 0, "num_ctx": 128}`, System: "Be brief.", Family: "llama", FileType: "Q8_0"}); err != nil {
		t.Fatal(err)
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
	// modified_at is the manifest's time, not now.
	var tags struct {
		Models []struct {
			Name       string `json:"name"`
			ModifiedAt string `json:"modified_at"`
		} `json:"models"`
	}
	if err := json.Unmarshal(b, &tags); err != nil {
		t.Fatal(err)
	}
	mfInfo, err := os.Stat(filepath.Join(store, "manifests", "registry.ollama.ai", "library", "tiny", "0.5b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range tags.Models {
		if m.Name == "tiny:0.5b" && m.ModifiedAt != mfInfo.ModTime().UTC().Format(time.RFC3339Nano) {
			t.Errorf("/api/tags modified_at %s, the manifest's time is %s", m.ModifiedAt, mfInfo.ModTime().UTC().Format(time.RFC3339Nano))
		}
	}
}
