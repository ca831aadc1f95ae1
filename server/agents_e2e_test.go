package server

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
)

// qwenTokenizer is Qwen3's real tokenizer (the test copy qwenDir writes).
func qwenTokenizer(t *testing.T) *bpe.Tokenizer {
	t.Helper()
	src := "../runtime/models/tokenizer/bpe/testdata/qwen3"
	f, err := os.Open(filepath.Join(src, "tokenizer.json.zst"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := zstd.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tj, err := io.ReadAll(d)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := bpe.Parse(tj, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestLogprobsText: over gRPC every logprob entry, the chosen token and
// each of top_logprobs alternatives, carries the token's bytes as Qwen3's
// tokenizer has them and its text (the bytes when UTF-8, else vLLM's
// "bytes:\xNN" form), on a random-weight model served by a real brokerd.
func TestLogprobsText(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "qwen-tiny"
	v, eos := qwenDir(t, cfg.ModelRepo, "qwen-tiny")
	writeTinyLlamaVocab(t, cfg.ModelRepo, "qwen-tiny", v, eos)
	tok := qwenTokenizer(t)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	const n, top = 24, 5
	st, err := c.Generate(testCtx(t), &brokerv1.GenerateRequest{Model: "qwen-tiny", Prompts: []string{"Name a color 🎨 and a fruit"},
		Sampling: &brokerv1.SamplingParams{MaxTokens: n, IgnoreEos: true, Temperature: new(float32), Logprobs: true, TopLogprobs: top}})
	if err != nil {
		t.Fatal(err)
	}
	entries := 0
	var ids []int32
	check := func(what string, lp *brokerv1.TokenLogprob) {
		want := tok.TokenBytes(lp.GetTokenId())
		if string(lp.GetBytes()) != string(want) || len(want) == 0 {
			t.Errorf("%s: token %d bytes %q, want %q", what, lp.GetTokenId(), lp.GetBytes(), want)
		}
		switch {
		case utf8.Valid(want) && lp.GetText() != string(want):
			t.Errorf("%s: token %d text %q, want %q", what, lp.GetTokenId(), lp.GetText(), want)
		case !utf8.Valid(want) && !strings.HasPrefix(lp.GetText(), `bytes:\x`):
			t.Errorf("%s: token %d of partial UTF-8 %q has text %q", what, lp.GetTokenId(), want, lp.GetText())
		}
	}
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, dl := range m.GetDeltas() {
			ids = append(ids, dl.GetTokenIds()...)
			for i, e := range dl.GetLogprobs() {
				entries++
				check("chosen", e.GetChosen())
				if e.GetChosen().GetTokenId() != dl.GetTokenIds()[i] {
					t.Errorf("chosen token %d, delta's %d", e.GetChosen().GetTokenId(), dl.GetTokenIds()[i])
				}
				if len(e.GetTop()) != top {
					t.Errorf("%d alternatives, want %d", len(e.GetTop()), top)
				}
				for _, a := range e.GetTop() {
					check("alternative", a)
				}
				// Greedy: the chosen token is the most likely one.
				if e.GetTop()[0].GetTokenId() != e.GetChosen().GetTokenId() {
					t.Errorf("greedy chose %d, the likeliest is %d", e.GetChosen().GetTokenId(), e.GetTop()[0].GetTokenId())
				}
			}
		}
	}
	if entries != n || len(ids) != n {
		t.Errorf("%d logprob entries and %d ids for %d tokens", entries, len(ids), n)
	}
}

func TestTokenText(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want string
	}{
		{[]byte("hello"), "hello"},
		{[]byte(" ü"), " ü"},
		{[]byte{0xe2, 0x80}, `bytes:\xe2\x80`},
		{[]byte{'a', 0xff}, `bytes:\x61\xff`},
		{nil, ""},
	} {
		if got := tokenText(tc.in); got != tc.want {
			t.Errorf("tokenText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
