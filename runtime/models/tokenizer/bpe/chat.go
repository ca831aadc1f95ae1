package bpe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/brokerd/brokerd/runtime/models/tokenizer/internal/jinja"
)

// ErrNoTemplate means the tokenizer_config.json has no chat template.
var ErrNoTemplate = errors.New("no chat template")

// ErrTemplate means the chat template failed: it cannot be compiled by the
// Jinja library, or it refused the conversation (raise_exception).
var ErrTemplate = errors.New("chat template")

// ErrTemplateLimit means the chat template broke one of its TemplateLimits
// (it also wraps ErrTemplate). A template is code from a model file: it is
// the request's error when it happens at request time, and the model's
// when the trial render at load finds it.
var ErrTemplateLimit = errors.New("chat template over its limits")

// Message is one turn of a conversation: brokerd's one message type from
// the edge to the template (runtime/models/llm aliases it; the type lives
// here, with its lowest consumer, so that the tokenizer needs nothing of
// the engine).
type Message struct {
	Role    string // system, user, assistant, tool
	Content string
	// Reasoning is an assistant turn's thinking, the template's
	// message.reasoning_content (Qwen3's), which thinking models' templates
	// show for the turns after the last user message; "" leaves it
	// undefined.
	Reasoning string
	// ToolCalls are an assistant turn's calls, the template's
	// message.tool_calls as Hugging Face templates read them:
	// [{"id", "type": "function", "function": {"name", "arguments"}}]
	// with arguments a mapping; none leaves it undefined.
	ToolCalls []ToolCall
	// ToolCallID is a tool turn's message.tool_call_id, the call whose
	// result its Content is ("": undefined).
	ToolCallID string
}

// ToolCall is a call of a function; Arguments is a JSON object's text.
type ToolCall struct {
	ID, Name, Arguments string
}

// ChatOptions are the template's inputs besides the messages.
type ChatOptions struct {
	// AddGenerationPrompt ends the prompt with the assistant's header, so
	// that the model writes the reply.
	AddGenerationPrompt bool
	// Vars are extra template variables, e.g. enable_thinking (Qwen3) or
	// date_string (Llama 3.2); they override the defaults.
	Vars map[string]any
	// Tools are the template's tools, each a JSON object ({"type":
	// "function", "function": {...}}); their keys keep their order, as
	// Python's dicts do (tojson writes them as given). None: tools is
	// None, as transformers passes it.
	Tools []json.RawMessage
	// Limits bound the render; zero fields take DefaultTemplateLimits'.
	Limits TemplateLimits
}

// TemplateLimits bound one render of a chat template (the Jinja engine is
// a fork of github.com/ardanlabs/jinja that enforces them; see
// tokenizer/internal/jinja).
type TemplateLimits struct {
	// MaxSteps bounds the nodes and expressions evaluated, loop
	// iterations included.
	MaxSteps int64
	// MaxCallDepth bounds nested macro calls (recursion).
	MaxCallDepth int
	// MaxOutputBytes bounds the rendered prompt.
	MaxOutputBytes int64
	// MaxAllocBytes bounds the bytes of values the render creates.
	MaxAllocBytes int64
	// MaxTime bounds the render's wall time.
	MaxTime time.Duration
}

// DefaultTemplateLimits are far above what real chat templates need (a
// few thousand steps and a few levels of macros per conversation) and
// bound a hostile one to about a second and tens of megabytes.
var DefaultTemplateLimits = TemplateLimits{
	MaxSteps:       jinja.DefaultLimits.MaxSteps,
	MaxCallDepth:   jinja.DefaultLimits.MaxCallDepth,
	MaxOutputBytes: 16 << 20,
	MaxAllocBytes:  64 << 20,
	MaxTime:        2 * time.Second,
}

func (l TemplateLimits) withDefaults() TemplateLimits {
	d := DefaultTemplateLimits
	if l.MaxSteps <= 0 {
		l.MaxSteps = d.MaxSteps
	}
	if l.MaxCallDepth <= 0 {
		l.MaxCallDepth = d.MaxCallDepth
	}
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = d.MaxOutputBytes
	}
	if l.MaxAllocBytes <= 0 {
		l.MaxAllocBytes = d.MaxAllocBytes
	}
	if l.MaxTime <= 0 {
		l.MaxTime = d.MaxTime
	}
	return l
}

// MaxTemplateBytes bounds a chat template's source (the largest real ones
// are about 25 KiB).
const MaxTemplateBytes = 1 << 20

type chatTemplate struct {
	tmpl *jinja.Template
}

func compileTemplate(src string) (*chatTemplate, error) {
	tm, err := jinja.CompileLimited(src, jinja.CompileLimits{MaxSourceBytes: MaxTemplateBytes})
	if err != nil {
		if errors.Is(err, jinja.ErrLimit) {
			return nil, fmt.Errorf("%w: %w: %w", ErrTemplate, ErrTemplateLimit, err)
		}
		return nil, fmt.Errorf("%w: cannot be compiled: %w", ErrTemplate, err)
	}
	return &chatTemplate{tmpl: tm}, nil
}

// HasChatTemplate reports whether ApplyChatTemplate can be used.
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// ApplyChatTemplate renders the conversation with the model's chat_template
// (from tokenizer_config.json), as transformers' apply_chat_template does:
// the template sees messages, add_generation_prompt, bos_token,
// eos_token and tools. raise_exception and strftime_now come from the
// Jinja library. The result holds the special tokens as text, so encode
// it with Encode(prompt, false).
//
// The render runs under opts.Limits and stops when ctx ends (the error
// then wraps ctx's); a limit broken wraps ErrTemplateLimit.
func (t *Tokenizer) ApplyChatTemplate(ctx context.Context, messages []Message, opts ChatOptions) (string, error) {
	if t.chat == nil {
		return "", ErrNoTemplate
	}
	msgs := make([]jinja.Value, len(messages))
	for i, m := range messages {
		v, err := messageValue(m)
		if err != nil {
			return "", fmt.Errorf("%w: messages[%d]: %w", ErrTemplate, i, err)
		}
		msgs[i] = v
	}
	var tools any // None
	if len(opts.Tools) > 0 {
		list := make([]jinja.Value, len(opts.Tools))
		for i, raw := range opts.Tools {
			v, err := jsonValue(raw)
			if err != nil || !v.IsDict() {
				return "", fmt.Errorf("%w: tools[%d] is not a JSON object", ErrTemplate, i)
			}
			list[i] = v
		}
		tools = list
	}
	data := map[string]any{
		"messages":              msgs,
		"add_generation_prompt": opts.AddGenerationPrompt,
		"bos_token":             t.bosToken,
		"eos_token":             t.eosToken,
		"tools":                 tools,
	}
	for k, v := range opts.Vars {
		data[k] = v
	}
	lim := opts.Limits.withDefaults()
	rctx, cancel := context.WithTimeout(ctx, lim.MaxTime)
	defer cancel()
	out, err := t.chat.tmpl.RenderContext(rctx, data, jinja.Limits{
		MaxSteps: lim.MaxSteps, MaxCallDepth: lim.MaxCallDepth,
		MaxOutputBytes: lim.MaxOutputBytes, MaxAllocBytes: lim.MaxAllocBytes,
	})
	switch {
	case err == nil:
		return out, nil
	case ctx.Err() != nil:
		// The caller left or its deadline passed: not the template's fault.
		return "", fmt.Errorf("%w: %w", ErrTemplate, ctx.Err())
	case rctx.Err() != nil:
		return "", fmt.Errorf("%w: %w: rendering took longer than %v", ErrTemplate, ErrTemplateLimit, lim.MaxTime)
	case errors.Is(err, jinja.ErrLimit):
		return "", fmt.Errorf("%w: %w: %w", ErrTemplate, ErrTemplateLimit, err)
	}
	return "", fmt.Errorf("%w: %w", ErrTemplate, err)
}

// messageValue is a message as the template sees it: a dict in the order
// transformers' messages have (role, content, then what the turn carries).
func messageValue(m Message) (jinja.Value, error) {
	msg := jinja.NewDict()
	d := msg.AsDict()
	d.Set("role", jinja.NewString(m.Role))
	d.Set("content", jinja.NewString(m.Content))
	if m.Reasoning != "" {
		d.Set("reasoning_content", jinja.NewString(m.Reasoning))
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			args, err := jsonValue([]byte(c.Arguments))
			if err != nil || !args.IsDict() {
				return jinja.Value{}, fmt.Errorf("tool_calls[%d].function.arguments is not a JSON object", i)
			}
			fn := jinja.NewDict()
			fn.AsDict().Set("name", jinja.NewString(c.Name))
			fn.AsDict().Set("arguments", args)
			call := jinja.NewDict()
			if c.ID != "" {
				call.AsDict().Set("id", jinja.NewString(c.ID))
			}
			call.AsDict().Set("type", jinja.NewString("function"))
			call.AsDict().Set("function", fn)
			calls[i] = call
		}
		d.Set("tool_calls", jinja.NewList(calls))
	}
	if m.ToolCallID != "" {
		d.Set("tool_call_id", jinja.NewString(m.ToolCallID))
	}
	return msg, nil
}

// jsonValue decodes JSON text into a template value whose objects keep
// their keys' order (jinja.FromGoValue sorts a Go map's).
func jsonValue(raw []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return jinja.Value{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Value{}, errors.New("more than one JSON value")
	}
	return v, nil
}

// maxJSONDepth bounds the nesting jsonValue decodes (a schema's).
const maxJSONDepth = 64

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Value{}, fmt.Errorf("JSON nested over %d levels", maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			v := jinja.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return jinja.Value{}, err
				}
				e, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Value{}, err
				}
				v.AsDict().Set(k.(string), e)
			}
			_, err := dec.Token() // }
			return v, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				e, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, e)
			}
			_, err := dec.Token() // ]
			return jinja.NewList(items), err
		}
		return jinja.Value{}, fmt.Errorf("unexpected %v", t)
	}
	// Strings, json.Number (an integer stays one, as Python's json keeps
	// it), booleans and null.
	return jinja.FromGoValue(tok), nil
}

// trialConversation is what CheckChatTemplate renders: a system prompt, a
// tool list and a few turns, so that the branches real requests take run.
var trialConversation = []Message{
	{Role: "system", Content: "You are a helpful assistant."},
	{Role: "user", Content: "What is the weather in Paris?"},
	{Role: "assistant", Content: "It is sunny in Paris."},
	{Role: "user", Content: "And in Rome?"},
}

var trialTools = []any{map[string]any{
	"type": "function",
	"function": map[string]any{
		"name":        "get_weather",
		"description": "Get the current weather in a city.",
		"parameters": map[string]any{
			"type":       "object",
			"properties": map[string]any{"city": map[string]any{"type": "string"}},
			"required":   []any{"city"},
		},
	},
}}

// CheckChatTemplate renders a sample conversation (with and without a
// system prompt and tools) under lim, as a model load does before it
// accepts a template: a template that breaks a limit on it is refused
// (ErrTemplateLimit, naming the limit). A template that refuses the
// sample itself (raise_exception) is not: real requests may still suit it.
func (t *Tokenizer) CheckChatTemplate(ctx context.Context, lim TemplateLimits) error {
	if t.chat == nil {
		return nil
	}
	for _, trial := range []struct {
		msgs []Message
		vars map[string]any
	}{
		{trialConversation, nil},
		{trialConversation[1:], map[string]any{"tools": trialTools}},
	} {
		_, err := t.ApplyChatTemplate(ctx, trial.msgs, ChatOptions{AddGenerationPrompt: true, Vars: trial.vars, Limits: lim})
		if errors.Is(err, ErrTemplateLimit) || ctx.Err() != nil {
			return fmt.Errorf("a trial render: %w", err)
		}
	}
	return nil
}
