package bpe

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChatTemplateTools renders conversations with tools, an assistant's
// calls and the tools' results through Qwen2.5's and Llama 3.1's published
// chat templates and compares them with what transformers renders
// (testdata/tool_renders.json, written by gen_tool_renders.py with
// Python's jinja2): the tools keep their keys' order, a call's arguments
// are a mapping, a tool turn is its result.
func TestChatTemplateTools(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "tool_renders.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases map[string]struct {
		Messages []struct {
			Role       string `json:"role"`
			Content    string `json:"content"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"messages"`
		Tools []json.RawMessage `json:"tools"`
		Want  string            `json:"want"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	tmpl := func(name string) string {
		src, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(src)
	}
	toks := map[string]*Tokenizer{
		"qwen2.5":  withTemplate(t, qwen3, tmpl("qwen2_5_chat_template.jinja")),
		"llama3.1": withTemplate(t, llama3, tmpl("llama3_1_chat_template.jinja")),
	}
	if len(cases) < 5 {
		t.Fatalf("%d cases in tool_renders.json", len(cases))
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tok := toks[name[:strings.IndexByte(name, '/')]]
			msgs := make([]Message, len(tc.Messages))
			for i, m := range tc.Messages {
				msgs[i] = Message{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}
				for _, c := range m.ToolCalls {
					msgs[i].ToolCalls = append(msgs[i].ToolCalls, ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: string(c.Function.Arguments)})
				}
			}
			got, err := tok.ApplyChatTemplate(context.Background(), msgs, ChatOptions{AddGenerationPrompt: true, Tools: tc.Tools})
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.Want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.Want)
			}
		})
	}
}

// Without tools a template sees tools as None (transformers passes it):
// Qwen2.5's writes no tool block, and a template that tests it for none
// takes that branch.
func TestChatTemplateNoTools(t *testing.T) {
	tok := withTemplate(t, qwen3, `{% if tools is none %}none{% elif tools is defined %}some{% endif %}`)
	got, err := tok.ApplyChatTemplate(context.Background(), sysUser, ChatOptions{})
	if err != nil || got != "none" {
		t.Errorf("got %q, %v; want none", got, err)
	}
	got, err = tok.ApplyChatTemplate(context.Background(), sysUser, ChatOptions{Tools: []json.RawMessage{json.RawMessage(`{"type":"function"}`)}})
	if err != nil || got != "some" {
		t.Errorf("got %q, %v; want some", got, err)
	}
}

// Arguments and tools that are not JSON objects are the render's error,
// not a template's surprise.
func TestChatTemplateToolsInvalid(t *testing.T) {
	tok := withTemplate(t, qwen3, `{{ messages | length }}`)
	for _, tc := range []struct {
		name  string
		msgs  []Message
		tools []json.RawMessage
	}{
		{"arguments a string", []Message{{Role: "assistant", ToolCalls: []ToolCall{{Name: "f", Arguments: `"{}"`}}}}, nil},
		{"arguments not JSON", []Message{{Role: "assistant", ToolCalls: []ToolCall{{Name: "f", Arguments: `{"a":`}}}}, nil},
		{"arguments two values", []Message{{Role: "assistant", ToolCalls: []ToolCall{{Name: "f", Arguments: `{} {}`}}}}, nil},
		{"a tool a list", sysUser, []json.RawMessage{json.RawMessage(`[]`)}},
		{"a tool nested too deep", sysUser, []json.RawMessage{json.RawMessage(`{"a":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tok.ApplyChatTemplate(context.Background(), tc.msgs, ChatOptions{Tools: tc.tools}); err == nil {
				t.Error("rendered")
			}
		})
	}
}
