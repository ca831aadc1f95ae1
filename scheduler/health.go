package scheduler

import "time"

// replicaHealth is a replica's health as its failures mark it, batch and
// generator replicas alike: UnhealthyAfter failures in a row make it
// unhealthy until a probe (one batch, or one sequence) succeeds after its
// ProbeInterval rest.
type replicaHealth struct {
	healthy     bool
	consecFails int
	lastErr     string
	probeAt     time.Time // when an unhealthy replica may take its probe
}

// failed counts a failure at now; true when it made the replica unhealthy.
func (h *replicaHealth) failed(err error, now time.Time, opts Options) (turned bool) {
	h.consecFails++
	h.lastErr = err.Error()
	if h.consecFails < opts.UnhealthyAfter {
		return false
	}
	turned = h.healthy
	h.healthy = false
	h.probeAt = now.Add(opts.ProbeInterval)
	return turned
}

// succeeded clears the failures; true when the replica was unhealthy.
func (h *replicaHealth) succeeded() (recovered bool) {
	recovered = !h.healthy
	h.healthy, h.consecFails, h.lastErr = true, 0, ""
	return recovered
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

func (h *Health) add(r *replicaHealth) {
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
			h.add(&r.replicaHealth)
		}
	}
	for _, gq := range s.gens {
		if r := gq.replica(deviceID); r != nil {
			h.add(&r.replicaHealth)
		}
	}
	return h
}
