package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding/gzip"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
)

// deflateName is the grpc-encoding of raw DEFLATE, which server registers.
const deflateName = "deflate"

// TestCompressedRequests: clients that compress (tritonclient's
// compression_algorithm, grpc.Compression.Gzip) are served on every
// service, and answered in the same compression.
func TestCompressedRequests(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := brokerv1.NewBrokerServiceClient(d.conn)
	k := inference.NewGRPCInferenceServiceClient(d.conn)
	text := strings.Repeat("a compressible memory record ", 200)
	for _, name := range []string{gzip.Name, deflateName} {
		t.Run(name, func(t *testing.T) {
			resp, err := c.Encode(ctx, &brokerv1.EncodeRequest{Items: []*brokerv1.EncodeItem{{Content: &brokerv1.EncodeItem_Text{Text: text}}}},
				grpc.UseCompressor(name))
			if err != nil {
				t.Fatalf("Encode with %s: %v", name, err)
			}
			if len(resp.GetResults()) != 1 || len(resp.GetResults()[0].GetVector()) == 0 {
				t.Errorf("Encode with %s: %v", name, resp)
			}
			if _, err := k.ServerLive(ctx, &inference.ServerLiveRequest{}, grpc.UseCompressor(name)); err != nil {
				t.Errorf("KServe ServerLive with %s: %v", name, err)
			}
		})
	}
}
