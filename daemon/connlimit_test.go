package daemon

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestConnectionLimits: connections beyond a client's limit are closed at
// once, and the health listener and /metrics still answer (21,000 idle
// connections once took every descriptor and both timed out).
func TestConnectionLimits(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxConnectionsPerClient = 4
	cfg.HealthListen = "127.0.0.1:0"
	d := startDaemon(t, cfg)
	ctx := testCtx(t)
	if _, err := brokerv1.NewBrokerServiceClient(d.conn).ListDevices(ctx, &brokerv1.ListDevicesRequest{}); err != nil {
		t.Fatal(err) // d.conn holds one of this uid's four
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 3 {
		c, err := net.Dial("unix", d.addrs.Socket)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	over, err := net.Dial("unix", d.addrs.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := over.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the fifth connection of one uid: read %v, want EOF (closed by brokerd)", err)
	}
	// Health and metrics have limits of their own.
	hc, err := grpc.NewClient(d.addrs.Health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if r, err := healthpb.NewHealthClient(hc).Check(hctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health listener: %v %v", r, err)
	}
	resp, err := http.Get("http://" + d.addrs.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`brokerd_connections_refused_total{limit="per_client",listener="socket"} 1`,
		`brokerd_connections_open{listener="socket"} 4`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// A slot freed is a slot again.
	held[0].Close()
	held = held[1:]
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + d.addrs.Metrics + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), `brokerd_connections_open{listener="socket"} 3`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed connection did not give its slot back")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConnectionLimitDefaults(t *testing.T) {
	tests := []struct {
		maxConns, perClient int
		nofile              uint64
		wantMax, wantPer    int
	}{
		{0, 0, 1 << 20, 1<<20 - fdReserve, (1<<20 - fdReserve) / 4},
		{0, 0, 1024, 1024 - fdReserve, (1024 - fdReserve) / 4},
		{0, 0, 100, 16, 4},
		{500, 0, 1 << 20, 500, 125},
		{500, 7, 1 << 20, 500, 7},
	}
	for _, tc := range tests {
		m, p := connectionLimits(tc.maxConns, tc.perClient, tc.nofile)
		if m != tc.wantMax || p != tc.wantPer {
			t.Errorf("connectionLimits(%d, %d, %d) = %d, %d; want %d, %d", tc.maxConns, tc.perClient, tc.nofile, m, p, tc.wantMax, tc.wantPer)
		}
	}
}

// TestSharedDescriptorPool: the bounded listeners share one pool, so two
// of them together hold no more than it (each alone once could take the
// whole descriptor budget).
func TestSharedDescriptorPool(t *testing.T) {
	pool := newConnPool(2)
	cm := newConnMetrics(prometheus.NewRegistry())
	var addrs []string
	for _, name := range []string{"a", "b"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l := newLimitListener(ln, name, 10, 10, pool, cm, zap.NewNop())
		defer l.Close()
		addrs = append(addrs, ln.Addr().String())
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
	}
	// A kept connection is one not closed within wait: short where it
	// should be kept (correct code never closes it), long where it should
	// be closed (a loaded machine may take a while).
	held := func(addr string, wait time.Duration) bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetReadDeadline(time.Now().Add(wait))
		_, err = c.Read(make([]byte, 1))
		return err != io.EOF // a timeout: accepted and kept
	}
	for i, want := range []bool{true, true, false} {
		wait := 200 * time.Millisecond
		if !want {
			wait = 30 * time.Second
		}
		if got := held(addrs[i%2], wait); got != want {
			t.Errorf("connection %d held %v, want %v (pool of 2 shared by two listeners)", i+1, got, want)
		}
	}
	if descriptorBudget(1024) != 1024-fdReserve || descriptorBudget(100) != 16 {
		t.Errorf("descriptorBudget: %d, %d", descriptorBudget(1024), descriptorBudget(100))
	}
}
