package scheduler

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"
)

// replicaCore is what batch and generator replicas share: the device, the
// removal, and the health as failures mark it: UnhealthyAfter failures in
// a row make a replica unhealthy until a probe (one batch, or one sequence)
// succeeds after its ProbeInterval rest. Its fields are guarded by
// Scheduler.mu.
type replicaCore struct {
	dev      Device
	removing bool          // RemoveReplica was called: it takes no new work
	exited   chan struct{} // closed when its workers (or loop) have returned

	healthy     bool
	consecFails int
	lastErr     string
	probeAt     time.Time // when an unhealthy replica may take its probe
}

func newReplicaCore(dev Device) replicaCore {
	return replicaCore{dev: dev, exited: make(chan struct{}), healthy: true}
}

func (r *replicaCore) core() *replicaCore { return r }

// matches reports whether r serves work pinned to deviceID and devType
// ("" for either: any).
func (r *replicaCore) matches(deviceID, devType string) bool {
	return (deviceID == "" || deviceID == r.dev.ID) && (devType == "" || devType == r.dev.Type)
}

// checkPinsLocked is Submit's and Generate's check of a request's device
// pins against its model's replicas: ErrDeviceNotFound for a device no
// replica runs on, ErrNoMatchingReplica when none matches the pins,
// ErrNoDevice when every matching one is cordoned, unhealthy (and not due
// for its probe) or being removed.
func checkPinsLocked[R interface{ core() *replicaCore }](s *Scheduler, model string, replicas []R, deviceID, devType string, now time.Time) error {
	if deviceID != "" && !slices.ContainsFunc(replicas, func(r R) bool { return r.core().dev.ID == deviceID }) {
		return fmt.Errorf("scheduler: %q on %s: %w", model, deviceID, ErrDeviceNotFound)
	}
	matched := false
	for _, r := range replicas {
		if c := r.core(); c.matches(deviceID, devType) {
			if s.usableLocked(c, now) {
				return nil
			}
			matched = true
		}
	}
	if !matched {
		return fmt.Errorf("scheduler: %q: %w (device %q, type %q)", model, ErrNoMatchingReplica, deviceID, devType)
	}
	return fmt.Errorf("scheduler: %q: %w: every matching replica is cordoned or unhealthy", model, ErrNoDevice)
}

// usableLocked reports whether r may be given work now: not being removed,
// not cordoned, and healthy or due for its probe.
func (s *Scheduler) usableLocked(r *replicaCore, now time.Time) bool {
	return !r.removing && !s.cordoned[r.dev.ID] && (r.healthy || !now.Before(r.probeAt))
}

// failedLocked counts a failure of r (a replica of model) at now, and logs
// the failure that makes it unhealthy.
func (s *Scheduler) failedLocked(r *replicaCore, model string, err error, now time.Time) {
	r.consecFails++
	r.lastErr = err.Error()
	if r.consecFails < s.opts.UnhealthyAfter {
		return
	}
	if r.healthy {
		s.log.Warn("replica unhealthy", zap.String("model", model), zap.String("device", r.dev.ID),
			zap.Int("failures_in_a_row", r.consecFails), zap.Error(err))
	}
	r.healthy = false
	r.probeAt = now.Add(s.opts.ProbeInterval)
}

// succeededLocked clears r's failures, and logs its recovery.
func (s *Scheduler) succeededLocked(r *replicaCore, model string) {
	if !r.healthy {
		s.log.Info("replica healthy again", zap.String("model", model), zap.String("device", r.dev.ID))
	}
	r.healthy, r.consecFails, r.lastErr = true, 0, ""
}

// Health is the state of a device as the scheduler sees it, over all the
// replicas on it.
type Health struct {
	Known               bool // some replica runs on the device
	Healthy             bool // no replica on it is marked unhealthy
	Cordoned            bool
	ConsecutiveFailures int       // the most of any replica on it
	LastError           string    // of the replica with the most failures
	ProbeAt             time.Time // when an unhealthy replica is tried again
}

func (h *Health) add(r *replicaCore) {
	h.Known = true
	if !r.healthy {
		h.Healthy = false
		if h.ProbeAt.IsZero() || r.probeAt.Before(h.ProbeAt) {
			h.ProbeAt = r.probeAt
		}
	}
	if r.consecFails > h.ConsecutiveFailures {
		h.ConsecutiveFailures = r.consecFails
		h.LastError = r.lastErr
	}
}

// Health reports the device's state over the replicas on it, batch and
// generator alike.
func (s *Scheduler) Health(deviceID string) Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := Health{Healthy: true, Cordoned: s.cordoned[deviceID]}
	for _, mq := range s.models {
		if r := mq.replica(deviceID); r != nil {
			h.add(&r.replicaCore)
		}
	}
	for _, gq := range s.gens {
		if r := gq.replica(deviceID); r != nil {
			h.add(&r.replicaCore)
		}
	}
	return h
}

// RemoveReplica stops giving work to the replica of model on deviceID,
// batch or generator alike, waits for what it runs to finish (or ctx to
// end), and removes it. Queued work that no remaining replica can serve
// fails with ErrNoDevice.
func (s *Scheduler) RemoveReplica(ctx context.Context, model, deviceID string) error {
	s.mu.Lock()
	var r *replicaCore
	var label string
	var err error
	if gq := s.gens[model]; gq != nil {
		r, label, err = s.detachGenLocked(gq, deviceID)
	} else {
		r, label, err = s.detachLocked(model, deviceID)
	}
	if err == nil {
		s.log.Info("replica removed", zap.String("model", model), zap.String("device", deviceID))
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	select {
	case <-r.exited:
	case <-ctx.Done():
		err = fmt.Errorf("scheduler: remove replica of %q on %s: waiting for its work: %w", model, deviceID, ctx.Err())
	}
	s.forgetSeries(label, deviceID)
	return err
}
