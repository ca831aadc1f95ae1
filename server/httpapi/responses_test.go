package httpapi

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// respond posts to /v1/responses and decodes the answer (any status).
func respond(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp := post(t, url+"/v1/responses", body)
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("status %d: %v", resp.StatusCode, err)
	}
	return resp.StatusCode, m
}

// sseEvent is a streamed event: its event line and its data.
type sseEvent struct {
	name string
	data map[string]any
}

func readEvents(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var m map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m); err != nil {
				t.Fatalf("data %q: %v", line, err)
			}
			out = append(out, sseEvent{name, m})
			name = ""
		}
	}
	return out
}

// outputText joins a response's message texts, as the SDKs' output_text.
func outputText(resp map[string]any) string {
	var b strings.Builder
	for _, it := range resp["output"].([]any) {
		item := it.(map[string]any)
		if item["type"] != "message" {
			continue
		}
		for _, c := range item["content"].([]any) {
			b.WriteString(c.(map[string]any)["text"].(string))
		}
	}
	return b.String()
}

func itemTypes(resp map[string]any) []string {
	var out []string
	for _, it := range resp["output"].([]any) {
		out = append(out, it.(map[string]any)["type"].(string))
	}
	return out
}

func TestResponsesCreate(t *testing.T) {
	srv, f, _ := newTestServer(t)
	code, r := respond(t, srv.URL, `{"model":"tiny-llm","input":"hi","instructions":"be brief","max_output_tokens":50,"temperature":0.5,"metadata":{"k":"v"},"store":false}`)
	if code != 200 {
		t.Fatalf("status %d: %v", code, r)
	}
	if want := "chat(system=be brief|user=hi) ünïcode"; outputText(r) != want {
		t.Errorf("output %q, want %q", outputText(r), want)
	}
	if r["object"] != "response" || r["status"] != "completed" || !strings.HasPrefix(r["id"].(string), "resp_") || r["model"] != "tiny-llm" ||
		r["instructions"] != "be brief" || r["store"] != false || r["metadata"].(map[string]any)["k"] != "v" || r["incomplete_details"] != nil {
		t.Errorf("response %v", r)
	}
	msg := r["output"].([]any)[0].(map[string]any)
	if msg["role"] != "assistant" || msg["status"] != "completed" || !strings.HasPrefix(msg["id"].(string), "msg_") {
		t.Errorf("message %v", msg)
	}
	u := r["usage"].(map[string]any)
	if u["input_tokens"] != 2.0 || u["output_tokens"] != 10.0 || u["total_tokens"] != 12.0 || u["input_tokens_details"] == nil || u["output_tokens_details"] == nil {
		t.Errorf("usage %v", u)
	}
	sp := f.lastChat.GetSampling()
	if sp.GetMaxTokens() != 50 || sp.GetTemperature() != 0.5 || f.lastChat.GetTruncateHistory() {
		t.Errorf("chat sent %v", f.lastChat)
	}
}

// TestResponsesInputItems: typed items become the chat's turns: an
// assistant's reasoning, text and calls in one turn, a call's output a
// tool turn, developer a system message.
func TestResponsesInputItems(t *testing.T) {
	srv, f, _ := newTestServer(t)
	body := `{"model":"tiny-llm","store":false,"input":[
		{"role":"developer","content":"rules"},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"weather? "},{"type":"input_text","text":"Paris"}]},
		{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"look it up"}]},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking.","annotations":[]}]},
		{"type":"function_call","call_id":"call_a","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call_output","call_id":"call_a","output":"sunny"},
		{"role":"user","content":"thanks"}]}`
	if code, r := respond(t, srv.URL, body); code != 200 {
		t.Fatalf("status %d: %v", code, r)
	}
	msgs := f.lastChat.GetConversations()[0].GetMessages()
	var got []string
	for _, m := range msgs {
		s := m.GetRole() + ":" + m.GetContent()
		if m.GetReasoning() != "" {
			s += " reasoning=" + m.GetReasoning()
		}
		for _, tc := range m.GetToolCalls() {
			s += fmt.Sprintf(" call=%s/%s%s", tc.GetId(), tc.GetName(), tc.GetArguments())
		}
		if m.GetToolCallId() != "" {
			s += " for=" + m.GetToolCallId()
		}
		got = append(got, s)
	}
	want := []string{"system:rules", "user:weather? Paris", `assistant:Checking. reasoning=look it up call=call_a/get_weather{"city":"Paris"}`, "tool:sunny for=call_a", "user:thanks"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("messages\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestResponsesStream: the events come in the API's order, each with its
// event line, increasing sequence numbers and the right item ids; their
// deltas make the final response's text.
func TestResponsesStream(t *testing.T) {
	srv, _, _ := newTestServer(t)
	resp := post(t, srv.URL+"/v1/responses", `{"model":"tiny-llm","input":"hi","stream":true,"reasoning":{"effort":"high"}}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := readEvents(t, resp.Body)
	var kinds []string
	var text, reasoning strings.Builder
	for i, e := range evs {
		if e.name != e.data["type"] || e.data["sequence_number"] != float64(i) {
			t.Fatalf("event %d: name %q, data %v", i, e.name, e.data)
		}
		switch e.name {
		case "response.output_text.delta":
			text.WriteString(e.data["delta"].(string))
		case "response.reasoning_text.delta":
			reasoning.WriteString(e.data["delta"].(string))
		}
		if len(kinds) == 0 || kinds[len(kinds)-1] != e.name {
			kinds = append(kinds, e.name)
		}
	}
	want := []string{"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
		"response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if strings.Join(kinds, " ") != strings.Join(want, " ") {
		t.Fatalf("events\n%v\nwant\n%v", kinds, want)
	}
	final := evs[len(evs)-1].data["response"].(map[string]any)
	if outputText(final) != text.String() || reasoning.String() != "hmm, let me think" || strings.Join(itemTypes(final), ",") != "reasoning,message" {
		t.Errorf("final %v; streamed text %q reasoning %q", final, text.String(), reasoning.String())
	}
	if final["reasoning"].(map[string]any)["effort"] != "high" {
		t.Errorf("reasoning %v", final["reasoning"])
	}
	// Each item event names its item.
	ids := map[float64]string{}
	for _, e := range evs {
		if e.name == "response.output_item.added" {
			ids[e.data["output_index"].(float64)] = e.data["item"].(map[string]any)["id"].(string)
		} else if id, ok := e.data["item_id"]; ok && ids[e.data["output_index"].(float64)] != id {
			t.Errorf("%s names item %v at %v", e.name, id, e.data["output_index"])
		}
	}
}

// TestResponsesReasoningEffort: none turns thinking off, another effort on
// (with the template's reasoning_effort); an unknown one is refused.
func TestResponsesReasoningEffort(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		effort string
		think  bool
		items  string
	}{{"none", false, "message"}, {"low", true, "reasoning,message"}} {
		code, r := respond(t, srv.URL, `{"model":"tiny-llm","input":"hi","store":false,"reasoning":{"effort":"`+tc.effort+`"}}`)
		if code != 200 || strings.Join(itemTypes(r), ",") != tc.items {
			t.Errorf("effort %s: status %d, items %v", tc.effort, code, itemTypes(r))
		}
		kw := f.lastChat.GetChatTemplateKwargs().GetFields()
		if kw["enable_thinking"].GetBoolValue() != tc.think || tc.think && kw["reasoning_effort"].GetStringValue() != tc.effort {
			t.Errorf("effort %s: kwargs %v", tc.effort, kw)
		}
	}
	if code, _ := respond(t, srv.URL, `{"model":"tiny-llm","input":"hi","reasoning":{"effort":"huge"}}`); code != 400 {
		t.Errorf("an unknown effort: status %d", code)
	}
}

func TestResponsesTools(t *testing.T) {
	srv, f, _ := newTestServer(t)
	tools := `"tools":[{"type":"function","name":"get_weather","description":"d","parameters":{"type":"object"}},{"type":"function","name":"get_time"}]`
	for _, tc := range []struct {
		name, extra string
		calls       int
		tools       []string
		choice      brokerv1.ToolChoiceMode
	}{
		{"auto", ``, 2, []string{"get_weather", "get_time"}, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_UNSPECIFIED},
		{"parallel_tool_calls false", `,"parallel_tool_calls":false`, 1, []string{"get_weather", "get_time"}, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_UNSPECIFIED},
		{"max_tool_calls", `,"max_tool_calls":1`, 1, []string{"get_weather", "get_time"}, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_UNSPECIFIED},
		{"required", `,"tool_choice":"required"`, 2, []string{"get_weather", "get_time"}, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED},
		{"allowed_tools", `,"tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"get_weather"}]}`, 2,
			[]string{"get_weather"}, brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, r := respond(t, srv.URL, `{"model":"tiny-llm","store":false,"input":"`+callTwoTools+`",`+tools+tc.extra+`}`)
			if code != 200 {
				t.Fatalf("status %d: %v", code, r)
			}
			out := r["output"].([]any)
			if len(out) != tc.calls {
				t.Fatalf("output %v, want %d calls", out, tc.calls)
			}
			for i, it := range out {
				c := it.(map[string]any)
				if c["type"] != "function_call" || c["call_id"] != fmt.Sprintf("call_%d", i) || c["name"] != "get_weather" ||
					c["status"] != "completed" || !strings.HasPrefix(c["id"].(string), "fc_") {
					t.Errorf("call %d: %v", i, c)
				}
			}
			if a := out[0].(map[string]any)["arguments"]; a != `{"x": 1}` {
				t.Errorf("arguments %v", a)
			}
			var names []string
			for _, tl := range f.lastChat.GetTools() {
				names = append(names, tl.GetName())
			}
			if strings.Join(names, ",") != strings.Join(tc.tools, ",") || f.lastChat.GetToolChoice() != tc.choice {
				t.Errorf("chat tools %v choice %v", names, f.lastChat.GetToolChoice())
			}
		})
	}
	t.Run("streamed", func(t *testing.T) {
		resp := post(t, srv.URL+"/v1/responses", `{"model":"tiny-llm","store":false,"stream":true,"input":"`+callTwoTools+`",`+tools+`}`)
		args := map[string]string{}
		for _, e := range readEvents(t, resp.Body) {
			if e.name == "response.function_call_arguments.done" {
				args[e.data["item_id"].(string)] = e.data["arguments"].(string)
			}
		}
		if len(args) != 2 {
			t.Errorf("arguments of %d calls streamed: %v", len(args), args)
		}
	})
	t.Run("a named function", func(t *testing.T) {
		if code, r := respond(t, srv.URL, `{"model":"tiny-llm","store":false,"input":"x",`+tools+`,"tool_choice":{"type":"function","name":"get_time"}}`); code != 200 ||
			f.lastChat.GetToolChoiceFunction() != "get_time" || f.lastChat.GetToolChoice() != brokerv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION {
			t.Errorf("status %d %v; chat %v", code, r, f.lastChat)
		}
	})
}

func TestResponsesLogprobsAndFormat(t *testing.T) {
	srv, f, _ := newTestServer(t)
	code, r := respond(t, srv.URL, `{"model":"tiny-llm","input":"hi","store":false,"include":["message.output_text.logprobs"],"top_logprobs":2,
		"text":{"format":{"type":"json_schema","name":"v","schema":{"type":"object"},"strict":true}}}`)
	if code != 200 {
		t.Fatalf("status %d: %v", code, r)
	}
	part := r["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)
	lps := part["logprobs"].([]any)
	if float64(len(lps)) != r["usage"].(map[string]any)["output_tokens"] {
		t.Errorf("%d logprobs for %v tokens", len(lps), r["usage"])
	}
	var joined strings.Builder
	for _, l := range lps {
		e := l.(map[string]any)
		joined.WriteString(e["token"].(string))
		if len(e["top_logprobs"].([]any)) != 2 {
			t.Errorf("entry %v", e)
		}
	}
	if joined.String() != part["text"] {
		t.Errorf("tokens %q, text %q", joined.String(), part["text"])
	}
	c := f.lastChat.GetSampling().GetConstraint()
	if c.GetKind() != brokerv1.Constraint_KIND_JSON_SCHEMA || c.GetSource() != `{"type":"object"}` {
		t.Errorf("constraint %v", c)
	}
	if r["text"].(map[string]any)["format"].(map[string]any)["name"] != "v" {
		t.Errorf("text %v", r["text"])
	}
	// Without include, no logprobs: an empty list.
	_, r = respond(t, srv.URL, `{"model":"tiny-llm","input":"hi","store":false}`)
	if part := r["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any); len(part["logprobs"].([]any)) != 0 || f.lastChat.GetSampling().GetLogprobs() {
		t.Errorf("logprobs not asked for: %v", part)
	}
}

func get(t *testing.T, url, key string) (int, map[string]any) {
	t.Helper()
	return call(t, http.MethodGet, url, key)
}

func call(t *testing.T, method, url, key string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, m
}

// TestResponsesStore: a stored response is read back whole by its caller
// only, its input items listed, and continued by previous_response_id
// (its conversation and answer, not its instructions); deleted, it is
// gone.
func TestResponsesStore(t *testing.T) {
	srv, f, _ := newTestServer(t)
	code, first := respond(t, srv.URL, `{"model":"tiny-llm","instructions":"sys","input":[{"role":"user","content":"one"},{"role":"user","content":"two"}]}`)
	if code != 200 || first["store"] != true {
		t.Fatalf("status %d: %v", code, first)
	}
	id := first["id"].(string)
	code, got := get(t, srv.URL+"/v1/responses/"+id, testKey)
	if b1, b2 := mustJSON(first), mustJSON(got); code != 200 || string(b1) != string(b2) {
		t.Errorf("GET: status %d\n%s\nwant\n%s", code, b2, b1)
	}
	if code, _ := get(t, srv.URL+"/v1/responses/"+id, otherKey); code != 404 {
		t.Errorf("another caller's GET: status %d", code)
	}
	code, items := get(t, srv.URL+"/v1/responses/"+id+"/input_items", testKey)
	data := items["data"].([]any)
	if code != 200 || len(data) != 2 || data[0].(map[string]any)["content"] != "two" || items["has_more"] != false || items["first_id"] != data[0].(map[string]any)["id"] {
		t.Errorf("input_items: status %d %v", code, items)
	}
	_, page := get(t, srv.URL+"/v1/responses/"+id+"/input_items?order=asc&limit=1", testKey)
	if d := page["data"].([]any); len(d) != 1 || d[0].(map[string]any)["content"] != "one" || page["has_more"] != true {
		t.Errorf("a page: %v", page)
	}
	_, rest := get(t, srv.URL+"/v1/responses/"+id+"/input_items?order=asc&after="+page["last_id"].(string), testKey)
	if d := rest["data"].([]any); len(d) != 1 || d[0].(map[string]any)["content"] != "two" {
		t.Errorf("after the page: %v", rest)
	}

	code, second := respond(t, srv.URL, `{"model":"tiny-llm","previous_response_id":"`+id+`","input":"three"}`)
	if code != 200 || second["previous_response_id"] != id {
		t.Fatalf("continuation: status %d %v", code, second)
	}
	if want := "chat(user=one|user=two|assistant=chat(system=sys|user=one|user=two) ünïcode|user=three) ünïcode"; outputText(second) != want {
		t.Errorf("continuation answered %q, want %q", outputText(second), want)
	}
	// A chain: the third continues the second, whose conversation has the
	// first's.
	_, third := respond(t, srv.URL, `{"model":"tiny-llm","previous_response_id":"`+second["id"].(string)+`","input":"four","store":false}`)
	if n := len(f.lastChat.GetConversations()[0].GetMessages()); n != 6 {
		t.Errorf("the third sent %d messages, want 6: %v", n, third)
	}
	if code, _ := get(t, srv.URL+"/v1/responses/"+third["id"].(string), testKey); code != 404 {
		t.Errorf("store false was kept: %d", code)
	}
	if code, r := respond(t, srv.URL, `{"model":"tiny-llm","previous_response_id":"resp_nope","input":"x"}`); code != 404 || r["error"].(map[string]any)["param"] != "previous_response_id" {
		t.Errorf("an unknown previous response: %d %v", code, r)
	}
	if code, r := call(t, http.MethodDelete, srv.URL+"/v1/responses/"+id, otherKey); code != 404 {
		t.Errorf("another caller's DELETE: %d %v", code, r)
	}
	if code, r := call(t, http.MethodDelete, srv.URL+"/v1/responses/"+id, testKey); code != 200 || r["deleted"] != true {
		t.Errorf("DELETE: %d %v", code, r)
	}
	if code, _ := get(t, srv.URL+"/v1/responses/"+id, testKey); code != 404 {
		t.Errorf("GET after DELETE: %d", code)
	}
	if code, _ := call(t, http.MethodPost, srv.URL+"/v1/responses/"+second["id"].(string)+"/cancel", testKey); code != 400 {
		t.Errorf("cancel of a completed response: %d", code)
	}
}

// TestResponseStoreBounded: the store keeps the most recently used within
// its bytes, counts what it holds and evicts, and keeps none at 0.
func TestResponseStoreBounded(t *testing.T) {
	s := newResponseStore(3 * (storedOverhead + 400))
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.collectors()...)
	obj := map[string]any{"pad": strings.Repeat("x", 300)}
	for i := range 3 {
		s.put("c", fmt.Sprint(i), obj, nil, nil)
	}
	if _, ok := s.get("c", "0"); !ok { // now the most recently used
		t.Fatal("0 was dropped while there was room")
	}
	s.put("c", "3", obj, nil, nil)
	for id, want := range map[string]bool{"0": true, "1": false, "2": true, "3": true} {
		if _, ok := s.get("c", id); ok != want {
			t.Errorf("%s kept: %v, want %v", id, ok, want)
		}
	}
	if n := testutil.ToFloat64(s.count); n != 3 || testutil.ToFloat64(s.evicted) != 1 || testutil.ToFloat64(s.bytes) > float64(s.max) {
		t.Errorf("gauges: %v stored, %v evicted, %v bytes", n, testutil.ToFloat64(s.evicted), testutil.ToFloat64(s.bytes))
	}
	s.put("c", "big", map[string]any{"pad": strings.Repeat("x", int(s.max))}, nil, nil)
	if _, ok := s.get("c", "big"); ok || testutil.ToFloat64(s.count) != 3 {
		t.Error("a response larger than the store was kept, or pushed the others out")
	}
	none := newResponseStore(0)
	none.put("c", "x", obj, nil, nil)
	if _, ok := none.get("c", "x"); ok {
		t.Error("a store of 0 bytes kept a response")
	}
}

func TestResponsesRefusals(t *testing.T) {
	srv, _, _ := newTestServer(t)
	for _, tc := range []struct {
		body  string
		code  int
		param string
	}{
		{`{"model":"tiny-llm","input":5}`, 400, "input"},
		{`{"model":"tiny-llm","input":[{"type":"message","role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, 400, "input[0].content[0].type"},
		{`{"model":"tiny-llm","input":[{"type":"item_reference","id":"msg_1"}]}`, 400, "input[0].type"},
		{`{"model":"tiny-llm","input":[{"type":"web_search_call"}]}`, 400, "input[0].type"},
		{`{"model":"tiny-llm","input":[{"type":"function_call","name":"f"}]}`, 400, "input[0]"},
		{`{"model":"tiny-llm","input":[{"role":"robot","content":"x"}]}`, 400, "input[0].role"},
		{`{"model":"tiny-llm","input":"x","include":["file_search_call.results"]}`, 400, "include"},
		{`{"model":"tiny-llm","input":"x","background":true}`, 400, "background"},
		{`{"model":"tiny-llm","input":"x","conversation":"conv_1"}`, 400, "conversation"},
		{`{"model":"tiny-llm","input":"x","prompt":{"id":"p"}}`, 400, "prompt"},
		{`{"model":"tiny-llm","input":"x","truncation":"sometimes"}`, 400, "truncation"},
		{`{"model":"tiny-llm","input":"x","top_logprobs":21}`, 400, "top_logprobs"},
		{`{"model":"tiny-llm","input":"x","max_output_tokens":0}`, 400, "max_output_tokens"},
		{`{"model":"tiny-llm","input":"x","max_tool_calls":0}`, 400, "max_tool_calls"},
		{`{"model":"tiny-llm","input":"x","temperature":3}`, 400, "temperature"},
		{`{"model":"tiny-llm","input":"x","text":{"format":{"type":"json_schema","name":"v"}}}`, 400, "text.format.schema"},
		{`{"model":"tiny-llm","input":"x","text":{"format":{"type":"yaml"}}}`, 400, "text.format.type"},
		{`{"model":"tiny-llm","input":"x","tools":[{"type":"web_search"}]}`, 400, "tools[0].type"},
		{`{"model":"tiny-llm","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"g"}]}}`, 400, "tool_choice.tools[0]"},
		{`{"model":"tiny-llm","input":"x","tool_choice":{"type":"web_search"}}`, 400, "tool_choice"},
		{`{"model":"tiny-llm","input":[]}`, 400, "input"},
		{`{"input":"x"}`, 400, "model"},
		{`{"model":"no-such","input":"x"}`, 404, ""},
		{`{"model":"busy","input":"x"}`, 429, ""},
	} {
		code, r := respond(t, srv.URL, tc.body)
		e, _ := r["error"].(map[string]any)
		if code != tc.code || e == nil || tc.param != "" && e["param"] != tc.param {
			t.Errorf("%s: status %d %v, want %d param %q", tc.body, code, r, tc.code, tc.param)
		}
	}
	meta := map[string]string{}
	for i := range maxMetadataPairs + 1 {
		meta[fmt.Sprint(i)] = "v"
	}
	if code, _ := respond(t, srv.URL, `{"model":"tiny-llm","input":"x","metadata":`+string(mustJSON(meta))+`}`); code != 400 {
		t.Errorf("too much metadata: status %d", code)
	}
}

func TestResponsesTruncation(t *testing.T) {
	srv, f, _ := newTestServer(t)
	if code, _ := respond(t, srv.URL, `{"model":"tiny-llm","input":"x","truncation":"auto","store":false}`); code != 200 || !f.lastChat.GetTruncateHistory() {
		t.Errorf("status %d, truncate_history %v", code, f.lastChat.GetTruncateHistory())
	}
}

// TestChatReasoningEffort: chat's reasoning_effort turns thinking on or off
// as the Responses API's does; chat_template_kwargs' own values win.
func TestChatReasoningEffort(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		extra  string
		code   int
		think  bool
		effort string
	}{
		{`"reasoning_effort":"medium"`, 200, true, "medium"},
		{`"reasoning_effort":"none"`, 200, false, ""},
		{`"reasoning_effort":"low","chat_template_kwargs":{"enable_thinking":false}`, 200, false, "low"},
		{`"reasoning_effort":"max"`, 400, false, ""},
	} {
		resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],`+tc.extra+`}`)
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != tc.code {
			t.Errorf("%s: status %d %v %v", tc.extra, resp.StatusCode, m, err)
			continue
		}
		if tc.code != 200 {
			continue
		}
		kw := f.lastChat.GetChatTemplateKwargs().GetFields()
		msg := m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
		if kw["enable_thinking"].GetBoolValue() != tc.think || kw["reasoning_effort"].GetStringValue() != tc.effort || (msg["reasoning_content"] != nil) != tc.think {
			t.Errorf("%s: kwargs %v, message %v", tc.extra, kw, msg)
		}
	}
}
