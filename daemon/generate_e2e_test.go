package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/llm/llmtest"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// byteTokenizer is a test tokenizer: a token per byte (id = byte + 3),
// BOS 1, EOS 2; a chat template of "<role>content\n" lines.
type byteTokenizer struct{}

// byteTokenizers is an Options.Tokenizers loading byteTokenizer for every
// model.
func byteTokenizers(context.Context, string, func(string, int64) ([]byte, error)) (llm.Tokenizer, llm.ChatTemplate, error) {
	return byteTokenizer{}, byteTokenizer{}, nil
}

func (byteTokenizer) Encode(text string, addSpecial bool, maxTokens int) ([]int32, bool, error) {
	var ids []int32
	if addSpecial {
		ids = append(ids, 1)
	}
	for _, b := range []byte(text) {
		ids = append(ids, int32(b)+3)
	}
	if maxTokens > 0 && len(ids) > maxTokens {
		return ids[:maxTokens+1], true, nil
	}
	return ids, false, nil
}

func (byteTokenizer) NewDetokenizer() llm.Detokenizer { return &byteDetok{} }

func (byteTokenizer) TokenBytes(id int32) []byte {
	if id < 3 || id > 258 {
		return nil
	}
	return []byte{byte(id - 3)}
}

type byteDetok struct{ held []byte }

func (d *byteDetok) Next(id int32) string {
	if id < 3 || id > 258 {
		return ""
	}
	d.held = append(d.held, byte(id-3))
	// Keep whole UTF-8 only; the tiny random model emits any byte.
	out := strings.ToValidUTF8(string(d.held), "\uFFFD")
	d.held = d.held[:0]
	return out
}
func (d *byteDetok) Flush() string { return "" }

func (byteTokenizer) Render(_ context.Context, msgs []llm.Message, opts llm.ChatOptions) (string, error) {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "<%s>%s\n", m.Role, m.Content)
	}
	if opts.AddGenerationPrompt {
		b.WriteString("<assistant>")
	}
	return b.String(), nil
}

// writeTinyLlama writes a random Llama checkpoint (vocab 300) as the
// repository's model name, version 1.
func writeTinyLlama(t testing.TB, repo, name string) {
	t.Helper()
	writeTinyLlamaVocab(t, repo, name, 300, 2)
}

// writeTinyLlamaVocab writes it with vocabulary size v and EOS id eos.
func writeTinyLlamaVocab(t testing.TB, repo, name string, v, eos int) {
	t.Helper()
	cfg, w := llmtest.TinyLlama(v, eos)
	dir := versionDir(t, repo, name, 1)
	writeJSON(t, filepath.Join(dir, "config.json"), cfg)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		writeJSON(t, filepath.Join(dir, "tokenizer.json"), map[string]any{"note": "read by the test's loader"})
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), w, "F32"); err != nil {
		t.Fatal(err)
	}
}

// TestGenerateEndToEnd loads a decoder LLM from the repository, places it
// on the CPU (real engine, real oneDNN device) and generates through the
// gRPC API: a round of prompts batched together, seeded sampling that
// repeats, the KV-cache gauge back to zero afterwards.
func TestGenerateEndToEnd(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "tiny-llm"
	writeTinyLlama(t, cfg.ModelRepo, "tiny-llm")
	d := startDaemonWith(t, Options{Config: cfg, Tokenizers: byteTokenizers})
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)

	run := func(req *brokerv1.GenerateRequest) ([][]int32, []*brokerv1.GenerationResult) {
		t.Helper()
		st, err := c.Generate(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([][]int32, len(req.GetPrompts()))
		res := make([]*brokerv1.GenerationResult, len(req.GetPrompts()))
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, dl := range m.GetDeltas() {
				ids[dl.GetIndex()] = append(ids[dl.GetIndex()], dl.GetTokenIds()...)
			}
			for _, r := range m.GetResults() {
				res[r.GetIndex()] = r
			}
		}
		return ids, res
	}
	prompts := []string{"the council meets", "a", "memory records are kept in order"}
	greedy := &brokerv1.GenerateRequest{Model: "tiny-llm", Prompts: prompts,
		Sampling: &brokerv1.SamplingParams{Temperature: new(float32), MaxTokens: 12, IgnoreEos: true}}
	ids, res := run(greedy)
	for i := range prompts {
		if len(ids[i]) != 12 || res[i].GetUsage().GetCompletionTokens() != 12 || res[i].GetFinishReason() != brokerv1.FinishReason_FINISH_REASON_LENGTH ||
			res[i].GetUsage().GetPromptTokens() != int32(len(prompts[i])+1) || res[i].GetExecution().GetDeviceId() != "cpu:0" {
			t.Errorf("prompt %d: %d ids, result %v", i, len(ids[i]), res[i])
		}
	}
	// Greedy alone equals greedy in the round.
	alone, _ := run(&brokerv1.GenerateRequest{Model: "tiny-llm", Prompts: prompts[2:],
		Sampling: &brokerv1.SamplingParams{Temperature: new(float32), MaxTokens: 12, IgnoreEos: true}})
	if fmt.Sprint(alone[0]) != fmt.Sprint(ids[2]) {
		t.Errorf("prompt 2 alone %v, in the round %v", alone[0], ids[2])
	}
	// Seeded sampling repeats.
	seed := uint64(42)
	temp := float32(0.9)
	sampled := &brokerv1.GenerateRequest{Model: "tiny-llm", Prompts: prompts[:2],
		Sampling: &brokerv1.SamplingParams{Temperature: &temp, Seed: &seed, MaxTokens: 10, IgnoreEos: true}}
	a, _ := run(sampled)
	b, _ := run(sampled)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("seeded runs differ: %v / %v", a, b)
	}
	// Chat goes through the template.
	cs, err := c.Chat(ctx, &brokerv1.ChatRequest{Model: "tiny-llm", Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{
		{Role: "user", Content: "hi"}}}}, Sampling: &brokerv1.SamplingParams{MaxTokens: 3}})
	if err != nil {
		t.Fatal(err)
	}
	var chatUsage *brokerv1.Usage
	for {
		m, err := cs.Recv()
		if err != nil {
			break
		}
		for _, r := range m.GetResults() {
			chatUsage = r.GetUsage()
		}
	}
	if want := int32(len("<user>hi\n<assistant>")); chatUsage.GetPromptTokens() != want {
		t.Errorf("chat prompt tokens %d, want %d (the template, no BOS added)", chatUsage.GetPromptTokens(), want)
	}
	// A generator is not an Infer model.
	if _, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "tiny-llm", Inputs: []*brokerv1.Tensor{{Name: "prompt"}}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Infer on a generator: %v", err)
	}
	ms, err := c.ListModels(ctx, &brokerv1.ListModelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range ms.GetModels() {
		found = found || (m.GetName() == "tiny-llm" && m.GetKind() == "llm" && m.GetState() == brokerv1.ModelState_MODEL_STATE_READY)
	}
	if !found {
		t.Errorf("ListModels: %v", ms.GetModels())
	}
	resp, err := http.Get("http://" + d.addrs.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`brokerd_generation_kv_cache_blocks{device="cpu:0",model="tiny-llm@1",state="used"} 0`,
		`brokerd_generation_generated_tokens_total{device="cpu:0",model="tiny-llm@1"}`,
		`brokerd_generation_time_to_first_token_seconds_count{device="cpu:0",model="tiny-llm@1"}`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
