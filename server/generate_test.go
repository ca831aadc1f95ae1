package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/brokerd/brokerd/lifecycle"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
	"github.com/brokerd/brokerd/scheduler"
	"github.com/brokerd/brokerd/server/internal/output"
)

// letterModel is a hand-written generator: a token per byte (id = byte+2,
// BOS 1), a template of "<role>content" lines, and an executor whose next
// token is the last one's letter plus one. Delta holds each token's text
// back by one token, so the stream depends on Flush for its last letter,
// as a real detokeniser holds back half a UTF-8 sequence.
type letterModel struct {
	ctxLen int
	defMax int           // DefaultMaxTokens (0: none, to the context)
	step   time.Duration // each step's duration

	mu       sync.Mutex
	released map[uint64]int
	reserved map[uint64]bool
	seeds    []uint64 // each seeded sequence's seed, in creation order
}

const letterBOS = 1

func (m *letterModel) SystemPrompt() string { return "" }

func (m *letterModel) ContextLength() int    { return m.ctxLen }
func (m *letterModel) DefaultMaxTokens() int { return m.defMax }
func (m *letterModel) EncodePrompt(text string, addSpecial bool) ([]int32, error) {
	var ids []int32
	if addSpecial {
		ids = append(ids, letterBOS)
	}
	for _, b := range []byte(text) {
		ids = append(ids, int32(b)+2)
	}
	return ids, nil
}

func (m *letterModel) ThinkTags() (output.Tags, bool) { return output.Tags{}, false }

// The letter model's vocabulary: BOS, EOS and a token per byte.
func (m *letterModel) VocabSize() int { return 258 }
func (m *letterModel) TokenBytes(id int32) []byte {
	if id < 2 {
		return []byte([]string{"</s>", "<s>"}[id]) // EOS 0, BOS 1
	}
	return []byte{byte(id - 2)}
}

func (m *letterModel) ToolFormat() output.ToolFormat { return output.NoToolFormat }

func (m *letterModel) DefaultSampling() llm.Sampling { return llm.Sampling{} }

func (m *letterModel) RenderChat(_ context.Context, msgs []llm.Message, opts llm.ChatOptions) (string, error) {
	var b strings.Builder
	for _, t := range msgs {
		fmt.Fprintf(&b, "<%s>%s\n", t.Role, t.Content)
	}
	if opts.AddGenerationPrompt {
		b.WriteString("<assistant>")
	}
	return b.String(), nil
}

type letterSeq struct {
	held string
	temp float32
}

func (m *letterModel) NewSequence(_ context.Context, p llm.Sampling, prompt []int32) (genSequence, error) {
	if p.Temperature < 0 {
		return nil, fmt.Errorf("temperature %v: %w", p.Temperature, models.ErrInvalidInput)
	}
	if p.Seeded {
		m.mu.Lock()
		m.seeds = append(m.seeds, p.Seed)
		m.mu.Unlock()
	}
	return &letterSeq{}, nil
}

func (s *letterSeq) State() any { return s }
func (s *letterSeq) Delta(out any) (genDelta, error) {
	tok := out.(int32)
	text := s.held
	s.held = string(rune(tok - 2))
	return genDelta{Text: text, TokenIDs: []int32{tok}}, nil
}
func (s *letterSeq) Flush() string {
	t := s.held
	s.held = ""
	return t
}

func (m *letterModel) Reserve(seq uint64, tokens int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reserved[seq] = true
	return true
}

func (m *letterModel) Release(seq uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.released[seq]++
	delete(m.reserved, seq)
}

func (m *letterModel) held() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.reserved)
}

func (m *letterModel) Step(ctx context.Context, items []scheduler.StepItem) ([]scheduler.StepResult, error) {
	if m.step > 0 {
		select {
		case <-time.After(m.step):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make([]scheduler.StepResult, len(items))
	for i, it := range items {
		// The letter after the last token's byte; 'a' after 'z' or a non-letter.
		last := it.Tokens[len(it.Tokens)-1] - 2
		next := int32('a')
		if last >= 'a' && last < 'z' {
			next = last + 1
		}
		next += 2
		out[i] = scheduler.StepResult{Token: next, Out: next}
	}
	return out, nil
}

// fixedModels serves fixed models with no devices or repository: the part
// of the model lifecycle the request path uses.
type fixedModels map[string]*lifecycle.Served

func (f fixedModels) Acquire(name string, version int64) (*lifecycle.Served, error) {
	sv := f[name]
	if sv == nil {
		return nil, f.Missing(name)
	}
	if version != 0 && version != sv.Info.Version {
		return nil, fmt.Errorf("model %s version %d: %w", name, version, lifecycle.ErrModelNotLoaded)
	}
	return sv, nil
}
func (f fixedModels) Release(*lifecycle.Served)            {}
func (f fixedModels) Lookup(name string) *lifecycle.Served { return f[name] }
func (f fixedModels) LookupLabel(label string) *lifecycle.Served {
	for _, sv := range f {
		if sv.Label == label {
			return sv
		}
	}
	return nil
}
func (f fixedModels) Builtin(string) (lifecycle.Encoder, bool) { return nil, false }
func (f fixedModels) DefaultModel() string                     { return "" }
func (f fixedModels) ComputeDType(string) (runtime.DType, bool) {
	return 0, false
}
func (f fixedModels) Missing(name string) error {
	return fmt.Errorf("model %q: %w", name, lifecycle.ErrModelNotFound)
}
func (f fixedModels) Load(context.Context, string, int64) (*lifecycle.Served, lifecycle.Action, error) {
	return nil, 0, errors.New("fixed models load nothing")
}
func (f fixedModels) Unload(context.Context, string) (*lifecycle.Served, error) {
	return nil, errors.New("fixed models unload nothing")
}
func (f fixedModels) Catalog() (lifecycle.Catalog, error) { return lifecycle.Catalog{Served: f}, nil }

// genServer serves a BrokerService with one generator "tiny" and one
// encoder "enc" over a real Unix socket.
func genServer(t *testing.T, m *letterModel, limits Limits) brokerv1.BrokerServiceClient {
	t.Helper()
	m.released, m.reserved = map[uint64]int{}, map[uint64]bool{}
	sched := scheduler.New(scheduler.Options{})
	t.Cleanup(sched.Close)
	if err := sched.AddGenReplica("tiny@1", scheduler.Device{ID: "cpu:0", Type: "cpu"}, scheduler.GenOptions{MaxRunning: 4, MaxStepTokens: 256}, m); err != nil {
		t.Fatal(err)
	}
	tiny := &lifecycle.Served{Info: models.Info{Name: "tiny", Version: 1, Kind: "llm"}, Key: "tiny@1"}
	ms := fixedModels{"tiny": tiny, "enc": {Info: models.Info{Name: "enc", Version: 1, Kind: models.KindBERT}, Key: "enc@1"}}
	gens := func(sv *lifecycle.Served) generator {
		if sv == tiny {
			return m
		}
		return nil
	}
	svc := NewBrokerService(nil, Policy{}, DataPlane{sched: sched, models: ms, limits: limits, testGenerator: gens}, zap.NewNop())
	srv := grpc.NewServer()
	brokerv1.RegisterBrokerServiceServer(srv, svc)
	return brokerv1.NewBrokerServiceClient(serveUnix(t, srv))
}

type streamed struct {
	text    []string
	ids     [][]int32
	results []*brokerv1.GenerationResult
	msgs    int
}

func readAll(t *testing.T, n int, recv func() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error)) (streamed, error) {
	t.Helper()
	s := streamed{text: make([]string, n), ids: make([][]int32, n), results: make([]*brokerv1.GenerationResult, n)}
	for {
		d, r, err := recv()
		if errors.Is(err, io.EOF) {
			return s, nil
		}
		if err != nil {
			return s, err
		}
		s.msgs++
		for _, x := range d {
			s.text[x.GetIndex()] += x.GetText()
			s.ids[x.GetIndex()] = append(s.ids[x.GetIndex()], x.GetTokenIds()...)
		}
		for _, x := range r {
			if s.results[x.GetIndex()] != nil {
				t.Errorf("two results for index %d", x.GetIndex())
			}
			s.results[x.GetIndex()] = x
		}
	}
}

// letters is what letterModel generates after a prompt ending in last.
func letters(last byte, n int) string {
	var b strings.Builder
	c := last
	for range n {
		if c < 'a' || c >= 'z' {
			c = 'a'
		} else {
			c++
		}
		b.WriteByte(c)
	}
	return b.String()
}

func TestGenerateRPC(t *testing.T) {
	m := &letterModel{ctxLen: 64, defMax: 8}
	cl := genServer(t, m, Limits{MaxItemsPerRequest: 8, MaxItemBytes: 1 << 10})
	ctx := t.Context()
	prompts := []string{"abc", "x", "hello world q"}
	st, err := cl.Generate(ctx, &brokerv1.GenerateRequest{Model: "tiny", Prompts: prompts, Sampling: &brokerv1.SamplingParams{MaxTokens: 5}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := readAll(t, len(prompts), func() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error) {
		m, err := st.Recv()
		return m.GetDeltas(), m.GetResults(), err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range prompts {
		want := letters(p[len(p)-1], 5)
		if got.text[i] != want || len(got.ids[i]) != 5 {
			t.Errorf("prompt %d: text %q ids %v, want %q", i, got.text[i], got.ids[i], want)
		}
		r := got.results[i]
		if r == nil {
			t.Fatalf("prompt %d: no result", i)
		}
		if r.GetFinishReason() != brokerv1.FinishReason_FINISH_REASON_LENGTH || r.GetUsage().GetPromptTokens() != int32(len(p)+1) ||
			r.GetUsage().GetCompletionTokens() != 5 || r.GetExecution().GetDeviceId() != "cpu:0" || r.GetTimeToFirstToken().AsDuration() <= 0 {
			t.Errorf("prompt %d: result %v", i, r)
		}
	}
	if got.msgs >= 3*6 {
		t.Errorf("%d messages for 3 prompts of 5 tokens: ready deltas were not sent together", got.msgs)
	}

	// Token prompts run as given: no BOS added; the letters' ids continue
	// as their text does.
	ids := &brokerv1.TokenPrompt{Ids: []int32{'h' + 2, 'i' + 2}}
	ts, err := cl.Generate(ctx, &brokerv1.GenerateRequest{Model: "tiny", TokenPrompts: []*brokerv1.TokenPrompt{ids}, Sampling: &brokerv1.SamplingParams{MaxTokens: 4}})
	if err != nil {
		t.Fatal(err)
	}
	byIDs, err := readAll(t, 1, func() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error) {
		m, err := ts.Recv()
		return m.GetDeltas(), m.GetResults(), err
	})
	if err != nil {
		t.Fatal(err)
	}
	if byIDs.text[0] != letters('i', 4) || byIDs.results[0].GetUsage().GetPromptTokens() != 2 {
		t.Errorf("token prompt: %q, usage %v", byIDs.text[0], byIDs.results[0].GetUsage())
	}

	// Chat renders the template; the template's tokens are not doubled by a BOS.
	cs, err := cl.Chat(ctx, &brokerv1.ChatRequest{Model: "tiny", Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{
		{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"},
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	chat, err := readAll(t, 1, func() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error) {
		m, err := cs.Recv()
		return m.GetDeltas(), m.GetResults(), err
	})
	if err != nil {
		t.Fatal(err)
	}
	rendered := "<system>be brief\n<user>hi\n<assistant>"
	if chat.text[0] != letters('>', 8) || chat.results[0].GetUsage().GetPromptTokens() != int32(len(rendered)) {
		t.Errorf("chat: %q, usage %v", chat.text[0], chat.results[0].GetUsage())
	}
}

// TestReturnPromptTokenIDs: asked, a call's first message gives each
// answer's prompt as token ids (a chat's as its template rendered them),
// one delta each and nothing else; unasked, no delta carries them.
func TestReturnPromptTokenIDs(t *testing.T) {
	m := &letterModel{ctxLen: 64}
	cl := genServer(t, m, Limits{MaxItemsPerRequest: 8, MaxItemBytes: 1 << 10})
	ctx := t.Context()
	sp := &brokerv1.SamplingParams{MaxTokens: 2, N: 2}
	read := func(recv func() ([]*brokerv1.GenerationDelta, error)) (first, all []*brokerv1.GenerationDelta) {
		for msg := 0; ; msg++ {
			ds, err := recv()
			if errors.Is(err, io.EOF) {
				return first, all
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg == 0 {
				first = ds
			}
			all = append(all, ds...)
		}
	}
	ids := func(text string, bos bool) []int32 {
		out, _ := m.EncodePrompt(text, bos)
		return out
	}
	for _, ask := range []bool{true, false} {
		gs, err := cl.Generate(ctx, &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab", "c"}, Sampling: sp, ReturnPromptTokenIds: ask})
		if err != nil {
			t.Fatal(err)
		}
		first, all := read(func() ([]*brokerv1.GenerationDelta, error) { m, err := gs.Recv(); return m.GetDeltas(), err })
		cs, err := cl.Chat(ctx, &brokerv1.ChatRequest{Model: "tiny", Sampling: sp, ReturnPromptTokenIds: ask,
			Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "hi"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		cfirst, call := read(func() ([]*brokerv1.GenerationDelta, error) { m, err := cs.Recv(); return m.GetDeltas(), err })
		for _, tc := range []struct {
			name       string
			first, all []*brokerv1.GenerationDelta
			want       [][]int32 // per answer
		}{
			{"generate", first, all, [][]int32{ids("ab", true), ids("ab", true), ids("c", true), ids("c", true)}},
			{"chat", cfirst, call, [][]int32{ids("<user>hi\n<assistant>", false), ids("<user>hi\n<assistant>", false)}},
		} {
			carrying := 0
			for _, d := range tc.all {
				if len(d.GetPromptTokenIds()) > 0 {
					carrying++
				}
			}
			if !ask {
				if carrying > 0 {
					t.Errorf("%s unasked: %d deltas carry prompt ids", tc.name, carrying)
				}
				continue
			}
			if len(tc.first) != len(tc.want) || carrying != len(tc.want) {
				t.Fatalf("%s: first message %v; %d deltas carry prompt ids, want %d", tc.name, tc.first, carrying, len(tc.want))
			}
			for i, d := range tc.first {
				if d.GetIndex() != int32(i) || !slices.Equal(d.GetPromptTokenIds(), tc.want[i]) || d.GetText() != "" || len(d.GetTokenIds()) != 0 {
					t.Errorf("%s: first message's delta %d: %v, want index %d and ids %v alone", tc.name, i, d, i, tc.want[i])
				}
			}
		}
	}
}

func TestGenerateRPCValidation(t *testing.T) {
	m := &letterModel{ctxLen: 32}
	cl := genServer(t, m, Limits{MaxItemsPerRequest: 2, MaxItemBytes: 64})
	long := strings.Repeat("y", 40)
	tests := []struct {
		name string
		req  *brokerv1.GenerateRequest
		chat *brokerv1.ChatRequest
		code codes.Code
		msg  string
	}{
		{name: "no model", req: &brokerv1.GenerateRequest{Prompts: []string{"a"}}, code: codes.InvalidArgument, msg: "model is required"},
		{name: "unknown model", req: &brokerv1.GenerateRequest{Model: "nope", Prompts: []string{"a"}}, code: codes.NotFound},
		{name: "an encoder", req: &brokerv1.GenerateRequest{Model: "enc", Prompts: []string{"a"}}, code: codes.InvalidArgument, msg: "generator"},
		{name: "no prompts", req: &brokerv1.GenerateRequest{Model: "tiny"}, code: codes.InvalidArgument, msg: "nothing to generate"},
		{name: "empty prompt", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{""}}, code: codes.InvalidArgument, msg: "empty"},
		{name: "empty token prompt", req: &brokerv1.GenerateRequest{Model: "tiny", TokenPrompts: []*brokerv1.TokenPrompt{{}}}, code: codes.InvalidArgument, msg: "token_prompts[0] is empty"},
		{name: "text and token prompts", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"a"}, TokenPrompts: []*brokerv1.TokenPrompt{{Ids: []int32{3}}}}, code: codes.InvalidArgument, msg: "not both"},
		{name: "too many token prompts", req: &brokerv1.GenerateRequest{Model: "tiny", TokenPrompts: []*brokerv1.TokenPrompt{{Ids: []int32{3}}, {Ids: []int32{3}}, {Ids: []int32{3}}}}, code: codes.InvalidArgument, msg: "--max-items-per-request"},
		{name: "token prompt too long for the context", req: &brokerv1.GenerateRequest{Model: "tiny", TokenPrompts: []*brokerv1.TokenPrompt{{Ids: make([]int32, 32)}}}, code: codes.InvalidArgument, msg: "context"},
		{name: "too many prompts", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"a", "b", "c"}}, code: codes.InvalidArgument, msg: "--max-items-per-request"},
		{name: "prompt too long for the context", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{long}}, code: codes.InvalidArgument, msg: "context"},
		{name: "prompt too large", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{strings.Repeat("z", 65)}}, code: codes.InvalidArgument, msg: "--max-item-bytes"},
		{name: "max tokens past the context", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, Sampling: &brokerv1.SamplingParams{MaxTokens: 40}}, code: codes.InvalidArgument, msg: "context"},
		{name: "min tokens over max tokens", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, Sampling: &brokerv1.SamplingParams{MaxTokens: 3, MinTokens: 4}}, code: codes.InvalidArgument, msg: "min_tokens"},
		{name: "min tokens past the context", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, Sampling: &brokerv1.SamplingParams{MinTokens: 31}}, code: codes.InvalidArgument, msg: "min_tokens"},
		{name: "negative min tokens", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, Sampling: &brokerv1.SamplingParams{MinTokens: -1}}, code: codes.InvalidArgument, msg: "min_tokens"},
		{name: "negative max tokens", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, Sampling: &brokerv1.SamplingParams{MaxTokens: -1}}, code: codes.InvalidArgument},
		{name: "bad temperature", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, Sampling: &brokerv1.SamplingParams{Temperature: proto.Float32(-1)}}, code: codes.InvalidArgument, msg: "temperature"},
		{name: "top logprobs without logprobs", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, Sampling: &brokerv1.SamplingParams{TopLogprobs: 3}}, code: codes.InvalidArgument},
		{name: "too many top logprobs", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, Sampling: &brokerv1.SamplingParams{Logprobs: true, TopLogprobs: 21}}, code: codes.InvalidArgument},
		{name: "empty stop string", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, Sampling: &brokerv1.SamplingParams{Stop: []string{""}}}, code: codes.InvalidArgument},
		{name: "negative max time", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, MaxTime: durationpb.New(-time.Second)}, code: codes.InvalidArgument},
		{name: "bad priority", req: &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"ab"}, Priority: 9}, code: codes.InvalidArgument},
		{name: "chat: bad role", chat: &brokerv1.ChatRequest{Model: "tiny", Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "robot", Content: "x"}}}}}, code: codes.InvalidArgument, msg: "role"},
		{name: "chat: empty conversation", chat: &brokerv1.ChatRequest{Model: "tiny", Conversations: []*brokerv1.Conversation{{}}}, code: codes.InvalidArgument, msg: "no messages"},
		{name: "chat: thinking on a model that does not think", chat: &brokerv1.ChatRequest{Model: "tiny", EnableThinking: proto.Bool(true),
			Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "x"}}}}}, code: codes.InvalidArgument, msg: "does not think"},
		{name: "chat: template kwargs replacing the messages", chat: &brokerv1.ChatRequest{Model: "tiny",
			ChatTemplateKwargs: &structpb.Struct{Fields: map[string]*structpb.Value{"messages": structpb.NewListValue(&structpb.ListValue{})}},
			Conversations:      []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "x"}}}}}, code: codes.InvalidArgument, msg: "messages"},
		{name: "chat: tools on a model with no call format", chat: toolChat(&brokerv1.ChatRequest{}), code: codes.InvalidArgument, msg: "no format"},
		{name: "chat: tool_choice required and a constraint", chat: toolChat(&brokerv1.ChatRequest{ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED,
			Sampling: &brokerv1.SamplingParams{Constraint: &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON}}}), code: codes.InvalidArgument, msg: "cannot take sampling.constraint"},
		{name: "chat: a named function and a constraint", chat: toolChat(&brokerv1.ChatRequest{ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION, ToolChoiceFunction: "f",
			Sampling: &brokerv1.SamplingParams{Constraint: &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON}}}), code: codes.InvalidArgument, msg: "cannot take sampling.constraint"},
		{name: "chat: a named function not among the tools", chat: toolChat(&brokerv1.ChatRequest{ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION, ToolChoiceFunction: "g"}), code: codes.InvalidArgument, msg: "not one of the tools"},
		{name: "chat: required without tools", chat: toolChat(&brokerv1.ChatRequest{ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED, Tools: []*brokerv1.Tool{}}), code: codes.InvalidArgument, msg: "needs tools"},
		{name: "chat: a function name without FUNCTION", chat: toolChat(&brokerv1.ChatRequest{ToolChoiceFunction: "f"}), code: codes.InvalidArgument, msg: "TOOL_CHOICE_MODE_FUNCTION"},
		{name: "chat: a bad tool name", chat: toolChat(&brokerv1.ChatRequest{Tools: []*brokerv1.Tool{{Name: "a b"}}}), code: codes.InvalidArgument, msg: "tools[0].name"},
		{name: "chat: two tools of a name", chat: toolChat(&brokerv1.ChatRequest{Tools: []*brokerv1.Tool{{Name: "f"}, {Name: "f"}}}), code: codes.InvalidArgument, msg: "two tools"},
		{name: "chat: parameters not an object", chat: toolChat(&brokerv1.ChatRequest{Tools: []*brokerv1.Tool{{Name: "f", Parameters: "[1]"}}}), code: codes.InvalidArgument, msg: "parameters"},
		{name: "chat: a user's tool calls", chat: toolChat(&brokerv1.ChatRequest{Tools: []*brokerv1.Tool{}},
			&brokerv1.ChatMessage{Role: "user", ToolCalls: []*brokerv1.ToolCall{{Name: "f", Arguments: "{}"}}}), code: codes.InvalidArgument, msg: "only an assistant's"},
		{name: "chat: arguments not an object", chat: toolChat(&brokerv1.ChatRequest{Tools: []*brokerv1.Tool{}},
			&brokerv1.ChatMessage{Role: "assistant", ToolCalls: []*brokerv1.ToolCall{{Name: "f", Arguments: `1`}}}), code: codes.InvalidArgument, msg: "arguments"},
		{name: "chat: tools count against the size", chat: toolChat(&brokerv1.ChatRequest{ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE,
			Tools: []*brokerv1.Tool{{Name: "f", Description: long}}}), code: codes.InvalidArgument, msg: "--max-item-bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.chat != nil {
				var s brokerv1.BrokerService_ChatClient
				if s, err = cl.Chat(t.Context(), tc.chat); err == nil {
					_, err = s.Recv()
				}
			} else {
				var s brokerv1.BrokerService_GenerateClient
				if s, err = cl.Generate(t.Context(), tc.req); err == nil {
					_, err = s.Recv()
				}
			}
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Errorf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
}

// toolChat is req for the letter model with one tool, f, unless req has
// its own (non-nil) tools, and msgs (none: a user's "x").
func toolChat(req *brokerv1.ChatRequest, msgs ...*brokerv1.ChatMessage) *brokerv1.ChatRequest {
	req.Model = "tiny"
	if req.Tools == nil {
		req.Tools = []*brokerv1.Tool{{Name: "f"}}
	}
	if len(msgs) == 0 {
		msgs = []*brokerv1.ChatMessage{{Role: "user", Content: "x"}}
	}
	req.Conversations = []*brokerv1.Conversation{{Messages: msgs}}
	return req
}

// tool_choice required and a named function constrain the output as
// vLLM does: an array of {"name", "parameters"} of the tools (anyOf), or
// the named function's parameters (an empty object schema when it has
// none).
func TestForcedCalls(t *testing.T) {
	const p = `{"type": "object", "properties": {"a": {"type": "integer"}}}`
	tools := []*brokerv1.Tool{{Name: "f", Parameters: p}, {Name: "g"}}
	for _, tc := range []struct {
		name string
		req  *brokerv1.ChatRequest
		want string
	}{
		{"auto", &brokerv1.ChatRequest{Tools: tools}, ""},
		{"none", &brokerv1.ChatRequest{Tools: tools, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE}, ""},
		{"named", &brokerv1.ChatRequest{Tools: tools, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION, ToolChoiceFunction: "f"}, p},
		{"named without parameters", &brokerv1.ChatRequest{Tools: tools, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION, ToolChoiceFunction: "g"},
			`{"type": "object", "properties": {}}`},
		{"required, one tool", &brokerv1.ChatRequest{Tools: tools[:1], ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED},
			`{"items":{"additionalProperties":false,"properties":{"name":{"enum":["f"],"type":"string"},"parameters":` + p + `},"required":["name","parameters"],"type":"object"},"minItems":1,"type":"array"}`},
		{"required, two tools", &brokerv1.ChatRequest{Tools: tools, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED},
			`{"items":{"anyOf":[{"additionalProperties":false,"properties":{"name":{"enum":["f"],"type":"string"},"parameters":` + p + `},"required":["name","parameters"],"type":"object"},` +
				`{"additionalProperties":false,"properties":{"name":{"enum":["g"],"type":"string"},"parameters":{"type": "object", "properties": {}}},"required":["name","parameters"],"type":"object"}]},"minItems":1,"type":"array"}`},
		{"required, parallel_tool_calls false: one call", &brokerv1.ChatRequest{Tools: tools[:1], ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED, ParallelToolCalls: proto.Bool(false)},
			`{"items":{"additionalProperties":false,"properties":{"name":{"enum":["f"],"type":"string"},"parameters":` + p + `},"required":["name","parameters"],"type":"object"},"minItems":1,"maxItems":1,"type":"array"}`},
		{"required, parallel_tool_calls true", &brokerv1.ChatRequest{Tools: tools[:1], ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED, ParallelToolCalls: proto.Bool(true)},
			`{"items":{"additionalProperties":false,"properties":{"name":{"enum":["f"],"type":"string"},"parameters":` + p + `},"required":["name","parameters"],"type":"object"},"minItems":1,"type":"array"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := forcedCalls(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want == "" && c != nil:
				t.Errorf("constraint %+v, want none", c)
			case tc.want != "" && (c == nil || c.Kind != grammar.KindJSONSchema):
				t.Errorf("constraint %+v, want a JSON Schema", c)
			case tc.want != "":
				var got, want any
				if json.Unmarshal([]byte(c.Source), &got) != nil || json.Unmarshal([]byte(tc.want), &want) != nil || !reflect.DeepEqual(got, want) {
					t.Errorf("schema\n%s\nwant\n%s", c.Source, tc.want)
				}
			}
		})
	}
}

// With tool_choice none a model that writes calls in no known format
// still gets its tools (the template renders them) and a tool turn; all
// of its output is text.
func TestChatToolChoiceNone(t *testing.T) {
	m := &letterModel{ctxLen: 64}
	cl := genServer(t, m, Limits{MaxItemsPerRequest: 2, MaxItemBytes: 1 << 10})
	req := toolChat(&brokerv1.ChatRequest{ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE, Sampling: &brokerv1.SamplingParams{MaxTokens: 3}},
		&brokerv1.ChatMessage{Role: "user", Content: "x"},
		&brokerv1.ChatMessage{Role: "assistant", ToolCalls: []*brokerv1.ToolCall{{Id: "call_1", Name: "f", Arguments: `{"a": 1}`}}},
		&brokerv1.ChatMessage{Role: "tool", ToolCallId: "call_1", Content: "1"})
	st, err := cl.Chat(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := readAll(t, 1, func() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error) {
		m, err := st.Recv()
		return m.GetDeltas(), m.GetResults(), err
	})
	if err != nil {
		t.Fatal(err)
	}
	if r := got.results[0]; r.GetFinishReason() != brokerv1.FinishReason_FINISH_REASON_LENGTH || len(got.text[0]) != 3 {
		t.Errorf("result %v, text %q", r, got.text[0])
	}
}

func TestGenerateRPCMaxTimeAndCancel(t *testing.T) {
	// 4000 tokens at 2 ms or more each: 8 s or more, far past max_time (1 s),
	// which is itself far past the first token's few milliseconds.
	m := &letterModel{ctxLen: 4096, step: 2 * time.Millisecond}
	cl := genServer(t, m, Limits{MaxItemsPerRequest: 8, MaxItemBytes: 1 << 10})
	st, err := cl.Generate(t.Context(), &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"a"},
		Sampling: &brokerv1.SamplingParams{MaxTokens: 4000}, MaxTime: durationpb.New(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := readAll(t, 1, func() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error) {
		m, err := st.Recv()
		return m.GetDeltas(), m.GetResults(), err
	})
	if err != nil {
		t.Fatal(err)
	}
	r := got.results[0]
	if r.GetFinishReason() != brokerv1.FinishReason_FINISH_REASON_DEADLINE || r.GetUsage().GetCompletionTokens() == 0 ||
		int(r.GetUsage().GetCompletionTokens()) != len(got.ids[0]) || len(got.text[0]) != len(got.ids[0]) {
		t.Errorf("max_time: %v; %d ids, text %q", r, len(got.ids[0]), got.text[0])
	}

	// A client that goes away frees its sequences' cache.
	ctx, cancel := context.WithCancel(t.Context())
	st, err = cl.Generate(ctx, &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"a", "b"}, Sampling: &brokerv1.SamplingParams{MaxTokens: 4000}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for m.held() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sequences still hold cache after the client left", m.held())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestGenerateNoLimit: a request without max_tokens runs to the end of the
// model's context (finish reason length, every remaining position used),
// as Ollama and OpenAI do, unless the model sets a default bound
// (generation_config.json's max_new_tokens).
func TestGenerateNoLimit(t *testing.T) {
	for _, tc := range []struct {
		name        string
		defMax, max int32
		want        int
	}{
		{name: "to the context", want: 40 - 4},
		{name: "the model's default", defMax: 5, want: 5},
		{name: "the model's default past the context", defMax: 100, want: 40 - 4},
		{name: "the request's bound", defMax: 5, max: 7, want: 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &letterModel{ctxLen: 40, defMax: int(tc.defMax)}
			cl := genServer(t, m, Limits{MaxItemsPerRequest: 8, MaxItemBytes: 1 << 10})
			st, err := cl.Generate(t.Context(), &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"abc"}, Sampling: &brokerv1.SamplingParams{MaxTokens: tc.max}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := readAll(t, 1, func() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error) {
				m, err := st.Recv()
				return m.GetDeltas(), m.GetResults(), err
			})
			if err != nil {
				t.Fatal(err)
			}
			r := got.results[0]
			if r.GetFinishReason() != brokerv1.FinishReason_FINISH_REASON_LENGTH || int(r.GetUsage().GetCompletionTokens()) != tc.want ||
				got.text[0] != letters('c', tc.want) {
				t.Errorf("result %v, text %q; want %d tokens", r, got.text[0], tc.want)
			}
		})
	}
}

// TestChatTruncateHistory: with truncate_history (Ollama's chat), a
// conversation over the context keeps its system messages and the most
// turns that fit, from any message but a tool's result on; without it, or
// when its last message on does not fit, it is INVALID_ARGUMENT.
func TestChatTruncateHistory(t *testing.T) {
	msg := func(role, content string) *brokerv1.ChatMessage {
		return &brokerv1.ChatMessage{Role: role, Content: content}
	}
	// "<role>content\n" a message, "<assistant>" the generation prompt.
	long := []*brokerv1.ChatMessage{
		msg("system", "be brief"),       // 17 bytes
		msg("user", "first question"),   // 21
		msg("assistant", "first reply"), // 23
		msg("user", "second"),           // 13
		msg("assistant", "ok"),          // 14
		msg("user", "third"),            // 12
	}
	for _, tc := range []struct {
		name     string
		ctx      int
		msgs     []*brokerv1.ChatMessage
		truncate bool
		prompt   int32 // prompt tokens; 0: INVALID_ARGUMENT
	}{
		{"fits", 64, long[3:], false, 13 + 14 + 12 + 11},
		{"over, not truncated", 64, long, false, 0},
		// Dropping the first exchange leaves 17+13+14+12+11 = 67.
		{"over, the first exchange dropped", 68, long, true, 17 + 13 + 14 + 12 + 11},
		// 67 is over 64 too: from the last reply on.
		{"over, from the last reply on", 64, long, true, 17 + 14 + 12 + 11},
		// An agent's transcript has one user message: it is cut at a
		// call, never at a tool's result.
		{"an agent's transcript", 64, []*brokerv1.ChatMessage{msg("system", "be brief"), msg("user", "task"), msg("assistant", "call a"),
			msg("tool", "result one is long"), msg("assistant", "call b"), msg("tool", "r2")}, true, 17 + 18 + 9 + 11},
		{"the last question alone is over", 64, []*brokerv1.ChatMessage{msg("system", "be brief"), msg("user", strings.Repeat("q", 60))}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := genServer(t, &letterModel{ctxLen: tc.ctx, defMax: 1}, Limits{MaxItemsPerRequest: 8, MaxItemBytes: 1 << 10})
			got, err := chatOnce(t, cl, &brokerv1.ChatRequest{Model: "tiny", TruncateHistory: tc.truncate,
				Conversations: []*brokerv1.Conversation{{Messages: tc.msgs}}})
			if answered(t, err, tc.prompt != 0) && got.results[0].GetUsage().GetPromptTokens() != tc.prompt {
				t.Fatalf("prompt of %d tokens, want %d", got.results[0].GetUsage().GetPromptTokens(), tc.prompt)
			}
		})
	}
}

// TestChatContinueFinalMessage: continue_final_message continues the last
// (assistant) message, the template's text cut after its content, as
// transformers and vLLM do; add_generation_prompt false leaves the
// generation prompt out; what cannot be continued is INVALID_ARGUMENT.
func TestChatContinueFinalMessage(t *testing.T) {
	cl := genServer(t, &letterModel{ctxLen: 64, defMax: 3}, Limits{MaxItemsPerRequest: 8, MaxItemBytes: 1 << 10})
	msg := func(role, content string) *brokerv1.ChatMessage {
		return &brokerv1.ChatMessage{Role: role, Content: content}
	}
	prefill := []*brokerv1.ChatMessage{msg("user", "hi"), msg("assistant", "{ab")}
	for _, tc := range []struct {
		name   string
		msgs   []*brokerv1.ChatMessage
		addGen *bool
		cont   bool
		prompt int32 // prompt tokens; 0: INVALID_ARGUMENT
		text   string
	}{
		// "<user>hi\n<assistant>{ab" and the letters after b.
		{"continued", prefill, nil, true, 9 + 14, letters('b', 3)},
		{"continued, add_generation_prompt false", prefill, proto.Bool(false), true, 9 + 14, letters('b', 3)},
		// A new turn: "<user>hi\n<assistant>{ab\n<assistant>".
		{"a new turn", prefill, nil, false, 9 + 15 + 11, letters('>', 3)},
		{"no generation prompt", []*brokerv1.ChatMessage{msg("user", "hi")}, proto.Bool(false), false, 9, letters('\n', 3)},
		{"both", prefill, proto.Bool(true), true, 0, ""},
		{"a user message last", []*brokerv1.ChatMessage{msg("user", "hi")}, nil, true, 0, ""},
		// "<user>hi\n<assistant> ": the space continued (a content
		// looked up in the text, trimmed, was not found).
		{"a space", []*brokerv1.ChatMessage{msg("user", "hi"), msg("assistant", " ")}, nil, true, 9 + 12, letters(' ', 3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chatOnce(t, cl, &brokerv1.ChatRequest{Model: "tiny", AddGenerationPrompt: tc.addGen, ContinueFinalMessage: tc.cont,
				Conversations: []*brokerv1.Conversation{{Messages: tc.msgs}}})
			if answered(t, err, tc.prompt != 0) && (got.results[0].GetUsage().GetPromptTokens() != tc.prompt || got.text[0] != tc.text) {
				t.Fatalf("prompt of %d tokens, %q; want %d, %q", got.results[0].GetUsage().GetPromptTokens(), got.text[0], tc.prompt, tc.text)
			}
		})
	}
	// A constraint would start over after the prefill.
	_, err := chatOnce(t, cl, &brokerv1.ChatRequest{Model: "tiny", ContinueFinalMessage: true,
		Sampling:      &brokerv1.SamplingParams{Constraint: &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON}},
		Conversations: []*brokerv1.Conversation{{Messages: prefill}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("continue_final_message with a constraint: %v, want INVALID_ARGUMENT", err)
	}
}

// TestGenerateN: n answers per prompt or conversation, indexed i·n+j, the
// j-th seeded with seed+j; prompts times n is bounded by
// --max-items-per-request.
func TestGenerateN(t *testing.T) {
	m := &letterModel{ctxLen: 64, defMax: 3}
	cl := genServer(t, m, Limits{MaxItemsPerRequest: 6, MaxItemBytes: 1 << 10})
	ctx := t.Context()
	read := func(n int, recv func() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error)) streamed {
		t.Helper()
		got, err := readAll(t, n, recv)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	prompts := []string{"abc", "x"}
	st, err := cl.Generate(ctx, &brokerv1.GenerateRequest{Model: "tiny", Prompts: prompts, Sampling: &brokerv1.SamplingParams{N: 3, Seed: proto.Uint64(10)}})
	if err != nil {
		t.Fatal(err)
	}
	got := read(6, func() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error) {
		m, err := st.Recv()
		return m.GetDeltas(), m.GetResults(), err
	})
	for k := range 6 {
		p := prompts[k/3]
		if want := letters(p[len(p)-1], 3); got.text[k] != want || got.results[k] == nil {
			t.Errorf("answer %d: %q, want %q (prompt %d's)", k, got.text[k], want, k/3)
		}
	}
	m.mu.Lock()
	seeds := slices.Sorted(slices.Values(m.seeds))
	m.seeds = nil
	m.mu.Unlock()
	if !slices.Equal(seeds, []uint64{10, 10, 11, 11, 12, 12}) {
		t.Errorf("seeds %v, want 10, 11 and 12 for each prompt", seeds)
	}
	chat, err := chatOnce(t, cl, &brokerv1.ChatRequest{Model: "tiny", Sampling: &brokerv1.SamplingParams{N: 2},
		Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "hi"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if chat.results[0] == nil || chat.results[1] == nil || chat.text[0] != chat.text[1] || chat.text[0] == "" {
		t.Errorf("chat answers %q", chat.text)
	}
	for _, tc := range []struct {
		name string
		n    int32
		ps   int
	}{{"over the limit", 4, 2}, {"negative", -1, 1}} {
		st, err := cl.Generate(ctx, &brokerv1.GenerateRequest{Model: "tiny", Prompts: make([]string, tc.ps), Sampling: &brokerv1.SamplingParams{N: tc.n}})
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", tc.name, err)
		}
	}
}

// chatOnce runs a chat of one conversation (its n answers) and reads
// every answer; the error is the call's.
func chatOnce(t *testing.T, cl brokerv1.BrokerServiceClient, req *brokerv1.ChatRequest) (streamed, error) {
	t.Helper()
	st, err := cl.Chat(t.Context(), req)
	if err != nil {
		return streamed{}, err
	}
	return readAll(t, max(int(req.GetSampling().GetN()), 1), func() ([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult, error) {
		m, err := st.Recv()
		return m.GetDeltas(), m.GetResults(), err
	})
}

// answered checks a call that should be answered (ok) or refused with
// INVALID_ARGUMENT, and says whether its answer is there to check.
func answered(t *testing.T, err error, ok bool) bool {
	t.Helper()
	switch {
	case !ok && status.Code(err) != codes.InvalidArgument:
		t.Fatalf("%v, want INVALID_ARGUMENT", err)
	case ok && err != nil:
		t.Fatal(err)
	}
	return ok
}
