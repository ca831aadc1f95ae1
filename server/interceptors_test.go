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

// serveUnix serves srv (its services registered) on a Unix socket of the
// test's and returns a client connection to it.
func serveUnix(t *testing.T, srv *grpc.Server, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// fixedWindows keep a client's HTTP/2 windows at 64 KiB (no BDP growth),
// so a server's sends stop after that much the client does not read.
var fixedWindows = []grpc.DialOption{grpc.WithInitialWindowSize(64 << 10), grpc.WithInitialConnWindowSize(64 << 10)}

// floodClient serves a floodBroker under pacedSends(timeout).
func floodClient(t *testing.T, timeout time.Duration) (brokerv1.BrokerServiceClient, *floodBroker) {
	b := &floodBroker{ended: make(chan error, 1)}
	srv := grpc.NewServer(grpc.StreamInterceptor(pacedSends(timeout)))
	brokerv1.RegisterBrokerServiceServer(srv, b)
	return brokerv1.NewBrokerServiceClient(serveUnix(t, srv, fixedWindows...)), b
}

// TestPacedSendsEndAStreamNobodyReads: a client that opens a stream and
// reads nothing stops flow control; the send that waits past the timeout
// fails UNAVAILABLE and the handler returns, instead of holding its
// resources for ever.
func TestPacedSendsEndAStreamNobodyReads(t *testing.T) {
	c, b := floodClient(t, 100*time.Millisecond)
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
}

// TestPacedSendsKeepAReader: a client that reads gets every message. The
// timeout is production's (a minute), far above a busy machine's pauses.
func TestPacedSendsKeepAReader(t *testing.T) {
	c, b := floodClient(t, sendTimeout)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := c.Generate(ctx, &brokerv1.GenerateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 64 { // 1 MiB, then the client leaves
		if _, err := st.Recv(); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	cancel()
	if err := <-b.ended; status.Code(err) == codes.Unavailable {
		t.Errorf("a client that read ended as one that does not: %v", err)
	}
}
