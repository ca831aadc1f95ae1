package httpapi

import (
	"encoding/json"
	"fmt"
	"io"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestOllamaNumPredict: -1 (no limit), -2 (fill the context) and other
// negatives ask for no bound, as in Ollama's runners, which brokerd runs
// to the end of the context; a positive count is the bound, and a limit
// (MaxTokensIsLimit), not a demand the context must meet.
func TestOllamaNumPredict(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		body string
		code int
		max  int32
	}{
		{`{"model":"tiny-llm","prompt":"hi","stream":false}`, 200, 0},
		{`{"model":"tiny-llm","prompt":"hi","stream":false,"options":{"num_predict":-1}}`, 200, 0},
		{`{"model":"tiny-llm","prompt":"hi","stream":false,"options":{"num_predict":-2}}`, 200, 0},
		{`{"model":"tiny-llm","prompt":"hi","stream":false,"options":{"num_predict":9}}`, 200, 9},
		{`{"model":"tiny-llm","prompt":"hi","stream":false,"options":{"num_predict":-3}}`, 200, 0},
	} {
		f.lastChat = nil
		resp := post(t, srv.URL+"/api/generate", tc.body)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d %s", tc.body, resp.StatusCode, b)
			continue
		}
		if tc.code == 200 && f.lastChat.GetSampling().GetMaxTokens() != tc.max {
			t.Errorf("%s: max_tokens %d sent, want %d", tc.body, f.lastChat.GetSampling().GetMaxTokens(), tc.max)
		}
	}
	resp := post(t, srv.URL+"/api/chat", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"options":{"num_predict":-5}}`)
	if resp.StatusCode != 200 || f.lastChat.GetSampling().GetMaxTokens() != 0 {
		t.Errorf("chat with num_predict -5: %d, max_tokens %d", resp.StatusCode, f.lastChat.GetSampling().GetMaxTokens())
	}
	if !f.limit {
		t.Error("an Ollama call's max_tokens is not marked a limit (MaxTokensIsLimit)")
	}
}

// TestOpenAICompletionsMaxTokens: /v1/completions without max_tokens writes
// 16 tokens at most, as OpenAI's and vLLM's legacy completions do (a
// limit: fewer where the prompt leaves less room); chat has no default.
func TestOpenAICompletionsMaxTokens(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		body  string
		max   int32
		limit bool
	}{
		{`{"model":"tiny-llm","prompt":"x"}`, 16, true},
		{`{"model":"tiny-llm","prompt":"x","max_tokens":40}`, 40, false},
		{`{"model":"tiny-llm","prompt":"x","max_completion_tokens":3}`, 3, false},
	} {
		resp := post(t, srv.URL+"/v1/completions", tc.body)
		b, _ := io.ReadAll(resp.Body)
		if got := f.lastGenerate.GetSampling().GetMaxTokens(); resp.StatusCode != 200 || got != tc.max || f.limit != tc.limit {
			t.Errorf("%s: %d %s: max_tokens %d (limit %v) sent, want %d (%v)", tc.body, resp.StatusCode, b, got, f.limit, tc.max, tc.limit)
		}
	}
	resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 200 || f.lastChat.GetSampling().GetMaxTokens() != 0 {
		t.Errorf("chat: %d, max_tokens %d sent, want none", resp.StatusCode, f.lastChat.GetSampling().GetMaxTokens())
	}
}

// TestOpenAILogitBias: logit_bias reaches the engine by token id; keys
// that are not ids and biases outside OpenAI's -100 to 100 are its 400.
func TestOpenAILogitBias(t *testing.T) {
	srv, f, _ := newTestServer(t)
	resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"logit_bias":{"7":-100,"12":5.5}}`)
	b, _ := io.ReadAll(resp.Body)
	if got := f.lastChat.GetSampling().GetLogitBias(); resp.StatusCode != 200 || len(got) != 2 || got[7] != -100 || got[12] != 5.5 {
		t.Errorf("chat: %d %s: logit_bias %v sent", resp.StatusCode, b, got)
	}
	resp = post(t, srv.URL+"/v1/completions", `{"model":"tiny-llm","prompt":"x","logit_bias":{"3":1}}`)
	b, _ = io.ReadAll(resp.Body)
	if got := f.lastGenerate.GetSampling().GetLogitBias(); resp.StatusCode != 200 || len(got) != 1 || got[3] != 1 {
		t.Errorf("completions: %d %s: logit_bias %v sent", resp.StatusCode, b, got)
	}
	for _, bias := range []string{`{"a":1}`, `{"-1":1}`, `{"99999999999":1}`, `{"5":100.5}`, `{"5":-101}`, `{"5":"x"}`, `[1]`} {
		resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"logit_bias":`+bias+`}`)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || (bias[0] == '{' && bias != `{"5":"x"}` && str(oaiErr(t, b).Param) != "logit_bias") {
			t.Errorf("logit_bias %s: %d %s", bias, resp.StatusCode, b)
		}
	}
}

// TestOpenAIFieldsNotServed: fields asking for what brokerd does not do
// are OpenAI's 400 naming them, never ignored; their neutral values pass.
func TestOpenAIFieldsNotServed(t *testing.T) {
	srv, _, _ := newTestServer(t)
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct{ path, body, param string }{
		{"/v1/completions", `{"model":"tiny-llm","prompt":"x","best_of":3}`, "best_of"},
		{"/v1/chat/completions", `{"model":"tiny-llm",` + msgs + `,"functions":[{"name":"f","parameters":{}}]}`, "functions"},
		{"/v1/chat/completions", `{"model":"tiny-llm",` + msgs + `,"function_call":"auto"}`, "function_call"},
		{"/v1/completions", `{"model":"tiny-llm","prompt":"x","best_of":1,"functions":null,"function_call":null}`, ""},
	} {
		resp := post(t, srv.URL+tc.path, tc.body)
		b, _ := io.ReadAll(resp.Body)
		switch {
		case tc.param == "" && resp.StatusCode != 200:
			t.Errorf("%s: %d %s", tc.body, resp.StatusCode, b)
		case tc.param != "" && (resp.StatusCode != 400 || str(oaiErr(t, b).Param) != tc.param):
			t.Errorf("%s: %d %s, want 400 naming %s", tc.body, resp.StatusCode, b, tc.param)
		}
	}
}

// TestOpenAILogprobsParams: OpenAI's limits on logprobs are answered in
// its error shape, before anything runs.
func TestOpenAILogprobsParams(t *testing.T) {
	srv, _, _ := newTestServer(t)
	for _, tc := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"top_logprobs":3}`, "top_logprobs"},
		{"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}`, "top_logprobs"},
		{"/v1/completions", `{"model":"tiny-llm","prompt":"x","logprobs":21}`, "logprobs"},
		{"/v1/completions", `{"model":"tiny-llm","prompt":"x","logprobs":-1}`, "logprobs"},
	} {
		resp := post(t, srv.URL+tc.path, tc.body)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || str(oaiErr(t, b).Param) != tc.param {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, resp.StatusCode, b)
		}
	}
}

// TestCompletionsLogprobsStreamed: streamed legacy logprobs carry each
// chunk's tokens, with offsets that go on across chunks.
func TestCompletionsLogprobsStreamed(t *testing.T) {
	srv, f, _ := newTestServer(t)
	resp := post(t, srv.URL+"/v1/completions", `{"model":"tiny-llm","prompt":"abcdefghij","stream":true,"logprobs":2}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if sp := f.lastGenerate.GetSampling(); !sp.GetLogprobs() || sp.GetTopLogprobs() != 2 {
		t.Errorf("sampling sent: %v", sp)
	}
	body, _ := io.ReadAll(resp.Body)
	var text strings.Builder
	var offsets []int
	for _, data := range sseData(body) {
		var chunk struct {
			Choices []struct {
				Text     string          `json:"text"`
				Logprobs *legacyLogprobs `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		for _, c := range chunk.Choices {
			if c.Text == "" {
				continue
			}
			lp := c.Logprobs
			if lp == nil || len(lp.Tokens) != 1 || lp.Tokens[0] != c.Text || len(lp.TopLogprobs[0]) != 2 {
				t.Fatalf("chunk %q: logprobs %+v", c.Text, lp)
			}
			if lp.TextOffset[0] != utf8.RuneCountInString(text.String()) {
				t.Errorf("chunk %q at offset %d, after %q", c.Text, lp.TextOffset[0], text.String())
			}
			offsets = append(offsets, lp.TextOffset[0])
			text.WriteString(c.Text)
		}
	}
	if text.String() != "gen: abcdefghij" || len(offsets) < 3 {
		t.Errorf("text %q, offsets %v", text.String(), offsets)
	}
}

// TestOllamaOptionTypes: options are read as Ollama reads them: a number
// with a fraction is an integer option's value (its fraction dropped),
// options brokerd does not apply are ignored, and a value of the wrong
// type is a 400 that names the option.
func TestOllamaOptionTypes(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		options string
		code    int
		check   func(sp *brokerv1.SamplingParams) bool
	}{
		{`{"num_predict":9.0,"top_k":40.7,"seed":1e10}`, 200, func(sp *brokerv1.SamplingParams) bool {
			return sp.GetMaxTokens() == 9 && sp.GetTopK() == 40 && sp.GetSeed() == 1e10
		}},
		{`{"num_predict":0}`, 200, func(sp *brokerv1.SamplingParams) bool { return sp.GetMaxTokens() == 0 }},
		{`{"num_ctx":8192,"num_gpu":99,"mirostat":"x","not_an_option":[1]}`, 200, func(*brokerv1.SamplingParams) bool { return true }},
		{`{"num_predict":null,"top_k":null}`, 200, func(sp *brokerv1.SamplingParams) bool { return sp.TopK == nil && sp.GetMaxTokens() == 0 }},
		{`{"num_predict":"5"}`, 400, nil},
		{`{"top_k":true}`, 400, nil},
		{`{"seed":[1]}`, 400, nil},
		{`{"num_predict":1e300}`, 400, nil},
	} {
		f.lastChat = nil
		resp := post(t, srv.URL+"/api/generate", `{"model":"tiny-llm","prompt":"hi","stream":false,"options":`+tc.options+`}`)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d %s", tc.options, resp.StatusCode, b)
			continue
		}
		if tc.code != 200 {
			var e struct{ Error string }
			if json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error, strings.Split(strings.Trim(tc.options, "{}"), `"`)[1]) {
				t.Errorf("%s: error %s does not name the option", tc.options, b)
			}
			continue
		}
		if !tc.check(f.lastChat.GetSampling()) {
			t.Errorf("%s: sampling sent %v", tc.options, f.lastChat.GetSampling())
		}
	}
}

// TestOllamaLogprobsParams: as in Ollama, top_logprobs applies only when
// logprobs is true (without it, no logprobs are computed or answered),
// and must be 0 to 20.
func TestOllamaLogprobsParams(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		fields   string
		code     int
		logprobs bool
		top      int32
	}{
		{`"logprobs":true,"top_logprobs":3`, 200, true, 3},
		{`"logprobs":true`, 200, true, 0},
		{`"top_logprobs":3`, 200, false, 0},
		{`"logprobs":true,"top_logprobs":21`, 400, false, 0},
		{`"top_logprobs":-1`, 400, false, 0},
	} {
		f.lastChat = nil
		resp := post(t, srv.URL+"/api/chat", `{"model":"tiny-llm","stream":false,"messages":[{"role":"user","content":"x"}],`+tc.fields+`}`)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d %s", tc.fields, resp.StatusCode, b)
			continue
		}
		if tc.code != 200 {
			continue
		}
		sp := f.lastChat.GetSampling()
		var m struct {
			Logprobs []logprobEntry `json:"logprobs"`
		}
		if sp.GetLogprobs() != tc.logprobs || sp.GetTopLogprobs() != tc.top || json.Unmarshal(b, &m) != nil || (len(m.Logprobs) > 0) != tc.logprobs {
			t.Errorf("%s: sampling %v, answer %s", tc.fields, sp, b)
		}
	}
}

// TestOllamaCapabilities: /api/show's capabilities as Ollama derives them
// from a template: tools where it renders tools, thinking where it thinks.
func TestOllamaCapabilities(t *testing.T) {
	for _, tc := range []struct {
		name, kind, template string
		want                 []string
	}{
		{"Qwen3", "llm", `{%- if tools %}{{- '<|im_start|>system\n' }}{%- for tool in tools %}{{ tool | tojson }}{%- endfor %}{%- endif %}` +
			`{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}`, []string{"completion", "tools", "thinking"}},
		{"Llama 3.1", "llm", `{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}{%- if tools is not none %}x{%- endif %}`, []string{"completion", "tools"}},
		{"no tools", "llm", `{% for m in messages %}{{ m.content }}{% endfor %}`, []string{"completion"}},
		{"a custom_tools variable only", "llm", `{{ custom_tools }}`, []string{"completion"}},
		{"Ollama's template", "llm", `{{- if .Tools }}{{ range .Tools }}{{ . }}{{ end }}{{ end }}{{ if .Think }}<think>{{ end }}`, []string{"completion", "tools", "thinking"}},
		{"an encoder", "bert", "", []string{"embedding"}},
	} {
		got := capabilities(&brokerv1.Model{Kind: tc.kind, Template: tc.template})
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestChatTruncateHistoryAsked: Ollama's chat drops a conversation's
// oldest turns to fit the context, as Ollama does; OpenAI's refuses it.
func TestChatTruncateHistoryAsked(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		route, body string
		want        bool
	}{
		{"/api/chat", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"stream":false}`, true},
		{"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}]}`, false},
	} {
		resp := post(t, srv.URL+tc.route, tc.body)
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 || f.lastChat.GetTruncateHistory() != tc.want {
			t.Errorf("%s: %d, truncate_history %v, want %v", tc.route, resp.StatusCode, f.lastChat.GetTruncateHistory(), tc.want)
		}
	}
}

// TestChatContinuesAPrefill: Ollama's chat continues a last assistant
// message of text (a prefill); OpenAI's does when asked, with vLLM's
// continue_final_message and add_generation_prompt.
func TestChatContinuesAPrefill(t *testing.T) {
	srv, f, _ := newTestServer(t)
	for _, tc := range []struct {
		route, body string
		cont        bool
		addGen      *bool
	}{
		{"/api/chat", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"{"}],"stream":false}`, true, nil},
		{"/api/chat", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"},{"role":"assistant","content":""}],"stream":false}`, false, nil},
		{"/api/chat", `{"model":"tiny-llm","messages":[{"role":"assistant","content":"{"},{"role":"user","content":"x"}],"stream":false}`, false, nil},
		{"/api/chat", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"{"}],"stream":false,"format":"json"}`, false, nil},
		{"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"{"}]}`, false, nil},
		{"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"{"}],` +
			`"continue_final_message":true,"add_generation_prompt":false}`, true, new(bool)},
	} {
		resp := post(t, srv.URL+tc.route, tc.body)
		io.Copy(io.Discard, resp.Body)
		got := f.lastChat
		if resp.StatusCode != 200 || got.GetContinueFinalMessage() != tc.cont || (got.AddGenerationPrompt == nil) != (tc.addGen == nil) {
			t.Errorf("%s %s: %d, continue_final_message %v, add_generation_prompt %v", tc.route, tc.body, resp.StatusCode, got.GetContinueFinalMessage(), got.AddGenerationPrompt)
		}
	}
}

// TestOpenAIVLLMSamplingExtras: vLLM's min_tokens, ignore_eos,
// stop_token_ids and include_stop_str_in_output reach the engine; a
// negative min_tokens is vLLM's 400.
func TestOpenAIVLLMSamplingExtras(t *testing.T) {
	srv, f, _ := newTestServer(t)
	resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],`+
		`"min_tokens":3,"ignore_eos":true,"stop_token_ids":[5,9],"include_stop_str_in_output":true}`)
	io.Copy(io.Discard, resp.Body)
	sp := f.lastChat.GetSampling()
	if resp.StatusCode != 200 || sp.GetMinTokens() != 3 || !sp.GetIgnoreEos() || !slices.Equal(sp.GetStopTokenIds(), []int32{5, 9}) || !sp.GetIncludeStopStrInOutput() {
		t.Errorf("%d: sampling %v", resp.StatusCode, sp)
	}
	resp = post(t, srv.URL+"/v1/completions", `{"model":"tiny-llm","prompt":"x","min_tokens":-1}`)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "min_tokens") {
		t.Errorf("min_tokens -1: %d %s", resp.StatusCode, b)
	}
}

// TestOpenAICompletionsEcho: echo puts each prompt before its completion
// (streamed: in its choice's first chunk); echo with logprobs is a 400 (no
// logprobs of prompt tokens).
func TestOpenAICompletionsEcho(t *testing.T) {
	srv, _, _ := newTestServer(t)
	prompts := []string{"alpha ", "beta "}
	// texts returns each choice's text, and whether each choice's first
	// streamed chunk started with its prompt.
	texts := func(echo, stream bool) ([]string, []bool) {
		t.Helper()
		resp := post(t, srv.URL+"/v1/completions", fmt.Sprintf(`{"model":"tiny-llm","prompt":["alpha ","beta "],"max_tokens":4,"echo":%v,"stream":%v}`, echo, stream))
		b, _ := io.ReadAll(resp.Body)
		out, firsts := make([]string, 2), make([]bool, 2)
		seen := make([]bool, 2)
		add := func(data []byte) {
			var v struct {
				Choices []struct {
					Index int
					Text  string
				}
			}
			if err := json.Unmarshal(data, &v); err != nil {
				t.Fatalf("%d %s: %v", resp.StatusCode, data, err)
			}
			for _, c := range v.Choices {
				if !seen[c.Index] {
					seen[c.Index], firsts[c.Index] = true, strings.HasPrefix(c.Text, prompts[c.Index])
				}
				out[c.Index] += c.Text
			}
		}
		if !stream {
			add(b)
			return out, firsts
		}
		for _, data := range sseData(b) {
			add([]byte(data))
		}
		return out, firsts
	}
	plain, _ := texts(false, false)
	for _, stream := range []bool{false, true} {
		got, firsts := texts(true, stream)
		for i, p := range prompts {
			if got[i] != p+plain[i] || stream && !firsts[i] {
				t.Errorf("stream %v, choice %d: %q (first chunk with the prompt: %v), want %q", stream, i, got[i], firsts[i], p+plain[i])
			}
		}
	}
	resp := post(t, srv.URL+"/v1/completions", `{"model":"tiny-llm","prompt":"x","echo":true,"logprobs":2}`)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "echo") {
		t.Errorf("echo with logprobs: %d %s", resp.StatusCode, b)
	}
}

// TestOpenAIChoices: n choices per prompt, indexed as the broker's
// answers (prompt i's j-th is choice i·n+j), each with its own message,
// chunks and finish; usage counts each prompt once.
func TestOpenAIChoices(t *testing.T) {
	srv, f, _ := newTestServer(t)
	resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"n":3}`)
	var whole struct {
		Choices []struct {
			Index   int
			Message struct{ Content string }
		}
		Usage struct {
			PromptTokens int32 `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&whole); err != nil || len(whole.Choices) != 3 || f.lastChat.GetSampling().GetN() != 3 {
		t.Fatalf("%d: %v %+v", resp.StatusCode, err, whole)
	}
	for i, c := range whole.Choices {
		want := "chat(user=x) ünïcode"
		if i > 0 {
			want += fmt.Sprintf(" #%d", i)
		}
		if c.Index != i || c.Message.Content != want {
			t.Errorf("choice %d: %+v, want index %d and %q", i, c, i, want)
		}
	}
	if whole.Usage.PromptTokens != 1 {
		t.Errorf("usage %+v: the prompt counted %d times", whole.Usage, whole.Usage.PromptTokens)
	}
	resp = post(t, srv.URL+"/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"n":2,"stream":true}`)
	b, _ := io.ReadAll(resp.Body)
	roles, finishes := make([]int, 2), make([]int, 2)
	texts := make([]string, 2)
	for _, data := range sseData(b) {
		var chunk struct {
			Choices []struct {
				Index int
				Delta struct {
					Role, Content string
				}
				FinishReason *string `json:"finish_reason"`
			}
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatal(err)
		}
		for _, c := range chunk.Choices {
			if c.Delta.Role != "" {
				roles[c.Index]++
			}
			if c.FinishReason != nil {
				finishes[c.Index]++
			}
			texts[c.Index] += c.Delta.Content
		}
	}
	if !slices.Equal(roles, []int{1, 1}) || !slices.Equal(finishes, []int{1, 1}) || texts[1] != texts[0]+" #1" {
		t.Errorf("streamed: roles %v finishes %v texts %q", roles, finishes, texts)
	}
	// Completions: two prompts, two choices each, echoed.
	resp = post(t, srv.URL+"/v1/completions", `{"model":"tiny-llm","prompt":["a","b"],"n":2,"max_tokens":3,"echo":true}`)
	var legacy struct {
		Choices []struct {
			Index int
			Text  string
		}
		Usage struct {
			PromptTokens int32 `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&legacy); err != nil || len(legacy.Choices) != 4 {
		t.Fatalf("%d: %v %+v", resp.StatusCode, err, legacy)
	}
	for i, want := range []string{"agen: a", "agen: a #1", "bgen: b", "bgen: b #1"} {
		if c := legacy.Choices[i]; c.Index != i || c.Text != want {
			t.Errorf("completion choice %d: %+v, want %q", i, c, want)
		}
	}
	if legacy.Usage.PromptTokens != 2 {
		t.Errorf("completions usage: prompt tokens %d, want each prompt once (1 + 1)", legacy.Usage.PromptTokens)
	}
}

// sseData is a server-sent event stream's data payloads, [DONE] left out.
func sseData(body []byte) []string {
	var out []string
	for _, line := range strings.Split(string(body), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			out = append(out, data)
		}
	}
	return out
}

// TestOpenAIChoicesAllocateNothingUpFront: a request of many prompts and
// a large n allocates nothing per choice before the broker has checked
// their number (it allocated prompts × n states first: 705 MB for a
// 300 KB body of 100,000 empty prompts with n 128).
func TestOpenAIChoicesAllocateNothingUpFront(t *testing.T) {
	srv, _, _ := newTestServer(t)
	body := `{"model":"nope","n":128,"prompt":[""` + strings.Repeat(`,""`, 99999) + `]}`
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	resp := post(t, srv.URL+"/v1/completions", body)
	io.Copy(io.Discard, resp.Body)
	goruntime.ReadMemStats(&after)
	if resp.StatusCode != 404 {
		t.Fatalf("%d, want the unknown model's 404", resp.StatusCode)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 100<<20 {
		t.Errorf("%d MB allocated for a %d KB request", got>>20, len(body)>>10)
	}
}
