package httpapi

import (
	"io"
	"testing"
)

// TestOllamaNumPredict: -1 (no limit) and -2 (fill the context) ask for
// no bound, which brokerd runs to the end of the context; a positive
// count is the bound; other negatives are refused.
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
		{`{"model":"tiny-llm","prompt":"hi","stream":false,"options":{"num_predict":-3}}`, 400, 0},
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
	if resp.StatusCode != 400 {
		t.Errorf("chat with num_predict -5: %d", resp.StatusCode)
	}
}
