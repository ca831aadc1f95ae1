package server

import (
	"context"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rpcMetrics counts and times every RPC by method and code.
type rpcMetrics struct {
	handled  *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newRPCMetrics(reg prometheus.Registerer) *rpcMetrics {
	m := &rpcMetrics{
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "brokerd", Subsystem: "grpc", Name: "handled_total",
			Help: "RPCs completed, by method and gRPC status code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "brokerd", Subsystem: "grpc", Name: "handling_seconds",
			Help:    "Time to handle an RPC, by method.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"method"}),
	}
	reg.MustRegister(m.handled, m.duration)
	return m
}

// unaryInterceptor recovers panics into INTERNAL (a bug must never take the
// daemon or another client's call down), logs, and records metrics.
func unaryInterceptor(log *zap.Logger, m *rpcMetrics, codec *parseCodec) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		start := time.Now()
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in RPC handler", zap.String("method", info.FullMethod),
					zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
				resp, err = nil, status.Errorf(codes.Internal, "internal error in %s (logged by brokerd)", info.FullMethod)
			}
			code := status.Code(err)
			elapsed := time.Since(start)
			m.handled.WithLabelValues(info.FullMethod, code.String()).Inc()
			m.duration.WithLabelValues(info.FullMethod).Observe(elapsed.Seconds())
			log.Debug("rpc", zap.String("method", info.FullMethod), zap.Stringer("code", code), zap.Duration("took", elapsed))
		}()
		if err := codec.takeParseError(info.FullMethod, req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// streamInterceptor recovers panics in streaming handlers (health Watch, reflection).
func streamInterceptor(log *zap.Logger, m *rpcMetrics, codec *parseCodec) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		start := time.Now()
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in stream handler", zap.String("method", info.FullMethod),
					zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
				err = status.Errorf(codes.Internal, "internal error in %s (logged by brokerd)", info.FullMethod)
			}
			m.handled.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
			m.duration.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
		}()
		if codec != nil {
			ss = &parseCheckedStream{ServerStream: ss, codec: codec, method: info.FullMethod}
		}
		return handler(srv, ss)
	}
}

// sendTimeout bounds one message of a server stream (pacedSends).
const sendTimeout = time.Minute

// pacedSends bounds each message a stream handler sends: a client that
// keeps its stream open and reads nothing stops HTTP/2 flow control, and
// SendMsg would block for ever with the call's resources held (a
// generator's model gate, which an unload waits for; its in-flight bytes).
// A send still waiting after timeout fails with UNAVAILABLE; the handler
// returns, gRPC ends the stream, and the blocked write returns.
func pacedSends(timeout time.Duration) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &pacedStream{ServerStream: ss, timeout: timeout})
	}
}

type pacedStream struct {
	grpc.ServerStream
	timeout time.Duration

	mu    sync.Mutex // one send at a time, as gRPC requires
	stuck error      // set once a send timed out: the client is not reading
}

func (s *pacedStream) SendMsg(m any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stuck != nil {
		return s.stuck
	}
	done := make(chan error, 1)
	go func() { done <- s.ServerStream.SendMsg(m) }()
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		s.stuck = status.Errorf(codes.Unavailable, "the client took no message of this stream for %v: it is not reading; the call ends", s.timeout)
		return s.stuck
	}
}
