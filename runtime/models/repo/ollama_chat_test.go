package repo

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/ollama"
)

// ggufWithoutTemplate writes a Q8_0 qwen2 GGUF whose metadata has no
// tokenizer.chat_template.
func ggufWithoutTemplate(t *testing.T) string {
	t.Helper()
	tok, st := t.TempDir(), t.TempDir()
	if err := modelkit.WriteByteTokenizer(tok, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := modelkit.WriteLLM(st, modelkit.LLM{Arch: "qwen2", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, Intermediate: 96,
		MaxPositions: 256, DType: "f32", Seed: 3, TokenizerDir: tok}); err != nil {
		t.Fatal(err)
	}
	gguf := filepath.Join(t.TempDir(), "model.gguf")
	if _, err := modelkit.WriteGGUF(st, gguf, "q8_0"); err != nil {
		t.Fatal(err)
	}
	return gguf
}

// TestOllamaTemplateLayer: a store model whose GGUF has no Jinja chat
// template renders chats with its template layer (Ollama's Qwen 2.5
// template; a legacy one; Ollama's default without one), its messages
// layer after the conversation's system message; a GGUF's Jinja template
// wins over the layer, the messages layer still applied; a template that
// recurses does not load, and one that breaks a limit on a request fails
// that request (INVALID_ARGUMENT's kind).
func TestOllamaTemplateLayer(t *testing.T) {
	qwen, err := os.ReadFile(filepath.Join("..", "ollama", "testdata", "templates", "qwen2.5.gotmpl"))
	if err != nil {
		t.Fatal(err)
	}
	dir, store := t.TempDir(), t.TempDir()
	plain := ggufWithoutTemplate(t)
	_, gg := ggufPair(t, dir, "qwen2", "q8_0") // its GGUF has a Jinja template
	jinja := filepath.Join(gg, "model.gguf")
	const msgs = `[{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "A tiny model."}]`
	for _, m := range []struct {
		name, gguf string
		om         modelkit.OllamaModel
	}{
		{"qwen", plain, modelkit.OllamaModel{Template: string(qwen), System: "Be brief.", Messages: msgs}},
		{"legacy", plain, modelkit.OllamaModel{Template: "{{ .System }} {{ .Prompt }}"}},
		{"none", plain, modelkit.OllamaModel{}},
		{"jinja", jinja, modelkit.OllamaModel{Template: "{{ .Prompt }} from the layer", Messages: msgs}},
		{"recursive", plain, modelkit.OllamaModel{Template: `{{ define "a" }}{{ template "a" . }}{{ end }}{{ template "a" . }}`}},
		{"loops", plain, modelkit.OllamaModel{Template: `{{ range .Messages }}{{ range $.Messages }}{{ range $.Messages }}{{ range $.Messages }}{{ end }}{{ end }}{{ end }}{{ end }}{{ .Response }}`}},
	} {
		writeOllamaModel(t, store, m.name, "latest", m.gguf, m.om)
	}
	s, err := ollama.Open(store, ollama.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(dir, zaptest.NewLogger(t), WithOllamaStore(s))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	load := func(name string) *llm.Model {
		t.Helper()
		l, err := r.Load(ctx, name, 0)
		if err != nil {
			t.Fatal(err)
		}
		return l.LLM
	}
	// What the server passes: the system layer first (the conversation
	// had none), then the request's messages.
	chat := []llm.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}
	for _, c := range []struct{ model, want string }{
		{"qwen", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n" +
			"<|im_start|>assistant\nA tiny model.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
		{"legacy", "Be brief. Hi"},
		{"none", "Hi"},
		{"jinja", "Be brief.Who are you?A tiny model.Hi"},
	} {
		m := load(c.model)
		got, err := m.RenderChat(ctx, chat, llm.ChatOptions{AddGenerationPrompt: true})
		if err != nil || got != c.want {
			t.Errorf("%s rendered %q %v, want %q", c.model, got, err, c.want)
			continue
		}
		// The prompt is the model's: its special tokens are tokens.
		ids, err := m.Encode(got, false)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(got, "<|im_start|>") != slices.Contains(ids, int32(modelkit.ByteTokenizerStart)) {
			t.Errorf("%s: %q encodes to %v", c.model, got, ids)
		}
	}

	_, err = r.Load(ctx, "recursive", 0)
	if !errors.Is(err, ollama.ErrInvalid) || !errors.Is(err, models.ErrInvalidModel) || !errors.Is(err, ollama.ErrTemplateLimit) || !strings.Contains(err.Error(), "template layer") {
		t.Errorf("a recursive template layer: %v", err)
	}

	m := load("loops") // the trial's four turns are cheap
	long := make([]llm.Message, 100)
	for i := range long {
		long[i] = llm.Message{Role: []string{"user", "assistant"}[i%2], Content: "x"}
	}
	_, err = m.RenderChat(ctx, long, llm.ChatOptions{AddGenerationPrompt: true})
	if !errors.Is(err, models.ErrInvalidInput) || !errors.Is(err, ollama.ErrTemplateLimit) {
		t.Errorf("100⁴ loop iterations on a request: %v", err)
	}
}
