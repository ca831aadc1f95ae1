package httpapi

import (
	"bytes"
	"encoding/json"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// Tools (function calling) as OpenAI's and Ollama's APIs shape them. Both
// take OpenAI's tool objects; a call's arguments are a JSON string in
// OpenAI's messages and an object in Ollama's.

// apiTool is {"type": "function", "function": {...}}.
type apiTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
		Strict      *bool           `json:"strict"`
	} `json:"function"`
}

// toolsToProto converts a request's tools (their parameters as written).
func toolsToProto(ts []apiTool) ([]*brokerv1.Tool, error) {
	out := make([]*brokerv1.Tool, len(ts))
	for i, t := range ts {
		if t.Type != "function" {
			return nil, paramError("tools", "invalid_value", "tools[%d].type %q: only function tools are supported", i, t.Type)
		}
		p := bytes.TrimSpace(t.Function.Parameters)
		if string(p) == "null" {
			p = nil
		}
		out[i] = &brokerv1.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: string(p)}
	}
	return out, nil
}

// openaiToolChoice reads OpenAI's tool_choice: "none", "auto",
// "required", or {"type": "function", "function": {"name": ...}}.
func openaiToolChoice(raw json.RawMessage) (brokerv1.ToolChoiceMode, string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_UNSPECIFIED, "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto":
			return brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO, "", nil
		case "none":
			return brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE, "", nil
		case "required":
			return brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED, "", nil
		}
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &named) == nil && named.Type == "function" && named.Function.Name != "" {
		return brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION, named.Function.Name, nil
	}
	return 0, "", paramError("tool_choice", "invalid_value", `Invalid 'tool_choice': want "none", "auto", "required" or {"type": "function", "function": {"name": ...}}`)
}

// openaiToolCall is a call in OpenAI's shape: arguments a JSON string.
type openaiToolCall struct {
	Index    *int32 `json:"index,omitempty"` // streamed deltas only
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func openaiToolCalls(tcs []*brokerv1.ToolCall, streamed bool) []openaiToolCall {
	out := make([]openaiToolCall, len(tcs))
	for i, tc := range tcs {
		out[i] = openaiToolCall{ID: tc.GetId(), Type: "function"}
		out[i].Function.Name, out[i].Function.Arguments = tc.GetName(), tc.GetArguments()
		if streamed {
			out[i].Index = &tc.Index
		}
	}
	return out
}

// firstCall keeps the call of index 0 (a sequence's first) from tcs.
func firstCall(tcs []*brokerv1.ToolCall) []*brokerv1.ToolCall {
	var out []*brokerv1.ToolCall
	for _, tc := range tcs {
		if tc.GetIndex() == 0 {
			out = append(out, tc)
		}
	}
	return out
}

// openaiHistoryCalls reads an assistant message's calls (the template
// gets their arguments as a mapping: brokerd checks they are an object).
func openaiHistoryCalls(tcs []openaiToolCall) ([]*brokerv1.ToolCall, error) {
	out := make([]*brokerv1.ToolCall, len(tcs))
	for i, tc := range tcs {
		if tc.Type != "" && tc.Type != "function" {
			return nil, status.Errorf(codes.InvalidArgument, "a message's tool_calls[%d].type %q: only function calls are supported", i, tc.Type)
		}
		out[i] = &brokerv1.ToolCall{Id: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments, Index: int32(i)}
	}
	return out, nil
}

// ollamaToolCall is a call in Ollama's shape: arguments an object.
type ollamaToolCall struct {
	ID       string `json:"id,omitempty"`
	Function struct {
		Index     int32           `json:"index"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

func ollamaToolCalls(tcs []*brokerv1.ToolCall) []ollamaToolCall {
	if len(tcs) == 0 {
		return nil
	}
	out := make([]ollamaToolCall, len(tcs))
	for i, tc := range tcs {
		out[i].ID = tc.GetId()
		out[i].Function.Index, out[i].Function.Name = tc.GetIndex(), tc.GetName()
		out[i].Function.Arguments = json.RawMessage(tc.GetArguments())
	}
	return out
}

func ollamaHistoryCalls(tcs []ollamaToolCall) []*brokerv1.ToolCall {
	out := make([]*brokerv1.ToolCall, len(tcs))
	for i, tc := range tcs {
		args := bytes.TrimSpace(tc.Function.Arguments)
		if len(args) == 0 || string(args) == "null" {
			args = []byte("{}")
		}
		out[i] = &brokerv1.ToolCall{Id: tc.ID, Name: tc.Function.Name, Arguments: string(args), Index: int32(i)}
	}
	return out
}
