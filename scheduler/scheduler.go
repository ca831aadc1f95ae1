// Package scheduler queues items per (model, device group), coalesces them
// into batches, and dispatches the batches to model replicas running on
// devices: priority levels (a flood at a higher one cannot starve a lower
// one), round-robin fairness between clients, deadlines, back-pressure,
// failover with health tracking, cordon and drain.
//
// It knows nothing of gRPC or cgo: requests are opaque inputs, replicas are
// Executors, and every failure is a %w-wrapped sentinel error that the server
// maps to a status code.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Sentinel errors. Every error returned by the Scheduler wraps one of these,
// or context.Canceled / context.DeadlineExceeded.
var (
	// ErrQueueFull: the bounded queue has no room; the error is a
	// *QueueFullError carrying a retry hint.
	ErrQueueFull = errors.New("queue full")
	// ErrDraining: the scheduler is draining or closed and accepts no work.
	ErrDraining = errors.New("draining")
	// ErrUnknownModel: no replica serves the model.
	ErrUnknownModel = errors.New("unknown model")
	// ErrNoDevice: no replica can take the request now (all cordoned or
	// unhealthy, or the device pins match no replica).
	ErrNoDevice = errors.New("no device can serve the request")
	// ErrNoMatchingReplica: the device pins (type, or ID and type) match no
	// replica of the model at all, e.g. a device type the host lacks: unlike
	// cordoned or unhealthy replicas, waiting does not help, so the edge
	// answers FAILED_PRECONDITION rather than UNAVAILABLE. It matches
	// ErrNoDevice too.
	ErrNoMatchingReplica = fmt.Errorf("%w: no replica matches the device pins", ErrNoDevice)
	// ErrDeviceNotFound: the pinned device ID serves no replica of the model.
	ErrDeviceNotFound = errors.New("device not found")
	// ErrBackend: the executor failed, and the retry on another replica (when
	// there was one) failed too.
	ErrBackend = errors.New("backend failure")
	// ErrInvalidArgument: a malformed replica or request (a bug in the caller).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrBatchTimeout: a batch ran longer than Options.BatchTimeout. It is
	// wrapped together with ErrBackend.
	ErrBatchTimeout = errors.New("batch timed out")
)

// QueueFullError is returned when a Submit would overflow the queue. It
// matches ErrQueueFull with errors.Is.
type QueueFullError struct {
	// RetryAfter estimates when enough room frees up, from the current
	// drain rate of the replicas.
	RetryAfter time.Duration
	Queued     int // items queued when the request was refused
	Requested  int // items in the refused request
	Limit      int // Options.MaxQueueItems, or a client's share of it
	// Client, when set, is the client whose share of the queue is full
	// (Queued and Limit are its): the queue itself has room for others.
	Client string
}

func (e *QueueFullError) Error() string {
	if e.Client != "" {
		return fmt.Sprintf("%v: client %q has %d items queued, %d requested, limit %d per client (half the queue); retry after %v",
			ErrQueueFull, e.Client, e.Queued, e.Requested, e.Limit, e.RetryAfter)
	}
	return fmt.Sprintf("%v: %d items queued, %d requested, limit %d; retry after %v",
		ErrQueueFull, e.Queued, e.Requested, e.Limit, e.RetryAfter)
}

// Is makes errors.Is(err, ErrQueueFull) true.
func (e *QueueFullError) Is(target error) bool { return target == ErrQueueFull }

// Failure reasons, as used in Stats and the failures metric.
const (
	ReasonRejected  = "rejected"  // refused at Submit: queue full, draining, no device
	ReasonCancelled = "cancelled" // the caller cancelled
	ReasonTimeout   = "timeout"   // the deadline passed
	ReasonBackend   = "backend"   // the executor failed
)

// Executor runs one batch of opaque inputs on one device. Model replicas over
// a runtime device implement it. It must return one output per input, in
// order. It is never called concurrently for one replica, unless the
// replica was added WithMaxInFlight(k > 1): then up to k calls overlap.
type Executor interface {
	Execute(ctx context.Context, inputs []any) ([]any, error)
}

// Device describes the device a replica runs on.
type Device struct {
	ID          string  // stable ID, e.g. "cpu:0", "gpu:1"
	Type        string  // "cpu", "gpu", "tpu"
	CostPerHour float64 // USD per hour, for ExecInfo.CostUSD
}

// Options configure a Scheduler. The zero value is usable.
type Options struct {
	// MaxQueueItems bounds the items queued over all models (default 65536).
	MaxQueueItems int
	// MaxQueueDelay is how long the oldest queued item may wait for a batch
	// to fill once a replica is free (default 0: leave at once).
	MaxQueueDelay time.Duration
	// Registerer receives the brokerd_ metrics when non-nil.
	Registerer prometheus.Registerer
	// Logger defaults to a no-op logger.
	Logger *zap.Logger
	// Now is the clock for measured durations (queue, compute, total) and the
	// queue delay; it defaults to time.Now. Deadlines always use the real
	// clock, as contexts do.
	Now func() time.Time
	// UnhealthyAfter failures in a row mark a replica unhealthy (default 3).
	UnhealthyAfter int
	// ProbeInterval is how long an unhealthy replica rests before it is given
	// one real batch as a probe (default 5s).
	ProbeInterval time.Duration
	// BatchTimeout bounds one Execute call (default 2m). A batch still
	// running after it is abandoned: its executor's context is cancelled,
	// its items are retried on another replica or fail with ErrBackend, and
	// the replica is unhealthy and gets no work until the call returns (its
	// late outputs are discarded). A stuck device call cannot be
	// interrupted from Go, so this is what keeps callers without a deadline,
	// and drain, from waiting for ever.
	BatchTimeout time.Duration
}

// Defaults of Options.
const (
	DefaultMaxQueueItems  = 65536
	DefaultUnhealthyAfter = 3
	DefaultProbeInterval  = 5 * time.Second
	DefaultBatchTimeout   = 2 * time.Minute
	// latencyWindow is how many recent requests the latency quantiles of
	// Stats cover, per model and per replica.
	latencyWindow = 1024
)

// Request is one call's work: items for one model.
type Request struct {
	Model  string
	Client string // peer identity; fairness is round-robin between clients
	// Priority: higher runs first (e.g. 1 low, 2 normal, 3 high), except
	// that a lower level with items waiting takes one item in 8 while
	// higher levels take the rest (lowerLevelShare); inside one level
	// clients take turns.
	Priority int
	// Optional pins: only replicas on this device ID and/or type run it.
	DeviceID, DeviceType string
	Inputs               []any
	// Costs, when set, is each input's share of a replica's batch cost
	// limit (tokens for text models; see WithMaxBatchCost). Nil means 1 each.
	Costs []int
}

// ReplicaOption configures a replica.
type ReplicaOption func(*replicaOptions)

type replicaOptions struct {
	maxCost, maxInFlight int
	name                 string
}

// WithName is the name Stats rows and the metrics' model label give the
// replica's model (default: the model key AddReplica and AddGenReplica
// take): the model version's name, one per version. Queues of one version
// (a hot reload queues the new instance under a key of its own while
// requests move over) share it, and their series; the replicas of one
// key must agree on it.
func WithName(name string) ReplicaOption {
	return func(o *replicaOptions) { o.name = name }
}

// label is the name o gives model's queue.
func (o replicaOptions) label(model string) string {
	if o.name != "" {
		return o.name
	}
	return model
}

// WithMaxBatchCost bounds the summed Request.Costs of one batch (e.g. a
// model's max_batch_tokens) besides its item count. An item costlier than
// the limit still runs, alone.
func WithMaxBatchCost(n int) ReplicaOption {
	return func(o *replicaOptions) { o.maxCost = n }
}

// WithMaxInFlight lets up to k batches run on the replica at once (default
// 1), for devices that overlap one batch's copy-in with another's run
// (runtime/pjrt): the next batch is formed and handed over while the
// current one runs, so its inputs are on the device when the device frees.
// The executor must then be safe for k concurrent calls. An unhealthy
// replica still gets one batch at a time, its probe.
func WithMaxInFlight(k int) ReplicaOption {
	return func(o *replicaOptions) { o.maxInFlight = k }
}

// Response is the outputs of a request, in input order, and how they ran.
type Response struct {
	Outputs []any
	// Devices is the ID of the device that ran each input, in input order.
	Devices []string
	Info    ExecInfo
}

// ExecInfo says where a request's items ran, how long they waited and what
// they cost.
type ExecInfo struct {
	// DeviceID and DeviceType of the replica that ran most of the items.
	DeviceID, DeviceType string
	// DeviceIDs lists every device that ran some of the items (most items
	// first), only when there is more than one.
	DeviceIDs []string
	// BatchSize is the largest batch any item ran in; BatchSizes lists the
	// size of every batch the request's items ran in, in completion order.
	BatchSize  int
	BatchSizes []int
	// Queue: Submit until the first batch with one of its items started.
	// Compute: the sum of the compute time of its batches.
	// Total: Submit until the last item was done.
	Queue, Compute, Total time.Duration
	// CostUSD sums, over its batches, perHour/3600 × batch compute seconds ×
	// its items in the batch / batch size.
	CostUSD float64
}

// Scheduler queues, batches and dispatches work. It is safe for concurrent use.
type Scheduler struct {
	opts    Options
	log     *zap.Logger
	now     func() time.Time
	metrics *metrics

	baseCtx context.Context // handed to executors; cancelled by Close
	cancel  context.CancelFunc
	workers sync.WaitGroup

	// mu guards everything below and all queue and replica state. One lock
	// keeps the queue bound, which spans models, simple and exact; critical
	// sections are short (no executor call runs under it).
	mu       sync.Mutex
	models   map[string]*modelQueue
	gens     map[string]*genQueue // generator models (generate.go)
	nextSeq  uint64               // the last sequence ID given out
	cordoned map[string]bool      // by device ID; survives replicas coming and going
	queued   int                  // items queued over all models
	active   int                  // accepted requests not yet finished
	running  int                  // batches executing now
	draining bool
	closed   bool
	drained  chan struct{} // closed when draining and idle

	// clientQueued counts the queued items of each client over all models,
	// batch items and waiting generation sequences alike (queued is their
	// sum): one client holds at most half the queue (clientShareLocked).
	clientQueued map[string]int
}

// New returns a Scheduler with no replicas.
func New(opts Options) *Scheduler {
	if opts.MaxQueueItems <= 0 {
		opts.MaxQueueItems = DefaultMaxQueueItems
	}
	if opts.MaxQueueDelay < 0 {
		opts.MaxQueueDelay = 0
	}
	if opts.UnhealthyAfter <= 0 {
		opts.UnhealthyAfter = DefaultUnhealthyAfter
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = DefaultProbeInterval
	}
	if opts.BatchTimeout <= 0 {
		opts.BatchTimeout = DefaultBatchTimeout
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Scheduler{
		opts:         opts,
		log:          opts.Logger.Named("scheduler"),
		now:          opts.Now,
		metrics:      newMetrics(opts.Registerer, opts.Logger),
		baseCtx:      ctx,
		cancel:       cancel,
		models:       make(map[string]*modelQueue),
		gens:         make(map[string]*genQueue),
		clientQueued: make(map[string]int),
		cordoned:     make(map[string]bool),
	}
	s.metrics.state.add(s)
	return s
}

// AddReplica makes dev serve model with batches of up to maxBatch items (from
// the device type's batch plan). exec runs the batches, one at a time.
func (s *Scheduler) AddReplica(model string, dev Device, maxBatch int, exec Executor, opts ...ReplicaOption) error {
	var ro replicaOptions
	for _, o := range opts {
		o(&ro)
	}
	switch {
	case model == "":
		return fmt.Errorf("scheduler: add replica: %w: empty model name", ErrInvalidArgument)
	case dev.ID == "":
		return fmt.Errorf("scheduler: add replica of %q: %w: empty device ID", model, ErrInvalidArgument)
	case maxBatch < 1:
		return fmt.Errorf("scheduler: add replica of %q on %s: %w: max batch %d < 1", model, dev.ID, ErrInvalidArgument, maxBatch)
	case exec == nil:
		return fmt.Errorf("scheduler: add replica of %q on %s: %w: nil executor", model, dev.ID, ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("scheduler: add replica of %q on %s: %w: closed", model, dev.ID, ErrDraining)
	}
	if s.gens[model] != nil {
		return fmt.Errorf("scheduler: add replica of %q: %w: it is a generator", model, ErrWrongKind)
	}
	mq := s.models[model]
	if mq == nil {
		mq = newModelQueue(model, ro.label(model), s.metrics)
		s.models[model] = mq
	}
	if mq.label != ro.label(model) {
		return fmt.Errorf("scheduler: add replica of %q on %s: %w: named %q, its other replicas %q", model, dev.ID, ErrInvalidArgument, ro.label(model), mq.label)
	}
	if mq.replica(dev.ID) != nil {
		return fmt.Errorf("scheduler: add replica of %q on %s: %w: already served", model, dev.ID, ErrInvalidArgument)
	}
	r := newReplica(mq, dev, maxBatch, ro.maxInFlight, exec, s.metrics)
	r.maxCost = ro.maxCost
	mq.replicas = append(mq.replicas, r)
	var wg sync.WaitGroup
	s.workers.Add(r.maxInFlight)
	for range r.maxInFlight {
		wg.Add(1)
		go s.worker(r, wg.Done)
	}
	go func() { wg.Wait(); close(r.exited) }()
	s.log.Info("replica added", zap.String("model", model), zap.String("device", dev.ID),
		zap.String("type", dev.Type), zap.Int("max_batch", maxBatch))
	s.dispatchLocked(mq)
	return nil
}

// detachLocked is RemoveReplica's part for a batch model: r takes no new
// batch, closes its work once its running ones finish, and leaves its
// queue (and the queue the scheduler, with its last replica).
func (s *Scheduler) detachLocked(model, deviceID string) (*replicaCore, string, error) {
	mq := s.models[model]
	if mq == nil {
		return nil, "", fmt.Errorf("scheduler: remove replica of %q: %w", model, ErrUnknownModel)
	}
	r := mq.replica(deviceID)
	if r == nil {
		return nil, "", fmt.Errorf("scheduler: remove replica of %q on %s: %w", model, deviceID, ErrDeviceNotFound)
	}
	r.removing = true
	mq.dropReplica(r)
	if !r.busy() {
		r.closeWork()
	}
	if len(mq.replicas) == 0 {
		// The model is gone: its queue goes with it.
		delete(s.models, model)
		mq.removed = true
		mq.stopTimer()
	}
	s.failUnservableLocked(mq)
	s.dispatchLocked(mq)
	return &r.replicaCore, mq.label, nil
}

// forgetSeries removes the metric series of a removed replica, and its
// model's once no queue of that name is left: series left behind would
// show a model that is gone, with its last values, for as long as brokerd
// runs. A replica of the same name on the device (another instance of the
// version, or one added again meanwhile) keeps them. The gauges of state
// (queue depth, running and waiting sequences, KV cache) are read at
// scrape time and need no forgetting.
func (s *Scheduler) forgetSeries(label, deviceID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	named := false
	for _, mq := range s.models {
		if mq.label == label {
			named = true
			if mq.replica(deviceID) != nil {
				return
			}
		}
	}
	for _, gq := range s.gens {
		if gq.label == label {
			named = true
			if gq.replica(deviceID) != nil {
				return
			}
		}
	}
	s.metrics.forgetReplica(label, deviceID)
	if !named {
		s.metrics.forgetModel(label)
	}
}

// Cordon stops (on) or resumes (off) new batches on every replica of the
// device. Queued work goes to other replicas or waits for the uncordon.
func (s *Scheduler) Cordon(deviceID string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.cordoned[deviceID] = true
	} else {
		delete(s.cordoned, deviceID)
	}
	// The inventory logs the state change and the authorizer the admin
	// call; one more line here would say it a third time.
	s.log.Debug("cordon", zap.String("device", deviceID), zap.Bool("on", on))
	for _, mq := range s.models {
		s.dispatchLocked(mq)
	}
	for _, gq := range s.gens {
		for _, r := range gq.replicas {
			r.wake()
		}
	}
}

// Submit queues the request's items, waits until all of them ran, and returns
// their outputs in input order. It fails fast (nothing queued) with
// ErrDraining, ErrUnknownModel, ErrDeviceNotFound, ErrNoDevice or a
// *QueueFullError (the queue is full, or the client's share of it: half,
// its waiting generation sequences included); later with ErrBackend, or the context's error when the
// deadline passes or the call is cancelled (its queued items leave the queue
// at once; an item never runs after its deadline).
func (s *Scheduler) Submit(ctx context.Context, req Request) (Response, error) {
	if len(req.Inputs) == 0 {
		return Response{Outputs: []any{}}, nil
	}
	if req.Costs != nil && len(req.Costs) != len(req.Inputs) {
		return Response{}, fmt.Errorf("scheduler: %w: %d costs for %d inputs", ErrInvalidArgument, len(req.Costs), len(req.Inputs))
	}
	s.mu.Lock()
	rq, err := s.enqueueLocked(ctx, req)
	s.mu.Unlock()
	if err != nil {
		return Response{}, err
	}

	select {
	case <-rq.done:
	case <-ctx.Done():
		s.mu.Lock()
		if !rq.finished {
			s.finishLocked(rq, fmt.Errorf("scheduler: %q: %w", req.Model, ctx.Err()), reasonOf(ctx.Err()))
			rq.mq.compact()
		}
		s.mu.Unlock()
	}
	// finished and done are set under mu before done is closed; the fields
	// read below are not written after that.
	<-rq.done
	if rq.err != nil {
		return Response{}, rq.err
	}
	if err := ctx.Err(); err != nil {
		// Done, but the caller is gone: spare it the work on the outputs.
		return Response{}, fmt.Errorf("scheduler: %q: %w", req.Model, err)
	}
	return Response{Outputs: rq.outputs, Devices: rq.devices, Info: rq.info}, nil
}

// enqueueLocked validates req against the current replicas and the queue
// bound and queues its items; nothing is queued when it fails.
func (s *Scheduler) enqueueLocked(ctx context.Context, req Request) (*request, error) {
	mq := s.models[req.Model]
	if s.draining || s.closed {
		if mq != nil { // an unknown name is not counted: see below
			mq.reject(ReasonRejected)
		}
		return nil, fmt.Errorf("scheduler: %q: %w", req.Model, ErrDraining)
	}
	if mq == nil && s.gens[req.Model] != nil {
		return nil, fmt.Errorf("scheduler: %q: %w: it is a generator", req.Model, ErrWrongKind)
	}
	if mq == nil {
		// Not counted in the metrics: arbitrary names would make label
		// cardinality unbounded.
		return nil, fmt.Errorf("scheduler: %q: %w", req.Model, ErrUnknownModel)
	}
	if err := ctx.Err(); err != nil {
		mq.reject(reasonOf(err))
		return nil, fmt.Errorf("scheduler: %q: before queueing: %w", req.Model, err)
	}
	now := s.now()
	if err := checkPinsLocked(s, req.Model, mq.replicas, req.DeviceID, req.DeviceType, now); err != nil {
		mq.reject(ReasonRejected)
		return nil, err
	}
	n := len(req.Inputs)
	if n > s.opts.MaxQueueItems {
		// Waiting would never help: no amount of draining makes room.
		mq.reject(ReasonRejected)
		return nil, fmt.Errorf("scheduler: %q: %w: %d items is more than the whole queue holds (%d); split the request",
			req.Model, ErrInvalidArgument, n, s.opts.MaxQueueItems)
	}
	if s.queued+n > s.opts.MaxQueueItems {
		mq.reject(ReasonRejected)
		return nil, &QueueFullError{
			RetryAfter: s.retryAfterLocked(s.queued + n - s.opts.MaxQueueItems),
			Queued:     s.queued, Requested: n, Limit: s.opts.MaxQueueItems,
		}
	}
	if full := s.clientShareLocked(req.Client, n); full != nil {
		mq.reject(ReasonRejected)
		full.RetryAfter = s.retryAfterLocked(full.Queued + n - full.Limit)
		return nil, full
	}
	rq := &request{
		ctx:       ctx,
		mq:        mq,
		client:    req.Client,
		priority:  req.Priority,
		deviceID:  req.DeviceID,
		devType:   req.DeviceType,
		inputs:    req.Inputs,
		costs:     req.Costs,
		outputs:   make([]any, n),
		devices:   make([]string, n),
		submitted: now,
		done:      make(chan struct{}),
	}
	if dl, ok := ctx.Deadline(); ok {
		rq.deadline = dl
	}
	mq.push(rq)
	s.addQueuedLocked(rq.client, n)
	s.active++
	mq.setDepth(n)
	s.dispatchLocked(mq)
	return rq, nil
}

// addQueuedLocked moves the items queued, and client's share of them, by d.
func (s *Scheduler) addQueuedLocked(client string, d int) {
	s.queued += d
	if n := s.clientQueued[client] + d; n > 0 {
		s.clientQueued[client] = n
	} else {
		delete(s.clientQueued, client)
	}
}

// clientShareLocked refuses n more items of client when they would take
// its queued items (batch and generation alike) past half the queue, so
// that one client cannot fill the queue and refuse every other; nil when
// they fit. A client with nothing queued may queue one request larger than
// that (up to the whole queue): it could never run otherwise, and the
// client holds nothing else meanwhile. The caller sets RetryAfter.
func (s *Scheduler) clientShareLocked(client string, n int) *QueueFullError {
	held, limit := s.clientQueued[client], (s.opts.MaxQueueItems+1)/2
	if held == 0 || held+n <= limit {
		return nil
	}
	return &QueueFullError{Queued: held, Requested: n, Limit: limit, Client: client}
}

// retryAfterLocked estimates how long the replicas take to drain excess
// items, from their measured throughput.
func (s *Scheduler) retryAfterLocked(excess int) time.Duration {
	var rate float64
	for _, mq := range s.models {
		for _, r := range mq.replicas {
			rate += r.throughput
		}
	}
	const lo, hi, unknown = 10 * time.Millisecond, time.Minute, time.Second
	if rate <= 0 {
		return unknown
	}
	d := time.Duration(float64(excess) / rate * float64(time.Second))
	return min(max(d, lo), hi)
}

// Drain stops accepting work (Submit returns ErrDraining) and waits until
// everything accepted has finished and no batch runs, or ctx ends.
func (s *Scheduler) Drain(ctx context.Context) error {
	s.mu.Lock()
	if !s.draining {
		s.log.Info("draining", zap.Int("queued_items", s.queued), zap.Int("active_requests", s.active))
	}
	s.draining = true
	if s.drained == nil {
		s.drained = make(chan struct{})
	}
	ch := s.drained
	s.checkDrainedLocked()
	s.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("scheduler: drain: %w", ctx.Err())
	}
}

// Draining reports whether Drain or Close was called: the scheduler accepts
// no new work (health should report NOT_SERVING).
func (s *Scheduler) Draining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

func (s *Scheduler) checkDrainedLocked() {
	if !s.draining || s.drained == nil || s.active > 0 || s.running > 0 {
		return
	}
	select {
	case <-s.drained:
	default:
		close(s.drained)
	}
}

// Close fails everything still queued with ErrDraining, stops the workers and
// waits for running batches to return (their executors see a cancelled
// context). Use Drain first to finish accepted work.
func (s *Scheduler) Close() { s.CloseWithin(0) }

// CloseWithin is Close waiting at most d (0: for ever) for the running
// batches and steps; it reports whether they all returned. A device call
// stuck in C cannot be interrupted: a process that must exit gives up on it.
func (s *Scheduler) CloseWithin(d time.Duration) bool {
	s.shutdown()
	if d <= 0 {
		s.workers.Wait()
		return true
	}
	done := make(chan struct{})
	go func() { s.workers.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		s.log.Error("scheduler closed with device calls still running", zap.Duration("waited", d))
		return false
	}
}

// shutdown fails what is queued, stops the workers' intake and cancels
// running work.
func (s *Scheduler) shutdown() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.draining = true
	s.cancel()
	for _, mq := range s.models {
		mq.stopTimer()
		for _, rq := range mq.allRequests() {
			s.finishLocked(rq, fmt.Errorf("scheduler: %q: %w: scheduler closed", mq.name, ErrDraining), ReasonCancelled)
		}
		mq.compact()
		for _, r := range mq.replicas {
			r.closeWork()
		}
	}
	for _, gq := range s.gens {
		for _, seq := range gq.waitingSeqs() {
			s.finishSeqLocked(seq, fmt.Errorf("scheduler: %q: %w: scheduler closed", gq.name, ErrDraining), "", ReasonCancelled)
		}
		for _, r := range gq.replicas {
			r.wake() // its loop sees closed, answers its running sequences and returns
		}
	}
	s.mu.Unlock()
}

// reasonOf maps a context error to a failure reason.
func reasonOf(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return ReasonTimeout
	}
	return ReasonCancelled
}
