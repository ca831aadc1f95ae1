package client

import brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"

// Structured output: set one of these as SamplingParams.Constraint and the
// answer stays inside it (every token sampled is one it allows; EOS only
// where the answer is complete). A constraint brokerd cannot compile is
// INVALID_ARGUMENT; a sequence whose constraint cannot go on ends with
// FINISH_REASON_CONSTRAINT. See the README for the JSON Schema keywords.

// JSON constrains the answer to a JSON object (Ollama's format "json",
// OpenAI's response_format json_object).
func JSON() *brokerv1.Constraint {
	return &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON}
}

// JSONSchema constrains the answer to JSON that validates against schema
// (a JSON Schema document, as text).
func JSONSchema(schema string) *brokerv1.Constraint {
	return &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_JSON_SCHEMA, Source: schema}
}

// Regex constrains the answer to a full match of a regular expression
// (RE2 syntax).
func Regex(re string) *brokerv1.Constraint {
	return &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_REGEX, Source: re}
}

// Grammar constrains the answer to a sentence of a grammar in llama.cpp's
// GBNF (start rule root).
func Grammar(gbnf string) *brokerv1.Constraint {
	return &brokerv1.Constraint{Kind: brokerv1.Constraint_KIND_GBNF, Source: gbnf}
}
