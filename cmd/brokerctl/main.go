// Command brokerctl is the admin tool of brokerd: it talks to the daemon over
// its Unix socket (or TCP) and prints devices, the routing report and batch
// plans, cordons devices, encodes texts, shows queue statistics, drains, and
// generates load (bench). The commands live in package cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/brokerd/brokerd/cmd/brokerctl/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.MainVersion(ctx, version, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
