package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The expected prompts below were written by hand from reading Ollama's
// template/template.go (Parse, Execute, collate, the template value
// types) and text/template's trimming rules, not by running this code:
// the templates are the ones Ollama's registry ships for llama3.2
// (966de95ca8a6) and qwen2.5 (eb4402837c78).

var (
	sysChat = []ChatMessage{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: "Hi"},
		{Role: "assistant", Content: "Hello!"},
		{Role: "user", Content: "Weather in Paris?"},
	}
	toolChat = []ChatMessage{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []ChatToolCall{{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris"}`)}}},
		{Role: "tool", Content: `{"sky": "sunny"}`, ToolCallID: "call_1"},
	}
	weatherTool = []json.RawMessage{json.RawMessage(`{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
		"parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}}, "required": ["city"]}}}`)}
)

// weatherJSON is the tool as Ollama prints a templateTool's function: its
// struct's fields in order, the parameters' required before properties.
const weatherJSON = `{"name":"get_weather","description":"Get the current weather in a city.","parameters":{"type":"object","required":["city"],"properties":{"city":{"type":"string","description":"The city."}}}}`

func readTemplate(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "templates", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTemplateRenders: Ollama's own templates render conversations,
// with and without tools and tool calls, as Ollama renders them.
func TestTemplateRenders(t *testing.T) {
	llama, qwen := readTemplate(t, "llama3.2.gotmpl"), readTemplate(t, "qwen2.5.gotmpl")
	const llamaHead = "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n\n"
	const llamaTools = "When you receive a tool call response, use the output to format an answer to the orginal user question.\n\nYou are a helpful assistant with tool calling capabilities.<|eot_id|>"
	const qwenTools = "<|im_start|>system\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
		`{"type": "function", "function": ` + weatherJSON + "}\n</tools>\n\n" +
		"For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" +
		"<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
	for _, c := range []struct {
		name, tmpl string
		msgs       []ChatMessage
		tools      []json.RawMessage
		want       string
	}{
		{"llama3.2", llama, sysChat, nil, llamaHead + "You are a helpful assistant.<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"llama3.2 tools", llama, toolChat[:1], weatherTool, llamaHead + llamaTools +
			"<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" +
			"Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. Do not use variables.\n\n" +
			`{"type":"function","function":` + weatherJSON + "}\n\nWeather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"llama3.2 tool call", llama, toolChat, weatherTool, llamaHead + llamaTools +
			"<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Paris\"}}<|eot_id|>" +
			"<|start_header_id|>ipython<|end_header_id|>\n\n{\"sky\": \"sunny\"}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"qwen2.5", qwen, sysChat, nil, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" +
			"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n" +
			"<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"},
		{"qwen2.5 tool call", qwen, toolChat, weatherTool, qwenTools +
			"<|im_start|>user\nWeather in Paris?<|im_end|>\n" +
			"<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call><|im_end|>\n" +
			"<|im_start|>user\n<tool_response>\n{\"sky\": \"sunny\"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"},
		// Consecutive user messages are merged (collate); the reply
		// continues a last assistant message.
		{"qwen2.5 collated", qwen, []ChatMessage{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}, {Role: "assistant", Content: "c"}}, nil,
			"<|im_start|>user\na\n\nb<|im_end|>\n<|im_start|>assistant\nc"},
		// Legacy: no .Messages, so once per turn, {{ .Response }}
		// appended, the last turn cut after it.
		{"legacy", "{{ .System }} {{ .Prompt }}", sysChat, nil, "You are a helpful assistant. HiHello! Weather in Paris?"},
		{"legacy cut", "{{ if .System }}<s>{{ .System }}</s>{{ end }}[U]{{ .Prompt }}[A]{{ .Response }}[END]",
			sysChat, weatherTool, "<s>You are a helpful assistant.</s>[U]Hi[A]Hello![END][U]Weather in Paris?[A]"},
		{"default", DefaultTemplate, sysChat[1:], nil, "HiHello!Weather in Paris?"},
		// Ollama's functions, and a missing key's "<no value>".
		{"json", `{{ range .Messages }}{{ json .Content }}{{ range .ToolCalls }}{{ json .Function.Arguments }}{{ .Function.Index }}{{ end }}{{ end }}|{{ .Nope }}|` +
			`{{ range .Tools }}{{ range $k, $v := .Function.Parameters.Properties }}{{ $k }}:{{ toTypeScriptType $v }}{{ end }}{{ end }}`,
			toolChat[:2], weatherTool, `"Weather in Paris?"""{"city":"Paris"}0|<no value>|city:string`},
	} {
		t.Run(c.name, func(t *testing.T) {
			tm, err := ParseTemplate(c.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			if err := tm.Check(context.Background(), TemplateLimits{}); err != nil {
				t.Fatalf("trial render: %v", err)
			}
			got, err := tm.Render(context.Background(), c.msgs, RenderOptions{Tools: c.tools})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("rendered\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

// TestTemplateThink: .Think and .IsThinkSet reach the template.
func TestTemplateThink(t *testing.T) {
	tm, err := ParseTemplate(`{{ range .Messages }}{{ .Content }}{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}{{ end }}{{ if $.IsThinkSet }}{{ if $.Think }} /think{{ else }} /no_think{{ end }}{{ end }}`)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []ChatMessage{{Role: "user", Content: "q"}, {Role: "assistant", Content: "a", Thinking: "t"}}
	for _, c := range []struct {
		opts RenderOptions
		want string
	}{
		{RenderOptions{}, "qa<think>t</think>"},
		{RenderOptions{Think: true, IsThinkSet: true}, "qa<think>t</think> /think"},
		{RenderOptions{IsThinkSet: true}, "qa<think>t</think> /no_think"},
	} {
		got, err := tm.Render(context.Background(), msgs, c.opts)
		if err != nil || got != c.want {
			t.Errorf("%+v: %q %v, want %q", c.opts, got, err, c.want)
		}
	}
}

// TestTemplateHostile: templates that would recurse, write or allocate
// without end, or loop past any use, are refused when parsed or at the
// trial render, or stopped at request time, by a limit that names
// itself.
func TestTemplateHostile(t *testing.T) {
	// Limits whose time is no factor: each template breaks the one it
	// names whatever the machine's speed.
	hostileLimits := TemplateLimits{MaxSteps: 200_000, MaxOutputBytes: 64 << 10, MaxAllocBytes: 1 << 20, MaxTime: time.Hour}
	for _, c := range []struct{ name, tmpl, why string }{
		{"self recursion", `{{ define "a" }}x{{ template "a" . }}{{ end }}{{ template "a" . }}`, "recurse"},
		{"mutual recursion", `{{ define "a" }}{{ template "b" . }}{{ end }}{{ define "b" }}{{ if .Prompt }}{{ template "a" . }}{{ end }}{{ end }}{{ .Prompt }}`, "recurse"},
		{"block recursion", `{{ block "a" . }}{{ range .Messages }}{{ template "a" $ }}{{ end }}{{ end }}`, "recurse"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseTemplate(c.tmpl)
			if !errors.Is(err, ErrTemplateLimit) || !strings.Contains(err.Error(), c.why) {
				t.Errorf("parsed: %v, want a refusal (%s)", err, c.why)
			}
		})
	}
	for _, c := range []struct{ name, tmpl, why string }{
		{"huge output", `{{ range $i := 1000000000 }}{{ $.System }}{{ $.Prompt }}{{ end }}{{ .Response }}`, "output"},
		{"doubling", `{{ $x := "ab" }}{{ range 64 }}{{ $x = printf "%s%s" $x $x }}{{ end }}{{ len $x }}{{ .Response }}`, "made more than"},
		{"wide printf", `{{ range 1000 }}{{ $x := printf "%01000000d" 0 }}{{ end }}{{ .Response }}`, "made more than"},
		{"empty loop", `{{ range 1000000000 }}{{ end }}{{ .Response }}`, "steps"},
		{"nested loops", `{{ range 100000 }}{{ range 100000 }}{{ end }}{{ end }}{{ .Messages }}`, "steps"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tm, err := ParseTemplate(c.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			err = tm.Check(context.Background(), hostileLimits)
			if !errors.Is(err, ErrTemplateLimit) || !strings.Contains(err.Error(), c.why) {
				t.Errorf("trial render: %v, want a refusal (%s)", err, c.why)
			}
		})
	}

	// A loop on .Messages within every other is cheap on the trial's
	// few turns and stopped on a long conversation.
	tm, err := ParseTemplate(`{{ range .Messages }}{{ range $.Messages }}{{ range $.Messages }}{{ range $.Messages }}{{ end }}{{ end }}{{ end }}{{ end }}ok`)
	if err != nil {
		t.Fatal(err)
	}
	if err := tm.Check(context.Background(), TemplateLimits{}); err != nil {
		t.Fatalf("trial render: %v", err)
	}
	long := make([]ChatMessage, 200)
	for i := range long {
		long[i] = ChatMessage{Role: []string{"user", "assistant"}[i%2], Content: "x"}
	}
	_, err = tm.Render(context.Background(), long, RenderOptions{Limits: TemplateLimits{MaxSteps: 100_000, MaxTime: time.Hour}})
	if !errors.Is(err, ErrTemplateLimit) || !strings.Contains(err.Error(), "steps") {
		t.Errorf("200⁴ iterations: %v, want the steps limit", err)
	}

	// The caller's context ends the render, and is not the template's
	// fault.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = tm.Render(ctx, long, RenderOptions{})
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTemplateLimit) {
		t.Errorf("a canceled render: %v", err)
	}

	// Ollama's own refusals, and what text/template refuses.
	for _, src := range []string{`{{ template "x" }}`, `{{ .Prompt `, `{{ nosuchfunc }}`, strings.Repeat("x", MaxTemplateBytes+1)} {
		if _, err := ParseTemplate(src); !errors.Is(err, ErrTemplate) {
			t.Errorf("ParseTemplate(%.40q): %v", src, err)
		}
	}
	// A template that fails on a request is the request's error.
	tm, err = ParseTemplate(`{{ range .Messages }}{{ .Nope }}{{ end }}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tm.Render(context.Background(), sysChat, RenderOptions{}); !errors.Is(err, ErrTemplate) || errors.Is(err, ErrTemplateLimit) {
		t.Errorf("a failing template: %v", err)
	}
}

// FuzzTemplate: any template text either fails to parse or renders the
// trial conversations under small limits with an error or a prompt, never
// a panic or a render past its bounds.
func FuzzTemplate(f *testing.F) {
	for _, name := range []string{"llama3.2.gotmpl", "qwen2.5.gotmpl"} {
		b, err := os.ReadFile(filepath.Join("testdata", "templates", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	for _, s := range []string{
		"{{ .System }} {{ .Prompt }}", "{{ if .System }}{{ .Response }}{{ else }}x{{ end }}y",
		`{{ define "a" }}{{ template "b" . }}{{ end }}{{ define "b" }}{{ .Prompt }}{{ end }}{{ template "a" . }}`,
		`{{ range $i := 1000000 }}{{ $.System }}{{ end }}`, `{{ with .Messages }}{{ range . }}{{ json . }}{{ end }}{{ else with .Prompt }}{{ . }}{{ end }}`,
		`{{ $x := "ab" }}{{ range 30 }}{{ $x = printf "%s%s" $x $x }}{{ end }}`, `{{ range .Tools }}{{ .Function }}{{ break }}{{ end }}{{ .Response }}tail`,
	} {
		f.Add(s)
	}
	lim := TemplateLimits{MaxSteps: 20_000, MaxOutputBytes: 64 << 10, MaxAllocBytes: 256 << 10, MaxTime: time.Minute}
	f.Fuzz(func(t *testing.T, src string) {
		tm, err := ParseTemplate(src)
		if err != nil {
			if !errors.Is(err, ErrTemplate) {
				t.Fatalf("a parse error that is not ErrTemplate: %v", err)
			}
			return
		}
		for _, trial := range trialConversations {
			out, err := tm.Render(context.Background(), trial.msgs, RenderOptions{Tools: trial.tools, Limits: lim})
			if err != nil && !errors.Is(err, ErrTemplate) {
				t.Fatalf("a render error that is not ErrTemplate: %v", err)
			}
			if int64(len(out)) > lim.MaxOutputBytes {
				t.Fatalf("%d bytes rendered, over the limit", len(out))
			}
		}
	})
}
