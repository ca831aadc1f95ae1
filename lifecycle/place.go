package lifecycle

import (
	"context"
	"errors"
	"fmt"
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
	RemoveGenReplica(ctx context.Context, model, deviceID string) error
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

func (ms *Set) addReplicaLocked(s *Served, od openDevice, maxBatch int, need int64, r Replica) error {
	e := od.entry
	opts := []scheduler.ReplicaOption{scheduler.WithName(s.Label)}
	if tokens := ms.maxTokens(s.Info); tokens > 0 {
		// Items cost their tokens (Served.costs): a batch stays within the budget.
		opts = append(opts, scheduler.WithMaxBatchCost(tokens))
	}
	inFlight := 1
	if s.Builtin == nil && od.inFlight > 1 {
		// The next batch is copied in while this one runs. (The built-in
		// hash encoder's budget counts one batch, so it keeps to one.)
		inFlight = od.inFlight
		opts = append(opts, scheduler.WithMaxInFlight(inFlight))
	}
	if err := ms.sched.AddReplica(s.Key, scheduler.Device{ID: e.ID, Type: string(e.Type), CostPerHour: e.CostPerHour}, maxBatch, r, opts...); err != nil {
		r.Close()
		return fmt.Errorf("Replica of %s on %s: %w", s.Key, e.ID, err)
	}
	s.replicas = append(s.replicas, placed{deviceID: e.ID, r: r, bytes: need, maxBatch: maxBatch})
	ms.reserved[e.ID] += need
	ms.log.Info("model placed", zap.String("model", s.Info.Name), zap.Int64("version", s.Info.Version), zap.String("device", e.ID),
		zap.Int("max_batch", maxBatch), zap.Int("batches_in_flight", inFlight), zap.Int64("memory_bytes", need))
	return nil
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

// placeLocked gives s a Replica on every usable device of the most preferred
// type where at least one device's budget admits it.
func (ms *Set) placeLocked(ctx context.Context, s *Served) error {
	current := map[string]detect.Entry{}
	if ms.opts.Entries != nil {
		for _, e := range ms.opts.Entries() {
			current[e.ID] = e
		}
	}
	var (
		refusals []string
		failures []error
		minNeed  int64
	)
	for _, t := range placementOrder(ms.opts.Select) {
		for _, od := range ms.devices {
			e := od.entry
			if e.Type != t {
				continue
			}
			if c, ok := current[e.ID]; ok && (c.Cordoned || c.Health == detect.Unhealthy) {
				continue
			}
			maxBatch, err := ms.maxBatch(s.Info, t)
			if err != nil {
				return err
			}
			// Each batch in flight holds its own buffers: a pipelined
			// Replica needs about that many batches' workspace.
			need := s.Model.MemoryBytes(od.dtype, maxBatch*od.inFlight)
			if minNeed == 0 || need < minNeed {
				minNeed = need
			}
			free := ms.freeLocked(od)
			if e.Budget > 0 && need > free {
				refusals = append(refusals, fmt.Sprintf("%s has %d bytes free of its %d-byte budget (needs %d)", e.ID, free, e.Budget, need))
				continue
			}
			r, err := s.Model.NewReplica(ctx, od.dev, maxBatch)
			if err != nil {
				if errors.Is(err, runtime.ErrOutOfMemory) {
					refusals = append(refusals, fmt.Sprintf("%s: %v", e.ID, err))
				} else {
					failures = append(failures, fmt.Errorf("Replica on %s: %w", e.ID, err))
				}
				continue
			}
			if err := ms.addReplicaLocked(s, od, maxBatch, need, r); err != nil {
				return err
			}
		}
		if len(s.replicas) > 0 {
			return nil
		}
	}
	switch {
	case len(failures) > 0:
		return fmt.Errorf("model %s version %d: %w", s.Info.Name, s.Info.Version, errors.Join(failures...))
	case len(refusals) > 0:
		return &AdmissionError{Model: s.Info.Name, Version: s.Info.Version, Need: minNeed, Devices: refusals}
	}
	return fmt.Errorf("model %s version %d: no open device can take a Replica: %w", s.Info.Name, s.Info.Version, scheduler.ErrNoDevice)
}
