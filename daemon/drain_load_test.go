package daemon

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestLoadModelDuringDrain: once a drain has begun, new work is refused
// with UNAVAILABLE, and so is a LoadModel: it would read a model's files
// and take device memory on a daemon that is going away.
func TestLoadModelDuringDrain(t *testing.T) {
	cfg := testConfig(t)
	cfg.ModelRepo = t.TempDir()
	writeMLP(t, cfg.ModelRepo, "mlp", 1, 1, 4, 6, 2)
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	if _, err := c.Drain(ctx, &brokerv1.DrainRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Encode(ctx, &brokerv1.EncodeRequest{Items: textItems("x")}); status.Code(err) != codes.Unavailable {
		t.Fatalf("Encode after the drain: %v, want UNAVAILABLE (the test's premise)", err)
	}
	resp, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "mlp"})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("LoadModel after a drain: %v (model %v on %v), want UNAVAILABLE", err, resp.GetModel().GetName(), resp.GetModel().GetDeviceIds())
	}
}
