package client

import (
	"context"
	"errors"
	"io"
	"iter"
	"strings"

	"google.golang.org/grpc"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// Generate streams the answers to req's prompts: each value holds the
// deltas (text as it is sampled, tagged by prompt index) and, at the end of
// each prompt, its result with usage and timings. Stopping the loop early
// cancels the call and brokerd frees the sequences.
func (c *Client) Generate(ctx context.Context, req *brokerv1.GenerateRequest) iter.Seq2[*brokerv1.GenerateResponse, error] {
	return stream(ctx, func(ctx context.Context) (grpc.ServerStreamingClient[brokerv1.GenerateResponse], error) {
		return c.broker.Generate(ctx, req)
	})
}

// Chat is Generate for conversations rendered by the model's chat template.
func (c *Client) Chat(ctx context.Context, req *brokerv1.ChatRequest) iter.Seq2[*brokerv1.ChatResponse, error] {
	return stream(ctx, func(ctx context.Context) (grpc.ServerStreamingClient[brokerv1.ChatResponse], error) {
		return c.broker.Chat(ctx, req)
	})
}

func stream[T any](ctx context.Context, open func(context.Context) (grpc.ServerStreamingClient[T], error)) iter.Seq2[*T, error] {
	return func(yield func(*T, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // an early break ends the call on the server too
		st, err := open(ctx)
		if err != nil {
			yield(nil, wrap(err))
			return
		}
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				yield(nil, wrap(err))
				return
			}
			if !yield(m, nil) {
				return
			}
		}
	}
}

// delta is what GenerateResponse and ChatResponse share.
type delta interface {
	GetDeltas() []*brokerv1.GenerationDelta
	GetResults() []*brokerv1.GenerationResult
}

// Answer is one prompt's whole answer: its text, a thinking model's
// reasoning (apart from the text), a chat's calls of its tools (apart
// from the text, in order; the result's finish reason is
// FINISH_REASON_TOOL_CALLS when the model stopped after calling), its
// token ids, their logprobs (with each token's text and the alternatives
// asked for by SamplingParams.top_logprobs) when SamplingParams.logprobs
// is set, and its result (finish reason, usage, timings). To feed a
// tool's result back, append a ChatMessage{Role: "assistant", Content:
// Text, ToolCalls: ToolCalls} and a ChatMessage{Role: "tool", Content:
// the result, ToolCallId: the call's id}.
type Answer struct {
	Text, Reasoning string
	ToolCalls       []*brokerv1.ToolCall
	TokenIDs        []int32
	Logprobs        []*brokerv1.LogprobEntry
	Result          *brokerv1.GenerationResult
}

// Answers collects a Generate or Chat stream into each prompt's Answer,
// by index.
func Answers[T delta](seq iter.Seq2[T, error]) ([]Answer, error) {
	var out []*answer
	at := func(i int32) (*answer, error) {
		if i < 0 || i > 1<<16 {
			return nil, errors.New("client: brokerd sent a delta with a bad index")
		}
		for len(out) <= int(i) {
			out = append(out, &answer{})
		}
		return out[i], nil
	}
	for m, err := range seq {
		if err != nil {
			return nil, err
		}
		for _, d := range m.GetDeltas() {
			a, err := at(d.GetIndex())
			if err != nil {
				return nil, err
			}
			a.text.WriteString(d.GetText())
			a.reasoning.WriteString(d.GetReasoning())
			a.ToolCalls = append(a.ToolCalls, d.GetToolCalls()...)
			a.TokenIDs = append(a.TokenIDs, d.GetTokenIds()...)
			a.Logprobs = append(a.Logprobs, d.GetLogprobs()...)
		}
		for _, r := range m.GetResults() {
			a, err := at(r.GetIndex())
			if err != nil {
				return nil, err
			}
			a.Result = r
		}
	}
	res := make([]Answer, len(out))
	for i, a := range out {
		res[i] = a.Answer
		res[i].Text, res[i].Reasoning = a.text.String(), a.reasoning.String()
	}
	return res, nil
}

type answer struct {
	Answer
	text, reasoning strings.Builder
}

// Text collects a Generate or Chat stream into the whole text of each
// prompt, by index.
func Text[T delta](seq iter.Seq2[T, error]) ([]string, error) {
	var texts []*strings.Builder
	for m, err := range seq {
		if err != nil {
			return nil, err
		}
		for _, d := range m.GetDeltas() {
			i := int(d.GetIndex())
			if i < 0 || i > 1<<16 {
				return nil, errors.New("client: brokerd sent a delta with a bad index")
			}
			for len(texts) <= i {
				texts = append(texts, &strings.Builder{})
			}
			texts[i].WriteString(d.GetText())
		}
	}
	out := make([]string, len(texts))
	for i := range texts {
		out[i] = texts[i].String()
	}
	return out, nil
}
