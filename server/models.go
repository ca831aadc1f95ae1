package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/detect"
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
func (hashEncoder) Input(data []byte, normalize bool) any {
	return hashenc.Input{Data: data, Normalize: normalize}
}
func (hashEncoder) Vector(out any) ([]float32, error) {
	v, ok := out.([]float32)
	if !ok {
		return nil, fmt.Errorf("nbmf-hash-v1 returned %T, want []float32", out)
	}
	return v, nil
}

// modelSet is what brokerd serves: models, the devices they run on, and the
// replicas to close at shutdown.
type modelSet struct {
	defaultModel string
	models       map[string]encoderModel
	placements   map[string][]string // model → device IDs with a replica
	replicas     []replica
	devices      []runtime.Device
}

func (ms *modelSet) get(name string) (encoderModel, bool) {
	m, ok := ms.models[name]
	return m, ok
}

func (ms *modelSet) names() string {
	var n []string
	for k := range ms.models {
		n = append(n, k)
	}
	sort.Strings(n)
	return strings.Join(n, ", ")
}

// close frees replicas, then devices.
func (ms *modelSet) close() error {
	var errs []error
	for _, r := range ms.replicas {
		errs = append(errs, r.Close())
	}
	for _, d := range ms.devices {
		errs = append(errs, d.Close())
	}
	return errors.Join(errs...)
}

// placeOptions are the inputs of model placement.
type placeOptions struct {
	Adapters map[string]runtime.Adapter // runtime name → adapter
	Factors  detect.Factors
	// MaxBatch caps every plan's max batch when > 0 (benchmarks compare
	// batching against max_batch 1 with it).
	MaxBatch int
}

// placeModels opens every runnable device whose runtime this build has and
// gives each model a replica there when the device's budget admits it.
// Devices are opened once and shared by all models placed on them.
func placeModels(ctx context.Context, entries []detect.Entry, models []encoderModel, sched *scheduler.Scheduler, opts placeOptions, log *zap.Logger) (*modelSet, error) {
	ms := &modelSet{models: map[string]encoderModel{}, placements: map[string][]string{}}
	if len(models) > 0 {
		ms.defaultModel = models[0].Name()
	}
	for _, m := range models {
		ms.models[m.Name()] = m
	}
	for _, e := range entries {
		if !e.Runnable() || e.Health == detect.Unhealthy {
			continue
		}
		ad, ok := opts.Adapters[e.Runtime]
		if !ok {
			log.Info("device not opened: no adapter of this build", zap.String("device", e.ID), zap.String("runtime", e.Runtime))
			continue
		}
		spec := runtime.DeviceSpec{ID: e.ID, Budget: e.Budget}
		if e.CPU != nil && e.CPU.EffectiveCores > 0 {
			spec.Threads = int(math.Ceil(e.CPU.EffectiveCores))
		}
		dev, err := ad.Open(ctx, spec)
		if err != nil {
			log.Warn("device could not be opened", zap.String("device", e.ID), zap.Error(err))
			continue
		}
		ms.devices = append(ms.devices, dev)
		for _, m := range models {
			plan, err := detect.PlanBatch(m.BaseBatch(), e.Type, opts.Factors)
			if err != nil {
				return ms, fmt.Errorf("batch plan of %s on %s: %w", m.Name(), e.ID, err)
			}
			maxBatch := plan.Max
			if opts.MaxBatch > 0 && opts.MaxBatch < maxBatch {
				maxBatch = opts.MaxBatch
			}
			need := m.MemoryBytes()
			var free uint64
			if used := dev.MemoryUsed(); used < e.Budget {
				free = e.Budget - used
			}
			if e.Budget > 0 && uint64(need) > free {
				log.Warn("model not placed: device budget too small", zap.String("model", m.Name()), zap.String("device", e.ID),
					zap.Int64("need_bytes", need), zap.Uint64("free_budget_bytes", free))
				continue
			}
			r, err := m.NewReplica(ctx, dev)
			if err != nil {
				log.Warn("model replica failed", zap.String("model", m.Name()), zap.String("device", e.ID), zap.Error(err))
				continue
			}
			if err := sched.AddReplica(m.Name(), scheduler.Device{ID: e.ID, Type: string(e.Type), CostPerHour: e.CostPerHour}, maxBatch, r); err != nil {
				r.Close()
				return ms, fmt.Errorf("replica of %s on %s: %w", m.Name(), e.ID, err)
			}
			ms.replicas = append(ms.replicas, r)
			ms.placements[m.Name()] = append(ms.placements[m.Name()], e.ID)
			log.Info("model placed", zap.String("model", m.Name()), zap.String("device", e.ID), zap.Int("max_batch", maxBatch),
				zap.Int64("memory_bytes", need))
		}
	}
	return ms, nil
}
