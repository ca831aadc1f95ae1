package config

import (
	"bytes"
	"errors"
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
	tests := []struct {
		args []string
		bad  string
	}{
		{[]string{"--http-listen", "127.0.0.1:11434"}, ""},
		{[]string{"--http-listen", "localhost:0"}, ""},
		{[]string{"--http-listen", "0.0.0.0:11434"}, "loopback"},
		{[]string{"--http-listen", "nonsense"}, "HOST:PORT"},
	}
	for _, tc := range tests {
		_, err := Load(tc.args, getenv, 0, &bytes.Buffer{})
		if (err == nil) != (tc.bad == "") || (err != nil && !strings.Contains(err.Error(), tc.bad)) {
			t.Errorf("%v: %v, want an error containing %q", tc.args, err, tc.bad)
		}
	}
}
