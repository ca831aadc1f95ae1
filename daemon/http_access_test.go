package daemon

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/server/config"
)

// TestHTTPListenerFollowsTheSocketsRule: with --http-listen and no API
// keys, a local user the socket's 0660 mode refuses got chat and
// embeddings over loopback HTTP. brokerd now refuses to start (a bad
// setting, before any listener opens) unless --http-allow-unauthenticated
// says that everyone who reaches the address may use the data plane.
func TestHTTPListenerFollowsTheSocketsRule(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPListen = "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := Run(ctx, Options{Config: cfg, Version: "test", Getenv: hermeticEnv, Ready: func(Addresses) {
		t.Error("brokerd became ready with an HTTP listener open to every local user")
	}}, zap.NewNop())
	var invalid *config.InvalidError
	if !errors.As(err, &invalid) {
		t.Fatalf("Run = %v, want a bad setting (config.InvalidError: exit 2 with one line)", err)
	}
	for _, want := range []string{"--api-keys-file", "--http-allow-unauthenticated", "every local user"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	if _, err := os.Stat(cfg.Socket); !os.IsNotExist(err) {
		t.Errorf("the socket was created before the refusal: %v", err)
	}

	// Said explicitly, it serves without a key.
	cfg.HTTPAllowUnauthenticated = true
	d := startDaemon(t, cfg)
	resp, err := http.Get("http://" + d.addrs.HTTP + "/api/version")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/api/version without a key, open by setting: %d", resp.StatusCode)
	}
}
