package httpapi

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestStructuredOutputFields: Ollama's format, OpenAI's response_format and
// vLLM's guided_* fields reach the backend as SamplingParams.constraint,
// on every route that generates; malformed or conflicting ones are 400.
func TestStructuredOutputFields(t *testing.T) {
	srv, f, _ := newTestServer(t)
	schema := `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`
	c := func(k brokerv1.Constraint_Kind, src string) *brokerv1.Constraint {
		return &brokerv1.Constraint{Kind: k, Source: src}
	}
	jsonKind, schemaKind := brokerv1.Constraint_KIND_JSON, brokerv1.Constraint_KIND_JSON_SCHEMA
	chat := `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct {
		name, path, body string
		want             *brokerv1.Constraint // nil: none
		code             int                  // 0: 200
	}{
		{"ollama generate json", "/api/generate", `{"model":"tiny-llm","prompt":"x","stream":false,"format":"json"}`, c(jsonKind, ""), 0},
		{"ollama generate schema", "/api/generate", `{"model":"tiny-llm","prompt":"x","stream":false,"format":` + schema + `}`, c(schemaKind, schema), 0},
		{"ollama raw generate schema", "/api/generate", `{"model":"tiny-llm","prompt":"x","raw":true,"stream":false,"format":` + schema + `}`, c(schemaKind, schema), 0},
		{"ollama chat json", "/api/chat", `{"model":"tiny-llm",` + chat + `,"stream":false,"format":"json"}`, c(jsonKind, ""), 0},
		{"ollama chat schema", "/api/chat", `{"model":"tiny-llm",` + chat + `,"stream":false,"format":` + schema + `}`, c(schemaKind, schema), 0},
		{"ollama empty format", "/api/chat", `{"model":"tiny-llm",` + chat + `,"stream":false,"format":""}`, nil, 0},
		{"ollama null format", "/api/chat", `{"model":"tiny-llm",` + chat + `,"stream":false,"format":null}`, nil, 0},
		{"ollama format yaml", "/api/chat", `{"model":"tiny-llm",` + chat + `,"format":"yaml"}`, nil, 400},
		{"ollama format a list", "/api/chat", `{"model":"tiny-llm",` + chat + `,"format":[1]}`, nil, 400},
		{"openai json_object", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"response_format":{"type":"json_object"}}`, c(jsonKind, ""), 0},
		{"openai json_schema", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"response_format":{"type":"json_schema","json_schema":{"name":"a","strict":true,"schema":` + schema + `}}}`, c(schemaKind, schema), 0},
		{"openai text", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"response_format":{"type":"text"}}`, nil, 0},
		{"completions json_schema", "/v1/completions", `{"model":"tiny-llm","prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"a","schema":` + schema + `}}}`, c(schemaKind, schema), 0},
		{"vllm guided_json object", "/v1/completions", `{"model":"tiny-llm","prompt":"x","guided_json":` + schema + `}`, c(schemaKind, schema), 0},
		{"vllm guided_json string", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"guided_json":` + string(must(json.Marshal(schema))) + `}`, c(schemaKind, schema), 0},
		{"vllm guided_regex", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"guided_regex":"[0-9]+"}`, c(brokerv1.Constraint_KIND_REGEX, "[0-9]+"), 0},
		{"vllm guided_grammar", "/v1/completions", `{"model":"tiny-llm","prompt":"x","guided_grammar":"root ::= \"a\""}`, c(brokerv1.Constraint_KIND_GBNF, `root ::= "a"`), 0},
		{"vllm guided_choice", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"guided_choice":["yes","no \"way\""]}`, c(brokerv1.Constraint_KIND_GBNF, `root ::= "yes" | "no \"way\""`), 0},
		{"openai unknown type", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"response_format":{"type":"xml"}}`, nil, 400},
		{"openai json_schema without schema", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"response_format":{"type":"json_schema","json_schema":{"name":"a"}}}`, nil, 400},
		{"openai schema not an object", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":[1]}}}`, nil, 400},
		{"two constraints", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"response_format":{"type":"json_object"},"guided_regex":"a"}`, nil, 400},
		{"empty guided_choice", "/v1/chat/completions", `{"model":"tiny-llm",` + chat + `,"guided_choice":[]}`, nil, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.lastChat, f.lastGenerate = nil, nil
			resp := post(t, srv.URL+tc.path, tc.body)
			want := tc.code
			if want == 0 {
				want = 200
			}
			if resp.StatusCode != want {
				t.Fatalf("status %d, want %d", resp.StatusCode, want)
			}
			if tc.code != 0 {
				if f.lastChat != nil || f.lastGenerate != nil {
					t.Error("a refused request reached the backend")
				}
				return
			}
			var sp *brokerv1.SamplingParams
			switch {
			case f.lastChat != nil:
				sp = f.lastChat.GetSampling()
			case f.lastGenerate != nil:
				sp = f.lastGenerate.GetSampling()
			default:
				t.Fatal("the backend got nothing")
			}
			if got := sp.GetConstraint(); !proto.Equal(got, tc.want) {
				t.Errorf("constraint %v, want %v", got, tc.want)
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestGenerateContextAndTemplateRefused: /api/generate's "context" and
// "template" are a 400 that names them when given, not ignored (the
// conversation's memory or the prompt's format would be lost without a
// word); null or empty ones are none.
func TestGenerateContextAndTemplateRefused(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		body, field string
		code        int
	}{
		{`{"model":"tiny-llm","prompt":"and then?","context":[1,2,3],"stream":false}`, "context", 400},
		{`{"model":"tiny-llm","prompt":"hi","template":"{{ .Prompt }}","stream":false}`, "template", 400},
		{`{"model":"tiny-llm","prompt":"hi","context":null,"template":"","stream":false}`, "", 200},
		{`{"model":"tiny-llm","prompt":"hi","context":[],"stream":false}`, "", 200},
	} {
		f.lastChat, f.lastGenerate = nil, nil
		resp := post(t, srv.URL+"/api/generate", tc.body)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d %s", tc.body, resp.StatusCode, b)
		}
		if tc.code == 400 && (f.lastChat != nil || f.lastGenerate != nil || !strings.Contains(string(b), tc.field)) {
			t.Errorf("%s: ran, or the error does not say why: %s", tc.body, b)
		}
	}
}

// TestCompletionPrompts: /v1/completions takes a prompt of token ids, or
// a list of them, as OpenAI and vLLM do (GenerateRequest.token_prompts);
// anything else that is not text is a 400 naming "prompt", and echo with
// ids a 400 naming "echo".
func TestCompletionPrompts(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		prompt string
		texts  []string
		ids    [][]int32
		code   int
		param  string
	}{
		{prompt: `"abc"`, texts: []string{"abc"}, code: 200},
		{prompt: `["a","b"]`, texts: []string{"a", "b"}, code: 200},
		{prompt: `[5,6,7]`, ids: [][]int32{{5, 6, 7}}, code: 200},
		{prompt: `[[5,6],[7]]`, ids: [][]int32{{5, 6}, {7}}, code: 200},
		{prompt: `[1.5]`, code: 400, param: "prompt"},
		{prompt: `[1,"a"]`, code: 400, param: "prompt"},
		{prompt: `[4294967296]`, code: 400, param: "prompt"},
		{prompt: `{"a":1}`, code: 400, param: "prompt"},
		{prompt: `[5,6]`, code: 400, param: "echo"},
	} {
		f.lastGenerate = nil
		body := `{"model":"tiny-llm","max_tokens":2,"prompt":` + tc.prompt
		if tc.param == "echo" {
			body += `,"echo":true`
		}
		resp := post(t, srv.URL+"/v1/completions", body+"}")
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.code {
			t.Errorf("prompt %s: %d %s", tc.prompt, resp.StatusCode, b)
			continue
		}
		if tc.code != 200 {
			if f.lastGenerate != nil || !strings.Contains(string(b), `"param":"`+tc.param+`"`) {
				t.Errorf("prompt %s: ran, or the error does not name %s: %s", tc.prompt, tc.param, b)
			}
			continue
		}
		var ids [][]int32
		for _, p := range f.lastGenerate.GetTokenPrompts() {
			ids = append(ids, p.GetIds())
		}
		if !slices.Equal(f.lastGenerate.GetPrompts(), tc.texts) || !slices.EqualFunc(ids, tc.ids, slices.Equal) {
			t.Errorf("prompt %s: texts %q ids %v", tc.prompt, f.lastGenerate.GetPrompts(), ids)
		}
	}
}

// TestSuffixRefused: a suffix (fill in the middle) is a 400, as vLLM and
// Ollama (for a model without insert) answer it, not ignored: an editor's
// completion client falls back to the prefix alone on that 400, and would
// otherwise take a continuation of the prompt for the middle. An empty
// suffix is no suffix.
func TestSuffixRefused(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		path, body string
		code       int
	}{
		{"/v1/completions", `{"model":"tiny-llm","prompt":"def f(","suffix":"\n    return x"}`, 400},
		{"/api/generate", `{"model":"tiny-llm","prompt":"def f(","suffix":"\n    return x","stream":false}`, 400},
		{"/v1/completions", `{"model":"tiny-llm","prompt":"def f(","suffix":""}`, 200},
		{"/v1/completions", `{"model":"tiny-llm","prompt":"def f(","suffix":null}`, 200},
		{"/api/generate", `{"model":"tiny-llm","prompt":"def f(","suffix":"","stream":false}`, 200},
	} {
		f.lastChat, f.lastGenerate = nil, nil
		resp := post(t, srv.URL+tc.path, tc.body)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, resp.StatusCode, b)
		}
		if tc.code == 400 && (f.lastChat != nil || f.lastGenerate != nil || !strings.Contains(string(b), "suffix")) {
			t.Errorf("%s %s: ran, or the error does not say why: %s", tc.path, tc.body, b)
		}
	}
}

// TestReturnTokenIDs: vLLM's return_token_ids gives chat's rendered
// prompt ids at the top (in each choice's first chunk when streamed) and
// completions' in each choice, and every choice's token ids (per chunk
// when streamed); unasked, neither key is there.
func TestReturnTokenIDs(t *testing.T) {
	srv, _, _ := newTestServer(t)
	// The fake's answer comes 4 runes a delta, each with the token id of
	// its offset; its prompt ids are 900 and the prompt's token count.
	offsets := func(reply string) []int32 {
		var ids []int32
		for off := 0; off < len([]rune(reply)); off += 4 {
			ids = append(ids, int32(off))
		}
		return ids
	}
	type choice struct {
		Index          int     `json:"index"`
		TokenIDs       []int32 `json:"token_ids"`
		PromptTokenIDs []int32 `json:"prompt_token_ids"`
	}
	type body struct {
		PromptTokenIDs []int32  `json:"prompt_token_ids"`
		Choices        []choice `json:"choices"`
	}
	read := func(path, req string, stream bool) (top []int32, prompts, own map[int][]int32, raw string) {
		resp := post(t, srv.URL+path, req)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s %s: %d %s", path, req, resp.StatusCode, b)
		}
		prompts, own = map[int][]int32{}, map[int][]int32{}
		payloads := []string{string(b)}
		if stream {
			payloads = sseData(b)
		}
		for _, p := range payloads {
			var m body
			if err := json.Unmarshal([]byte(p), &m); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if m.PromptTokenIDs != nil {
				if top != nil && !stream {
					t.Errorf("prompt ids twice: %s", p)
				}
				top = m.PromptTokenIDs
			}
			for _, c := range m.Choices {
				if c.PromptTokenIDs != nil {
					prompts[c.Index] = c.PromptTokenIDs
				}
				own[c.Index] = append(own[c.Index], c.TokenIDs...)
			}
		}
		return top, prompts, own, string(b)
	}
	for _, stream := range []bool{false, true} {
		s := fmt.Sprint(stream)
		top, _, own, _ := read("/v1/chat/completions", `{"model":"tiny-llm","return_token_ids":true,"stream":`+s+`,"messages":[{"role":"user","content":"hi"}]}`, stream)
		if want := offsets("chat(user=hi) ünïcode"); !slices.Equal(top, []int32{900, 1}) || !slices.Equal(own[0], want) {
			t.Errorf("chat (stream %v): prompt ids %v, token ids %v; want [900 1] and %v", stream, top, own[0], want)
		}
		_, prompts, own, _ := read("/v1/completions", `{"model":"tiny-llm","return_token_ids":true,"stream":`+s+`,"max_tokens":5,"prompt":["one","three"]}`, stream)
		for i, p := range []string{"one", "three"} {
			if want := offsets("gen: " + p); !slices.Equal(prompts[i], []int32{900, int32(len(p))}) || !slices.Equal(own[i], want) {
				t.Errorf("completion %d (stream %v): prompt ids %v, token ids %v; want [900 %d] and %v", i, stream, prompts[i], own[i], len(p), want)
			}
		}
		for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
			_, _, _, raw := read(path, `{"model":"tiny-llm","stream":`+s+`,"max_tokens":5,"prompt":"x","messages":[{"role":"user","content":"hi"}]}`, stream)
			if strings.Contains(raw, "token_ids") {
				t.Errorf("%s unasked (stream %v): %s", path, stream, raw)
			}
		}
	}
}
