package client

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func withDetails(t *testing.T, c codes.Code, msg string, details ...*errdetails.RetryInfo) error {
	t.Helper()
	st := status.New(c, msg)
	for _, d := range details {
		var err error
		if st, err = st.WithDetails(d); err != nil {
			t.Fatal(err)
		}
	}
	return st.Err()
}

func TestErrors(t *testing.T) {
	hint := &errdetails.RetryInfo{RetryDelay: durationpb.New(250 * time.Millisecond)}
	tests := []struct {
		name      string
		err       error
		prev      time.Duration
		code      codes.Code
		retryable bool
		delay     time.Duration
	}{
		{"server hint", withDetails(t, codes.ResourceExhausted, "queue full", hint), 0, codes.ResourceExhausted, true, 250 * time.Millisecond},
		{"hint capped at 1s", withDetails(t, codes.Unavailable, "draining", &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Minute)}), 0, codes.Unavailable, true, time.Second},
		{"unavailable, first", withDetails(t, codes.Unavailable, "connection refused"), 0, codes.Unavailable, true, 5 * time.Millisecond},
		{"unavailable, doubling", withDetails(t, codes.Unavailable, "connection refused"), 40 * time.Millisecond, codes.Unavailable, true, 80 * time.Millisecond},
		{"unavailable, capped", withDetails(t, codes.Unavailable, "x"), 900 * time.Millisecond, codes.Unavailable, true, time.Second},
		{"client mistake", withDetails(t, codes.InvalidArgument, "items[0]: empty item"), 0, codes.InvalidArgument, false, 0},
		{"not a status", errors.New("boom"), 0, codes.Unknown, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := fmt.Errorf("call: %w", wrap(tt.err))
			e, ok := AsError(err)
			if !ok || e.Code != tt.code || e.Retryable() != tt.retryable {
				t.Fatalf("AsError = %+v, %v", e, ok)
			}
			if status.Code(e) != tt.code {
				t.Errorf("status.Code(*Error) = %v, want %v", status.Code(e), tt.code)
			}
			if got := RetryDelay(err, tt.prev); got != tt.delay {
				t.Errorf("RetryDelay = %v, want %v", got, tt.delay)
			}
		})
	}
	if RetryDelay(nil, time.Second) != 0 || wrap(nil) != nil {
		t.Error("nil is not an error")
	}
}
