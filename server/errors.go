package server

import (
	"errors"

	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/brokerd/brokerd/scheduler"
	"github.com/brokerd/brokerd/server/internal/errtable"
)

// toStatus turns an error from the packages below into the gRPC status the
// API promises, with the code of the error table (server/internal/errtable,
// which the HTTP edge shares). It is the only place where that translation
// happens. A full queue carries a RetryInfo detail so clients back off by
// the scheduler's own estimate.
func toStatus(log *zap.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := errtable.Code(err)
	if code == codes.Internal {
		log.Error("internal error", zap.String("method", method), zap.Error(err))
	}
	st := status.New(code, err.Error())
	if full := (*scheduler.QueueFullError)(nil); errors.As(err, &full) {
		if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(full.RetryAfter)}); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// schedulerStatus is toStatus for the scheduler's errors, whose draining
// says who is draining.
func (s *BrokerService) schedulerStatus(method string, err error) error {
	if errors.Is(err, scheduler.ErrDraining) {
		return status.Error(codes.Unavailable, "brokerd is draining: "+err.Error())
	}
	return toStatus(s.log, method, err)
}
