package httpapi

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// floodBackend streams 16 KiB deltas until send fails or its context
// ends (a generator with room left), and says when its call has ended.
type floodBackend struct {
	fakeBackend
	called chan struct{}
	ended  chan error
}

func (b *floodBackend) RunChat(ctx context.Context, req *brokerv1.ChatRequest, send func([]*brokerv1.GenerationDelta, []*brokerv1.GenerationResult) error) (err error) {
	close(b.called)
	defer func() { b.ended <- err }()
	piece := strings.Repeat("x", 16<<10)
	for i := 0; i < 1<<20; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := send([]*brokerv1.GenerationDelta{{Index: 0, Text: piece, TokenIds: []int32{1}}}, nil); err != nil {
			return err
		}
	}
	return nil
}

// serveTCP serves h as production does (server/http.go: no WriteTimeout).
func serveTCP(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute, MaxHeaderBytes: 64 << 10}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestStreamNeverReadEndsTheCall: a streaming client that keeps its
// connection open and reads nothing does not hold the generation call (its
// model's gate, its in-flight bytes) forever: once a write has waited
// WriteTimeout, the call's context ends.
func TestStreamNeverReadEndsTheCall(t *testing.T) {
	for _, tc := range []struct{ name, path, body string }{
		{"ollama chat", "/api/chat", `{"model":"tiny-llm","messages":[{"role":"user","content":"hi"}]}`},
		{"openai chat stream", "/v1/chat/completions", `{"model":"tiny-llm","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &floodBackend{called: make(chan struct{}), ended: make(chan error, 1)}
			addr := serveTCP(t, New(b, Options{Registerer: prometheus.NewRegistry(), WriteTimeout: 100 * time.Millisecond}))
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.(*net.TCPConn).SetReadBuffer(4096)
			req := "POST " + tc.path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
				strconv.Itoa(len(tc.body)) + "\r\n\r\n" + tc.body
			if _, err := conn.Write([]byte(req)); err != nil {
				t.Fatal(err)
			}
			<-b.called
			// Far from the work's duration: the socket's buffers fill in
			// milliseconds, then one write waits 100ms.
			select {
			case err := <-b.ended:
				if err == nil {
					t.Error("the call ran to its end: the writes never failed")
				}
			case <-time.After(time.Minute):
				t.Fatal("a client that reads nothing still holds the generation call after a minute")
			}
		})
	}
}
