package daemon

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/config"
)

// readZstd is the decompressed contents of a zstd file (the tokenizers'
// test copies are compressed).
func readZstd(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := zstd.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	b, err := io.ReadAll(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// qwenTokenizerFiles returns Qwen3's real tokenizer.json and
// tokenizer_config.json (runtime/models/tokenizer/bpe's test copies).
func qwenTokenizerFiles(t testing.TB) (tokenizerJSON, tokenizerConfig []byte) {
	t.Helper()
	src := "../runtime/models/tokenizer/bpe/testdata/qwen3"
	tj := readZstd(t, filepath.Join(src, "tokenizer.json.zst"))
	cfg, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tj, cfg
}

// llmHTTPConfig is testConfig with an empty repository that loads model,
// the HTTP APIs on a free port and key as their one API key.
func llmHTTPConfig(t *testing.T, model, key string) config.Config {
	t.Helper()
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = model
	cfg.HTTPListen = "127.0.0.1:0"
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.APIKeysFile = keys
	return cfg
}

// qwenDir writes a version directory holding Qwen3's real tokenizer files
// (runtime/models/tokenizer/bpe's test copies) and returns it with the
// vocabulary size and the EOS id.
func qwenDir(t testing.TB, repo, name string) (int, int) {
	t.Helper()
	tj, cfg := qwenTokenizerFiles(t)
	dir := versionDir(t, repo, name, 1)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	tok := qwenTokenizer(t)
	eos, ok := tok.EOS()
	if !ok {
		t.Fatal("Qwen3's tokenizer has no EOS")
	}
	return tok.VocabSize(), int(eos)
}

// TestLLMWithRealTokenizer serves a (random-weight) model with Qwen3's real
// tokenizer and chat template through brokerd's default tokenizer loader:
// chat over gRPC renders the template and streams whole UTF-8 text, and the
// official ollama and openai npm clients generate and chat against it.
func TestLLMWithRealTokenizer(t *testing.T) {
	cfg := llmHTTPConfig(t, "qwen-tiny", "k-llm")
	v, eos := qwenDir(t, cfg.ModelRepo, "qwen-tiny")
	writeTinyLlamaVocab(t, cfg.ModelRepo, "qwen-tiny", v, eos)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	st, err := c.Chat(ctx, &brokerv1.ChatRequest{Model: "qwen-tiny", Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{
		{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name a color 🎨"}}}},
		Sampling: &brokerv1.SamplingParams{MaxTokens: 24, IgnoreEos: true}})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	var res *brokerv1.GenerationResult
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, dl := range m.GetDeltas() {
			if !utf8.ValidString(dl.GetText()) {
				t.Errorf("a delta that is not UTF-8: %q", dl.GetText())
			}
			text.WriteString(dl.GetText())
		}
		if len(m.GetResults()) > 0 {
			res = m.GetResults()[0]
		}
	}
	// Qwen3's template wraps each turn in <|im_start|>role ... <|im_end|>:
	// two turns and the generation prompt are well over 20 tokens.
	if res.GetUsage().GetCompletionTokens() != 24 || res.GetUsage().GetPromptTokens() < 20 {
		t.Errorf("result %v", res)
	}
	t.Logf("random weights said %q", text.String())

	// A prompt of token ids runs as its text does (no special tokens added
	// to either); an id outside the vocabulary is the caller's error.
	const council = "The council meets at dawn"
	greedy := &brokerv1.SamplingParams{Temperature: new(float32), MaxTokens: 8}
	byText, _, err := generateTexts(t, c, &brokerv1.GenerateRequest{Model: "qwen-tiny", Prompts: []string{council}, AddSpecialTokens: proto.Bool(false), Sampling: greedy})
	if err != nil {
		t.Fatal(err)
	}
	ids := qwenTokenizer(t).Encode(council, false)
	byIDs, _, err := generateTexts(t, c, &brokerv1.GenerateRequest{Model: "qwen-tiny", TokenPrompts: []*brokerv1.TokenPrompt{{Ids: ids}}, Sampling: greedy})
	if err != nil || byIDs[0] != byText[0] {
		t.Errorf("the prompt's %d ids gave %q (%v); its text %q", len(ids), byIDs, err, byText[0])
	}
	if _, _, err := generateTexts(t, c, &brokerv1.GenerateRequest{Model: "qwen-tiny", TokenPrompts: []*brokerv1.TokenPrompt{{Ids: []int32{ids[0], 1 << 30}}}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an id outside the vocabulary: %v", err)
	}
	runClients(t, "http://"+d.addrs.HTTP, "k-llm", "daemon", "LLM=qwen-tiny")
}
