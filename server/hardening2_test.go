package server

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestEncodePinnedToAnAbsentDeviceType: a device type the host lacks (or
// one no replica runs on) is not a transient failure: UNAVAILABLE told
// clients to retry forever; it is FAILED_PRECONDITION. Every replica
// cordoned stays UNAVAILABLE (an uncordon helps).
func TestEncodePinnedToAnAbsentDeviceType(t *testing.T) {
	d := startDaemon(t, testConfig(t)) // cpu:0 and four TPUs without a PJRT plugin: no GPU, no TPU replica
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)
	for _, typ := range []brokerv1.DeviceType{brokerv1.DeviceType_DEVICE_TYPE_GPU, brokerv1.DeviceType_DEVICE_TYPE_TPU} {
		_, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: "nbmf-hash-v1", DeviceType: typ, Items: textItems("a record")})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("Encode pinned to %v: %v, want FAILED_PRECONDITION", typ, err)
		}
	}
	if _, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: "nbmf-hash-v1", DeviceType: brokerv1.DeviceType_DEVICE_TYPE_CPU, Items: textItems("a record")}); err != nil {
		t.Errorf("Encode pinned to the CPU: %v", err)
	}
}
