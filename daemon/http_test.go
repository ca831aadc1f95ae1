package daemon

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/brokerd/brokerd/server/httpapi/nodeclients"
)

// TestHTTPAPIsEndToEnd serves the HTTP APIs from a real brokerd and drives
// them with the official ollama and openai npm clients (embeddings, model
// listing, errors, API keys), then drains: new HTTP calls get 503.
func TestHTTPAPIsEndToEnd(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPListen = "127.0.0.1:0"
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("# the test's key\nk-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.APIKeysFile = keys
	d := startDaemon(t, cfg)
	base := "http://" + d.addrs.HTTP
	runClients(t, base, "k-123", "daemon")

	req, _ := http.NewRequest(http.MethodGet, base+"/api/version", nil)
	req.Header.Set("Authorization", "Bearer k-123")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/api/version: %d", resp.StatusCode)
	}
}

// runClients runs server/httpapi's script of the official JavaScript
// clients against base.
func runClients(t *testing.T, base, key, mode string, env ...string) {
	t.Helper()
	nodeclients.Run(t, base, key, mode, env)
}
