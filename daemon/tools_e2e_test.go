package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
)

// pythonTag is the token Llama 3.1 writes before a call.
const pythonTag = "<|python_tag|>"

// Tools end to end: a model of Qwen3's real tokenizer and chat template
// whose weights say "Let me check." and then call get_weather for Paris
// in Qwen's (Hermes) format, served by a real brokerd.
const (
	toolContent   = "Let me check."
	toolCallText  = `<tool_call>{"name": "get_weather","arguments":{"city":"Paris"}}</tool_call>`
	toolSchema    = `{"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"], "description": "The city."}}, "required": ["city"]}`
	toolResult    = `{"temp": 21}`
	toolUserQuery = "Weather in Paris?"
)

func writeToolModel(t testing.TB, repo, name string) {
	t.Helper()
	v, eos := qwenDir(t, repo, name)
	tok := qwenTokenizer(t)
	nl := tok.Encode("\n", false)
	if len(nl) != 1 {
		t.Fatal("\\n is not one token")
	}
	script := append(nl, tok.Encode(toolContent+toolCallText, false)...)
	// Under a constraint that bars the script (tool_choice required or a
	// named function) every allowed token but these scores 0, and greedy
	// takes the lowest id: the JSON comes a character at a time. After a
	// "}" the model prefers "]" (else "," would start another call
	// forever) and then its end (else whitespace up to the grammar's
	// bound); after "]", its end.
	one := func(s string) int {
		ids := tok.Encode(s, false)
		if len(ids) != 1 {
			t.Fatalf("%q is %d tokens", s, len(ids))
		}
		return int(ids[0])
	}
	writeScript(t, tok, repo, name, v, eos, append(script, int32(eos)), func(embed, head []float32, h int) {
		brace, bracket := one("}"), one("]")
		embed[brace*h+h-1], embed[bracket*h+h-2] = 1, 1
		head[bracket*h+h-1], head[eos*h+h-1] = 10, 5
		head[eos*h+h-2] = 10
	})
}

// toolRoundTripPrompt is what Qwen3's template renders for the tools, the
// question, the model's answer (its content and call, arguments a
// mapping) and the tool's result, written out by hand from the template
// (tojson writes ", " and ": ").
func toolRoundTripPrompt() string {
	tool := `{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city.", "parameters": ` + toolSchema + `}}`
	return "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" + tool + "\n</tools>\n\n" +
		"For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" +
		"<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\n" + toolUserQuery + "<|im_end|>\n" +
		"<|im_start|>assistant\n" + toolContent + "\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\n<tool_response>\n" + toolResult + "\n</tool_response><|im_end|>\n" +
		"<|im_start|>assistant\n"
}

// TestToolsEndToEnd: over gRPC the call comes back in
// GenerationDelta.tool_calls (its arguments valid against the tool's
// schema), never in text, and the sequence finishes TOOL_CALLS; the
// answer fed back with the tool's result renders as Qwen3's template
// renders it (the prompt's token count); tool_choice none leaves the call
// in the text; required and a named function are held to the tools'
// schemas by the grammar even though the script says otherwise. Then the
// official openai and ollama npm clients do the same over HTTP, streamed
// and not.
func TestToolsEndToEnd(t *testing.T) {
	cfg := llmHTTPConfig(t, "qwen-tools", "k-tools")
	writeToolModel(t, cfg.ModelRepo, "qwen-tools")
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)

	schema, err := jsonschema.UnmarshalJSON(strings.NewReader(toolSchema))
	if err != nil {
		t.Fatal(err)
	}
	comp := jsonschema.NewCompiler()
	if err := comp.AddResource("tool.json", schema); err != nil {
		t.Fatal(err)
	}
	sch, err := comp.Compile("tool.json")
	if err != nil {
		t.Fatal(err)
	}
	tools := []*brokerv1.Tool{{Name: "get_weather", Description: "Get the weather in a city.", Parameters: toolSchema}}
	user := &brokerv1.ChatMessage{Role: "user", Content: toolUserQuery}
	type answer struct {
		text   string
		calls  []*brokerv1.ToolCall
		finish brokerv1.FinishReason
		prompt int32
	}
	chat := func(t *testing.T, req *brokerv1.ChatRequest) answer {
		t.Helper()
		req.Model = "qwen-tools"
		req.Sampling = &brokerv1.SamplingParams{Temperature: new(float32)}
		st, err := c.Chat(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var a answer
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return a
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, dl := range m.GetDeltas() {
				a.text += dl.GetText()
				a.calls = append(a.calls, dl.GetToolCalls()...)
			}
			for _, r := range m.GetResults() {
				a.finish, a.prompt = r.GetFinishReason(), r.GetUsage().GetPromptTokens()
			}
		}
	}
	checkCall := func(t *testing.T, a answer) {
		t.Helper()
		if a.text != toolContent || len(a.calls) != 1 || a.finish != brokerv1.FinishReason_FINISH_REASON_TOOL_CALLS {
			t.Fatalf("text %q, calls %v, finish %v", a.text, a.calls, a.finish)
		}
		tc := a.calls[0]
		if tc.GetName() != "get_weather" || tc.GetIndex() != 0 || !strings.HasPrefix(tc.GetId(), "call_") || len(tc.GetId()) != 29 {
			t.Errorf("call %v", tc)
		}
		args, err := jsonschema.UnmarshalJSON(strings.NewReader(tc.GetArguments()))
		if err != nil {
			t.Fatalf("arguments %q: %v", tc.GetArguments(), err)
		}
		if err := sch.Validate(args); err != nil {
			t.Errorf("arguments %q against the tool's schema: %v", tc.GetArguments(), err)
		}
		if args.(map[string]any)["city"] != "Paris" {
			t.Errorf("arguments %q", tc.GetArguments())
		}
	}

	var first answer
	t.Run("a call", func(t *testing.T) {
		first = chat(t, &brokerv1.ChatRequest{Tools: tools, Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{user}}}})
		checkCall(t, first)
	})
	want := len(qwenTokenizer(t).Encode(toolRoundTripPrompt(), false))
	t.Run("the tool's result fed back", func(t *testing.T) {
		if len(first.calls) != 1 {
			t.Skip("no call to answer")
		}
		a := chat(t, &brokerv1.ChatRequest{Tools: tools, Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{user,
			{Role: "assistant", Content: first.text, ToolCalls: first.calls},
			{Role: "tool", Content: toolResult, ToolCallId: first.calls[0].GetId()}}}}})
		if int(a.prompt) != want {
			t.Errorf("the round trip's prompt is %d tokens; Qwen3's template renders %d", a.prompt, want)
		}
		// The script has one answer, whatever the prompt.
		checkCall(t, a)
	})
	t.Run("tool_choice none", func(t *testing.T) {
		a := chat(t, &brokerv1.ChatRequest{Tools: tools, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE,
			Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{user}}}})
		if a.text != toolContent+toolCallText || len(a.calls) != 0 || a.finish != brokerv1.FinishReason_FINISH_REASON_STOP {
			t.Errorf("text %q, calls %v, finish %v", a.text, a.calls, a.finish)
		}
	})
	t.Run("tool_choice required", func(t *testing.T) {
		// The output is constrained to a JSON array of calls (vLLM's):
		// the script's answer is barred.
		a := chat(t, &brokerv1.ChatRequest{Tools: tools, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED,
			Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{user}}}})
		if a.text != "" || len(a.calls) != 1 {
			t.Fatalf("text %q, calls %v, finish %v", a.text, a.calls, a.finish)
		}
		a.text = toolContent // as checkCall wants it: the answer is the call alone
		checkCall(t, a)
	})
	t.Run("a named function", func(t *testing.T) {
		a := chat(t, &brokerv1.ChatRequest{Tools: tools, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION, ToolChoiceFunction: "get_weather",
			Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{user}}}})
		if a.text != "" || a.finish != brokerv1.FinishReason_FINISH_REASON_STOP || len(a.calls) != 1 {
			t.Fatalf("text %q, calls %v, finish %v", a.text, a.calls, a.finish)
		}
		a.text, a.finish = toolContent, brokerv1.FinishReason_FINISH_REASON_TOOL_CALLS // as checkCall wants them
		checkCall(t, a)
	})
	t.Run("no tools", func(t *testing.T) {
		a := chat(t, &brokerv1.ChatRequest{Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{user}}}})
		if a.text != toolContent+toolCallText || len(a.calls) != 0 {
			t.Errorf("text %q, calls %v", a.text, a.calls)
		}
	})

	runClients(t, "http://"+d.addrs.HTTP, "k-tools", "daemon", "TOOL_LLM=qwen-tools",
		"TOOL_CONTENT="+toolContent, "TOOL_TEXT="+toolCallText, "TOOL_SCHEMA="+toolSchema, "TOOL_RESULT="+toolResult,
		"TOOL_QUERY="+toolUserQuery, "TOOL_ROUNDTRIP_PROMPT_TOKENS="+strconv.Itoa(want))
}

// llama31Dir writes Llama 3.1's tokenizer into repo/name/1: the Llama 3
// test copy with the two special tokens 3.1 names (<|eom_id|>,
// <|python_tag|>, reserved tokens 4 and 5 in 3.0) and 3.1's published
// chat template, whose tools go in the first user message. It returns
// the tokenizer, its vocabulary size and <|eot_id|>.
func llama31Dir(t *testing.T, repo, name string) (*bpe.Tokenizer, int, int) {
	t.Helper()
	src := "../runtime/models/tokenizer/bpe/testdata"
	raw := readZstd(t, filepath.Join(src, "llama3", "tokenizer.json.zst"))
	renamed := map[float64]string{128008: "<|eom_id|>", 128010: pythonTag}
	var tj map[string]any
	if err := json.Unmarshal(raw, &tj); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, a := range tj["added_tokens"].([]any) {
		if s, ok := renamed[a.(map[string]any)["id"].(float64)]; ok {
			a.(map[string]any)["content"] = s
			n++
		}
	}
	if n != len(renamed) {
		t.Fatalf("renamed %d added tokens", n)
	}
	rawCfg, err := os.ReadFile(filepath.Join(src, "llama3", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(rawCfg, &cfg); err != nil {
		t.Fatal(err)
	}
	for id, s := range renamed {
		cfg["added_tokens_decoder"].(map[string]any)[strconv.Itoa(int(id))].(map[string]any)["content"] = s
	}
	tmpl, err := os.ReadFile(filepath.Join(src, "llama3_1_chat_template.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"], cfg["eos_token"] = string(tmpl), "<|eot_id|>"
	dir := versionDir(t, repo, name, 1)
	tjOut, _ := json.Marshal(tj)
	cfgOut, _ := json.Marshal(cfg)
	for file, b := range map[string][]byte{"tokenizer.json": tjOut, "tokenizer_config.json": cfgOut} {
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := bpe.Parse(tjOut, cfgOut, nil)
	if err != nil {
		t.Fatal(err)
	}
	eot := tok.Encode("<|eot_id|>", false)
	if len(eot) != 1 {
		t.Fatal("<|eot_id|> is not one token")
	}
	return tok, tok.VocabSize(), int(eot[0])
}

// llamaCall is the call as the scripted Llama writes it, after
// <|python_tag|> (each token once: see writeScript).
const llamaCall = `{"name": "get_weather","parameters":{"city":"Paris"}}`

// TestToolsLlama31 serves a model of Llama 3.1's tokenizer and template
// whose weights call get_weather in Llama's JSON after <|python_tag|>
// (a special token: not in the text): the call comes back in tool_calls,
// and the tools and a round trip render as Llama 3.1's template does
// (tools in the first user message, the result as an ipython turn).
func TestToolsLlama31(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "llama-tools"
	tok, v, eot := llama31Dir(t, cfg.ModelRepo, "llama-tools")
	nl := tok.Encode("\n\n", false)
	tag := tok.Encode(pythonTag, false)
	if len(nl) != 1 || len(tag) != 1 {
		t.Fatalf("\\n\\n is %v, the python tag %v", nl, tag)
	}
	script := append(append(nl, tag...), tok.Encode(llamaCall, false)...)
	writeScript(t, tok, cfg.ModelRepo, "llama-tools", v, eot, append(script, int32(eot)), nil)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	tools := []*brokerv1.Tool{{Name: "get_weather", Description: "Get the weather in a city.", Parameters: toolSchema}}
	user := &brokerv1.ChatMessage{Role: "user", Content: toolUserQuery}
	chat := func(t *testing.T, msgs ...*brokerv1.ChatMessage) (string, []*brokerv1.ToolCall, *brokerv1.GenerationResult) {
		t.Helper()
		st, err := c.Chat(ctx, &brokerv1.ChatRequest{Model: "llama-tools", Tools: tools, Sampling: &brokerv1.SamplingParams{Temperature: new(float32)},
			Conversations: []*brokerv1.Conversation{{Messages: msgs}}})
		if err != nil {
			t.Fatal(err)
		}
		var text string
		var calls []*brokerv1.ToolCall
		var res *brokerv1.GenerationResult
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return text, calls, res
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, dl := range m.GetDeltas() {
				text += dl.GetText()
				calls = append(calls, dl.GetToolCalls()...)
			}
			if rs := m.GetResults(); len(rs) > 0 {
				res = rs[0]
			}
		}
	}
	text, calls, res := chat(t, user)
	if text != "" || len(calls) != 1 || calls[0].GetName() != "get_weather" || calls[0].GetArguments() != `{"city":"Paris"}` ||
		res.GetFinishReason() != brokerv1.FinishReason_FINISH_REASON_TOOL_CALLS {
		t.Fatalf("text %q, calls %v, result %v", text, calls, res)
	}
	// The round trip, as the template renders it (tojson(indent=4) of the
	// tool; the result a JSON string, as Llama 3.1's template writes a
	// tool's content).
	var tool bytes.Buffer
	if err := json.Indent(&tool, []byte(`{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city.", "parameters": `+toolSchema+`}}`), "", "    "); err != nil {
		t.Fatal(err)
	}
	result, _ := json.Marshal(toolResult)
	want := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" +
		"Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n" +
		tool.String() + "\n\n" + toolUserQuery + "<|eot_id|>" +
		"<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>" +
		"<|start_header_id|>ipython<|end_header_id|>\n\n" + string(result) + "<|eot_id|>" +
		"<|start_header_id|>assistant<|end_header_id|>\n\n"
	_, calls2, res := chat(t, user, &brokerv1.ChatMessage{Role: "assistant", ToolCalls: calls},
		&brokerv1.ChatMessage{Role: "tool", Content: toolResult, ToolCallId: calls[0].GetId()})
	if n := len(tok.Encode(want, false)); int(res.GetUsage().GetPromptTokens()) != n || len(calls2) != 1 {
		t.Errorf("the round trip's prompt is %d tokens (calls %v); Llama 3.1's template renders %d", res.GetUsage().GetPromptTokens(), calls2, n)
	}
}
