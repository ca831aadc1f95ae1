package daemon

import (
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/bench/modelkit"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// byteTokenizerDir writes a version directory with a small byte-level BPE
// tokenizer.json (every byte a token, <|im_start|> 256, <|im_end|> 257 the
// EOS) and a tokenizer_config.json with chat template tmpl, and a random
// model whose vocabulary is modelVocab (at least 258: the ids past the
// tokenizer's are text-less tokens): what brokerd's own tokenizer loader reads,
// without Qwen's 151k-token file (slow to load under the race detector).
func byteTokenizerDir(t *testing.T, repo, name, tmpl string, modelVocab int) {
	t.Helper()
	writeByteTokenizer(t, versionDir(t, repo, name, 1), tmpl)
	writeTinyLlamaVocab(t, repo, name, modelVocab, 257)
}

// writeByteTokenizer writes modelkit's byte-level tokenizer into dir.
func writeByteTokenizer(t *testing.T, dir, tmpl string) {
	t.Helper()
	if err := modelkit.WriteByteTokenizer(dir, tmpl); err != nil {
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
		// The step bound, or under the race detector the time bound.
		"nested-loops": {`{% set l = range(5000) %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}`, "evaluation steps|longer than"},
		"parentheses":  {"{{ " + strings.Repeat("(", 10<<20) + " }}", "bytes, over"},
		"nested-ifs":   {strings.Repeat("{% if x %}", 14<<20/10), "bytes, over"},
	}
	cfg := httpTestConfig(t)
	for name, h := range hostile {
		byteTokenizerDir(t, cfg.ModelRepo, name, h.tmpl, 258)
	}
	// Fine on the load's trial conversation, hostile on one message.
	byteTokenizerDir(t, cfg.ModelRepo, "sometimes",
		`{% for m in messages %}{% if m.content == 'boom' %}{{ 'x' * 2000000000 }}{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}<|im_start|>assistant
`, 258)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)

	for name, h := range hostile {
		_, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: name, Version: 1})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !containsOneOf(st.Message(), h.want) {
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
	// Over HTTP the same limit is the request's 400, in each API's shape.
	for path, body := range map[string]string{
		"/api/chat":            `{"model": "sometimes", "stream": false, "messages": [{"role": "user", "content": "boom"}]}`,
		"/v1/chat/completions": `{"model": "sometimes", "messages": [{"role": "user", "content": "boom"}]}`,
	} {
		resp, err := http.Post("http://"+d.addrs.HTTP+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "repetitions") {
			t.Errorf("POST %s over the template's limit: %d %s; want 400 naming the limit", path, resp.StatusCode, b)
		}
	}
	hc, err := grpc_health_v1.NewHealthClient(d.conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{})
	if err != nil || hc.GetStatus() != grpc_health_v1.HealthCheckResponse_SERVING {
		t.Errorf("health after the hostile templates: %v %v", hc, err)
	}
}

// maxChatMessages is the server's bound on a conversation's messages.
const maxChatMessages = 8192

// TestChatMessagesBoundedBeforeRendering: a conversation of millions of
// empty messages is refused on its count and size before the template or
// the tokenizer sees it (it cost seconds of CPU and gigabytes before).
func TestChatMessagesBoundedBeforeRendering(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "qwen-tiny"
	cfg.MaxMessageBytes = 256 << 20
	cfg.MaxItemBytes = 64 << 10
	byteTokenizerDir(t, cfg.ModelRepo, "qwen-tiny", `{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}<|im_start|>assistant
`, 258)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	// A million (the attack sent 2.2 million); then few enough to pass
	// the count, too many for the size.
	for _, n := range []int{1_000_000, maxChatMessages + 1, 4000} {
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

// TestManyPromptCallsCharged: what a generation call's sequences hold on
// the host is charged to the in-flight budget (Hardening II, finding 3):
// a 24 KB call of 4,096 prompts held gigabytes the budget did not see.
// Here a budget that fits small calls refuses the 4,096-prompt one at
// once, serves a small one beside it, and the many-prompt call that fits
// a larger budget runs without holding a sampling buffer per prompt.
func TestManyPromptCallsCharged(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "qwen-tiny"
	cfg.MaxInflightBytes = 32 << 20
	// Qwen's vocabulary size, so that a sampling buffer is what it is for
	// Qwen (1.8 MB).
	byteTokenizerDir(t, cfg.ModelRepo, "qwen-tiny", "{{ messages[0].content }}", 151936)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	generate := func(n, maxTokens int) error {
		prompts := make([]string, n)
		for i := range prompts {
			prompts[i] = "hi"
		}
		st, err := c.Generate(ctx, &brokerv1.GenerateRequest{Model: "qwen-tiny", Prompts: prompts,
			Sampling: &brokerv1.SamplingParams{MaxTokens: int32(maxTokens), IgnoreEos: true}})
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
	// 4,096 × (16 KiB + 64 tokens' bytes) is over 64 MiB: more than the
	// whole 32 MiB budget.
	if err := generate(4096, 64); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "max-inflight-bytes") {
		t.Errorf("4,096 prompts over a 32 MiB budget: %v; want INVALID_ARGUMENT naming --max-inflight-bytes", err)
	}
	if err := generate(2, 4); err != nil {
		t.Errorf("a small call beside it: %v", err)
	}

	// 1,024 prompts of one token each fit (17 MiB). Each sampled step
	// borrows a [V] buffer (1.8 MB for this vocabulary); holding one per
	// prompt, as before, is 1.8 GB. The peak heap must stay well below.
	var peak atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	err := generate(1024, 1)
	close(stop)
	<-done
	if err != nil {
		t.Fatalf("1,024 prompts: %v", err)
	}
	t.Logf("peak heap during the 1,024-prompt call: %d MB", peak.Load()>>20)
	if peak.Load() > 900<<20 {
		t.Errorf("peak heap %d MB during a 1,024-prompt call: sequences hold per-prompt sampling buffers again", peak.Load()>>20)
	}
}

// containsOneOf reports whether s contains one of the |-separated wants.
func containsOneOf(s, wants string) bool {
	for _, w := range strings.Split(wants, "|") {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}
