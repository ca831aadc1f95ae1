package endpoint

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestDefaultSocketPath(t *testing.T) {
	tests := []struct {
		name string
		euid int
		env  map[string]string
		want string
	}{
		{name: "root ignores XDG_RUNTIME_DIR", euid: 0, env: map[string]string{"XDG_RUNTIME_DIR": "/run/user/0"}, want: "/run/brokerd/brokerd.sock"},
		{name: "root", euid: 0, want: "/run/brokerd/brokerd.sock"},
		{name: "user with XDG_RUNTIME_DIR", euid: 1000, env: map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000"}, want: "/run/user/1000/brokerd.sock"},
		{name: "user with trailing slash", euid: 1000, env: map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000/"}, want: "/run/user/1000/brokerd.sock"},
		{name: "user without XDG_RUNTIME_DIR", euid: 1000, want: "/tmp/brokerd-1000/brokerd.sock"},
		{name: "user with empty XDG_RUNTIME_DIR", euid: 4242, env: map[string]string{"XDG_RUNTIME_DIR": ""}, want: "/tmp/brokerd-4242/brokerd.sock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			if got := DefaultSocketPath(tt.euid, getenv); got != tt.want {
				t.Errorf("DefaultSocketPath(%d) = %q, want %q", tt.euid, got, tt.want)
			}
		})
	}
}

func TestTarget(t *testing.T) {
	tests := []struct {
		name, socket, addr, want string
		wantErr                  error
	}{
		{name: "socket", socket: "/run/brokerd/brokerd.sock", want: "unix:///run/brokerd/brokerd.sock"},
		{name: "addr wins", socket: "/run/brokerd/brokerd.sock", addr: "127.0.0.1:7070", want: "127.0.0.1:7070"},
		{name: "addr only", addr: "localhost:7070", want: "localhost:7070"},
		{name: "neither", wantErr: ErrNoEndpoint},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Target(tt.socket, tt.addr)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Target error = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("Target = %q, want %q", got, tt.want)
			}
		})
	}

	t.Run("relative socket becomes absolute", func(t *testing.T) {
		got, err := Target("rel/brokerd.sock", "")
		if err != nil {
			t.Fatal(err)
		}
		abs, _ := filepath.Abs("rel/brokerd.sock")
		if got != "unix://"+abs {
			t.Errorf("Target = %q, want %q", got, "unix://"+abs)
		}
	})
}

// serveHealth starts a health server on lis, with TLS when cert is set.
func serveHealth(t *testing.T, lis net.Listener, cert *tls.Certificate) {
	t.Helper()
	var opts []grpc.ServerOption
	if cert != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{*cert}})))
	}
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
}

func check(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestDialUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "b.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	serveHealth(t, lis, nil)

	tests := []struct {
		name, socket, addr string
		wantCode           codes.Code
	}{
		{name: "live socket", socket: sock, wantCode: codes.OK},
		{name: "missing socket", socket: filepath.Join(t.TempDir(), "none.sock"), wantCode: codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := Dial(t.Context(), tt.socket, tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if got := status.Code(check(t.Context(), conn)); got != tt.wantCode {
				t.Errorf("Check code = %v, want %v", got, tt.wantCode)
			}
		})
	}
}

func TestDialErrors(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		socket  string
		wantErr error
	}{
		{name: "no endpoint", ctx: context.Background(), wantErr: ErrNoEndpoint},
		{name: "cancelled context", ctx: cancelled, socket: "/nonexistent/b.sock", wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := Dial(tt.ctx, tt.socket, "")
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Dial error = %v, want %v", err, tt.wantErr)
			}
			if conn != nil {
				t.Error("Dial returned a connection with an error")
			}
		})
	}
}

// selfSigned returns a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "brokerd-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true,

		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func TestDialTCP(t *testing.T) {
	cert, pool := selfSigned(t)
	tlsLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveHealth(t, tlsLis, &cert)
	plainLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveHealth(t, plainLis, nil)
	// A socket that does not exist proves addr wins over it.
	missing := filepath.Join(t.TempDir(), "none.sock")

	tests := []struct {
		name     string
		addr     string
		opts     []grpc.DialOption
		wantCode codes.Code
	}{
		{name: "plaintext to plaintext server", addr: plainLis.Addr().String(), wantCode: codes.OK},
		{name: "TLS to TLS server", addr: tlsLis.Addr().String(), opts: []grpc.DialOption{WithTLS(&tls.Config{RootCAs: pool})}, wantCode: codes.OK},
		{name: "plaintext to TLS server fails", addr: tlsLis.Addr().String(), wantCode: codes.Unavailable},
		{name: "untrusted TLS fails", addr: tlsLis.Addr().String(), opts: []grpc.DialOption{WithTLS(&tls.Config{RootCAs: x509.NewCertPool()})}, wantCode: codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := Dial(t.Context(), missing, tt.addr, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if got := status.Code(check(t.Context(), conn)); got != tt.wantCode {
				t.Errorf("Check code = %v, want %v", got, tt.wantCode)
			}
		})
	}
}
