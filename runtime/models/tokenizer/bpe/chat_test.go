package bpe

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// withConfig returns a copy of a loaded tokenizer configured by another
// tokenizer_config.json (same vocabulary), without parsing tokenizer.json
// again.
func withConfig(t *testing.T, f *fixture, configPath string) *Tokenizer {
	t.Helper()
	cfg, err := os.ReadFile(configPath)
	if err != nil {
		t.Fatal(err)
	}
	c := *f.get(t)
	c.bos, c.eos, c.pad, c.eosIDs, c.chat = -1, -1, -1, nil, nil
	if err := c.configure(cfg, nil); err != nil {
		t.Fatal(err)
	}
	return &c
}

// withTemplate returns a copy of a loaded tokenizer with another template.
func withTemplate(t *testing.T, f *fixture, src string) *Tokenizer {
	t.Helper()
	c := *f.get(t)
	ct, err := compileTemplate(src)
	if err != nil {
		t.Fatal(err)
	}
	c.chat = ct
	return &c
}

var (
	sysUser = []Message{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: "  What is 2+2?\n"},
	}
	multiTurn = []Message{
		{Role: "system", Content: "You are terse."},
		{Role: "user", Content: "Hi"},
		{Role: "assistant", Content: "<think>\nThe user greets.\n</think>\n\nHello there."},
		{Role: "user", Content: "How are you?"},
	}
	userAssistant = []Message{
		{Role: "user", Content: "Hi"},
		{Role: "assistant", Content: "Hello."},
	}
)

// The expected strings are written out from what each template defines.
func TestChatTemplates(t *testing.T) {
	llama32Src, err := os.ReadFile(filepath.Join("testdata", "llama3_2_chat_template.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	llama31 := withConfig(t, llama3, filepath.Join("testdata", "llama3_1", "tokenizer_config.json"))
	llama32 := withTemplate(t, llama3, string(llama32Src))
	tests := []struct {
		name string
		tok  *Tokenizer
		msgs []Message
		opts ChatOptions
		want string
	}{
		{
			"llama3.1/system+user/generation", llama31, sysUser, ChatOptions{AddGenerationPrompt: true},
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n",
		},
		{
			"llama3.1/multi-turn", llama31, multiTurn, ChatOptions{},
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nThe user greets.\n</think>\n\nHello there.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>",
		},
		{
			// the Llama 3 (base) package's template adds the header unconditionally
			"llama3/user+assistant", llama3.get(t), userAssistant, ChatOptions{},
			"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n",
		},
		{
			"llama3.2/system+user/generation", llama32, sysUser,
			ChatOptions{AddGenerationPrompt: true, Vars: map[string]any{"date_string": "24 Nov 2026"}},
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
				"Cutting Knowledge Date: December 2023\nToday Date: 24 Nov 2026\n\n" +
				"You are a helpful assistant.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n",
		},
		{
			"llama3.2/no system/multi-turn", llama32, multiTurn[1:],
			ChatOptions{Vars: map[string]any{"date_string": "01 Jan 2025"}},
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
				"Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nThe user greets.\n</think>\n\nHello there.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>",
		},
		{
			"qwen3/system+user/generation", qwen3.get(t), sysUser, ChatOptions{AddGenerationPrompt: true},
			"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" +
				"<|im_start|>user\n  What is 2+2?\n<|im_end|>\n" +
				"<|im_start|>assistant\n",
		},
		{
			"qwen3/system+user/no generation", qwen3.get(t), sysUser, ChatOptions{},
			"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" +
				"<|im_start|>user\n  What is 2+2?\n<|im_end|>\n",
		},
		{
			"qwen3/thinking off", qwen3.get(t), sysUser[1:],
			ChatOptions{AddGenerationPrompt: true, Vars: map[string]any{"enable_thinking": false}},
			"<|im_start|>user\n  What is 2+2?\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
		},
		{
			// an assistant turn before the last user query loses its reasoning
			"qwen3/multi-turn/generation", qwen3.get(t), multiTurn, ChatOptions{AddGenerationPrompt: true},
			"<|im_start|>system\nYou are terse.<|im_end|>\n" +
				"<|im_start|>user\nHi<|im_end|>\n" +
				"<|im_start|>assistant\nHello there.<|im_end|>\n" +
				"<|im_start|>user\nHow are you?<|im_end|>\n" +
				"<|im_start|>assistant\n",
		},
		{
			// the last assistant turn, after the last query, gets an empty think block
			"qwen3/user+assistant", qwen3.get(t), userAssistant, ChatOptions{},
			"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello.<|im_end|>\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.tok.ApplyChatTemplate(context.Background(), tc.msgs, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got\n%q\nwant\n%q", got, tc.want)
			}
			// the specials written by the template encode as single ids
			ids := tc.tok.Encode(got, false)
			if first := tc.tok.Decode(ids[:1], false); !strings.HasPrefix(got, first) || !tc.tok.IsSpecial(ids[0]) {
				t.Errorf("first id %d (%q) is not the leading special token", ids[0], first)
			}
			if tc.tok.Decode(ids, false) != got {
				t.Error("prompt does not round-trip")
			}
		})
	}
}

func TestChatTemplateToday(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "llama3_2_chat_template.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tok := withTemplate(t, llama3, string(src))
	before := time.Now().Format("02 Jan 2006")
	got, err := tok.ApplyChatTemplate(context.Background(), sysUser[1:], ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now().Format("02 Jan 2006")
	if !strings.Contains(got, "Today Date: "+before+"\n") && !strings.Contains(got, "Today Date: "+after+"\n") {
		t.Errorf("strftime_now date missing: %q", got)
	}
}

func TestChatTemplateErrors(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"include", "{% include 'other.jinja' %}", `unknown statement "include"`},
		{"extends", "{% extends 'base' %}", `unknown statement "extends"`},
		{"raise_exception", "{{ raise_exception('Conversation roles must alternate user/assistant') }}", "Conversation roles must alternate"},
		{"filter", "{{ messages | no_such_filter }}", `unknown filter "no_such_filter"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := compileTemplate(tc.src)
			if err == nil {
				c := *qwen3.get(t)
				c.chat, _ = compileTemplate(tc.src)
				_, err = c.ApplyChatTemplate(context.Background(), sysUser, ChatOptions{})
			}
			if !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want ErrTemplate naming %q", err, tc.want)
			}
		})
	}
	c := *qwen3.get(t)
	c.chat = nil
	if _, err := c.ApplyChatTemplate(context.Background(), sysUser, ChatOptions{}); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("no template: %v", err)
	}
}
