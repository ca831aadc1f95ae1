package bpe

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// vocabOf writes a fixture's tokenizer.json as the arrays a GGUF file holds
// (what llama.cpp's convert_hf_to_gguf.py writes): tokens by id, added
// special tokens as control, other added tokens as user-defined.
func vocabOf(t *testing.T, f *fixture, pre string) Vocab {
	t.Helper()
	tok := f.get(t)
	var file struct {
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		Model struct {
			Vocab  map[string]int    `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(f.rawJSON, &file); err != nil {
		t.Fatal(err)
	}
	v := Vocab{Model: "gpt2", Pre: pre, BOS: -1, EOS: -1, PAD: -1, UNK: -1}
	v.Tokens = make([]string, tok.VocabSize())
	v.Types = make([]int32, tok.VocabSize())
	for i := range v.Tokens {
		v.Tokens[i] = "[PAD" + string(rune('0'+i%10)) + "]" // ids no file names: unused
		v.Types[i] = TokenUnused
	}
	for s, id := range file.Model.Vocab {
		v.Tokens[id], v.Types[id] = s, TokenNormal
	}
	for _, a := range file.AddedTokens {
		v.Tokens[a.ID], v.Types[a.ID] = a.Content, TokenUserDefined
		if a.Special {
			v.Types[a.ID] = TokenControl
		}
	}
	for _, m := range file.Model.Merges {
		var s string
		if json.Unmarshal(m, &s) != nil {
			var pair []string
			if err := json.Unmarshal(m, &pair); err != nil || len(pair) != 2 {
				t.Fatalf("merge %s", m)
			}
			s = pair[0] + " " + pair[1]
		}
		v.Merges = append(v.Merges, s)
	}
	if id, ok := tok.BOS(); ok {
		v.BOS = id
	}
	if id, ok := tok.EOS(); ok {
		v.EOS = id
	}
	v.AddBOS = len(tok.prefix) > 0
	for _, id := range tok.EOSIDs() {
		if id != v.EOS {
			v.EOT = append(v.EOT, id)
		}
	}
	cfg, err := os.ReadFile(filepath.Join("testdata", f.name, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		t.Fatal(err)
	}
	v.ChatTemplate = c.ChatTemplate
	return v
}

// TestVocabMatchesTokenizerJSON: Qwen3's and Llama 3's tokenizers built
// from GGUF-style arrays encode every test string to the same ids as from
// their tokenizer.json, with and without the specials, and render the same
// chat prompts.
func TestVocabMatchesTokenizerJSON(t *testing.T) {
	e := loadExpected(t)
	for _, tc := range []struct {
		f   *fixture
		pre string
	}{{qwen3, "qwen2"}, {llama3, "llama-bpe"}} {
		t.Run(tc.f.name, func(t *testing.T) {
			want := tc.f.get(t)
			got, err := NewFromVocab(vocabOf(t, tc.f, tc.pre))
			if err != nil {
				t.Fatal(err)
			}
			texts := append(slices.Clone(e.Strings), "<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|><|eot_id|>", "<think>\n\n</think>")
			for _, s := range texts {
				for _, special := range []bool{false, true} {
					if g, w := got.Encode(s, special), want.Encode(s, special); !slices.Equal(g, w) {
						t.Fatalf("Encode(%q, %v) = %v, tokenizer.json gives %v", s, special, g, w)
					}
				}
			}
			if !slices.Equal(got.EOSIDs(), want.EOSIDs()) {
				t.Errorf("EOS ids %v, tokenizer.json gives %v", got.EOSIDs(), want.EOSIDs())
			}
			ctx := context.Background()
			g, err1 := got.ApplyChatTemplate(ctx, multiTurn, ChatOptions{AddGenerationPrompt: true})
			w, err2 := want.ApplyChatTemplate(ctx, multiTurn, ChatOptions{AddGenerationPrompt: true})
			if err1 != nil || err2 != nil || g != w {
				t.Errorf("chat prompt %q (%v), tokenizer.json gives %q (%v)", g, err1, w, err2)
			}
		})
	}
}

// TestVocabRefusals: arrays from a hostile or unsupported file are errors
// naming what is wrong, never a panic.
func TestVocabRefusals(t *testing.T) {
	base := func() Vocab {
		return Vocab{Model: "gpt2", Pre: "qwen2", Tokens: []string{"a", "b", "ab", "<|x|>"}, Types: []int32{1, 1, 1, 3},
			Merges: []string{"a b"}, BOS: -1, EOS: 3, PAD: -1, UNK: -1}
	}
	if _, err := NewFromVocab(base()); err != nil {
		t.Fatalf("the base vocabulary: %v", err)
	}
	for _, tc := range []struct {
		name, want string
		edit       func(*Vocab)
	}{
		{"SentencePiece", `model "llama"`, func(v *Vocab) { v.Model = "llama" }},
		{"GPT-2 pre-tokenizer", `pre-tokenizer "default"`, func(v *Vocab) { v.Pre = "default" }},
		{"empty", "empty vocabulary", func(v *Vocab) { v.Tokens, v.Types = nil, nil }},
		{"types short", "token types", func(v *Vocab) { v.Types = v.Types[:2] }},
		{"unknown type", "unknown type", func(v *Vocab) { v.Types[0] = 99 }},
		{"byte token", "byte token", func(v *Vocab) { v.Types[0] = TokenByte }},
		{"merge of unknown", "merge 0", func(v *Vocab) { v.Merges = []string{"a c"} }},
		{"merge not a pair", "merge 0", func(v *Vocab) { v.Merges = []string{"ab"} }},
		{"eos out of range", "eos id 4", func(v *Vocab) { v.EOS = 4 }},
		{"bos negative", "bos id -2", func(v *Vocab) { v.BOS = -2 }},
		{"eot out of range", "end-of-turn id 100", func(v *Vocab) { v.EOT = []int32{100} }},
		{"add bos without bos", "add_bos_token", func(v *Vocab) { v.AddBOS = true }},
		{"long token", "bytes (limit", func(v *Vocab) { v.Tokens[0] = strings.Repeat("x", maxTokenBytes+1) }},
		{"empty control token", "empty", func(v *Vocab) { v.Tokens[3] = "" }},
		{"bad template", "chat template", func(v *Vocab) { v.ChatTemplate = "{% for %}" }},
		{"hostile template", "over its limits", func(v *Vocab) { v.ChatTemplate = "{{ " + strings.Repeat("(", 2<<20) + " }}" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := base()
			tc.edit(&v)
			_, err := NewFromVocab(v)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v; want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
}

// FuzzNewFromVocab: a GGUF file's tokenizer arrays and chat template (the
// path a .gguf's tokenizer.chat_template takes) never crash the load or a
// bounded render.
func FuzzNewFromVocab(f *testing.F) {
	f.Add("a\x00b\x00ab\x00<|x|>", "a b", "{% for m in messages %}{{ m.content }}{% endfor %}", int32(3))
	f.Add("a\x00b", "a c", `{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}`, int32(0))
	f.Add("<|x|>\x00x", "", `{{ messages|tojson(indent=2) }}`, int32(1))
	lim := TemplateLimits{MaxSteps: 20_000, MaxOutputBytes: 1 << 16, MaxAllocBytes: 1 << 20, MaxTime: time.Second}
	f.Fuzz(func(t *testing.T, tokens, merges, tmpl string, eos int32) {
		v := Vocab{Model: "gpt2", Pre: "qwen2", Tokens: strings.Split(tokens, "\x00"), BOS: -1, EOS: eos, PAD: -1, UNK: -1, ChatTemplate: tmpl}
		if merges != "" {
			v.Merges = strings.Split(merges, "\n")
		}
		v.Types = make([]int32, len(v.Tokens))
		for i, s := range v.Tokens {
			v.Types[i] = TokenNormal
			if strings.HasPrefix(s, "<|") {
				v.Types[i] = TokenControl
			}
		}
		tok, err := NewFromVocab(v)
		if err != nil {
			return
		}
		_ = tok.Decode(tok.Encode("ab <|x|> a", true), false)
		if tok.HasChatTemplate() {
			_ = tok.CheckChatTemplate(context.Background(), lim)
		}
	})
}
