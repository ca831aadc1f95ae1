package server

import (
	"context"
	"errors"

	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/lifecycle"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
	"github.com/brokerd/brokerd/runtime/safetensors"
	"github.com/brokerd/brokerd/scheduler"
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
	case errors.Is(err, lifecycle.ErrModelNotFound):
		code = codes.NotFound
	case errors.Is(err, lifecycle.ErrModelNotLoaded), errors.Is(err, lifecycle.ErrBuiltinModel):
		code = codes.FailedPrecondition
	case errors.As(err, new(*lifecycle.AdmissionError)), errors.Is(err, runtime.ErrOutOfMemory):
		code = codes.ResourceExhausted
	case errors.Is(err, models.ErrInvalidModel), errors.Is(err, safetensors.ErrInvalid), errors.Is(err, models.ErrInvalidInput):
		// A model's files (every kind: config, tokenizer, weights, layout).
		code = codes.InvalidArgument
	case errors.Is(err, grammar.ErrInvalidGrammar), errors.Is(err, grammar.ErrUnsupportedSchema), errors.Is(err, grammar.ErrGrammarTooLarge):
		// A request's structured-output constraint.
		code = codes.InvalidArgument
	case errors.Is(err, scheduler.ErrDraining):
		code = codes.Unavailable
	case errors.Is(err, scheduler.ErrNoMatchingReplica):
		code = codes.FailedPrecondition
	case errors.Is(err, scheduler.ErrNoDevice):
		code = codes.Unavailable
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

// schedulerStatus maps the scheduler's errors. A full queue carries a
// RetryInfo detail so clients back off by the scheduler's own estimate.
func (s *BrokerService) schedulerStatus(method string, err error) error {
	var full *scheduler.QueueFullError
	switch {
	case errors.As(err, &full):
		st := status.New(codes.ResourceExhausted, err.Error())
		if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(full.RetryAfter)}); derr == nil {
			st = d
		}
		return st.Err()
	case errors.Is(err, scheduler.ErrQueueFull):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, scheduler.ErrDraining):
		return status.Error(codes.Unavailable, "brokerd is draining: "+err.Error())
	case errors.Is(err, scheduler.ErrUnknownModel), errors.Is(err, scheduler.ErrDeviceNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, runtime.ErrOutOfMemory):
		// The device ran out of its budget for this batch: the next try
		// may fit (RESOURCE_EXHAUSTED), unlike a failing device.
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, scheduler.ErrNoMatchingReplica):
		// Pinned to devices no replica runs on (a type the host lacks):
		// a retry gets the same answer, unlike cordoned replicas.
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, scheduler.ErrNoDevice), errors.Is(err, scheduler.ErrBackend):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, scheduler.ErrInvalidArgument):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, scheduler.ErrWrongKind):
		// The edge checks the model's kind first: this is a model
		// replaced by one of another kind in between (a reload).
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return toStatus(s.log, method, err)
}
