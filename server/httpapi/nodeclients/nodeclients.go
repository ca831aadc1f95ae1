// Package nodeclients runs the official npm ollama and openai clients
// (server/httpapi/testdata/node) against an HTTP API base URL, for the
// tests of server/httpapi and of the daemon. It installs the locked
// packages once: test binaries of several packages run at the same time,
// and two npm ci in one directory break each other, so the install holds a
// file lock.
package nodeclients

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Dir is the folder of the script and its package-lock.json.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", "node")
}

// Run runs clients.mjs against base with the API key and mode, and fails
// t unless it prints "all ok".
func Run(t testing.TB, base, key, mode string, env []string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		if testing.Short() {
			t.Skip("node is not installed (make deps installs it)")
		}
		t.Fatalf("node is not installed: the HTTP APIs are tested with the official JavaScript clients (make deps installs Node.js): %v", err)
	}
	dir := Dir()
	install(t, dir)
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

// install runs npm ci under an exclusive lock when the packages are missing.
func install(t testing.TB, dir string) {
	t.Helper()
	lock, err := os.OpenFile(filepath.Join(dir, ".npm-ci.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it too
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
}
