package httpapi

import (
	"net/http"
	"testing"
)

// TestBearerScheme: the Authorization scheme is case-insensitive (RFC
// 7235), so "bearer KEY" is let in like "Bearer KEY"; a wrong key, another
// scheme or no key is still 401.
func TestBearerScheme(t *testing.T) {
	srv, _, _ := newTestServer(t)
	tests := []struct {
		header string
		want   int
	}{
		{"Bearer " + testKey, http.StatusOK},
		{"bearer " + testKey, http.StatusOK},
		{"BEARER " + testKey, http.StatusOK},
		{"Bearer  " + testKey, http.StatusOK}, // extra spaces before the token (RFC 7235's 1*SP)
		{"Bearer wrong", http.StatusUnauthorized},
		{"Basic " + testKey, http.StatusUnauthorized},
		{"Bearer" + testKey, http.StatusUnauthorized},
		{testKey, http.StatusUnauthorized},
		{"", http.StatusUnauthorized},
	}
	for _, tc := range tests {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/api/version", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.header != "" {
			req.Header.Set("Authorization", tc.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("Authorization %q: %d, want %d", tc.header, resp.StatusCode, tc.want)
		}
	}
}

// TestModelNames: Ollama's names map onto served names and back: :latest
// is the untagged name, any other tag (an Ollama store's) is kept.
func TestModelNames(t *testing.T) {
	for _, tc := range []struct{ in, served, shown string }{
		{"tiny-llm", "tiny-llm", "tiny-llm:latest"},
		{"tiny-llm:latest", "tiny-llm", "tiny-llm:latest"},
		{"qwen2.5:0.5b", "qwen2.5:0.5b", "qwen2.5:0.5b"},
		{"myuser/model:q8", "myuser/model:q8", "myuser/model:q8"},
		{"host:5000/ns/model", "host:5000/ns/model", "host:5000/ns/model:latest"},
	} {
		if got := modelName(tc.in); got != tc.served {
			t.Errorf("modelName(%q) = %q, want %q", tc.in, got, tc.served)
		}
		if got := tagged(tc.served); got != tc.shown {
			t.Errorf("tagged(%q) = %q, want %q", tc.served, got, tc.shown)
		}
	}
}
