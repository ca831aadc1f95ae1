package lifecycle

import (
	"context"
	"fmt"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/hashenc"
	"github.com/brokerd/brokerd/scheduler"
)

// Encoder is a built-in model the Encode RPC serves (repository models
// are models.Model).
type Encoder interface {
	Name() string
	Kind() string
	Version() int64
	// BaseBatch is the model's base batch; the device's batch plan scales it.
	BaseBatch() int
	// MemoryBytes is what one Replica needs on a device.
	MemoryBytes() int64
	NewReplica(ctx context.Context, dev runtime.Device) (Replica, error)
	// Input builds the scheduler payload of one item.
	Input(data []byte, normalize bool) any
	// Vector reads one output payload.
	Vector(out any) ([]float32, error)
}

// Replica is a model on one device: a scheduler executor that can be closed.
type Replica interface {
	scheduler.Executor
	Close() error
}

// HashEncoder serves the built-in nbmf-hash-v1.
type HashEncoder struct{ m *hashenc.Model }

// NewHashEncoder returns the built-in encoder.
func NewHashEncoder() HashEncoder { return HashEncoder{hashenc.New()} }

func (HashEncoder) Name() string         { return hashenc.Name }
func (HashEncoder) Kind() string         { return "hash-encoder" }
func (HashEncoder) Version() int64       { return 1 }
func (HashEncoder) BaseBatch() int       { return 8 }
func (h HashEncoder) MemoryBytes() int64 { return h.m.MemoryBytes() }
func (h HashEncoder) NewReplica(ctx context.Context, dev runtime.Device) (Replica, error) {
	return h.m.NewReplica(ctx, dev)
}

// Input does the host's share of the encoding (featurising) in the calling
// request handler, in parallel with other requests.
func (HashEncoder) Input(data []byte, normalize bool) any {
	return hashenc.Input{Data: data, Normalize: normalize}.Prepare()
}
func (HashEncoder) Vector(out any) ([]float32, error) {
	v, ok := out.([]float32)
	if !ok {
		return nil, fmt.Errorf("nbmf-hash-v1 returned %T, want []float32", out)
	}
	return v, nil
}
