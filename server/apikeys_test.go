package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
