package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/repo"
	"github.com/brokerd/brokerd/runtime/safetensors"
	"github.com/brokerd/brokerd/scheduler"
)

// TestSchedulerStatus pins the codes a scheduler failure reaches a client
// with, the faults of a batch included.
func TestSchedulerStatus(t *testing.T) {
	s := &BrokerService{log: zap.NewNop()}
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"queue full", &scheduler.QueueFullError{RetryAfter: time.Second}, codes.ResourceExhausted},
		{"draining", fmt.Errorf("x: %w", scheduler.ErrDraining), codes.Unavailable},
		{"every replica cordoned", fmt.Errorf("x: %w: cordoned", scheduler.ErrNoDevice), codes.Unavailable},
		{"pinned to a device type no replica runs on", fmt.Errorf("x: %w", scheduler.ErrNoMatchingReplica), codes.FailedPrecondition},
		{"a model replaced by one of another kind", fmt.Errorf("x: %w", scheduler.ErrWrongKind), codes.FailedPrecondition},
		// Every kind of model-file error is the model's fault, never INTERNAL.
		{"invalid model config", fmt.Errorf("x: %w", models.ErrInvalidConfig), codes.InvalidArgument},
		{"invalid generation config", fmt.Errorf("x: %w", models.ErrInvalidGenerationConfig), codes.InvalidArgument},
		{"invalid tokenizer", fmt.Errorf("x: %w", models.ErrInvalidTokenizer), codes.InvalidArgument},
		{"invalid model weights", fmt.Errorf("x: %w", models.ErrInvalidWeights), codes.InvalidArgument},
		{"invalid safetensors file", fmt.Errorf("x: %w", safetensors.ErrInvalid), codes.InvalidArgument},
		{"invalid model layout", fmt.Errorf("x: %w", repo.ErrInvalid), codes.InvalidArgument},
		{"device fault", fmt.Errorf("x: %w: %w", scheduler.ErrBackend, fmt.Errorf("boom")), codes.Unavailable},
		{"batch timeout", fmt.Errorf("x: %w: %w", scheduler.ErrBackend, scheduler.ErrBatchTimeout), codes.Unavailable},
		{"out of device memory", fmt.Errorf("x: %w: %w", scheduler.ErrBackend, runtime.ErrOutOfMemory), codes.ResourceExhausted},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"cancelled", fmt.Errorf("x: %w", context.Canceled), codes.Canceled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(s.schedulerStatus("/m", tc.err)); got != tc.want {
				t.Errorf("code = %v, want %v", got, tc.want)
			}
		})
	}
}
