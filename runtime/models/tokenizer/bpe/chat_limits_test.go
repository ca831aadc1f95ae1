package bpe

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// tinyWithTemplate parses the tiny test tokenizer with tmpl as its
// tokenizer_config.json chat_template, as a model load does.
func tinyWithTemplate(tmpl string) (*Tokenizer, error) {
	cfg, err := json.Marshal(map[string]any{"chat_template": tmpl})
	if err != nil {
		return nil, err
	}
	return Parse(tinyTokenizer(), cfg, nil)
}

// TestHostileTemplatesRefusedAtLoad: the attack's templates (Hardening II,
// finding 1) fail the compile or the load's trial render with
// ErrTemplateLimit, naming the limit.
func TestHostileTemplatesRefusedAtLoad(t *testing.T) {
	for _, tc := range []struct{ name, tmpl, want string }{
		{"recursive macro", `{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}`, "macro calls nested"},
		{"2 GB string", `{{ 'x' * 2000000000 }}`, "repetitions"},
		{"range(10^10)", `{% for i in range(10000000000) %}{% endfor %}`, "range of"},
		// The step bound, or under the race detector the time bound.
		{"nested loops", `{% set l = range(5000) %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}`, "evaluation steps|longer than"},
		{"10 MB of parentheses", "{{ " + strings.Repeat("(", 10<<20) + " }}", "bytes, over"},
		{"14 MB of nested ifs", strings.Repeat("{% if x %}", 14<<20/10), "bytes, over"},
		{"nested ifs", strings.Repeat("{% if x %}", 1000) + strings.Repeat("{% endif %}", 1000), "nested more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := tinyWithTemplate(tc.tmpl)
			if err == nil {
				err = tok.CheckChatTemplate(context.Background(), DefaultTemplateLimits)
			}
			if !errors.Is(err, ErrTemplateLimit) || !containsAny(err.Error(), tc.want) {
				t.Fatalf("load: %v; want ErrTemplateLimit naming %q", err, tc.want)
			}
		})
	}
}

// TestTemplateLimitsAtRequestTime: a template that passes the trial and
// breaks a limit on one conversation fails that render only; a caller
// that leaves stops the render with its own error; the wall-time bound
// ends a render that neither steps nor bytes would.
func TestTemplateLimitsAtRequestTime(t *testing.T) {
	ctx := context.Background()
	tok, err := tinyWithTemplate(`{% for m in messages %}{% if m.content == 'boom' %}{{ 'x' * 2000000000 }}{% else %}{{ m.content }}{% endif %}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := tok.CheckChatTemplate(ctx, DefaultTemplateLimits); err != nil {
		t.Fatalf("trial: %v", err)
	}
	if _, err := tok.ApplyChatTemplate(ctx, []Message{{Role: "user", Content: "boom"}}, ChatOptions{}); !errors.Is(err, ErrTemplateLimit) {
		t.Fatalf("boom: %v; want ErrTemplateLimit", err)
	}
	if got, err := tok.ApplyChatTemplate(ctx, []Message{{Role: "user", Content: "fine"}}, ChatOptions{}); err != nil || got != "fine" {
		t.Fatalf("next render: %q %v", got, err)
	}

	loop, err := tinyWithTemplate(`{% set l = range(100000) %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, err = loop.ApplyChatTemplate(gone, nil, ChatOptions{Limits: TemplateLimits{MaxSteps: 1 << 62}})
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTemplateLimit) {
		t.Fatalf("render for a caller that left: %v; want context.Canceled", err)
	}
	// The loop never ends on its own: only the wall-time bound stops it.
	_, err = loop.ApplyChatTemplate(ctx, nil, ChatOptions{Limits: TemplateLimits{MaxSteps: 1 << 62, MaxTime: time.Millisecond}})
	if !errors.Is(err, ErrTemplateLimit) || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("render past its time: %v; want ErrTemplateLimit naming the time", err)
	}
}

// TestRealTemplatesPassTheTrial: the chat templates of the test
// tokenizers (Qwen3, Llama 3.1) pass the load's trial render.
func TestRealTemplatesPassTheTrial(t *testing.T) {
	for _, f := range []*fixture{qwen3, llama3} {
		if err := f.get(t).CheckChatTemplate(context.Background(), DefaultTemplateLimits); err != nil {
			t.Errorf("%s: %v", f.name, err)
		}
	}
}

// FuzzChatTemplate: a chat_template from a model file never crashes the
// load or a render, and a render stays within its output bound.
func FuzzChatTemplate(f *testing.F) {
	for _, s := range []string{
		`{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}`,
		`{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}`,
		`{{ 'x' * 99 }}{{ messages|tojson(indent=2) }}`,
		`{% if tools %}{{ tools[0].function.name }}{% endif %}{{ raise_exception('no') }}`,
		`{{ (messages[0].content ~ bos_token)[::-1] }}`,
	} {
		f.Add(s)
	}
	lim := TemplateLimits{MaxSteps: 20_000, MaxOutputBytes: 1 << 16, MaxAllocBytes: 1 << 20, MaxTime: time.Second}
	f.Fuzz(func(t *testing.T, tmpl string) {
		tok, err := tinyWithTemplate(tmpl)
		if err != nil || !tok.HasChatTemplate() {
			return
		}
		_ = tok.CheckChatTemplate(context.Background(), lim)
		out, err := tok.ApplyChatTemplate(context.Background(), []Message{{Role: "user", Content: "hi"}}, ChatOptions{AddGenerationPrompt: true, Limits: lim})
		if err == nil && int64(len(out)) > lim.MaxOutputBytes {
			t.Fatalf("rendered %d bytes over the %d limit", len(out), lim.MaxOutputBytes)
		}
	})
}

// containsAny reports whether s contains one of the |-separated wants.
func containsAny(s, wants string) bool {
	for _, w := range strings.Split(wants, "|") {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}
