package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// OpenAI's Responses API (POST /v1/responses), which the official clients
// now put first and vLLM and Ollama serve too: a conversation of typed
// items in, output items (reasoning, a message, function calls) out, or
// streamed as typed events. It runs as a chat (RunChat); the response is
// kept for previous_response_id and GET /v1/responses/{id} when store is
// true (responseStore, bounded by --responses-store-bytes).

// responsesRequest is POST /v1/responses' body.
type responsesRequest struct {
	Model        string          `json:"model"`
	Input        json.RawMessage `json:"input"`
	Instructions *string         `json:"instructions"`
	Stream       bool            `json:"stream"`
	// StreamOptions (include_obfuscation) is taken and left: brokerd pads
	// no events.
	StreamOptions   json.RawMessage `json:"stream_options"`
	Temperature     *float32        `json:"temperature"`
	TopP            *float32        `json:"top_p"`
	MaxOutputTokens *int32          `json:"max_output_tokens"`
	TopLogprobs     *int            `json:"top_logprobs"`
	Include         []string        `json:"include"`
	Tools           json.RawMessage `json:"tools"`
	ToolChoice      json.RawMessage `json:"tool_choice"`
	// ParallelToolCalls false: at most one call (as the chat route).
	ParallelToolCalls *bool `json:"parallel_tool_calls"`
	// MaxToolCalls keeps the first calls of an answer.
	MaxToolCalls *int `json:"max_tool_calls"`
	Text         *struct {
		Format    *responsesFormat `json:"format"`
		Verbosity *string          `json:"verbosity"`
	} `json:"text"`
	Reasoning *struct {
		Effort  *string `json:"effort"`
		Summary *string `json:"summary"`
	} `json:"reasoning"`
	Store              *bool             `json:"store"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Metadata           map[string]string `json:"metadata"`
	// Truncation "auto" drops a conversation's oldest turns that do not
	// fit the context (ChatRequest.truncate_history); "disabled" (the
	// default) refuses such a conversation.
	Truncation *string `json:"truncation"`
	// Taken and echoed: they only name or route the caller at OpenAI.
	User             *string `json:"user"`
	SafetyIdentifier *string `json:"safety_identifier"`
	PromptCacheKey   *string `json:"prompt_cache_key"`
	ServiceTier      *string `json:"service_tier"`
	// Refused when set: brokerd runs every response in the foreground,
	// keeps no conversations apart from responses, and no prompt
	// templates.
	Background   *bool           `json:"background"`
	Conversation json.RawMessage `json:"conversation"`
	Prompt       json.RawMessage `json:"prompt"`
	// Sampling extras vLLM's Responses route takes too.
	Seed              *int64   `json:"seed"`
	TopK              *int32   `json:"top_k"`
	MinP              *float32 `json:"min_p"`
	RepetitionPenalty *float32 `json:"repetition_penalty"`
}

// responsesFormat is text.format: text, json_object, or json_schema with
// its name and schema at the top (not under json_schema, as in chat).
type responsesFormat struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Schema      json.RawMessage `json:"schema"`
	Strict      *bool           `json:"strict"`
}

// responsesTool is a function tool, flat: its name and parameters at the
// top (chat nests them under "function").
type responsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
}

// respInputItem is an input item: a message (easy or typed), a function
// call and its output, or a reasoning item, as the API's output gives
// them back.
type respInputItem struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// function_call
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	// function_call_output
	Output json.RawMessage `json:"output"`
	// reasoning
	Summary []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

// responsesIncludes are the include values taken: output text logprobs,
// and encrypted reasoning, which brokerd does not encrypt (its reasoning
// items carry their text, which the caller sends back as it is).
var responsesIncludes = map[string]bool{"message.output_text.logprobs": true, "reasoning.encrypted_content": true}

// Metadata bounds (OpenAI's).
const (
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// responseID is a response's or an item's id: prefix and 128 random bits.
func responseID(prefix string) string {
	return fmt.Sprintf("%s_%016x%016x", prefix, rand.Uint64(), rand.Uint64())
}

// partsText reads a content field: a string, or a list of parts whose
// text it joins (input_text, output_text, reasoning_text, summary_text,
// refusal, and chat's "text"); any other part is refused.
func partsText(raw json.RawMessage, where string) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Refusal string `json:"refusal"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", paramError(where, "invalid_type", "Invalid '%s': expected a string or a list of content parts.", where)
	}
	var b strings.Builder
	for i, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text", "reasoning_text", "summary_text":
			b.WriteString(p.Text)
		case "refusal":
			b.WriteString(p.Refusal)
		default:
			return "", paramError(fmt.Sprintf("%s[%d].type", where, i), "invalid_value",
				"Invalid '%s[%d]': content parts of type %q are not supported: brokerd serves text models", where, i, p.Type)
		}
	}
	return b.String(), nil
}

// responseMessages turns items into a chat's messages: an assistant's
// reasoning, text and function calls that follow one another make one
// assistant turn (as a chat template wants them); a function call's
// output is a tool turn.
func responseMessages(items []respInputItem, where string) ([]*brokerv1.ChatMessage, error) {
	var out []*brokerv1.ChatMessage
	var turn *brokerv1.ChatMessage // the assistant turn being gathered
	flush := func() {
		if turn != nil {
			out = append(out, turn)
			turn = nil
		}
	}
	assistant := func() *brokerv1.ChatMessage {
		if turn == nil {
			turn = &brokerv1.ChatMessage{Role: "assistant"}
		}
		return turn
	}
	for i, it := range items {
		at := fmt.Sprintf("%s[%d]", where, i)
		switch it.Type {
		case "", "message":
			text, err := partsText(it.Content, at+".content")
			if err != nil {
				return nil, err
			}
			switch it.Role {
			case "assistant":
				if turn != nil && (turn.Content != "" || len(turn.ToolCalls) > 0) {
					flush()
				}
				assistant().Content = text
			case "user", "system", "developer":
				flush()
				role := it.Role
				if role == "developer" { // OpenAI's newer name for system
					role = "system"
				}
				out = append(out, &brokerv1.ChatMessage{Role: role, Content: text})
			default:
				return nil, paramError(at+".role", "invalid_value", "Invalid '%s.role': %q; expected user, assistant, system or developer.", at, it.Role)
			}
		case "reasoning":
			if turn != nil && (turn.Content != "" || len(turn.ToolCalls) > 0) {
				flush()
			}
			text, err := partsText(it.Content, at+".content")
			if err != nil {
				return nil, err
			}
			if text == "" { // a summary only
				for _, s := range it.Summary {
					text += s.Text
				}
			}
			assistant().Reasoning += text
		case "function_call":
			if it.CallID == "" || it.Name == "" {
				return nil, paramError(at, "missing_required_parameter", "Invalid '%s': a function_call needs call_id and name.", at)
			}
			t := assistant()
			t.ToolCalls = append(t.ToolCalls, &brokerv1.ToolCall{Id: it.CallID, Name: it.Name, Arguments: it.Arguments, Index: int32(len(t.ToolCalls))})
		case "function_call_output":
			if it.CallID == "" {
				return nil, paramError(at+".call_id", "missing_required_parameter", "Invalid '%s': a function_call_output needs call_id.", at)
			}
			text, err := partsText(it.Output, at+".output")
			if err != nil {
				return nil, err
			}
			flush()
			out = append(out, &brokerv1.ChatMessage{Role: "tool", Content: text, ToolCallId: it.CallID})
		case "item_reference":
			return nil, paramError(at+".type", "invalid_value", "Invalid '%s': item references are not supported: send the item itself, or continue a stored response with previous_response_id", at)
		default:
			return nil, paramError(at+".type", "invalid_value", "Invalid '%s.type': %q is not supported: brokerd takes message, function_call, function_call_output and reasoning items", at, it.Type)
		}
	}
	flush()
	return out, nil
}

// responseInput reads input: a string (one user message) or a list of
// items. It returns the items as stored for input_items (each with an id)
// and as read.
func responseInput(raw json.RawMessage) (stored []json.RawMessage, items []respInputItem, err error) {
	if isNull(raw) { // a continuation may add nothing
		return []json.RawMessage{}, nil, nil
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		item, _ := json.Marshal(map[string]any{"id": responseID("msg"), "type": "message", "role": "user", "status": "completed",
			"content": []any{map[string]any{"type": "input_text", "text": text}}})
		return []json.RawMessage{item}, []respInputItem{{Type: "message", Role: "user", Content: mustJSON(text)}}, nil
	}
	var raws []json.RawMessage
	if json.Unmarshal(raw, &raws) != nil {
		return nil, nil, paramError("input", "invalid_type", "Invalid 'input': expected a string or a list of input items.")
	}
	items = make([]respInputItem, len(raws))
	stored = make([]json.RawMessage, len(raws))
	for i, r := range raws {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(r, &fields); err != nil || fields == nil {
			return nil, nil, paramError(fmt.Sprintf("input[%d]", i), "invalid_type", "Invalid 'input[%d]': expected an object.", i)
		}
		if err := json.Unmarshal(r, &items[i]); err != nil {
			return nil, nil, paramError(fmt.Sprintf("input[%d]", i), "invalid_type", "Invalid 'input[%d]': %v", i, err)
		}
		if items[i].Type == "" {
			fields["type"] = mustJSON("message")
		}
		if isNull(fields["id"]) {
			fields["id"] = mustJSON(responseID(itemPrefix(items[i].Type)))
		}
		stored[i] = mustJSON(fields)
	}
	return stored, items, nil
}

// itemPrefix is the id prefix of an item of a type (OpenAI's).
func itemPrefix(typ string) string {
	switch typ {
	case "function_call":
		return "fc"
	case "function_call_output":
		return "fco"
	case "reasoning":
		return "rs"
	}
	return "msg"
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only values that always marshal are given
	}
	return b
}

// responseTools reads tools (function tools only) and tool_choice,
// including allowed_tools, which narrows the tools the model sees.
func responseTools(rawTools, rawChoice json.RawMessage) ([]*brokerv1.Tool, brokerv1.ToolChoiceMode, string, error) {
	var ts []responsesTool
	if !isNull(rawTools) {
		if err := json.Unmarshal(rawTools, &ts); err != nil {
			return nil, 0, "", paramError("tools", "invalid_type", "Invalid 'tools': expected a list of tools.")
		}
	}
	tools := make([]*brokerv1.Tool, len(ts))
	for i, t := range ts {
		if t.Type != "function" {
			return nil, 0, "", paramError(fmt.Sprintf("tools[%d].type", i), "invalid_value",
				"Invalid 'tools[%d].type': %q is not supported: brokerd runs function tools only, whose calls the caller runs", i, t.Type)
		}
		if t.Name == "" {
			return nil, 0, "", paramError(fmt.Sprintf("tools[%d].name", i), "missing_required_parameter", "Invalid 'tools[%d]': a function tool needs a name.", i)
		}
		p := bytes.TrimSpace(t.Parameters)
		if string(p) == "null" {
			p = nil
		}
		tools[i] = &brokerv1.Tool{Name: t.Name, Description: t.Description, Parameters: string(p)}
	}
	if isNull(rawChoice) {
		return tools, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_UNSPECIFIED, "", nil
	}
	var s string
	if json.Unmarshal(rawChoice, &s) == nil {
		switch s {
		case "auto":
			return tools, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO, "", nil
		case "none":
			return tools, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE, "", nil
		case "required":
			return tools, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED, "", nil
		}
	}
	var obj struct {
		Type  string `json:"type"`
		Name  string `json:"name"`
		Mode  string `json:"mode"`
		Tools []struct {
			Type string `json:"type"`
			Name string `json:"name"`
		} `json:"tools"`
	}
	bad := paramError("tool_choice", "invalid_value", `Invalid 'tool_choice': want "none", "auto", "required", {"type": "function", "name": ...} or {"type": "allowed_tools", "mode": "auto" or "required", "tools": [...]}`)
	if json.Unmarshal(rawChoice, &obj) != nil {
		return nil, 0, "", bad
	}
	switch {
	case obj.Type == "function" && obj.Name != "":
		return tools, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION, obj.Name, nil
	case obj.Type == "allowed_tools" && (obj.Mode == "auto" || obj.Mode == "required"):
		var kept []*brokerv1.Tool
		for i, a := range obj.Tools {
			j := slices.IndexFunc(tools, func(t *brokerv1.Tool) bool { return t.GetName() == a.Name })
			if a.Type != "function" || j < 0 {
				return nil, 0, "", paramError(fmt.Sprintf("tool_choice.tools[%d]", i), "invalid_value",
					"Invalid 'tool_choice.tools[%d]': %q is not a function among tools", i, a.Name)
			}
			kept = append(kept, tools[j])
		}
		mode := brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO
		if obj.Mode == "required" {
			mode = brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED
		}
		return kept, mode, "", nil
	}
	return nil, 0, "", bad
}

// sampling checks the request's sampling fields.
func (req *responsesRequest) sampling() (*brokerv1.SamplingParams, error) {
	if t := req.Temperature; t != nil && (*t < 0 || *t > 2) {
		return nil, paramError("temperature", "invalid_value", "Invalid 'temperature': %v; expected 0 to 2.", *t)
	}
	if t := req.TopP; t != nil && (*t < 0 || *t > 1) {
		return nil, paramError("top_p", "invalid_value", "Invalid 'top_p': %v; expected 0 to 1.", *t)
	}
	sp := &brokerv1.SamplingParams{Temperature: req.Temperature, TopP: req.TopP, TopK: req.TopK, MinP: req.MinP, RepetitionPenalty: req.RepetitionPenalty}
	if m := req.MaxOutputTokens; m != nil {
		if *m < 1 {
			return nil, paramError("max_output_tokens", "integer_below_min_value", "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 1, but got %d instead.", *m)
		}
		sp.MaxTokens = *m
	}
	if req.Seed != nil {
		seed := uint64(*req.Seed)
		sp.Seed = &seed
	}
	for _, inc := range req.Include {
		if !responsesIncludes[inc] {
			return nil, paramError("include", "invalid_value", "Invalid 'include': %q is not supported: brokerd takes message.output_text.logprobs and reasoning.encrypted_content", inc)
		}
		if inc == "message.output_text.logprobs" {
			sp.Logprobs = true
		}
	}
	if req.TopLogprobs != nil {
		if err := checkTopLogprobs("top_logprobs", *req.TopLogprobs); err != nil {
			return nil, err
		}
		sp.TopLogprobs = int32(*req.TopLogprobs)
		sp.Logprobs = sp.Logprobs || *req.TopLogprobs > 0
	}
	if req.Text != nil && req.Text.Format != nil {
		f := req.Text.Format
		switch f.Type {
		case "", "text":
		case "json_object":
			sp.Constraint = &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON}
		case "json_schema":
			s := bytes.TrimSpace(f.Schema)
			if len(s) == 0 || s[0] != '{' {
				return nil, paramError("text.format.schema", "invalid_value", "Invalid 'text.format.schema': a json_schema format needs its schema, a JSON object.")
			}
			sp.Constraint = &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON_SCHEMA, Source: string(s)}
		default:
			return nil, paramError("text.format.type", "invalid_value", "Invalid 'text.format.type': %q; expected text, json_object or json_schema.", f.Type)
		}
	}
	return sp, nil
}

// refuseUnserved refuses what brokerd does not do, and checks metadata.
func (req *responsesRequest) refuseUnserved() error {
	switch {
	case req.Background != nil && *req.Background:
		return paramError("background", "invalid_value", "background responses are not supported: brokerd answers in the foreground (stream the response to see it as it comes)")
	case !isNull(req.Conversation):
		return paramError("conversation", "invalid_value", "conversations are not supported: continue a stored response with previous_response_id")
	case !isNull(req.Prompt):
		return paramError("prompt", "invalid_value", "prompt templates are not supported: send instructions and input")
	case req.Truncation != nil && *req.Truncation != "auto" && *req.Truncation != "disabled":
		return paramError("truncation", "invalid_value", "Invalid 'truncation': %q; expected auto or disabled.", *req.Truncation)
	case len(req.Metadata) > maxMetadataPairs:
		return paramError("metadata", "invalid_value", "Invalid 'metadata': %d pairs, at most %d.", len(req.Metadata), maxMetadataPairs)
	}
	for k, v := range req.Metadata {
		if len(k) > maxMetadataKey || len(v) > maxMetadataValue {
			return paramError("metadata", "invalid_value", "Invalid 'metadata': keys are at most %d characters and values %d.", maxMetadataKey, maxMetadataValue)
		}
	}
	return nil
}

// thinking maps reasoning.effort onto the chat template: "none" turns a
// thinking model's thinking off, any other effort on (and is the
// template's reasoning_effort, which gpt-oss's reads); unset leaves the
// template's default. A model that does not think ignores it, as vLLM's
// does.
func (req *responsesRequest) thinking() (*structpb.Struct, error) {
	if req.Reasoning == nil || req.Reasoning.Effort == nil {
		return nil, nil
	}
	vars, err := effortVars(*req.Reasoning.Effort, "reasoning.effort")
	if err != nil {
		return nil, err
	}
	return structpb.NewStruct(vars)
}

// effortVars are the chat template variables of an OpenAI reasoning
// effort (chat's reasoning_effort, the Responses API's reasoning.effort):
// "none" turns thinking off, any other effort on, and is the template's
// reasoning_effort.
func effortVars(effort, param string) (map[string]any, error) {
	switch effort {
	case "none":
		return map[string]any{"enable_thinking": false}, nil
	case "minimal", "low", "medium", "high", "xhigh":
		return map[string]any{"enable_thinking": true, "reasoning_effort": effort}, nil
	}
	return nil, paramError(param, "invalid_value", "Invalid '%s': %q; expected none, minimal, low, medium, high or xhigh.", param, effort)
}

func (h *Handler) openaiResponses(w http.ResponseWriter, r *http.Request) {
	run, err := h.prepareResponse(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	req := run.b.req
	out := &sse{w: w}
	if req.Stream {
		run.b.emit = func(typ string, fields map[string]any) error { return out.event(typ, fields) }
	}
	err = h.chat(r.Context(), run.chat, run.b.on)
	if err == nil && !req.Stream {
		writeJSON(w, run.b.final)
	}
	if err == nil && run.b.store {
		h.store.put(clientOf(r), run.b.id, run.b.final, run.stored, append(run.history, run.b.messages()...))
	}
	switch {
	case err != nil && out.started:
		// What OpenAI's clients raise mid-stream.
		st := status.Convert(err)
		_ = out.event("error", map[string]any{"type": "error", "sequence_number": run.b.seq,
			"code": openaiCode(err, st), "message": st.Message(), "param": openaiParam(err)})
	case err != nil:
		h.fail(w, r, h.explainKind(r.Context(), err, modelName(req.Model), wantGenerator, true))
	}
}

// responseRun is a prepared response: the chat it runs, what is kept of
// it, and the builder of its output.
type responseRun struct {
	chat    *brokerv1.ChatRequest
	b       *responseBuilder
	stored  []json.RawMessage       // its input items, for input_items
	history []*brokerv1.ChatMessage // the conversation before its output, without instructions
}

// prepareResponse reads and checks a request and makes its chat.
func (h *Handler) prepareResponse(r *http.Request) (*responseRun, error) {
	req := &responsesRequest{}
	if err := decode(r, req); err != nil {
		return nil, err
	}
	if err := req.refuseUnserved(); err != nil {
		return nil, err
	}
	if req.Model == "" {
		return nil, paramError("model", "missing_required_parameter", "Missing required parameter: 'model'.")
	}
	sp, err := req.sampling()
	if err != nil {
		return nil, err
	}
	stored, items, err := responseInput(req.Input)
	if err != nil {
		return nil, err
	}
	msgs, err := responseMessages(items, "input")
	if err != nil {
		return nil, err
	}
	var history []*brokerv1.ChatMessage
	if p := req.PreviousResponseID; p != nil && *p != "" {
		prev, ok := h.store.get(clientOf(r), *p)
		if !ok {
			return nil, &httpError{code: http.StatusNotFound, param: "previous_response_id", oaCode: "previous_response_not_found",
				err: status.Errorf(codes.NotFound, "Previous response with id '%s' not found: brokerd keeps responses stored with store true, the newest first, in %d bytes (--responses-store-bytes)", *p, h.store.max)}
		}
		history = slices.Clone(prev.history)
	}
	history = append(history, msgs...)
	conv := &brokerv1.Conversation{}
	if req.Instructions != nil && *req.Instructions != "" {
		// Instructions are this request's alone: a continuation does not
		// carry them over (OpenAI's rule).
		conv.Messages = append(conv.Messages, &brokerv1.ChatMessage{Role: "system", Content: *req.Instructions})
	}
	conv.Messages = append(conv.Messages, history...)
	if len(conv.Messages) == 0 {
		return nil, paramError("input", "missing_required_parameter", "Invalid 'input': the conversation is empty.")
	}
	tools, choice, choiceFn, err := responseTools(req.Tools, req.ToolChoice)
	if err != nil {
		return nil, err
	}
	if req.MaxToolCalls != nil && *req.MaxToolCalls < 1 {
		return nil, paramError("max_tool_calls", "invalid_value", "Invalid 'max_tool_calls': %d; expected at least 1.", *req.MaxToolCalls)
	}
	kwargs, err := req.thinking()
	if err != nil {
		return nil, err
	}
	store := (req.Store == nil || *req.Store) && h.store.max > 0
	chat := &brokerv1.ChatRequest{Model: modelName(req.Model), Conversations: []*brokerv1.Conversation{conv}, Sampling: sp,
		Tools: tools, ToolChoice: choice, ToolChoiceFunction: choiceFn, ParallelToolCalls: req.ParallelToolCalls,
		ChatTemplateKwargs: kwargs, TruncateHistory: req.Truncation != nil && *req.Truncation == "auto"}
	b := &responseBuilder{id: responseID("resp"), created: h.opts.Now().Unix(), req: req, store: store, logprobs: sp.GetLogprobs()}
	if req.ParallelToolCalls != nil && !*req.ParallelToolCalls {
		b.maxCalls = 1
	}
	if m := req.MaxToolCalls; m != nil && (b.maxCalls == 0 || *m < b.maxCalls) {
		b.maxCalls = *m
	}
	return &responseRun{chat: chat, b: b, stored: stored, history: history}, nil
}

// clientOf is the caller's name, whose stored responses it may see.
func clientOf(r *http.Request) string {
	c, _ := ClientFrom(r.Context())
	return c
}

// event writes a typed server-sent event, as the Responses API streams.
func (s *sse) event(typ string, v any) error {
	if !s.started {
		s.w.Header().Set("Content-Type", "text/event-stream")
		s.w.Header().Set("Cache-Control", "no-cache")
		s.started = true
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", typ, b); err != nil {
		return err
	}
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// responseItem is an output item being built.
type responseItem struct {
	kind     string // message, reasoning or function_call
	id       string
	text     strings.Builder
	logprobs []logprobEntry
	call     *brokerv1.ToolCall
	status   string // in_progress until closed
	index    int    // its output_index
}

// responseBuilder turns a chat's deltas into output items, sending the
// Responses API's events as they happen when emit is set (streaming).
type responseBuilder struct {
	id       string
	created  int64
	req      *responsesRequest
	store    bool
	logprobs bool
	maxCalls int // 0: any

	emit    func(typ string, fields map[string]any) error
	seq     int
	started bool
	items   []*responseItem
	open    *responseItem // the message or reasoning text goes to
	held    []logprobEntry
	calls   int
	final   map[string]any // the response when done
}

func (b *responseBuilder) send(typ string, fields map[string]any) error {
	if b.emit == nil {
		return nil
	}
	fields["type"], fields["sequence_number"] = typ, b.seq
	b.seq++
	return b.emit(typ, fields)
}

// object is the response as it stands.
func (b *responseBuilder) object(status string, incomplete any, usage any) map[string]any {
	req := b.req
	output := make([]any, len(b.items))
	for i, it := range b.items {
		output[i] = b.itemJSON(it)
	}
	var effort any
	if req.Reasoning != nil && req.Reasoning.Effort != nil {
		effort = *req.Reasoning.Effort
	}
	format := any(map[string]any{"type": "text"})
	if req.Text != nil && req.Text.Format != nil && req.Text.Format.Type != "" {
		format = req.Text.Format
	}
	tools := any([]any{})
	if !isNull(req.Tools) {
		tools = req.Tools
	}
	choice := any("auto")
	if !isNull(req.ToolChoice) {
		choice = req.ToolChoice
	}
	metadata := req.Metadata
	if metadata == nil {
		metadata = map[string]string{}
	}
	truncation := "disabled"
	if req.Truncation != nil {
		truncation = *req.Truncation
	}
	topLogprobs := 0
	if req.TopLogprobs != nil {
		topLogprobs = *req.TopLogprobs
	}
	return map[string]any{
		"id": b.id, "object": "response", "created_at": b.created, "status": status, "background": false,
		"error": nil, "incomplete_details": incomplete, "instructions": req.Instructions,
		"max_output_tokens": req.MaxOutputTokens, "max_tool_calls": req.MaxToolCalls, "model": req.Model,
		"output": output, "parallel_tool_calls": req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		"previous_response_id": req.PreviousResponseID, "reasoning": map[string]any{"effort": effort, "summary": nil},
		"service_tier": "default", "store": b.store, "temperature": req.Temperature, "top_p": req.TopP,
		"text": map[string]any{"format": format}, "tool_choice": choice, "tools": tools, "top_logprobs": topLogprobs,
		"truncation": truncation, "usage": usage, "user": req.User, "safety_identifier": req.SafetyIdentifier,
		"prompt_cache_key": req.PromptCacheKey, "metadata": metadata,
	}
}

// itemJSON is an output item as the API gives it.
func (b *responseBuilder) itemJSON(it *responseItem) map[string]any {
	switch it.kind {
	case "reasoning":
		return map[string]any{"id": it.id, "type": "reasoning", "status": it.status, "summary": []any{},
			"content": []any{map[string]any{"type": "reasoning_text", "text": it.text.String()}}}
	case "function_call":
		return map[string]any{"id": it.id, "type": "function_call", "status": it.status, "call_id": it.call.GetId(),
			"name": it.call.GetName(), "arguments": it.call.GetArguments()}
	}
	return map[string]any{"id": it.id, "type": "message", "status": it.status, "role": "assistant",
		"content": []any{b.textPart(it)}}
}

func (b *responseBuilder) textPart(it *responseItem) map[string]any {
	lps := it.logprobs
	if lps == nil {
		lps = []logprobEntry{}
	}
	return map[string]any{"type": "output_text", "text": it.text.String(), "annotations": []any{}, "logprobs": lps}
}

// start sends response.created and response.in_progress.
func (b *responseBuilder) start() error {
	if b.started {
		return nil
	}
	b.started = true
	if err := b.send("response.created", map[string]any{"response": b.object("in_progress", nil, nil)}); err != nil {
		return err
	}
	return b.send("response.in_progress", map[string]any{"response": b.object("in_progress", nil, nil)})
}

// add opens an item.
func (b *responseBuilder) add(it *responseItem) error {
	it.status, it.index = "in_progress", len(b.items)
	b.items = append(b.items, it)
	i := it.index
	item := b.itemJSON(it)
	switch it.kind {
	case "message", "reasoning":
		item["content"] = []any{}
		b.open = it
	}
	if err := b.send("response.output_item.added", map[string]any{"output_index": i, "item": item}); err != nil {
		return err
	}
	switch it.kind {
	case "message":
		return b.send("response.content_part.added", map[string]any{"item_id": it.id, "output_index": i, "content_index": 0, "part": b.textPart(it)})
	case "reasoning":
		return b.send("response.content_part.added", map[string]any{"item_id": it.id, "output_index": i, "content_index": 0,
			"part": map[string]any{"type": "reasoning_text", "text": ""}})
	}
	return nil
}

// close ends the open item with a status.
func (b *responseBuilder) close(status string) error {
	it := b.open
	if it == nil {
		return nil
	}
	b.open = nil
	it.status = status
	i := it.index
	switch it.kind {
	case "message":
		if len(b.held) > 0 { // tokens whose text never came (a stop string's)
			if err := b.text(it, "", nil); err != nil {
				return err
			}
		}
		lps := it.logprobs
		if lps == nil {
			lps = []logprobEntry{}
		}
		if err := b.send("response.output_text.done", map[string]any{"item_id": it.id, "output_index": i, "content_index": 0,
			"text": it.text.String(), "logprobs": lps}); err != nil {
			return err
		}
		if err := b.send("response.content_part.done", map[string]any{"item_id": it.id, "output_index": i, "content_index": 0, "part": b.textPart(it)}); err != nil {
			return err
		}
	case "reasoning":
		if err := b.send("response.reasoning_text.done", map[string]any{"item_id": it.id, "output_index": i, "content_index": 0, "text": it.text.String()}); err != nil {
			return err
		}
		if err := b.send("response.content_part.done", map[string]any{"item_id": it.id, "output_index": i, "content_index": 0,
			"part": map[string]any{"type": "reasoning_text", "text": it.text.String()}}); err != nil {
			return err
		}
	}
	return b.send("response.output_item.done", map[string]any{"output_index": i, "item": b.itemJSON(it)})
}

// openKind makes sure the open item is of a kind, closing another.
func (b *responseBuilder) openKind(kind, prefix string) (*responseItem, error) {
	if b.open != nil && b.open.kind == kind {
		return b.open, nil
	}
	if err := b.close("completed"); err != nil {
		return nil, err
	}
	it := &responseItem{kind: kind, id: responseID(prefix)}
	return it, b.add(it)
}

// text appends to a message, with its tokens' logprobs and those held.
func (b *responseBuilder) text(it *responseItem, s string, lps []logprobEntry) error {
	if b.logprobs {
		lps = append(b.held, lps...)
		b.held = nil
	} else {
		lps = nil
	}
	it.text.WriteString(s)
	it.logprobs = append(it.logprobs, lps...)
	if lps == nil {
		lps = []logprobEntry{}
	}
	return b.send("response.output_text.delta", map[string]any{"item_id": it.id, "output_index": it.index,
		"content_index": 0, "delta": s, "logprobs": lps})
}

// on takes the chat's events.
func (b *responseBuilder) on(e event) error {
	if err := b.start(); err != nil {
		return err
	}
	if d := e.delta; d != nil {
		lps := logprobEntries(d.GetLogprobs())
		if r := d.GetReasoning(); r != "" {
			b.held = nil // the thinking's tokens: no logprobs are given for them
			it, err := b.openKind("reasoning", "rs")
			if err != nil {
				return err
			}
			it.text.WriteString(r)
			if err := b.send("response.reasoning_text.delta", map[string]any{"item_id": it.id, "output_index": it.index,
				"content_index": 0, "delta": r}); err != nil {
				return err
			}
			if d.GetText() == "" {
				lps = nil
			}
		}
		switch {
		case d.GetText() != "":
			it, err := b.openKind("message", "msg")
			if err != nil {
				return err
			}
			if err := b.text(it, d.GetText(), lps); err != nil {
				return err
			}
		case len(d.GetToolCalls()) > 0:
			b.held = nil
		case b.open == nil || b.open.kind == "message":
			// Tokens whose text is held back (a character's first bytes,
			// a stop string's start): their logprobs go with the text.
			b.held = append(b.held, lps...)
		}
		for _, tc := range d.GetToolCalls() {
			if b.maxCalls > 0 && b.calls >= b.maxCalls {
				continue
			}
			b.calls++
			if err := b.close("completed"); err != nil {
				return err
			}
			it := &responseItem{kind: "function_call", id: responseID("fc"), call: &brokerv1.ToolCall{Id: tc.GetId(), Name: tc.GetName()}}
			if err := b.add(it); err != nil {
				return err
			}
			i := it.index
			it.call.Arguments = tc.GetArguments()
			if err := b.send("response.function_call_arguments.delta", map[string]any{"item_id": it.id, "output_index": i, "delta": tc.GetArguments()}); err != nil {
				return err
			}
			if err := b.send("response.function_call_arguments.done", map[string]any{"item_id": it.id, "output_index": i,
				"name": tc.GetName(), "arguments": tc.GetArguments()}); err != nil {
				return err
			}
			it.status = "completed"
			if err := b.send("response.output_item.done", map[string]any{"output_index": i, "item": b.itemJSON(it)}); err != nil {
				return err
			}
		}
		return nil
	}
	res := e.result
	status, event := "completed", "response.completed"
	var incomplete any
	switch res.GetFinishReason() {
	case brokerv1.FinishReason_FINISH_REASON_STOP, brokerv1.FinishReason_FINISH_REASON_TOOL_CALLS:
	case brokerv1.FinishReason_FINISH_REASON_CONSTRAINT:
		// The structured output's grammar could not continue.
		status, event, incomplete = "incomplete", "response.incomplete", map[string]any{"reason": "constraint"}
	default: // a length or time limit
		status, event, incomplete = "incomplete", "response.incomplete", map[string]any{"reason": "max_output_tokens"}
	}
	if err := b.close(status); err != nil {
		return err
	}
	u := res.GetUsage()
	usage := map[string]any{
		"input_tokens": u.GetPromptTokens(), "input_tokens_details": map[string]any{"cached_tokens": u.GetCachedPromptTokens()},
		"output_tokens": u.GetCompletionTokens(), "output_tokens_details": map[string]any{"reasoning_tokens": u.GetReasoningTokens()},
		"total_tokens": u.GetPromptTokens() + u.GetCompletionTokens(),
	}
	b.final = b.object(status, incomplete, usage)
	return b.send(event, map[string]any{"response": b.final})
}

// messages is the output as a chat's messages, for a continuation.
func (b *responseBuilder) messages() []*brokerv1.ChatMessage {
	items := make([]respInputItem, 0, len(b.items))
	for _, it := range b.items {
		var in respInputItem
		_ = json.Unmarshal(mustJSON(b.itemJSON(it)), &in)
		items = append(items, in)
	}
	msgs, err := responseMessages(items, "output")
	if err != nil {
		return nil // the builder's own items always read
	}
	return msgs
}
