package scheduler

import (
	"container/list"
	"context"
	"slices"
	"time"
)

// request is one accepted Submit. Its items are queued from next on; the
// ones before next are in batches (running, done or waiting for a retry).
type request struct {
	ctx               context.Context
	deadline          time.Time // zero when none
	mq                *modelQueue
	client            string
	priority          int
	deviceID, devType string
	inputs, outputs   []any
	devices           []string // the device that ran each input
	costs             []int    // per input; nil means 1 each
	submitted         time.Time

	next        int // first item not yet taken into a batch
	retryQueued int // items waiting in mq.retry
	resolved    int // items with an output

	// Where it sits while it has untaken items: its client's FIFO and its
	// pin class's FIFO (oldest first, for the delay).
	cq       *clientQueue
	clientEl *list.Element
	pq       *pinQueue
	pinEl    *list.Element

	// Accumulated ExecInfo, written under Scheduler.mu. The first device
	// is held inline; the maps hold every device (the first included) once
	// a second one runs items, so that a request on one device allocates
	// no maps.
	dev0       string
	dev0Type   string
	dev0Items  int
	devItems   map[string]int
	devTypes   map[string]string
	batchSizes []int
	started    time.Time // first batch start; zero before
	compute    time.Duration
	cost       float64

	finished bool
	err      error
	info     ExecInfo
	done     chan struct{}
}

// addDevice records k more of the request's items run on device id.
func (rq *request) addDevice(id, typ string, k int) {
	if rq.devItems == nil {
		if rq.dev0Items == 0 || rq.dev0 == id {
			rq.dev0, rq.dev0Type = id, typ
			rq.dev0Items += k
			return
		}
		rq.devItems = map[string]int{rq.dev0: rq.dev0Items}
		rq.devTypes = map[string]string{rq.dev0: rq.dev0Type}
	}
	rq.devItems[id] += k
	rq.devTypes[id] = typ
}

// itemCost is input i's share of a batch's cost limit.
func (rq *request) itemCost(i int) int {
	if rq.costs == nil {
		return 1
	}
	return rq.costs[i]
}

// queued reports the request's items counted in the queue.
func (rq *request) queued() int {
	n := rq.retryQueued
	if rq.clientEl != nil {
		n += len(rq.inputs) - rq.next
	}
	return n
}

// expired reports whether the call is over: its deadline passed (by the real
// clock, as the context measures it) or it was cancelled.
func (rq *request) expired() error {
	if err := rq.ctx.Err(); err != nil {
		return err
	}
	if !rq.deadline.IsZero() && !time.Now().Before(rq.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// matchesReplica reports whether r may run the request's items.
func (rq *request) matchesReplica(r *replica) bool {
	return r.matches(rq.deviceID, rq.devType)
}

// itemRef is one item in a batch or the retry queue.
type itemRef struct {
	rq       *request
	idx      int
	enqueued time.Time // when it (re)entered the queue
	retried  bool      // this is its second attempt
	exclude  *replica  // the replica it failed on
}

// clientQueue is one client's FIFO of requests inside a priority level.
type clientQueue struct {
	name string
	reqs list.List // of *request
}

// level is one priority level: its clients take turns.
type level struct {
	priority int
	clients  []*clientQueue // ring, in arrival order
	byName   map[string]*clientQueue
	cursor   int // the client that starts the next batch's round
	// passed counts the items higher levels took, one after another,
	// while this level had an item the taking replica could run (see
	// lowerLevelShare). It goes back to 0 when the level takes one.
	passed int
}

// lowerLevelShare bounds how long a flood at a higher priority holds a
// lower level back. A level with work the picking replica can run that
// higher levels passed over for lowerLevelShare-1 picks in a row takes the
// next pick (the highest such level first: a level waits at most
// lowerLevelShare-1 picks, plus one for each level above it owed one too).
// Anyone may ask for the highest priority, and strict levels let one
// flooding client starve every client below it. 1 in 8 keeps priority
// meaningful (a saturated higher level keeps 7 picks in 8, its latency
// grows by 8/7 at most) while a lower level's wait is a count of picks,
// not the flood's length. Counted, not timed: aging by age would tie the
// share to device speed, and tests to the clock. A pick is an item taken
// into a batch; for generation (generate.go), a sequence admitted to a
// running set, and a step's prompt chunks.
const lowerLevelShare = 8

// owedPick reports whether a level passed over passed picks in a row
// takes the next one.
func owedPick(passed int) bool { return passed >= lowerLevelShare-1 }

// pinQueue counts the queued items of one pin class ("" unpinned, a device
// ID, or a device type) and keeps its requests oldest first.
type pinQueue struct {
	items int
	reqs  list.List // of *request
}

// modelQueue is the queue of one model and the group of replicas serving it.
type modelQueue struct {
	name     string // the queue's key
	label    string // its name in Stats and the metrics (WithName)
	replicas []*replica
	levels   []*level // priority descending
	pins     map[string]*pinQueue
	retry    []itemRef
	active   map[*request]struct{}
	depth    int // items queued (normal and retry)
	removed  bool

	timer   *time.Timer
	timerAt time.Time

	stats   rowStats // model-wide row of Stats
	metrics *metrics
}

func newModelQueue(name, label string, m *metrics) *modelQueue {
	return &modelQueue{
		name:    name,
		label:   label,
		pins:    make(map[string]*pinQueue),
		active:  make(map[*request]struct{}),
		stats:   newRowStats(),
		metrics: m,
	}
}

func (mq *modelQueue) replica(deviceID string) *replica {
	for _, r := range mq.replicas {
		if r.dev.ID == deviceID {
			return r
		}
	}
	return nil
}

func (mq *modelQueue) dropReplica(r *replica) {
	mq.replicas = slices.DeleteFunc(mq.replicas, func(x *replica) bool { return x == r })
}

func (mq *modelQueue) reject(reason string) {
	mq.stats.totals.Failed++ // refused at once: no time spent
	mq.stats.failed[reason]++
	mq.metrics.failed(mq.label, reason)
}

// setDepth moves the queued items; brokerd_queue_depth_items reads them at
// scrape time.
func (mq *modelQueue) setDepth(delta int) {
	mq.depth += delta
}

func (mq *modelQueue) stopTimer() {
	if mq.timer != nil {
		mq.timer.Stop()
		mq.timer = nil
		mq.timerAt = time.Time{}
	}
}

// pinKey is the pin class of a request. A request pinned to an ID was
// checked at Submit to match that replica's type, so the ID decides.
func pinKey(deviceID, devType string) string {
	switch {
	case deviceID != "":
		return "id:" + deviceID
	case devType != "":
		return "type:" + devType
	}
	return ""
}

// push queues all of rq's items.
func (mq *modelQueue) push(rq *request) {
	var lv *level
	i, found := slices.BinarySearchFunc(mq.levels, rq.priority, func(l *level, p int) int { return p - l.priority })
	if found {
		lv = mq.levels[i]
	} else {
		lv = &level{priority: rq.priority, byName: make(map[string]*clientQueue)}
		mq.levels = slices.Insert(mq.levels, i, lv)
	}
	cq := lv.byName[rq.client]
	if cq == nil {
		cq = &clientQueue{name: rq.client}
		lv.byName[rq.client] = cq
		lv.clients = append(lv.clients, cq)
	}
	rq.cq = cq
	rq.clientEl = cq.reqs.PushBack(rq)

	key := pinKey(rq.deviceID, rq.devType)
	pq := mq.pins[key]
	if pq == nil {
		pq = &pinQueue{}
		mq.pins[key] = pq
	}
	pq.items += len(rq.inputs)
	rq.pq = pq
	rq.pinEl = pq.reqs.PushBack(rq)
	mq.active[rq] = struct{}{}
}

// unlink takes rq's untaken items out of the client and pin queues and
// returns how many there were.
func (mq *modelQueue) unlink(rq *request) int {
	if rq.clientEl == nil {
		return 0
	}
	n := len(rq.inputs) - rq.next
	rq.cq.reqs.Remove(rq.clientEl)
	rq.clientEl = nil
	rq.pq.items -= n
	rq.pq.reqs.Remove(rq.pinEl)
	rq.pinEl = nil
	return n
}

// compact drops clients and levels left empty. It runs after the queues
// changed and never during a round, so ring positions stay valid in a round.
func (mq *modelQueue) compact() {
	mq.levels = slices.DeleteFunc(mq.levels, func(lv *level) bool {
		kept := lv.clients[:0]
		for i, cq := range lv.clients {
			if cq.reqs.Len() > 0 {
				kept = append(kept, cq)
				continue
			}
			delete(lv.byName, cq.name)
			if i < lv.cursor {
				lv.cursor--
			}
		}
		clear(lv.clients[len(kept):])
		lv.clients = kept
		if lv.cursor >= len(lv.clients) {
			lv.cursor = 0
		}
		return len(lv.clients) == 0
	})
	for k, pq := range mq.pins {
		if pq.reqs.Len() == 0 {
			delete(mq.pins, k)
		}
	}
}

// allRequests returns every active request of the model.
func (mq *modelQueue) allRequests() []*request {
	out := make([]*request, 0, len(mq.active))
	for rq := range mq.active {
		out = append(out, rq)
	}
	return out
}

// eligible counts the queued items r may take, and the enqueue time of the
// oldest of them (retried items count as due at once).
func (mq *modelQueue) eligible(r *replica, now time.Time, delay time.Duration) (n int, oldest time.Time) {
	for _, key := range [...]string{"", r.idKey, r.typeKey} {
		pq := mq.pins[key]
		if pq == nil || pq.items == 0 {
			continue
		}
		n += pq.items
		if front := pq.reqs.Front(); front != nil {
			if t := front.Value.(*request).submitted; oldest.IsZero() || t.Before(oldest) {
				oldest = t
			}
		}
	}
	for i := range mq.retry {
		it := &mq.retry[i]
		if it.rq.finished || it.exclude == r || !it.rq.matchesReplica(r) {
			continue
		}
		n++
		if due := now.Add(-delay); oldest.IsZero() || due.Before(oldest) {
			oldest = due
		}
	}
	return n, oldest
}

// take fills a batch of up to capacity items for r: retried items first,
// then item by item, the highest priority level with an item r may run
// (unless a lower one is owed a pick: lowerLevelShare), clients of a level
// taking one item each in turn. Requests found expired are finished (never
// run) via expire. The queue counters are updated by the caller from
// len(batch).
func (mq *modelQueue) take(r *replica, capacity int, expire func(*request, error)) []itemRef {
	batch := make([]itemRef, 0, capacity)
	// full stops filling when the batch has capacity items, or when the
	// next item would take it past the replica's cost limit (the first item
	// always goes, however costly, so nothing waits forever).
	cost := 0
	full := func(next int) bool {
		if len(batch) == capacity {
			return true
		}
		return r.maxCost > 0 && len(batch) > 0 && cost+next > r.maxCost
	}

	kept := mq.retry[:0]
	for _, it := range mq.retry {
		switch {
		case it.rq.finished:
			continue // its count left the queue when it finished
		case full(it.rq.itemCost(it.idx)) || it.exclude == r || !it.rq.matchesReplica(r):
			kept = append(kept, it)
			continue
		}
		if err := it.rq.expired(); err != nil {
			expire(it.rq, err)
			continue
		}
		it.rq.retryQueued--
		cost += it.rq.itemCost(it.idx)
		batch = append(batch, it)
	}
	clear(mq.retry[len(kept):])
	mq.retry = kept

	rounds := make([]levelRound, len(mq.levels))
	for i, lv := range mq.levels {
		rounds[i] = newLevelRound(lv)
	}
	for len(batch) < capacity {
		// The highest level with an item for r, unless a lower one with
		// an item is owed a pick.
		k, rq := -1, (*request)(nil)
		for j := range rounds {
			next := rounds[j].peek(r, expire)
			if next == nil {
				continue
			}
			if k < 0 {
				k, rq = j, next
			} else if owedPick(rounds[j].lv.passed) {
				k, rq = j, next
				break
			}
		}
		if k < 0 {
			break
		}
		// rq is the request at the chosen turn. (Peeking again could
		// find it expired meanwhile, by the clock, and the turn gone.)
		lr := &rounds[k]
		t := &lr.turns[lr.i]
		c := rq.itemCost(rq.next)
		if full(c) {
			// Over the cost limit: the batch leaves as it is, and this
			// client's turn comes first next time.
			lr.lv.cursor = slices.Index(lr.lv.clients, t.cq)
			lr.last = nil
			break
		}
		cost += c
		batch = append(batch, itemRef{rq: rq, idx: rq.next, enqueued: rq.submitted})
		rq.pq.items--
		rq.next++
		if rq.next == len(rq.inputs) {
			t.el = rq.clientEl.Next()
			mq.unlink(rq)
		}
		lr.last = t.cq
		lr.i++
		lr.lv.passed = 0
		for j := k + 1; j < len(rounds); j++ {
			if rounds[j].peek(r, expire) != nil {
				rounds[j].lv.passed++
			}
		}
	}
	for _, lr := range rounds {
		if lr.last != nil {
			// The next round starts after the last client served, so
			// leftover turns rotate between batches.
			lr.lv.cursor = (slices.Index(lr.lv.clients, lr.last) + 1) % len(lr.lv.clients)
		}
	}
	mq.compact()
	return batch
}

// levelRound is one level's turns while take fills a batch: its clients
// from the cursor on, one item each in turn.
type levelRound struct {
	lv    *level
	turns []turn
	i     int          // the turn that takes next
	last  *clientQueue // the last client served
}

type turn struct {
	cq *clientQueue
	el *list.Element // the next request of cq to look at
}

func newLevelRound(lv *level) levelRound {
	lr := levelRound{lv: lv, turns: make([]turn, 0, len(lv.clients))}
	for i := range lv.clients {
		cq := lv.clients[(lv.cursor+i)%len(lv.clients)]
		lr.turns = append(lr.turns, turn{cq: cq, el: cq.reqs.Front()})
	}
	return lr
}

// peek returns the request whose item the level's next turn takes, or nil
// when no client of the level has one r may run; turns without one are
// dropped, and the request found is remembered, so peeking again is O(1).
func (lr *levelRound) peek(r *replica, expire func(*request, error)) *request {
	for len(lr.turns) > 0 {
		if lr.i >= len(lr.turns) {
			lr.i = 0 // the next round of the level's clients
		}
		t := &lr.turns[lr.i]
		if rq := nextEligible(t.el, r, expire); rq != nil {
			t.el = rq.clientEl
			return rq
		}
		lr.turns = slices.Delete(lr.turns, lr.i, lr.i+1)
	}
	return nil
}

// nextEligible returns the first request from el on that r may run, finishing
// expired ones on the way.
func nextEligible(el *list.Element, r *replica, expire func(*request, error)) *request {
	for el != nil {
		rq := el.Value.(*request)
		next := el.Next()
		if rq.matchesReplica(r) {
			if err := rq.expired(); err != nil {
				expire(rq, err)
			} else {
				return rq
			}
		}
		el = next
	}
	return nil
}
