package repo

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/ollama"
)

// A store model's chat template is its GGUF's Jinja tokenizer.chat_template
// when it has one, else its template layer (Ollama's Go text/template, run
// as Ollama runs it: runtime/models/ollama), else Ollama's default
// "{{ .Prompt }}". The template layer must parse and pass a trial render
// under the limits requests render it with (ollama.DefaultTemplateLimits),
// or the model does not load; a render that fails at request time is the
// request's error. Its messages layer (a Modelfile's MESSAGE lines) goes
// before every conversation's messages, after its system messages (the
// model's system layer included).

// ollamaChatTemplate is the chat template of store model m named name,
// given its GGUF's (nil: none).
func ollamaChatTemplate(ctx context.Context, name string, m ollama.Model, gguf llm.ChatTemplate) (llm.ChatTemplate, error) {
	chat := gguf
	if chat == nil {
		src := m.Template
		if src == "" {
			src = ollama.DefaultTemplate
		}
		t, err := ollama.ParseTemplate(src)
		if err == nil {
			err = t.Check(ctx, ollama.DefaultTemplateLimits)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w: %s: the template layer: %w", ollama.ErrInvalid, name, err)
		}
		chat = ollamaChat{t}
	}
	if len(m.Messages) > 0 {
		msgs := make([]llm.Message, len(m.Messages))
		for i, msg := range m.Messages {
			msgs[i] = llm.Message{Role: msg.Role, Content: msg.Content}
		}
		chat = withMessages{chat: chat, msgs: msgs}
	}
	return chat, nil
}

// ollamaChat renders conversations with a template layer. The template
// decides where the reply begins from the last message, as Ollama's do
// (AddGenerationPrompt has no counterpart); enable_thinking is .Think
// (and .IsThinkSet); other variables are not a Go template's.
type ollamaChat struct{ t *ollama.Template }

func (c ollamaChat) Render(ctx context.Context, messages []llm.Message, opts llm.ChatOptions) (string, error) {
	msgs := make([]ollama.ChatMessage, len(messages))
	calls := map[string]string{} // a call's id → its function, a tool turn's .ToolName
	for i, m := range messages {
		msgs[i] = ollama.ChatMessage{Role: m.Role, Content: m.Content, Thinking: m.Reasoning, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			msgs[i].ToolCalls = append(msgs[i].ToolCalls, ollama.ChatToolCall{ID: tc.ID, Name: tc.Name, Arguments: json.RawMessage(tc.Arguments)})
			if tc.ID != "" {
				calls[tc.ID] = tc.Name
			}
		}
		if m.Role == "tool" && m.ToolCallID != "" {
			msgs[i].ToolName = calls[m.ToolCallID]
		}
	}
	ro := ollama.RenderOptions{Tools: opts.Tools}
	if think, ok := opts.Vars["enable_thinking"].(bool); ok {
		ro.Think, ro.IsThinkSet = think, true
	}
	return c.t.Render(ctx, msgs, ro)
}

// withMessages puts a messages layer's conversation after a
// conversation's leading system messages.
type withMessages struct {
	chat llm.ChatTemplate
	msgs []llm.Message
}

func (w withMessages) Render(ctx context.Context, messages []llm.Message, opts llm.ChatOptions) (string, error) {
	n := 0
	for n < len(messages) && messages[n].Role == "system" {
		n++
	}
	all := make([]llm.Message, 0, len(messages)+len(w.msgs))
	all = append(append(append(all, messages[:n]...), w.msgs...), messages[n:]...)
	return w.chat.Render(ctx, all, opts)
}
