package httpapi

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/internal/errtable"
)

// The OpenAI API (chat completions, completions, embeddings, models) as
// its official clients use it: SSE streaming ending in "data: [DONE]",
// stream_options.include_usage, its error object and status codes.

type openaiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func openaiErrorType(code int) string {
	switch code {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusRequestTimeout, http.StatusRequestEntityTooLarge, http.StatusNotImplemented:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "invalid_request_error" // with code invalid_api_key, as OpenAI answers a wrong key
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	}
	return "server_error"
}

// stopField is OpenAI's stop: a string or a list of strings.
type stopField []string

func (s *stopField) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return status.Error(codes.InvalidArgument, `"stop" must be a string or a list of strings`)
	}
	*s = many
	return nil
}

// openaiSampling are the sampling fields both completion endpoints share.
type openaiSampling struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Temperature         *float32              `json:"temperature"`
	TopP                *float32              `json:"top_p"`
	MaxTokens           *int32                `json:"max_tokens"`
	MaxCompletionTokens *int32                `json:"max_completion_tokens"`
	Stop                stopField             `json:"stop"`
	Seed                *int64                `json:"seed"`
	N                   *int                  `json:"n"`
	PresencePenalty     *float32              `json:"presence_penalty"`
	FrequencyPenalty    *float32              `json:"frequency_penalty"`
	ResponseFormat      *openaiResponseFormat `json:"response_format"`
	// LogitBias maps token ids (as strings: JSON's keys) to -100 to 100.
	LogitBias map[string]float64 `json:"logit_bias"`
	// Refused when they ask for what brokerd does not do, never ignored:
	// best_of (one candidate a prompt, as n), and the deprecated
	// functions and function_call (tools and tool_choice replace them).
	BestOf       *int            `json:"best_of"`
	Functions    json.RawMessage `json:"functions"`
	FunctionCall json.RawMessage `json:"function_call"`
	openaiGuided
	Tools json.RawMessage `json:"tools"`
	// Extensions vLLM's server accepts too.
	TopK                   *int32   `json:"top_k"`
	MinP                   *float32 `json:"min_p"`
	RepetitionPenalty      *float32 `json:"repetition_penalty"`
	MinTokens              *int32   `json:"min_tokens"`
	IgnoreEOS              bool     `json:"ignore_eos"`
	StopTokenIDs           []int32  `json:"stop_token_ids"`
	IncludeStopStrInOutput bool     `json:"include_stop_str_in_output"`
}

func (o *openaiSampling) params() (*brokerv1.SamplingParams, error) {
	if o.N != nil && (*o.N < 1 || *o.N > maxChoices) {
		return nil, paramError("n", "invalid_value", "Invalid 'n': want 1 to %d, got %d.", maxChoices, *o.N)
	}
	if o.BestOf != nil && *o.BestOf != 1 {
		return nil, paramError("best_of", "invalid_value", "best_of=%d is not supported: one candidate per prompt", *o.BestOf)
	}
	for _, f := range []struct {
		name string
		v    json.RawMessage
	}{{"functions", o.Functions}, {"function_call", o.FunctionCall}} {
		if len(f.v) > 0 && string(f.v) != "null" {
			return nil, paramError(f.name, "invalid_value", "%q is OpenAI's deprecated function calling, which brokerd does not serve: send \"tools\" and \"tool_choice\"", f.name)
		}
	}
	if err := unsupported(o.Tools, 0); err != nil {
		return nil, err
	}
	// OpenAI's range: above 2 its API refuses what brokerd's sampler would
	// take, so a client sees here what it would see there.
	if t := o.Temperature; t != nil && *t > 2 {
		return nil, paramError("temperature", "decimal_above_max_value", "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got %v instead.", *t)
	}
	if t := o.Temperature; t != nil && *t < 0 {
		return nil, paramError("temperature", "decimal_below_min_value", "Invalid 'temperature': decimal below minimum value. Expected a value >= 0, but got %v instead.", *t)
	}
	if o.MinTokens != nil && *o.MinTokens < 0 {
		return nil, paramError("min_tokens", "invalid_value", "min_tokens must be greater than or equal to 0, got %d", *o.MinTokens)
	}
	sp := &brokerv1.SamplingParams{
		Temperature: o.Temperature, TopP: o.TopP, TopK: o.TopK, MinP: o.MinP,
		PresencePenalty: o.PresencePenalty, FrequencyPenalty: o.FrequencyPenalty, RepetitionPenalty: o.RepetitionPenalty,
		Stop: o.Stop, IgnoreEos: o.IgnoreEOS, StopTokenIds: o.StopTokenIDs, IncludeStopStrInOutput: o.IncludeStopStrInOutput,
	}
	if o.MinTokens != nil {
		sp.MinTokens = *o.MinTokens
	}
	if o.N != nil {
		sp.N = int32(*o.N)
	}
	var err error
	if sp.Constraint, err = o.constraint(); err != nil {
		return nil, err
	}
	// OpenAI's and vLLM's range: at least 1. brokerd's 0 (to the end of the
	// context) is the field left out.
	for _, f := range []struct {
		name string
		v    *int32
	}{{"max_tokens", o.MaxTokens}, {"max_completion_tokens", o.MaxCompletionTokens}} {
		if f.v != nil && *f.v < 1 {
			return nil, paramError(f.name, "integer_below_min_value", "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %d instead.", f.name, *f.v)
		}
	}
	switch {
	case o.MaxCompletionTokens != nil:
		sp.MaxTokens = *o.MaxCompletionTokens
	case o.MaxTokens != nil:
		sp.MaxTokens = *o.MaxTokens
	}
	if o.Seed != nil {
		sp.Seed = proto.Uint64(uint64(*o.Seed))
	}
	if sp.LogitBias, err = logitBias(o.LogitBias); err != nil {
		return nil, err
	}
	return sp, nil
}

// logitBias reads OpenAI's logit_bias: token ids as JSON keys, biases
// -100 to 100 (the engine checks the count and the ids' vocabulary).
func logitBias(m map[string]float64) (map[int32]float32, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[int32]float32, min(len(m), 1024))
	for k, v := range m {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 {
			return nil, paramError("logit_bias", "invalid_value", "Invalid 'logit_bias': key %.40q is not a token id.", k)
		}
		if v < -100 || v > 100 {
			return nil, paramError("logit_bias", "invalid_value", "Invalid 'logit_bias': the bias of token %d is %v: want -100 to 100.", id, v)
		}
		out[int32(id)] = float32(v)
	}
	return out, nil
}

type openaiUsage struct {
	PromptTokens        int32 `json:"prompt_tokens"`
	CompletionTokens    int32 `json:"completion_tokens"`
	TotalTokens         int32 `json:"total_tokens"`
	PromptTokensDetails struct {
		// Prompt tokens the prefix cache held.
		CachedTokens int32 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		// A thinking model's tokens of thought.
		ReasoningTokens int32 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// add counts a choice's result; n choices per prompt count the prompt
// once, as OpenAI and vLLM count it (its first choice's cache hits).
func (u *openaiUsage) add(r *brokerv1.GenerationResult, n int32) {
	if r.GetIndex()%max(n, 1) == 0 {
		u.PromptTokens += r.GetUsage().GetPromptTokens()
		u.PromptTokensDetails.CachedTokens += r.GetUsage().GetCachedPromptTokens()
	}
	u.CompletionTokens += r.GetUsage().GetCompletionTokens()
	u.CompletionTokensDetails.ReasoningTokens += r.GetUsage().GetReasoningTokens()
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
}

// maxChoices bounds n (OpenAI's 128); --max-items-per-request bounds
// prompts times n.
const maxChoices = 128

// sse writes server-sent events.
type sse struct {
	w       http.ResponseWriter
	started bool
}

func (s *sse) send(v any) error {
	if !s.started {
		s.w.Header().Set("Content-Type", "text/event-stream")
		s.w.Header().Set("Cache-Control", "no-cache")
		s.started = true
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "data: %s\n\n", b); err != nil {
		return err
	}
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

func (s *sse) done() {
	fmt.Fprint(s.w, "data: [DONE]\n\n")
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
}

func newID(prefix string) string { return fmt.Sprintf("%s-%016x", prefix, rand.Uint64()) }

// endStream ends a completion's stream: the usage chunk when
// stream_options asks for it, then data: [DONE].
func (o *openaiSampling) endStream(out *sse, id, object string, created int64, usage openaiUsage) error {
	if o.StreamOptions != nil && o.StreamOptions.IncludeUsage {
		if err := out.send(map[string]any{"id": id, "object": object, "created": created, "model": o.Model,
			"choices": []any{}, "usage": usage}); err != nil {
			return err
		}
	}
	out.done()
	return nil
}

// endSSE reports a completion's error (none: nothing): as a status before
// the stream started (saying what model's kind is when that is why), as
// an error event after (what OpenAI's clients raise), then data: [DONE],
// so the stream ends as streams do and is not taken for a network fault.
func (h *Handler) endSSE(w http.ResponseWriter, r *http.Request, out *sse, model string, err error) {
	if err == nil {
		return
	}
	if !out.started {
		h.fail(w, r, h.explainKind(r.Context(), err, modelName(model), wantGenerator, true))
		return
	}
	st := status.Convert(err)
	if out.send(map[string]any{"error": openaiError{Message: st.Message(), Type: openaiErrorType(errtable.HTTPStatus(st.Code())), Param: openaiParam(err), Code: openaiCode(err, st)}}) == nil {
		out.done()
	}
}

type openaiChatRequest struct {
	openaiSampling
	Logprobs    *bool `json:"logprobs"`
	TopLogprobs *int  `json:"top_logprobs"`
	// ChatTemplateKwargs are variables for the chat template, as vLLM
	// takes them (Qwen3's enable_thinking).
	ChatTemplateKwargs map[string]any `json:"chat_template_kwargs"`
	// ReasoningEffort is OpenAI's: "none" turns a thinking model's
	// thinking off, any other effort on (the template's reasoning_effort,
	// as vLLM passes it); chat_template_kwargs' own win.
	ReasoningEffort *string `json:"reasoning_effort"`
	// vLLM's: a reply that continues the last (assistant) message, a
	// prefill, instead of starting a turn.
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ContinueFinalMessage bool  `json:"continue_final_message"`
	// ReturnTokenIDs is vLLM's: the response gives the rendered prompt's
	// token ids (prompt_token_ids) and each choice's (token_ids).
	ReturnTokenIDs bool            `json:"return_token_ids"`
	Messages       []openaiMessage `json:"messages"`
	// Tools (over openaiSampling's, which the completions route refuses)
	// and tool_choice; parallel_tool_calls false holds tool_choice
	// required to one call, and answers tool_choice auto's first call
	// only (vLLM's maybe_filter_parallel_tool_calls: the model is not held
	// to one).
	Tools             []apiTool       `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
}

// openaiMessage is a chat message.
type openaiMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// ReasoningContent is an earlier answer's thinking (vLLM's field).
	ReasoningContent string `json:"reasoning_content"`
	// An assistant's calls, and a tool's answer to one.
	ToolCalls  []openaiToolCall `json:"tool_calls"`
	ToolCallID string           `json:"tool_call_id"`
}

// openaiConversation reads a chat's messages.
func openaiConversation(msgs []openaiMessage) (*brokerv1.Conversation, error) {
	conv := &brokerv1.Conversation{}
	for i, m := range msgs {
		if m.Role != "assistant" && (len(m.Content) == 0 || string(m.Content) == "null") {
			// Only an assistant's calls may come without content.
			return nil, paramError(fmt.Sprintf("messages.[%d].content", i), "invalid_type",
				"Invalid type for 'messages.[%d].content': expected one of a string or array of objects, but got null instead.", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, err
		}
		role := m.Role
		if role == "developer" { // OpenAI's newer name for system
			role = "system"
		}
		calls, err := openaiHistoryCalls(m.ToolCalls)
		if err != nil {
			return nil, err
		}
		conv.Messages = append(conv.Messages, &brokerv1.ChatMessage{Role: role, Content: text, Reasoning: m.ReasoningContent,
			ToolCalls: calls, ToolCallId: m.ToolCallID})
	}
	return conv, nil
}

// openaiChatShape is what a chat's body says of its prompt: its messages,
// tools, tool_choice and template variables (the chat route and vLLM's
// /tokenize read them alike).
func openaiChatShape(msgs []openaiMessage, ts []apiTool, rawChoice json.RawMessage, kwargs map[string]any) (*brokerv1.ChatRequest, error) {
	conv, err := openaiConversation(msgs)
	if err != nil {
		return nil, err
	}
	tools, err := toolsToProto(ts)
	if err != nil {
		return nil, err
	}
	choice, choiceFn, err := openaiToolChoice(rawChoice)
	if err != nil {
		return nil, err
	}
	chat := &brokerv1.ChatRequest{Conversations: []*brokerv1.Conversation{conv}, Tools: tools, ToolChoice: choice, ToolChoiceFunction: choiceFn}
	if kwargs != nil {
		if chat.ChatTemplateKwargs, err = structpb.NewStruct(kwargs); err != nil {
			return nil, paramError("chat_template_kwargs", "invalid_value", "Invalid 'chat_template_kwargs': %v", err)
		}
	}
	return chat, nil
}

// messageText reads a message's content: a string, or a list of parts of
// which only text parts are supported.
func messageText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 { // an assistant's calls without content
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", status.Error(codes.InvalidArgument, "a message's content must be a string or a list of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", status.Errorf(codes.InvalidArgument, "content parts of type %q are not supported: brokerd serves text models", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

func (h *Handler) openaiChat(w http.ResponseWriter, r *http.Request) {
	var req openaiChatRequest
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	sp, err := req.params()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	wantLogprobs := req.Logprobs != nil && *req.Logprobs
	if req.TopLogprobs != nil {
		if err := checkTopLogprobs("top_logprobs", *req.TopLogprobs); err != nil {
			h.fail(w, r, err)
			return
		}
		if *req.TopLogprobs > 0 && !wantLogprobs {
			h.fail(w, r, paramError("top_logprobs", "invalid_value", "Invalid 'top_logprobs': logprobs must be true when top_logprobs is used."))
			return
		}
		sp.TopLogprobs = int32(*req.TopLogprobs)
	}
	sp.Logprobs = wantLogprobs
	if req.ReasoningEffort != nil {
		vars, err := effortVars(*req.ReasoningEffort, "reasoning_effort")
		if err != nil {
			h.fail(w, r, err)
			return
		}
		for k, v := range req.ChatTemplateKwargs {
			vars[k] = v
		}
		req.ChatTemplateKwargs = vars
	}
	chat, err := openaiChatShape(req.Messages, req.Tools, req.ToolChoice, req.ChatTemplateKwargs)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	chat.Model, chat.Sampling, chat.ParallelToolCalls, chat.ReturnPromptTokenIds = modelName(req.Model), sp, req.ParallelToolCalls, req.ReturnTokenIDs
	chat.AddGenerationPrompt, chat.ContinueFinalMessage = req.AddGenerationPrompt, req.ContinueFinalMessage
	id, created := newID("chatcmpl"), h.opts.Now().Unix()
	out := &sse{w: w}
	// Each choice's answer so far (n of them, indexed as the broker's
	// sequences).
	type choiceState struct {
		text, reasoning strings.Builder
		calls           []*brokerv1.ToolCall
		logprobs        []logprobEntry
		tokenIDs        []int32 // return_token_ids
		first           bool    // no chunk sent yet
		finish          string
	}
	var promptIDs []int32 // return_token_ids: the rendered conversation's
	choices := make([]choiceState, max(sp.GetN(), 1))
	for i := range choices {
		choices[i].first = true
	}
	left := len(choices)
	var usage openaiUsage
	// logprobs is the choice's logprobs object: null unless asked for.
	logprobs := func(es []logprobEntry) any {
		if !wantLogprobs {
			return nil
		}
		if es == nil {
			es = []logprobEntry{}
		}
		return map[string]any{"content": es, "refusal": nil}
	}
	oneCall := req.ParallelToolCalls != nil && !*req.ParallelToolCalls
	// chunk is a choice's chunk; with return_token_ids, one that is not
	// the last carries the choice's token ids.
	chunk := func(i int32, delta map[string]any, finish *string, lps any, ids []int32) map[string]any {
		c := map[string]any{"index": i, "delta": delta, "finish_reason": finish, "logprobs": lps}
		if req.ReturnTokenIDs && finish == nil {
			c["token_ids"] = nonNilIDs(ids)
		}
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": req.Model, "choices": []any{c}}
	}
	err = h.chat(r.Context(), chat, func(e event) error {
		if e.delta != nil && len(e.delta.GetPromptTokenIds()) > 0 {
			// The call's first message: each choice's prompt ids, which
			// vLLM streams in each choice's first chunk.
			i := e.delta.GetIndex()
			promptIDs = e.delta.GetPromptTokenIds()
			if !req.Stream {
				return nil
			}
			choices[i].first = false
			ch := chunk(i, map[string]any{"role": "assistant", "content": ""}, nil, nil, nil)
			ch["prompt_token_ids"] = promptIDs
			return out.send(ch)
		}
		if e.delta != nil {
			i := e.delta.GetIndex()
			c := &choices[i]
			c.tokenIDs = append(c.tokenIDs, e.delta.GetTokenIds()...)
			lps := logprobEntries(e.delta.GetLogprobs())
			tcs := e.delta.GetToolCalls()
			if oneCall {
				tcs = firstCall(tcs)
				if len(tcs) == 0 && len(e.delta.GetToolCalls()) > 0 && e.delta.GetText() == "" && e.delta.GetReasoning() == "" && len(lps) == 0 {
					return nil // only calls after the first
				}
			}
			if !req.Stream {
				c.text.WriteString(e.delta.GetText())
				c.reasoning.WriteString(e.delta.GetReasoning())
				c.calls = append(c.calls, tcs...)
				c.logprobs = append(c.logprobs, lps...)
				return nil
			}
			// vLLM's shape: a thinking model's reasoning in
			// reasoning_content, content only when there is some; each
			// call whole in one delta, with its index, as OpenAI's
			// clients gather them.
			delta := map[string]any{}
			if r := e.delta.GetReasoning(); r != "" {
				delta["reasoning_content"] = r
			}
			if len(tcs) > 0 {
				delta["tool_calls"] = openaiToolCalls(tcs, true)
			}
			if t := e.delta.GetText(); t != "" || len(delta) == 0 {
				delta["content"] = t
			}
			if len(delta) == 1 && delta["content"] == "" && !c.first && len(lps) == 0 && (!req.ReturnTokenIDs || len(e.delta.GetTokenIds()) == 0) {
				// Text held back (a stop string's possible start, part of
				// a character or a call): nothing to send, as vLLM sends
				// nothing.
				return nil
			}
			if c.first {
				delta["role"] = "assistant"
				c.first = false
			}
			return out.send(chunk(i, delta, nil, logprobs(lps), e.delta.GetTokenIds()))
		}
		i := e.result.GetIndex()
		c := &choices[i]
		usage.add(e.result, sp.GetN())
		c.finish = openaiFinish(e.result.GetFinishReason())
		left--
		if req.Stream {
			if err := out.send(chunk(i, map[string]any{}, &c.finish, nil, nil)); err != nil {
				return err
			}
			if left > 0 {
				return nil
			}
			return req.endStream(out, id, "chat.completion.chunk", created, usage)
		}
		if left > 0 {
			return nil
		}
		all := make([]any, len(choices))
		for i := range choices {
			c := &choices[i]
			text := c.text.String()
			msg := map[string]any{"role": "assistant", "content": text, "reasoning_content": nullIfEmpty(c.reasoning.String())}
			if len(c.calls) > 0 {
				// OpenAI's shape: content null when the answer is calls.
				msg["content"], msg["tool_calls"] = nullIfEmpty(text), openaiToolCalls(c.calls, false)
			}
			all[i] = map[string]any{"index": i, "message": msg, "finish_reason": c.finish, "logprobs": logprobs(c.logprobs)}
			if req.ReturnTokenIDs {
				all[i].(map[string]any)["token_ids"] = nonNilIDs(c.tokenIDs)
			}
		}
		resp := map[string]any{"id": id, "object": "chat.completion", "created": created, "model": req.Model, "choices": all, "usage": usage}
		if req.ReturnTokenIDs {
			resp["prompt_token_ids"] = nonNilIDs(promptIDs)
		}
		writeJSON(w, resp)
		return nil
	})
	h.endSSE(w, r, out, req.Model, err)
}

// nonNilIDs is ids, never JSON null: [] for none.
func nonNilIDs(ids []int32) []int32 {
	if ids == nil {
		return []int32{}
	}
	return ids
}

// nullIfEmpty is s, or JSON null for "".
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// openaiFinish maps a finish reason onto OpenAI's: stop, tool_calls or
// length (a deadline is a length limit of time).
func openaiFinish(f brokerv1.FinishReason) string {
	switch f {
	case brokerv1.FinishReason_FINISH_REASON_STOP:
		return "stop"
	case brokerv1.FinishReason_FINISH_REASON_TOOL_CALLS:
		return "tool_calls"
	case brokerv1.FinishReason_FINISH_REASON_CONSTRAINT:
		return "constraint"
	}
	return "length"
}

type openaiCompletionRequest struct {
	openaiSampling
	Prompt json.RawMessage `json:"prompt"`
	Echo   bool            `json:"echo"`
	// Suffix (fill in the middle) is refused, as vLLM refuses it.
	Suffix *string `json:"suffix"`
	// Logprobs is the legacy API's count of alternatives (null: none).
	Logprobs *int `json:"logprobs"`
	// ReturnTokenIDs is vLLM's: each choice gives its prompt's token ids
	// (prompt_token_ids) and its own (token_ids).
	ReturnTokenIDs bool `json:"return_token_ids"`
}

// completionPrompts is /v1/completions' prompt: a string, a list of
// strings, a prompt of token ids, or a list of those (OpenAI's and vLLM's
// forms): texts or ids, never both.
type completionPrompts struct {
	texts []string
	ids   [][]int32
}

func (p *completionPrompts) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		p.texts = []string{one}
		return nil
	}
	var texts []string
	if err := json.Unmarshal(b, &texts); err == nil {
		p.texts = texts
		return nil
	}
	var ids []int32
	if err := json.Unmarshal(b, &ids); err == nil {
		p.ids = [][]int32{ids}
		return nil
	}
	var many [][]int32
	if err := json.Unmarshal(b, &many); err == nil {
		p.ids = many
		return nil
	}
	return paramError("prompt", "invalid_type", `"prompt" must be a string, a list of strings, a list of token ids (32-bit integers) or a list of such lists`)
}

// legacyMaxTokens is /v1/completions' max_tokens when a request sets none.
const legacyMaxTokens = 16

func (h *Handler) openaiCompletions(w http.ResponseWriter, r *http.Request) {
	var req openaiCompletionRequest
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	sp, err := req.params()
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var prompts completionPrompts
	if err := prompts.UnmarshalJSON(req.Prompt); err != nil {
		h.fail(w, r, err)
		return
	}
	if req.Echo && prompts.ids != nil {
		h.fail(w, r, paramError("echo", "invalid_value", "echo with a prompt of token ids is not supported: brokerd echoes the prompt's text; send it as text, or leave echo out"))
		return
	}
	if req.Echo && req.Logprobs != nil {
		// The prompt's logprobs would come with it, and brokerd computes
		// the logits of sampled positions only.
		h.fail(w, r, paramError("echo", "invalid_value", "echo with logprobs is not supported: brokerd gives no logprobs of prompt tokens; leave one of them out"))
		return
	}
	if req.Suffix != nil && *req.Suffix != "" {
		h.fail(w, r, paramError("suffix", "invalid_value", "suffix is not currently supported: brokerd does not fill in the middle; send the text before it as the prompt"))
		return
	}
	if req.Logprobs != nil {
		if err := checkTopLogprobs("logprobs", *req.Logprobs); err != nil {
			h.fail(w, r, err)
			return
		}
		sp.Logprobs, sp.TopLogprobs = true, int32(*req.Logprobs)
	}
	ctx := r.Context()
	if req.MaxTokens == nil && req.MaxCompletionTokens == nil {
		// OpenAI's and vLLM's legacy completions write 16 tokens when
		// asked for no bound (chat runs to a stop); fewer where the
		// prompt leaves less room.
		sp.MaxTokens, ctx = legacyMaxTokens, withMaxTokensLimit(ctx)
	}
	id, created := newID("cmpl"), h.opts.Now().Unix()
	out := &sse{w: w}
	// n choices per prompt: choice i answers prompt i/n. Each choice's
	// state is made when its first event comes: the broker checks prompts
	// times n against --max-items-per-request before any, and a request
	// of many prompts and a large n must not allocate before that check.
	n := max(sp.GetN(), 1)
	left := (len(prompts.texts) + len(prompts.ids)) * int(n)
	type legacyChoice struct {
		text      strings.Builder
		finish    string
		lp        *legacyLogprobs // when asked for
		offset    int
		echoed    bool
		promptIDs []int32 // return_token_ids
		tokenIDs  []int32
	}
	var cs []*legacyChoice
	get := func(i int32) *legacyChoice {
		for int(i) >= len(cs) {
			c := &legacyChoice{}
			if req.Logprobs != nil {
				c.lp = newLegacyLogprobs()
			}
			cs = append(cs, c)
		}
		return cs[i]
	}
	var usage openaiUsage
	// echo: a choice's text starts with its prompt (streamed in its first
	// chunk), as OpenAI and vLLM answer it.
	echo := func(i int32, text string) string {
		c := get(i)
		if !req.Echo || c.echoed {
			return text
		}
		c.echoed = true
		return prompts.texts[i/n] + text
	}
	choice := func(i int32, text string, finish *string, lp *legacyLogprobs) map[string]any {
		var v any
		if lp != nil {
			v = lp
		}
		return map[string]any{"index": i, "text": text, "finish_reason": finish, "logprobs": v}
	}
	// withIDs adds a choice's token ids (return_token_ids): its prompt's
	// where given (vLLM streams them in the choice's first chunk), and
	// its own.
	withIDs := func(ch map[string]any, prompt, own []int32) map[string]any {
		if req.ReturnTokenIDs {
			if prompt != nil {
				ch["prompt_token_ids"] = prompt
			}
			ch["token_ids"] = nonNilIDs(own)
		}
		return ch
	}
	gen := &brokerv1.GenerateRequest{Model: modelName(req.Model), Prompts: prompts.texts, Sampling: sp, ReturnPromptTokenIds: req.ReturnTokenIDs}
	for _, ids := range prompts.ids {
		gen.TokenPrompts = append(gen.TokenPrompts, &brokerv1.TokenPrompt{Ids: ids})
	}
	err = h.generate(ctx, gen, func(e event) error {
		if e.delta != nil && len(e.delta.GetPromptTokenIds()) > 0 {
			i := e.delta.GetIndex()
			c := get(i)
			c.promptIDs = e.delta.GetPromptTokenIds()
			if !req.Stream {
				return nil
			}
			return out.send(map[string]any{"id": id, "object": "text_completion", "created": created, "model": req.Model,
				"choices": []any{withIDs(choice(i, echo(i, ""), nil, nil), c.promptIDs, nil)}})
		}
		if e.delta != nil {
			i := e.delta.GetIndex()
			c := get(i)
			c.tokenIDs = append(c.tokenIDs, e.delta.GetTokenIds()...)
			lp := c.lp
			if lp != nil {
				if req.Stream {
					lp = newLegacyLogprobs() // this chunk's tokens only
				}
				lp.add(e.delta.GetLogprobs(), &c.offset)
			}
			if !req.Stream {
				c.text.WriteString(e.delta.GetText())
				return nil
			}
			return out.send(map[string]any{"id": id, "object": "text_completion", "created": created, "model": req.Model,
				"choices": []any{withIDs(choice(i, echo(i, e.delta.GetText()), nil, lp), nil, e.delta.GetTokenIds())}})
		}
		i := e.result.GetIndex()
		c := get(i)
		usage.add(e.result, n)
		c.finish = openaiFinish(e.result.GetFinishReason())
		left--
		if req.Stream {
			if err := out.send(map[string]any{"id": id, "object": "text_completion", "created": created, "model": req.Model,
				"choices": []any{choice(i, echo(i, ""), &c.finish, nil)}}); err != nil {
				return err
			}
		}
		if left > 0 {
			return nil
		}
		if !req.Stream {
			choices := make([]any, len(cs))
			for j, c := range cs {
				choices[j] = withIDs(choice(int32(j), echo(int32(j), c.text.String()), &c.finish, c.lp), nonNilIDs(c.promptIDs), c.tokenIDs)
			}
			writeJSON(w, map[string]any{"id": id, "object": "text_completion", "created": created, "model": req.Model,
				"choices": choices, "usage": usage})
			return nil
		}
		return req.endStream(out, id, "text_completion", created, usage)
	})
	h.endSSE(w, r, out, req.Model, err)
}

func (h *Handler) openaiEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model          string     `json:"model"`
		Input          embedInput `json:"input"`
		EncodingFormat string     `json:"encoding_format"`
		Dimensions     *int       `json:"dimensions"`
	}
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		h.fail(w, r, status.Errorf(codes.InvalidArgument, "encoding_format %q: want float or base64", req.EncodingFormat))
		return
	}
	resp, err := h.encode(r.Context(), modelName(req.Model), req.Input, nil)
	if err != nil {
		h.fail(w, r, h.explainKind(r.Context(), err, modelName(req.Model), wantEmbedder, true))
		return
	}
	if err := checkDimensions(req.Dimensions, req.Model, resp); err != nil {
		h.fail(w, r, err)
		return
	}
	data := make([]any, len(resp.GetResults()))
	for i, res := range resp.GetResults() {
		var emb any = res.GetVector()
		if req.EncodingFormat == "base64" {
			// Little-endian float32s, as OpenAI's base64 encoding is.
			b := make([]byte, 0, 4*len(res.GetVector()))
			for _, v := range res.GetVector() {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
			}
			emb = base64.StdEncoding.EncodeToString(b)
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": emb}
	}
	// Encoders that do not tokenise count no tokens.
	n := encodedTokens(resp)
	writeJSON(w, map[string]any{"object": "list", "data": data, "model": req.Model,
		"usage": map[string]int64{"prompt_tokens": n, "total_tokens": n}})
}

func (h *Handler) openaiModels(w http.ResponseWriter, r *http.Request) {
	ms, err := h.b.ListModels(r.Context(), &brokerv1.ListModelsRequest{})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	data := []any{}
	for _, m := range ms.GetModels() {
		// Only what an OpenAI route serves now, as vLLM lists its served
		// models: generators and embedding models that are loaded (not
		// MLPs or classifiers; brokerctl models lists the repository).
		if m.GetState() != brokerv1.ModelState_MODEL_STATE_READY || !openaiServes(m.GetKind()) {
			continue
		}
		data = append(data, h.openaiModel(m))
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

// openaiServes reports whether an OpenAI route serves a model of a kind.
func openaiServes(kind string) bool { return isGenerator(kind) || isEmbedder(kind) }

// checkDimensions refuses a dimensions other than the model's: brokerd
// does not shorten embeddings.
func checkDimensions(dims *int, model string, resp *brokerv1.EncodeResponse) error {
	if dims == nil || len(resp.GetResults()) == 0 {
		return nil
	}
	if n := len(resp.GetResults()[0].GetVector()); *dims != n {
		return paramError("dimensions", "invalid_value", "dimensions %d: model %s gives %d-dimensional embeddings and does not shorten them; leave dimensions out or give %d", *dims, model, n, n)
	}
	return nil
}

// openaiModel is a model as /v1/models gives it: created is when its
// files were last written (as Ollama's modified_at), else now.
func (h *Handler) openaiModel(m *brokerv1.Model) map[string]any {
	created := h.opts.Now().Unix()
	if t := m.GetModifiedAt(); t != nil {
		created = t.AsTime().Unix()
	}
	return map[string]any{"id": m.GetName(), "object": "model", "created": created, "owned_by": "brokerd"}
}

func (h *Handler) openaiModelByID(w http.ResponseWriter, r *http.Request) {
	m, err := h.findModel(r.Context(), modelName(r.PathValue("model")))
	if err == nil && m.GetState() != brokerv1.ModelState_MODEL_STATE_READY {
		// As the list: what the routes serve now.
		err = status.Errorf(codes.NotFound, "model %s is in the repository but not loaded (brokerctl load %s)", m.GetName(), m.GetName())
	}
	if err == nil && !openaiServes(m.GetKind()) {
		err = status.Errorf(codes.NotFound, "model %s is a %s model, which the OpenAI API does not serve (generators and embedding models only): it takes tensors through brokerd's gRPC or KServe v2 API", m.GetName(), m.GetKind())
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, h.openaiModel(m))
}
