package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

// FuzzConfigFile loads arbitrary YAML settings files: Load must answer an
// error or a configuration that validates, never panic.
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		"max-queue-items: 64\nlog-level: debug\n",
		"socket: /tmp/x.sock\nlisten: 127.0.0.1:0\ninsecure-tcp: true\n",
		"max-queue-delay: 5ms\nbatch-timeout: 1m\n",
		"costs: gpu=0.9,tpu=3.1\ncompute-dtype: cpu=bf16\n",
		"max-item-bytes: 99999999999999999999\n",
		"max-queue-items: [1, 2]\n",
		"{{{{",
		"nosuchkey: 1\n",
		"max-queue-delay: -1s\n",
		"&a [*a, *a]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, yaml []byte) {
		path := filepath.Join(t.TempDir(), "brokerd.yaml")
		if err := os.WriteFile(path, yaml, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load([]string{"--config", path}, func(string) string { return "" }, 1000, os.Stderr)
		if err != nil {
			if errors.Is(err, flag.ErrHelp) || errors.Is(err, ErrVersion) {
				t.Fatalf("a config file produced %v", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Load returned a configuration that does not validate: %v", err)
		}
	})
}
