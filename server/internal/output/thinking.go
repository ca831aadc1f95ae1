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

// Tags are a thinking block's markers.
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
	tags    Tags
	state   thinkState
	held    string
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

// Push adds a piece of text and returns what is decided.
func (p *Thinking) Push(text string) Split {
	var out Split
	s := p.held + text
	p.held = ""
	for s != "" {
		switch p.state {
		case beforeThinking:
			body := strings.TrimLeftFunc(s, unicode.IsSpace)
			switch {
			case strings.HasPrefix(body, p.tags.Open):
				s = body[len(p.tags.Open):]
				p.state = thinking
			case strings.HasPrefix(p.tags.Open, body):
				p.held = s // whitespace or a part of the tag: wait
				return out
			default:
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
				out.Reasoning += strings.TrimRightFunc(s[:i], unicode.IsSpace)
				s = s[i+len(p.tags.Close):]
				p.state = afterThinking
				continue
			}
			keep := holdBack(s, p.tags.Close)
			out.Reasoning += s[:len(s)-keep]
			p.held = s[len(s)-keep:]
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
	s := p.held
	p.held = ""
	switch p.state {
	case beforeThinking, answering:
		return Split{Content: s}
	case thinking:
		return Split{Reasoning: strings.TrimRightFunc(s, unicode.IsSpace)}
	}
	return Split{}
}

// holdBack is how many bytes at the end of s to keep back: trailing
// whitespace (a close tag after it would drop it) and a proper prefix of
// tag that may complete with the next piece.
func holdBack(s, tag string) int {
	n := 0
	for k := min(len(tag)-1, len(s)); k > 0; k-- {
		if strings.HasSuffix(s, tag[:k]) {
			n = k
			break
		}
	}
	rest := s[:len(s)-n]
	trimmed := strings.TrimRightFunc(rest, unicode.IsSpace)
	// Both are whole characters (a tag's prefix starts with its ASCII
	// first byte), so both sides stay UTF-8.
	return n + len(rest) - len(trimmed)
}
