package config

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestHelpShowsDefaultsAndEnvironment: -h lists every flag with its
// environment variable and its default for this process.
func TestHelpShowsDefaultsAndEnvironment(t *testing.T) {
	env := map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000", "HOME": "/home/u"}
	var out bytes.Buffer
	_, err := Load([]string{"-h"}, func(k string) string { return env[k] }, 1000, &out)
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("Load(-h) = %v", err)
	}
	text := out.String()
	for _, want := range []string{
		"--socket STRING\n      Unix socket path (env BROKERD_SOCKET; default /run/user/1000/brokerd.sock)",
		"--max-queue-items INT",
		"(env BROKERD_MAX_QUEUE_ITEMS; default 65536)",
		"--batch-timeout DURATION",
		"(env BROKERD_BATCH_TIMEOUT; default 2m0s)",
		"(env BROKERD_STATE_DIR; default /home/u/.local/state/brokerd)",
		"--version\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("-h output lacks %q", want)
		}
	}
	// Every flag with an environment variable names it.
	for name, env := range envNames {
		if !strings.Contains(text, "--"+name) || !strings.Contains(text, "env "+env) {
			t.Errorf("-h does not show --%s with env %s", name, env)
		}
	}
}

func TestVersionAndBadFlags(t *testing.T) {
	getenv := func(string) string { return "" }
	if _, err := Load([]string{"--version"}, getenv, 0, &bytes.Buffer{}); !errors.Is(err, ErrVersion) {
		t.Errorf("--version: %v", err)
	}
	var out bytes.Buffer
	_, err := Load([]string{"--no-such-flag"}, getenv, 0, &out)
	if err == nil || !strings.Contains(err.Error(), "no-such-flag") || !strings.Contains(err.Error(), "brokerd -h") {
		t.Errorf("bad flag: %v", err)
	}
	if out.Len() != 0 {
		t.Errorf("a bad flag also printed %q: the caller prints the one message", out.String())
	}
}

func TestHTTPListenRules(t *testing.T) {
	getenv := func(string) string { return "" }
	open := "--http-allow-unauthenticated"
	tests := []struct {
		args []string
		bad  string
	}{
		{[]string{"--http-listen", "127.0.0.1:11434", open}, ""},
		{[]string{"--http-listen", "localhost:0", open}, ""},
		{[]string{"--http-listen", "0.0.0.0:11434", open}, "loopback"},
		{[]string{"--http-listen", "nonsense", open}, "HOST:PORT"},
	}
	for _, tc := range tests {
		_, err := Load(tc.args, getenv, 0, &bytes.Buffer{})
		if (err == nil) != (tc.bad == "") || (err != nil && !strings.Contains(err.Error(), tc.bad)) {
			t.Errorf("%v: %v, want an error containing %q", tc.args, err, tc.bad)
		}
	}
}

// TestHTTPListenNeedsKeysOrConsent: the HTTP APIs reach the data plane, so
// with no API keys they would give every user who can reach the address
// (every local user on loopback) what the socket's 0660 mode refuses.
// --http-listen needs --api-keys-file, or --http-allow-unauthenticated to
// say so; the refusal names both fixes.
func TestHTTPListenNeedsKeysOrConsent(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		yaml string
		bad  []string // all in the error; none: it loads
	}{
		{name: "no HTTP listener", args: nil},
		{name: "loopback without keys", args: []string{"--http-listen", "127.0.0.1:11434"},
			bad: []string{"http-listen 127.0.0.1:11434", "every local user", "--api-keys-file", "--http-allow-unauthenticated"}},
		{name: "from the environment without keys", env: map[string]string{"BROKERD_HTTP_LISTEN": "127.0.0.1:11434"},
			bad: []string{"BROKERD_API_KEYS_FILE", "BROKERD_HTTP_ALLOW_UNAUTHENTICATED"}},
		{name: "from YAML without keys", yaml: "http-listen: 127.0.0.1:11434\n", bad: []string{"--api-keys-file"}},
		{name: "with keys", args: []string{"--http-listen", "127.0.0.1:11434", "--api-keys-file", "/etc/brokerd/keys"}},
		{name: "open by flag", args: []string{"--http-listen", "127.0.0.1:11434", "--http-allow-unauthenticated"}},
		{name: "open by environment", args: []string{"--http-listen", "127.0.0.1:11434"}, env: map[string]string{"BROKERD_HTTP_ALLOW_UNAUTHENTICATED": "true"}},
		{name: "open by YAML", yaml: "http-listen: 127.0.0.1:11434\nhttp-allow-unauthenticated: true\n"},
		{name: "keys and open", args: []string{"--http-listen", "127.0.0.1:11434", "--api-keys-file", "k", "--http-allow-unauthenticated"},
			bad: []string{"contradict"}},
		{name: "open without a listener", args: []string{"--http-allow-unauthenticated"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.yaml != "" {
				path := filepath.Join(t.TempDir(), "brokerd.yaml")
				if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append([]string{"--config", path}, args...)
			}
			_, err := Load(args, func(k string) string { return tc.env[k] }, 0, &bytes.Buffer{})
			if len(tc.bad) == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load accepted %v %v", args, tc.env)
			}
			for _, want := range tc.bad {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
	// The check is also the daemon's (Run calls it on a Config not from Load).
	cfg := Config{HTTPListen: "127.0.0.1:0"}
	if err := cfg.CheckHTTPAccess(); err == nil {
		t.Error("CheckHTTPAccess accepts an HTTP listener without keys or consent")
	}
	cfg.HTTPAllowUnauthenticated = true
	if err := cfg.CheckHTTPAccess(); err != nil {
		t.Errorf("CheckHTTPAccess with consent: %v", err)
	}
}

// TestHTTPCORSOrigins: --http-cors-origins (and its variable) takes
// origins as browsers send them, or *; anything else stops brokerd at start
// with the setting's name.
func TestHTTPCORSOrigins(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want List
		bad  string
	}{
		{name: "none by default"},
		{name: "flag", args: []string{"--http-cors-origins", "https://app.example.com, http://box.lan:3000"}, want: List{"https://app.example.com", "http://box.lan:3000"}},
		{name: "env", env: map[string]string{"BROKERD_HTTP_CORS_ORIGINS": "*"}, want: List{"*"}},
		{name: "flag replaces env", args: []string{"--http-cors-origins=https://a.example"}, env: map[string]string{"BROKERD_HTTP_CORS_ORIGINS": "*"}, want: List{"https://a.example"}},
		{name: "a path", args: []string{"--http-cors-origins=https://a.example/app"}, bad: "http-cors-origins \"https://a.example/app\" is invalid"},
		{name: "no scheme", args: []string{"--http-cors-origins=a.example"}, bad: "SCHEME://HOST[:PORT]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.args, env(tt.env), 1000, io.Discard)
			if tt.bad != "" {
				if err == nil || !strings.Contains(err.Error(), tt.bad) {
					t.Fatalf("%v, want an error containing %q", err, tt.bad)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.HTTPCORSOrigins, tt.want) {
				t.Errorf("origins %q, want %q", c.HTTPCORSOrigins, tt.want)
			}
		})
	}
}
