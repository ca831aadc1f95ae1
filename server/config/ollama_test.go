package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOllamaModels: --ollama-models over OLLAMA_MODELS over the YAML key
// over the default, ~/.ollama/models when it is a directory; off (or an
// explicitly empty value) turns the store off; a bad value is refused
// naming the setting.
func TestOllamaModels(t *testing.T) {
	withStore := t.TempDir()
	store := filepath.Join(withStore, ".ollama", "models")
	if err := os.MkdirAll(store, 0o755); err != nil {
		t.Fatal(err)
	}
	withFile := t.TempDir()
	if err := os.MkdirAll(filepath.Join(withFile, ".ollama"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(withFile, ".ollama", "models"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	yamlPath := filepath.Join(t.TempDir(), "brokerd.yaml")
	if err := os.WriteFile(yamlPath, []byte("ollama-models: /from/yaml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	offYAML := filepath.Join(t.TempDir(), "off.yaml")
	if err := os.WriteFile(offYAML, []byte("ollama-models: \"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // OllamaModelsDir
	}{
		{"no home", nil, nil, ""},
		{"home without a store", nil, map[string]string{"HOME": t.TempDir()}, ""},
		{"home with a store", nil, map[string]string{"HOME": withStore}, store},
		{"home with a file", nil, map[string]string{"HOME": withFile}, ""},
		{"env over default", nil, map[string]string{"HOME": withStore, "OLLAMA_MODELS": "/data/ollama"}, "/data/ollama"},
		{"flag over env", []string{"--ollama-models", "/flag"}, map[string]string{"OLLAMA_MODELS": "/data/ollama"}, "/flag"},
		{"yaml over default", []string{"--config", yamlPath}, map[string]string{"HOME": withStore}, "/from/yaml"},
		{"env over yaml", []string{"--config", yamlPath}, map[string]string{"OLLAMA_MODELS": "/env"}, "/env"},
		{"relative", []string{"--ollama-models", "store"}, nil, "store"},
		{"off", []string{"--ollama-models", "off"}, map[string]string{"HOME": withStore}, ""},
		{"env off", nil, map[string]string{"HOME": withStore, "OLLAMA_MODELS": "off"}, ""},
		{"flag empty", []string{"--ollama-models="}, map[string]string{"HOME": withStore}, ""},
		{"yaml empty", []string{"--config", offYAML}, map[string]string{"HOME": withStore}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, env(tc.env), 1000, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.OllamaModelsDir(); got != tc.want {
				t.Errorf("OllamaModelsDir() = %q, want %q", got, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"NUL", []string{"--ollama-models", "/a\x00b"}, nil},
		{"blank", []string{"--ollama-models", "  "}, nil},
		{"env NUL", nil, map[string]string{"OLLAMA_MODELS": "/a\x00"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.args, env(tc.env), 1000, nil)
			if err == nil || !strings.Contains(err.Error(), "ollama-models (OLLAMA_MODELS)") {
				t.Errorf("Load(%q) = %v, want an error naming ollama-models", tc.args, err)
			}
		})
	}
	var usage bytes.Buffer
	if _, err := Load([]string{"-h"}, env(map[string]string{"HOME": withStore}), 1000, &usage); !errors.Is(err, ErrHelp) {
		t.Fatal(err)
	}
	if u := usage.String(); !strings.Contains(u, "--ollama-models") || !strings.Contains(u, "env OLLAMA_MODELS; default "+store) {
		t.Errorf("usage does not show --ollama-models with its variable and default:\n%s", u)
	}
}
