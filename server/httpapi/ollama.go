package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// The Ollama API (github.com/ollama/ollama docs/api.md), as its clients
// use it: field names, NDJSON streaming by default, durations in
// nanoseconds, done_reason.

// ollamaOptions are the options brokerd applies; others (num_ctx,
// num_gpu...) are ignored, as Ollama ignores the options it does not know.
type ollamaOptions struct {
	Temperature      *float32   `json:"temperature"`
	TopK             *ollamaInt `json:"top_k"`
	TopP             *float32   `json:"top_p"`
	MinP             *float32   `json:"min_p"`
	Seed             *ollamaInt `json:"seed"`
	NumPredict       *ollamaInt `json:"num_predict"`
	Stop             []string   `json:"stop"`
	RepeatPenalty    *float32   `json:"repeat_penalty"`
	PresencePenalty  *float32   `json:"presence_penalty"`
	FrequencyPenalty *float32   `json:"frequency_penalty"`
}

// ollamaInt is an integer option as Ollama reads one: any JSON number, its
// fraction dropped (Ollama decodes options into float64s).
type ollamaInt int64

func (n *ollamaInt) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil || f <= math.MinInt64 || f >= math.MaxInt64 {
		// A type error, which the decoder names the option in.
		return &json.UnmarshalTypeError{Value: strings.TrimSpace(string(b)), Type: reflect.TypeFor[int64]()}
	}
	*n = ollamaInt(f) // toward zero, as Ollama's int(t)
	return nil
}

// int32p is n as a proto field, within int32 (nil: unset).
func (n *ollamaInt) int32p() *int32 {
	if n == nil {
		return nil
	}
	return proto.Int32(int32(min(max(*n, math.MinInt32), math.MaxInt32)))
}

func (o *ollamaOptions) sampling() (*brokerv1.SamplingParams, error) {
	sp := &brokerv1.SamplingParams{}
	if o == nil {
		return sp, nil
	}
	sp.Temperature, sp.TopK, sp.TopP, sp.MinP = o.Temperature, o.TopK.int32p(), o.TopP, o.MinP
	sp.RepetitionPenalty, sp.PresencePenalty, sp.FrequencyPenalty = o.RepeatPenalty, o.PresencePenalty, o.FrequencyPenalty
	sp.Stop = o.Stop
	if o.Seed != nil && *o.Seed >= 0 {
		sp.Seed = proto.Uint64(uint64(*o.Seed))
	}
	// -1 (infinite), -2 (fill the context) and any other negative, as
	// Ollama's runners take them, are "to a stop or the end of the
	// context", brokerd's bound when none is given (a context is never
	// shifted to make room, so -1 ends where -2 does). 0 is unset, as in
	// Ollama (its /api/generate omits it, its own runners took it as no
	// bound). A bound past the context's end is the context's end
	// (MaxTokensIsLimit).
	if n := o.NumPredict; n != nil && *n > 0 {
		sp.MaxTokens = *n.int32p()
	}
	return sp, nil
}

type ollamaMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// Thinking is a thinking model's reasoning, apart from content (in a
	// request's history, an earlier answer's).
	Thinking string   `json:"thinking,omitempty"`
	Images   []string `json:"images,omitempty"`
	// ToolCalls are an assistant's calls (arguments an object);
	// ToolCallID names the call a tool message answers (ToolName is
	// Ollama's name of the tool, taken and not needed).
	ToolCalls  []ollamaToolCall `json:"tool_calls,omitempty"`
	ToolCallID string           `json:"tool_call_id,omitempty"`
	ToolName   string           `json:"tool_name,omitempty"`
}

// thinkField is Ollama's think: a bool, or a level ("high", "medium",
// "low") that models with levels take; brokerd's thinking models (Qwen3)
// think or not, so a level is true.
type thinkField struct{ set, on bool }

func (t *thinkField) UnmarshalJSON(b []byte) error {
	switch s := string(b); s {
	case "null":
		*t = thinkField{}
		return nil
	case "true", "false":
		*t = thinkField{set: true, on: s == "true"}
		return nil
	case `"high"`, `"medium"`, `"low"`:
		*t = thinkField{set: true, on: true}
		return nil
	}
	return status.Error(codes.InvalidArgument, `"think" must be true, false, "high", "medium" or "low"`)
}

// ptr is the gRPC request's enable_thinking (nil: the template's default).
func (t thinkField) ptr() *bool {
	if !t.set {
		return nil
	}
	return proto.Bool(t.on)
}

type ollamaGenerateRequest struct {
	Model  string `json:"model"`
	Prompt string `json:"prompt"`
	// Suffix (fill in the middle) is refused, as Ollama refuses it for a
	// model without the insert capability: ignored, an editor's
	// completion would continue the prompt and overwrite what follows.
	Suffix string `json:"suffix"`
	// Context (an earlier answer's token ids, deprecated by Ollama) and
	// Template (a Go template instead of the model's) are refused when
	// given: ignored, the conversation's memory or the prompt's format
	// would silently be lost.
	Context  json.RawMessage `json:"context"`
	Template string          `json:"template"`
	System   string          `json:"system"`
	Raw      bool            `json:"raw"`
	Stream   *bool           `json:"stream"`
	Format   json.RawMessage `json:"format"`
	Images   []string        `json:"images"`
	Options  *ollamaOptions  `json:"options"`
	// KeepAlive is refused when 0 (unload), accepted otherwise.
	KeepAlive   json.RawMessage `json:"keep_alive"`
	Logprobs    bool            `json:"logprobs"`
	TopLogprobs int             `json:"top_logprobs"`
	Think       thinkField      `json:"think"`
}

type ollamaChatRequest struct {
	Model    string          `json:"model"`
	Messages []ollamaMessage `json:"messages"`
	Stream   *bool           `json:"stream"`
	Format   json.RawMessage `json:"format"`
	Tools    []apiTool       `json:"tools"`
	Options  *ollamaOptions  `json:"options"`
	// KeepAlive is refused when 0 (unload), accepted otherwise.
	KeepAlive   json.RawMessage `json:"keep_alive"`
	Logprobs    bool            `json:"logprobs"`
	TopLogprobs int             `json:"top_logprobs"`
	Think       thinkField      `json:"think"`
}

// ollamaDone are the fields of a stream's last object.
type ollamaDone struct {
	Done               bool   `json:"done"`
	DoneReason         string `json:"done_reason,omitempty"`
	TotalDuration      int64  `json:"total_duration,omitempty"`
	LoadDuration       int64  `json:"load_duration,omitempty"`
	PromptEvalCount    int32  `json:"prompt_eval_count,omitempty"`
	PromptEvalDuration int64  `json:"prompt_eval_duration,omitempty"`
	EvalCount          int32  `json:"eval_count,omitempty"`
	EvalDuration       int64  `json:"eval_duration,omitempty"`
}

func doneFields(r *brokerv1.GenerationResult, total time.Duration) ollamaDone {
	ttft := r.GetTimeToFirstToken().AsDuration()
	return ollamaDone{
		Done: true, DoneReason: finishName(r.GetFinishReason()),
		TotalDuration: total.Nanoseconds(), PromptEvalCount: r.GetUsage().GetPromptTokens(),
		PromptEvalDuration: ttft.Nanoseconds(), EvalCount: r.GetUsage().GetCompletionTokens(),
		EvalDuration: max(total-ttft, 0).Nanoseconds(),
	}
}

type ollamaGenerateChunk struct {
	Model     string `json:"model"`
	CreatedAt string `json:"created_at"`
	Response  string `json:"response"`
	Thinking  string `json:"thinking,omitempty"`
	ollamaDone
	Logprobs []logprobEntry `json:"logprobs,omitempty"`
}

type ollamaChatChunk struct {
	Model     string        `json:"model"`
	CreatedAt string        `json:"created_at"`
	Message   ollamaMessage `json:"message"`
	ollamaDone
	Logprobs []logprobEntry `json:"logprobs,omitempty"`
}

// ndjson writes a stream of JSON objects, one per line, each flushed.
type ndjson struct {
	w       http.ResponseWriter
	started bool
}

func (n *ndjson) send(v any) error {
	if !n.started {
		n.w.Header().Set("Content-Type", "application/x-ndjson")
		n.started = true
	}
	if err := json.NewEncoder(n.w).Encode(v); err != nil {
		return err
	}
	if f, ok := n.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// unsupported refuses request fields brokerd does not implement, rather
// than ignoring them.
func unsupported(tools json.RawMessage, images int) error {
	if len(tools) > 0 && string(tools) != "null" && string(tools) != "[]" {
		return status.Error(codes.InvalidArgument, `"tools" (function calling) are a chat's: send them to /v1/chat/completions or /api/chat`)
	}
	if images > 0 {
		return status.Error(codes.InvalidArgument, `"images" are not supported: brokerd serves text models`)
	}
	return nil
}

func (h *Handler) created() string { return h.opts.Now().UTC().Format(time.RFC3339Nano) }

// modified is when a model's files last changed, as Ollama's /api/tags
// and /api/show say it (now, when the repository does not say).
func (h *Handler) modified(m *brokerv1.Model) string {
	if t := m.GetModifiedAt(); t != nil {
		return t.AsTime().UTC().Format(time.RFC3339Nano)
	}
	return h.created()
}

func (h *Handler) ollamaGenerate(w http.ResponseWriter, r *http.Request) {
	var req ollamaGenerateRequest
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := unsupported(nil, len(req.Images)); err != nil {
		h.fail(w, r, err)
		return
	}
	if req.Suffix != "" {
		h.fail(w, r, status.Errorf(codes.InvalidArgument, "%q does not support insert: brokerd does not fill in the middle (\"suffix\"); send the text before it as the prompt", req.Model))
		return
	}
	if c := strings.TrimSpace(string(req.Context)); c != "" && c != "null" && c != "[]" {
		h.fail(w, r, status.Error(codes.InvalidArgument, `"context" (an earlier answer's token ids, deprecated by Ollama) is not supported: send the conversation's messages to /api/chat, or its whole text with "raw": true`))
		return
	}
	if req.Template != "" {
		h.fail(w, r, status.Error(codes.InvalidArgument, `"template" is not supported: brokerd renders the model's own chat template; render the prompt yourself and send it with "raw": true`))
		return
	}
	if err := checkKeepAlive(req.KeepAlive, req.Model, req.Prompt != ""); err != nil {
		h.fail(w, r, err)
		return
	}
	sp, err := ollamaSampling(req.Options, req.Logprobs, req.TopLogprobs, req.Format)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	name := modelName(req.Model)
	if req.Prompt == "" {
		// Ollama's "load the model" call: answer whether it is there.
		if err := h.modelExists(r.Context(), name); err != nil {
			h.fail(w, r, err)
			return
		}
		writeJSON(w, ollamaGenerateChunk{Model: req.Model, CreatedAt: h.created(), ollamaDone: ollamaDone{Done: true, DoneReason: "load"}})
		return
	}
	out := &ndjson{w: w}
	on := h.ollamaReply(w, out, req.Stream, func(p ollamaPiece) any {
		return ollamaGenerateChunk{Model: req.Model, CreatedAt: h.created(), Response: p.text, Thinking: p.thinking, ollamaDone: p.done, Logprobs: p.logprobs}
	})
	if req.Raw {
		err = h.generate(withMaxTokensLimit(r.Context()), &brokerv1.GenerateRequest{Model: name, Prompts: []string{req.Prompt}, Sampling: sp}, on)
	} else {
		conv := &brokerv1.Conversation{}
		if req.System != "" {
			conv.Messages = append(conv.Messages, &brokerv1.ChatMessage{Role: "system", Content: req.System})
		}
		conv.Messages = append(conv.Messages, &brokerv1.ChatMessage{Role: "user", Content: req.Prompt})
		err = h.chat(withMaxTokensLimit(r.Context()), &brokerv1.ChatRequest{Model: name, Conversations: []*brokerv1.Conversation{conv}, Sampling: sp,
			EnableThinking: req.Think.ptr()}, on)
	}
	if err != nil && !out.started {
		err = h.explainKind(r.Context(), err, name, wantGenerator, false)
	}
	h.endStream(w, r, out, err)
}

// ollamaSampling is the sampling of an Ollama generate or chat: its
// options, logprobs and format.
func ollamaSampling(o *ollamaOptions, logprobs bool, topLogprobs int, format json.RawMessage) (*brokerv1.SamplingParams, error) {
	sp, err := o.sampling()
	if err == nil {
		err = ollamaLogprobs(sp, logprobs, topLogprobs)
	}
	if err == nil {
		sp.Constraint, err = ollamaFormat(format)
	}
	return sp, err
}

// ollamaPiece is what one object of an Ollama generate's or chat's answer
// carries: a delta's, or (done set) the last one's, which gathers the
// whole answer when it is not streamed.
type ollamaPiece struct {
	text, thinking string
	calls          []*brokerv1.ToolCall
	logprobs       []logprobEntry
	done           ollamaDone
}

// ollamaReply is the handler of an Ollama generate's or chat's events:
// each delta that carries something streamed as the object chunk makes
// of it, then the last object; or, when stream is false, one object of
// everything.
func (h *Handler) ollamaReply(w http.ResponseWriter, out *ndjson, stream *bool, chunk func(ollamaPiece) any) func(event) error {
	start := time.Now()
	streamed := stream == nil || *stream
	var text, thinking strings.Builder
	var all ollamaPiece
	return func(e event) error {
		if d := e.delta; d != nil {
			lps := logprobEntries(d.GetLogprobs())
			if !streamed {
				text.WriteString(d.GetText())
				thinking.WriteString(d.GetReasoning())
				all.calls = append(all.calls, d.GetToolCalls()...)
				all.logprobs = append(all.logprobs, lps...)
				return nil
			}
			if d.GetText() == "" && d.GetReasoning() == "" && len(d.GetLogprobs()) == 0 && len(d.GetToolCalls()) == 0 {
				return nil
			}
			return out.send(chunk(ollamaPiece{text: d.GetText(), thinking: d.GetReasoning(), calls: d.GetToolCalls(), logprobs: lps}))
		}
		done := doneFields(e.result, time.Since(start))
		if !streamed {
			all.text, all.thinking, all.done = text.String(), thinking.String(), done
			writeJSON(w, chunk(all))
			return nil
		}
		return out.send(chunk(ollamaPiece{done: done}))
	}
}

// endStream reports an error: as a status before anything was written, as
// a last {"error": ...} line after.
func (h *Handler) endStream(w http.ResponseWriter, r *http.Request, out *ndjson, err error) {
	if err == nil {
		return
	}
	if !out.started {
		h.fail(w, r, err)
		return
	}
	_ = out.send(map[string]string{"error": status.Convert(err).Message()})
}

func (h *Handler) ollamaChat(w http.ResponseWriter, r *http.Request) {
	var req ollamaChatRequest
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	images := 0
	conv := &brokerv1.Conversation{}
	for _, m := range req.Messages {
		images += len(m.Images)
		// Ollama lowercases roles ("User" is user).
		conv.Messages = append(conv.Messages, &brokerv1.ChatMessage{Role: strings.ToLower(m.Role), Content: m.Content, Reasoning: m.Thinking,
			ToolCalls: ollamaHistoryCalls(m.ToolCalls), ToolCallId: m.ToolCallID})
	}
	if err := unsupported(nil, images); err != nil {
		h.fail(w, r, err)
		return
	}
	tools, err := toolsToProto(req.Tools)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if err := checkKeepAlive(req.KeepAlive, req.Model, len(req.Messages) > 0); err != nil {
		h.fail(w, r, err)
		return
	}
	sp, err := ollamaSampling(req.Options, req.Logprobs, req.TopLogprobs, req.Format)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	name := modelName(req.Model)
	if len(req.Messages) == 0 {
		if err := h.modelExists(r.Context(), name); err != nil {
			h.fail(w, r, err)
			return
		}
		writeJSON(w, ollamaChatChunk{Model: req.Model, CreatedAt: h.created(), Message: ollamaMessage{Role: "assistant"}, ollamaDone: ollamaDone{Done: true, DoneReason: "load"}})
		return
	}
	out := &ndjson{w: w}
	err = h.chat(withMaxTokensLimit(r.Context()), &brokerv1.ChatRequest{Model: name, Conversations: []*brokerv1.Conversation{conv}, Sampling: sp,
		EnableThinking: req.Think.ptr(), Tools: tools, TruncateHistory: true, ContinueFinalMessage: prefilled(conv) && sp.GetConstraint() == nil}, h.ollamaReply(w, out, req.Stream, func(p ollamaPiece) any {
		// Ollama streams each call whole, in the chunk where it ended;
		// its done_reason is "stop" after calls too (finishName).
		return ollamaChatChunk{Model: req.Model, CreatedAt: h.created(),
			Message:    ollamaMessage{Role: "assistant", Content: p.text, Thinking: p.thinking, ToolCalls: ollamaToolCalls(p.calls)},
			ollamaDone: p.done, Logprobs: p.logprobs}
	}))
	if err != nil && !out.started {
		err = h.explainKind(r.Context(), err, name, wantGenerator, false)
	}
	h.endStream(w, r, out, err)
}

// embedInput is a string or a list of strings.
type embedInput []string

func (e *embedInput) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*e = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return status.Error(codes.InvalidArgument, `"input" must be a string or a list of strings`)
	}
	*e = many
	return nil
}

type ollamaEmbedRequest struct {
	Model      string          `json:"model"`
	Input      embedInput      `json:"input"`
	Truncate   *bool           `json:"truncate"`
	Dimensions *int            `json:"dimensions"`
	KeepAlive  json.RawMessage `json:"keep_alive"`
}

// encode embeds texts through Encode.
func (h *Handler) encode(ctx context.Context, model string, texts []string, truncate *bool) (*brokerv1.EncodeResponse, error) {
	req := &brokerv1.EncodeRequest{Model: model, Fidelity: brokerv1.Fidelity_FIDELITY_SEMANTIC, Truncate: truncate}
	for _, t := range texts {
		req.Items = append(req.Items, &brokerv1.EncodeItem{Content: &brokerv1.EncodeItem_Text{Text: t}})
	}
	return h.b.Encode(ctx, req)
}

func (h *Handler) ollamaEmbed(w http.ResponseWriter, r *http.Request) {
	var req ollamaEmbedRequest
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := checkKeepAlive(req.KeepAlive, req.Model, len(req.Input) > 0); err != nil {
		h.fail(w, r, err)
		return
	}
	start := time.Now()
	resp, err := h.encode(r.Context(), modelName(req.Model), req.Input, req.Truncate)
	if err != nil {
		h.fail(w, r, h.explainKind(r.Context(), err, modelName(req.Model), wantEmbedder, false))
		return
	}
	if err := checkDimensions(req.Dimensions, req.Model, resp); err != nil {
		h.fail(w, r, err)
		return
	}
	vecs := make([][]float32, len(resp.GetResults()))
	for i, res := range resp.GetResults() {
		vecs[i] = res.GetVector()
	}
	writeJSON(w, map[string]any{
		"model": req.Model, "embeddings": vecs,
		"total_duration": time.Since(start).Nanoseconds(), "load_duration": 0,
		"prompt_eval_count": encodedTokens(resp),
	})
}

// encodedTokens is the tokens an Encode ran for all its items.
func encodedTokens(resp *brokerv1.EncodeResponse) int64 {
	var n int64
	for _, r := range resp.GetResults() {
		n += int64(r.GetTokens())
	}
	return n
}

func (h *Handler) ollamaEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string          `json:"model"`
		Prompt    string          `json:"prompt"`
		KeepAlive json.RawMessage `json:"keep_alive"`
	}
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := checkKeepAlive(req.KeepAlive, req.Model, req.Prompt != ""); err != nil {
		h.fail(w, r, err)
		return
	}
	resp, err := h.encode(r.Context(), modelName(req.Model), []string{req.Prompt}, nil)
	if err != nil {
		h.fail(w, r, h.explainKind(r.Context(), err, modelName(req.Model), wantEmbedder, false))
		return
	}
	writeJSON(w, map[string]any{"embedding": resp.GetResults()[0].GetVector()})
}

// modelExists is NOT_FOUND when name is neither served nor in the
// repository.
func (h *Handler) modelExists(ctx context.Context, name string) error {
	_, err := h.findModel(ctx, name)
	return err
}

type ollamaModelDetails struct {
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

func details(m *brokerv1.Model) ollamaModelDetails {
	d := ollamaModelDetails{Format: m.GetFormat(), Family: m.GetFamily(), ParameterSize: m.GetParameterSize(), QuantizationLevel: m.GetQuantization()}
	if d.Format == "" {
		d.Format = "safetensors"
	}
	if d.Family == "" {
		d.Family = m.GetKind()
	}
	d.Families = []string{d.Family}
	return d
}

// fileSize is a model's size as /api/tags shows it: its files' bytes, or
// its memory where the repository does not say.
func fileSize(m *brokerv1.Model) uint64 {
	if n := m.GetFileBytes(); n > 0 {
		return n
	}
	return m.GetMemoryBytes()
}

// tagged is a model's name as Ollama shows it: with its tag, ":latest"
// when it has none (a store model's qwen2.5:0.5b keeps its own).
func tagged(name string) string {
	if strings.Contains(name[strings.LastIndexByte(name, '/')+1:], ":") {
		return name
	}
	return name + ":latest"
}

// ollamaListed is a model as /api/tags (every model that did not fail:
// modified_at, and the size of its files) and /api/ps (the loaded ones:
// expires_at, the size of its memory and the part of it on accelerators)
// list it.
type ollamaListed struct {
	Name       string             `json:"name"`
	Model      string             `json:"model"`
	ModifiedAt string             `json:"modified_at,omitempty"`
	Size       uint64             `json:"size"`
	Digest     string             `json:"digest"`
	Details    ollamaModelDetails `json:"details"`
	ExpiresAt  string             `json:"expires_at,omitempty"`
	SizeVRAM   *uint64            `json:"size_vram,omitempty"`
}

func (h *Handler) ollamaTags(w http.ResponseWriter, r *http.Request) { h.ollamaList(w, r, false) }

func (h *Handler) ollamaPS(w http.ResponseWriter, r *http.Request) { h.ollamaList(w, r, true) }

// ollamaList answers /api/tags, or /api/ps when loaded.
func (h *Handler) ollamaList(w http.ResponseWriter, r *http.Request, loaded bool) {
	ms, err := h.b.ListModels(r.Context(), &brokerv1.ListModelsRequest{})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := []ollamaListed{}
	for _, m := range ms.GetModels() {
		e := ollamaListed{Name: tagged(m.GetName()), Model: tagged(m.GetName()), Digest: m.GetDigest(), Details: details(m)}
		switch {
		case !loaded:
			if m.GetState() == brokerv1.ModelState_MODEL_STATE_FAILED {
				continue
			}
			e.ModifiedAt, e.Size = h.modified(m), fileSize(m)
		case m.GetState() != brokerv1.ModelState_MODEL_STATE_READY:
			continue
		default:
			vram := uint64(0)
			for _, d := range m.GetDeviceIds() {
				if !strings.HasPrefix(d, "cpu:") {
					vram = m.GetMemoryBytes()
				}
			}
			// Loaded models stay until unloaded: Ollama's keep_alive -1,
			// whose expiry it gives as now plus the longest duration
			// (`ollama ps` shows "Forever"; a zero time reads "Never").
			e.Size, e.ExpiresAt, e.SizeVRAM = m.GetMemoryBytes(), h.opts.Now().Add(math.MaxInt64).Format(time.RFC3339Nano), &vram
		}
		out = append(out, e)
	}
	writeJSON(w, map[string]any{"models": out})
}

// prefilled says whether a chat ends with an assistant message of text
// (no calls), which Ollama's chat continues instead of starting a turn
// (a prefill such as "{"); not under a format, whose grammar would start
// over after the prefill.
func prefilled(conv *brokerv1.Conversation) bool {
	ms := conv.GetMessages()
	if len(ms) == 0 {
		return false
	}
	last := ms[len(ms)-1]
	return last.GetRole() == "assistant" && strings.TrimSpace(last.GetContent()) != "" && len(last.GetToolCalls()) == 0
}

// capabilities are what /api/show says a model does, as Ollama derives
// them from its template (some clients send tools only to a model that
// lists "tools"): "completion" for a generator, with "tools" where its
// chat template renders tools (Jinja's tools, Ollama's .Tools) and
// "thinking" where it thinks (Qwen3's <think> block, Ollama's .Think);
// "embedding" for an encoder.
func capabilities(m *brokerv1.Model) []string {
	if !isGenerator(m.GetKind()) {
		return []string{"embedding"}
	}
	caps := []string{"completion"}
	t := m.GetTemplate()
	if strings.Contains(t, ".Tools") || jinjaTools.MatchString(t) {
		caps = append(caps, "tools")
	}
	if strings.Contains(t, ".Think") || strings.Contains(t, "<think>") || strings.Contains(t, "enable_thinking") {
		caps = append(caps, "thinking")
	}
	return caps
}

// jinjaTools finds a Jinja template's use of its tools variable.
var jinjaTools = regexp.MustCompile(`\{[%{]-?\s*(if|for)?[^%}]*\btools\b`)

func (h *Handler) findModel(ctx context.Context, name string) (*brokerv1.Model, error) {
	ms, err := h.b.ListModels(ctx, &brokerv1.ListModelsRequest{})
	if err != nil {
		return nil, err
	}
	for _, m := range ms.GetModels() {
		if m.GetName() == name {
			return m, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "model %q not found", name)
}

func (h *Handler) ollamaShow(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string `json:"model"`
		Name  string `json:"name"` // the older field
	}
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	name := req.Model
	if name == "" {
		name = req.Name
	}
	m, err := h.findModel(r.Context(), modelName(name))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := map[string]any{
		"modelfile": modelfile(m),
		"details":   details(m),
		"model_info": map[string]any{"general.architecture": details(m).Family, "general.parameter_count": m.GetParameterCount(),
			"general.file_type": m.GetQuantization(), details(m).Family + ".context_length": m.GetContextLength(),
			"brokerd.kind": m.GetKind(), "brokerd.version": m.GetVersion(), "brokerd.devices": m.GetDeviceIds()},
		"capabilities": capabilities(m),
		"modified_at":  h.modified(m),
	}
	// Ollama leaves these out when empty.
	for k, v := range map[string]string{"template": m.GetTemplate(), "system": m.GetSystem(), "parameters": showParameters(m)} {
		if v != "" {
			out[k] = v
		}
	}
	writeJSON(w, out)
}

// paramValue is a default option's value (JSON in the Model) as Ollama
// holds its options: a number is a float64.
func paramValue(p *brokerv1.ModelParameter) any {
	var v any
	if json.Unmarshal([]byte(p.GetValue()), &v) != nil {
		return p.GetValue()
	}
	return v
}

// showParameters are a model's default options as /api/show prints them:
// a line per value, the name padded to 30 columns, the value in Go
// syntax ("<|im_end|>" quoted, 0.7 as it is).
func showParameters(m *brokerv1.Model) string {
	lines := make([]string, 0, len(m.GetParameters()))
	for _, p := range m.GetParameters() {
		lines = append(lines, fmt.Sprintf("%-30s %#v", p.GetName(), paramValue(p)))
	}
	return strings.Join(lines, "\n")
}

// modelfile is the Modelfile /api/show gives, in Ollama's form: FROM the
// weights' file (the model's name where the repository names none), its
// template, system prompt and default options.
func modelfile(m *brokerv1.Model) string {
	var b strings.Builder
	b.WriteString("# Modelfile generated by \"ollama show\"\n# To build a new Modelfile based on this, replace FROM with:\n")
	fmt.Fprintf(&b, "# FROM %s\n\n", tagged(m.GetName()))
	fmt.Fprintf(&b, "FROM %s\n", cmp.Or(m.GetModelFile(), tagged(m.GetName())))
	if t := m.GetTemplate(); t != "" {
		fmt.Fprintf(&b, "TEMPLATE %s\n", modelfileQuote(t))
	}
	if s := m.GetSystem(); s != "" {
		fmt.Fprintf(&b, "SYSTEM %s\n", modelfileQuote(s))
	}
	for _, p := range m.GetParameters() {
		fmt.Fprintf(&b, "PARAMETER %s %s\n", p.GetName(), modelfileQuote(fmt.Sprint(paramValue(p))))
	}
	return b.String()
}

// modelfileQuote quotes a Modelfile argument as Ollama writes one: text
// with a line break or edge spaces in quotes, triple quotes when it holds
// a quote; other text as it is.
func modelfileQuote(s string) string {
	if !strings.Contains(s, "\n") && !strings.HasPrefix(s, " ") && !strings.HasSuffix(s, " ") {
		return s
	}
	if strings.Contains(s, `"`) {
		return `"""` + s + `"""`
	}
	return `"` + s + `"`
}

func (h *Handler) ollamaVersion(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]string{"version": semanticVersion(h.opts.Version)})
}
