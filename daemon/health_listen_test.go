package daemon

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestHealthListener checks the plaintext listener kubelet gRPC probes use:
// it answers grpc.health.v1 for both services, serves nothing else, and goes
// NOT_SERVING when brokerd drains, so readiness takes the pod out.
func TestHealthListener(t *testing.T) {
	cfg := testConfig(t)
	cfg.HealthListen = "127.0.0.1:0"
	d := startDaemon(t, cfg)
	if d.addrs.Health == "" {
		t.Fatal("Addresses.Health is empty with --health-listen set")
	}
	conn, err := grpc.NewClient(d.addrs.Health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)

	check := func(t *testing.T, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, svc := range []string{"", brokerv1.BrokerService_ServiceDesc.ServiceName} {
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err != nil {
				t.Fatalf("Check(%q): %v", svc, err)
			}
			if resp.GetStatus() != want {
				t.Errorf("Check(%q) = %v, want %v", svc, resp.GetStatus(), want)
			}
		}
	}
	t.Run("serving", func(t *testing.T) { check(t, healthpb.HealthCheckResponse_SERVING) })
	t.Run("health only", func(t *testing.T) {
		_, err := brokerv1.NewBrokerServiceClient(conn).ListDevices(ctx, &brokerv1.ListDevicesRequest{})
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("ListDevices on the health listener: %v, want UNIMPLEMENTED", err)
		}
	})
	t.Run("not serving after drain", func(t *testing.T) {
		if _, err := brokerv1.NewBrokerServiceClient(d.conn).Drain(ctx, &brokerv1.DrainRequest{}); err != nil {
			t.Fatal(err)
		}
		check(t, healthpb.HealthCheckResponse_NOT_SERVING)
	})
}

// TestHealthListenerOff checks the default: no health listener at all.
func TestHealthListenerOff(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	if d.addrs.Health != "" {
		t.Errorf("Addresses.Health = %q with --health-listen unset", d.addrs.Health)
	}
}
