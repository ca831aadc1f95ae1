// Package endpoint holds where brokerd listens by default and how clients
// reach it. It is kept tiny (no cgo, no daemon packages) because brokerctl and
// other clients import it.
package endpoint

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Environment variables clients read to find brokerd.
const (
	// EnvSocket names the Unix socket path.
	EnvSocket = "BROKERD_SOCKET"
	// EnvAddr names a TCP host:port; when set it wins over the socket.
	EnvAddr = "BROKERD_ADDR"
)

// RootSocketPath is the socket of a brokerd running as root.
const RootSocketPath = "/run/brokerd/brokerd.sock"

// SocketName is the file name of the socket inside a per-user directory.
const SocketName = "brokerd.sock"

// ErrNoEndpoint is returned by Dial and Target when neither a socket nor an
// address is given.
var ErrNoEndpoint = errors.New("endpoint: no socket path or TCP address given")

// DefaultSocketPath is the socket brokerd listens on when none is configured:
// /run/brokerd/brokerd.sock for root, else $XDG_RUNTIME_DIR/brokerd.sock, else
// /tmp/brokerd-<uid>/brokerd.sock. The effective uid and getenv are parameters
// so daemon, clients and tests agree without reading process state here.
func DefaultSocketPath(euid int, getenv func(string) string) string {
	if euid == 0 {
		return RootSocketPath
	}
	if dir := getenv("XDG_RUNTIME_DIR"); dir != "" {
		return filepath.Join(dir, SocketName)
	}
	return filepath.Join("/tmp", "brokerd-"+strconv.Itoa(euid), SocketName)
}

// Target is the gRPC target Dial uses: "unix://" and the absolute socket path,
// or addr itself when addr is set.
func Target(socket, addr string) (string, error) {
	if addr != "" {
		return addr, nil
	}
	if socket == "" {
		return "", ErrNoEndpoint
	}
	abs, err := filepath.Abs(socket)
	if err != nil {
		return "", fmt.Errorf("endpoint: socket path %q: %w", socket, err)
	}
	return "unix://" + abs, nil
}

// tlsOption carries a TLS configuration through Dial's ...grpc.DialOption
// list; it changes nothing by itself (EmptyDialOption), Dial looks for it.
type tlsOption struct {
	grpc.EmptyDialOption
	config *tls.Config
}

// WithTLS makes Dial use TLS with cfg for a TCP address. The Unix socket is
// always plaintext: its file mode is what guards it.
func WithTLS(cfg *tls.Config) grpc.DialOption {
	return tlsOption{config: cfg}
}

// Dial returns a client connection to brokerd: to addr (TCP host:port) when it
// is set, else to the Unix socket. TCP is plaintext unless WithTLS is among
// opts. Options given by the caller are applied after the defaults, so explicit
// transport credentials win. Like grpc.NewClient it does not connect: the
// first RPC does, and reports an unreachable endpoint as UNAVAILABLE.
func Dial(ctx context.Context, socket, addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("endpoint: dial: %w", err)
	}
	target, err := Target(socket, addr)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if addr != "" {
		for _, o := range opts {
			if t, ok := o.(tlsOption); ok && t.config != nil {
				creds = credentials.NewTLS(t.config)
			}
		}
	}
	all := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)
	conn, err := grpc.NewClient(target, all...)
	if err != nil {
		return nil, fmt.Errorf("endpoint: dial %s: %w", target, err)
	}
	return conn, nil
}
