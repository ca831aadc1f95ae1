package daemon

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/server/config"
)

// TestBusyPortNamesTheSetting: a TCP listener whose address another
// program holds stops brokerd at start with one line that names the
// setting to change, its flag and its environment variable, as a bad
// setting does (a config.InvalidError: exit 2, one line).
func TestBusyPortNamesTheSetting(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	for _, tt := range []struct {
		setting, env string
		set          func(*config.Config)
	}{
		{"listen", "BROKERD_LISTEN", func(c *config.Config) { c.Listen = addr }},
		{"metrics-listen", "BROKERD_METRICS_LISTEN", func(c *config.Config) { c.MetricsListen = addr }},
		{"health-listen", "BROKERD_HEALTH_LISTEN", func(c *config.Config) { c.HealthListen = addr }},
		{"http-listen", "BROKERD_HTTP_LISTEN", func(c *config.Config) { c.HTTPListen, c.HTTPAllowUnauthenticated = addr, true }},
	} {
		t.Run(tt.setting, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.MetricsListen = ""
			tt.set(&cfg)
			err := Run(context.Background(), Options{Config: cfg, Getenv: hermeticEnv}, zap.NewNop())
			var invalid *config.InvalidError
			if !errors.As(err, &invalid) {
				t.Fatalf("Run = %v, want a config.InvalidError", err)
			}
			msg := err.Error()
			for _, want := range []string{
				"--" + tt.setting + " " + addr + ": address already in use (another brokerd, or another program, listens there)",
				"; set --" + tt.setting + " / " + tt.env + " to another address",
			} {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q does not say %q", msg, want)
				}
			}
			if strings.Contains(msg, "\n") || strings.Contains(msg, "bind:") {
				t.Errorf("message %q: want one line without the syscall's prefix", msg)
			}
		})
	}
}

// TestListenErrorHints: the hint for Ollama's port, and for the other
// reasons a listener cannot open.
func TestListenErrorHints(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, err = net.Listen("tcp", busy.Addr().String())
	if err == nil {
		t.Fatal("a second listener on a busy port opened")
	}
	got := listenError("http-listen", "127.0.0.1:11434", err).Error()
	want := "--http-listen 127.0.0.1:11434: address already in use (another Ollama?); set --http-listen / BROKERD_HTTP_LISTEN to another address, or empty to turn it off"
	if got != want {
		t.Errorf("listenError = %q\nwant          %q", got, want)
	}
	_, err = net.Listen("tcp", "192.0.2.1:0") // TEST-NET-1: no interface has it
	if err == nil {
		t.Skip("this host has 192.0.2.1")
	}
	if got := listenError("listen", "192.0.2.1:0", err).Error(); !strings.Contains(got, "--listen 192.0.2.1:0: cannot assign requested address (no interface of this host has that address); set --listen / BROKERD_LISTEN") {
		t.Errorf("listenError = %q", got)
	}
}
