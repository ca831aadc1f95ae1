package server

import (
	"context"
	"fmt"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/hashenc"
	"github.com/brokerd/brokerd/scheduler"
)

// encoderModel is a model the Encode RPC serves.
type encoderModel interface {
	Name() string
	Kind() string
	Version() int64
	// BaseBatch is the model's base batch; the device's batch plan scales it.
	BaseBatch() int
	// MemoryBytes is what one replica needs on a device.
	MemoryBytes() int64
	NewReplica(ctx context.Context, dev runtime.Device) (replica, error)
	// Input builds the scheduler payload of one item.
	Input(data []byte, normalize bool) any
	// Vector reads one output payload.
	Vector(out any) ([]float32, error)
}

// replica is a model on one device: a scheduler executor that can be closed.
type replica interface {
	scheduler.Executor
	Close() error
}

// hashEncoder serves the built-in nbmf-hash-v1.
type hashEncoder struct{ m *hashenc.Model }

func (hashEncoder) Name() string         { return hashenc.Name }
func (hashEncoder) Kind() string         { return "hash-encoder" }
func (hashEncoder) Version() int64       { return 1 }
func (hashEncoder) BaseBatch() int       { return 8 }
func (h hashEncoder) MemoryBytes() int64 { return h.m.MemoryBytes() }
func (h hashEncoder) NewReplica(ctx context.Context, dev runtime.Device) (replica, error) {
	return h.m.NewReplica(ctx, dev)
}

// Input does the host's share of the encoding (featurising) in the calling
// request handler, in parallel with other requests.
func (hashEncoder) Input(data []byte, normalize bool) any {
	return hashenc.Input{Data: data, Normalize: normalize}.Prepare()
}
func (hashEncoder) Vector(out any) ([]float32, error) {
	v, ok := out.([]float32)
	if !ok {
		return nil, fmt.Errorf("nbmf-hash-v1 returned %T, want []float32", out)
	}
	return v, nil
}
