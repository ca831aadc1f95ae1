package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// Structured output: each API's way of asking for it becomes
// SamplingParams.constraint; its source is compiled by the engine, which
// answers INVALID_ARGUMENT (400) for one it cannot enforce.

// isNull is an absent or null JSON value.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// ollamaFormat is Ollama's "format": "json" (any JSON object) or a JSON
// Schema object; "" or null: none.
func ollamaFormat(raw json.RawMessage) (*brokerv1.Constraint, error) {
	if isNull(raw) {
		return nil, nil
	}
	t := bytes.TrimSpace(raw)
	switch t[0] {
	case '"':
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, `"format": %v`, err)
		}
		switch s {
		case "":
			return nil, nil
		case "json":
			return &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON}, nil
		}
		return nil, status.Errorf(codes.InvalidArgument, `"format" %q: want "json" or a JSON schema object`, s)
	case '{':
		return &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON_SCHEMA, Source: string(t)}, nil
	}
	return nil, status.Error(codes.InvalidArgument, `"format" must be "json" or a JSON schema object`)
}

// openaiResponseFormat is OpenAI's response_format.
type openaiResponseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Schema      json.RawMessage `json:"schema"`
		// Strict is accepted either way: brokerd always enforces the
		// schema (the keywords it cannot enforce are refused).
		Strict *bool `json:"strict"`
	} `json:"json_schema"`
}

// openaiGuided are vLLM's structured-output extras of both completion
// endpoints (its guided decoding parameters).
type openaiGuided struct {
	GuidedJSON    json.RawMessage `json:"guided_json"`
	GuidedRegex   *string         `json:"guided_regex"`
	GuidedGrammar *string         `json:"guided_grammar"`
	GuidedChoice  []string        `json:"guided_choice"`
}

// constraint is response_format's or the guided_* fields' constraint (at
// most one of them; nil: none).
func (o *openaiSampling) constraint() (*brokerv1.Constraint, error) {
	var found []string
	var c *brokerv1.Constraint
	set := func(name string, k brokerv1.Constraint_Kind, src string) {
		found = append(found, name)
		c = &brokerv1.Constraint{Kind: k, Source: src}
	}
	if rf := o.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			set("response_format", brokerv1.Constraint_KIND_JSON, "")
		case "json_schema":
			if rf.JSONSchema == nil || isNull(rf.JSONSchema.Schema) {
				return nil, paramError("response_format.json_schema", "invalid_value", "response_format json_schema needs json_schema.schema")
			}
			s := bytes.TrimSpace(rf.JSONSchema.Schema)
			if s[0] != '{' {
				return nil, paramError("response_format.json_schema.schema", "invalid_value", "response_format json_schema.schema must be a JSON object")
			}
			set("response_format", brokerv1.Constraint_KIND_JSON_SCHEMA, string(s))
		default:
			return nil, paramError("response_format.type", "invalid_value", "response_format type %q: want text, json_object or json_schema", rf.Type)
		}
	}
	if !isNull(o.GuidedJSON) {
		s := bytes.TrimSpace(o.GuidedJSON)
		if s[0] == '"' { // vLLM takes the schema as a string too
			var text string
			if err := json.Unmarshal(s, &text); err != nil {
				return nil, paramError("guided_json", "invalid_value", "guided_json: %v", err)
			}
			s = []byte(strings.TrimSpace(text))
		}
		if len(s) == 0 || s[0] != '{' {
			return nil, paramError("guided_json", "invalid_value", "guided_json must be a JSON schema object")
		}
		set("guided_json", brokerv1.Constraint_KIND_JSON_SCHEMA, string(s))
	}
	if o.GuidedRegex != nil {
		set("guided_regex", brokerv1.Constraint_KIND_REGEX, *o.GuidedRegex)
	}
	if o.GuidedGrammar != nil {
		set("guided_grammar", brokerv1.Constraint_KIND_GBNF, *o.GuidedGrammar)
	}
	if o.GuidedChoice != nil {
		if len(o.GuidedChoice) == 0 {
			return nil, paramError("guided_choice", "invalid_value", "guided_choice needs at least one choice")
		}
		alts := make([]string, len(o.GuidedChoice))
		for i, ch := range o.GuidedChoice {
			if ch == "" {
				return nil, paramError("guided_choice", "invalid_value", "guided_choice[%d] is empty", i)
			}
			alts[i] = gbnfString(ch)
		}
		set("guided_choice", brokerv1.Constraint_KIND_GBNF, "root ::= "+strings.Join(alts, " | "))
	}
	if len(found) > 1 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: at most one structured-output constraint per request", strings.Join(found, ", "))
	}
	return c, nil
}

// gbnfString is s as a GBNF string literal.
func gbnfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\x%02x`, r)
				continue
			}
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
