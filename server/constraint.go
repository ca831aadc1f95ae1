package server

import (
	"encoding/json"
	"fmt"
	"strings"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
)

// constraintFromProto is SamplingParams.constraint as the engine takes it
// (nil: none). The source is compiled with the model's vocabulary when the
// sequence is made: only its shape is checked here.
func constraintFromProto(c *brokerv1.Constraint) (*llm.Constraint, error) {
	if c == nil {
		return nil, nil
	}
	var kind grammar.Kind
	switch c.GetKind() {
	case brokerv1.Constraint_KIND_JSON:
		if c.GetSource() != "" {
			return nil, invalid("sampling.constraint: KIND_JSON (any JSON object) takes no source; a schema is KIND_JSON_SCHEMA")
		}
		return &llm.Constraint{Kind: grammar.KindJSON}, nil
	case brokerv1.Constraint_KIND_JSON_SCHEMA:
		kind = grammar.KindJSONSchema
	case brokerv1.Constraint_KIND_REGEX:
		kind = grammar.KindRegex
	case brokerv1.Constraint_KIND_GBNF:
		kind = grammar.KindGBNF
	default:
		return nil, invalid("sampling.constraint.kind %v: want KIND_JSON, KIND_JSON_SCHEMA, KIND_REGEX or KIND_GBNF", c.GetKind())
	}
	if strings.TrimSpace(c.GetSource()) == "" {
		return nil, invalid("sampling.constraint: %v needs a source", c.GetKind())
	}
	return &llm.Constraint{Kind: kind, Source: c.GetSource()}, nil
}

// ToolCallSchema is the JSON Schema of one call of one of tools: an object
// {"name": <a tool's name>, "arguments": <that tool's parameters>}, an
// anyOf over the tools (one tool: its schema alone), for a constraint
// (KIND_JSON_SCHEMA) of the call's JSON that the model's call format
// wraps (Hermes: "<tool_call>\n" … "\n</tool_call>"). A tool without
// parameters takes any JSON object.
func ToolCallSchema(tools []*brokerv1.Tool) (string, error) {
	alts, err := toolAlternatives(tools, "arguments")
	if err != nil {
		return "", err
	}
	if len(alts) == 1 {
		return string(alts[0]), nil
	}
	b, err := json.Marshal(map[string]any{"anyOf": alts})
	return string(b), err
}

// RequiredToolsSchema is vLLM's constraint of tool_choice "required": a
// JSON array of one call or more, each {"name": <a tool's name>,
// "parameters": <that tool's parameters>}. (A named function's is that
// function's parameters schema itself.)
func RequiredToolsSchema(tools []*brokerv1.Tool) (string, error) {
	alts, err := toolAlternatives(tools, "parameters")
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(map[string]any{"type": "array", "minItems": 1, "items": map[string]any{"anyOf": alts}})
	return string(b), err
}

// toolAlternatives are the object schemas {"name": const, args: params},
// one per tool.
func toolAlternatives(tools []*brokerv1.Tool, args string) ([]json.RawMessage, error) {
	if len(tools) == 0 {
		return nil, invalid("a tool-call constraint needs tools")
	}
	alts := make([]json.RawMessage, 0, len(tools))
	for i, t := range tools {
		params := json.RawMessage(`{"type": "object"}`)
		if p := strings.TrimSpace(t.GetParameters()); p != "" {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal([]byte(p), &obj); err != nil {
				return nil, invalid("tools[%d].parameters is not a JSON object: %v", i, err)
			}
			params = json.RawMessage(p)
		}
		name, err := json.Marshal(t.GetName())
		if err != nil {
			return nil, err
		}
		alts = append(alts, json.RawMessage(fmt.Sprintf(
			`{"type": "object", "properties": {"name": {"const": %s}, %q: %s}, "required": ["name", %q], "additionalProperties": false}`,
			name, args, params, args)))
	}
	return alts, nil
}
