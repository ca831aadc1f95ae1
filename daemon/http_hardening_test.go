package daemon

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server"
	"github.com/brokerd/brokerd/server/config"
)

// inflightBytes reads brokerd_inflight_request_bytes from the metrics
// listener.
func inflightBytes(t *testing.T, metricsAddr string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^brokerd_inflight_request_bytes ([0-9.e+]+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("metrics lack brokerd_inflight_request_bytes")
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitFor polls cond every 20 ms until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIdleHTTPBodiesHoldNoBudget (Hardening II, finding 2): the HTTP edge
// charged a request's declared Content-Length to the in-flight budget
// before reading its body, with no deadline on the body, so connections
// that sent headers and then nothing held the whole budget: every HTTP and
// gRPC call got 429 / RESOURCE_EXHAUSTED for as long as they stayed. Bytes
// are now charged as they are read, and a body that does not arrive within
// --http-body-timeout is answered 408 and its connection closed; a length
// over the per-request limit is refused up front with 413.
func TestIdleHTTPBodiesHoldNoBudget(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.HTTPAllowUnauthenticated = true
	cfg.MaxMessageBytes = 4 << 20
	// Four requests declaring 4 MiB filled it (each was charged twice its
	// declared length and its overhead), leaving less than a call needs.
	cfg.MaxInflightBytes = 4*(2*int64(cfg.MaxMessageBytes-1)+server.RequestOverhead) + server.RequestOverhead/2
	// Far from the work the test does while they hang (a few calls), far
	// below the test's own bound on their closing.
	cfg.HTTPBodyTimeout = config.Duration(5 * time.Second)
	// Room for the test's connections from one address, whatever this
	// machine's descriptor limit.
	cfg.MaxConnections, cfg.MaxConnectionsPerClient = 1000, 1000
	d := startDaemon(t, cfg)

	const idle = 36
	header := func(length int) string {
		return fmt.Sprintf("POST /api/embed HTTP/1.1\r\nHost: brokerd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", length)
	}
	var conns []net.Conn
	dial := func() net.Conn {
		c, err := net.Dial("tcp", d.addrs.HTTP)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
		return c
	}
	for range idle {
		if _, err := io.WriteString(dial(), header(cfg.MaxMessageBytes-1)); err != nil {
			t.Fatal(err)
		}
	}
	// One sends a quarter of its body and stalls.
	stalled, sent := dial(), `{"model":"nbmf-hash-v1","input":"`+strings.Repeat("a", cfg.MaxMessageBytes/4)
	if _, err := io.WriteString(stalled, header(cfg.MaxMessageBytes-1)+sent); err != nil {
		t.Fatal(err)
	}
	// One opens a connection and sends nothing at all.
	silent := dial()
	// Every hanging request is in its handler: each holds at least its
	// overhead.
	waitFor(t, 30*time.Second, "hanging requests admitted", func() bool {
		return inflightBytes(t, d.addrs.Metrics) >= float64((idle+1)*server.RequestOverhead)
	})

	// While they hang, others are served over HTTP and gRPC.
	for i := range 3 {
		resp, err := http.Post("http://"+d.addrs.HTTP+"/api/embed", "application/json", strings.NewReader(`{"model":"nbmf-hash-v1","input":"served"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP call %d while %d bodies hang: %d %s", i, idle+1, resp.StatusCode, body)
		}
		if _, err := brokerv1.NewBrokerServiceClient(d.conn).Encode(testCtx(t), &brokerv1.EncodeRequest{Model: "nbmf-hash-v1",
			Fidelity: brokerv1.Fidelity_FIDELITY_SEMANTIC, Items: []*brokerv1.EncodeItem{{Content: &brokerv1.EncodeItem_Text{Text: "served"}}}}); err != nil {
			t.Fatalf("gRPC call %d while %d bodies hang: %v", i, idle+1, err)
		}
	}
	// The stalled body holds at most what it sent (twice), not what it
	// declared; the others their overhead.
	if got, most := inflightBytes(t, d.addrs.Metrics), float64(2*len(sent)+(idle+1)*server.RequestOverhead); got > most {
		t.Errorf("in flight %.0f bytes while they hang, want at most %.0f", got, most)
	}

	// A declared length over the limit is refused before its body.
	tooLarge := dial()
	if _, err := io.WriteString(tooLarge, header(cfg.MaxMessageBytes+1)); err != nil {
		t.Fatal(err)
	}
	tooLarge.SetReadDeadline(time.Now().Add(30 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(tooLarge), nil); err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a body declared over the limit: %v %v, want 413", resp, err)
	}

	// Each hanging connection is answered 408 (it sent headers) and closed
	// once the body deadline passes; the one that sent nothing is closed.
	for i, c := range conns[:idle+2] {
		c.SetReadDeadline(time.Now().Add(60 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("connection %d not closed by brokerd: %v", i, err)
		}
		if c == silent {
			continue
		}
		if !bytes.HasPrefix(b, []byte("HTTP/1.1 408 ")) {
			t.Errorf("connection %d was answered %q, want 408", i, b)
		}
	}
	waitFor(t, 30*time.Second, "budget back to zero", func() bool { return inflightBytes(t, d.addrs.Metrics) == 0 })
}
