package server

import (
	"context"
	"errors"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/detect"
)

// toStatus turns an error from the packages below into the gRPC status the
// API promises. It is the only place where that translation happens.
func toStatus(log *zap.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, detect.ErrDeviceNotFound):
		code = codes.NotFound
	case errors.Is(err, detect.ErrInvalidArgument):
		code = codes.InvalidArgument
	case errors.Is(err, detect.ErrDeviceUnavailable):
		code = codes.FailedPrecondition
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	if code == codes.Internal {
		log.Error("internal error", zap.String("method", method), zap.Error(err))
	}
	return status.Error(code, err.Error())
}
