package httpapi

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// fakeBackend is a hand-written Backend: Encode gives 4-dimensional vectors
// from the text, Generate and Chat stream a reply in 4-character pieces,
// models "busy", "draining" and anything unknown fail as brokerd would, and
// so does a model of the wrong kind (tiny-llm generates, nbmf-hash-v1
// encodes, tiny-mlp does neither).
type fakeBackend struct {
	lastGenerate *brokerv1.GenerateRequest
	lastChat     *brokerv1.ChatRequest
	limit        bool // the last chat's or generate's MaxTokensIsLimit
	lastEncode   *brokerv1.EncodeRequest
	lastTokenize *brokerv1.TokenizeRequest
}

func (f *fakeBackend) check(model string) error {
	switch model {
	case "tiny-llm", "nbmf-hash-v1", "tiny-mlp":
		return nil
	case "busy":
		st, _ := status.New(codes.ResourceExhausted, "queue full").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)})
		return st.Err()
	case "draining":
		return status.Error(codes.Unavailable, "brokerd is draining")
	}
	return status.Errorf(codes.NotFound, "model %q not found", model)
}

func (f *fakeBackend) Encode(_ context.Context, req *brokerv1.EncodeRequest) (*brokerv1.EncodeResponse, error) {
	f.lastEncode = req
	if err := f.check(req.GetModel()); err != nil {
		return nil, err
	}
	if req.GetModel() != "nbmf-hash-v1" {
		// The broker's own words, which name its gRPC methods.
		return nil, status.Errorf(codes.InvalidArgument, "model %s is a llm model: Encode serves encoders (bert); use Infer", req.GetModel())
	}
	if len(req.GetItems()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "at least one item")
	}
	resp := &brokerv1.EncodeResponse{Model: req.GetModel()}
	for _, it := range req.GetItems() {
		n := float32(len(it.GetText()))
		// As a BERT tokenizer would: a token a word, [CLS] and [SEP].
		resp.Results = append(resp.Results, &brokerv1.EncodeResult{Vector: []float32{n, 1, -1, 0.5}, Tokens: int32(len(strings.Fields(it.GetText())) + 2)})
	}
	return resp, nil
}

// withLogprobs gives each delta, when sp asks for logprobs, one entry per
// token: the piece as the chosen token (logprob -0.25) and top_logprobs
// alternatives ("alt0", "alt1", ..., logprob -1, -2, ...).
func withLogprobs(sp *brokerv1.SamplingParams, send func(*brokerv1.GenerationDelta, *brokerv1.GenerationResult) error) func(*brokerv1.GenerationDelta, *brokerv1.GenerationResult) error {
	return func(d *brokerv1.GenerationDelta, r *brokerv1.GenerationResult) error {
		if d != nil && sp.GetLogprobs() {
			text := d.GetText() + d.GetReasoning()
			e := &brokerv1.LogprobEntry{Chosen: &brokerv1.TokenLogprob{TokenId: d.GetTokenIds()[0], Text: text, Bytes: []byte(text), Logprob: -0.25}}
			for k := range sp.GetTopLogprobs() {
				alt := fmt.Sprintf("alt%d", k)
				e.Top = append(e.Top, &brokerv1.TokenLogprob{TokenId: 1000 + k, Text: alt, Bytes: []byte(alt), Logprob: float32(-1 - k)})
			}
			d.Logprobs = []*brokerv1.LogprobEntry{e}
		}
		return send(d, r)
	}
}

// thinks says whether a chat request asks a thinking model to think:
// enable_thinking, else chat_template_kwargs' enable_thinking (off by
// default in the fake, to keep the other tests' text).
func thinks(req *brokerv1.ChatRequest) bool {
	if req.EnableThinking != nil {
		return req.GetEnableThinking()
	}
	v, ok := req.GetChatTemplateKwargs().GetFields()["enable_thinking"]
	return ok && v.GetBoolValue()
}

// reply streams replies[i] for index i, pieces interleaved, then results.
func reply(replies []string, prompt []int32, finish brokerv1.FinishReason, send func(*brokerv1.GenerationDelta, *brokerv1.GenerationResult) error) error {
	runes := make([][]rune, len(replies))
	for i, r := range replies {
		runes[i] = []rune(r)
	}
	for off := 0; ; off += 4 {
		any := false
		for i, r := range runes {
			if off < len(r) {
				any = true
				piece := string(r[off:min(off+4, len(r))])
				if err := send(&brokerv1.GenerationDelta{Index: int32(i), Text: piece, TokenIds: []int32{int32(off)}}, nil); err != nil {
					return err
				}
			}
		}
		if !any {
			break
		}
	}
	for i, r := range runes {
		res := &brokerv1.GenerationResult{Index: int32(i), FinishReason: finish,
			Usage:            &brokerv1.Usage{PromptTokens: prompt[i], CompletionTokens: int32((len(r) + 3) / 4)},
			TimeToFirstToken: durationpb.New(3 * time.Millisecond),
			Execution:        &brokerv1.ExecutionInfo{DeviceId: "cpu:0", TotalNs: int64(9 * time.Millisecond)}}
		if err := send(nil, res); err != nil {
			return err
		}
	}
	return nil
}

// promptIDs, when asked (return_prompt_token_ids), sends the first
// message as the broker does: a delta per answer with its prompt's ids,
// here 900 and the answer's prompt token count.
func promptIDs(ask bool, prompt []int32, s func([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult) error) error {
	if !ask {
		return nil
	}
	ds := make([]*brokerv1.GenerationDelta, len(prompt))
	for i, n := range prompt {
		ds[i] = &brokerv1.GenerationDelta{Index: int32(i), PromptTokenIds: []int32{900, n}}
	}
	return s(ds, nil)
}

func (f *fakeBackend) RunGenerate(ctx context.Context, req *brokerv1.GenerateRequest, s func([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult) error) error {
	f.lastGenerate, f.limit = req, MaxTokensIsLimit(ctx)
	if err := f.check(req.GetModel()); err != nil {
		return err
	}
	if req.GetModel() != "tiny-llm" {
		return status.Errorf(codes.InvalidArgument, "model %s is a mlp model: Generate serves generator (LLM) models", req.GetModel())
	}
	var replies []string
	var prompt []int32
	// A text prompt counts its bytes as tokens; a token prompt is answered
	// as the text "ids 1,2,3" and counts its ids.
	type input struct {
		text   string
		tokens int
	}
	var inputs []input
	for _, p := range req.GetPrompts() {
		inputs = append(inputs, input{p, len(p)})
	}
	for _, tp := range req.GetTokenPrompts() {
		ids := make([]string, len(tp.GetIds()))
		for i, id := range tp.GetIds() {
			ids[i] = fmt.Sprint(id)
		}
		inputs = append(inputs, input{"ids " + strings.Join(ids, ","), len(ids)})
	}
	for _, in := range inputs {
		for j := range max(req.GetSampling().GetN(), 1) { // the j-th of n answers
			reply := "gen: " + in.text
			if j > 0 {
				reply += fmt.Sprintf(" #%d", j)
			}
			replies = append(replies, reply)
			prompt = append(prompt, int32(in.tokens))
		}
	}
	finish := brokerv1.FinishReason_FINISH_REASON_LENGTH
	if req.GetSampling().GetMaxTokens() == 0 {
		finish = brokerv1.FinishReason_FINISH_REASON_STOP
	}
	if err := promptIDs(req.GetReturnPromptTokenIds(), prompt, s); err != nil {
		return err
	}
	return reply(replies, prompt, finish, withLogprobs(req.GetSampling(), func(d *brokerv1.GenerationDelta, r *brokerv1.GenerationResult) error {
		m := &brokerv1.GenerateResponse{}
		if d != nil {
			m.Deltas = append(m.Deltas, d)
		}
		if r != nil {
			m.Results = append(m.Results, r)
		}
		return s(m.Deltas, m.Results)
	}))
}

// callTwoTools, as the last message of a chat with tools, has the fake
// answer two calls of the first tool.
const callTwoTools = "call two tools"

func (f *fakeBackend) RunChat(ctx context.Context, req *brokerv1.ChatRequest, s func([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult) error) error {
	f.lastChat, f.limit = req, MaxTokensIsLimit(ctx)
	if err := f.check(req.GetModel()); err != nil {
		return err
	}
	if req.GetModel() != "tiny-llm" {
		return status.Errorf(codes.InvalidArgument, "model %s is a mlp model: Generate serves generator (LLM) models", req.GetModel())
	}
	var replies []string
	var prompt []int32
	for _, c := range req.GetConversations() {
		var turns []string
		for _, m := range c.GetMessages() {
			turns = append(turns, m.GetRole()+"="+m.GetContent())
		}
		for j := range max(req.GetSampling().GetN(), 1) { // the j-th of n answers
			reply := fmt.Sprintf("chat(%s) ünïcode", strings.Join(turns, "|"))
			if j > 0 {
				reply += fmt.Sprintf(" #%d", j)
			}
			replies = append(replies, reply)
			prompt = append(prompt, int32(len(turns)))
		}
	}
	send := withLogprobs(req.GetSampling(), func(d *brokerv1.GenerationDelta, r *brokerv1.GenerationResult) error {
		m := &brokerv1.ChatResponse{}
		if d != nil {
			m.Deltas = append(m.Deltas, d)
		}
		if r != nil {
			m.Results = append(m.Results, r)
		}
		return s(m.Deltas, m.Results)
	})
	if err := promptIDs(req.GetReturnPromptTokenIds(), prompt, s); err != nil {
		return err
	}
	if msgs := req.GetConversations()[0].GetMessages(); len(req.GetTools()) > 0 && msgs[len(msgs)-1].GetContent() == callTwoTools {
		// A model's answer of two calls, each in a delta of its own.
		name := req.GetTools()[0].GetName()
		for i, args := range []string{`{"x": 1}`, `{"y": "ü"}`} {
			tc := &brokerv1.ToolCall{Id: fmt.Sprintf("call_%d", i), Name: name, Arguments: args, Index: int32(i)}
			if err := send(&brokerv1.GenerationDelta{ToolCalls: []*brokerv1.ToolCall{tc}, TokenIds: []int32{int32(i)}}, nil); err != nil {
				return err
			}
		}
		return send(nil, &brokerv1.GenerationResult{FinishReason: brokerv1.FinishReason_FINISH_REASON_TOOL_CALLS,
			Usage: &brokerv1.Usage{PromptTokens: prompt[0], CompletionTokens: 2}})
	}
	if thinks(req) {
		// A thinking model's reasoning comes first, apart from the text.
		for i := range replies {
			if err := send(&brokerv1.GenerationDelta{Index: int32(i), Reasoning: "hmm, ", TokenIds: []int32{-1}}, nil); err != nil {
				return err
			}
			if err := send(&brokerv1.GenerationDelta{Index: int32(i), Reasoning: "let me think", TokenIds: []int32{-2}}, nil); err != nil {
				return err
			}
		}
	}
	return reply(replies, prompt, brokerv1.FinishReason_FINISH_REASON_STOP, send)
}

func (f *fakeBackend) ListModels(context.Context, *brokerv1.ListModelsRequest) (*brokerv1.ListModelsResponse, error) {
	return &brokerv1.ListModelsResponse{Models: []*brokerv1.Model{
		{Name: "nbmf-hash-v1", Kind: "hash-encoder", State: brokerv1.ModelState_MODEL_STATE_READY, DeviceIds: []string{"cpu:0"}, MemoryBytes: 4096},
		{Name: "tiny-llm", Kind: "llm", State: brokerv1.ModelState_MODEL_STATE_READY, DeviceIds: []string{"cpu:0"}, MemoryBytes: 1 << 20,
			ModifiedAt: timestamppb.New(time.Unix(1700000000, 0))},
		{Name: "cold", Kind: "bert", State: brokerv1.ModelState_MODEL_STATE_AVAILABLE},
		{Name: "tiny-mlp", Kind: "mlp", State: brokerv1.ModelState_MODEL_STATE_READY, DeviceIds: []string{"cpu:0"}, MemoryBytes: 1024},
	}}, nil
}

// Tokenize counts as the fake generates: a prompt's bytes, a chat's turns
// (its usage's prompt tokens); a chat's tokens are named role=content.
func (f *fakeBackend) Tokenize(_ context.Context, req *brokerv1.TokenizeRequest) (*brokerv1.TokenizeResponse, error) {
	if err := f.check(req.GetModel()); err != nil {
		return nil, err
	}
	if req.GetModel() != "tiny-llm" {
		return nil, status.Errorf(codes.InvalidArgument, "model %s is a mlp model: Tokenize serves generator (LLM) models", req.GetModel())
	}
	f.lastTokenize = req
	resp := &brokerv1.TokenizeResponse{ContextLength: 2048}
	for _, p := range req.GetPrompts() {
		r := &brokerv1.TokenizedPrompt{}
		for _, c := range []byte(p) {
			r.Ids = append(r.Ids, int32(c))
			r.Tokens = append(r.Tokens, string(c))
		}
		resp.Results = append(resp.Results, r)
	}
	for _, c := range req.GetChat().GetConversations() {
		r := &brokerv1.TokenizedPrompt{}
		for i, m := range c.GetMessages() {
			r.Ids = append(r.Ids, int32(i))
			r.Tokens = append(r.Tokens, m.GetRole()+"="+m.GetContent())
		}
		resp.Results = append(resp.Results, r)
	}
	if !req.GetReturnTokenStrings() {
		for _, r := range resp.Results {
			r.Tokens = nil
		}
	}
	return resp, nil
}

// Detokenize writes each id as a byte.
func (f *fakeBackend) Detokenize(_ context.Context, req *brokerv1.DetokenizeRequest) (*brokerv1.DetokenizeResponse, error) {
	if err := f.check(req.GetModel()); err != nil {
		return nil, err
	}
	var b []byte
	for _, id := range req.GetIds() {
		if id < 0 || id > 255 {
			return nil, status.Errorf(codes.InvalidArgument, "id %d is outside the vocabulary", id)
		}
		b = append(b, byte(id))
	}
	return &brokerv1.DetokenizeResponse{Text: string(b)}, nil
}
