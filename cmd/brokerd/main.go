// Command brokerd is the per-host accelerator broker daemon.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	goruntime "runtime"
	"syscall"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/daemon"
	"github.com/brokerd/brokerd/runtime/onednn"
	"github.com/brokerd/brokerd/server"
	"github.com/brokerd/brokerd/server/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	cfg, err := config.Load(os.Args[1:], os.Getenv, os.Geteuid(), os.Stdout)
	if errors.Is(err, config.ErrHelp) {
		os.Exit(0)
	}
	if errors.Is(err, config.ErrVersion) {
		fmt.Printf("brokerd %s (%s, oneDNN %s)\n", version, goruntime.Version(), onednn.LibraryVersion())
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "brokerd: %v\n", err)
		os.Exit(2)
	}
	log, level, err := server.NewLoggerLevel(cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		fmt.Fprintf(os.Stderr, "brokerd: %v\n", err)
		os.Exit(2)
	}
	defer log.Sync() //nolint:errcheck // nothing to do if the final flush fails

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := daemon.Run(ctx, daemon.Options{Config: cfg, Version: version, LogLevel: level}, log); err != nil {
		// One line per error: a bad setting as Load's are (exit 2), a
		// failure while running in the log's format (exit 1).
		var invalid *config.InvalidError
		if errors.As(err, &invalid) {
			fmt.Fprintf(os.Stderr, "brokerd: %v\n", err)
			os.Exit(2)
		}
		log.Error("brokerd failed", zap.Error(err))
		log.Sync() //nolint:errcheck
		os.Exit(1)
	}
}
