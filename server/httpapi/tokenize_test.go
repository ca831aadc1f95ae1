package httpapi

import (
	"encoding/json"
	"testing"
)

func TestVLLMTokenize(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		name, path, body string
		code             int
		want             string
	}{
		{"a prompt", "/tokenize", `{"model":"tiny-llm","prompt":"ab"}`, 200, `{"count":2,"max_model_len":2048,"token_strs":null,"tokens":[97,98]}`},
		{"a prompt's strings", "/tokenize", `{"model":"tiny-llm:latest","prompt":"ab","return_token_strs":true}`, 200,
			`{"count":2,"max_model_len":2048,"token_strs":["a","b"],"tokens":[97,98]}`},
		{"messages", "/tokenize", `{"model":"tiny-llm","messages":[{"role":"developer","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"return_token_strs":true}`, 200,
			`{"count":2,"max_model_len":2048,"token_strs":["system=s","user=hi"],"tokens":[0,1]}`},
		{"an empty prompt", "/tokenize", `{"model":"tiny-llm","prompt":""}`, 200, `{"count":0,"max_model_len":2048,"token_strs":null,"tokens":[]}`},
		{"both", "/tokenize", `{"model":"tiny-llm","prompt":"a","messages":[{"role":"user","content":"x"}]}`, 400, ""},
		{"special tokens with messages", "/tokenize", `{"model":"tiny-llm","add_special_tokens":true,"messages":[{"role":"user","content":"x"}]}`, 400, ""},
		{"a bad tool", "/tokenize", `{"model":"tiny-llm","tools":[{"type":"retrieval"}],"messages":[{"role":"user","content":"x"}]}`, 400, ""},
		{"an unknown model", "/tokenize", `{"model":"nope","prompt":"a"}`, 404, ""},
		{"detokenize", "/detokenize", `{"model":"tiny-llm","tokens":[104,105]}`, 200, `{"prompt":"hi"}`},
		{"detokenize outside the vocabulary", "/detokenize", `{"model":"tiny-llm","tokens":[-1]}`, 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, srv.URL+tc.path, tc.body)
			var got json.RawMessage
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.code || tc.want != "" && string(mustJSON(got)) != tc.want {
				t.Errorf("status %d %s, want %d %s", resp.StatusCode, got, tc.code, tc.want)
			}
		})
	}
	// Messages render as chat renders them: tools, kwargs and the
	// generation prompt reach the chat request.
	post(t, srv.URL+"/tokenize", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,"continue_final_message":true,
		"chat_template_kwargs":{"enable_thinking":false},"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}`)
	c := f.lastTokenize.GetChat()
	if c.GetAddGenerationPrompt() || c.AddGenerationPrompt == nil || !c.GetContinueFinalMessage() || len(c.GetTools()) != 1 ||
		c.GetToolChoice().String() != "TOOL_CHOICE_MODE_REQUIRED" || c.GetChatTemplateKwargs().GetFields()["enable_thinking"].GetBoolValue() {
		t.Errorf("chat sent to Tokenize: %v", c)
	}
}

// TestResponsesInputTokens: the count is the prompt a response of the same
// body runs (its usage's input tokens), a continuation's included.
func TestResponsesInputTokens(t *testing.T) {
	srv, _, _ := newTestServer(t)
	_, first := respond(t, srv.URL, `{"model":"tiny-llm","input":"one"}`)
	body := `{"model":"tiny-llm","instructions":"sys","previous_response_id":"` + first["id"].(string) + `","input":[{"role":"user","content":"two"}]}`
	resp := post(t, srv.URL+"/v1/responses/input_tokens", body)
	var count map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&count); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d: %v", resp.StatusCode, err)
	}
	_, run := respond(t, srv.URL, body)
	if count["object"] != "response.input_tokens" || count["input_tokens"] != run["usage"].(map[string]any)["input_tokens"] || count["input_tokens"] != 4.0 {
		t.Errorf("counted %v; the response ran %v", count, run["usage"])
	}
	if resp := post(t, srv.URL+"/v1/responses/input_tokens", `{"model":"tiny-llm","input":"x","previous_response_id":"resp_x"}`); resp.StatusCode != 404 {
		t.Errorf("an unknown previous response: %d", resp.StatusCode)
	}
}
