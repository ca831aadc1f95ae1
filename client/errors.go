package client

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is a call brokerd refused or failed, with its gRPC status code and,
// when brokerd sent one (queue full, memory budget, draining), how long to
// wait before trying again.
type Error struct {
	Code    codes.Code
	Message string
	// RetryAfter is the server's RetryInfo delay; 0 when it sent none.
	RetryAfter time.Duration
	// Reason and Metadata are the server's ErrorInfo (e.g. the role a
	// PERMISSION_DENIED needs), when it sent one.
	Reason   string
	Metadata map[string]string
	err      error
}

func (e *Error) Error() string { return fmt.Sprintf("brokerd: %s: %s", e.Code, e.Message) }

// Unwrap gives the gRPC status error, so status.FromError still works.
func (e *Error) Unwrap() error { return e.err }

// GRPCStatus lets status.Code and status.Convert read an *Error.
func (e *Error) GRPCStatus() *status.Status { return status.Convert(e.err) }

// Retryable says whether the same call may succeed later unchanged: the
// daemon was unreachable, overloaded or draining, or the call ran out of
// time in its queue.
func (e *Error) Retryable() bool {
	switch e.Code {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return e.RetryAfter > 0
}

// AsError returns the *Error in err's chain.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// RetryDelay is how long a well-behaved client waits after err before
// retrying, given the delay it waited last time: the server's hint when it
// sent one, else doubling from 5 ms up to 1 s for Unavailable and
// ResourceExhausted, else 0 (do not wait; most such errors should not be
// retried at all).
func RetryDelay(err error, prev time.Duration) time.Duration {
	const minBackoff, maxBackoff = 5 * time.Millisecond, time.Second
	if err == nil {
		return 0
	}
	e, ok := AsError(err)
	if !ok {
		e = wrap(err).(*Error)
	}
	if e.RetryAfter > 0 {
		return min(e.RetryAfter, maxBackoff)
	}
	switch e.Code {
	case codes.Unavailable, codes.ResourceExhausted:
		return min(max(2*prev, minBackoff), maxBackoff)
	}
	return 0
}

// wrap turns a gRPC error into an *Error (nil stays nil; a context error
// of the caller's own stays as it is, wrapped in its status).
func wrap(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := AsError(err); ok {
		return err
	}
	st := status.Convert(err)
	e := &Error{Code: st.Code(), Message: st.Message(), err: err}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			if d.GetRetryDelay() != nil {
				e.RetryAfter = max(d.GetRetryDelay().AsDuration(), 0)
			}
		case *errdetails.ErrorInfo:
			e.Reason, e.Metadata = d.GetReason(), d.GetMetadata()
		}
	}
	return e
}
