package daemon

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// A 4,096-record BOTH answer is larger than gRPC clients' default 4 MiB
// receive limit: plain Encode fails in such a client, EncodeStream gives
// every result in order, each part under the limit, equal to Encode's
// (read by a client that raised its limit).
func TestEncodeStreamLargeAnswer(t *testing.T) {
	d := startDaemon(t, testConfig(t))
	ctx := testCtx(t)
	items := make([]*brokerv1.EncodeItem, 4096)
	for i := range items {
		text := fmt.Sprintf("record %d: %s", i, strings.Repeat("the council keeps its memory in order ", 2))
		items[i] = &brokerv1.EncodeItem{Id: fmt.Sprint(i), Content: &brokerv1.EncodeItem_Text{Text: text}}
	}
	req := &brokerv1.EncodeRequest{Items: items, Fidelity: brokerv1.Fidelity_FIDELITY_BOTH}

	c := brokerv1.NewBrokerServiceClient(d.conn) // default limits
	_, err := c.Encode(ctx, req)
	wantCode(t, err, codes.ResourceExhausted, "larger than max")

	big, err := grpc.NewClient("unix://"+d.addrs.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	whole, err := brokerv1.NewBrokerServiceClient(big).Encode(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if n := proto.Size(whole); n <= 4<<20 {
		t.Fatalf("the whole answer is %d bytes: not over the 4 MiB default, the test proves nothing", n)
	}

	// Each phase has a deadline of its own: under -race on a loaded
	// machine one 4096-item answer takes tens of seconds.
	for _, limit := range []int32{0, 300 << 10} {
		t.Run(fmt.Sprint("max_part_bytes=", limit), func(t *testing.T) {
			ctx := testCtx(t)
			st, err := c.EncodeStream(ctx, &brokerv1.EncodeStreamRequest{Request: req, MaxPartBytes: limit})
			if err != nil {
				t.Fatal(err)
			}
			want := int(limit)
			if want == 0 {
				want = 1 << 20
			}
			var (
				got   []*brokerv1.EncodeResult
				parts int
				last  *brokerv1.EncodeStreamResponse
			)
			for {
				p, err := st.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				parts++
				if int(p.GetOffset()) != len(got) || p.GetTotal() != 4096 {
					t.Fatalf("part %d: offset %d total %d after %d results", parts, p.GetOffset(), p.GetTotal(), len(got))
				}
				if n := proto.Size(p); n > want+1024 {
					t.Errorf("part %d is %d bytes, over %d", parts, n, want)
				}
				got = append(got, p.GetResults()...)
				last = p
			}
			if len(got) != 4096 || parts < 2 || last.GetExecution() == nil || last.GetModel() != whole.GetModel() {
				t.Fatalf("%d results in %d parts; last %v", len(got), parts, last.GetExecution())
			}
			for i, r := range got {
				if !proto.Equal(r, whole.GetResults()[i]) {
					t.Fatalf("result %d differs from Encode's", i)
				}
			}
		})
	}

	t.Run("errors", func(t *testing.T) {
		ctx := testCtx(t)
		st, err := c.EncodeStream(ctx, &brokerv1.EncodeStreamRequest{Request: &brokerv1.EncodeRequest{}})
		if err == nil {
			_, err = st.Recv()
		}
		wantCode(t, err, codes.InvalidArgument)
		st, err = c.EncodeStream(ctx, &brokerv1.EncodeStreamRequest{Request: &brokerv1.EncodeRequest{Items: items[:1], Model: "nope"}})
		if err == nil {
			_, err = st.Recv()
		}
		wantCode(t, err, codes.NotFound, "nope")
		st, err = c.EncodeStream(ctx, &brokerv1.EncodeStreamRequest{Request: req, MaxPartBytes: -1})
		if err == nil {
			_, err = st.Recv()
		}
		wantCode(t, err, codes.InvalidArgument, "max_part_bytes")
	})
}
