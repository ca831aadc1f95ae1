package output

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// runTools feeds pieces through a parser and returns what came out, with
// every piece's content checked to be whole UTF-8.
func runTools(t *testing.T, f ToolFormat, pieces []string) Piece {
	t.Helper()
	p := NewToolCalls(f)
	var all Piece
	add := func(x Piece) {
		if !utf8.ValidString(x.Content) {
			t.Fatalf("pieces %q: content %q is not UTF-8", pieces, x.Content)
		}
		all.Content += x.Content
		all.Calls = append(all.Calls, x.Calls...)
	}
	for _, s := range pieces {
		add(p.Push(s))
	}
	add(p.Flush())
	return all
}

func TestToolCallsHermes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	weather := Call{Name: "get_weather", Arguments: `{"city":"Paris","unit":"c"}`}
	rome := Call{Name: "get_weather", Arguments: `{"city":"Rome"}`}
	for _, tc := range []struct {
		name    string
		text    string
		content string
		calls   []Call
	}{
		{name: "one call (Qwen's shape)", text: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>", calls: []Call{weather}},
		{name: "text, then two calls", text: "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>",
			content: "Let me check.", calls: []Call{weather, rome}},
		{name: "text after a call stays content", text: "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}</tool_call>\n\nDone, ünïcödé 🎨", content: "Done, ünïcödé 🎨", calls: []Call{rome}},
		{name: "no call", text: "Blue, surely.\n", content: "Blue, surely.\n"},
		{name: "a tag's look-alike", text: "Use <tool_calls> or <tool_> here  ", content: "Use <tool_calls> or <tool_> here  "},
		{name: "not JSON stays text", text: "A <tool_call>get_weather(Paris)</tool_call> B", content: "A <tool_call>get_weather(Paris)</tool_call> B"},
		{name: "no name stays text", text: "<tool_call>{\"arguments\": {}}</tool_call>", content: "<tool_call>{\"arguments\": {}}</tool_call>"},
		{name: "arguments not an object stay text", text: "<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>", content: "<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>"},
		{name: "trailing garbage stays text", text: "<tool_call>{\"name\": \"f\"} x</tool_call>", content: "<tool_call>{\"name\": \"f\"} x</tool_call>"},
		{name: "a malformed call between good ones", text: "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}</tool_call>\n<tool_call>{oops</tool_call>\n<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}</tool_call>",
			content: "<tool_call>{oops</tool_call>", calls: []Call{rome, rome}},
		{name: "no arguments are {}", text: "<tool_call>{\"name\": \"now\"}</tool_call>", calls: []Call{{Name: "now", Arguments: "{}"}}},
		{name: "parameters are taken for arguments", text: "<tool_call>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}</tool_call>", calls: []Call{rome}},
		{name: "an unclosed last call that parses (the model stopped)", text: "ok <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n", content: "ok", calls: []Call{rome}},
		{name: "an unclosed call that does not parse", text: "ok <tool_call>\n{\"name\": \"get_wea", content: "ok <tool_call>\n{\"name\": \"get_wea"},
		{name: "an unfinished open tag is text", text: "ok <tool_ca", content: "ok <tool_ca"},
		{name: "a close tag alone is text", text: "a </tool_call> b", content: "a </tool_call> b"},
		{name: "nothing", text: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, pieces := range splits(tc.text, rng) {
				got := runTools(t, Hermes, pieces)
				if got.Content != tc.content || !reflect.DeepEqual(got.Calls, tc.calls) {
					t.Fatalf("pieces %q: content %q calls %+v; want %q and %+v", pieces, got.Content, got.Calls, tc.content, tc.calls)
				}
			}
		})
	}
}

func TestToolCallsLlama(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	paris := Call{Name: "get_weather", Arguments: `{"city":"Paris"}`}
	for _, tc := range []struct {
		name    string
		text    string
		content string
		calls   []Call
	}{
		{name: "one call (Llama 3.1's shape)", text: `{"name": "get_weather", "parameters": {"city": "Paris"}}`, calls: []Call{paris}},
		{name: "after the python tag, in text", text: "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", calls: []Call{paris}},
		{name: "leading whitespace", text: "\n  {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n", calls: []Call{paris}},
		{name: "two calls joined by ;", text: `{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "now", "parameters": {}}`, calls: []Call{paris, {Name: "now", Arguments: "{}"}}},
		{name: "an answer", text: "It is sunny in Paris. {\"name\": 1}", content: "It is sunny in Paris. {\"name\": 1}"},
		{name: "JSON that is not a call stays text", text: `{"answer": "sunny"}`, content: `{"answer": "sunny"}`},
		{name: "a call then text stays text", text: `{"name": "get_weather", "parameters": {}} and more`, content: `{"name": "get_weather", "parameters": {}} and more`},
		{name: "unfinished JSON stays text", text: `{"name": "get_weather", "parameters": {"ci`, content: `{"name": "get_weather", "parameters": {"ci`},
		{name: "parameters not an object", text: `{"name": "f", "parameters": [1]}`, content: `{"name": "f", "parameters": [1]}`},
		{name: "the tag then text", text: "<|python_tag|>print(1)", content: "<|python_tag|>print(1)"},
		{name: "a part of the tag", text: "<|pyth", content: "<|pyth"},
		{name: "whitespace, then an answer", text: "\n \n It is sunny.", content: "\n \n It is sunny."},
		{name: "whitespace, then a part of the tag", text: " \n <|pyth", content: " \n <|pyth"},
		{name: "whitespace only", text: " \n\t ", content: " \n\t "},
		{name: "whitespace, the tag, whitespace", text: " \n <|python_tag|> \n", content: "<|python_tag|>"},
		{name: "nothing", text: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, pieces := range splits(tc.text, rng) {
				got := runTools(t, Llama3JSON, pieces)
				if got.Content != tc.content || !reflect.DeepEqual(got.Calls, tc.calls) {
					t.Fatalf("pieces %q: content %q calls %+v; want %q and %+v", pieces, got.Content, got.Calls, tc.content, tc.calls)
				}
			}
		})
	}
}

// TestToolCallsStream: Hermes content leaves at once; only what a tag or
// the whitespace before a call could claim waits, and a call leaves
// whole when its close tag comes.
func TestToolCallsStream(t *testing.T) {
	p := NewToolCalls(Hermes)
	steps := []struct {
		in   string
		want Piece
	}{
		{"Let me", Piece{Content: "Let me"}},
		{" check.\n", Piece{Content: " check."}},
		{"<tool", Piece{}},
		{"_call>\n{\"name\": \"f\",", Piece{}},
		{" \"arguments\": {\"a\": 1}}\n</tool_", Piece{}},
		{"call>\n", Piece{Calls: []Call{{Name: "f", Arguments: `{"a":1}`}}}},
		{"\nBye <", Piece{Content: "Bye"}},
		{"b>", Piece{Content: " <b>"}},
	}
	for _, s := range steps {
		if got := p.Push(s.in); !reflect.DeepEqual(got, s.want) {
			t.Errorf("Push(%q) = %+v, want %+v", s.in, got, s.want)
		}
	}
	if got := p.Flush(); !reflect.DeepEqual(got, Piece{}) {
		t.Errorf("Flush = %+v", got)
	}
}

// No format: everything is content, tags included.
func TestToolCallsNone(t *testing.T) {
	text := "<tool_call>{\"name\": \"f\"}</tool_call>"
	if got := runTools(t, NoToolFormat, []string{text[:5], text[5:]}); got.Content != text || got.Calls != nil {
		t.Errorf("got %+v", got)
	}
}

// A call that never closes and outgrows the bound is text, not memory.
func TestToolCallsBound(t *testing.T) {
	p := NewToolCalls(Hermes)
	p.maxCall = 100
	got := p.Push("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"")
	long := strings.Repeat("x", 200)
	got.Content += p.Push(long).Content
	got.Content += p.Push("\"}}</tool_call>").Content
	got.Content += p.Flush().Content
	if want := "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"" + long + "\"}}</tool_call>"; got.Content != want || got.Calls != nil {
		t.Errorf("got %q, %+v", got.Content, got.Calls)
	}
}

// A constrained answer (tool_choice required or a named function) is
// calls only, decided at the end; cut short it is text.
func TestToolCallsForced(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	paris := Call{Name: "get_weather", Arguments: `{"city":"Paris"}`}
	for _, tc := range []struct {
		name    string
		fn      string
		text    string
		content string
		calls   []Call
	}{
		{name: "required: one call", text: `[{"name": "get_weather", "parameters": {"city": "Paris"}}]`, calls: []Call{paris}},
		{name: "required: two calls", text: "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}},\n {\"name\": \"now\", \"parameters\": {}}]",
			calls: []Call{paris, {Name: "now", Arguments: "{}"}}},
		{name: "required: cut short", text: `[{"name": "get_weather", "parameters": {"ci`, content: `[{"name": "get_weather", "parameters": {"ci`},
		{name: "required: empty", text: `[]`, content: `[]`},
		{name: "named", fn: "get_weather", text: ` {"city": "Paris"} `, calls: []Call{paris}},
		{name: "named: cut short", fn: "get_weather", text: `{"city": "Pa`, content: `{"city": "Pa`},
		{name: "named: not an object", fn: "get_weather", text: `"Paris"`, content: `"Paris"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, pieces := range splits(tc.text, rng) {
				p := NewToolCalls(ForcedJSON)
				if tc.fn != "" {
					p = NewForcedCall(tc.fn)
				}
				for _, s := range pieces {
					if x := p.Push(s); x.Content != "" || x.Calls != nil {
						t.Fatalf("pieces %q: %+v before the end", pieces, x)
					}
				}
				got := p.Flush()
				if got.Content != tc.content || !reflect.DeepEqual(got.Calls, tc.calls) {
					t.Fatalf("pieces %q: content %q calls %+v; want %q and %+v", pieces, got.Content, got.Calls, tc.content, tc.calls)
				}
			}
		})
	}
}
