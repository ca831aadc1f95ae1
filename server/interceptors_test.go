package server

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// floodBroker's Generate sends 16 KiB deltas until a send fails or the
// call's context ends, and reports how it ended.
type floodBroker struct {
	brokerv1.UnimplementedBrokerServiceServer
	ended chan error
}

func (b *floodBroker) Generate(_ *brokerv1.GenerateRequest, stream brokerv1.BrokerService_GenerateServer) (err error) {
	defer func() { b.ended <- err }()
	piece := strings.Repeat("x", 16<<10)
	for range 1 << 20 {
		if err := stream.Context().Err(); err != nil {
			return err
		}
		if err := stream.Send(&brokerv1.GenerateResponse{Deltas: []*brokerv1.GenerationDelta{{Text: piece}}}); err != nil {
			return err
		}
	}
	return nil
}

// TestPacedSendsEndAStreamNobodyReads: a client that opens a stream and
// reads nothing stops flow control; the send that waits past the timeout
// fails UNAVAILABLE and the handler returns, instead of holding its
// resources for ever. A client that reads gets every message.
func TestPacedSendsEndAStreamNobodyReads(t *testing.T) {
	b := &floodBroker{ended: make(chan error, 1)}
	srv := grpc.NewServer(grpc.StreamInterceptor(pacedSends(100 * time.Millisecond)))
	brokerv1.RegisterBrokerServiceServer(srv, b)
	sock := filepath.Join(t.TempDir(), "b.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	// Fixed windows: no BDP growth, so the flow stops after 64 KiB.
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := brokerv1.NewBrokerServiceClient(conn)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := c.Generate(ctx, &brokerv1.GenerateRequest{}); err != nil {
		t.Fatal(err)
	}
	// Far from the work's duration: the windows fill in milliseconds.
	select {
	case err := <-b.ended:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("the handler ended with %v, want UNAVAILABLE", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a stream nobody reads still holds its handler after a minute")
	}

	// A reader is not cut: it takes 64 messages (1 MiB), then leaves.
	st, err := c.Generate(ctx, &brokerv1.GenerateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 64 {
		if _, err := st.Recv(); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	cancel()
	if err := <-b.ended; status.Code(err) == codes.Unavailable {
		t.Errorf("a client that read ended as one that does not: %v", err)
	}
}
