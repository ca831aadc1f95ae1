package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/scheduler"
)

// Host is what placement needs of the scheduler.
type Host interface {
	AddReplica(model string, dev scheduler.Device, maxBatch int, exec scheduler.Executor, opts ...scheduler.ReplicaOption) error
	RemoveReplica(ctx context.Context, model, deviceID string) error
	AddGenReplica(model string, dev scheduler.Device, opts scheduler.GenOptions, exec scheduler.GenExecutor, ropts ...scheduler.ReplicaOption) error
}

// maxBatch is a model's batch limit in items on a device type: the plan's,
// capped by --max-batch. (Text models are bounded by tokens too: maxTokens.)
func (ms *Set) maxBatch(info models.Info, t detect.Type) (int, error) {
	plan, err := detect.PlanBatch(info.BaseBatch, t, ms.opts.Factors)
	if err != nil {
		return 0, fmt.Errorf("batch plan of %s on %s: %w", info.Name, t, err)
	}
	n := plan.Max
	if ms.opts.MaxBatch > 0 {
		n = min(n, ms.opts.MaxBatch)
	}
	return n, nil
}

// maxTokens is a text model's batch token budget (0 for other models): its
// own max_batch_tokens, else --max-batch-tokens.
func (ms *Set) maxTokens(info models.Info) int {
	if info.MaxSeqLen <= 0 {
		return 0
	}
	if info.MaxBatchTokens > 0 {
		return info.MaxBatchTokens
	}
	return ms.opts.MaxBatchTokens
}

// placementOrder is the device types a repository model may go to, most
// preferred first: the selection chain of the preference, then the rest, so
// a preference never leaves a model without a device while another could run it.
func placementOrder(p detect.Policy) []detect.Type {
	var order []detect.Type
	switch p.Prefer {
	case detect.PreferCPU:
		order = []detect.Type{detect.TypeCPU}
	case detect.PreferGPU:
		order = []detect.Type{detect.TypeGPU, detect.TypeCPU}
	}
	for _, t := range []detect.Type{detect.TypeTPU, detect.TypeGPU, detect.TypeCPU} {
		if !slices.Contains(order, t) {
			order = append(order, t)
		}
	}
	if !p.AllowTPU {
		order = slices.DeleteFunc(order, func(t detect.Type) bool { return t == detect.TypeTPU })
	}
	return order
}

// tiersLocked are the devices a repository model may be placed on, a tier
// per device type in placementOrder, less those cordoned or unhealthy now.
func (ms *Set) tiersLocked() [][]openDevice {
	current := map[string]detect.Entry{}
	if ms.opts.Entries != nil {
		for _, e := range ms.opts.Entries() {
			current[e.ID] = e
		}
	}
	var tiers [][]openDevice
	for _, t := range placementOrder(ms.opts.Select) {
		var tier []openDevice
		for _, od := range ms.devices {
			if od.entry.Type != t {
				continue
			}
			if c, ok := current[od.entry.ID]; ok && (c.Cordoned || c.Health == detect.Unhealthy) {
				continue
			}
			tier = append(tier, od)
		}
		tiers = append(tiers, tier)
	}
	return tiers
}

// placement is what placeLocked met on the devices it did not place on.
type placement struct {
	refusals []string // budgets (or device memory) too small for a replica
	failures []error  // replicas that could not start
	minNeed  int64    // the smallest need of the devices tried
}

// err says why a servable got no replica.
func (p placement) err(s *Served) error {
	switch {
	case len(p.failures) > 0:
		return fmt.Errorf("model %s version %d: %w", s.Info.Name, s.Info.Version, errors.Join(p.failures...))
	case len(p.refusals) > 0:
		return &AdmissionError{Model: s.Info.Name, Version: s.Info.Version, Need: p.minNeed, Devices: p.refusals}
	}
	return fmt.Errorf("model %s version %d: no open device can take a %s: %w", s.Info.Name, s.Info.Version, s.kind.unit(), scheduler.ErrNoDevice)
}

// start is s.kind.start with a panic (a bug, which a model file may reach)
// turned into that device's failure: the placement goes on, and a load
// that places nothing rolls back, as after any failure, instead of leaving
// what it placed, its reservations and the lifecycle's lock behind.
func (ms *Set) start(ctx context.Context, s *Served, od openDevice, maxBatch int, free int64) (r instance, bytes int64, err error) {
	defer func() {
		if p := recover(); p != nil {
			ms.log.Error("panic starting a replica", zap.String("model", s.Info.Name), zap.String("device", od.entry.ID),
				zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			r, bytes, err = nil, 0, fmt.Errorf("starting a replica panicked (a bug, logged): %v", p)
		}
	}()
	return s.kind.start(ctx, od, maxBatch, free)
}

// placeLocked gives s a replica on every device of the first tier where at
// least one device's budget admits one, and registers each with the
// scheduler; it is the one placement loop of every servable. An error is
// one that ends the placement (a batch plan, the scheduler refusing a
// replica); devices that could not take a replica are in the placement.
func (ms *Set) placeLocked(ctx context.Context, s *Served, tiers [][]openDevice) (placement, error) {
	var p placement
	for _, tier := range tiers {
		for _, od := range tier {
			e := od.entry
			maxBatch, err := ms.maxBatch(s.Info, e.Type)
			if err != nil {
				return p, err
			}
			need := s.kind.need(od, maxBatch)
			if p.minNeed == 0 || need < p.minNeed {
				p.minNeed = need
			}
			free := int64(-1)
			if e.Budget > 0 {
				if free = ms.freeLocked(od); need > free {
					p.refusals = append(p.refusals, fmt.Sprintf("%s has %d bytes free of its %d-byte budget (needs %d%s)", e.ID, free, e.Budget, need, s.kind.needs()))
					continue
				}
			}
			r, bytes, err := ms.start(ctx, s, od, maxBatch, free)
			if err != nil {
				if errors.Is(err, runtime.ErrOutOfMemory) {
					p.refusals = append(p.refusals, fmt.Sprintf("%s: %v", e.ID, err))
				} else {
					p.failures = append(p.failures, fmt.Errorf("%s on %s: %w", s.kind.unit(), e.ID, err))
				}
				continue
			}
			dev := scheduler.Device{ID: e.ID, Type: string(e.Type), CostPerHour: e.CostPerHour}
			if err := r.join(ms.sched, s.Key, dev, scheduler.WithName(s.Label)); err != nil {
				r.Close()
				return p, fmt.Errorf("%s of %s on %s: %w", s.kind.unit(), s.Key, e.ID, err)
			}
			s.replicas = append(s.replicas, placed{deviceID: e.ID, r: r, bytes: bytes, maxBatch: maxBatch})
			ms.reserved[e.ID] += bytes
			msg, fields := r.placed()
			ms.log.Info(msg, slices.Concat([]zap.Field{zap.String("model", s.Info.Name), zap.Int64("version", s.Info.Version), zap.String("device", e.ID)},
				fields, []zap.Field{zap.Int64("memory_bytes", bytes)})...)
		}
		if len(s.replicas) > 0 {
			return p, nil
		}
	}
	return p, nil
}
