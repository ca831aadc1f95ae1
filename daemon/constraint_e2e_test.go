package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
	"github.com/brokerd/brokerd/server"
)

// personSchema bounds every string, number and array, so that a random
// model's answer ends within max tokens.
const personSchema = `{"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 6},
  "age": {"type": "integer", "minimum": 0, "maximum": 120},
  "role": {"enum": ["admin", "user"]},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
  "active": {"type": "boolean"}},
 "required": ["name", "age", "role"], "additionalProperties": false}`

func compileSchema(t *testing.T, src string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(src))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func validateJSON(s *jsonschema.Schema, text string) error {
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return err
	}
	return s.Validate(v)
}

// generateTexts runs a Generate call and returns each prompt's text and
// finish reason.
func generateTexts(t *testing.T, c brokerv1.BrokerServiceClient, req *brokerv1.GenerateRequest) ([]string, []brokerv1.FinishReason, error) {
	t.Helper()
	st, err := c.Generate(testCtx(t), req)
	if err != nil {
		return nil, nil, err
	}
	n := len(req.GetPrompts()) + len(req.GetTokenPrompts())
	texts := make([]strings.Builder, n)
	finish := make([]brokerv1.FinishReason, n)
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		for _, d := range m.GetDeltas() {
			texts[d.GetIndex()].WriteString(d.GetText())
		}
		for _, r := range m.GetResults() {
			finish[r.GetIndex()] = r.GetFinishReason()
		}
	}
	out := make([]string, len(texts))
	for i := range texts {
		out[i] = texts[i].String()
	}
	return out, finish, nil
}

// TestConstrainedEndToEnd: a brokerd serving a random-weight model with
// Qwen3's real tokenizer (151,669 tokens) answers at temperature 1 within
// a JSON Schema (validated with santhosh-tekuri/jsonschema), a regular
// expression and a GBNF grammar over gRPC, refuses constraints it cannot
// compile with INVALID_ARGUMENT, and the official npm clients get valid
// JSON back through response_format json_schema and Ollama's format.
func TestConstrainedEndToEnd(t *testing.T) {
	cfg := llmHTTPConfig(t, "qwen-tiny", "k-struct")
	v, eos := qwenDir(t, cfg.ModelRepo, "qwen-tiny")
	writeTinyLlamaVocab(t, cfg.ModelRepo, "qwen-tiny", v, eos)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	schema := compileSchema(t, personSchema)
	one := float32(1)
	prompts := []string{"A person:", "Someone else:", "Describe a user.", "JSON please"}
	re := `[a-f]{2,5}-[0-9]{1,3}`
	gbnf := `root ::= "[" item ("," item){0,2} "]"` + "\n" + `item ::= [0-9]{1,2} | "null"`
	for _, tc := range []struct {
		name  string
		con   *brokerv1.Constraint
		check func(string) error
	}{
		{"json schema", &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON_SCHEMA, Source: personSchema}, func(s string) error { return validateJSON(schema, s) }},
		{"regex", &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_REGEX, Source: re}, func(s string) error {
			if !regexp.MustCompile(`^(?:` + re + `)$`).MatchString(s) {
				return errors.New("no full match")
			}
			return nil
		}},
		{"gbnf", &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_GBNF, Source: gbnf}, func(s string) error {
			if !regexp.MustCompile(`^\[(?:[0-9]{1,2}|null)(?:,(?:[0-9]{1,2}|null)){0,2}\]$`).MatchString(s) {
				return errors.New("not a sentence of the grammar")
			}
			return nil
		}},
	} {
		for seed := range uint64(2) {
			texts, finish, err := generateTexts(t, c, &brokerv1.GenerateRequest{Model: "qwen-tiny", Prompts: prompts,
				Sampling: &brokerv1.SamplingParams{Temperature: &one, Seed: &seed, MaxTokens: 200, Constraint: tc.con}})
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			for i, s := range texts {
				if finish[i] != brokerv1.FinishReason_FINISH_REASON_STOP {
					t.Errorf("%s, seed %d, prompt %d: finished %v with %q", tc.name, seed, i, finish[i], s)
					continue
				}
				if err := tc.check(s); err != nil {
					t.Errorf("%s, seed %d, prompt %d: %q: %v", tc.name, seed, i, s, err)
				}
			}
			t.Logf("%s, seed %d: %q", tc.name, seed, texts[0])
		}
	}
	for _, bad := range []*brokerv1.Constraint{
		{Kind: brokerv1.Constraint_KIND_JSON_SCHEMA, Source: `{"type": "object", "not": {}}`},
		{Kind: brokerv1.Constraint_KIND_JSON_SCHEMA, Source: `{"type":`},
		{Kind: brokerv1.Constraint_KIND_REGEX, Source: `(`},
		{Kind: brokerv1.Constraint_KIND_GBNF, Source: `root ::= root "a"`},
		{Kind: brokerv1.Constraint_KIND_GBNF},
		{Kind: brokerv1.Constraint_KIND_JSON, Source: "{}"},
		{},
	} {
		_, _, err := generateTexts(t, c, &brokerv1.GenerateRequest{Model: "qwen-tiny", Prompts: []string{"x"},
			Sampling: &brokerv1.SamplingParams{MaxTokens: 4, Constraint: bad}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("constraint %v: %v, want INVALID_ARGUMENT", bad, err)
		}
	}

	out := filepath.Join(t.TempDir(), "struct.json")
	runClients(t, "http://"+d.addrs.HTTP, "k-struct", "daemon", "STRUCT_LLM=qwen-tiny", "STRUCT_SCHEMA="+personSchema, "STRUCT_OUT="+out)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var answers []json.RawMessage
	if err := json.Unmarshal(b, &answers); err != nil {
		t.Fatal(err)
	}
	if len(answers) != 6 {
		t.Fatalf("%d answers from the npm clients, want 6", len(answers))
	}
	for i, a := range answers {
		if err := validateJSON(schema, string(a)); err != nil {
			t.Errorf("npm answer %d %s: %v", i, a, err)
		}
	}
}

// noZTokenizer is byteTokenizer without a token for "Z": a constraint that
// needs one reaches a dead end.
type noZTokenizer struct{ byteTokenizer }

func (noZTokenizer) TokenBytes(id int32) []byte {
	if id == 'Z'+3 {
		return nil
	}
	return byteTokenizer{}.TokenBytes(id)
}

// TestConstraintDeadEndEndToEnd: a sequence whose constraint cannot go on
// (its next character has no token) ends with FINISH_REASON_CONSTRAINT and
// what it wrote, over gRPC and as finish_reason / done_reason "constraint"
// over HTTP, instead of looping or sampling outside the grammar.
func TestConstraintDeadEndEndToEnd(t *testing.T) {
	cfg := llmHTTPConfig(t, "tiny-llm", "k-dead")
	writeTinyLlama(t, cfg.ModelRepo, "tiny-llm")
	d := startDaemonWith(t, Options{Config: cfg, Tokenizers: func(context.Context, string, func(string, int64) ([]byte, error)) (llm.Tokenizer, llm.ChatTemplate, error) {
		return noZTokenizer{}, byteTokenizer{}, nil
	}})
	c := brokerv1.NewBrokerServiceClient(d.conn)
	texts, finish, err := generateTexts(t, c, &brokerv1.GenerateRequest{Model: "tiny-llm", Prompts: []string{"x", "y"},
		Sampling: &brokerv1.SamplingParams{MaxTokens: 10, Constraint: &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_REGEX, Source: "abZ"}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range texts {
		if finish[i] != brokerv1.FinishReason_FINISH_REASON_CONSTRAINT || texts[i] != "ab" {
			t.Errorf("prompt %d: %v with %q, want FINISH_REASON_CONSTRAINT with \"ab\"", i, finish[i], texts[i])
		}
	}
	for _, tc := range []struct{ path, body, field string }{
		{"/v1/completions", `{"model":"tiny-llm","prompt":"x","max_tokens":10,"guided_regex":"abZ"}`, "finish_reason"},
		{"/api/generate", `{"model":"tiny-llm","prompt":"x","raw":true,"stream":false,"format":{"const":"abZ"}}`, "done_reason"},
	} {
		req, err := http.NewRequest(http.MethodPost, "http://"+d.addrs.HTTP+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer k-dead")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"`+tc.field+`":"constraint"`) {
			t.Errorf("%s: %d %s", tc.path, resp.StatusCode, b)
		}
	}
}

// TestToolCallSchema: the constraint of tool_choice required (or a named
// function) compiles and admits exactly the calls of the tools, each with
// arguments of its own schema.
func TestToolCallSchema(t *testing.T) {
	tools := []*brokerv1.Tool{
		{Name: "get_weather", Parameters: `{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}`},
		{Name: "now"},
	}
	src, err := server.ToolCallSchema(tools)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grammar.SchemaToGBNF(context.Background(), []byte(src), grammar.Limits{}); err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	s := compileSchema(t, src)
	for call, ok := range map[string]bool{
		`{"name": "get_weather", "arguments": {"city": "Paris"}}`: true,
		`{"name": "now", "arguments": {}}`:                        true,
		`{"name": "get_weather", "arguments": {}}`:                false,
		`{"name": "other", "arguments": {}}`:                      false,
		`{"name": "now"}`:                                         false,
	} {
		if err := validateJSON(s, call); (err == nil) != ok {
			t.Errorf("%s: %v", call, err)
		}
	}
	one, err := server.ToolCallSchema(tools[:1])
	if err != nil || strings.Contains(one, "anyOf") {
		t.Errorf("one tool: %s, %v", one, err)
	}
	if _, err := server.ToolCallSchema([]*brokerv1.Tool{{Name: "f", Parameters: "[1]"}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("parameters not an object: %v", err)
	}
	// vLLM's shape for tool_choice required: an array of calls.
	src, err = server.RequiredToolsSchema(tools)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grammar.SchemaToGBNF(context.Background(), []byte(src), grammar.Limits{}); err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	s = compileSchema(t, src)
	for calls, ok := range map[string]bool{
		`[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "now", "parameters": {}}]`: true,
		`[{"name": "now", "parameters": {}}]`: true,
		`[]`:                                  false,
		`[{"name": "now", "arguments": {}}]`:  false,
		`[{"name": "get_weather", "parameters": {}}]`: false,
	} {
		if err := validateJSON(s, calls); (err == nil) != ok {
			t.Errorf("%s: %v", calls, err)
		}
	}
}
