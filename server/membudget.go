package server

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Memory held for requests is bounded in bytes, not only in queued items:
// each call is charged for its request (twice its encoded size: the
// decoded message and what is built from it — tokens, features, outputs —
// and the Go structs and slices decoding made, decodecost.go) from the moment it is accepted until it answers, and a call that would
// exceed the budget is refused at once with RESOURCE_EXHAUSTED and a retry
// hint, so brokerd keeps working at its limit instead of being killed.

// RequestOverhead is charged to every call besides its bytes.
const RequestOverhead = 4 << 10

// budgetRetry is the RetryInfo delay of a refusal: requests finish in
// milliseconds, so a short wait finds room.
const budgetRetry = 100 * time.Millisecond

type byteBudget struct {
	max    int64
	shapes shapes // what decoding a request builds (cost)

	mu   sync.Mutex
	used int64

	inflight prometheus.Gauge
	refused  *prometheus.CounterVec
}

func newByteBudget(max int64, reg prometheus.Registerer) *byteBudget {
	b := &byteBudget{
		max: max,
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "brokerd", Name: "inflight_request_bytes",
			Help: "Bytes charged to the calls being served (requests and what is built from them).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "brokerd", Name: "inflight_bytes_refused_total",
			Help: "Calls refused because the in-flight byte budget was full (RESOURCE_EXHAUSTED) or smaller than the call (INVALID_ARGUMENT).",
		}, []string{"method"}),
	}
	if reg != nil {
		reg.MustRegister(b.inflight, b.refused)
	}
	return b
}

// cost is what a request is charged: twice its bytes, and what decoding it
// built besides them (decodecost.go).
func (b *byteBudget) cost(req any) int64 {
	if m, ok := req.(proto.Message); ok {
		return 2*int64(proto.Size(m)) + b.shapes.decoded(m.ProtoReflect()) + RequestOverhead
	}
	return RequestOverhead
}

// acquire charges n bytes; release gives them back.
func (b *byteBudget) acquire(method string, n int64) (release func(), err error) {
	if n > b.max {
		b.refused.WithLabelValues(method).Inc()
		return nil, status.Errorf(codes.InvalidArgument, "%s: the request needs %d bytes in flight, more than the whole budget of %d (--max-inflight-bytes); split it", method, n, b.max)
	}
	b.mu.Lock()
	if b.used+n > b.max {
		used := b.used
		b.mu.Unlock()
		b.refused.WithLabelValues(method).Inc()
		st := status.Newf(codes.ResourceExhausted, "%s: %d of %d bytes are held by calls in flight and this one needs %d (--max-inflight-bytes); retry after %v", method, used, b.max, n, budgetRetry)
		if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(budgetRetry)}); derr == nil {
			st = d
		}
		return nil, st.Err()
	}
	b.used += n
	b.mu.Unlock()
	b.inflight.Add(float64(n))
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.used -= n
			b.mu.Unlock()
			b.inflight.Sub(float64(n))
		})
	}, nil
}

// What a call builds besides its request, per item, before it answers:
// the interceptors charge a request twice its size, which a request of
// many small items outgrows many times (an Encode item of one byte makes a
// 1.5 KiB projection and a 1.5 KiB vector, twice: built and serialised).
const (
	// encodeItemHeld is one Encode item's vectors, projection and result.
	encodeItemHeld = 8 << 10
	// tokenHeld is one token of a tokenised text item (ids, types, mask).
	tokenHeld = 24
	// unknownWidth stands for an output whose width the model's metadata
	// leaves open (an encoder's hidden size): the largest usual one.
	unknownWidth = 1024
)

// holdOutputs charges n bytes a call builds (outputs, vectors, tokens) to
// the in-flight budget until release, as the interceptors charge its
// request; a call the budget cannot take is refused as a request is.
func (s *BrokerService) holdOutputs(method string, n int64) (release func(), err error) {
	if s.budget == nil || n <= 0 {
		return func() {}, nil
	}
	return s.budget.acquire(method, n)
}

func (b *byteBudget) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		release, err := b.acquire(info.FullMethod, b.cost(req))
		if err != nil {
			return nil, err
		}
		defer release()
		return handler(ctx, req)
	}
}

func (b *byteBudget) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		bs := &budgetStream{ServerStream: ss, b: b, method: info.FullMethod, charges: &msgCharges{}}
		bs.ctx = context.WithValue(ss.Context(), chargesKey{}, bs.charges)
		defer bs.charges.releaseAll()
		return handler(srv, bs)
	}
}

// budgetStream charges each message a streaming call receives until the
// call ends, or until its handler takes the charge (messageCharge) to
// release it when that message's work is done: a bidirectional stream
// (ModelStreamInfer) lives as long as its client, and its answered
// messages must not stay charged.
type budgetStream struct {
	grpc.ServerStream
	b       *byteBudget
	method  string
	ctx     context.Context
	charges *msgCharges
}

func (s *budgetStream) Context() context.Context { return s.ctx }

func (s *budgetStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	release, err := s.b.acquire(s.method, s.b.cost(m))
	if err != nil {
		return budgetRefusal{err}
	}
	s.charges.add(release)
	return nil
}

// budgetRefusal is the refusal of a streamed message received whole: the
// stream is intact, so a stream of independent requests (ModelStreamInfer)
// may answer that request and read on. Its status is the refusal's.
type budgetRefusal struct{ error }

func (r budgetRefusal) GRPCStatus() *status.Status { return status.Convert(r.error) }

// msgCharges are the charges of a stream's messages not yet released.
type msgCharges struct {
	mu      sync.Mutex
	pending []func()
}

type chargesKey struct{}

func (c *msgCharges) add(release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = append(c.pending, release)
}

func (c *msgCharges) releaseAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.pending {
		r()
	}
	c.pending = nil
}

// messageCharge hands a stream handler the charge of the message it
// received last (call it right after the receive, from the receiving
// goroutine): the handler releases it when that message is answered. It
// is a no-op outside a budgeted stream.
func messageCharge(ctx context.Context) (release func()) {
	c, ok := ctx.Value(chargesKey{}).(*msgCharges)
	if !ok {
		return func() {}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.pending)
	if n == 0 {
		return func() {}
	}
	release = c.pending[n-1]
	c.pending[n-1] = nil
	c.pending = c.pending[:n-1]
	return release
}
