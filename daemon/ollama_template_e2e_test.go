package daemon

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/bench/modelkit"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestOllamaStoreTemplateLayer: a store model whose GGUF has no Jinja
// chat template serves Chat over gRPC and /api/chat through its template
// layer (Ollama's Go text/template), the messages layer after the system
// layer. Each byte of the byte-level tokenizer is a token, so the prompt's
// token count says which text the template rendered.
func TestOllamaStoreTemplateLayer(t *testing.T) {
	cfg := httpTestConfig(t)
	store := t.TempDir()
	cfg.OllamaModels = store
	tok, st := t.TempDir(), t.TempDir()
	if err := modelkit.WriteByteTokenizer(tok, ""); err != nil { // no chat_template
		t.Fatal(err)
	}
	if _, err := modelkit.WriteLLM(st, modelkit.LLM{Arch: "qwen2", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, Intermediate: 96,
		MaxPositions: 256, DType: "f32", Seed: 5, TokenizerDir: tok}); err != nil {
		t.Fatal(err)
	}
	gguf := filepath.Join(t.TempDir(), "m.gguf")
	if _, err := modelkit.WriteGGUF(st, gguf, "q8_0"); err != nil {
		t.Fatal(err)
	}
	const tmpl = `{{ range .Messages }}[{{ .Role }}]{{ .Content }}{{ end }}{{ if .Tools }}[tools]{{ range .Tools }}{{ .Function.Name }}{{ end }}{{ end }}`
	if err := modelkit.WriteOllamaModel(store, "tmpl", "latest", gguf, modelkit.OllamaModel{
		Params: `{"temperature": 0.7, "num_ctx": 256, "stop": ["<|im_end|>", "[user]"]}`, System: "Be brief.", Family: "qwen2", FileType: "Q8_0",
		Template: tmpl,
		Messages: `[{"role": "user", "content": "Who?"}, {"role": "assistant", "content": "Me."}]`,
	}); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	if _, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "tmpl"}); err != nil {
		t.Fatal(err)
	}

	promptTokens := func(req *brokerv1.ChatRequest) int32 {
		t.Helper()
		st, err := c.Chat(ctx, req)
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
	one := &brokerv1.SamplingParams{MaxTokens: 1}
	user := &brokerv1.ChatMessage{Role: "user", Content: "hi"}
	for _, c := range []struct {
		req  *brokerv1.ChatRequest
		want string
	}{
		{&brokerv1.ChatRequest{Model: "tmpl", Sampling: one, Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{user}}}},
			"[system]Be brief.[user]Who?[assistant]Me.[user]hi"},
		{&brokerv1.ChatRequest{Model: "tmpl", Sampling: one, Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{
			{Role: "system", Content: "Be long-winded."}, user}}}},
			"[system]Be long-winded.[user]Who?[assistant]Me.[user]hi"},
		{&brokerv1.ChatRequest{Model: "tmpl", Sampling: one, Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{user}}},
			ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE, Tools: []*brokerv1.Tool{{Name: "get_weather", Parameters: `{"type": "object", "properties": {}}`}}},
			"[system]Be brief.[user]Who?[assistant]Me.[user]hi[tools]get_weather"},
	} {
		if got := promptTokens(c.req); got != int32(len(c.want)) {
			t.Errorf("prompt of %d tokens, want the %d of %q", got, len(c.want), c.want)
		}
	}

	resp, err := http.Post("http://"+d.addrs.HTTP+"/api/chat", "application/json", strings.NewReader(
		`{"model": "tmpl", "stream": false, "options": {"num_predict": 1}, "messages": [{"role": "user", "content": "hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out struct {
		PromptEvalCount int `json:"prompt_eval_count"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil {
		t.Fatalf("/api/chat: %d %s", resp.StatusCode, b)
	}
	if want := len("[system]Be brief.[user]Who?[assistant]Me.[user]hi"); out.PromptEvalCount != want {
		t.Errorf("/api/chat's prompt_eval_count %d, want %d", out.PromptEvalCount, want)
	}

	// /api/show gives the template layer (the GGUF has no Jinja one), the
	// system layer and the params a line each, as Ollama prints them.
	show := apiShow(t, "http://"+d.addrs.HTTP, "tmpl")
	if show.Template != tmpl || show.System != "Be brief." {
		t.Errorf("/api/show tmpl: template %q system %q; want the template and system layers", show.Template, show.System)
	}
	if want := `stop                           "<|im_end|>"` + "\n" + `stop                           "[user]"` + "\n" +
		"temperature                    0.7\nnum_ctx                        256"; show.Parameters != want {
		t.Errorf("/api/show tmpl parameters:\n%s\nwant\n%s", show.Parameters, want)
	}
	for _, line := range []string{"\nTEMPLATE " + tmpl + "\n", "\nSYSTEM Be brief.\n", "\nPARAMETER stop <|im_end|>\nPARAMETER stop [user]\nPARAMETER temperature 0.7\nPARAMETER num_ctx 256\n"} {
		if !strings.Contains(show.Modelfile, line) {
			t.Errorf("/api/show tmpl modelfile lacks %q:\n%s", line, show.Modelfile)
		}
	}
}
