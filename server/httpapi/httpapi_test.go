package httpapi

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/server/httpapi/nodeclients"
)

// testKey and otherKey are two callers' keys.
const (
	testKey  = "secret-key"
	otherKey = "other-key"
)

func newTestServer(t *testing.T) (*httptest.Server, *fakeBackend, *Handler) {
	t.Helper()
	f := &fakeBackend{}
	h := New(f, Options{APIKeys: []string{testKey, otherKey}, Version: "test", Registerer: prometheus.NewRegistry(), ResponseStoreBytes: 1 << 20,
		Now: func() time.Time { return time.Unix(1_700_000_000, 0) }})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, f, h
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestOllamaShapes(t *testing.T) {
	srv, f, _ := newTestServer(t)
	t.Run("generate streams NDJSON and ends with done", func(t *testing.T) {
		resp := post(t, srv.URL+"/api/generate", `{"model":"tiny-llm:latest","prompt":"hi","system":"sys","options":{"num_predict":5,"seed":3,"temperature":0.5,"stop":["x"]}}`)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("status %d type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var text strings.Builder
		var last map[string]any
		sc := bufio.NewScanner(resp.Body)
		lines := 0
		for sc.Scan() {
			lines++
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			text.WriteString(m["response"].(string))
			last = m
		}
		if want := "chat(system=sys|user=hi) ünïcode"; text.String() != want || lines < 3 {
			t.Errorf("text %q over %d lines, want %q", text.String(), lines, want)
		}
		if last["done"] != true || last["done_reason"] != "length" && last["done_reason"] != "stop" || last["eval_count"] == nil || last["total_duration"] == nil {
			t.Errorf("last line %v", last)
		}
		sp := f.lastChat.GetSampling()
		if f.lastChat.GetModel() != "tiny-llm" || sp.GetMaxTokens() != 5 || sp.GetSeed() != 3 || sp.GetTemperature() != 0.5 || len(sp.GetStop()) != 1 {
			t.Errorf("chat request sent: %v", f.lastChat)
		}
	})
	t.Run("raw generate skips the template", func(t *testing.T) {
		resp := post(t, srv.URL+"/api/generate", `{"model":"tiny-llm","prompt":"hi","raw":true,"stream":false}`)
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		if m["response"] != "gen: hi" || m["done"] != true {
			t.Errorf("raw: %v", m)
		}
	})
	t.Run("empty prompt loads", func(t *testing.T) {
		resp := post(t, srv.URL+"/api/generate", `{"model":"tiny-llm"}`)
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		if m["done_reason"] != "load" {
			t.Errorf("load: %v", m)
		}
		if resp := post(t, srv.URL+"/api/generate", `{"model":"nope"}`); resp.StatusCode != 404 {
			t.Errorf("load of an unknown model: %d", resp.StatusCode)
		}
	})
	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			path, body string
			code       int
		}{
			{"/api/generate", `{"model":"tiny-llm","prompt":"x","format":"yaml"}`, 400},
			{"/api/chat", `{"model":"tiny-llm","messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]}`, 400},
			{"/api/chat", `{"model":"busy","messages":[{"role":"user","content":"x"}]}`, 429},
			{"/api/embed", `{"model":"draining","input":"x"}`, 503},
			{"/api/embed", `not json`, 400},
			{"/api/embed", `{"model":"nbmf-hash-v1","input":42}`, 400},
		} {
			resp := post(t, srv.URL+tc.path, tc.body)
			var m map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&m)
			if resp.StatusCode != tc.code || m["error"] == nil || m["error"] == "" {
				t.Errorf("%s %s: %d %v, want %d with an error", tc.path, tc.body, resp.StatusCode, m, tc.code)
			}
		}
	})
}

func TestOpenAIShapes(t *testing.T) {
	srv, f, h := newTestServer(t)
	t.Run("chat stream: role first, finish, usage, DONE", func(t *testing.T) {
		resp := post(t, srv.URL+"/v1/chat/completions", `{"model":"tiny-llm","stream":true,"stream_options":{"include_usage":true},"max_tokens":9,
			"messages":[{"role":"developer","content":"d"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`)
		if resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("type %q", resp.Header.Get("Content-Type"))
		}
		body, _ := io.ReadAll(resp.Body)
		events := strings.Split(strings.TrimSpace(string(body)), "\n\n")
		if events[len(events)-1] != "data: [DONE]" {
			t.Fatalf("last event %q", events[len(events)-1])
		}
		var text strings.Builder
		var sawRole, sawFinish, sawUsage bool
		for _, e := range events[:len(events)-1] {
			var c struct {
				Choices []struct {
					Delta        map[string]string `json:"delta"`
					FinishReason *string           `json:"finish_reason"`
				} `json:"choices"`
				Usage *openaiUsage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(e, "data: ")), &c); err != nil {
				t.Fatalf("event %q: %v", e, err)
			}
			for _, ch := range c.Choices {
				sawRole = sawRole || ch.Delta["role"] == "assistant"
				text.WriteString(ch.Delta["content"])
				sawFinish = sawFinish || (ch.FinishReason != nil && *ch.FinishReason == "stop")
			}
			sawUsage = sawUsage || (c.Usage != nil && c.Usage.TotalTokens > 0 && len(c.Choices) == 0)
		}
		if text.String() != "chat(system=d|user=ab) ünïcode" || !sawRole || !sawFinish || !sawUsage {
			t.Errorf("text %q role %v finish %v usage %v", text.String(), sawRole, sawFinish, sawUsage)
		}
		if f.lastChat.GetSampling().GetMaxTokens() != 9 {
			t.Errorf("max_tokens not passed: %v", f.lastChat.GetSampling())
		}
	})
	t.Run("errors in OpenAI's shape and codes", func(t *testing.T) {
		for _, tc := range []struct {
			body       string
			code       int
			typ        string
			retryAfter string
		}{
			{`{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "invalid_request_error", ""},
			{`{"model":"busy","messages":[{"role":"user","content":"x"}]}`, 429, "rate_limit_error", "2"},
			{`{"model":"draining","messages":[{"role":"user","content":"x"}]}`, 503, "server_error", ""},
			{`{"model":"tiny-llm","n":0,"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error", ""},
			{`{"model":"tiny-llm","n":129,"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error", ""},
			{`{"model":"tiny-llm","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "invalid_request_error", ""},
		} {
			resp := post(t, srv.URL+"/v1/chat/completions", tc.body)
			var m struct {
				Error openaiError `json:"error"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&m)
			if resp.StatusCode != tc.code || m.Error.Type != tc.typ || m.Error.Message == "" || resp.Header.Get("Retry-After") != tc.retryAfter {
				t.Errorf("%s: %d %+v retry-after %q", tc.body, resp.StatusCode, m, resp.Header.Get("Retry-After"))
			}
		}
	})
	t.Run("no key is 401", func(t *testing.T) {
		resp, err := http.Get(srv.URL + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("status %d", resp.StatusCode)
		}
	})
	if n := testutil.ToFloat64(h.reqs.WithLabelValues("POST /v1/chat/completions", "429")); n != 1 {
		t.Errorf("http requests metric for the 429: %v", n)
	}
}

// TestOfficialClients runs the npm ollama and openai clients against the
// handler (with the fake backend behind it), over a real socket.
func TestOfficialClients(t *testing.T) {
	srv, _, _ := newTestServer(t)
	runNodeClients(t, srv.URL, testKey, "fake", nil)
}

// runNodeClients runs testdata/node/clients.mjs.
func runNodeClients(t *testing.T, base, key, mode string, env []string) {
	t.Helper()
	nodeclients.Run(t, base, key, mode, env)
}

// TestAdmitCharges: every request is charged through Admit (its overhead,
// then twice its body as it is read, not its declared length, then what
// decoding it builds), released
// when answered, and a refusal is answered in the API's shape.
func TestAdmitCharges(t *testing.T) {
	f := &fakeBackend{}
	var held int64
	var charges []int64
	full := false
	h := New(f, Options{Admit: func(route string, n int64) (func(), error) {
		if full {
			return nil, status.Error(codes.ResourceExhausted, "budget full")
		}
		charges = append(charges, n)
		held += n
		return func() { held -= n }, nil
	}})
	srv := httptest.NewServer(h)
	defer srv.Close()
	body := `{"model":"nbmf-hash-v1","input":"abc"}`
	resp, err := http.Post(srv.URL+"/api/embed", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if want := fmt.Sprint([]int64{requestOverhead, 2 * int64(len(body)), decodedCost([]byte(body))}); resp.StatusCode != 200 || fmt.Sprint(charges) != want || held != 0 {
		t.Errorf("status %d, charges %v (want %s), %d bytes still held", resp.StatusCode, charges, want, held)
	}
	full = true
	resp, err = http.Post(srv.URL+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"nbmf-hash-v1","input":"abc"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("over budget: %d", resp.StatusCode)
	}
}
