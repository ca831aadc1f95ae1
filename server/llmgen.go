package server

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/brokerd/brokerd/lifecycle"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/server/internal/output"
)

// generator is what Generate and Chat run for sv: its decoder LLM, nil for
// other models.
func (d DataPlane) generator(sv *lifecycle.Served) generator {
	if d.testGenerator != nil {
		return d.testGenerator(sv)
	}
	if sv.LLM() == nil {
		return nil
	}
	return llmGenerator{sv.LLM()}
}

// llmGenerator adapts *llm.Model to what Generate and Chat need.
type llmGenerator struct{ m *llm.Model }

func (g llmGenerator) ContextLength() int    { return g.m.ContextLength() }
func (g llmGenerator) SystemPrompt() string  { return g.m.SystemPrompt() }
func (g llmGenerator) DefaultMaxTokens() int { return g.m.DefaultMaxTokens() }
func (g llmGenerator) EncodePrompt(text string, addSpecial bool) ([]int32, error) {
	return g.m.Encode(text, addSpecial)
}

func (g llmGenerator) DefaultSampling() llm.Sampling { return g.m.DefaultSampling() }
func (g llmGenerator) VocabSize() int                { return g.m.VocabSize() }
func (g llmGenerator) TokenBytes(id int32) []byte    { return g.m.TokenBytes(id) }

func (g llmGenerator) RenderChat(ctx context.Context, msgs []llm.Message, opts llm.ChatOptions) (string, error) {
	return g.m.RenderChat(ctx, msgs, opts)
}

// ToolFormat: Qwen2.5's and Qwen3's vocabularies have <tool_call> and
// </tool_call> as tokens of their own (Hermes calls); Llama 3.1's and
// 3.2's have <|python_tag|> (JSON calls).
func (g llmGenerator) ToolFormat() output.ToolFormat {
	single := func(tags ...string) bool {
		for _, tag := range tags {
			if ids, err := g.m.Encode(tag, false); err != nil || len(ids) != 1 {
				return false
			}
		}
		return true
	}
	switch {
	case single(output.HermesTags.Open, output.HermesTags.Close):
		return output.Hermes
	case single(output.PythonTag):
		return output.Llama3JSON
	}
	return output.NoToolFormat
}

// ThinkTags: a model thinks when its vocabulary has Qwen3's (and
// DeepSeek-R1's) thinking markers as tokens of their own, as Qwen3's
// tokenizer adds them; Qwen2.5's and Llama 3's split them into pieces.
func (g llmGenerator) ThinkTags() (output.Tags, bool) {
	tags := output.Qwen3Tags
	for _, tag := range []string{tags.Open, tags.Close} {
		if ids, err := g.m.Encode(tag, false); err != nil || len(ids) != 1 {
			return output.Tags{}, false
		}
	}
	return tags, true
}

// NewSequence: p is the request's sampling over the model's defaults,
// validated by the edge (samplingFromProto).
func (g llmGenerator) NewSequence(ctx context.Context, p llm.Sampling, prompt []int32) (genSequence, error) {
	seq, err := g.m.NewSequenceContext(ctx, p, prompt)
	if err != nil {
		return nil, err
	}
	return llmSequence{s: seq, m: g.m}, nil
}

// llmSequence adapts *llm.Sequence.
type llmSequence struct {
	s *llm.Sequence
	m *llm.Model // the tokens' text of logprobs
}

func (q llmSequence) State() any    { return q.s }
func (q llmSequence) Flush() string { return q.s.Flush().Text }
func (q llmSequence) Delta(out any) (genDelta, error) {
	d, ok := out.(llm.Delta)
	if !ok {
		return genDelta{}, fmt.Errorf("a generation step returned %T, want llm.Delta", out)
	}
	gd := genDelta{Text: d.Text, TokenIDs: d.TokenIDs}
	for _, lp := range d.Logprobs {
		e := &brokerv1.LogprobEntry{Chosen: q.tokenLogprob(lp.TokenLogprob)}
		for _, alt := range lp.Top {
			e.Top = append(e.Top, q.tokenLogprob(alt))
		}
		gd.Logprobs = append(gd.Logprobs, e)
	}
	return gd, nil
}

func (q llmSequence) tokenLogprob(t llm.TokenLogprob) *brokerv1.TokenLogprob {
	b := q.m.TokenBytes(t.Token)
	return &brokerv1.TokenLogprob{TokenId: t.Token, Logprob: t.Logprob, Text: tokenText(b), Bytes: b}
}

// tokenText is a token's text in a logprob: its bytes when they are
// UTF-8, else (a part of a character split across tokens) "bytes:" and
// the bytes escaped, as vLLM writes them.
func tokenText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var s strings.Builder
	s.WriteString("bytes:")
	for _, c := range b {
		fmt.Fprintf(&s, "\\x%02x", c)
	}
	return s.String()
}
