// Package output is the text-level end of a generated sequence's pipeline
// in the server: after the engine's sampler has detokenised a token and
// matched the stop strings, the text passes through parsers that take out
// what is not the answer. Thinking is the first: a thinking model's
// reasoning (Qwen3's <think>…</think>) goes apart from its content.
// ToolCalls follows it on the content: calls of tools go apart too.
// Nothing here runs on the engine's step path: it is per sequence, on the
// edge's goroutine.
package output

import (
	"strings"
	"unicode"
)

// Tags are a thinking block's markers. Each starts with a character that
// is not whitespace (the parsers rely on it: whitespace held before a tag
// is never a part of the tag).
type Tags struct{ Open, Close string }

// Qwen3Tags are Qwen3's (and DeepSeek-R1's) thinking markers.
var Qwen3Tags = Tags{Open: "<think>", Close: "</think>"}

// Split is a piece of output: the answer's text and the reasoning's.
type Split struct{ Content, Reasoning string }

type thinkState int

const (
	beforeThinking thinkState = iota // nothing yet: a block may open (after whitespace)
	thinking                         // inside the block
	afterThinking                    // the block closed: whitespace before the answer is dropped
	answering                        // everything is content
)

// Thinking splits a sequence's text, as it streams in pieces cut anywhere
// (a tag may straddle pieces), into content and reasoning. The reasoning
// is what lies between the open tag at the output's start and the close
// tag, without the whitespace around it; the content is what follows, its
// leading whitespace dropped (as Ollama's parser does). Text that does not
// open with the tag is all content, as is any later tag. A prompt that
// ends inside an open block (a template that opens it, as Qwen3's
// thinking-only models do) starts the sequence in the block.
//
// Text that could still be part of a tag, or whitespace that a tag
// following it would drop, is held until the next piece decides it, so
// nothing of a tag ever reaches either side.
type Thinking struct {
	tags  Tags
	state thinkState
	// What is held is ws then part: whitespace that a tag following it
	// would drop, then a proper prefix of the tag (or nothing). The
	// whitespace waits apart, only appended to, so that a long run of it
	// costs linear work: a push scans part and its own text, never ws.
	ws      heldSpace
	part    string
	started bool // the block's reasoning began: its leading whitespace is behind
}

// NewThinking returns a parser; inBlock says the prompt left a block open.
func NewThinking(tags Tags, inBlock bool) *Thinking {
	p := &Thinking{tags: tags}
	if inBlock {
		p.state = thinking
	}
	return p
}

// PromptOpensBlock reports whether a rendered prompt ends inside an open
// thinking block: the open tag after the last close tag, followed only by
// whitespace.
func PromptOpensBlock(tags Tags, prompt string) bool {
	rest := strings.TrimRightFunc(prompt, unicode.IsSpace)
	return strings.HasSuffix(rest, tags.Open)
}

// PromptClosesBlock reports whether a rendered prompt ends with a closed
// thinking block (the empty one a template writes with thinking off),
// followed only by whitespace.
func PromptClosesBlock(tags Tags, prompt string) bool {
	rest := strings.TrimRightFunc(prompt, unicode.IsSpace)
	return strings.HasSuffix(rest, tags.Close)
}

// PushTokens is Push for the text of generated tokens, and says whether
// the tokens belong to the thinking: inside the block, or opening or
// closing it (what OpenAI counts as reasoning tokens).
func (p *Thinking) PushTokens(text string) (Split, bool) {
	before := p.state
	out := p.Push(text)
	opened := before == beforeThinking && (p.state == thinking || p.state == afterThinking)
	return out, before == thinking || opened
}

// Push adds a piece of text and returns what is decided.
func (p *Thinking) Push(text string) Split {
	var out Split
	s := p.part + text
	p.part = ""
	for s != "" {
		switch p.state {
		case beforeThinking:
			body := strings.TrimLeftFunc(s, unicode.IsSpace)
			switch {
			case strings.HasPrefix(body, p.tags.Open):
				s = body[len(p.tags.Open):]
				p.ws.Reset()
				p.state = thinking
			case strings.HasPrefix(p.tags.Open, body):
				// Whitespace or a part of the tag: wait.
				p.ws.WriteString(s[:len(s)-len(body)])
				p.part = body
				return out
			default:
				s = p.ws.take() + s
				p.state = answering
			}
		case thinking:
			if !p.started {
				if s = strings.TrimLeftFunc(s, unicode.IsSpace); s == "" {
					return out
				}
				p.started = true
			}
			if i := strings.Index(s, p.tags.Close); i >= 0 {
				p.ws.add(&out.Reasoning, s[:i])
				p.ws.Reset() // the reasoning's trailing whitespace goes
				s = s[i+len(p.tags.Close):]
				p.state = afterThinking
				continue
			}
			n := tagPrefix(s, p.tags.Close)
			p.ws.add(&out.Reasoning, s[:len(s)-n])
			p.part = s[len(s)-n:]
			return out
		case afterThinking:
			s = strings.TrimLeftFunc(s, unicode.IsSpace)
			if s == "" {
				return out
			}
			p.state = answering
		case answering:
			out.Content += s
			return out
		}
	}
	return out
}

// Flush returns what is held when the sequence ends: an unfinished tag or
// whitespace is the side's own text after all (trailing whitespace of the
// reasoning excepted).
func (p *Thinking) Flush() Split {
	var out Split
	switch p.state {
	case beforeThinking, answering:
		out.Content = p.ws.take() + p.part
	case thinking:
		p.ws.add(&out.Reasoning, p.part)
	}
	p.ws.Reset()
	p.part = ""
	return out
}

// tagPrefix is the length of the longest suffix of s that is a proper
// prefix of tag: a tag the next piece may complete. It looks only at the
// last len(tag)-1 bytes of s.
func tagPrefix(s, tag string) int {
	for k := min(len(tag)-1, len(s)); k > 0; k-- {
		if strings.HasSuffix(s, tag[:k]) {
			return k
		}
	}
	return 0
}

// heldSpace is whitespace held back from one side of the output because a
// tag following it would drop it. A model may write a long run of
// whitespace in many pieces: it is appended to, never copied or scanned
// again, so that the run costs linear work.
type heldSpace struct{ strings.Builder }

// add decides text that follows the held whitespace: when text is more
// than whitespace, the held whitespace and text up to its own trailing
// whitespace go to *out, and that trailing whitespace is held instead;
// when it is only whitespace, it is held too. Only text is scanned.
func (h *heldSpace) add(out *string, text string) {
	body := strings.TrimRightFunc(text, unicode.IsSpace)
	if body != "" {
		*out += h.take() + body
	}
	h.WriteString(text[len(body):])
}

// take returns the held whitespace and holds none.
func (h *heldSpace) take() string {
	s := h.String()
	h.Reset()
	return s
}
