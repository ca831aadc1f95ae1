package server

import (
	"compress/flate"
	"io"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/encoding"
	// gzip registers itself: requests compressed with gzip are accepted,
	// and a server answers in the compression its client asked with.
	_ "google.golang.org/grpc/encoding/gzip"
)

// deflateName is the grpc-encoding of raw DEFLATE (RFC 1951), which
// grpc-go does not ship and some clients (grpcio's Deflate) send.
const deflateName = "deflate"

func init() {
	encoding.RegisterCompressor(gated{&deflateCompressor{}})
	encoding.RegisterCompressor(gated{encoding.GetCompressor("gzip")})
}

// deflateCompressor is encoding.Compressor over compress/flate, with pooled
// writers (a flate.Writer holds ~600 KiB).
type deflateCompressor struct {
	writers sync.Pool
}

type deflateWriter struct {
	*flate.Writer
	pool *sync.Pool
}

func (w *deflateWriter) Close() error {
	defer w.pool.Put(w)
	return w.Writer.Close()
}

func (c *deflateCompressor) Compress(w io.Writer) (io.WriteCloser, error) {
	if dw, ok := c.writers.Get().(*deflateWriter); ok {
		dw.Reset(w)
		return dw, nil
	}
	fw, err := flate.NewWriter(w, flate.DefaultCompression)
	if err != nil {
		return nil, err
	}
	return &deflateWriter{Writer: fw, pool: &c.writers}, nil
}

func (c *deflateCompressor) Decompress(r io.Reader) (io.Reader, error) {
	return flate.NewReader(r), nil
}

func (c *deflateCompressor) Name() string { return deflateName }

// A compressed request is decompressed whole (grpc-go bounds it by
// MaxRecvMsgSize only) before any interceptor, and so the in-flight budget,
// sees it: a few KiB of gzip become 64 MiB, so one client's concurrent
// calls could hold gigabytes before a single one was refused. The bytes
// being decompressed are bounded in the whole process instead (the
// compressor registry is the process's): each decompression reserves what
// its input can expand to, at most, and waits while the reservations of
// those running would pass the bound. Decompression is work on bytes
// already received, so those running always finish and make room.

// maxInflateRatio is DEFLATE's largest expansion (zlib's FAQ: 1032:1), for
// gzip and raw DEFLATE alike; inflateSlack covers headers and rounding.
const (
	maxInflateRatio = 1032
	inflateSlack    = 4 << 10
)

// decompressing is the process's bound on bytes being decompressed;
// NewEdge sets it to the in-flight budget.
var decompressing = newByteGate(256 << 20)

// gated is a compressor whose decompressions take their room in
// decompressing first.
type gated struct{ encoding.Compressor }

func (g gated) Decompress(r io.Reader) (io.Reader, error) {
	// Unknown size: the most one message yields.
	n := int64(-1)
	if rem, ok := r.(interface{ Remaining() int }); ok { // mem.Reader: the whole message is in memory
		n = inflateSlack + maxInflateRatio*int64(rem.Remaining())
	}
	release := decompressing.acquire(n)
	dr, err := g.Compressor.Decompress(r)
	if err != nil {
		release()
		return nil, err
	}
	return &gatedReader{Reader: dr, release: release}, nil
}

// gatedReader gives its room back when grpc-go closes it, once the message
// is decompressed (or failed).
type gatedReader struct {
	io.Reader
	release func()
}

func (r *gatedReader) Close() error {
	defer r.release()
	if c, ok := r.Reader.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// byteGate is a FIFO counting semaphore of bytes: one large reservation
// is not passed by a stream of small ones.
type byteGate struct {
	mu      sync.Mutex
	max     int64
	most    int64 // the most one decompression yields: grpc-go stops it past MaxRecvMsgSize (0: no such bound)
	used    int64
	peak    int64 // the most reserved at once (tests)
	waiting []*gateWaiter
}

type gateWaiter struct {
	n     int64
	ready chan struct{}
}

func newByteGate(max int64) *byteGate { return &byteGate{max: max} }

// setLimits changes the bound and the most one reservation needs (what
// grpc-go lets one message expand to); reservations already made stay.
func (g *byteGate) setLimits(max, most int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.max, g.most = max, most
	g.wake()
}

// acquire reserves n bytes (n < 0: the most one message yields; over the
// bound: the whole bound, so a decompression larger than it runs alone),
// waiting for room.
func (g *byteGate) acquire(n int64) (release func()) {
	g.mu.Lock()
	if g.most > 0 && (n < 0 || n > g.most) {
		n = g.most
	}
	if n < 0 || n > g.max {
		n = g.max
	}
	w := &gateWaiter{n: n, ready: make(chan struct{})}
	g.waiting = append(g.waiting, w)
	g.wake()
	g.mu.Unlock()
	<-w.ready
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.used -= n
			g.wake()
		})
	}
}

// state is what is reserved and how many wait (metrics).
func (g *byteGate) state() (used int64, waiting int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, len(g.waiting)
}

// registerGateMetrics exports the gate's state: decompressions that wait
// are calls queued before any interceptor counts them.
func registerGateMetrics(reg prometheus.Registerer, g *byteGate) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "brokerd", Subsystem: "grpc", Name: "decompress_reserved_bytes",
			Help: "Bytes reserved by compressed requests being decompressed (bounded by the in-flight budget).",
		}, func() float64 { u, _ := g.state(); return float64(u) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "brokerd", Subsystem: "grpc", Name: "decompress_waiting",
			Help: "Compressed requests waiting for room to be decompressed.",
		}, func() float64 { _, w := g.state(); return float64(w) }),
	)
}

// wake admits the waiters at the head of the queue that fit.
func (g *byteGate) wake() {
	for len(g.waiting) > 0 {
		w := g.waiting[0]
		if g.used > 0 && g.used+w.n > g.max {
			return
		}
		g.used += w.n
		g.peak = max(g.peak, g.used)
		g.waiting = g.waiting[1:]
		close(w.ready)
	}
}
