package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"
)

const (
	// ewmaWeight is the weight of the newest batch in a replica's throughput.
	ewmaWeight = 0.3
	// overdueSlack absorbs scheduling noise before a busy replica's batch
	// counts as overrunning (so short batches are not judged stuck by jitter).
	overdueSlack = 50 * time.Millisecond
)

// replica is one device serving one model. Its workers run up to
// maxInFlight batches at a time (one each); all other fields are guarded by
// Scheduler.mu.
type replica struct {
	replicaCore
	mq             *modelQueue
	idKey, typeKey string // pin classes it serves besides ""
	maxBatch       int
	maxCost        int // summed Request.Costs per batch; 0 = no limit
	maxInFlight    int // batches given to the executor at once (≥ 1)
	exec           Executor

	work       chan *batch // capacity maxInFlight: a batch is sent only below it
	workClosed bool

	running      []*batch // in flight, oldest first
	runningItems int      // items of the batches in flight

	throughput float64 // EWMA of items per compute second; 0 = unmeasured

	stats rowStats
	m     replicaMetrics
}

func newReplica(mq *modelQueue, dev Device, maxBatch, maxInFlight int, exec Executor, m *metrics) *replica {
	maxInFlight = max(maxInFlight, 1)
	return &replica{
		replicaCore: newReplicaCore(dev),
		mq:          mq,
		idKey:       pinKey(dev.ID, ""),
		typeKey:     pinKey("", dev.Type),
		maxBatch:    maxBatch,
		maxInFlight: maxInFlight,
		exec:        exec,
		work:        make(chan *batch, maxInFlight),
		stats:       newRowStats(),
		m:           m.forReplica(mq.label, dev.ID),
	}
}

// busy reports whether r has a batch in flight.
func (r *replica) busy() bool { return len(r.running) > 0 }

// canTake reports whether r may be given another batch: below its
// in-flight limit, and only one at a time while it is unhealthy (its probe).
func (r *replica) canTake() bool {
	if !r.healthy {
		return len(r.running) == 0
	}
	return len(r.running) < r.maxInFlight
}

// backlog is the expected seconds until r's batches in flight finish, from
// its measured throughput (0 when idle or unmeasured), and when they count
// as overrunning: twice the expected time (plus overdueSlack) after the
// oldest started.
func (r *replica) backlog(now time.Time) (secs float64, overdue time.Time) {
	if !r.busy() || r.throughput == 0 {
		return 0, time.Time{}
	}
	start := r.running[0].start
	expected := float64(r.runningItems) / r.throughput
	overdue = start.Add(time.Duration(2*expected*float64(time.Second)) + overdueSlack)
	return max(0, expected-now.Sub(start).Seconds()), overdue
}

func (r *replica) closeWork() {
	if !r.workClosed {
		r.workClosed = true
		close(r.work)
	}
}

// batch is what a worker runs. The fields below start are written under
// Scheduler.mu.
type batch struct {
	items []itemRef
	start time.Time // when it was handed to the replica

	run       []itemRef          // the items given to the executor
	cancel    context.CancelFunc // cancels the executor's context
	finished  bool               // complete has run
	abandoned bool               // it overran BatchTimeout; see abandon
}

// dispatchLocked hands batches to idle replicas of mq while there is work
// they may take, and arms a timer for the next moment that could change
// (the queue delay of a partial batch, an unhealthy replica's probe).
func (s *Scheduler) dispatchLocked(mq *modelQueue) {
	if s.closed || mq.removed {
		return
	}
	now := s.now()
	delay := s.opts.MaxQueueDelay
	expire := func(rq *request, err error) {
		s.finishLocked(rq, fmt.Errorf("scheduler: %q: dropped before it ran: %w", rq.mq.name, err), reasonOf(err))
	}
	var wake time.Time
	type cand struct {
		r      *replica
		n      int // eligible items
		oldest time.Time
		finish float64 // seconds to run a batch of min(n, maxBatch); 0 unmeasured
	}
	for {
		cands := make([]cand, 0, len(mq.replicas))
		for _, r := range mq.replicas {
			if !r.canTake() || !s.usableLocked(&r.replicaCore, now) {
				continue
			}
			n, oldest := mq.eligible(r, now, delay)
			if n == 0 {
				continue
			}
			c := cand{r: r, n: n, oldest: oldest}
			if r.throughput > 0 {
				// A pipelined replica's new batch finishes after those in
				// flight.
				behind, _ := r.backlog(now)
				c.finish = behind + float64(min(n, r.maxBatch))/r.throughput
			}
			cands = append(cands, c)
		}
		// Unmeasured replicas first (so they get measured), then the
		// earliest expected finish.
		slices.SortStableFunc(cands, func(a, b cand) int { return cmp.Compare(a.finish, b.finish) })

		progressed := false
		for _, c := range cands {
			r := c.r
			if c.n < r.maxBatch && delay > 0 && now.Sub(c.oldest) < delay {
				if due := c.oldest.Add(delay); wake.IsZero() || due.Before(wake) {
					wake = due
				}
				continue
			}
			if wait, recheck := s.fasterElsewhereLocked(mq, r, c.n, c.finish, now); wait {
				if !recheck.IsZero() && (wake.IsZero() || recheck.Before(wake)) {
					wake = recheck
				}
				continue
			}
			items := mq.take(r, r.maxBatch, expire)
			for i := 0; i < len(items); { // runs of one client's items
				j := i + 1
				for j < len(items) && items[j].rq.client == items[i].rq.client {
					j++
				}
				s.addQueuedLocked(items[i].rq.client, i-j)
				i = j
			}
			mq.setDepth(-len(items))
			// A request can expire while its own items are being taken;
			// what it already had in the batch must not run either.
			items = slices.DeleteFunc(items, func(it itemRef) bool { return it.rq.finished })
			progressed = true // the queue changed: look again
			if len(items) > 0 {
				s.startLocked(r, items, now)
			}
			break
		}
		if !progressed {
			break
		}
	}
	for _, r := range mq.replicas {
		if !r.healthy && !r.busy() && !r.removing && !s.cordoned[r.dev.ID] && now.Before(r.probeAt) {
			if n, _ := mq.eligible(r, now, delay); n > 0 && (wake.IsZero() || r.probeAt.Before(wake)) {
				wake = r.probeAt
			}
		}
	}
	s.armLocked(mq, wake, now)
}

// fasterElsewhereLocked reports whether another usable, measured replica
// that may take at least as many of the queued items would finish all n of
// them (after its running batch) sooner than r finishes one batch: then r
// leaves the work to it. Comparing r's single batch against the other's
// whole backlog rules out two replicas waiting on each other. recheck is
// when to look again should the other's running batch overrun: a replica
// running past twice its expected time (plus overdueSlack) is not waited for.
func (s *Scheduler) fasterElsewhereLocked(mq *modelQueue, r *replica, n int, mine float64, now time.Time) (wait bool, recheck time.Time) {
	if mine == 0 {
		return false, time.Time{} // r is unmeasured: it is tried first
	}
	for _, o := range mq.replicas {
		if o == r || o.throughput == 0 || !s.usableLocked(&o.replicaCore, now) {
			continue
		}
		if on, _ := mq.eligible(o, now, 0); on < n {
			continue
		}
		backlog, overdue := o.backlog(now)
		if !overdue.IsZero() && !now.Before(overdue) {
			continue
		}
		if backlog+float64(n)/o.throughput < mine {
			return true, overdue
		}
	}
	return false, time.Time{}
}

// armLocked makes sure mq is looked at again at wake.
func (s *Scheduler) armLocked(mq *modelQueue, wake, now time.Time) {
	if wake.IsZero() || (mq.timer != nil && !mq.timerAt.After(wake)) {
		return
	}
	mq.stopTimer()
	var t *time.Timer
	t = time.AfterFunc(max(wake.Sub(now), 0), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if mq.timer == t {
			mq.timer, mq.timerAt = nil, time.Time{}
		}
		s.dispatchLocked(mq)
	})
	mq.timer, mq.timerAt = t, wake
}

// startLocked hands items to one of r's workers.
func (s *Scheduler) startLocked(r *replica, items []itemRef, now time.Time) {
	b := &batch{items: items, start: now}
	r.running = append(r.running, b)
	r.runningItems += len(items)
	s.running++
	r.m.running.Inc()
	r.work <- b // never blocks: fewer than maxInFlight (its capacity) are in flight
}

// worker runs r's batches until its work channel closes. A replica has
// maxInFlight of them. Each is counted in s.workers until its batch is
// abandoned (then Close does not wait for a call that may never return).
func (s *Scheduler) worker(r *replica, done func()) {
	counted := true
	defer func() {
		if counted {
			s.workers.Done()
		}
		done()
	}()
	for b := range r.work {
		// Last look before running: an item whose call ended since the
		// batch was formed is dropped, never run; so is one whose deadline
		// comes before half the batch's expected run time (its caller
		// would be gone before the result).
		s.mu.Lock()
		thr := r.throughput
		s.mu.Unlock()
		var tooLate time.Time
		if thr > 0 {
			tooLate = time.Now().Add(time.Duration(float64(len(b.items)) / thr / 2 * float64(time.Second)))
		}
		run := make([]itemRef, 0, len(b.items))
		var dropped []itemRef
		for _, it := range b.items {
			dl := it.rq.deadline
			if it.rq.expired() != nil || (!tooLate.IsZero() && !dl.IsZero() && dl.Before(tooLate)) {
				dropped = append(dropped, it)
			} else {
				run = append(run, it)
			}
		}
		var outs []any
		var err error
		start := s.now()
		end := start
		if len(run) > 0 {
			inputs := make([]any, len(run))
			for i, it := range run {
				inputs[i] = it.rq.inputs[it.idx] // immutable after Submit
			}
			ctx, cancel := context.WithCancel(s.baseCtx)
			s.mu.Lock()
			b.run, b.cancel = run, cancel
			s.mu.Unlock()
			watchdog := time.AfterFunc(s.opts.BatchTimeout, func() { s.abandon(r, b) })
			outs, err = s.execute(ctx, r, inputs)
			watchdog.Stop()
			cancel()
			end = s.now()
		}
		if counted = s.complete(r, b, run, dropped, outs, err, start, end); !counted {
			return
		}
	}
}

// abandon gives up on a batch that overran BatchTimeout: its items are
// retried elsewhere or failed now, the replica becomes unhealthy, and the
// worker stuck in Execute stops counting for drain and Close. When the
// call returns, complete discards its outputs.
func (s *Scheduler) abandon(r *replica, b *batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.finished || b.abandoned {
		return
	}
	b.abandoned = true
	b.cancel()
	s.workers.Done()
	s.running--
	r.m.running.Dec()
	r.m.abandoned.Inc()
	now := s.now()
	err := fmt.Errorf("%w: still running after %v", ErrBatchTimeout, s.opts.BatchTimeout)
	s.log.Error("batch abandoned: the device call did not return in time; replica marked unhealthy",
		zap.String("model", r.mq.name), zap.String("device", r.dev.ID), zap.Int("items", len(b.run)),
		zap.Duration("batch_timeout", s.opts.BatchTimeout))
	// One failure in a row is enough: a hung device takes no more work.
	r.consecFails = max(r.consecFails, s.opts.UnhealthyAfter-1)
	s.failLocked(r, b.run, err, now)
	s.checkDrainedLocked()
	s.dispatchLocked(r.mq)
}

// execute calls the executor, turning a panic or a wrong output count into
// an error so one bad batch cannot take the daemon down.
func (s *Scheduler) execute(ctx context.Context, r *replica, inputs []any) (outs []any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("executor panicked: %v", p)
		}
	}()
	outs, err = r.exec.Execute(ctx, inputs)
	if err == nil && len(outs) != len(inputs) {
		err = fmt.Errorf("executor returned %d outputs for %d inputs", len(outs), len(inputs))
	}
	return outs, err
}

// complete records a finished batch: outputs to their requests on success,
// a retry elsewhere or ErrBackend on failure; then dispatches again. It
// reports whether the calling worker is still counted in s.workers (false
// only for an abandoned batch returning after Close: the worker exits).
func (s *Scheduler) complete(r *replica, b *batch, run, dropped []itemRef, outs []any, execErr error, start, end time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	mq := r.mq
	b.finished = true
	r.running = slices.DeleteFunc(r.running, func(x *batch) bool { return x == b })
	r.runningItems -= len(b.items)
	if b.abandoned {
		// Its items were answered by abandon; the late outputs are not used.
		s.log.Warn("abandoned batch returned", zap.String("model", mq.name), zap.String("device", r.dev.ID),
			zap.Duration("took", end.Sub(start)), zap.NamedError("exec_error", execErr))
		if r.removing && !r.busy() {
			r.closeWork()
		}
		if s.closed {
			return false
		}
		s.workers.Add(1) // counted again; Close has not started waiting
		s.dispatchLocked(mq)
		return true
	}
	s.running--
	r.m.running.Dec()
	for _, it := range dropped {
		if !it.rq.finished {
			err := it.rq.expired()
			if err == nil { // it would have finished after its deadline
				err = context.DeadlineExceeded
			}
			s.finishLocked(it.rq, fmt.Errorf("scheduler: %q: dropped before it ran: %w", mq.name, err), reasonOf(err))
		}
	}
	if len(run) > 0 {
		compute := end.Sub(start)
		r.m.compute.Observe(compute.Seconds())
		r.m.batch.Observe(float64(len(run)))
		for _, it := range run {
			r.m.queue.Observe(start.Sub(it.enqueued).Seconds())
			if rq := it.rq; !rq.finished && (rq.started.IsZero() || start.Before(rq.started)) {
				rq.started = start
			}
		}
		if execErr == nil {
			s.succeedLocked(r, run, outs, compute)
		} else {
			s.failLocked(r, run, execErr, end)
		}
	}
	if r.removing && !r.busy() {
		r.closeWork()
	}
	s.checkDrainedLocked()
	s.dispatchLocked(mq)
	return true
}

func (s *Scheduler) succeedLocked(r *replica, run []itemRef, outs []any, compute time.Duration) {
	mq := r.mq
	n := len(run)
	secs := compute.Seconds()
	if secs > 0 {
		rate := float64(n) / secs
		if r.throughput == 0 {
			r.throughput = rate
		} else {
			r.throughput += ewmaWeight * (rate - r.throughput)
		}
	}
	s.succeededLocked(&r.replicaCore, mq.name)
	batchCost := r.dev.CostPerHour / 3600 * secs
	now := s.now()
	r.stats.addBatch(n, compute, now)
	mq.stats.addBatch(n, compute, now)
	r.m.items.Add(float64(n))
	r.m.cost.Add(batchCost)

	// Items of one request are mostly adjacent in a batch, so shares
	// collects (request, count) runs rather than using a map.
	type share struct {
		rq *request
		k  int
	}
	var shares []share
	for i, it := range run {
		rq := it.rq
		if rq.finished {
			continue
		}
		rq.outputs[it.idx] = outs[i]
		rq.devices[it.idx] = r.dev.ID
		if j := slices.IndexFunc(shares, func(sh share) bool { return sh.rq == rq }); j >= 0 {
			shares[j].k++
		} else {
			shares = append(shares, share{rq, 1})
		}
	}
	for _, sh := range shares {
		rq := sh.rq
		rq.resolved += sh.k
		rq.addDevice(r.dev.ID, r.dev.Type, sh.k)
		rq.batchSizes = append(rq.batchSizes, n)
		rq.compute += compute
		rq.cost += batchCost * float64(sh.k) / float64(n)
		if rq.resolved == len(rq.inputs) {
			s.finishLocked(rq, nil, "")
		}
	}
}

func (s *Scheduler) failLocked(r *replica, run []itemRef, execErr error, now time.Time) {
	mq := r.mq
	r.stats.failed[ReasonBackend] += int64(len(run))
	s.failedLocked(&r.replicaCore, mq.name, execErr, now)
	for _, it := range run {
		rq := it.rq
		if rq.finished {
			continue
		}
		if !it.retried && s.alternativeLocked(mq, r, rq) {
			mq.retry = append(mq.retry, itemRef{rq: rq, idx: it.idx, enqueued: now, retried: true, exclude: r})
			rq.retryQueued++
			s.addQueuedLocked(rq.client, 1)
			mq.setDepth(1)
			continue
		}
		s.finishLocked(rq, fmt.Errorf("scheduler: %q on %s: %w: %w", mq.name, r.dev.ID, ErrBackend, execErr), ReasonBackend)
	}
}

// alternativeLocked reports whether a replica other than r could retry rq's
// items (it may be unhealthy: then its probe is the retry).
func (s *Scheduler) alternativeLocked(mq *modelQueue, r *replica, rq *request) bool {
	for _, o := range mq.replicas {
		if o != r && !o.removing && !s.cordoned[o.dev.ID] && rq.matchesReplica(o) {
			return true
		}
	}
	return false
}

// failUnservableLocked fails queued work that no replica left in mq can run.
func (s *Scheduler) failUnservableLocked(mq *modelQueue) {
	servable := func(rq *request, not *replica) bool {
		for _, o := range mq.replicas {
			if o != not && rq.matchesReplica(o) {
				return true
			}
		}
		return false
	}
	for _, rq := range mq.allRequests() {
		if rq.clientEl != nil && !servable(rq, nil) {
			s.finishLocked(rq, fmt.Errorf("scheduler: %q: %w: its replicas were removed", mq.name, ErrNoDevice), ReasonRejected)
		}
	}
	for _, it := range mq.retry {
		if !it.rq.finished && !servable(it.rq, it.exclude) {
			s.finishLocked(it.rq, fmt.Errorf("scheduler: %q: %w: no replica left to retry on", mq.name, ErrBackend), ReasonBackend)
		}
	}
	mq.compact()
}

// finishLocked ends rq with err (nil: success), releasing its queued items.
func (s *Scheduler) finishLocked(rq *request, err error, reason string) {
	if rq.finished {
		return
	}
	mq := rq.mq
	rq.finished = true
	rq.err = err
	n := mq.unlink(rq) + rq.retryQueued
	rq.retryQueued = 0 // its retry entries are skipped from now on
	s.addQueuedLocked(rq.client, -n)
	mq.setDepth(-n)
	delete(mq.active, rq)
	s.active--
	if err == nil {
		rq.info = s.execInfo(rq)
		mq.stats.addRequest(rq.info, rq.info.Total, true, s.now())
		mq.stats.lat.add(rq.info.Total)
		if r := mq.replica(rq.info.DeviceID); r != nil {
			r.stats.lat.add(rq.info.Total)
			r.m.request.Observe(rq.info.Total.Seconds())
		} else {
			mq.metrics.requestDuration(mq.label, rq.info.DeviceID).Observe(rq.info.Total.Seconds())
		}
	} else {
		now := s.now()
		mq.stats.addRequest(ExecInfo{}, now.Sub(rq.submitted), false, now)
		mq.stats.failed[reason]++
		mq.metrics.failed(mq.label, reason)
	}
	close(rq.done)
	s.checkDrainedLocked()
}

func (s *Scheduler) execInfo(rq *request) ExecInfo {
	info := ExecInfo{
		BatchSizes: rq.batchSizes,
		Queue:      rq.started.Sub(rq.submitted),
		Compute:    rq.compute,
		Total:      s.now().Sub(rq.submitted),
		CostUSD:    rq.cost,
	}
	if rq.devItems == nil { // one device at most
		if rq.dev0Items > 0 {
			info.DeviceID, info.DeviceType = rq.dev0, rq.dev0Type
		}
	} else {
		ids := make([]string, 0, len(rq.devItems))
		for id := range rq.devItems {
			ids = append(ids, id)
		}
		slices.SortFunc(ids, func(a, b string) int {
			return cmp.Or(cmp.Compare(rq.devItems[b], rq.devItems[a]), cmp.Compare(a, b))
		})
		info.DeviceID = ids[0]
		info.DeviceType = rq.devTypes[ids[0]]
		if len(ids) > 1 {
			info.DeviceIDs = ids
		}
	}
	for _, b := range rq.batchSizes {
		info.BatchSize = max(info.BatchSize, b)
	}
	return info
}
