// Package daemontest runs a real brokerd in process for the tests of its
// clients (client/, clients/python): hermetic settings on a Unix socket,
// the CPU only, stopped when the test ends.
package daemontest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/daemon"
	"github.com/brokerd/brokerd/server/config"
)

// Config is brokerd's settings under dir: its socket and state there, no
// accelerator found (empty sysfs and devfs, no NVML), no metrics listener,
// the model repository dir/models.
func Config(dir string) config.Config {
	cfg := config.Defaults(os.Geteuid(), func(string) string { return "" })
	cfg.Socket = filepath.Join(dir, "brokerd.sock")
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.MetricsListen = ""
	cfg.Sysfs = filepath.Join(dir, "sys")
	cfg.Devfs = filepath.Join(dir, "dev")
	cfg.NVMLLibrary = filepath.Join(dir, "no-libnvidia-ml.so.1")
	cfg.ModelRepo = filepath.Join(dir, "models")
	cfg.ShutdownGrace = config.Duration(5 * time.Second)
	return cfg
}

// Start runs brokerd with cfg until the test ends and returns where it
// listens once it serves.
func Start(t testing.TB, cfg config.Config) daemon.Addresses {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan daemon.Addresses, 1)
	go func() {
		done <- daemon.Run(ctx, daemon.Options{Config: cfg, Version: "test", Getenv: func(string) string { return "" },
			Ready: func(a daemon.Addresses) { ready <- a }}, zap.NewNop())
	}()
	var addrs daemon.Addresses
	select {
	case addrs = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("brokerd exited: %v", err)
	case <-time.After(2 * time.Minute): // far above a start (seconds), even under -race on a loaded machine
		cancel()
		t.Fatal("brokerd not ready after 2m")
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("brokerd: %v", err)
		}
	})
	return addrs
}
