package daemon

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestHealthSlotsTakenByAFewAddresses: four addresses each holding their
// four idle connections (the per-client cap) fill the health listener's
// 16 slots. A probe from a fifth address is still served: the listener
// closes its oldest connection for it. Before, the probe was closed at
// accept, so kubelet's probes failed for as long as the connections were
// held.
func TestHealthSlotsTakenByAFewAddresses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(ln, "health", sideConns, sideConnsPerClient, nil, newConnMetrics(prometheus.NewRegistry()), zap.NewNop())
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	addr := ln.Addr().String()

	// dialFrom dials addr from the loopback address ip.
	dialFrom := func(ctx context.Context, ip string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return d.DialContext(ctx, "tcp", addr)
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	preface := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0) // + empty SETTINGS
	for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		for range sideConnsPerClient {
			c, err := dialFrom(context.Background(), ip)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
			_, _ = c.Write(preface)
			// The server's SETTINGS: accepted and served.
			_ = c.SetReadDeadline(time.Now().Add(time.Minute)) // a guard against a hang
			if _, err := io.ReadFull(c, make([]byte, 9)); err != nil {
				t.Fatalf("connection %d (from %s) was not served: %v", len(held), ip, err)
			}
		}
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return dialFrom(ctx, "127.0.0.6") }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("with %d connections held by 4 addresses, a probe from a fifth: %v, %v; want SERVING", len(held), resp, err)
	}
	// The slot was the oldest connection's: it is closed.
	oldest := held[0]
	_ = oldest.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.Copy(io.Discard, oldest); err != nil {
		t.Errorf("the oldest connection was not closed for the probe: %v", err)
	}
}
