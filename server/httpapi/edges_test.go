package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// do sends a request with the test key (body "" : none) and headers.
func do(t *testing.T, method, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// ollamaErr and oaiErr read the two APIs' error shapes.
func ollamaErr(t *testing.T, b []byte) string {
	t.Helper()
	var m struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Error == "" {
		t.Fatalf("not Ollama's error shape: %s (%v)", b, err)
	}
	return m.Error
}

type oaiErrBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func oaiErr(t *testing.T, b []byte) oaiErrBody {
	t.Helper()
	var m struct {
		Error *oaiErrBody `json:"error"`
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Error == nil || m.Error.Message == "" {
		t.Fatalf("not OpenAI's error shape: %s (%v)", b, err)
	}
	// OpenAI always sends param and code, null when it has none.
	var raw map[string]map[string]json.RawMessage
	_ = json.Unmarshal(b, &raw)
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("error object lacks %q: %s", k, b)
		}
	}
	return *m.Error
}

func str(p *string) string {
	if p == nil {
		return "<null>"
	}
	return *p
}

// internals are words of brokerd's gRPC API and Go that an HTTP caller
// must not be told.
var internals = []string{"Infer", "Encode", "Generate ", "Chat ", "rpc error", "codes.", "InvalidArgument", "grpc"}

func checkNoInternals(t *testing.T, msg string) {
	t.Helper()
	for _, w := range internals {
		if strings.Contains(msg, w) {
			t.Errorf("message names %q: %s", w, msg)
		}
	}
}

// TestUnsupportedAndUnknownRoutes: Ollama's store routes say what to do
// instead; unknown paths and methods are answered in the API's own error
// shape.
func TestUnsupportedAndUnknownRoutes(t *testing.T) {
	srv, _, _ := newTestServer(t)
	for _, tc := range []struct {
		method, path, body string
		code               int
		openai             bool
		want               []string // in the message
		allow              string
	}{
		{"POST", "/api/pull", `{"model":"qwen2.5:0.5b"}`, 501, false, []string{"ollama pull", "brokerctl load", "repository"}, ""},
		{"POST", "/api/push", `{"model":"x"}`, 501, false, []string{"ollama push"}, ""},
		{"POST", "/api/create", `{"model":"x","from":"y"}`, 501, false, []string{"ollama create", "brokerctl load"}, ""},
		{"POST", "/api/copy", `{"source":"a","destination":"b"}`, 501, false, []string{"ollama cp", "brokerctl load"}, ""},
		{"DELETE", "/api/delete", `{"model":"x"}`, 501, false, []string{"brokerctl unload", "ollama rm"}, ""},
		{"POST", "/api/blobs/sha256:abc", "data", 501, false, []string{"blobs", "brokerctl load"}, ""},
		{"GET", "/api/nothing", "", 404, false, []string{"no route GET /api/nothing", "/api/chat", "/v1/chat/completions"}, ""},
		{"POST", "/api/tags", `{}`, 405, false, []string{"/api/tags takes GET"}, "GET"},
		{"GET", "/api/generate", "", 405, false, []string{"takes POST"}, "POST"},
		{"GET", "/nothing", "", 404, false, []string{"no route"}, ""},
		{"POST", "/v1/assistants", `{}`, 404, true, []string{"Invalid URL (POST /v1/assistants)", "/v1/chat/completions", "/v1/responses"}, ""},
		{"GET", "/v1/chat/completions", "", 405, true, []string{"takes POST"}, "POST"},
		{"DELETE", "/v1/models/tiny-llm", "", 405, true, []string{"takes GET"}, "GET"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			resp, b := do(t, tc.method, srv.URL+tc.path, tc.body, nil)
			if resp.StatusCode != tc.code || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				t.Fatalf("status %d type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
			}
			if got := resp.Header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
			var msg string
			if tc.openai {
				e := oaiErr(t, b)
				msg = e.Message
				if e.Type != "invalid_request_error" {
					t.Errorf("type %q", e.Type)
				}
				if tc.code == 404 && str(e.Code) != "unknown_url" {
					t.Errorf("code %s, want unknown_url", str(e.Code))
				}
			} else {
				msg = ollamaErr(t, b)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q: %s", w, msg)
				}
			}
			checkNoInternals(t, msg)
		})
	}
}

// TestOpenAIErrorCodes: OpenAI's error codes, params and types, and
// messages that say what to do in the HTTP API's words.
func TestOpenAIErrorCodes(t *testing.T) {
	srv, _, _ := newTestServer(t)
	chat := func(model, extra string) string {
		return `{"model":"` + model + `"` + extra + `,"messages":[{"role":"user","content":"x"}]}`
	}
	for _, tc := range []struct {
		name, path, body string
		key              string // "" : the test key
		status           int
		typ, code, param string
		want             string
	}{
		{"unknown model", "/v1/chat/completions", chat("nope", ""), "", 404, "invalid_request_error", "model_not_found", "<null>", "not found"},
		{"unknown model, embeddings", "/v1/embeddings", `{"model":"nope","input":"x"}`, "", 404, "invalid_request_error", "model_not_found", "<null>", "not found"},
		{"bad key", "/v1/chat/completions", chat("tiny-llm", ""), "wrong", 401, "invalid_request_error", "invalid_api_key", "<null>", "API key"},
		{"queue full", "/v1/chat/completions", chat("busy", ""), "", 429, "rate_limit_error", "rate_limit_exceeded", "<null>", "queue full"},
		{"draining", "/v1/completions", `{"model":"draining","prompt":"x"}`, "", 503, "server_error", "unavailable", "<null>", "draining"},
		{"temperature over 2", "/v1/chat/completions", chat("tiny-llm", `,"temperature":2.5`), "", 400, "invalid_request_error", "decimal_above_max_value", "temperature", "<= 2"},
		{"temperature over 2, completions", "/v1/completions", `{"model":"tiny-llm","prompt":"x","temperature":3}`, "", 400, "invalid_request_error", "decimal_above_max_value", "temperature", "<= 2"},
		{"max_tokens 0", "/v1/chat/completions", chat("tiny-llm", `,"max_tokens":0`), "", 400, "invalid_request_error", "integer_below_min_value", "max_tokens", ">= 1, but got 0"},
		{"max_completion_tokens below 1", "/v1/chat/completions", chat("tiny-llm", `,"max_completion_tokens":-4`), "", 400, "invalid_request_error", "integer_below_min_value", "max_completion_tokens", "got -4"},
		{"max_tokens 0, completions", "/v1/completions", `{"model":"tiny-llm","prompt":"x","max_tokens":0}`, "", 400, "invalid_request_error", "integer_below_min_value", "max_tokens", ">= 1"},
		{"negative temperature", "/v1/chat/completions", chat("tiny-llm", `,"temperature":-0.5`), "", 400, "invalid_request_error", "decimal_below_min_value", "temperature", ">= 0"},
		{"dimensions", "/v1/embeddings", `{"model":"nbmf-hash-v1","input":"x","dimensions":2}`, "", 400, "invalid_request_error", "invalid_value", "dimensions", "gives 4-dimensional"},
		{"an LLM asked for embeddings", "/v1/embeddings", `{"model":"tiny-llm","input":"x"}`, "", 400, "invalid_request_error", "<null>", "<null>", "generator (LLM) and gives no embeddings: use it with /v1/chat/completions"},
		{"an encoder asked to chat", "/v1/chat/completions", chat("nbmf-hash-v1", ""), "", 400, "invalid_request_error", "<null>", "<null>", "embedding model (kind hash-encoder) and does not generate text: use it with /v1/embeddings"},
		{"an MLP asked to complete", "/v1/completions", `{"model":"tiny-mlp","prompt":"x"}`, "", 400, "invalid_request_error", "<null>", "<null>", "takes tensors through brokerd's gRPC or KServe v2 API"},
		{"an MLP by id", "/v1/models/tiny-mlp", "", "", 404, "invalid_request_error", "model_not_found", "<null>", "does not serve"},
		{"a user message of null", "/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"user","content":null}]}`, "", 400,
			"invalid_request_error", "invalid_type", "messages.[0].content", "got null"},
		{"a system message without content", "/v1/chat/completions", `{"model":"tiny-llm","messages":[{"role":"system"},{"role":"user","content":"x"}]}`, "", 400,
			"invalid_request_error", "invalid_type", "messages.[0].content", "got null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{"Content-Type": "application/json"}
			if tc.key != "" {
				hdr["Authorization"] = "Bearer " + tc.key
			}
			method := "POST"
			if tc.body == "" {
				method = "GET"
			}
			resp, b := do(t, method, srv.URL+tc.path, tc.body, hdr)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			e := oaiErr(t, b)
			if e.Type != tc.typ || str(e.Code) != tc.code || str(e.Param) != tc.param || !strings.Contains(e.Message, tc.want) {
				t.Errorf("got %+v code %s param %s, want type %s code %s param %s message with %q", e, str(e.Code), str(e.Param), tc.typ, tc.code, tc.param, tc.want)
			}
			checkNoInternals(t, e.Message)
		})
	}
}

// TestContextLengthCode: a prompt longer than the model's context is
// OpenAI's context_length_exceeded.
func TestContextLengthCode(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want string
	}{
		{"prompt 0 is 9000 tokens; the model's context holds 8192, output included", "context_length_exceeded"},
		{"prompt 0 is 100 tokens and max_tokens is 9000: more than the model's context of 8192 tokens", "context_length_exceeded"},
		{`prompts[0]: models: invalid input: the prompt is over 64 tokens, the context of llm "tiny-llm"`, "context_length_exceeded"},
		{"prompts[0] is empty", "<null>"},
	} {
		err := status.Error(codes.InvalidArgument, tc.msg)
		if got := str(openaiCode(err, status.Convert(err))); got != tc.want {
			t.Errorf("%q: code %s, want %s", tc.msg, got, tc.want)
		}
	}
}

// TestOllamaEdges: keep_alive 0 with nothing to do is refused with what to
// do, with work it is answered (the model stays), other values
// are accepted; /api/embed's dimensions as /v1/embeddings'; an LLM asked
// for embeddings is told so.
func TestOllamaEdges(t *testing.T) {
	srv, _, _ := newTestServer(t)
	for _, tc := range []struct {
		name, path, body string
		code             int
		want             string
	}{
		{"keep_alive 0 on generate", "/api/generate", `{"model":"tiny-llm","keep_alive":0}`, 400, "brokerctl unload tiny-llm"},
		{"keep_alive \"0\" on chat", "/api/chat", `{"model":"tiny-llm:latest","messages":[],"keep_alive":"0"}`, 400, "brokerctl unload tiny-llm"},
		// With work to do, the work is answered and the model stays.
		{"keep_alive 0s on chat with messages", "/api/chat", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"stream":false,"keep_alive":"0s"}`, 200, ""},
		{"keep_alive 0 on generate with a prompt", "/api/generate", `{"model":"tiny-llm","prompt":"hi","stream":false,"keep_alive":0}`, 200, ""},
		{"keep_alive 0 on embed", "/api/embed", `{"model":"nbmf-hash-v1","input":"x","keep_alive":0}`, 200, ""},
		{"keep_alive 0 on embeddings", "/api/embeddings", `{"model":"nbmf-hash-v1","prompt":"x","keep_alive":0}`, 200, ""},
		{"keep_alive 0 on embed of nothing", "/api/embed", `{"model":"nbmf-hash-v1","input":[],"keep_alive":0}`, 400, "brokerctl unload"},
		{"keep_alive bad", "/api/generate", `{"model":"tiny-llm","keep_alive":"soon"}`, 400, "keep_alive"},
		{"keep_alive 5m loads", "/api/generate", `{"model":"tiny-llm","keep_alive":"5m"}`, 200, ""},
		{"keep_alive -1 loads", "/api/generate", `{"model":"tiny-llm","keep_alive":-1}`, 200, ""},
		{"keep_alive 300 generates", "/api/generate", `{"model":"tiny-llm","prompt":"hi","stream":false,"keep_alive":300}`, 200, ""},
		{"embed dimensions of the model", "/api/embed", `{"model":"nbmf-hash-v1","input":"x","dimensions":4}`, 200, ""},
		{"embed other dimensions", "/api/embed", `{"model":"nbmf-hash-v1","input":"x","dimensions":2}`, 400, "gives 4-dimensional embeddings"},
		{"an LLM asked for embeddings", "/api/embed", `{"model":"tiny-llm","input":"x"}`, 400, "generator (LLM) and gives no embeddings: use it with /api/generate or /api/chat"},
		{"an LLM asked for embeddings, old route", "/api/embeddings", `{"model":"tiny-llm","prompt":"x"}`, 400, "gives no embeddings"},
		{"an encoder asked to generate", "/api/generate", `{"model":"nbmf-hash-v1","prompt":"x"}`, 400, "does not generate text: use it with /api/embed"},
		{"an MLP asked to chat", "/api/chat", `{"model":"tiny-mlp","messages":[{"role":"user","content":"x"}]}`, 400, "takes tensors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := do(t, "POST", srv.URL+tc.path, tc.body, nil)
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.code, b)
			}
			if tc.code == 200 {
				return
			}
			msg := ollamaErr(t, b)
			if !strings.Contains(msg, tc.want) {
				t.Errorf("message lacks %q: %s", tc.want, msg)
			}
			checkNoInternals(t, msg)
		})
	}
}

// TestSemanticVersion: /api/version is a semantic version whatever the
// build's version string.
func TestSemanticVersion(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"1.2.3", "1.2.3"},
		{"v1.2.3", "1.2.3"},
		{"v0.4.0-rc.1+build.5", "0.4.0-rc.1+build.5"},
		{"v1.2.3-4-g6744c7d-dirty", "1.2.3-4-g6744c7d-dirty"},
		{"6744c7d", "0.0.0-dev+6744c7d"},
		{"6744c7d-dirty", "0.0.0-dev+6744c7d-dirty"},
		{"dev", "0.0.0-dev"},
		{"", "0.0.0-dev"},
		{"weird build/1..x", "0.0.0-dev+weird-build-1.x"},
	} {
		got := semanticVersion(tc.in)
		if got != tc.want || !semverRE.MatchString(got) {
			t.Errorf("semanticVersion(%q) = %q, want %q (semver: %v)", tc.in, got, tc.want, semverRE.MatchString(got))
		}
	}
	srv, _, _ := newTestServer(t) // its Version is "test"
	_, b := do(t, "GET", srv.URL+"/api/version", "", nil)
	var v struct{ Version string }
	if err := json.Unmarshal(b, &v); err != nil || v.Version != "0.0.0-dev+test" {
		t.Errorf("/api/version: %s (%v)", b, err)
	}
}

// TestOpenAIModelsServable: /v1/models lists the loaded generators and
// embedding models only (not "cold", in the repository but not loaded).
func TestOpenAIModelsServable(t *testing.T) {
	srv, _, _ := newTestServer(t)
	_, b := do(t, "GET", srv.URL+"/v1/models", "", nil)
	var list struct {
		Data []struct {
			ID      string
			Created int64
		}
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
		if m.ID == "tiny-llm" && m.Created != 1700000000 {
			t.Errorf("tiny-llm created %d, want its files' time", m.Created)
		}
	}
	if got, want := strings.Join(ids, ","), "nbmf-hash-v1,tiny-llm"; got != want {
		t.Errorf("/v1/models ids %s, want %s (no MLP, nothing unloaded)", got, want)
	}
	for _, tc := range []struct {
		id   string
		code int
	}{{"tiny-llm", 200}, {"nbmf-hash-v1", 200}, {"tiny-mlp", 404}, {"nope", 404}, {"cold", 404}} {
		if resp, b := do(t, "GET", srv.URL+"/v1/models/"+tc.id, "", nil); resp.StatusCode != tc.code {
			t.Errorf("/v1/models/%s: %d, want %d: %s", tc.id, resp.StatusCode, tc.code, b)
		}
	}
}

// TestCORS: loopback origins and the configured ones may call the APIs
// and their preflights are answered without an API key; others get 403.
func TestCORS(t *testing.T) {
	h := New(&fakeBackend{}, Options{APIKeys: []string{testKey}, Version: "test", Registerer: prometheus.NewRegistry(),
		Now: func() time.Time { return time.Unix(1_700_000_000, 0) }, CORSOrigins: []string{"https://app.example.com"}})
	srv := httptest.NewServer(h)
	defer srv.Close()
	anyH := New(&fakeBackend{}, Options{APIKeys: []string{testKey}, Registerer: prometheus.NewRegistry(), CORSOrigins: []string{"*"}})
	anySrv := httptest.NewServer(anyH)
	defer anySrv.Close()
	for _, tc := range []struct {
		name, base, method, path, origin string
		preflight                        bool
		code                             int
		allowOrigin                      string
	}{
		{"no origin", srv.URL, "GET", "/api/tags", "", false, 200, ""},
		{"localhost", srv.URL, "GET", "/api/tags", "http://localhost:3000", false, 200, "http://localhost:3000"},
		{"127.0.0.1", srv.URL, "POST", "/v1/embeddings", "http://127.0.0.1:8080", false, 200, "http://127.0.0.1:8080"},
		{"[::1]", srv.URL, "GET", "/v1/models", "http://[::1]:5173", false, 200, "http://[::1]:5173"},
		{"configured", srv.URL, "GET", "/api/tags", "https://app.example.com", false, 200, "https://app.example.com"},
		{"foreign", srv.URL, "GET", "/api/tags", "https://evil.example.com", false, 403, ""},
		{"foreign on /v1", srv.URL, "POST", "/v1/chat/completions", "https://evil.example.com", false, 403, ""},
		{"localhost look-alike", srv.URL, "GET", "/api/tags", "http://localhost.evil.com", false, 403, ""},
		{"preflight, loopback", srv.URL, "OPTIONS", "/v1/chat/completions", "http://localhost:3000", true, 204, "http://localhost:3000"},
		{"preflight, configured", srv.URL, "OPTIONS", "/api/chat", "https://app.example.com", true, 204, "https://app.example.com"},
		{"preflight, foreign", srv.URL, "OPTIONS", "/api/chat", "https://evil.example.com", true, 403, ""},
		{"plain OPTIONS", srv.URL, "OPTIONS", "/api/chat", "", false, 204, ""},
		{"any origin", anySrv.URL, "GET", "/api/tags", "https://evil.example.com", false, 200, "https://evil.example.com"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, tc.base+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.method == "POST" {
				req.Body = io.NopCloser(strings.NewReader(`{"model":"nbmf-hash-v1","input":"x","messages":[{"role":"user","content":"x"}]}`))
				req.Header.Set("Content-Type", "application/json")
			}
			if !tc.preflight {
				req.Header.Set("Authorization", "Bearer "+testKey)
			} else {
				req.Header.Set("Access-Control-Request-Method", "POST")
				req.Header.Set("Access-Control-Request-Headers", "authorization, content-type, x-stainless-os")
			}
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
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
			if got := resp.Header.Get("Access-Control-Allow-Origin"); got != tc.allowOrigin {
				t.Errorf("Access-Control-Allow-Origin %q, want %q", got, tc.allowOrigin)
			}
			if tc.code == 403 {
				var msg string
				if strings.HasPrefix(tc.path, "/v1/") {
					msg = oaiErr(t, b).Message
				} else {
					msg = ollamaErr(t, b)
				}
				if !strings.Contains(msg, "--http-cors-origins") {
					t.Errorf("message lacks the setting: %s", msg)
				}
			}
			if tc.preflight && tc.code == 204 {
				if m := resp.Header.Get("Access-Control-Allow-Methods"); !strings.Contains(m, "POST") {
					t.Errorf("Allow-Methods %q", m)
				}
				if hd := resp.Header.Get("Access-Control-Allow-Headers"); !strings.Contains(hd, "authorization") || !strings.Contains(hd, "x-stainless-os") {
					t.Errorf("Allow-Headers %q", hd)
				}
			}
			if tc.origin != "" && !strings.Contains(strings.Join(resp.Header.Values("Vary"), ","), "Origin") {
				t.Errorf("no Vary: Origin")
			}
		})
	}
}
