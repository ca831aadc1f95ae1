package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/client"
	"github.com/brokerd/brokerd/daemon/daemontest"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// startBrokerd runs a real brokerd in-process on a Unix socket, with a model
// repository holding an MLP and a small chat model, and returns its socket.
func startBrokerd(t *testing.T) string {
	t.Helper()
	cfg := daemontest.Config(t.TempDir())
	if _, err := modelkit.WriteMLP(filepath.Join(cfg.ModelRepo, "mlp", "1"), modelkit.MLP{In: 4, Hidden: 8, Out: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := modelkit.WriteLLM(filepath.Join(cfg.ModelRepo, "chat", "1"), modelkit.LLM{Arch: "qwen3", Layers: 1, Hidden: 32, Heads: 2,
		KVHeads: 1, HeadDim: 16, Intermediate: 64, Tied: true, DType: "f32", TokenizerDir: "../runtime/models/tokenizer/bpe/testdata/qwen3"}); err != nil {
		t.Fatal(err)
	}
	return daemontest.Start(t, cfg).Socket
}

// testCtx bounds a whole test's calls: far above what they take (seconds;
// a minute or more for loading and running the chat model under -race on
// a loaded machine), so only a call that never ends fails it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestClientAgainstBrokerd(t *testing.T) {
	socket := startBrokerd(t)
	ctx := testCtx(t)
	c, err := client.Dial(ctx, client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	if err := c.Healthy(ctx); err != nil {
		t.Fatal(err)
	}
	devs, err := c.Devices(ctx)
	if err != nil || len(devs) == 0 || devs[0].GetId() != "cpu:0" {
		t.Fatalf("Devices = %v, %v", devs, err)
	}

	t.Run("encode, decode, verify", func(t *testing.T) {
		texts := []string{"the cat sat on the mat", "ünïcödé ✓", "a"}
		res, err := c.EncodeTexts(ctx, "", texts, client.Both)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.GetId() != string(rune('0'+i)) || len(r.GetVector()) != 384 {
				t.Errorf("result %d: id %q, %d dims", i, r.GetId(), len(r.GetVector()))
			}
			orig, err := client.Decode(r)
			if err != nil || string(orig) != texts[i] {
				t.Errorf("Decode(%d) = %q, %v; want %q", i, orig, err, texts[i])
			}
		}
		tampered := res[0]
		tampered.Signature = res[1].GetSignature()
		if _, err := client.Decode(tampered); !errors.Is(err, client.ErrSignature) {
			t.Errorf("Decode of a code under another's signature: %v, want ErrSignature", err)
		}
	})

	t.Run("an answer larger than gRPC's default receive limit", func(t *testing.T) {
		// 3,000 records with vectors and codes are about 5 MB: one Encode
		// answer would exceed a default client's 4 MiB.
		texts := make([]string, 3000)
		for i := range texts {
			texts[i] = strings.Repeat("record ", 20) + string(rune('a'+i%26))
		}
		res, err := c.EncodeTexts(ctx, "", texts, client.Both)
		if err != nil || len(res) != len(texts) {
			t.Fatalf("%d results, %v", len(res), err)
		}
	})

	t.Run("models, load, infer, unload", func(t *testing.T) {
		if _, err := c.Load(ctx, "mlp", 0); err != nil {
			t.Fatal(err)
		}
		ms, err := c.Models(ctx)
		if err != nil || !strings.Contains(ms.String(), "mlp") {
			t.Fatalf("Models = %v, %v", ms, err)
		}
		r, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "mlp", Inputs: []*brokerv1.Tensor{
			client.FloatTensor("input", []int64{2, 4}, []float32{1, 2, 3, 4, 5, 6, 7, 8})}})
		if err != nil || len(r.GetOutputs()) != 1 {
			t.Fatalf("Infer = %v, %v", r, err)
		}
		if out, err := client.Floats(r.GetOutputs()[0]); err != nil || len(out) != 6 {
			t.Errorf("output %v, %v", out, err)
		}
		if err := c.Unload(ctx, "mlp"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("typed errors", func(t *testing.T) {
		_, err := c.EncodeTexts(ctx, "no-such-model", []string{"x"}, client.Semantic)
		e, ok := client.AsError(err)
		if !ok || e.Code != codes.NotFound || e.Retryable() {
			t.Fatalf("unknown model: %#v", err)
		}
		if _, err := c.Load(ctx, "../etc", 0); err == nil {
			t.Error("a path as a model name was loaded")
		} else if e, _ := client.AsError(err); e.Code != codes.InvalidArgument {
			t.Errorf("a path as a model name: %v", err)
		}
	})

	t.Run("generate and chat", func(t *testing.T) {
		if _, err := c.Load(ctx, "chat", 0); err != nil {
			t.Fatal(err)
		}
		texts, err := client.Text(c.Generate(ctx, &brokerv1.GenerateRequest{Model: "chat", Prompts: []string{"one", "two"},
			Sampling: &brokerv1.SamplingParams{MaxTokens: 5, IgnoreEos: true}}))
		if err != nil || len(texts) != 2 {
			t.Fatalf("Generate: %q, %v", texts, err)
		}
		var results int
		for m, err := range c.Chat(ctx, &brokerv1.ChatRequest{Model: "chat", Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "hi"}}}},
			Sampling: &brokerv1.SamplingParams{MaxTokens: 4, IgnoreEos: true}}) {
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range m.GetResults() {
				results++
				if r.GetUsage().GetCompletionTokens() != 4 {
					t.Errorf("chat result %v", r)
				}
			}
		}
		if results != 1 {
			t.Errorf("%d chat results, want 1", results)
		}
		// Answers gathers each prompt's text, ids, logprobs and result.
		ans, err := client.Answers(c.Generate(ctx, &brokerv1.GenerateRequest{Model: "chat", Prompts: []string{"one", "two"},
			Sampling: &brokerv1.SamplingParams{MaxTokens: 5, IgnoreEos: true, Logprobs: true, TopLogprobs: 2}}))
		if err != nil || len(ans) != 2 {
			t.Fatalf("Answers: %v, %v", ans, err)
		}
		for i, a := range ans {
			if len(a.TokenIDs) != 5 || len(a.Logprobs) != 5 || a.Result.GetUsage().GetCompletionTokens() != 5 {
				t.Errorf("answer %d: %d ids, %d logprobs, result %v", i, len(a.TokenIDs), len(a.Logprobs), a.Result)
				continue
			}
			for j, e := range a.Logprobs {
				if e.GetChosen().GetTokenId() != a.TokenIDs[j] || e.GetChosen().GetText() == "" || len(e.GetTop()) != 2 ||
					e.GetTop()[0].GetText() == "" || e.GetTop()[1].GetText() == "" {
					t.Errorf("answer %d token %d: %v", i, j, e)
				}
			}
		}
		// Structured output: a schema's answer parses, at temperature 1
		// on random weights; a constraint brokerd cannot compile is
		// INVALID_ARGUMENT.
		one := float32(1)
		schema := `{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}}, "required": ["n", "ok"], "additionalProperties": false}`
		ans, err = client.Answers(c.Generate(ctx, &brokerv1.GenerateRequest{Model: "chat", Prompts: []string{"one", "two"},
			Sampling: &brokerv1.SamplingParams{MaxTokens: 100, Temperature: &one, Constraint: client.JSONSchema(schema)}}))
		if err != nil || len(ans) != 2 {
			t.Fatalf("Answers under a schema: %v, %v", ans, err)
		}
		for i, a := range ans {
			var v struct {
				N  *int  `json:"n"`
				OK *bool `json:"ok"`
			}
			if err := json.Unmarshal([]byte(a.Text), &v); err != nil || v.N == nil || v.OK == nil || *v.N > 9 ||
				a.Result.GetFinishReason() != brokerv1.FinishReason_FINISH_REASON_STOP {
				t.Errorf("answer %d under a schema: %q (%v), %v", i, a.Text, a.Result.GetFinishReason(), err)
			}
		}
		texts, err = client.Text(c.Generate(ctx, &brokerv1.GenerateRequest{Model: "chat", Prompts: []string{"x"},
			Sampling: &brokerv1.SamplingParams{MaxTokens: 20, Temperature: &one, Constraint: client.Regex("[0-9]{3}")}}))
		if err != nil || len(texts) != 1 || len(texts[0]) != 3 || strings.Trim(texts[0], "0123456789") != "" {
			t.Errorf("a regex answer: %q, %v", texts, err)
		}
		if _, err := client.Text(c.Generate(ctx, &brokerv1.GenerateRequest{Model: "chat", Prompts: []string{"x"},
			Sampling: &brokerv1.SamplingParams{Constraint: client.Grammar(`root ::= undefined`)}})); err == nil {
			t.Error("an invalid grammar was taken")
		} else if e, ok := client.AsError(err); !ok || e.Code != codes.InvalidArgument {
			t.Errorf("an invalid grammar: %v", err)
		}
		// Breaking out of the loop ends the call: the next one is served.
		for _, err := range c.Generate(ctx, &brokerv1.GenerateRequest{Model: "chat", Prompts: []string{"long"},
			Sampling: &brokerv1.SamplingParams{MaxTokens: 2000, IgnoreEos: true}}) {
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		if _, err := client.Text(c.Generate(ctx, &brokerv1.GenerateRequest{Model: "nope", Prompts: []string{"x"}})); err == nil {
			t.Error("Generate of an unknown model succeeded")
		} else if e, ok := client.AsError(err); !ok || e.Code != codes.NotFound {
			t.Errorf("Generate of an unknown model: %v", err)
		}
	})
}
