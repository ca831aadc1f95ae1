package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHealthListen covers --health-listen through each source: it is off by
// default, and a value that is not HOST:PORT stops brokerd with its name.
func TestHealthListen(t *testing.T) {
	yamlFile := filepath.Join(t.TempDir(), "brokerd.yaml")
	if err := os.WriteFile(yamlFile, []byte("health-listen: 0.0.0.0:7071\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{name: "default off", want: ""},
		{name: "flag", args: []string{"--health-listen", "0.0.0.0:7071"}, want: "0.0.0.0:7071"},
		{name: "env", env: map[string]string{"BROKERD_HEALTH_LISTEN": "[::]:7071"}, want: "[::]:7071"},
		{name: "yaml", args: []string{"--config", yamlFile}, want: "0.0.0.0:7071"},
		{name: "flag beats env", args: []string{"--health-listen=127.0.0.1:1"}, env: map[string]string{"BROKERD_HEALTH_LISTEN": "127.0.0.1:2"}, want: "127.0.0.1:1"},
		{name: "no port", args: []string{"--health-listen=7071"}, wantErr: `health-listen "7071" is invalid: want HOST:PORT`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string {
				if k == "HOME" {
					return "/home/test"
				}
				return tt.env[k]
			}
			c, err := Load(tt.args, getenv, 1000, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.HealthListen != tt.want {
				t.Errorf("HealthListen = %q, want %q", c.HealthListen, tt.want)
			}
		})
	}
}
