package server

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// setChatTemplate replaces the chat_template of a version directory's
// tokenizer_config.json.
func setChatTemplate(t *testing.T, repo, name, tmpl string) {
	t.Helper()
	path := filepath.Join(repo, name, "1", "tokenizer_config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"] = tmpl
	if raw, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHostileChatTemplates: chat templates that crashed brokerd, exhausted
// its memory or kept its cores busy after the caller left (Hardening II,
// finding 1) are refused at load with a message naming the limit; one that
// misbehaves only on some conversations fails those requests with
// INVALID_ARGUMENT and brokerd serves the next one.
func TestHostileChatTemplates(t *testing.T) {
	hostile := map[string]struct{ tmpl, want string }{
		"recursive-macro": {`{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}`, "macro calls nested"},
		"huge-repeat":     {`{{ 'x' * 2000000000 }}`, "repetitions"},
		"huge-range":      {`{% for i in range(10000000000) %}{% endfor %}`, "range of"},
		"nested-loops":    {`{% set l = range(5000) %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}`, "evaluation steps"},
		"parentheses":     {"{{ " + strings.Repeat("(", 10<<20) + " }}", "bytes, over"},
		"nested-ifs":      {strings.Repeat("{% if x %}", 14<<20/10), "bytes, over"},
	}
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	// One model written, copied under every name (Qwen's tokenizer is
	// slow to write).
	v, eos := qwenDir(t, cfg.ModelRepo, "sometimes")
	writeTinyLlamaVocab(t, cfg.ModelRepo, "sometimes", v, eos)
	for name, h := range hostile {
		copyDir(t, filepath.Join(cfg.ModelRepo, "sometimes", "1"), versionDir(t, cfg.ModelRepo, name, 1))
		setChatTemplate(t, cfg.ModelRepo, name, h.tmpl)
	}
	// Fine on the load's trial conversation, hostile on one message.
	setChatTemplate(t, cfg.ModelRepo, "sometimes",
		`{% for m in messages %}{% if m.content == 'boom' %}{{ 'x' * 2000000000 }}{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}<|im_start|>assistant
`)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)

	for name, h := range hostile {
		_, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: name, Version: 1})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), h.want) {
			t.Errorf("LoadModel(%s) = %v; want INVALID_ARGUMENT naming %q", name, err, h.want)
		}
	}

	if _, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "sometimes", Version: 1}); err != nil {
		t.Fatalf("LoadModel(sometimes): %v", err)
	}
	chat := func(content string) error {
		st, err := c.Chat(ctx, &brokerv1.ChatRequest{Model: "sometimes", Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{
			{Role: "user", Content: content}}}}, Sampling: &brokerv1.SamplingParams{MaxTokens: 2}})
		if err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	}
	if err := chat("boom"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "repetitions") {
		t.Errorf("chat that breaks the template's limits: %v; want INVALID_ARGUMENT naming the limit", err)
	}
	if err := chat("hello"); err != nil {
		t.Errorf("the next chat: %v", err)
	}
	hc, err := grpc_health_v1.NewHealthClient(d.conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{})
	if err != nil || hc.GetStatus() != grpc_health_v1.HealthCheckResponse_SERVING {
		t.Errorf("health after the hostile templates: %v %v", hc, err)
	}
}

// TestChatMessagesBoundedBeforeRendering: a conversation of millions of
// empty messages is refused on its count and size before the template or
// the tokenizer sees it (it cost seconds of CPU and gigabytes before).
func TestChatMessagesBoundedBeforeRendering(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "qwen-tiny"
	cfg.MaxMessageBytes = 256 << 20
	cfg.MaxItemBytes = 64 << 10
	v, eos := qwenDir(t, cfg.ModelRepo, "qwen-tiny")
	writeTinyLlamaVocab(t, cfg.ModelRepo, "qwen-tiny", v, eos)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	// 2.2 million as in the attack; then few enough to pass the count,
	// too many for the size.
	for _, n := range []int{2_200_000, maxChatMessages + 1, 4000} {
		msgs := make([]*brokerv1.ChatMessage, n)
		for i := range msgs {
			msgs[i] = &brokerv1.ChatMessage{Role: "user"}
		}
		st, err := c.Chat(ctx, &brokerv1.ChatRequest{Model: "qwen-tiny", Conversations: []*brokerv1.Conversation{{Messages: msgs}}})
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%d empty messages: %v; want INVALID_ARGUMENT", n, err)
		}
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
