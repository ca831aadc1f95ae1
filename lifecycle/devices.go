package lifecycle

import (
	"context"
	"errors"
	"math"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
)

// openDevice is a device opened at start; models get replicas on it.
type openDevice struct {
	dev   runtime.Device
	entry detect.Entry
	dtype runtime.DType // what it computes in: the setting's, or F32 after a fallback
	// inFlight is how many batches a model Replica on it runs at once: more
	// than one where the device overlaps a batch's copy-in with another's
	// run (PJRT), one elsewhere.
	inFlight int
}

// pipelinedDevice is a runtime device that overlaps one batch's copy-in with
// another's run (runtime/pjrt's Device), matched by method so lifecycle needs
// no adapter's types.
type pipelinedDevice interface {
	MaxInFlight() int
}

func inFlightOf(dev runtime.Device) int {
	if p, ok := dev.(pipelinedDevice); ok {
		return max(p.MaxInFlight(), 1)
	}
	return 1
}

// openDevices opens every runnable device whose runtime this build has.
// Devices are opened once and shared by every model placed on them.
func openDevices(ctx context.Context, entries []detect.Entry, sched Host, repo Repository, opts Options, log *zap.Logger) *Set {
	ms := &Set{repo: repo, sched: sched, opts: opts, log: log, reserved: map[string]int64{},
		pending: map[string]string{}, lastErr: map[string]string{}, dtypes: map[string]runtime.DType{}, retiring: map[*Served]chan struct{}{}, loads: map[string]chan struct{}{}}
	ms.table.Store(&nameTable{byName: map[string]*Served{}})
	for _, e := range entries {
		if !e.Runnable() || e.Health == detect.Unhealthy {
			continue
		}
		ad, ok := opts.Adapters[e.Runtime]
		if !ok {
			log.Info("device not opened: no adapter of this build", zap.String("device", e.ID), zap.String("runtime", e.Runtime))
			continue
		}
		spec := runtime.DeviceSpec{ID: e.ID, Budget: e.Budget, DType: opts.DTypes[e.Type]}
		if spec.DType == 0 {
			spec.DType = runtime.F32
		}
		if e.CPU != nil && e.CPU.EffectiveCores > 0 {
			spec.Threads = int(math.Ceil(e.CPU.EffectiveCores))
		}
		dev, err := ad.Open(ctx, spec)
		if err != nil && spec.DType != runtime.F32 && errors.Is(err, runtime.ErrUnsupported) {
			// A setting for a whole device type may not suit every host
			// (bf16 on a CPU without the instructions): serve in f32
			// rather than not at all.
			log.Warn("device cannot compute in the configured dtype: falling back to f32", zap.String("device", e.ID),
				zap.Stringer("compute_dtype", spec.DType), zap.Error(err))
			spec.DType = runtime.F32
			dev, err = ad.Open(ctx, spec)
		}
		if err != nil {
			log.Warn("device could not be opened", zap.String("device", e.ID), zap.Error(err))
			continue
		}
		ms.devices = append(ms.devices, openDevice{dev: dev, entry: e, dtype: spec.DType, inFlight: inFlightOf(dev)})
		ms.dtypes[e.ID] = spec.DType
		log.Info("device opened", zap.String("device", e.ID), zap.String("runtime", e.Runtime), zap.Stringer("compute_dtype", spec.DType))
	}
	return ms
}

// ComputeDType is the type an open device computes in; false for a device
// that is not open.
func (ms *Set) ComputeDType(id string) (runtime.DType, bool) {
	dt, ok := ms.dtypes[id]
	return dt, ok
}

// freeLocked is the part of a device's budget no Replica holds or reserved:
// a Replica reserves its batch workspace too, which it allocates only while
// it runs.
func (ms *Set) freeLocked(od openDevice) int64 {
	used := max(int64(od.dev.MemoryUsed()), ms.reserved[od.entry.ID])
	return max(int64(od.entry.Budget)-used, 0)
}
