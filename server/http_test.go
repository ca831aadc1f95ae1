package server

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

func TestAPIKeysFile(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("# no keys\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readAPIKeys(empty); err == nil || !strings.Contains(err.Error(), "holds no key") {
		t.Errorf("a file without keys: %v", err)
	}
	two := filepath.Join(dir, "two")
	if err := os.WriteFile(two, []byte("a\n  b  \n#c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if k, err := readAPIKeys(two); err != nil || len(k) != 2 || k[1] != "b" {
		t.Errorf("keys %q, %v", k, err)
	}
}

// runClients runs server/httpapi's script of the official JavaScript
// clients against base.
func runClients(t *testing.T, base, key, mode string, env ...string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed (make deps installs Node.js): %v", err)
	}
	dir, err := filepath.Abs("httpapi/testdata/node")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci: %v\n%s", err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "clients.mjs", base, key, mode)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("node clients:\n%s", out.String())
	if err != nil || !strings.Contains(out.String(), "all ok") {
		t.Fatalf("the official clients failed: %v", err)
	}
}
