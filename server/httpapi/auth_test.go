package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
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

// clientBackend records the caller's name each chat call carries.
type clientBackend struct {
	fakeBackend
	mu      sync.Mutex
	clients []string
}

func (b *clientBackend) RunChat(ctx context.Context, req *brokerv1.ChatRequest, send func([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult) error) error {
	c, ok := ClientFrom(ctx)
	if !ok {
		c = "(none)"
	}
	b.mu.Lock()
	b.clients = append(b.clients, c)
	b.mu.Unlock()
	return b.fakeBackend.RunChat(ctx, req, send)
}

// TestClientIdentity: each HTTP call carries its caller's name for the
// scheduler's fairness between clients: its API key's (one per key, the
// key itself not in it) or, without keys, its address's.
func TestClientIdentity(t *testing.T) {
	sum := func(k string) string { s := sha256.Sum256([]byte(k)); return "key:" + hex.EncodeToString(s[:6]) }
	for _, tc := range []struct {
		name string
		keys []string
		used []string // the key of each call ("" for none)
		want []string
	}{
		{"no keys: the address", nil, []string{"", ""}, []string{"ip:127.0.0.1", "ip:127.0.0.1"}},
		{"one client a key", []string{"alpha-key", "beta-key"}, []string{"alpha-key", "beta-key", "alpha-key"},
			[]string{sum("alpha-key"), sum("beta-key"), sum("alpha-key")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &clientBackend{}
			srv := httptest.NewServer(New(b, Options{APIKeys: tc.keys, Registerer: prometheus.NewRegistry()}))
			defer srv.Close()
			for _, key := range tc.used {
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/api/chat",
					strings.NewReader(`{"model":"tiny-llm","stream":false,"messages":[{"role":"user","content":"hi"}]}`))
				if err != nil {
					t.Fatal(err)
				}
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
			}
			if !slices.Equal(b.clients, tc.want) {
				t.Errorf("clients %v, want %v", b.clients, tc.want)
			}
			for _, c := range b.clients {
				for _, k := range tc.keys {
					if strings.Contains(c, k) {
						t.Errorf("client name %q holds the key", c)
					}
				}
			}
		})
	}
}
