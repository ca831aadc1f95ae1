package output

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode"
)

// ToolFormat is how a model writes its calls of tools.
type ToolFormat int

const (
	// NoToolFormat: the model has no format brokerd parses.
	NoToolFormat ToolFormat = iota
	// Hermes is Qwen2.5's and Qwen3's (NousResearch's Hermes format):
	// each call is <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
	// several per answer, text around them.
	Hermes
	// Llama3JSON is Llama 3.1's and 3.2's custom tools: the answer is a
	// JSON object {"name": ..., "parameters": {...}} (after the
	// <|python_tag|> token, when the model writes it), or several joined
	// by ";".
	Llama3JSON
	// ForcedJSON is a constrained answer that is calls and nothing else,
	// as vLLM constrains tool_choice "required" and a named function: a
	// JSON array of {"name": ..., "parameters": {...}} (required), or the
	// arguments object of one function (NewForcedCall). Held to the end.
	ForcedJSON
)

func (f ToolFormat) String() string {
	switch f {
	case Hermes:
		return "hermes"
	case Llama3JSON:
		return "llama3_json"
	case ForcedJSON:
		return "forced_json"
	}
	return "none"
}

// HermesTags are the markers of a Hermes call (tokens of their own in
// Qwen2.5's and Qwen3's vocabularies).
var HermesTags = Tags{Open: "<tool_call>", Close: "</tool_call>"}

// PythonTag is the token Llama 3.1 writes before a call (a special token:
// it is usually not in the text at all).
const PythonTag = "<|python_tag|>"

// Call is a call of a function parsed from the output.
type Call struct {
	Name string
	// Arguments is a JSON object's text, as the model wrote it (keys in its
	// order) without insignificant whitespace.
	Arguments string
}

// Piece is what a push decided: content, and calls that ended in it.
type Piece struct {
	Content string
	Calls   []Call
}

type toolState int

const (
	toolContent    toolState = iota // text: a call may open
	toolInCall                      // inside <tool_call>: held until it closes
	toolAfter                       // a call closed: whitespace before more is dropped
	toolLlamaStart                  // Llama: nothing decided yet (whitespace, the python tag)
	toolLlamaJSON                   // Llama: the answer opened with "{": held to the end
	toolForced                      // a constrained answer: held to the end
	toolPlain                       // everything is content
)

// ToolCalls takes a sequence's calls of tools out of its content, as text
// streams in pieces cut anywhere. What is not a call stays content; a
// call that does not parse (not JSON, no name, arguments that are not an
// object) stays content too, as vLLM's parsers leave it. Whitespace
// between content and a call, or between calls, is dropped.
//
// Hermes: text before, between and after calls streams as it comes
// (holding only what a tag or the whitespace before one could claim); a
// call is decided when its close tag arrives, or at the end when the
// model stopped inside it (vLLM parses an unclosed last call too).
//
// Llama3JSON: an answer that opens with "{" (after whitespace and the
// python tag) is held to the end, then parsed as calls; any other answer
// is content as it comes, as vLLM's llama3_json parser decides.
type ToolCalls struct {
	format ToolFormat
	forced string // ForcedJSON of one function: its name
	state  toolState
	held   string // undecided text: a part of a tag
	// ws is whitespace held apart from held, only appended to, so that a
	// long run of it costs linear work: Hermes content's trailing
	// whitespace, dropped if a call follows; Llama's leading whitespace,
	// before the answer is decided.
	ws      heldSpace
	call    strings.Builder
	maxCall int
}

// maxHeldCall bounds the text of one call held while it is open (the
// sequence's own length bounds it too): past it, it is content.
const maxHeldCall = 1 << 20

// NewToolCalls returns a parser of format's calls (NoToolFormat: all is
// content).
func NewToolCalls(format ToolFormat) *ToolCalls {
	p := &ToolCalls{format: format, maxCall: maxHeldCall}
	switch format {
	case Hermes:
		p.state = toolContent
	case Llama3JSON:
		p.state = toolLlamaStart
	case ForcedJSON:
		p.state = toolForced
	default:
		p.state = toolPlain
	}
	return p
}

// NewForcedCall returns a parser of a constrained answer that is the
// arguments object of the function name (ForcedJSON).
func NewForcedCall(name string) *ToolCalls {
	p := NewToolCalls(ForcedJSON)
	p.forced = name
	return p
}

// Push adds a piece of text and returns what is decided.
func (p *ToolCalls) Push(text string) Piece {
	var out Piece
	s := p.held + text
	p.held = ""
	for s != "" {
		switch p.state {
		case toolPlain:
			out.Content += s
			return out
		case toolContent:
			if i := strings.Index(s, HermesTags.Open); i >= 0 {
				p.content(&out, s[:i])
				s = s[i+len(HermesTags.Open):]
				p.state = toolInCall
				p.call.Reset()
				continue
			}
			// What is held is whitespace then a part of the tag (or only
			// whitespace): the whitespace waits in ws, the part in held.
			n := tagPrefix(s, HermesTags.Open)
			p.content(&out, s[:len(s)-n])
			p.held = s[len(s)-n:]
			return out
		case toolInCall:
			// What is in p.call cannot hold the close tag whole: only the
			// tail of it with s can, so only that is searched.
			from := max(p.call.Len()-len(HermesTags.Close)+1, 0)
			p.call.WriteString(s)
			c := p.call.String() // the builder's bytes, not a copy
			if i := strings.Index(c[from:], HermesTags.Close); i >= 0 {
				i += from
				p.endCall(&out, c[:i], true)
				s = c[i+len(HermesTags.Close):]
				continue
			}
			if len(c) > p.maxCall {
				// Not a call anyone would send: it is text after all.
				out.Content += p.ws.take() + HermesTags.Open + c
				p.call.Reset()
				p.state = toolPlain
			}
			return out
		case toolAfter:
			s = strings.TrimLeftFunc(s, unicode.IsSpace)
			if s == "" {
				return out
			}
			p.state = toolContent
		case toolLlamaStart:
			// What is held is whitespace (in ws) then a part of the python
			// tag or the tag (in held).
			body := strings.TrimLeftFunc(s, unicode.IsSpace)
			switch {
			case strings.HasPrefix(body, PythonTag):
				p.ws.Reset() // whitespace before the tag goes
				s = strings.TrimLeftFunc(body[len(PythonTag):], unicode.IsSpace)
				if s == "" {
					// The tag alone: what follows decides.
					p.held = body[:len(PythonTag)]
					return out
				}
				if s[0] != '{' {
					p.state = toolPlain
					s = body // the tag is the text's, as the model wrote it
					continue
				}
				p.call.Reset()
				p.call.WriteString(body)
				p.state = toolLlamaJSON
				return out
			case body == "" || strings.HasPrefix(PythonTag, body):
				p.ws.WriteString(s[:len(s)-len(body)])
				p.held = body
				return out
			case body[0] == '{':
				p.call.Reset()
				p.call.WriteString(p.ws.take())
				p.call.WriteString(s)
				p.state = toolLlamaJSON
				return out
			default:
				s = p.ws.take() + s
				p.state = toolPlain
			}
		case toolLlamaJSON, toolForced:
			if p.call.Len()+len(s) > p.maxCall {
				out.Content += p.call.String() + s
				p.call.Reset()
				p.state = toolPlain
				return out
			}
			p.call.WriteString(s)
			return out
		}
	}
	return out
}

// content adds text to the output, holding its trailing whitespace back
// (a call may follow).
func (p *ToolCalls) content(out *Piece, s string) {
	p.ws.add(&out.Content, s)
}

// endCall decides a Hermes call's body (closed: its close tag came).
func (p *ToolCalls) endCall(out *Piece, body string, closed bool) {
	p.call.Reset()
	if c, ok := parseHermes(body); ok {
		out.Calls = append(out.Calls, c)
		p.ws.Reset()
		p.state = toolAfter
		return
	}
	out.Content += p.ws.take() + HermesTags.Open + body
	if closed {
		out.Content += HermesTags.Close
	}
	p.state = toolContent
}

// Flush returns what is held when the sequence ends.
func (p *ToolCalls) Flush() Piece {
	var out Piece
	s := p.held
	p.held = ""
	switch p.state {
	case toolContent, toolPlain, toolLlamaStart:
		out.Content = p.ws.take() + s
	case toolInCall:
		p.endCall(&out, p.call.String(), false)
	case toolLlamaJSON:
		text := p.call.String()
		if calls, ok := parseLlama(text); ok {
			out.Calls = calls
		} else {
			out.Content = text
		}
	case toolForced:
		text := p.call.String()
		if calls, ok := p.parseForced(text); ok {
			out.Calls = calls
		} else {
			out.Content = text // cut short (length, deadline): not a call
		}
	}
	p.ws.Reset()
	p.call.Reset()
	p.state = toolPlain
	return out
}

// parseForced reads a constrained answer: the forced function's
// arguments, or an array of {"name", "parameters"} (vLLM's required).
func (p *ToolCalls) parseForced(text string) ([]Call, bool) {
	if p.forced != "" {
		c, ok := call(p.forced, json.RawMessage(strings.TrimSpace(text)))
		if !ok || strictDecode(text, new(json.RawMessage)) != nil {
			return nil, false
		}
		return []Call{c}, true
	}
	var list []struct {
		Name       *string         `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
		Arguments  json.RawMessage `json:"arguments"`
	}
	if err := strictDecode(text, &list); err != nil || len(list) == 0 {
		return nil, false
	}
	calls := make([]Call, len(list))
	for i, v := range list {
		if v.Name == nil || *v.Name == "" {
			return nil, false
		}
		args := v.Parameters
		if args == nil {
			args = v.Arguments
		}
		c, ok := call(*v.Name, args)
		if !ok {
			return nil, false
		}
		calls[i] = c
	}
	return calls, true
}

// parseHermes reads {"name": ..., "arguments": {...}} (Qwen writes
// "arguments"; "parameters" is taken too); absent arguments are {}.
func parseHermes(body string) (Call, bool) {
	var v struct {
		Name       *string         `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if err := strictDecode(strings.TrimSpace(body), &v); err != nil || v.Name == nil || *v.Name == "" {
		return Call{}, false
	}
	args := v.Arguments
	if args == nil {
		args = v.Parameters
	}
	return call(*v.Name, args)
}

// parseLlama reads one or more {"name": ..., "parameters": {...}}
// objects ("arguments" is taken too), joined by ";" and whitespace, after
// an optional python tag; all of them must be calls.
func parseLlama(text string) ([]Call, bool) {
	text = strings.TrimSpace(text)
	text = strings.TrimSpace(strings.TrimPrefix(text, PythonTag))
	dec := json.NewDecoder(strings.NewReader(text))
	var calls []Call
	for {
		var v struct {
			Name       *string         `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
			Arguments  json.RawMessage `json:"arguments"`
		}
		if err := dec.Decode(&v); err != nil || v.Name == nil || *v.Name == "" {
			return nil, false
		}
		args := v.Parameters
		if args == nil {
			args = v.Arguments
		}
		c, ok := call(*v.Name, args)
		if !ok {
			return nil, false
		}
		calls = append(calls, c)
		rest := strings.TrimLeftFunc(text[dec.InputOffset():], unicode.IsSpace)
		if rest == "" {
			return calls, true
		}
		if rest[0] != ';' {
			return nil, false
		}
		rest = strings.TrimLeftFunc(rest[1:], unicode.IsSpace)
		if rest == "" {
			return calls, true
		}
		text = rest
		dec = json.NewDecoder(strings.NewReader(text))
	}
}

func call(name string, args json.RawMessage) (Call, bool) {
	if args == nil || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	if !bytes.HasPrefix(bytes.TrimSpace(args), []byte("{")) {
		return Call{}, false
	}
	var b bytes.Buffer
	if err := json.Compact(&b, args); err != nil {
		return Call{}, false
	}
	return Call{Name: name, Arguments: b.String()}, true
}

// strictDecode decodes exactly one JSON value from s.
func strictDecode(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if rest := strings.TrimSpace(s[dec.InputOffset():]); rest != "" {
		return &json.SyntaxError{Offset: dec.InputOffset()}
	}
	return nil
}
