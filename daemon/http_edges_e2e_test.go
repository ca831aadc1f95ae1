package daemon

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/server/config"
)

// TestHTTPEdgesEndToEnd: the HTTP APIs' edges on a real brokerd (a
// generator loaded, an MLP in the repository): wrong-kind models, unknown
// models and too-long prompts answered with OpenAI's codes and without the
// gRPC API's words, temperature over 2 refused, /v1/models without the MLP,
// Ollama's store routes and keep_alive 0 refused with what to do,
// num_predict bounded by the context where max_tokens past it is refused,
// logit_bias applied and its ids checked, a
// semantic version, CORS from --http-cors-origins, and structured output
// the engine cannot enforce (a schema keyword, a malformed schema or
// regex, a regex whose (?i) classes fold too much) a 400 saying why.
func TestHTTPEdgesEndToEnd(t *testing.T) {
	cfg := tinyHTTPConfig(t)
	cfg.HTTPCORSOrigins = []string{"https://app.example.com"}
	writeMLP(t, cfg.ModelRepo, "mlp", 1, 1, 4, 8, 2)
	d := startDaemonWith(t, Options{Config: cfg, Tokenizers: byteTokenizers})
	base := "http://" + d.addrs.HTTP
	long := strings.Repeat("x", 200)
	chat := func(extra string) string {
		return `{"model":"tiny-llm","max_tokens":1,"stream":false,"messages":[{"role":"user","content":"x"}],` + extra + `}`
	}
	// 17 classes of 125,185 characters each that Go's parser would fold
	// one at a time, over the grammar's bound of 2M.
	foldHeavy, _ := json.Marshal("(?i)" + strings.Repeat(`[\x{42}-\x{1E942}]`, 17))
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      map[string]string
		code                     int
		want                     []string // in the body
		not                      []string
	}{
		{"an LLM asked for embeddings", "POST", "/v1/embeddings", `{"model":"tiny-llm","input":"x"}`, nil, 400,
			[]string{"generator (LLM) and gives no embeddings", "/v1/chat/completions"}, []string{"Infer", "Encode"}},
		{"an LLM asked for embeddings, Ollama", "POST", "/api/embed", `{"model":"tiny-llm","input":"x"}`, nil, 400,
			[]string{"gives no embeddings", "/api/generate"}, []string{"Infer", "Encode"}},
		{"an MLP asked to chat", "POST", "/v1/chat/completions", `{"model":"mlp","messages":[{"role":"user","content":"x"}]}`, nil, 400,
			[]string{"takes tensors"}, []string{"Generate", "Chat serves"}},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, nil, 404,
			[]string{`"code":"model_not_found"`}, nil},
		{"too long a prompt", "POST", "/v1/completions", `{"model":"tiny-llm","prompt":"` + long + `"}`, nil, 400,
			[]string{`"code":"context_length_exceeded"`}, nil},
		{"temperature over 2", "POST", "/v1/chat/completions", `{"model":"tiny-llm","temperature":2.5,"messages":[{"role":"user","content":"x"}]}`, nil, 400,
			[]string{`"param":"temperature"`, "decimal_above_max_value"}, nil},
		{"models", "GET", "/v1/models", "", nil, 200, []string{`"id":"tiny-llm"`}, []string{`"id":"mlp"`}},
		{"pull", "POST", "/api/pull", `{"model":"qwen2.5:0.5b"}`, nil, 501, []string{"brokerctl load"}, nil},
		{"unknown route", "POST", "/v1/assistants", `{}`, nil, 404, []string{"unknown_url"}, nil},
		// Ollama's num_predict is bounded by the context, as Ollama's
		// runners bound it; OpenAI's max_tokens past it is refused, as
		// OpenAI and vLLM refuse it.
		{"num_predict past the context", "POST", "/api/generate", `{"model":"tiny-llm","prompt":"x","stream":false,"options":{"num_predict":1000}}`, nil, 200,
			[]string{`"done":true`}, nil},
		{"num_predict -3", "POST", "/api/chat", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"stream":false,"options":{"num_predict":-3}}`, nil, 200,
			[]string{`"done":true`}, nil},
		{"max_tokens past the context", "POST", "/v1/completions", `{"model":"tiny-llm","prompt":"x","max_tokens":1000}`, nil, 400,
			[]string{`"code":"context_length_exceeded"`}, nil},
		// logit_bias by the byte tokenizer's ids (a byte's id is 3 more).
		{"logit_bias forces a token", "POST", "/v1/completions", `{"model":"tiny-llm","prompt":"x","max_tokens":3,"logit_bias":{"68":100}}`, nil, 200,
			[]string{`"text":"AAA"`}, nil},
		{"logit_bias past the vocabulary", "POST", "/v1/chat/completions", chat(`"logit_bias":{"300":1}`), nil, 400,
			[]string{"logit_bias token id 300 outside the vocabulary"}, nil},
		{"keep_alive 0", "POST", "/api/generate", `{"model":"tiny-llm","keep_alive":0}`, nil, 400, []string{"brokerctl unload tiny-llm"}, nil},
		{"version", "GET", "/api/version", "", nil, 200, []string{`"version":"0.0.0-dev+test"`}, nil},
		{"preflight, configured origin", "OPTIONS", "/v1/chat/completions", "",
			map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}, 204, nil, nil},
		{"preflight, loopback origin", "OPTIONS", "/api/chat", "",
			map[string]string{"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"}, 204, nil, nil},
		{"foreign origin", "GET", "/api/tags", "", map[string]string{"Origin": "https://evil.example.com"}, 403, []string{"--http-cors-origins"}, nil},
		// Structured output the engine cannot enforce: a 400 that says why,
		// before anything runs.
		{"a schema keyword not enforced", "POST", "/v1/chat/completions", chat(`"response_format":{"type":"json_schema","json_schema":{"name":"a","strict":true,"schema":{"type":"object","not":{}}}}`), nil, 400,
			[]string{"unsupported JSON schema", "invalid_request_error"}, nil},
		{"a malformed schema, Ollama", "POST", "/api/chat", chat(`"format":{"type":"object","properties":{"a":{"type":7}}}`), nil, 400, []string{"invalid grammar: type at root-a"}, nil},
		{"a malformed regex", "POST", "/v1/completions", `{"model":"tiny-llm","prompt":"x","guided_regex":"("}`, nil, 400, []string{"invalid grammar"}, nil},
		{"a regex folding too much", "POST", "/v1/completions", `{"model":"tiny-llm","prompt":"x","max_tokens":1,"guided_regex":` + string(foldHeavy) + `}`, nil, 400,
			[]string{"case-folds"}, nil},
		{"required calls of a tool whose schema is not enforced", "POST", "/v1/chat/completions",
			chat(`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","not":{}}}}],"tool_choice":"required"`), nil, 400, []string{"unsupported JSON schema"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rd io.Reader
			if tc.body != "" {
				rd = strings.NewReader(tc.body)
			}
			req, err := http.NewRequest(tc.method, base+tc.path, rd)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.code, b)
			}
			if len(b) > 0 && !json.Valid(b) {
				t.Errorf("not JSON: %s", b)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(b), w) {
					t.Errorf("body lacks %q: %s", w, b)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(string(b), w) {
					t.Errorf("body has %q: %s", w, b)
				}
			}
			if o := tc.hdr["Origin"]; o != "" && tc.code != 403 && resp.Header.Get("Access-Control-Allow-Origin") != o {
				t.Errorf("Access-Control-Allow-Origin %q, want %q", resp.Header.Get("Access-Control-Allow-Origin"), o)
			}
		})
	}
}

// tinyHTTPConfig serves tiny-llm (a 64-token context; byteTokenizers
// reads it) on the HTTP APIs of a free loopback port, without keys.
func tinyHTTPConfig(t *testing.T) config.Config {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	cfg.LoadModels = "tiny-llm"
	cfg.MaxContext = 64
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.HTTPAllowUnauthenticated = true
	writeTinyLlama(t, cfg.ModelRepo, "tiny-llm")
	return cfg
}

// TestOpenAIStreamSendsNoEmptyChunks: a streamed chat whose text is held
// back (here each token could start the stop string) sends no chunk of
// empty content for it, as vLLM sends none, and the held text comes at
// the end.
func TestOpenAIStreamSendsNoEmptyChunks(t *testing.T) {
	cfg := tinyHTTPConfig(t)
	d := startDaemonWith(t, Options{Config: cfg, Tokenizers: byteTokenizers})
	// logit_bias makes every token "A" (id 68), each a possible start of
	// the stop string "AAAAB".
	body := `{"model":"tiny-llm","stream":true,"max_tokens":3,"stop":["AAAAB"],"logit_bias":{"68":100},"messages":[{"role":"user","content":"x"}]}`
	resp, err := http.Post("http://"+d.addrs.HTTP+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"content":"AAA"`) {
		t.Fatalf("%d: %s", resp.StatusCode, b)
	}
	if n := strings.Count(string(b), `"delta":{"content":""}`); n > 0 {
		t.Errorf("%d chunks of empty content:\n%s", n, b)
	}
}
