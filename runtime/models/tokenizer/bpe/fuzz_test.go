package bpe

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzEncode: Encode never panics, and Decode(Encode(s)) gives s back (NFC
// for Qwen's normalizer); invalid UTF-8 comes back byte for byte too, since
// byte-level BPE keeps every byte.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "Hello world", "I'm  \n\n  x", "12345", "👨‍👩‍👧‍👦", "<|im_start|>a<|im_end|>", "e\u0301", "\xff\xfe a", "'ſ \u0085"} {
		f.Add(s)
	}
	tok := qwen3.get(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s, false)
		got := tok.Decode(ids, false)
		if !utf8.ValidString(got) {
			t.Fatalf("Decode gave invalid UTF-8 %q", got)
		}
		if utf8.ValidString(s) {
			if want := norm.NFC.String(s); got != want {
				t.Fatalf("Decode(Encode(%q)) = %q, want %q", s, got, want)
			}
			return
		}
		// Invalid UTF-8: Decode replaces it, but the tokens still hold
		// every byte of the normalised text.
		var b []byte
		for _, id := range ids {
			b = append(b, tok.TokenBytes(id)...)
		}
		if want := norm.NFC.String(s); string(b) != want {
			t.Fatalf("bytes of Encode(%q) = %q, want %q", s, b, want)
		}
	})
}

// FuzzSplit: the pieces of the matcher cover the input exactly, none empty.
func FuzzSplit(f *testing.F) {
	for _, s := range []string{"", "a  b", " \n \r\n\t x", "don't 'LL", "1234567"} {
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, s string, llama bool) {
		sp := splitter{maxDigits: 1}
		if llama {
			sp.maxDigits = 3
		}
		var b strings.Builder
		sp.split(s, func(p string) {
			if p == "" {
				t.Fatal("empty piece")
			}
			b.WriteString(p)
		})
		if b.String() != s {
			t.Fatalf("pieces of %q join to %q", s, b.String())
		}
	})
}

// tinyTokenizer is a small valid tokenizer.json: every byte, a few merges,
// two added tokens, the Llama 3 pipeline.
func tinyTokenizer() []byte {
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w"}
	for _, m := range merges {
		vocab[strings.ReplaceAll(m, " ", "")] = len(vocab)
	}
	file := map[string]any{
		"added_tokens": []any{
			map[string]any{"id": 300, "content": "<|bos|>", "special": true},
			map[string]any{"id": 301, "content": "<|eos|>", "special": true},
		},
		"normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternLlama3}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<|bos|>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}},
			"special_tokens": map[string]any{"<|bos|>": map[string]any{"id": "<|bos|>", "ids": []int{300}}}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": false},
	}
	b, err := json.Marshal(file)
	if err != nil {
		panic(err)
	}
	return b
}

func TestTinyTokenizer(t *testing.T) {
	tok, err := Parse(tinyTokenizer(), []byte(`{"bos_token": "<|bos|>", "eos_token": {"content": "<|eos|>"}}`), []byte(`{"eos_token_id": 301}`))
	if err != nil {
		t.Fatal(err)
	}
	hello, _ := tok.TokenID("hello")
	gw, _ := tok.TokenID("Ġw")
	got := fmt.Sprint(tok.Encode("hello world<|eos|>", true))
	want := fmt.Sprint([]int32{300, hello, gw, 'o', 'r', 'l', 'd', 301})
	if got != want {
		t.Errorf("Encode = %s, want %s", got, want)
	}
	if bos, _ := tok.BOS(); bos != 300 {
		t.Errorf("BOS = %d", bos)
	}
}

// TestParseRefuses: what the package does not implement is named, never
// approximated.
func TestParseRefuses(t *testing.T) {
	good := string(tinyTokenizer())
	tests := []struct{ name, from, to, want string }{
		{"model", `"type":"BPE"`, `"type":"WordPiece"`, `model.type "WordPiece"`},
		{"pattern", `\\s+(?!\\S)|\\s+`, `\\s+`, "pattern"},
		{"use_regex", `"use_regex":false`, `"use_regex":true`, "use_regex"},
		{"decoder", `"decoder":{"type":"ByteLevel"}`, `"decoder":{"type":"WordPiece"}`, "decoder"},
		{"merge", `"hell o"`, `"hell zz"`, "merge"},
		{"added id", `"id":301`, `"id":-5`, "outside"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(good, tc.from, tc.to, 1)
			if bad == good {
				t.Fatalf("%q not found in the tiny tokenizer", tc.from)
			}
			_, err := Parse([]byte(bad), nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// FuzzParse: hostile tokenizer.json and tokenizer_config.json files give an
// error or a usable tokenizer, never a panic.
func FuzzParse(f *testing.F) {
	f.Add(tinyTokenizer(), []byte(`{"bos_token": "<|bos|>", "chat_template": "{{ messages[0].content }}"}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]]},"decoder":{"type":"ByteLevel"},"pre_tokenizer":{"type":"ByteLevel","use_regex":false}}`), []byte(`{}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":99999999}}}`), []byte(`null`))
	f.Add([]byte(`[]`), []byte(`{"chat_template": [{"name": "default", "template": "{% for %}"}]}`))
	f.Fuzz(func(t *testing.T, tokJSON, cfgJSON []byte) {
		tok, err := Parse(tokJSON, cfgJSON, nil)
		if err != nil {
			return
		}
		ids := tok.Encode("hello <|bos|> wörld 你好", true)
		_ = tok.Decode(ids, false)
		d := tok.NewStreamDecoder(true)
		for _, id := range append(ids, -1, int32(tok.VocabSize())) {
			_ = d.Push(id)
		}
		_ = d.Flush()
		if tok.HasChatTemplate() {
			_, _ = tok.ApplyChatTemplate(context.Background(), []Message{{Role: "user", Content: "hi"}},
				ChatOptions{AddGenerationPrompt: true, Limits: TemplateLimits{MaxSteps: 20_000, MaxAllocBytes: 1 << 20, MaxTime: time.Second}})
		}
	})
}
