package bpe

import (
	"errors"
	"fmt"

	"github.com/ardanlabs/jinja"
)

// ErrNoTemplate means the tokenizer_config.json has no chat_template.
var ErrNoTemplate = errors.New("no chat template")

// ErrTemplate means the chat template failed: it cannot be compiled by the
// Jinja library, or it refused the conversation (raise_exception).
var ErrTemplate = errors.New("chat template")

// Message is one turn of a conversation.
type Message struct {
	Role    string // system, user, assistant
	Content string
}

// ChatOptions are the template's inputs besides the messages.
type ChatOptions struct {
	// AddGenerationPrompt ends the prompt with the assistant's header, so
	// that the model writes the reply.
	AddGenerationPrompt bool
	// Vars are extra template variables, e.g. enable_thinking (Qwen3) or
	// date_string (Llama 3.2); they override the defaults.
	Vars map[string]any
}

type chatTemplate struct {
	tmpl *jinja.Template
}

func compileTemplate(src string) (*chatTemplate, error) {
	tm, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot be compiled: %w", ErrTemplate, err)
	}
	return &chatTemplate{tmpl: tm}, nil
}

// HasChatTemplate reports whether ApplyChatTemplate can be used.
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// ApplyChatTemplate renders the conversation with the model's chat_template
// (from tokenizer_config.json), as transformers' apply_chat_template does:
// the template sees messages, add_generation_prompt, bos_token and
// eos_token; tools are absent. raise_exception and strftime_now come from
// the Jinja library. The result holds the special tokens as text, so encode
// it with Encode(prompt, false).
func (t *Tokenizer) ApplyChatTemplate(messages []Message, opts ChatOptions) (string, error) {
	if t.chat == nil {
		return "", ErrNoTemplate
	}
	msgs := make([]any, len(messages))
	for i, m := range messages {
		msgs[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	data := map[string]any{
		"messages":              msgs,
		"add_generation_prompt": opts.AddGenerationPrompt,
		"bos_token":             t.bosToken,
		"eos_token":             t.eosToken,
	}
	for k, v := range opts.Vars {
		data[k] = v
	}
	out, err := t.chat.tmpl.Render(data)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	return out, nil
}
