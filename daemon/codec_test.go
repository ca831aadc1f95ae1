package daemon

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// rawCodec sends the bytes it is given as the message, as a broken or
// hostile client would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }

// TestUnparseableRequests: a message that does not parse, or whose string
// field is not UTF-8, is INVALID_ARGUMENT (it was INTERNAL, which is for
// bugs) on unary and streaming RPCs alike, and counted in
// brokerd_grpc_handled_total (it was not: grpc-go failed it before any
// interceptor).
func TestUnparseableRequests(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	ctx := testCtx(t)
	bodies := map[string][]byte{
		"not UTF-8":      {0x0a, 0x02, 0xff, 0xfe},       // EncodeRequest.model = "\xff\xfe"
		"truncated":      {0x12, 0x10, 0x0a},             // items: 16 bytes announced, 1 sent
		"bad wire type":  {0x0f, 0xff, 0xff, 0xff, 0xff}, // field 1 with wire type 7
		"varint too big": {0x28, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	}
	for name, body := range bodies {
		t.Run("unary "+name, func(t *testing.T) {
			var out []byte
			err := d.conn.Invoke(ctx, "/broker.v1.BrokerService/Encode", &body, &out, grpc.ForceCodecV2(rawCodec{}))
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("got %v, want INVALID_ARGUMENT", err)
			}
		})
		t.Run("stream "+name, func(t *testing.T) {
			desc := &grpc.StreamDesc{ServerStreams: true}
			s, err := d.conn.NewStream(ctx, desc, "/broker.v1.BrokerService/Generate", grpc.ForceCodecV2(rawCodec{}))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SendMsg(&body); err != nil {
				t.Fatal(err)
			}
			if err := s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			var out []byte
			if err := s.RecvMsg(&out); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("got %v, want INVALID_ARGUMENT", err)
			}
		})
	}
	// A good request still works on the same connection.
	if _, err := brokerv1.NewBrokerServiceClient(d.conn).Encode(ctx, &brokerv1.EncodeRequest{Items: textItems("fine")}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + d.addrs.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, method := range []string{"Encode", "Generate"} {
		want := fmt.Sprintf(`brokerd_grpc_handled_total{code="InvalidArgument",method="/broker.v1.BrokerService/%s"} %d`, method, len(bodies))
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
