package scheduler

import (
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// QueueStats describes one model queue (DeviceID "") or one replica of it.
//
// A generator's rows (Gen set) count sequences: Queued are those waiting
// to be admitted (preempted ones included), Running those in running sets,
// Completed those that finished (any finish reason), Batches the steps and
// MeanBatchSize the sequences per step, Latency the sequences' end-to-end
// time, RecentItemsPerSecond the sequences finished per second.
type QueueStats struct {
	// Model is the model version's name (WithName), never the queue key.
	Model      string
	DeviceID   string // "" for the model-wide row
	DeviceType string
	MaxBatch   int // the replica's batch limit (a generator's running set); 0 in the model row

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

	// Gen is set in the rows of a generator model (Generate).
	Gen *GenStats
}

// GenStats are a generator's own figures, in its model row (summed or
// over all its sequences) and in each replica's.
type GenStats struct {
	// Tokens per second over the last RateWindow: prompt tokens prefilled
	// (a preempted sequence's recomputation not counted) and tokens
	// generated.
	PromptTokensPerSecond, OutputTokensPerSecond float64
	// TimeToFirstToken over recent sequences (the last 1024): Generate
	// until the first token. InterToken over recent tokens (the last
	// 1024): the time between consecutive tokens of a sequence.
	TimeToFirstToken, InterToken LatencySummary
	// KV is the KV cache in blocks, when the executor reports it
	// (KVCacheReporter); summed over the replicas in the model row.
	KV KVCache
	// Since the queue was created.
	PromptTokens, GeneratedTokens, Preemptions int64
	// Speculative decoding (GenOptions.SpecTokens), since the queue was
	// created: tokens guessed and run after a decoding sequence's token,
	// and those the sequence sampled anyway (kept).
	DraftTokens, AcceptedTokens int64
	// DeferredSamples counts the sequences steps ran without sampling
	// them, their grammar's mask not done when the step's others were
	// (StepResult.Pending), since the queue was created.
	DeferredSamples int64
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

// Stats returns the model row and one row per replica of model (a queue
// key), or of every model when model is "", sorted by model name, then key,
// then device. Unknown models give no rows.
func (s *Scheduler) Stats(model string) []QueueStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	type queue struct {
		label, key string
		mq         *modelQueue
		gq         *genQueue
	}
	var queues []queue
	for key, mq := range s.models {
		if model == "" || key == model {
			queues = append(queues, queue{label: mq.label, key: key, mq: mq})
		}
	}
	for key, gq := range s.gens {
		if model == "" || key == model {
			queues = append(queues, queue{label: gq.label, key: key, gq: gq})
		}
	}
	slices.SortFunc(queues, func(a, b queue) int {
		if c := strings.Compare(a.label, b.label); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	var out []QueueStats
	for _, q := range queues {
		if q.mq != nil {
			out = s.batchRowsLocked(out, q.mq, now)
		} else {
			out = s.genRowsLocked(out, q.gq, now)
		}
	}
	return out
}

func (s *Scheduler) batchRowsLocked(out []QueueStats, mq *modelQueue, now time.Time) []QueueStats {
	row := QueueStats{
		Model:   mq.label,
		Queued:  int64(mq.depth),
		Healthy: true,
	}
	mq.stats.fill(&row, now)
	rows := make([]QueueStats, 0, len(mq.replicas))
	for _, r := range mq.replicas {
		n, _ := mq.eligible(r, now, 0)
		rr := QueueStats{
			Model:          mq.label,
			DeviceID:       r.dev.ID,
			DeviceType:     r.dev.Type,
			MaxBatch:       r.maxBatch,
			Queued:         int64(n),
			Running:        int64(r.runningItems),
			ItemsPerSecond: r.throughput,
			Cordoned:       s.cordoned[r.dev.ID],
		}
		r.replicaCore.fill(&rr)
		r.stats.fill(&rr, now)
		row.Running += rr.Running
		row.ItemsPerSecond += rr.ItemsPerSecond
		row.Healthy = row.Healthy && rr.Healthy
		rows = append(rows, rr)
	}
	slices.SortFunc(rows, func(a, b QueueStats) int { return strings.Compare(a.DeviceID, b.DeviceID) })
	return append(append(out, row), rows...)
}

// genRowsLocked makes a generator's rows from its queue's own counters.
func (s *Scheduler) genRowsLocked(out []QueueStats, gq *genQueue, now time.Time) []QueueStats {
	row := QueueStats{Model: gq.label, Queued: int64(gq.waiting.Len()), Healthy: true}
	gq.stats.fill(&row, now)
	rows := make([]QueueStats, 0, len(gq.replicas))
	for _, r := range gq.replicas {
		var waiting int64
		for el := gq.waiting.Front(); el != nil; el = el.Next() {
			if el.Value.(*sequence).matches(r) {
				waiting++
			}
		}
		rr := QueueStats{
			Model:      gq.label,
			DeviceID:   r.dev.ID,
			DeviceType: r.dev.Type,
			MaxBatch:   r.opts.MaxRunning,
			Queued:     waiting,
			Running:    int64(len(r.running)),
			Cordoned:   s.cordoned[r.dev.ID],
		}
		r.replicaCore.fill(&rr)
		r.stats.fill(&rr, now)
		rr.Gen.KV = r.kv
		row.Running += rr.Running
		row.Healthy = row.Healthy && rr.Healthy
		row.Gen.KV.UsedBlocks += r.kv.UsedBlocks
		row.Gen.KV.TotalBlocks += r.kv.TotalBlocks
		row.Gen.KV.PrefixHitTokens += r.kv.PrefixHitTokens
		rows = append(rows, rr)
	}
	slices.SortFunc(rows, func(a, b QueueStats) int { return strings.Compare(a.DeviceID, b.DeviceID) })
	// The model's KV cache types: its replicas', distinct, in device order.
	var types []string
	for _, rr := range rows {
		if t := rr.Gen.KV.DType; t != "" && !slices.Contains(types, t) {
			types = append(types, t)
		}
	}
	row.Gen.KV.DType = strings.Join(types, ",")
	return append(append(out, row), rows...)
}

func (h *replicaCore) fill(q *QueueStats) {
	q.Healthy, q.ConsecutiveFailures, q.LastError = h.healthy, h.consecFails, h.lastErr
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

// genRowStats are the counters behind a generator's Stats row: rowStats
// counts sequences (completed, failed, their latency) and steps (batches).
type genRowStats struct {
	rowStats
	stepSeqs                       int64 // sequences over all steps
	prompt, generated, preemptions int64
	drafted, accepted              int64 // speculative decoding's guesses: run, kept
	deferred                       int64 // samples put off (StepResult.Pending)
	ttft, itl                      latencyRing
	promptRate, outRate            rateWindow
}

func newGenRowStats() genRowStats { return genRowStats{rowStats: newRowStats()} }

// step counts a successful step of n sequences.
func (g *genRowStats) step(n int, took time.Duration) {
	g.batches++
	g.stepSeqs += int64(n)
	b := g.totals.BatchesBySize[n]
	b.Count++
	b.Compute += took
	g.totals.BatchesBySize[n] = b
}

func (g *genRowStats) promptTokens(n int, now time.Time) {
	g.prompt += int64(n)
	g.promptRate.add(n, now)
}

// token counts a generated token: the first of its sequence (d is the
// time to it) or a later one (d is the time since the last).
func (g *genRowStats) token(d time.Duration, first bool, now time.Time) {
	g.generated++
	g.outRate.add(1, now)
	if first {
		g.ttft.add(d)
	} else {
		g.itl.add(d)
	}
}

// drafts counts a sequence's guessed tokens of a step: drafted run after
// its token, accepted of them kept.
func (g *genRowStats) drafts(drafted, accepted int) {
	g.drafted += int64(drafted)
	g.accepted += int64(accepted)
}

// finished counts a sequence that ended well.
func (g *genRowStats) finished(info *GenInfo, now time.Time) {
	g.completed++
	g.recent.add(1, now)
	g.lat.add(info.Total)
	g.addRequest(ExecInfo{Queue: info.Queue, Compute: info.Compute}, info.Total, true, now)
}

func (g *genRowStats) fill(q *QueueStats, now time.Time) {
	g.rowStats.fill(q, now)
	q.MeanBatchSize = 0
	if g.batches > 0 {
		q.MeanBatchSize = float64(g.stepSeqs) / float64(g.batches)
	}
	q.Gen = &GenStats{
		PromptTokensPerSecond: g.promptRate.rate(now),
		OutputTokensPerSecond: g.outRate.rate(now),
		TimeToFirstToken:      g.ttft.summary(),
		InterToken:            g.itl.summary(),
		PromptTokens:          g.prompt,
		GeneratedTokens:       g.generated,
		Preemptions:           g.preemptions,
		DraftTokens:           g.drafted,
		AcceptedTokens:        g.accepted,
		DeferredSamples:       g.deferred,
	}
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
