package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// writeCert writes a self-signed certificate for 127.0.0.1 and returns the
// PEM paths and a pool trusting it.
func writeCert(t *testing.T, dir, name string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestDaemonTLS(t *testing.T) {
	dir := t.TempDir()
	srvCert, srvKey, srvPool := writeCert(t, dir, "server")
	cliCert, cliKey, _ := writeCert(t, dir, "client")
	cfg := testConfig(t)
	cfg.Listen = "127.0.0.1:0"
	cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA = srvCert, srvKey, cliCert
	d := startDaemon(t, cfg)

	clientPair, err := tls.LoadX509KeyPair(cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	check := func(opt grpc.DialOption) error {
		conn, err := grpc.NewClient(d.addrs.TCP, opt)
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	tests := []struct {
		name   string
		opt    grpc.DialOption
		wantOK bool
	}{
		{"mutual TLS", grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: srvPool, Certificates: []tls.Certificate{clientPair}})), true},
		{"TLS without a client certificate", grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: srvPool})), false},
		{"plaintext", grpc.WithTransportCredentials(insecure.NewCredentials()), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := check(tt.opt)
			if (err == nil) != tt.wantOK {
				t.Errorf("health check: %v, want ok=%v", err, tt.wantOK)
			}
		})
	}
}
