package httpapi

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// The tools, tool_choice and a tool round trip reach Chat as brokerd's
// request: parameters as the caller wrote them, OpenAI's arguments string
// and Ollama's arguments object as JSON text, the tool's answer with its
// call's id.
func TestToolsRequest(t *testing.T) {
	srv, f, _ := newTestServer(t)
	const params = `{"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}`
	tool := &brokerv1.Tool{Name: "f", Description: "Does f.", Parameters: params}
	history := func(args string) []*brokerv1.ChatMessage {
		return []*brokerv1.ChatMessage{{Role: "user", Content: "x"},
			{Role: "assistant", ToolCalls: []*brokerv1.ToolCall{{Id: "call_1", Name: "f", Arguments: args}}},
			{Role: "tool", Content: "42", ToolCallId: "call_1"}}
	}
	for _, tc := range []struct {
		name, path, body string
		want             *brokerv1.ChatRequest
	}{
		{"openai auto", "/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"},
			{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"z\": \"q\"}"}}]},
			{"role":"tool","tool_call_id":"call_1","content":"42"}],
			"tools":[{"type":"function","function":{"name":"f","description":"Does f.","parameters":` + params + `}}],"tool_choice":"auto","parallel_tool_calls":true}`,
			&brokerv1.ChatRequest{Tools: []*brokerv1.Tool{tool}, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO,
				Conversations: []*brokerv1.Conversation{{Messages: history(`{"z": "q"}`)}}}},
		{"openai none", "/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],
			"tools":[{"type":"function","function":{"name":"f","description":"Does f.","parameters":` + params + `}}],"tool_choice":"none"}`,
			&brokerv1.ChatRequest{Tools: []*brokerv1.Tool{tool}, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE,
				Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "x"}}}}}},
		{"openai named", "/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],
			"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`,
			&brokerv1.ChatRequest{Tools: []*brokerv1.Tool{{Name: "f"}}, ToolChoice: brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION, ToolChoiceFunction: "f",
				Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "x"}}}}}},
		{"ollama", "/api/chat", `{"model":"tiny-llm","stream":false,"messages":[{"role":"user","content":"x"},
			{"role":"assistant","content":"","tool_calls":[{"id":"call_1","function":{"name":"f","arguments":{"z": "q"}}}]},
			{"role":"tool","content":"42","tool_call_id":"call_1","tool_name":"f"}],
			"tools":[{"type":"function","function":{"name":"f","description":"Does f.","parameters":` + params + `}}]}`,
			&brokerv1.ChatRequest{Tools: []*brokerv1.Tool{tool},
				Conversations: []*brokerv1.Conversation{{Messages: history(`{"z": "q"}`)}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, srv.URL+tc.path, tc.body)
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			got := &brokerv1.ChatRequest{Tools: f.lastChat.GetTools(), ToolChoice: f.lastChat.GetToolChoice(),
				ToolChoiceFunction: f.lastChat.GetToolChoiceFunction(), Conversations: f.lastChat.GetConversations()}
			if !proto.Equal(got, tc.want) {
				t.Errorf("Chat got\n%v\nwant\n%v", protojson.Format(got), protojson.Format(tc.want))
			}
		})
	}
}

func TestToolsRequestErrors(t *testing.T) {
	srv, _, _ := newTestServer(t)
	for _, tc := range []struct{ name, path, body, param string }{
		{"openai tool_choice unknown", "/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"always"}`, "tool_choice"},
		{"openai tool_choice no name", "/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function"}}`, "tool_choice"},
		{"openai a tool not a function", "/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]}`, "tools"},
		{"openai a call not a function", "/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"assistant","tool_calls":[{"type":"code","function":{"name":"f","arguments":"{}"}}]}]}`, ""},
		{"completions take no tools", "/v1/completions", `{"model":"tiny-llm","prompt":"x","tools":[{"type":"function","function":{"name":"f"}}]}`, ""},
		{"ollama a tool not a function", "/api/chat", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, srv.URL+tc.path, tc.body)
			var m struct {
				Error json.RawMessage `json:"error"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&m)
			if resp.StatusCode != 400 || len(m.Error) == 0 {
				t.Fatalf("%d %s", resp.StatusCode, m.Error)
			}
			if tc.param != "" {
				var e struct{ Param string }
				if json.Unmarshal(m.Error, &e) != nil || e.Param != tc.param {
					t.Errorf("error %s, want param %s", m.Error, tc.param)
				}
			}
		})
	}
}

// TestOpenAIToolCallsAnswer: a chat's calls in OpenAI's shape, whole and
// streamed (each call's first delta with its index, id, type and name),
// finish_reason tool_calls; parallel_tool_calls false answers the first
// call only, as vLLM does.
func TestOpenAIToolCallsAnswer(t *testing.T) {
	srv, f, _ := newTestServer(t)
	body := func(stream bool, parallel string) string {
		b := `{"model":"tiny-llm","messages":[{"role":"user","content":"` + callTwoTools + `"}],` +
			`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"stream":` + fmt.Sprint(stream)
		if parallel != "" {
			b += `,"parallel_tool_calls":` + parallel
		}
		return b + "}"
	}
	type call = openaiToolCall // read back as a client reads it
	for _, tc := range []struct {
		parallel string
		want     int
	}{{"", 2}, {"true", 2}, {"false", 1}} {
		t.Run("parallel_tool_calls "+tc.parallel, func(t *testing.T) {
			check := func(calls []call, finish string) {
				t.Helper()
				if len(calls) != tc.want || finish != "tool_calls" {
					t.Fatalf("%d calls, finish %q: %+v", len(calls), finish, calls)
				}
				for i, c := range calls {
					args := map[string]any{}
					if c.ID != fmt.Sprintf("call_%d", i) || c.Type != "function" || c.Function.Name != "f" || json.Unmarshal([]byte(c.Function.Arguments), &args) != nil {
						t.Errorf("call %d: %+v", i, c)
					}
				}
			}
			resp := post(t, srv.URL+"/v1/chat/completions", body(false, tc.parallel))
			// It reaches the broker, which holds tool_choice required to it.
			if got := f.lastChat.ParallelToolCalls; (tc.parallel == "") != (got == nil) || got != nil && fmt.Sprint(*got) != tc.parallel {
				t.Errorf("parallel_tool_calls %v sent, want %s", got, tc.parallel)
			}
			var whole struct {
				Choices []struct {
					Message struct {
						Content   *string `json:"content"`
						ToolCalls []call  `json:"tool_calls"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&whole); err != nil || len(whole.Choices) != 1 {
				t.Fatalf("%d: %v %+v", resp.StatusCode, err, whole)
			}
			ch := whole.Choices[0]
			if ch.Message.Content != nil {
				t.Errorf("content %q beside calls, want null", *ch.Message.Content)
			}
			for _, c := range ch.Message.ToolCalls {
				if c.Index != nil {
					t.Errorf("an answer's call has an index: %+v", c)
				}
			}
			check(ch.Message.ToolCalls, ch.FinishReason)

			resp = post(t, srv.URL+"/v1/chat/completions", body(true, tc.parallel))
			b, _ := io.ReadAll(resp.Body)
			var calls []call
			finish := ""
			for _, data := range sseData(b) {
				var chunk struct {
					Choices []struct {
						Delta struct {
							ToolCalls []call `json:"tool_calls"`
						} `json:"delta"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(data), &chunk); err != nil {
					t.Fatalf("%s: %v", data, err)
				}
				for _, c := range chunk.Choices {
					for _, d := range c.Delta.ToolCalls {
						if d.Index == nil || int(*d.Index) != len(calls) {
							t.Errorf("streamed call %+v after %d calls", d, len(calls))
						}
						calls = append(calls, d)
					}
					if c.FinishReason != nil {
						finish = *c.FinishReason
					}
				}
			}
			check(calls, finish)
		})
	}
}

// TestOllamaRoles: Ollama lowercases a message's role, so "User" and
// "SYSTEM" are the roles the template knows.
func TestOllamaRoles(t *testing.T) {
	srv, f, _ := newTestServer(t)
	resp := post(t, srv.URL+"/api/chat", `{"model":"tiny-llm","stream":false,"messages":[{"role":"SYSTEM","content":"s"},{"role":"User","content":"u"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var roles []string
	for _, m := range f.lastChat.GetConversations()[0].GetMessages() {
		roles = append(roles, m.GetRole())
	}
	if strings.Join(roles, ",") != "system,user" {
		t.Errorf("roles %v", roles)
	}
}
