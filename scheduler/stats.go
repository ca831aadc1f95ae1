package scheduler

import (
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// QueueStats describes one model queue (DeviceID "") or one replica of it.
type QueueStats struct {
	Model      string
	DeviceID   string // "" for the model-wide row
	DeviceType string
	MaxBatch   int // the replica's batch limit; 0 in the model row

	// Queued: in the model row, every item in the model's queue; in a
	// replica row, the queued items that replica may take (unpinned ones
	// and those pinned to its ID or type), so rows of one model overlap.
	Queued int64
	// Running: items in batches executing now.
	Running int64
	// Completed: items executed successfully.
	Completed int64
	Batches   int64
	// Failed: in the model row, failed requests by reason (rejected,
	// cancelled, timeout, backend); in a replica row, items whose batch
	// failed on it (backend), retried elsewhere or not.
	Failed        map[string]int64
	MeanBatchSize float64
	// Latency of recent successful requests (the last 1024): all of the
	// model's in the model row, those the replica ran most of in its row.
	Latency LatencySummary
	// ItemsPerSecond: measured throughput while busy (EWMA over batches),
	// summed over replicas in the model row: what the device can do.
	ItemsPerSecond float64
	// RecentItemsPerSecond: items completed over the last RateWindow,
	// divided by it: what the device did (0 when idle).
	RecentItemsPerSecond float64

	Healthy             bool
	Cordoned            bool
	ConsecutiveFailures int
	LastError           string

	// Totals since the queue was created, in the model row (Triton's
	// model statistics are built from them): successful requests with
	// their summed end-to-end, queue and compute times; failed requests
	// with their summed time until they failed; batches by size with their
	// summed compute time; when the last request succeeded.
	Totals Totals
}

// Totals are cumulative counts and durations of a model's requests.
type Totals struct {
	Succeeded, Failed      int64
	SuccessTime, FailTime  time.Duration
	QueueTime, ComputeTime time.Duration
	BatchesBySize          map[int]BatchTotals
	LastSuccess            time.Time // zero before the first
}

// BatchTotals count the batches of one size and their compute time.
type BatchTotals struct {
	Count   int64
	Compute time.Duration
}

// LatencySummary holds request latency quantiles.
type LatencySummary struct {
	Mean, P50, P95, P99 time.Duration
	Count               int // requests in the window
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

// Stats returns the model row and one row per replica of model, or of every
// model when model is "", sorted by model then device. Unknown models give
// no rows.
func (s *Scheduler) Stats(model string) []QueueStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var names []string
	if model == "" {
		names = slices.Sorted(maps.Keys(s.models))
	} else if s.models[model] != nil {
		names = []string{model}
	}
	var out []QueueStats
	for _, name := range names {
		mq := s.models[name]
		row := QueueStats{
			Model:   name,
			Queued:  int64(mq.depth),
			Healthy: true,
		}
		mq.stats.fill(&row, now)
		rows := make([]QueueStats, 0, len(mq.replicas))
		for _, r := range mq.replicas {
			n, _ := mq.eligible(r, now, 0)
			rr := QueueStats{
				Model:               name,
				DeviceID:            r.dev.ID,
				DeviceType:          r.dev.Type,
				MaxBatch:            r.maxBatch,
				Queued:              int64(n),
				Running:             int64(r.runningItems),
				ItemsPerSecond:      r.throughput,
				Healthy:             r.healthy,
				Cordoned:            s.cordoned[r.dev.ID],
				ConsecutiveFailures: r.consecFails,
				LastError:           r.lastErr,
			}
			r.stats.fill(&rr, now)
			row.Running += rr.Running
			row.ItemsPerSecond += rr.ItemsPerSecond
			row.Healthy = row.Healthy && rr.Healthy
			rows = append(rows, rr)
		}
		slices.SortFunc(rows, func(a, b QueueStats) int { return strings.Compare(a.DeviceID, b.DeviceID) })
		out = append(out, row)
		out = append(out, rows...)
	}
	return out
}

// Health reports the device's state over the replicas on it.
func (s *Scheduler) Health(deviceID string) Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := Health{Healthy: true, Cordoned: s.cordoned[deviceID]}
	for _, mq := range s.models {
		r := mq.replica(deviceID)
		if r == nil {
			continue
		}
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
	return h
}

// rowStats are the counters behind one Stats row.
type rowStats struct {
	completed, batches int64
	failed             map[string]int64
	lat                latencyRing
	recent             rateWindow
	totals             Totals
}

func newRowStats() rowStats {
	return rowStats{failed: make(map[string]int64), totals: Totals{BatchesBySize: map[int]BatchTotals{}}}
}

func (rs *rowStats) addBatch(n int, compute time.Duration, now time.Time) {
	rs.batches++
	rs.completed += int64(n)
	rs.recent.add(n, now)
	b := rs.totals.BatchesBySize[n]
	b.Count++
	b.Compute += compute
	rs.totals.BatchesBySize[n] = b
}

// addRequest counts a finished request: err == nil for a success.
func (rs *rowStats) addRequest(info ExecInfo, took time.Duration, ok bool, now time.Time) {
	t := &rs.totals
	if !ok {
		t.Failed++
		t.FailTime += took
		return
	}
	t.Succeeded++
	t.SuccessTime += took
	t.QueueTime += info.Queue
	t.ComputeTime += info.Compute
	t.LastSuccess = now
}

func (rs *rowStats) fill(q *QueueStats, now time.Time) {
	q.RecentItemsPerSecond = rs.recent.rate(now)
	q.Completed = rs.completed
	q.Batches = rs.batches
	q.Failed = maps.Clone(rs.failed)
	if rs.batches > 0 {
		q.MeanBatchSize = float64(rs.completed) / float64(rs.batches)
	}
	q.Latency = rs.lat.summary()
	q.Totals = rs.totals
	q.Totals.BatchesBySize = maps.Clone(rs.totals.BatchesBySize)
}

// latencyRing keeps the last latencyWindow request latencies.
type latencyRing struct {
	buf  []time.Duration
	next int
}

func (l *latencyRing) add(d time.Duration) {
	if len(l.buf) < latencyWindow {
		l.buf = append(l.buf, d)
		return
	}
	l.buf[l.next] = d
	l.next = (l.next + 1) % latencyWindow
}

func (l *latencyRing) summary() LatencySummary {
	if len(l.buf) == 0 {
		return LatencySummary{}
	}
	sorted := slices.Clone(l.buf)
	slices.Sort(sorted)
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	return LatencySummary{
		Mean:  sum / time.Duration(len(sorted)),
		P50:   quantile(sorted, 0.50),
		P95:   quantile(sorted, 0.95),
		P99:   quantile(sorted, 0.99),
		Count: len(sorted),
	}
}

// quantile is the nearest-rank quantile of sorted (non-empty).
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// RateWindow is the span RecentItemsPerSecond averages over.
const RateWindow = 10 * time.Second

// rateWindow counts completed items per second over the last RateWindow,
// in one-second buckets stamped with their second.
type rateWindow struct {
	count [10]int64
	sec   [10]int64 // the Unix second each bucket counts; stale ones are ignored
}

func (w *rateWindow) add(n int, now time.Time) {
	s := now.Unix()
	i := s % int64(len(w.count))
	if w.sec[i] != s {
		w.sec[i], w.count[i] = s, 0
	}
	w.count[i] += int64(n)
}

// rate is the items per second completed over the last RateWindow, the
// current (partial) second included.
func (w *rateWindow) rate(now time.Time) float64 {
	s := now.Unix()
	var sum int64
	for i := range w.count {
		if age := s - w.sec[i]; age >= 0 && age < int64(len(w.count)) {
			sum += w.count[i]
		}
	}
	return float64(sum) / RateWindow.Seconds()
}
