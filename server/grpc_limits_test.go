package server

// Tests of the transport-level bounds: what one connection's concurrent
// compressed calls may hold before the in-flight budget sees them, and how
// many calls one connection runs at once.

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// limitsServer serves k's KServe service on a Unix socket with the
// production server options (newGRPCServers) over cfg and a budget of
// budgetBytes, and returns the socket's path.
func limitsServer(t *testing.T, cfg config.Config, budgetBytes int64) string {
	t.Helper()
	_, k := dataService(t)
	reg := prometheus.NewRegistry()
	authz := &authorizer{admins: admins{uids: []uint32{0}}, scope: scopeAPI, log: zap.NewNop(), denied: newDeniedCounter(reg)}
	srv, _, err := newGRPCServers(cfg, false, newRPCMetrics(reg), authz, newByteBudget(budgetBytes, reg), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { decompressing.setLimits(256<<20, 0) })
	inference.RegisterGRPCInferenceServiceServer(srv, k)
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return sock
}

// preGzipped is a client codec and compressor pair that sends one
// message, gzipped once in advance, for every call: the client costs
// nothing per call, as an attacker's would not. It is the process's
// "gzip" while registered, so it decompresses with the server's, and
// counts the decompressions under way: each holds its first read until
// all calls have reached decompression, so those the server lets run at
// once are all seen running together.
type preGzipped struct {
	msg, gz []byte
	server  encoding.Compressor
	calls   int

	mu               sync.Mutex
	started          int // calls that reached decompression
	open, mostOpen   int // decompressions under way (their reader open)
	allStarted       chan struct{}
	allStartedClosed bool
}

func (p *preGzipped) Name() string { return "gzip" }

// codec marshals every request as p's message.
func (p *preGzipped) codec() encoding.CodecV2 { return preMarshaled{p.msg} }

type preMarshaled struct{ msg []byte }

func (c preMarshaled) Marshal(any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(c.msg)}, nil
}
func (preMarshaled) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}
func (preMarshaled) Name() string { return "proto" }
func (p *preGzipped) Compress(w io.Writer) (io.WriteCloser, error) {
	return preGzipWriter{w: w, gz: p.gz}, nil
}

func (p *preGzipped) Decompress(r io.Reader) (io.Reader, error) {
	p.mu.Lock()
	if p.started++; p.started == p.calls {
		close(p.allStarted)
	}
	p.mu.Unlock()
	dr, err := p.server.Decompress(r)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.open++
	p.mostOpen = max(p.mostOpen, p.open)
	p.mu.Unlock()
	return &countedReader{Reader: dr, p: p}, nil
}

type countedReader struct {
	io.Reader
	p      *preGzipped
	waited bool
}

func (r *countedReader) Read(b []byte) (int, error) {
	if !r.waited {
		r.waited = true
		select {
		case <-r.p.allStarted:
		case <-time.After(time.Minute): // a guard against a hang, not a measure
		}
	}
	return r.Reader.Read(b)
}

func (r *countedReader) Close() error {
	r.p.mu.Lock()
	r.p.open--
	r.p.mu.Unlock()
	if c, ok := r.Reader.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

type preGzipWriter struct {
	w  io.Writer
	gz []byte
}

func (w preGzipWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w preGzipWriter) Close() error {
	_, err := w.w.Write(w.gz)
	return err
}

// TestCompressedCallsBoundedBeforeTheBudget: 64 concurrent ModelInfer
// calls on one connection, each 8 KiB of gzip that expands to an 8 MiB
// request. grpc-go decompresses (and decodes) a message whole before any
// interceptor, so the in-flight budget (32 MiB here) saw each only once it
// was built: unbounded, all 64 were decompressed at once, 512 MiB (then
// copied and decoded). What the decompressions running at once may expand
// to is bounded by the budget now; every call is answered with its own
// code, and the room is given back.
func TestCompressedCallsBoundedBeforeTheBudget(t *testing.T) {
	const (
		size   = 8 << 20
		calls  = 64
		budget = 32 << 20
	)
	cfg := config.Defaults(0, func(string) string { return "" })
	cfg.MaxMessageBytes = size + 4<<10
	sock := limitsServer(t, cfg, budget)

	req := &inference.ModelInferRequest{ModelName: "nope",
		Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "UINT8", Shape: []int64{size - 64}}},
		RawInputContents: [][]byte{make([]byte, size-64)}}
	msg, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	_, _ = zw.Write(msg)
	_ = zw.Close()
	server := encoding.GetCompressor("gzip")
	client := &preGzipped{msg: msg, gz: gz.Bytes(), server: server, calls: calls, allStarted: make(chan struct{})}
	encoding.RegisterCompressor(client)
	defer encoding.RegisterCompressor(server)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(client.codec()), grpc.UseCompressor("gzip")))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := inference.NewGRPCInferenceServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			_, err := c.ModelInfer(ctx, &inference.ModelInferRequest{})
			if code := status.Code(err); code != codes.NotFound && code != codes.ResourceExhausted {
				t.Errorf("a call answered %v, want NOT_FOUND (no such model) or RESOURCE_EXHAUSTED (budget full)", err)
			}
		})
	}
	wg.Wait()
	if held := int64(client.mostOpen) * size; held > budget {
		t.Errorf("%d calls of %d KiB of gzip on one connection: %d were decompressed at once, %d MiB, before the in-flight budget of %d MiB saw any",
			calls, len(client.gz)>>10, client.mostOpen, held>>20, budget>>20)
	}
	if got := decompressing.used; got != 0 {
		t.Errorf("%d bytes still reserved for decompression after every call answered", got)
	}
}

// TestConnectionStreamsBounded: the socket's and TCP listener's server
// tells each client how many calls one connection may run at once
// (SETTINGS_MAX_CONCURRENT_STREAMS, max-concurrent-streams); grpc-go's
// default is no limit, so one connection could run any number of calls,
// each a handler goroutine and a message.
func TestConnectionStreamsBounded(t *testing.T) {
	cfg := config.Defaults(0, func(string) string { return "" })
	cfg.MaxConcurrentStreams = 7
	sock := limitsServer(t, cfg, 1<<30)
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute)) // a guard against a hang
	if _, err := c.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	// The server's first frame is its SETTINGS: 6-byte entries of an id
	// (MAX_CONCURRENT_STREAMS is 3) and a value.
	var h [9]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		t.Fatal(err)
	}
	if h[3] != 4 {
		t.Fatalf("the server's first frame is of type %d, want SETTINGS (4)", h[3])
	}
	payload := make([]byte, int(h[0])<<16|int(h[1])<<8|int(h[2]))
	if _, err := io.ReadFull(c, payload); err != nil {
		t.Fatal(err)
	}
	got := -1
	for e := payload; len(e) >= 6; e = e[6:] {
		if binary.BigEndian.Uint16(e) == 3 {
			got = int(binary.BigEndian.Uint32(e[2:]))
		}
	}
	if got != cfg.MaxConcurrentStreams {
		t.Errorf("the server's SETTINGS_MAX_CONCURRENT_STREAMS is %d (-1: none, no limit), want max-concurrent-streams %d", got, cfg.MaxConcurrentStreams)
	}
}

// TestByteGate: reservations are admitted in order while they fit; one
// larger than the bound runs alone; released room admits the next.
func TestByteGate(t *testing.T) {
	g := newByteGate(10)
	r1 := g.acquire(6)
	admitted := make(chan int, 3)
	var rel [3]func()
	for i, n := range []int64{6, 1, 20} {
		go func() {
			rel[i] = g.acquire(n)
			admitted <- i
		}()
		// Queued in this order before the next: wait until it waits.
		for {
			g.mu.Lock()
			queued := len(g.waiting)
			g.mu.Unlock()
			if queued == i+1 {
				break
			}
			goruntime.Gosched()
		}
	}
	select {
	case i := <-admitted:
		t.Fatalf("reservation %d admitted with 6 of 10 bytes held and the first waiter (6) not fitting", i)
	default:
	}
	r1()
	if a, b := <-admitted, <-admitted; a+b != 1 { // 6 + 1 fit, 20 (10) not
		t.Fatalf("admitted %d and %d, want the two oldest waiters, 0 and 1", a, b)
	}
	rel[0]()
	rel[1]()
	if i := <-admitted; i != 2 { // the whole bound, alone
		t.Fatalf("admitted %d, want 2", i)
	}
	if g.used != 10 || g.peak != 10 {
		t.Errorf("used %d, peak %d: want the large reservation capped at the bound, 10", g.used, g.peak)
	}
	rel[2]()
	rel[2]() // once only
	if g.used != 0 {
		t.Errorf("%d bytes reserved after every release", g.used)
	}
}

// No reservation needs more than one message can expand to: grpc-go stops
// a decompression past the message limit, so a large compressed message
// (reserving 1032× its size) does not run alone for nothing.
func TestByteGateMostOneMessage(t *testing.T) {
	g := newByteGate(100)
	g.setLimits(100, 30)
	for _, c := range []struct{ n, want int64 }{{1000, 30}, {-1, 30}, {30, 30}, {7, 7}} {
		release := g.acquire(c.n)
		if g.used != c.want {
			t.Errorf("a reservation of %d under a 30-byte message bound holds %d, want %d", c.n, g.used, c.want)
		}
		release()
	}
}
