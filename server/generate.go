package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/brokerd/brokerd/lifecycle"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
	"github.com/brokerd/brokerd/scheduler"
	"github.com/brokerd/brokerd/server/httpapi"
	"github.com/brokerd/brokerd/server/internal/output"
)

// generator is what Generate and Chat need of a loaded decoder LLM:
// its tokenizer and chat template, and the per-sequence state (sampler,
// stop strings, detokeniser) its steps carry. llmGenerator adapts
// runtime/models/llm to it; DataPlane.generator finds a model's.
type generator interface {
	// ContextLength is the most tokens a sequence (prompt and output) holds.
	ContextLength() int
	// DefaultMaxTokens is the output bound of a request that sets none
	// (generation_config.json's max_new_tokens); 0: none, a sequence runs
	// to a stop or to the end of its context.
	DefaultMaxTokens() int
	// DefaultSampling is the sampling of a request that sets none
	// (generation_config.json's, an Ollama model's params).
	DefaultSampling() llm.Sampling
	// SystemPrompt is the system message a conversation without one
	// starts with ("": none).
	SystemPrompt() string
	EncodePrompt(text string, addSpecial bool) ([]int32, error)
	// VocabSize bounds the token ids; TokenBytes is a token's bytes (a
	// special token's text).
	VocabSize() int
	TokenBytes(id int32) []byte
	// RenderChat runs the model's chat template under its bounds; it
	// stops with ctx's error when ctx ends.
	RenderChat(ctx context.Context, msgs []llm.Message, opts llm.ChatOptions) (string, error)
	// ThinkTags are the markers of the model's thinking, when it thinks.
	ThinkTags() (output.Tags, bool)
	// ToolFormat is how the model writes calls of tools
	// (output.NoToolFormat: in no format brokerd parses).
	ToolFormat() output.ToolFormat
	// NewSequence returns the state of one sequence sampling with p
	// (errors wrap models.ErrInvalidInput, or the grammar package's
	// sentinels for a constraint, compiled under ctx).
	NewSequence(ctx context.Context, p llm.Sampling, prompt []int32) (genSequence, error)
}

// genSequence is one sequence's state, owned by the model's executor.
type genSequence interface {
	// State is what the scheduler hands the executor with every step.
	State() any
	// Delta reads the payload of one generated token (scheduler.GenEvent.Out).
	Delta(out any) (genDelta, error)
	// Flush returns the text held back when the sequence ends (an
	// unfinished UTF-8 sequence, a prefix of a stop string that never
	// completed).
	Flush() string
}

// genDelta is what one token added.
type genDelta struct {
	Text     string
	TokenIDs []int32
	Logprobs []*brokerv1.LogprobEntry
}

// Bounds of a generation request besides the model's own and its
// sampling's (llm.Sampling.Validate's).
const (
	// maxTemplateKwargs bounds chat_template_kwargs: keys, and bytes.
	maxTemplateKwargs      = 64
	maxTemplateKwargsBytes = 64 << 10
	// maxTools bounds a chat's tools (OpenAI's limit), maxToolCalls an
	// assistant turn's calls.
	maxTools     = 128
	maxToolCalls = 128
	// maxChatMessages bounds one conversation; chatMessageOverhead is
	// what each message counts against --max-item-bytes besides its role
	// and content (about what a chat template adds around it).
	maxChatMessages     = 8192
	chatMessageOverhead = 16
)

// samplingFromProto is a request's sampling as the engine takes it: the
// fields the request sets over the model's defaults d, validated. It is
// the one place they are merged: a request's stop strings replace the
// model's (an Ollama model's params), as Ollama's options do.
func samplingFromProto(p *brokerv1.SamplingParams, d llm.Sampling) (llm.Sampling, error) {
	if p == nil {
		p = &brokerv1.SamplingParams{}
	}
	s := d
	if p.Temperature != nil {
		s.Temperature = p.GetTemperature()
	}
	if p.TopP != nil {
		s.TopP = p.GetTopP()
		if s.TopP == 0 {
			// A request's top_p 0 keeps the most likely token, as llama.cpp
			// (so Ollama) and OpenAI take it; the engine's 0 is "off".
			s.TopP = math.SmallestNonzeroFloat32
		}
	}
	if p.TopK != nil {
		s.TopK = int(p.GetTopK())
	}
	if p.MinP != nil {
		s.MinP = p.GetMinP()
	}
	if p.RepetitionPenalty != nil {
		s.RepetitionPenalty = p.GetRepetitionPenalty()
	}
	if p.PresencePenalty != nil {
		s.PresencePenalty = p.GetPresencePenalty()
	}
	if p.FrequencyPenalty != nil {
		s.FrequencyPenalty = p.GetFrequencyPenalty()
	}
	if p.Seed != nil {
		s.Seed, s.Seeded = p.GetSeed(), true
	}
	if len(p.GetStop()) > 0 {
		s.Stop = p.GetStop()
	}
	s.StopTokenIDs = p.GetStopTokenIds()
	if lb := p.GetLogitBias(); len(lb) > 0 {
		s.LogitBias = lb
	}
	s.Logprobs, s.TopLogprobs, s.IgnoreEOS = p.GetLogprobs(), int(p.GetTopLogprobs()), p.GetIgnoreEos()
	s.MinTokens, s.IncludeStop = int(p.GetMinTokens()), p.GetIncludeStopStrInOutput()
	var err error
	if s.Constraint, err = constraintFromProto(p.GetConstraint()); err != nil {
		return s, err
	}
	return s, s.Validate()
}

// genCall is one Generate or Chat call: its prompts' sequences, merged into
// one stream of responses.
type genCall struct {
	svc     *BrokerService
	method  string
	sv      *lifecycle.Served
	gm      generator
	params  llm.Sampling
	maxNew  int // 0: per prompt, the model's default or else the rest of the context
	sched   scheduler.GenRequest
	maxTime time.Duration
	// thinking, for a chat of a thinking model, splits each sequence's
	// reasoning from its text (nil: no parsing).
	thinking []*output.Thinking
	// reasoning counts each sequence's thinking tokens (with thinking).
	reasoning []int
	// tools, for a chat with tools, takes each sequence's calls out of
	// its text (nil: no parsing); calls counts them.
	tools []*output.ToolCalls
	calls []int
	// named: tool_choice named a function (its call finishes stop).
	named bool
	// thinkFirst, for a constrained chat of a thinking model, lets each
	// sequence think before its constraint applies (nil: from the start).
	thinkFirst []*llm.ThinkFirst
	// n answers per prompt (SamplingParams.n): sequence k answers prompt
	// k/n; seeded, with seed + k%n.
	n int
	// promptIDs: the first message gives each answer's prompt as token
	// ids (return_prompt_token_ids).
	promptIDs bool
}

// generateSink takes one response's deltas and results: the ones ready
// together, in order (a sequence's result after its last delta).
type generateSink = func(deltas []*brokerv1.GenerationDelta, results []*brokerv1.GenerationResult) error

// Generate continues each prompt in the model's running set: the gRPC
// adapter of RunGenerate.
func (s *BrokerService) Generate(req *brokerv1.GenerateRequest, stream brokerv1.BrokerService_GenerateServer) error {
	return s.RunGenerate(stream.Context(), req, func(d []*brokerv1.GenerationDelta, r []*brokerv1.GenerationResult) error {
		return stream.Send(&brokerv1.GenerateResponse{Deltas: d, Results: r})
	})
}

// Chat renders each conversation through the model's chat template and
// generates the assistant's reply: the gRPC adapter of RunChat.
func (s *BrokerService) Chat(req *brokerv1.ChatRequest, stream brokerv1.BrokerService_ChatServer) error {
	return s.RunChat(stream.Context(), req, func(d []*brokerv1.GenerationDelta, r []*brokerv1.GenerationResult) error {
		return stream.Send(&brokerv1.ChatResponse{Deltas: d, Results: r})
	})
}

// RunGenerate and RunChat are the generation API without a transport: the
// gRPC handlers and the HTTP edge (httpapi.Backend) call them. send gets
// the deltas and results as they are ready; ctx ending cancels the call's
// sequences. Errors are gRPC statuses, which each edge maps.

// RunGenerate continues each prompt of req.
func (s *BrokerService) RunGenerate(ctx context.Context, req *brokerv1.GenerateRequest, send generateSink) error {
	prompts, idPrompts := req.GetPrompts(), req.GetTokenPrompts()
	if len(prompts) > 0 && len(idPrompts) > 0 {
		return invalid("give prompts or token_prompts, not both")
	}
	call, release, err := s.newGenCall(ctx, "Generate", req.GetModel(), len(prompts)+len(idPrompts), req.GetSampling(), req.GetPriority(), req.GetDeviceType(), req.GetDeviceId(), req.GetMaxTime())
	if err != nil {
		return err
	}
	defer release()
	call.promptIDs = req.GetReturnPromptTokenIds()
	// Each prompt's ids, given or tokenised: ids outside the vocabulary
	// are refused with the sequence (NewSequence), and a prompt past the
	// context by run.
	inputs := make([][]int32, 0, len(prompts)+len(idPrompts))
	for i, p := range idPrompts {
		if len(p.GetIds()) == 0 {
			return invalid("token_prompts[%d] is empty", i)
		}
		inputs = append(inputs, p.GetIds())
	}
	addSpecial := req.AddSpecialTokens == nil || req.GetAddSpecialTokens()
	for i, p := range prompts {
		if p == "" {
			return invalid("prompts[%d] is empty", i)
		}
		if len(p) > s.limits.MaxItemBytes {
			return invalid("prompts[%d] is %d bytes; the limit is %d (--max-item-bytes)", i, len(p), s.limits.MaxItemBytes)
		}
		ids, err := call.gm.EncodePrompt(p, addSpecial)
		if err != nil {
			return invalid("prompts[%d]: %v", i, err)
		}
		inputs = append(inputs, ids)
	}
	toks := make([][]int32, len(inputs)*call.n)
	for i, ids := range inputs {
		for j := range call.n {
			toks[i*call.n+j] = ids
		}
	}
	return call.run(ctx, toks, send)
}

// RunChat renders each conversation of req through the model's chat
// template and generates the assistant's reply.
func (s *BrokerService) RunChat(ctx context.Context, req *brokerv1.ChatRequest, send generateSink) error {
	convs := req.GetConversations()
	call, release, err := s.newGenCall(ctx, "Chat", req.GetModel(), len(convs), req.GetSampling(), req.GetPriority(), req.GetDeviceType(), req.GetDeviceId(), req.GetMaxTime())
	if err != nil {
		return err
	}
	defer release()
	call.promptIDs = req.GetReturnPromptTokenIds()
	vars, err := templateVars(req)
	if err != nil {
		return err
	}
	tags, thinks := call.gm.ThinkTags()
	if req.GetEnableThinking() && !thinks {
		return invalid("model %s does not think (its vocabulary has no <think> and </think> tokens): leave enable_thinking (Ollama's think) unset or false", req.GetModel())
	}
	seqs := len(convs) * call.n // sequence k answers conversation k/n
	if thinks {
		call.thinking = make([]*output.Thinking, seqs)
		call.reasoning = make([]int, seqs)
	}
	tools, toolsSize, err := chatTools(req, call.gm)
	if err != nil {
		return err
	}
	if len(tools) > 0 && req.GetToolChoice() != brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE {
		call.tools = make([]*output.ToolCalls, seqs)
		call.calls = make([]int, seqs)
	}
	forced, err := forcedCalls(req)
	if err != nil {
		return err
	}
	if forced != nil {
		if call.params.Constraint != nil {
			return invalid("tool_choice %s constrains the output to the tools' schemas: it cannot take sampling.constraint (response_format, format) too", choiceName(req))
		}
		call.params.Constraint = forced
		call.named = req.GetToolChoice() == brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION
	}
	// A constrained answer of a thinking model comes after its thinking,
	// as vLLM's structured output waits for the reasoning parser's end
	// and Ollama's format for the thinking: where the template opens the
	// block, or the first token may open it, unless the chat turns
	// thinking off or the prompt ends with a closed (empty) block. Unasked,
	// a hybrid model (Qwen3) decides, as it does without a constraint.
	var thinkIDs [2]int32
	thinkOff := vars["enable_thinking"] == false
	if thinks && call.params.Constraint != nil {
		for k, tag := range []string{tags.Open, tags.Close} {
			ids, err := call.gm.EncodePrompt(tag, false)
			if err != nil || len(ids) != 1 {
				return toStatus(s.log, "Chat", fmt.Errorf("model %s: thinking tag %q is not one token (%v): %w", req.GetModel(), tag, ids, err))
			}
			thinkIDs[k] = ids[0]
		}
		call.thinkFirst = make([]*llm.ThinkFirst, seqs)
	}
	prompts, err := s.renderChats(ctx, req, call.gm, vars, tools, toolsSize, call.params.Constraint != nil)
	if err != nil {
		return err
	}
	toks := make([][]int32, seqs)
	for i, p := range prompts {
		text, ids := p.text, p.ids
		// A template may open the block itself (thinking-only models):
		// the reply then starts inside it.
		opened := thinks && output.PromptOpensBlock(tags, text)
		for k := i * call.n; k < (i+1)*call.n; k++ { // each answer its own parsers
			toks[k] = ids
			if thinks {
				call.thinking[k] = output.NewThinking(tags, opened)
				if call.thinkFirst != nil && (opened || (!thinkOff && !output.PromptClosesBlock(tags, text))) {
					call.thinkFirst[k] = &llm.ThinkFirst{Open: thinkIDs[0], Close: thinkIDs[1], InBlock: opened}
				}
			}
			switch {
			case call.named:
				call.tools[k] = output.NewForcedCall(req.GetToolChoiceFunction())
			case forced != nil:
				call.tools[k] = output.NewToolCalls(output.ForcedJSON)
			case call.tools != nil:
				call.tools[k] = output.NewToolCalls(call.gm.ToolFormat())
			}
		}
	}
	return call.run(ctx, toks, send)
}

// chatPrompt is a conversation as the model runs it: its rendered text
// and token ids.
type chatPrompt struct {
	text string
	ids  []int32
}

// renderChats renders each conversation of req through gm's chat template
// and tokenises it, as Chat runs it and Tokenize counts it. constrained
// says the output is constrained (a prefill cannot take a constraint).
func (s *BrokerService) renderChats(ctx context.Context, req *brokerv1.ChatRequest, gm generator, vars map[string]any,
	tools []json.RawMessage, toolsSize int, constrained bool) ([]chatPrompt, error) {
	cont := req.GetContinueFinalMessage()
	addGen := req.AddGenerationPrompt == nil || req.GetAddGenerationPrompt()
	if cont && req.AddGenerationPrompt != nil && addGen {
		return nil, invalid("continue_final_message and add_generation_prompt cannot both be true: the reply continues the last message or starts a turn")
	}
	if cont && constrained {
		// The grammar would start over after the prefill ("{" then "{...}").
		return nil, invalid("continue_final_message cannot take a constraint (response_format, format, a required tool call): the constraint would start over after the prefilled text")
	}
	addGen = addGen && !cont
	prompts := make([]chatPrompt, 0, len(req.GetConversations()))
	for i, c := range req.GetConversations() {
		msgs := c.GetMessages()
		if len(msgs) == 0 {
			return nil, invalid("conversations[%d] has no messages", i)
		}
		// Bounded before any work: millions of empty messages are as
		// costly to render and tokenise as their text, so each counts
		// its role and a template's markup besides its content.
		if len(msgs) > maxChatMessages {
			return nil, invalid("conversations[%d] has %d messages; at most %d", i, len(msgs), maxChatMessages)
		}
		size := toolsSize
		for _, m := range msgs {
			size += len(m.GetContent()) + len(m.GetReasoning()) + len(m.GetRole()) + len(m.GetToolCallId()) + chatMessageOverhead
			for _, tc := range m.GetToolCalls() {
				size += len(tc.GetId()) + len(tc.GetName()) + len(tc.GetArguments()) + chatMessageOverhead
			}
		}
		if size > s.limits.MaxItemBytes {
			return nil, invalid("conversations[%d] is %d bytes (%d messages, counting %d bytes of markup each); the limit is %d (--max-item-bytes)",
				i, size, len(msgs), chatMessageOverhead, s.limits.MaxItemBytes)
		}
		turns := make([]llm.Message, 0, len(msgs)+1)
		hasSystem := false
		for j, m := range msgs {
			switch m.GetRole() {
			case "system", "user", "assistant", "tool":
			default:
				return nil, invalid("conversations[%d].messages[%d].role %q: want system, user, assistant or tool", i, j, m.GetRole())
			}
			hasSystem = hasSystem || m.GetRole() == "system"
			turn := llm.Message{Role: m.GetRole(), Content: m.GetContent(), Reasoning: m.GetReasoning(), ToolCallID: m.GetToolCallId()}
			var err error
			if turn.ToolCalls, err = turnCalls(m); err != nil {
				return nil, invalid("conversations[%d].messages[%d]: %v", i, j, err)
			}
			turns = append(turns, turn)
		}
		// The model's own system prompt (an Ollama model's), as Ollama
		// applies it: when the conversation brings none.
		if sys := gm.SystemPrompt(); sys != "" && !hasSystem {
			turns = append([]llm.Message{{Role: "system", Content: sys}}, turns...)
		}
		if cont && turns[len(turns)-1].Role != "assistant" {
			return nil, invalid("conversations[%d]: continue_final_message needs an assistant message last, has %s", i, turns[len(turns)-1].Role)
		}
		render := func(turns []llm.Message) (string, []int32, error) {
			if cont {
				// The final message's content is marked at its end, and
				// the text cut there: its end of turn left out. (Looking
				// the content up, as transformers does, finds a prefill
				// of "<" inside "<|im_end|>".)
				turns = slices.Clone(turns)
				turns[len(turns)-1].Content += prefillEnd
			}
			text, err := gm.RenderChat(ctx, turns, llm.ChatOptions{AddGenerationPrompt: addGen, Vars: vars, Tools: tools})
			if err != nil {
				return "", nil, err
			}
			if cont {
				k := strings.Index(text, prefillEnd)
				if k < 0 {
					return "", nil, errors.New("continue_final_message: the chat template does not write the final message's content")
				}
				text = text[:k]
			}
			// The template writes the special tokens itself.
			ids, err := gm.EncodePrompt(text, false)
			return text, ids, err
		}
		text, ids, err := render(turns)
		if err == nil && req.GetTruncateHistory() && len(ids) >= gm.ContextLength() {
			text, ids, err = s.truncateChat(turns, render, gm.ContextLength(), i)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, toStatus(s.log, "Chat", ctx.Err())
			}
			return nil, invalid("conversations[%d]: %v", i, err)
		}
		prompts = append(prompts, chatPrompt{text: text, ids: ids})
	}
	return prompts, nil
}

// prefillEnd marks the end of a continued message's content in its
// rendered chat: private-use characters no template writes.
const prefillEnd = "\ue000brokerd:prefill-end\ue001"

// truncateChat drops a conversation's oldest turns until its prompt fits
// the context, as Ollama does (ChatRequest.truncate_history): the system
// messages stay, the last message stays, and the rest starts at the
// earliest message that lets it fit, never at a tool's result (its call
// would be gone). The starts are binary-searched: a render is the
// conversation's cost, and starts are up to maxChatMessages. A
// conversation whose last message on does not fit is the usual refusal.
func (s *BrokerService) truncateChat(turns []llm.Message, render func([]llm.Message) (string, []int32, error), ctxLen, conv int) (string, []int32, error) {
	var starts []int // where the kept turns may start, after the first non-system one
	first := slices.IndexFunc(turns, func(m llm.Message) bool { return m.Role != "system" })
	for j := first + 1; first >= 0 && j < len(turns); j++ {
		if turns[j].Role != "tool" && turns[j].Role != "system" {
			starts = append(starts, j)
		}
	}
	cut := func(k int) []llm.Message {
		var kept []llm.Message
		for _, m := range turns[:starts[k]] {
			if m.Role == "system" {
				kept = append(kept, m)
			}
		}
		return append(kept, turns[starts[k]:]...)
	}
	// The earliest start whose prompt fits: starts later keep fewer turns.
	k := sort.Search(len(starts), func(k int) bool {
		_, ids, err := render(cut(k))
		return err == nil && len(ids) < ctxLen
	})
	if k == len(starts) {
		// Even the last message on is too long: refused as it is.
		return render(turns)
	}
	kept := cut(k)
	text, ids, err := render(kept)
	if err == nil {
		s.log.Info("chat over the context: its oldest messages dropped, as Ollama does",
			zap.Int("conversation", conv), zap.Int("messages_dropped", len(turns)-len(kept)), zap.Int("prompt_tokens", len(ids)), zap.Int("context", ctxLen))
	}
	return text, ids, err
}

// toolName is what OpenAI takes as a function's name.
var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// chatTools validates a chat's tools and tool_choice and returns them as
// the template's tools (OpenAI's tool objects, parameters as written)
// and their bytes, which count against each conversation's size.
func chatTools(req *brokerv1.ChatRequest, gm generator) ([]json.RawMessage, int, error) {
	ts := req.GetTools()
	choice := req.GetToolChoice()
	switch choice {
	case brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_UNSPECIFIED, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE:
		if req.GetToolChoiceFunction() != "" {
			return nil, 0, invalid("tool_choice_function %q needs tool_choice TOOL_CHOICE_MODE_FUNCTION", req.GetToolChoiceFunction())
		}
	case brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION:
		if len(ts) == 0 {
			return nil, 0, invalid("tool_choice %s needs tools", choiceName(req))
		}
	default:
		return nil, 0, invalid("tool_choice %d is not a ToolChoiceMode", choice)
	}
	if len(ts) > maxTools {
		return nil, 0, invalid("%d tools; at most %d", len(ts), maxTools)
	}
	out := make([]json.RawMessage, len(ts))
	size := 0
	names := map[string]bool{}
	for i, t := range ts {
		if !toolName.MatchString(t.GetName()) {
			return nil, 0, invalid("tools[%d].name %q: want 1 to 64 letters, digits, _ or -", i, t.GetName())
		}
		if names[t.GetName()] {
			return nil, 0, invalid("tools[%d].name %q: two tools have that name", i, t.GetName())
		}
		names[t.GetName()] = true
		name, _ := json.Marshal(t.GetName())
		fn := append([]byte(`{"name":`), name...)
		if d := t.GetDescription(); d != "" {
			b, _ := json.Marshal(d)
			fn = append(append(fn, `,"description":`...), b...)
		}
		if p := t.GetParameters(); p != "" {
			if !json.Valid([]byte(p)) || !strings.HasPrefix(strings.TrimSpace(p), "{") {
				return nil, 0, invalid("tools[%d] (%s).parameters is not a JSON object (a JSON Schema)", i, t.GetName())
			}
			fn = append(append(fn, `,"parameters":`...), p...)
		}
		fn = append(fn, '}')
		out[i] = json.RawMessage(`{"type":"function","function":` + string(fn) + `}`)
		size += len(out[i])
	}
	if choice == brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION && !names[req.GetToolChoiceFunction()] {
		return nil, 0, invalid("tool_choice_function %q is not one of the tools", req.GetToolChoiceFunction())
	}
	if len(out) > 0 && (choice == brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_UNSPECIFIED || choice == brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO) &&
		gm.ToolFormat() == output.NoToolFormat {
		return nil, 0, invalid("model %s writes calls of tools in no format brokerd parses (Qwen's <tool_call> or Llama 3.1's <|python_tag|> as tokens of its vocabulary): leave tools out, or set tool_choice none to show them without parsing", req.GetModel())
	}
	return out, size, nil
}

// forcedCalls is the constraint of tool_choice required or a named
// function (nil for auto and none), as vLLM builds it: the answer is a
// JSON array of one or more {"name": a tool's, "parameters": its
// arguments} (required), or the named function's arguments object. The
// model's own call format is not used: its output is the JSON alone,
// compiled by the grammar engine and parsed by output.ForcedJSON.
func forcedCalls(req *brokerv1.ChatRequest) (*llm.Constraint, error) {
	choice := req.GetToolChoice()
	if choice != brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED && choice != brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION {
		return nil, nil
	}
	params := func(t *brokerv1.Tool) json.RawMessage {
		if p := strings.TrimSpace(t.GetParameters()); p != "" {
			return json.RawMessage(p) // an object: chatTools checked it
		}
		return json.RawMessage(`{"type": "object", "properties": {}}`)
	}
	var schema []byte
	var err error
	if choice == brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION {
		for _, t := range req.GetTools() {
			if t.GetName() == req.GetToolChoiceFunction() {
				schema = params(t)
			}
		}
	} else {
		alts := make([]any, len(req.GetTools()))
		for i, t := range req.GetTools() {
			alts[i] = map[string]any{
				"type": "object",
				"properties": map[string]any{
					"name":       map[string]any{"type": "string", "enum": []string{t.GetName()}},
					"parameters": params(t),
				},
				"required":             []string{"name", "parameters"},
				"additionalProperties": false,
			}
		}
		items := alts[0]
		if len(alts) > 1 {
			items = map[string]any{"anyOf": alts}
		}
		array := map[string]any{"type": "array", "minItems": 1, "items": items}
		if req.ParallelToolCalls != nil && !req.GetParallelToolCalls() {
			array["maxItems"] = 1 // OpenAI's one call at most
		}
		schema, err = json.Marshal(array)
		if err != nil {
			return nil, err
		}
	}
	return &llm.Constraint{Kind: grammar.KindJSONSchema, Source: string(schema)}, nil
}

// choiceName is tool_choice as OpenAI's API writes it.
func choiceName(req *brokerv1.ChatRequest) string {
	switch req.GetToolChoice() {
	case brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED:
		return `"required"`
	case brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION:
		return fmt.Sprintf("function %q", req.GetToolChoiceFunction())
	}
	return req.GetToolChoice().String()
}

// turnCalls are a message's calls of tools, as the template gets them.
func turnCalls(m *brokerv1.ChatMessage) ([]llm.ToolCall, error) {
	tcs := m.GetToolCalls()
	if len(tcs) == 0 {
		return nil, nil
	}
	if m.GetRole() != "assistant" {
		return nil, fmt.Errorf("a %s message has tool_calls: only an assistant's do", m.GetRole())
	}
	if len(tcs) > maxToolCalls {
		return nil, fmt.Errorf("%d tool_calls; at most %d", len(tcs), maxToolCalls)
	}
	out := make([]llm.ToolCall, len(tcs))
	for k, tc := range tcs {
		if tc.GetName() == "" {
			return nil, fmt.Errorf("tool_calls[%d] has no name", k)
		}
		args := tc.GetArguments()
		if strings.TrimSpace(args) == "" {
			args = "{}"
		}
		if !json.Valid([]byte(args)) || !strings.HasPrefix(strings.TrimSpace(args), "{") {
			return nil, fmt.Errorf("tool_calls[%d] (%s).arguments is not a JSON object", k, tc.GetName())
		}
		out[k] = llm.ToolCall{ID: tc.GetId(), Name: tc.GetName(), Arguments: args}
	}
	return out, nil
}

// reservedTemplateVars are a chat template's own inputs, which
// chat_template_kwargs cannot replace.
var reservedTemplateVars = []string{"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "documents"}

// templateVars are a chat's template variables besides the messages:
// chat_template_kwargs, then enable_thinking over its namesake.
func templateVars(req *brokerv1.ChatRequest) (map[string]any, error) {
	kw := req.GetChatTemplateKwargs()
	if n := len(kw.GetFields()); n > maxTemplateKwargs {
		return nil, invalid("chat_template_kwargs has %d keys; at most %d", n, maxTemplateKwargs)
	}
	if n := proto.Size(kw); n > maxTemplateKwargsBytes {
		return nil, invalid("chat_template_kwargs is %d bytes; at most %d", n, maxTemplateKwargsBytes)
	}
	for _, k := range reservedTemplateVars {
		if _, ok := kw.GetFields()[k]; ok {
			return nil, invalid("chat_template_kwargs cannot set %q: it is the chat template's own input", k)
		}
	}
	var vars map[string]any
	if kw != nil {
		vars = kw.AsMap()
	}
	if req.EnableThinking != nil {
		if vars == nil {
			vars = map[string]any{}
		}
		vars["enable_thinking"] = req.GetEnableThinking()
	}
	return vars, nil
}

// newGenCall validates what Generate and Chat share and enters the model's
// gate (release leaves it).
func (s *BrokerService) newGenCall(ctx context.Context, method, model string, n int, sp *brokerv1.SamplingParams,
	prio brokerv1.Priority, typ brokerv1.DeviceType, deviceID string, maxTime *durationpb.Duration) (*genCall, func(), error) {
	if n == 0 {
		return nil, nil, invalid("nothing to generate: give at least one prompt or conversation")
	}
	answers := max(int(sp.GetN()), 1)
	if sp.GetN() < 0 {
		return nil, nil, invalid("sampling.n %d is invalid: 1 or more (0: 1)", sp.GetN())
	}
	if n > s.limits.MaxItemsPerRequest || n*answers > s.limits.MaxItemsPerRequest {
		return nil, nil, invalid("%d prompts of %d answers each; the limit is %d answers (--max-items-per-request)", n, answers, s.limits.MaxItemsPerRequest)
	}
	if sp.GetMaxTokens() < 0 {
		return nil, nil, invalid("sampling.max_tokens %d is invalid: 0 (the default) or more", sp.GetMaxTokens())
	}
	priority, err := priorityFromProto(prio)
	if err != nil {
		return nil, nil, err
	}
	pinType, err := s.pinType(typ)
	if err != nil {
		return nil, nil, err
	}
	if err := s.pinnedDevice(method, deviceID); err != nil {
		return nil, nil, err
	}
	if maxTime != nil {
		if err := maxTime.CheckValid(); err != nil || maxTime.AsDuration() <= 0 {
			return nil, nil, invalid("max_time %v is invalid: a positive duration", maxTime)
		}
	}
	sv, gm, err := s.acquireGenerator(method, model)
	if err != nil {
		return nil, nil, err
	}
	params, err := samplingFromProto(sp, gm.DefaultSampling())
	if err != nil {
		s.models.Release(sv)
		return nil, nil, toStatus(s.log, method, err)
	}
	call := &genCall{
		svc: s, method: method, sv: sv, gm: gm, params: params, maxNew: int(sp.GetMaxTokens()), n: answers,
		sched: scheduler.GenRequest{
			Model: sv.Key, Client: clientID(ctx), Priority: priority, DeviceID: deviceID, DeviceType: pinType,
		},
	}
	if maxTime != nil {
		call.maxTime = maxTime.AsDuration()
	}
	return call, func() { s.models.Release(sv) }, nil
}

// acquireGenerator holds a served generator model (Release it).
func (s *BrokerService) acquireGenerator(method, model string) (*lifecycle.Served, generator, error) {
	if s.models == nil {
		return nil, nil, status.Error(codes.Unavailable, "no model is being served")
	}
	if model == "" {
		return nil, nil, invalid("model is required: a generator model's name")
	}
	sv, err := s.models.Acquire(model, 0)
	if err != nil {
		return nil, nil, toStatus(s.log, method, err)
	}
	gm := s.generator(sv)
	if gm == nil {
		s.models.Release(sv)
		return nil, nil, invalid("model %s is a %s model: %s serves generator (LLM) models", model, sv.Info.Kind, method)
	}
	return sv, gm, nil
}

// seqEvent is one event of one of the call's sequences.
type seqEvent struct {
	index int
	ev    scheduler.GenEvent
	err   error
}

// run queues one sequence per prompt, then forwards their events until
// every sequence ended. Events that are ready together go in one response.
func (c *genCall) run(ctx context.Context, prompts [][]int32, send generateSink) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a failed call cancels its other sequences
	ctxLen := c.gm.ContextLength()
	seqs := make([]genSequence, len(prompts))
	streams := make([]*scheduler.GenStream, len(prompts))
	maxNews := make([]int, len(prompts))
	var held int64
	for i, toks := range prompts {
		if len(toks) >= ctxLen {
			return invalid("prompt %d is %d tokens; the model's context holds %d, output included", i, len(toks), ctxLen)
		}
		room := ctxLen - len(toks)
		// No bound asked: to a stop or the end of the context, as Ollama
		// and OpenAI do. The scheduler reserves KV blocks as the sequence
		// grows, not for its bound, so this costs nothing until used.
		maxNew := c.maxNew
		if maxNew == 0 {
			maxNew = room
			if d := c.gm.DefaultMaxTokens(); d > 0 {
				maxNew = min(d, room)
			}
		} else if maxNew > room && httpapi.MaxTokensIsLimit(ctx) {
			maxNew = room
		} else if maxNew > room {
			return invalid("prompt %d is %d tokens and max_tokens is %d: more than the model's context of %d tokens", i, len(toks), maxNew, ctxLen)
		}
		if c.params.MinTokens > maxNew {
			return invalid("prompt %d: min_tokens %d is more than the %d tokens it may write (max_tokens, or the room its %d tokens leave in the context)", i, c.params.MinTokens, maxNew, len(toks))
		}
		maxNews[i] = maxNew
		held += c.seqCost(len(toks), maxNew)
	}
	// What the call's sequences hold on the host until it ends counts
	// against the in-flight budget like a request's bytes, so a small
	// request of thousands of prompts cannot hold memory it does not see.
	if c.svc.budget != nil {
		release, err := c.svc.budget.acquire(c.method, held)
		if err != nil {
			return err
		}
		defer release()
	}
	for i, toks := range prompts {
		maxNew := maxNews[i]
		p := c.params
		if c.thinkFirst != nil {
			p.ThinkFirst = c.thinkFirst[i]
		}
		if p.Seeded {
			p.Seed += uint64(i % c.n) // a prompt's answers differ
		}
		seq, err := c.gm.NewSequence(ctx, p, toks)
		if err != nil {
			return toStatus(c.svc.log, c.method, err)
		}
		seqs[i] = seq
		req := c.sched
		req.Prompt, req.MaxNewTokens, req.State = toks, maxNew, seq.State()
		if c.maxTime > 0 {
			req.Deadline = time.Now().Add(c.maxTime)
		}
		st, err := c.svc.sched.Generate(ctx, req)
		if err != nil {
			return c.svc.schedulerStatus(c.method, err)
		}
		streams[i] = st
	}

	if c.promptIDs {
		deltas := make([]*brokerv1.GenerationDelta, len(prompts))
		for i, toks := range prompts {
			deltas[i] = &brokerv1.GenerationDelta{Index: int32(i), PromptTokenIds: toks}
		}
		if err := send(deltas, nil); err != nil {
			return err
		}
	}
	events := make(chan seqEvent, 64)
	for i, st := range streams {
		go func() {
			for {
				ev, err := st.Recv()
				if errors.Is(err, io.EOF) {
					return
				}
				select {
				case events <- seqEvent{index: i, ev: ev, err: err}:
				case <-ctx.Done():
					return
				}
				if err != nil || ev.Finish != "" {
					return
				}
			}
		}()
	}
	open := len(streams)
	for open > 0 {
		var first seqEvent
		select {
		case first = <-events:
		case <-ctx.Done():
			return toStatus(c.svc.log, c.method, ctx.Err())
		}
		batch := []seqEvent{first}
	more:
		for len(batch) < 256 {
			select {
			case e := <-events:
				batch = append(batch, e)
			default:
				break more
			}
		}
		var deltas []*brokerv1.GenerationDelta
		var results []*brokerv1.GenerationResult
		for _, e := range batch {
			if e.err != nil {
				return c.svc.schedulerStatus(c.method, e.err)
			}
			d, r, err := c.convert(e.index, seqs[e.index], e.ev)
			if err != nil {
				return status.Errorf(codes.Internal, "%s: %v", c.method, err)
			}
			if d != nil {
				deltas = append(deltas, d)
			}
			if r != nil {
				results = append(results, r)
				open--
			}
		}
		if err := send(deltas, results); err != nil {
			return err
		}
	}
	return nil
}

// Host memory one sequence of a call holds until the call ends, besides
// its KV blocks (admitted by the scheduler) and its sampling buffers
// (borrowed per step): its goroutine, stream and state, its prompt, and
// per output token what the edge keeps or sends (text, ids, logprobs).
const (
	seqBaseBytes     = 16 << 10
	seqTokenBytes    = 16
	seqLogprobBytes  = 64
	promptTokenBytes = 4
	// A constrained sequence's two masks (19 KiB each over Qwen's
	// vocabulary), besides its matcher's parse state (constraintSeqBytes).
	constraintMaskBytes  = 64 << 10
	constraintTokenBytes = 64
)

// constraintSeqBytes is what a constrained sequence holds besides its
// tokens: its masks and the most its grammar matcher keeps between tokens
// (about 860 KiB: an ambiguous grammar reaches it, agents' JSON schemas
// hold under 100 KiB).
var constraintSeqBytes = constraintMaskBytes + grammar.DefaultLimits.MatcherBytes()

func (c *genCall) seqCost(promptTokens, maxNew int) int64 {
	base, perToken := int64(seqBaseBytes), int64(seqTokenBytes)
	if c.params.Logprobs {
		perToken += seqLogprobBytes * int64(1+c.params.TopLogprobs)
	}
	if c.params.Constraint != nil {
		base, perToken = base+constraintSeqBytes, perToken+constraintTokenBytes
	}
	return base + promptTokenBytes*int64(promptTokens) + perToken*int64(maxNew)
}

// convert turns one scheduler event into a delta and, on the last event,
// the result.
func (c *genCall) convert(i int, seq genSequence, ev scheduler.GenEvent) (*brokerv1.GenerationDelta, *brokerv1.GenerationResult, error) {
	var d *brokerv1.GenerationDelta
	if ev.HasToken {
		gd, err := seq.Delta(ev.Out)
		if err != nil {
			return nil, nil, err
		}
		d = &brokerv1.GenerationDelta{Index: int32(i), Text: gd.Text, TokenIds: gd.TokenIDs, Logprobs: gd.Logprobs}
	}
	var think *output.Thinking
	if c.thinking != nil {
		think = c.thinking[i]
	}
	if d != nil && think != nil {
		sp, reasoning := think.PushTokens(d.Text)
		d.Text, d.Reasoning = sp.Content, sp.Reasoning
		if reasoning {
			c.reasoning[i] += len(d.TokenIds)
		}
	}
	var tools *output.ToolCalls
	if c.tools != nil {
		tools = c.tools[i]
	}
	if d != nil && tools != nil {
		p := tools.Push(d.Text)
		d.Text = p.Content
		d.ToolCalls = c.toolCalls(i, p.Calls)
	}
	if ev.Finish == "" {
		return d, nil, nil
	}
	tail := output.Split{Content: seq.Flush()}
	if think != nil {
		sp := think.Push(tail.Content)
		end := think.Flush()
		tail = output.Split{Content: sp.Content + end.Content, Reasoning: sp.Reasoning + end.Reasoning}
	}
	var tailCalls []*brokerv1.ToolCall
	if tools != nil {
		p := tools.Push(tail.Content)
		end := tools.Flush()
		tail.Content = p.Content + end.Content
		tailCalls = c.toolCalls(i, append(p.Calls, end.Calls...))
	}
	if tail != (output.Split{}) || tailCalls != nil {
		if d == nil {
			d = &brokerv1.GenerationDelta{Index: int32(i)}
		}
		d.Text += tail.Content
		d.Reasoning += tail.Reasoning
		d.ToolCalls = append(d.ToolCalls, tailCalls...)
	}
	if d != nil && !(utf8.ValidString(d.Text) && utf8.ValidString(d.Reasoning)) {
		return nil, nil, fmt.Errorf("sequence %d produced text that is not UTF-8", i)
	}
	info := ev.Info
	finish := finishToProto(ev.Finish)
	if finish == brokerv1.FinishReason_FINISH_REASON_STOP && c.calls != nil && c.calls[i] > 0 && !c.named {
		// The model stopped after calling: the caller runs the tools
		// (vLLM's and OpenAI's "tool_calls"; a length or deadline cut
		// stays what it is; a named function stops, as in vLLM).
		finish = brokerv1.FinishReason_FINISH_REASON_TOOL_CALLS
	}
	r := &brokerv1.GenerationResult{
		Index:        int32(i),
		FinishReason: finish,
		Usage: &brokerv1.Usage{PromptTokens: int32(info.PromptTokens), CompletionTokens: int32(info.GeneratedTokens),
			CachedPromptTokens: int32(info.CachedPromptTokens)},
		Execution: execInfoToProto(scheduler.ExecInfo{
			DeviceID: info.DeviceID, DeviceType: info.DeviceType, BatchSize: info.MaxBatch,
			Queue: info.Queue, Compute: info.Compute, Total: info.Total, CostUSD: info.CostUSD,
		}),
		Preemptions: int32(info.Preemptions),
	}
	if c.reasoning != nil {
		r.Usage.ReasoningTokens = int32(c.reasoning[i])
	}
	if info.TimeToFirstToken > 0 {
		r.TimeToFirstToken = durationpb.New(info.TimeToFirstToken)
	}
	return d, r, nil
}

// toolCalls gives sequence i's parsed calls their ids and positions.
func (c *genCall) toolCalls(i int, calls []output.Call) []*brokerv1.ToolCall {
	if len(calls) == 0 {
		return nil
	}
	out := make([]*brokerv1.ToolCall, len(calls))
	for k, tc := range calls {
		out[k] = &brokerv1.ToolCall{Id: toolCallID(), Name: tc.Name, Arguments: tc.Arguments, Index: int32(c.calls[i])}
		c.calls[i]++
	}
	return out
}

// toolCallID is "call_" and 24 random letters and digits, as OpenAI's.
func toolCallID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := []byte("call_------------------------")
	for k := 5; k < len(b); k++ {
		b[k] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}

func finishToProto(f string) brokerv1.FinishReason {
	switch f {
	case scheduler.FinishStop:
		return brokerv1.FinishReason_FINISH_REASON_STOP
	case scheduler.FinishLength:
		return brokerv1.FinishReason_FINISH_REASON_LENGTH
	case scheduler.FinishDeadline:
		return brokerv1.FinishReason_FINISH_REASON_DEADLINE
	case llm.FinishConstraint:
		return brokerv1.FinishReason_FINISH_REASON_CONSTRAINT
	}
	return brokerv1.FinishReason_FINISH_REASON_UNSPECIFIED
}
