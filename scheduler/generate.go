package scheduler

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Generation: continuous (iteration-level) batching of decoder sequences.
//
// A generation replica runs a loop of steps. Each step carries the next
// token of every running sequence plus chunks of prompts (chunked prefill)
// up to a token budget; a sequence joins the running set at the next step
// once its first chunk fits and leaves at the step it finishes, instead of
// waiting for the longest sequence of a static batch. KV-cache room is the
// executor's: the loop reserves it before each step, and when a running
// sequence cannot grow, the newest running sequence is preempted (its
// blocks freed, its tokens recomputed when it is admitted again).
// Between clients, steps are shared in tokens (planStepLocked): one
// client's long prompts or full running set do not hold another's
// sequence back until they end. Between priority levels, a flood at a
// higher level cannot starve a lower one: one admission in 8, and one
// step in 8 for its prompt chunks, go to a lower level with work waiting
// (lowerLevelShare).
//
// What the tokens mean (sampling, stop strings, detokenising) is the
// executor's business too: it gets each sequence's opaque State with every
// step and says when a sequence stops, or that it could not sample one yet
// without holding the step's others (a grammar's mask: StepResult.Pending),
// which then sits out the steps until the executor is ready for it.

// ErrWrongKind means the model exists but serves another kind of request
// (Generate on an encoder, Submit on a generator).
var ErrWrongKind = errors.New("model does not serve this kind of request")

// Finish reasons of a generated sequence.
const (
	FinishStop     = "stop"     // the executor stopped it: an end-of-sequence token or a stop string
	FinishLength   = "length"   // MaxNewTokens generated, or the context or KV cache is full
	FinishDeadline = "deadline" // GenRequest.Deadline passed: it ends with what it has
)

// GenRequest is one sequence to generate.
type GenRequest struct {
	Model, Client string
	// Priority: higher is admitted first, and its prompt chunks go first,
	// except that a lower level with work waiting is owed one admission in
	// 8, and one step in 8 for its chunks (lowerLevelShare).
	Priority             int
	DeviceID, DeviceType string
	// Prompt is the tokenised prompt (at least one token).
	Prompt []int32
	// MaxNewTokens bounds the generated tokens (at least 1).
	MaxNewTokens int
	// Deadline, when set, ends the sequence with FinishDeadline and the
	// tokens it has (unlike the context, whose end is an error).
	Deadline time.Time
	// State is the executor's per-sequence state (sampler, stop strings,
	// detokeniser), handed back with every step of the sequence.
	State any
}

// StepItem is one sequence's part of a step.
type StepItem struct {
	Seq   uint64 // stable for the sequence's life, preemptions included
	State any
	// Tokens to run: a chunk of the prompt (or, after a preemption, of the
	// prompt and the tokens generated so far), or the last sampled token.
	Tokens []int32
	// Pos is the position of Tokens[0]: tokens before it are in the cache.
	Pos int
	// Sample: Tokens end the sequence's known tokens, so the step samples
	// its next token.
	Sample bool
	// Draft is the most tokens the executor may guess after Tokens and
	// verify in the same step (speculative decoding,
	// GenOptions.SpecTokens); their cache room is reserved.
	Draft int
	// History is the sequence's tokens up to the end of Tokens, set with
	// Draft: the executor looks its guesses up there. Read only.
	History []int32
}

// StepResult is the executor's answer for one StepItem; only items with
// Sample set have one that counts.
type StepResult struct {
	Token int32
	Out   any  // the executor's payload for the token (text delta, logprobs)
	Stop  bool // the sequence ends with this token (FinishStop)
	Full  bool // no room for more tokens (context length): FinishLength
	// End, when set, ends the sequence at this step without a token, with
	// End as its finish reason: the executor's own reason (a structured-
	// output constraint that cannot continue). Token is ignored; Out
	// covers Accepted's tokens, if any.
	End string
	// Pending, when set, means the item sampled nothing yet: its
	// executor is still preparing the sequence's sampling (a grammar's
	// mask) and would have held the whole step for it. Its tokens ran,
	// but the cache holds all but the last: the sequence sits out the
	// steps until Pending is closed, then runs that token again.
	Pending <-chan struct{}
	// Drafted is how many guessed tokens the step ran for the item;
	// Accepted those the sequence took, in order, before Token (with End,
	// before it ended).
	Drafted  int
	Accepted []int32
	// Cached is how many of the item's tokens the executor's prefix
	// cache held instead of computing them (GenInfo.CachedPromptTokens).
	Cached int
}

// GenExecutor runs decoder steps on one device.
type GenExecutor interface {
	// Reserve makes sure sequence seq has KV-cache room for tokens tokens
	// in all; false when the free blocks do not suffice now.
	Reserve(seq uint64, tokens int) bool
	// Release frees the sequence's cache (it finished, was cancelled or is
	// preempted). Its State stays valid: a preempted sequence comes back.
	Release(seq uint64)
	// Step runs one forward pass over items and returns one result per
	// item. After it, an item that guessed holds room for its written
	// positions and the next one: its refused guesses' room goes back.
	Step(ctx context.Context, items []StepItem) ([]StepResult, error)
}

// GenOptions size a generation replica (from the device's batch plan).
type GenOptions struct {
	MaxRunning    int // sequences in the running set (at least 1)
	MaxStepTokens int // tokens in one step: decode tokens plus prefill chunks (at least MaxRunning)
	MaxChunk      int // longest prefill chunk of one sequence in one step (0: MaxStepTokens)
	// SpecTokens is the most tokens a decoding sequence's step may guess
	// and verify at once (StepItem.Draft): 0 turns speculative decoding
	// off. Guesses take step tokens and cache room left after the
	// running sequences' tokens and the prompts' chunks, and run only
	// while at most SpecMaxRunning sequences run (0: DefaultSpecMaxRunning):
	// a wide step already reads each weight once for many tokens, and
	// guesses it rejects cost it compute.
	SpecTokens     int
	SpecMaxRunning int
	// ChunkAlign, when more than 1, ends a prompt chunk cut short of the
	// prompt's end on a multiple of it: the KV cache's block size. The
	// next chunk then starts on a block, where the prefix cache can map
	// the blocks after it (one starting inside a block maps none).
	ChunkAlign int
}

// DefaultSpecMaxRunning is GenOptions.SpecMaxRunning's default.
const DefaultSpecMaxRunning = 4

// GenEvent is one token of a stream, or its end.
type GenEvent struct {
	HasToken bool
	Token    int32
	Out      any
	// Finish is set on the last event: FinishStop, FinishLength,
	// FinishDeadline or an executor's StepResult.End (a deadline's or an
	// End's last event may carry no token).
	Finish string
	Info   *GenInfo // on the last event
}

// GenInfo is how a finished sequence ran.
type GenInfo struct {
	DeviceID, DeviceType string
	PromptTokens         int
	GeneratedTokens      int
	// CachedPromptTokens: of PromptTokens, those the executor's prefix
	// cache held at the sequence's first admission (StepResult.Cached).
	CachedPromptTokens int
	// Queue: Generate until its first step. TimeToFirstToken: Generate
	// until its first token. Total: Generate until its last token.
	Queue, TimeToFirstToken, Total time.Duration
	// Compute: the time of the steps it took part in. CostUSD: its share
	// of them, by tokens.
	Compute     time.Duration
	CostUSD     float64
	MaxBatch    int // most sequences in one of its steps
	Preemptions int
}

// GenStream delivers a sequence's tokens.
type GenStream struct {
	s   *Scheduler
	seq *sequence
}

// Seq is the sequence's ID, as the executor sees it.
func (g *GenStream) Seq() uint64 { return g.seq.id }

// Recv returns the next event. After the last one (Finish set) it returns
// io.EOF; a sequence that failed returns its error (ErrBackend,
// ErrDraining, or the context's error).
func (g *GenStream) Recv() (GenEvent, error) {
	for {
		g.s.mu.Lock()
		ev, err, ok := g.nextLocked()
		g.s.mu.Unlock()
		if ok {
			return ev, err
		}
		<-g.seq.notify
	}
}

// nextLocked is Recv's next event or end, ok false while there is none yet.
// A Finish event waits while a step holds the sequence: a deadline ends it
// from outside the step, and its caller then flushes the sequence's state
// (an llm.Sequence's held-back text), which the step may still be sampling.
// An error (a cancellation) does not wait: its caller flushes nothing.
func (g *GenStream) nextLocked() (ev GenEvent, err error, ok bool) {
	seq := g.seq
	if len(seq.events) > 0 {
		if seq.events[0].Finish != "" && seq.inStep {
			return GenEvent{}, nil, false
		}
		ev = seq.events[0]
		seq.events[0] = GenEvent{}
		seq.events = seq.events[1:]
		return ev, nil, true
	}
	if !seq.finished || (seq.inStep && seq.err == nil) {
		return GenEvent{}, nil, false
	}
	if seq.err == nil {
		return GenEvent{}, io.EOF, true
	}
	return GenEvent{}, seq.err, true
}

// sequence is one accepted sequence of Generate, as request is one of
// Submit. Its fields are guarded by Scheduler.mu.
type sequence struct {
	id                uint64
	gq                *genQueue
	client            string
	priority          int
	deviceID, devType string
	state             any

	tokens    []int32 // prompt, then generated
	promptLen int
	maxNew    int
	computed  int // tokens in the KV cache
	generated int
	// cachedPrompt: prompt tokens the prefix cache held at its first
	// admission.
	cachedPrompt int

	waitEl    *list.Element // its place in gq.waiting; nil when not waiting
	r         *genReplica   // running on; it holds cache there
	last      *genReplica   // the replica of its last step (its Stats row)
	retried   bool          // failed once on exclude and went back to waiting
	exclude   *genReplica
	preempted int

	submitted, firstStep, firstToken, lastToken time.Time
	compute                                     time.Duration
	cost                                        float64
	maxBatch                                    int
	lastDev, lastDevType                        string

	stopCtx  func() bool // stops the context watch
	deadline *time.Timer

	inStep bool // in the step its replica runs now (planned, not yet applied)
	// pending is the executor's StepResult.Pending of its last step:
	// running, it sits out steps until it is closed.
	pending  <-chan struct{}
	finished bool
	err      error
	events   []GenEvent
	notify   chan struct{} // capacity 1: something to Recv
}

func (seq *sequence) wake() {
	select {
	case seq.notify <- struct{}{}:
	default:
	}
}

func (seq *sequence) matches(r *genReplica) bool { return r.matches(seq.deviceID, seq.devType) }

// waitsForExecutor says whether the executor put off seq's sampling
// (StepResult.Pending) and is not ready for it yet.
func (seq *sequence) waitsForExecutor() bool {
	if seq.pending == nil {
		return false
	}
	select {
	case <-seq.pending:
		seq.pending = nil
		return false
	default:
		return true
	}
}

// genQueue is one generator model: its waiting sequences and replicas.
type genQueue struct {
	name     string // the queue's key
	label    string // its name in Stats and the metrics (WithName)
	replicas []*genReplica
	// waiting holds *sequence in arrival order, preempted and retried ones
	// put first; each holds its element, so leaving is O(1) (a client's
	// 32768 waiting sequences cancelled at once cost n, not n², under mu).
	waiting list.List
	// waitVisits counts the waiting entries looked at to take sequences
	// out of waiting (a test bounds it: leaving must not scan the list).
	waitVisits int64
	// served counts the tokens each client had run (prompt and generated):
	// admission picks the client that had least (virtual token counters),
	// so fairness between clients is in tokens, not requests. A client is
	// forgotten when it has nothing waiting or running (it comes back at
	// the least served active client's count, as a new one does), so the
	// map holds the active clients, not every address ever seen.
	served  map[string]int64
	clients map[string]int // sequences waiting or running per client
	// levelWaiting counts the waiting sequences of each priority level;
	// passed, of each level with some, the admissions higher levels took
	// one after another while it had one the admitting replica could run
	// (lowerLevelShare: the level owed one takes the next).
	levelWaiting, passed map[int]int
	stats                genRowStats // the model row of Stats
}

// waitingSeqs returns a copy of the waiting sequences, for loops that
// finish them (and so take them out of the list) as they go.
func (gq *genQueue) waitingSeqs() []*sequence {
	out := make([]*sequence, 0, gq.waiting.Len())
	for el := gq.waiting.Front(); el != nil; el = el.Next() {
		out = append(out, el.Value.(*sequence))
	}
	return out
}

func (gq *genQueue) replica(deviceID string) *genReplica {
	for _, r := range gq.replicas {
		if r.dev.ID == deviceID {
			return r
		}
	}
	return nil
}

// genReplica is one device serving one generator model.
type genReplica struct {
	replicaCore
	gq      *genQueue
	opts    GenOptions
	exec    GenExecutor
	running []*sequence // admission order: the last is the newest
	kick    chan struct{}
	// chunkPassed counts, per priority level, the steps in a row in which
	// a prompt chunk of the level ran short while a higher level's ran
	// more than a token: a level owed a pick (lowerLevelShare) has its
	// chunks ahead of higher levels' in the next step.
	chunkPassed map[int]int

	tokensPerS float64 // EWMA of step tokens per second

	// kv is the executor's KV cache as last sampled (between steps, by
	// the replica's loop); zero when the executor does not report it.
	kv    KVCache
	stats genRowStats // the replica's row of Stats
	m     genReplicaMetrics
}

func (r *genReplica) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// AddGenReplica makes dev serve the generator model with a running set of
// opts.MaxRunning sequences. A model serves either Submit or Generate. Of
// the replica options only WithName applies.
func (s *Scheduler) AddGenReplica(model string, dev Device, opts GenOptions, exec GenExecutor, options ...ReplicaOption) error {
	var ro replicaOptions
	for _, o := range options {
		o(&ro)
	}
	switch {
	case model == "":
		return fmt.Errorf("scheduler: add generator replica: %w: empty model name", ErrInvalidArgument)
	case dev.ID == "":
		return fmt.Errorf("scheduler: add generator replica of %q: %w: empty device ID", model, ErrInvalidArgument)
	case opts.MaxRunning < 1 || opts.MaxStepTokens < opts.MaxRunning:
		return fmt.Errorf("scheduler: add generator replica of %q on %s: %w: max running %d, step tokens %d (want 1 ≤ running ≤ step tokens)",
			model, dev.ID, ErrInvalidArgument, opts.MaxRunning, opts.MaxStepTokens)
	case exec == nil:
		return fmt.Errorf("scheduler: add generator replica of %q on %s: %w: nil executor", model, dev.ID, ErrInvalidArgument)
	}
	if opts.SpecMaxRunning <= 0 {
		opts.SpecMaxRunning = DefaultSpecMaxRunning
	}
	if opts.MaxChunk <= 0 || opts.MaxChunk > opts.MaxStepTokens {
		opts.MaxChunk = opts.MaxStepTokens
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("scheduler: add generator replica of %q on %s: %w: closed", model, dev.ID, ErrDraining)
	}
	if s.models[model] != nil {
		return fmt.Errorf("scheduler: add generator replica of %q: %w: it serves batches", model, ErrWrongKind)
	}
	gq := s.gens[model]
	if gq == nil {
		gq = &genQueue{name: model, label: ro.label(model), served: map[string]int64{}, clients: map[string]int{},
			levelWaiting: map[int]int{}, passed: map[int]int{}, stats: newGenRowStats()}
		s.gens[model] = gq
	}
	if gq.label != ro.label(model) {
		return fmt.Errorf("scheduler: add generator replica of %q on %s: %w: named %q, its other replicas %q", model, dev.ID, ErrInvalidArgument, ro.label(model), gq.label)
	}
	if gq.replica(dev.ID) != nil {
		return fmt.Errorf("scheduler: add generator replica of %q on %s: %w: already served", model, dev.ID, ErrInvalidArgument)
	}
	r := &genReplica{
		replicaCore: newReplicaCore(dev),
		gq:          gq, opts: opts, exec: exec,
		kick:        make(chan struct{}, 1),
		chunkPassed: map[int]int{},
		stats:       newGenRowStats(),
		m:           s.metrics.gen.forReplica(gq.label, dev.ID),
	}
	s.sampleKVLocked(r)
	gq.replicas = append(gq.replicas, r)
	s.workers.Add(1)
	go s.genLoop(r)
	s.log.Info("generator replica added", zap.String("model", model), zap.String("device", dev.ID),
		zap.Int("max_running", opts.MaxRunning), zap.Int("step_tokens", opts.MaxStepTokens))
	return nil
}

// detachGenLocked is RemoveReplica's part for a generator: r admits no
// new sequence and its loop ends once its running ones finish; it leaves
// gq (and gq the scheduler, with its last replica), and the waiting
// sequences no replica left can serve fail with ErrNoDevice.
func (s *Scheduler) detachGenLocked(gq *genQueue, deviceID string) (*replicaCore, string, error) {
	i := slices.IndexFunc(gq.replicas, func(r *genReplica) bool { return r.dev.ID == deviceID })
	if i < 0 {
		return nil, "", fmt.Errorf("scheduler: remove generator replica of %q on %s: %w", gq.name, deviceID, ErrDeviceNotFound)
	}
	r := gq.replicas[i]
	r.removing = true
	gq.replicas = slices.Delete(gq.replicas, i, i+1)
	if len(gq.replicas) == 0 {
		delete(s.gens, gq.name)
	}
	for _, seq := range gq.waitingSeqs() {
		if !slices.ContainsFunc(gq.replicas, seq.matches) {
			s.finishSeqLocked(seq, fmt.Errorf("scheduler: %q: %w: its replicas were removed", gq.name, ErrNoDevice), "", ReasonRejected)
		}
	}
	r.wake()
	return &r.replicaCore, gq.label, nil
}

// Generate queues a sequence and returns its stream at once. It fails fast
// like Submit: ErrDraining, ErrUnknownModel, ErrWrongKind,
// ErrDeviceNotFound, ErrNoDevice, ErrInvalidArgument or a *QueueFullError
// (each waiting sequence counts as one queued item, and one client's
// queued items, its waiting sequences and batch items together, may fill
// half the queue at most). The context's end
// cancels the sequence and frees its cache.
func (s *Scheduler) Generate(ctx context.Context, req GenRequest) (*GenStream, error) {
	if len(req.Prompt) == 0 || req.MaxNewTokens < 1 {
		return nil, fmt.Errorf("scheduler: %q: %w: %d prompt tokens, max new tokens %d (want at least 1 of each)",
			req.Model, ErrInvalidArgument, len(req.Prompt), req.MaxNewTokens)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	gq := s.gens[req.Model]
	if s.draining || s.closed {
		if gq != nil { // an unknown name is not counted (label cardinality)
			s.genReject(gq, ReasonRejected)
		}
		return nil, fmt.Errorf("scheduler: %q: %w", req.Model, ErrDraining)
	}
	if gq == nil {
		if s.models[req.Model] != nil {
			return nil, fmt.Errorf("scheduler: %q: %w: it is not a generator", req.Model, ErrWrongKind)
		}
		return nil, fmt.Errorf("scheduler: %q: %w", req.Model, ErrUnknownModel)
	}
	if err := ctx.Err(); err != nil {
		s.genReject(gq, reasonOf(err))
		return nil, fmt.Errorf("scheduler: %q: before queueing: %w", req.Model, err)
	}
	now := s.now()
	if err := checkPinsLocked(s, req.Model, gq.replicas, req.DeviceID, req.DeviceType, now); err != nil {
		s.genReject(gq, ReasonRejected)
		return nil, err
	}
	if s.queued+1 > s.opts.MaxQueueItems {
		s.genReject(gq, ReasonRejected)
		return nil, &QueueFullError{RetryAfter: s.genRetryAfterLocked(gq), Queued: s.queued, Requested: 1, Limit: s.opts.MaxQueueItems}
	}
	if full := s.clientShareLocked(req.Client, 1); full != nil {
		s.genReject(gq, ReasonRejected)
		full.RetryAfter = s.genRetryAfterLocked(gq)
		return nil, full
	}
	s.nextSeq++
	seq := &sequence{
		id: s.nextSeq, gq: gq, client: req.Client, priority: req.Priority,
		deviceID: req.DeviceID, devType: req.DeviceType, state: req.State,
		tokens: slices.Clone(req.Prompt), promptLen: len(req.Prompt), maxNew: req.MaxNewTokens,
		submitted: now, notify: make(chan struct{}, 1),
	}
	// A client that had nothing queued starts from the least served
	// active client, so idling does not bank credit.
	if gq.clients[seq.client] == 0 {
		low, any := int64(0), false
		for c, n := range gq.clients {
			if n > 0 && (!any || gq.served[c] < low) {
				low, any = gq.served[c], true
			}
		}
		if any && gq.served[seq.client] < low {
			gq.served[seq.client] = low
		}
	}
	gq.clients[seq.client]++
	s.waitSeqLocked(seq, false)
	s.active++
	seq.stopCtx = context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		err := ctx.Err()
		s.finishSeqLocked(seq, fmt.Errorf("scheduler: %q: %w", gq.name, err), "", reasonOf(err))
	})
	if !req.Deadline.IsZero() {
		seq.deadline = time.AfterFunc(time.Until(req.Deadline), func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.finishSeqLocked(seq, nil, FinishDeadline, "")
		})
	}
	for _, r := range gq.replicas {
		if seq.matches(r) {
			r.wake()
		}
	}
	return &GenStream{s: s, seq: seq}, nil
}

func (s *Scheduler) genReject(gq *genQueue, reason string) {
	gq.stats.totals.Failed++ // refused at once: no time spent
	gq.stats.failed[reason]++
	s.metrics.failed(gq.label, reason)
}

// genRetryAfterLocked estimates when a waiting slot frees: the time the
// replicas take to run one step's worth of tokens, bounded like Submit's.
func (s *Scheduler) genRetryAfterLocked(gq *genQueue) time.Duration {
	var rate float64
	for _, r := range gq.replicas {
		rate += r.tokensPerS
	}
	if rate <= 0 {
		return time.Second
	}
	d := time.Duration(float64(gq.waiting.Len()) / rate * float64(time.Second))
	return min(max(d, 10*time.Millisecond), time.Minute)
}

// finishSeqLocked answers the caller: err, or success with finish (a final
// event is added when the last token did not carry it). The cache is freed
// by the replica's loop at its next step boundary, or here when the
// sequence is not running.
func (s *Scheduler) finishSeqLocked(seq *sequence, err error, finish, reason string) {
	if seq.finished {
		return
	}
	gq := seq.gq
	seq.finished = true
	seq.err = err
	if seq.stopCtx != nil {
		seq.stopCtx()
	}
	if seq.deadline != nil {
		seq.deadline.Stop()
	}
	if seq.waitEl != nil {
		s.unwaitSeqLocked(seq)
	}
	if seq.r != nil {
		seq.r.wake() // its loop frees the cache
	}
	gq.clients[seq.client]--
	if gq.clients[seq.client] <= 0 {
		delete(gq.clients, seq.client)
		delete(gq.served, seq.client)
	}
	s.active--
	now := s.now()
	if err == nil {
		info := s.genInfo(seq)
		if n := len(seq.events); n > 0 && seq.events[n-1].HasToken && seq.events[n-1].Finish == "" && finish != FinishDeadline {
			seq.events[n-1].Finish, seq.events[n-1].Info = finish, info
		} else {
			seq.events = append(seq.events, GenEvent{Finish: finish, Info: info})
		}
		gq.stats.finished(info, now)
		if seq.last != nil {
			seq.last.stats.finished(info, now)
		}
		s.metrics.gen.finished(gq.label, finish, info.Total)
	} else {
		gq.stats.addRequest(ExecInfo{}, now.Sub(seq.submitted), false, now)
		gq.stats.failed[reason]++
		s.metrics.failed(gq.label, reason)
	}
	seq.wake()
	s.checkDrainedLocked()
}

func (s *Scheduler) genInfo(seq *sequence) *GenInfo {
	info := &GenInfo{
		DeviceID: seq.lastDev, DeviceType: seq.lastDevType,
		PromptTokens: seq.promptLen, GeneratedTokens: seq.generated,
		Total: s.now().Sub(seq.submitted), Compute: seq.compute, CostUSD: seq.cost,
		MaxBatch: seq.maxBatch, Preemptions: seq.preempted, CachedPromptTokens: seq.cachedPrompt,
	}
	if !seq.firstStep.IsZero() {
		info.Queue = seq.firstStep.Sub(seq.submitted)
	}
	if !seq.firstToken.IsZero() {
		info.TimeToFirstToken = seq.firstToken.Sub(seq.submitted)
		info.Total = seq.lastToken.Sub(seq.submitted)
	}
	return info
}

// genLoop runs r's steps until the scheduler closes or r is removed and
// has nothing running.
func (s *Scheduler) genLoop(r *genReplica) {
	defer s.workers.Done()
	defer close(r.exited)
	var probeTimer *time.Timer
	defer func() {
		if probeTimer != nil {
			probeTimer.Stop()
		}
	}()
	for {
		s.mu.Lock()
		if s.closed {
			s.releaseAllLocked(r)
			for _, seq := range r.gq.waitingSeqs() {
				s.finishSeqLocked(seq, fmt.Errorf("scheduler: %q: %w: scheduler closed", r.gq.name, ErrDraining), "", ReasonCancelled)
			}
			s.mu.Unlock()
			return
		}
		now := s.now()
		items, seqs := s.planStepLocked(r, now)
		if len(items) == 0 {
			if r.removing && len(r.running) == 0 {
				s.mu.Unlock()
				return
			}
			// Idle: wait for a kick, or for the end of an unhealthy rest.
			// The plan may have just freed cancelled sequences: say so now,
			// not at the next step, which may be a long time coming.
			s.sampleKVLocked(r)
			var probe <-chan time.Time
			if !r.healthy && r.gq.waiting.Len() > 0 && now.Before(r.probeAt) {
				if probeTimer == nil {
					probeTimer = time.NewTimer(r.probeAt.Sub(now))
				} else {
					probeTimer.Reset(r.probeAt.Sub(now))
				}
				probe = probeTimer.C
			}
			s.mu.Unlock()
			select {
			case <-r.kick:
			case <-probe:
			}
			continue
		}
		s.running++
		s.sampleKVLocked(r)
		s.mu.Unlock()

		start := s.now()
		results, err := s.step(r, items)
		end := s.now()

		s.mu.Lock()
		s.running--
		s.applyStepLocked(r, items, seqs, results, err, start, end)
		s.sampleKVLocked(r)
		s.checkDrainedLocked()
		s.mu.Unlock()
	}
}

// step calls the executor, turning a panic, a wrong result count or more
// guesses taken than granted (tokens past max_tokens) into an error.
func (s *Scheduler) step(r *genReplica, items []StepItem) (res []StepResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("generator step panicked: %v", p)
		}
	}()
	res, err = r.exec.Step(s.baseCtx, items)
	if err == nil && len(res) != len(items) {
		err = fmt.Errorf("generator step returned %d results for %d items", len(res), len(items))
	}
	for i := range res {
		if err == nil && (len(res[i].Accepted) > res[i].Drafted || res[i].Drafted > items[i].Draft) {
			err = fmt.Errorf("generator step took %d of %d guesses for an item granted %d", len(res[i].Accepted), res[i].Drafted, items[i].Draft)
		}
		if p := res[i]; err == nil && p.Pending != nil && (!items[i].Sample || p.Drafted > 0 || p.End != "") {
			err = fmt.Errorf("generator step put off an item that did not sample, or also guessed or ended it")
		}
	}
	return res, err
}

// releaseLocked frees seq's cache on its replica and takes it out of the
// running set.
func (s *Scheduler) releaseLocked(r *genReplica, seq *sequence) {
	r.exec.Release(seq.id)
	r.running = slices.DeleteFunc(r.running, func(x *sequence) bool { return x == seq })
	seq.r = nil
	seq.computed = 0
}

func (s *Scheduler) releaseAllLocked(r *genReplica) {
	for _, seq := range slices.Clone(r.running) {
		s.finishSeqLocked(seq, fmt.Errorf("scheduler: %q: %w: scheduler closed", r.gq.name, ErrDraining), "", ReasonCancelled)
		s.releaseLocked(r, seq)
	}
}

// waitSeqLocked puts seq in its model's waiting sequences: last (a new
// one) or first (preempted or retried).
func (s *Scheduler) waitSeqLocked(seq *sequence, first bool) {
	gq := seq.gq
	if first {
		seq.waitEl = gq.waiting.PushFront(seq)
	} else {
		seq.waitEl = gq.waiting.PushBack(seq)
	}
	s.addQueuedLocked(seq.client, 1)
	gq.levelWaiting[seq.priority]++
}

// unwaitSeqLocked takes seq out of its model's waiting sequences.
func (s *Scheduler) unwaitSeqLocked(seq *sequence) {
	gq := seq.gq
	gq.waiting.Remove(seq.waitEl)
	gq.waitVisits++
	seq.waitEl = nil
	s.addQueuedLocked(seq.client, -1)
	if gq.levelWaiting[seq.priority]--; gq.levelWaiting[seq.priority] <= 0 {
		delete(gq.levelWaiting, seq.priority)
		delete(gq.passed, seq.priority) // owed nothing once it waits no more
	}
}

// requeueLocked puts seq back at the front of the waiting sequences.
// One that no replica left can run (its own is being removed) is answered
// ErrNoDevice, as detachGenLocked answers the waiting ones.
func (s *Scheduler) requeueLocked(seq *sequence) {
	gq := seq.gq
	if !slices.ContainsFunc(gq.replicas, seq.matches) {
		s.finishSeqLocked(seq, fmt.Errorf("scheduler: %q: %w: its replicas were removed", gq.name, ErrNoDevice), "", ReasonRejected)
		return
	}
	s.waitSeqLocked(seq, true)
	for _, o := range gq.replicas {
		if seq.matches(o) {
			o.wake()
		}
	}
}

// planStepLocked chooses the next step of r: the running sequences first
// (each its next token or prompt chunk, preempting the newest when the
// cache is full), then waiting sequences while the running set and the
// token budget have room.
//
// Between clients it is fair in tokens, as admission is: every running
// sequence advances each step (a decode is never left out for prompt
// chunks; one whose executor put its sampling off, StepResult.Pending,
// sits out until the executor is ready for it), a prompt chunk leaves room for the chunks of sequences ahead
// of it (higher priority, or a client with fewer tokens served; a lower
// level owed a step goes ahead of higher ones: lowerLevelShare), the
// waiting one admitted next included, and a client that runs nothing
// gets a place in a running set another client fills (makeRoomLocked).
// Room that a sequence ahead could not take goes back at the end.
func (s *Scheduler) planStepLocked(r *genReplica, now time.Time) ([]StepItem, []*sequence) {
	// Sequences answered since the last step leave now, freeing their cache.
	for _, seq := range slices.Clone(r.running) {
		if seq.finished {
			s.releaseLocked(r, seq)
		}
	}
	admits := func() bool {
		return s.usableLocked(&r.replicaCore, now) && (r.healthy || len(r.running) == 0)
	}
	var next *sequence // the waiting sequence admission takes next, if it has a place
	if admits() {
		if next = s.nextWaitingLocked(r); next != nil && len(r.running) >= r.opts.MaxRunning {
			s.makeRoomLocked(r, next)
		}
		if len(r.running) >= r.opts.MaxRunning {
			next = nil
		}
	}
	budget := r.opts.MaxStepTokens
	var items []StepItem
	var seqs []*sequence
	var wants []int // each item's chunk before the room left to others
	// aligned is the tokens of a chunk from pos of seq's taking take, cut
	// back to end on a block (ChunkAlign) when the chunk stops short of
	// the tokens to run and a token is left.
	aligned := func(seq *sequence, pos, take int) int {
		if a, end := r.opts.ChunkAlign, pos+take; a > 1 && end < len(seq.tokens) && end/a*a > pos {
			return end/a*a - pos
		}
		return take
	}
	add := func(seq *sequence, take, want int) {
		pos := seq.computed
		items = append(items, StepItem{
			Seq: seq.id, State: seq.state, Tokens: seq.tokens[pos : pos+take], Pos: pos,
			Sample: pos+take == len(seq.tokens),
		})
		seqs = append(seqs, seq)
		wants = append(wants, want)
		seq.inStep = true
		budget -= take
	}
	for i := 0; i < len(r.running) && budget > 0; {
		seq := r.running[i]
		if seq.waitsForExecutor() {
			i++
			continue
		}
		want := min(len(seq.tokens)-seq.computed, r.opts.MaxChunk)
		take := min(want, budget)
		if want > 1 {
			// At least a token: the ones after hold at least a token each,
			// so the budget (≥ MaxRunning) never runs out before them.
			take = max(1, min(want, budget-s.heldLocked(r, i, next)))
		}
		take = aligned(seq, seq.computed, take)
		fits := true
		for fits && !r.exec.Reserve(seq.id, seq.computed+take) {
			victim := r.running[len(r.running)-1]
			if victim == seq {
				fits = false // seq is the newest: it waits, or cannot run at all
				if len(items) == 0 && len(r.running) == 1 {
					s.log.Warn("sequence outgrew the KV cache; ending it", zap.String("model", r.gq.name),
						zap.String("device", r.dev.ID), zap.Int("tokens", len(seq.tokens)))
					s.releaseLocked(r, seq)
					s.finishSeqLocked(seq, nil, FinishLength, "")
					break
				}
			}
			s.preemptLocked(r, victim)
		}
		if !fits {
			continue // seq was the last of the running set: the loop ends
		}
		add(seq, take, want)
		i++
	}
	if admits() {
		for len(r.running) < r.opts.MaxRunning && budget > 0 {
			levels := s.waitingLevelsLocked(r)
			if len(levels) == 0 {
				break
			}
			k := r.gq.pickLevel(levels)
			seq := levels[k]
			want := min(len(seq.tokens), r.opts.MaxChunk)
			take := aligned(seq, 0, min(want, budget))
			if !r.exec.Reserve(seq.id, take) {
				break // it waits for blocks
			}
			s.unwaitSeqLocked(seq)
			r.gq.admitted(levels, k)
			seq.r = r
			seq.computed = 0
			r.running = append(r.running, seq)
			if seq.firstStep.IsZero() {
				seq.firstStep = now
			}
			add(seq, take, want)
			if !r.healthy {
				break // one sequence is the probe
			}
		}
	}
	// next was left waiting with room in the running set: the step's
	// tokens went to the running sequences.
	var crowdedOut *sequence
	if next != nil && next.waitEl != nil && len(r.running) < r.opts.MaxRunning && budget == 0 {
		crowdedOut = next
	}
	// Room held for a sequence that did not take it (one waiting for
	// cache blocks) goes to the chunks it was held from, oldest first.
	for k := 0; k < len(items) && budget > 0; k++ {
		it := &items[k]
		seq := seqs[k]
		more := aligned(seq, it.Pos, len(it.Tokens)+min(wants[k]-len(it.Tokens), budget)) - len(it.Tokens)
		if more <= 0 || !r.exec.Reserve(it.Seq, it.Pos+len(it.Tokens)+more) {
			continue
		}
		it.Tokens = seq.tokens[it.Pos : it.Pos+len(it.Tokens)+more]
		it.Sample = it.Pos+len(it.Tokens) == len(seq.tokens)
		budget -= more
	}
	r.countChunkPasses(items, seqs, wants, crowdedOut)
	s.grantDraftsLocked(r, items, seqs, budget)
	return items, seqs
}

// grantDraftsLocked gives sampling items room for guessed tokens
// (StepItem.Draft) from the step's budget left over, while few sequences
// run: never past a sequence's max_tokens, and only where the cache has
// the blocks after the step's own tokens took theirs. The executor gives
// a refused guess's room back after the step (GenExecutor.Step), so a
// guess never holds room the next step needs; and a grant needs, before
// it, a block free for each running sequence (an executor that reports
// its blocks, idle prefix-cache blocks counting as free), so that guesses
// stop before the cache runs short.
func (s *Scheduler) grantDraftsLocked(r *genReplica, items []StepItem, seqs []*sequence, budget int) {
	if r.opts.SpecTokens <= 0 || len(r.running) > r.opts.SpecMaxRunning {
		return
	}
	kv, _ := r.exec.(KVCacheReporter)
	for k := range items {
		it, seq := &items[k], seqs[k]
		n := min(r.opts.SpecTokens, budget, seq.maxNew-seq.generated-1)
		// A prompt's last chunk too: its guesses follow the prompt.
		if !it.Sample || n <= 0 {
			continue
		}
		if kv != nil {
			if used, total := kv.CacheBlocks(); total-used < len(r.running) {
				return
			}
		}
		if !r.exec.Reserve(seq.id, it.Pos+len(it.Tokens)+n) {
			continue
		}
		it.Draft, it.History = n, seq.tokens[:it.Pos+len(it.Tokens)]
		budget -= n
	}
}

// countChunkPasses updates r.chunkPassed after a step is planned: a level
// with a prompt chunk cut short, or whose waiting sequence was crowded out
// (no token left for it with room in the running set), while a higher
// level's sequence ran more than a token was passed over; one owed a step
// (it went ahead in this one), or not passed over, starts again from 0.
func (r *genReplica) countChunkPasses(items []StepItem, seqs []*sequence, wants []int, crowdedOut *sequence) {
	top, ran := 0, false // the highest level that ran more than a token
	for k, it := range items {
		if p := seqs[k].priority; len(it.Tokens) > 1 && (!ran || p > top) {
			top, ran = p, true
		}
	}
	var passed []int // few: one per level
	for k, it := range items {
		if p := seqs[k].priority; ran && p < top && len(it.Tokens) < wants[k] && !slices.Contains(passed, p) {
			passed = append(passed, p)
		}
	}
	if c := crowdedOut; c != nil && ran && c.priority < top && !slices.Contains(passed, c.priority) {
		passed = append(passed, c.priority)
	}
	for p := range r.chunkPassed {
		if !slices.Contains(passed, p) {
			delete(r.chunkPassed, p)
		}
	}
	for _, p := range passed {
		if owedPick(r.chunkPassed[p]) {
			delete(r.chunkPassed, p)
		} else {
			r.chunkPassed[p]++
		}
	}
}

// heldLocked is the budget the chunk of r.running[i] leaves to the
// sequences after it in the step: a token for each, a whole chunk for the
// prompts of those ahead of it, and next's first chunk when next is ahead.
func (s *Scheduler) heldLocked(r *genReplica, i int, next *sequence) int {
	seq := r.running[i]
	held := 0
	for _, o := range r.running[i+1:] {
		held++
		if left := len(o.tokens) - o.computed; left > 1 && r.ahead(o, seq) {
			held += min(left, r.opts.MaxChunk) - 1
		}
	}
	if next != nil && r.ahead(next, seq) {
		held += min(len(next.tokens), r.opts.MaxChunk)
	}
	return held
}

// ahead says whether a's chunk goes before b's in r's step: a level owed
// a step (chunkPassed) before one that is not, else a higher priority, or
// the same and a client that had fewer tokens served.
func (r *genReplica) ahead(a, b *sequence) bool {
	if a.priority != b.priority {
		if oa, ob := owedPick(r.chunkPassed[a.priority]), owedPick(r.chunkPassed[b.priority]); oa != ob {
			return oa
		}
		return a.priority > b.priority
	}
	return r.gq.served[a.client] < r.gq.served[b.client]
}

// makeRoomLocked gives next, the waiting sequence of a client that runs
// nothing on r while r's running set is full, a place: the newest
// sequence of the client that runs the most there is preempted, when that
// client runs two or more, had more tokens served than next's and is not
// of a higher priority. Otherwise a client that fills the running set with
// long sequences would keep every other one waiting until one of them ends;
// the victim's client keeps a place, so two clients never take turns
// preempting each other.
func (s *Scheduler) makeRoomLocked(r *genReplica, next *sequence) {
	runs := map[string]int{}
	for _, seq := range r.running {
		runs[seq.client]++
	}
	if runs[next.client] > 0 {
		return
	}
	var victim *sequence
	for _, seq := range slices.Backward(r.running) { // the newest of each client first
		if victim == nil || runs[seq.client] > runs[victim.client] {
			victim = seq
		}
	}
	gq := r.gq
	if victim == nil || runs[victim.client] < 2 || victim.priority > next.priority || gq.served[victim.client] <= gq.served[next.client] {
		return
	}
	s.preemptLocked(r, victim)
}

// preemptLocked frees seq's cache and sends it back to wait; its tokens are
// recomputed when it runs again.
func (s *Scheduler) preemptLocked(r *genReplica, seq *sequence) {
	s.releaseLocked(r, seq)
	seq.preempted++
	r.gq.stats.preemptions++
	r.stats.preemptions++
	r.m.preemptions.Inc()
	s.requeueLocked(seq)
}

// nextWaitingLocked picks the waiting sequence r admits next: of the
// level pickLevel chooses, the client that had the fewest tokens served;
// that client's oldest sequence (preempted and retried ones are at the
// front).
func (s *Scheduler) nextWaitingLocked(r *genReplica) *sequence {
	levels := s.waitingLevelsLocked(r)
	if len(levels) == 0 {
		return nil
	}
	return levels[r.gq.pickLevel(levels)]
}

// waitingLevelsLocked returns, for each priority level with a waiting
// sequence r may run, the one it would admit of that level, highest level
// first.
func (s *Scheduler) waitingLevelsLocked(r *genReplica) []*sequence {
	gq := r.gq
	var levels []*sequence // few: one per level
	for el := gq.waiting.Front(); el != nil; el = el.Next() {
		seq := el.Value.(*sequence)
		if !seq.matches(r) || (seq.exclude == r && len(gq.replicas) > 1) {
			continue
		}
		i, found := slices.BinarySearchFunc(levels, seq.priority, func(l *sequence, p int) int { return cmp.Compare(p, l.priority) })
		switch {
		case !found:
			levels = slices.Insert(levels, i, seq)
		case gq.served[seq.client] < gq.served[levels[i].client]:
			levels[i] = seq
		}
	}
	return levels
}

// pickLevel returns the index in levels (waitingLevelsLocked's) of the
// level admitted next: the highest, unless a lower one is owed an
// admission (lowerLevelShare; the highest such one).
func (gq *genQueue) pickLevel(levels []*sequence) int {
	for k := 1; k < len(levels); k++ {
		if owedPick(gq.passed[levels[k].priority]) {
			return k
		}
	}
	return 0
}

// admitted counts the admission of levels[k]'s sequence: the lower levels
// that had one waiting were passed over, and its own level is owed
// nothing now.
func (gq *genQueue) admitted(levels []*sequence, k int) {
	delete(gq.passed, levels[k].priority)
	for _, o := range levels[k+1:] {
		gq.passed[o.priority]++
	}
}

// applyStepLocked delivers a step's tokens, or handles its failure.
func (s *Scheduler) applyStepLocked(r *genReplica, items []StepItem, seqs []*sequence, results []StepResult, err error, start, end time.Time) {
	gq := r.gq
	took := end.Sub(start)
	for _, seq := range seqs {
		seq.inStep = false
		if seq.finished {
			seq.wake() // its end waited for the step (nextLocked)
		}
	}
	if err != nil && s.closed {
		// Close cancelled the step: its sequences end as every other
		// one Close answers, not as a failure of the device.
		for _, seq := range seqs {
			if seq.r == r {
				s.releaseLocked(r, seq)
				s.finishSeqLocked(seq, fmt.Errorf("scheduler: %q: %w: scheduler closed", gq.name, ErrDraining), "", ReasonCancelled)
			}
		}
		return
	}
	if err != nil {
		s.failedLocked(&r.replicaCore, gq.name, err, end)
		for _, seq := range seqs {
			if seq.r != r {
				continue
			}
			r.stats.failed[ReasonBackend]++
			s.releaseLocked(r, seq)
			if seq.finished {
				continue
			}
			// A sequence that streamed nothing yet may start over elsewhere.
			if seq.generated == 0 && !seq.retried && slices.ContainsFunc(gq.replicas, func(o *genReplica) bool {
				return o != r && !o.removing && seq.matches(o)
			}) {
				seq.retried, seq.exclude = true, r
				s.requeueLocked(seq)
				continue
			}
			s.finishSeqLocked(seq, fmt.Errorf("scheduler: %q on %s: %w: %w", gq.name, r.dev.ID, ErrBackend, err), "", ReasonBackend)
		}
		return
	}
	s.succeededLocked(&r.replicaCore, gq.name)
	gq.stats.step(len(items), took)
	r.stats.step(len(items), took)
	// A step ran its items' tokens and the guesses after them.
	ran := make([]int, len(items))
	stepTokens, refused := 0, 0
	for i, it := range items {
		ran[i] = len(it.Tokens)
		if it.Sample && i < len(results) && results[i].Drafted > 0 {
			d, a := results[i].Drafted, len(results[i].Accepted)
			ran[i] += d
			refused += d - a
			r.m.drafted.Add(float64(d))
			r.m.accepted.Add(float64(a))
			gq.stats.drafts(d, a)
			r.stats.drafts(d, a)
		}
		stepTokens += ran[i]
	}
	// The rate that estimates how long queued work takes counts the
	// tokens that step gave, not the guesses it refused; clients are
	// charged (served) for every row they had computed.
	if secs := took.Seconds(); secs > 0 {
		rate := float64(stepTokens-refused) / secs
		if r.tokensPerS == 0 {
			r.tokensPerS = rate
		} else {
			r.tokensPerS += ewmaWeight * (rate - r.tokensPerS)
		}
	}
	r.m.step.Observe(took.Seconds())
	r.m.stepTokens.Observe(float64(stepTokens))
	stepCost := r.dev.CostPerHour / 3600 * took.Seconds()
	r.m.cost.Add(stepCost)
	for i, it := range items {
		seq := seqs[i]
		if gq.clients[seq.client] > 0 { // not a client forgotten during the step
			gq.served[seq.client] += int64(ran[i])
		}
		if seq.r != r || seq.finished {
			continue // answered during the step (cancelled, deadline): freed at the next plan
		}
		seq.computed += len(it.Tokens)
		seq.compute += took
		seq.cost += stepCost * float64(ran[i]) / float64(stepTokens)
		seq.maxBatch = max(seq.maxBatch, len(items))
		seq.lastDev, seq.lastDevType, seq.last = r.dev.ID, r.dev.Type, r
		if seq.generated == 0 && seq.preempted == 0 {
			if i < len(results) {
				seq.cachedPrompt = min(seq.cachedPrompt+results[i].Cached, seq.promptLen)
			}
			r.m.prompt.Add(float64(len(it.Tokens)))
			gq.stats.promptTokens(len(it.Tokens), end)
			r.stats.promptTokens(len(it.Tokens), end)
		}
		if !it.Sample {
			continue
		}
		res := results[i]
		if res.Pending != nil {
			// Sampled nothing: its last token runs again once the
			// executor is ready for it.
			seq.computed--
			seq.pending = res.Pending
			r.m.deferred.Inc()
			gq.stats.deferred++
			r.stats.deferred++
			go func() {
				<-res.Pending
				r.wake()
			}()
			continue
		}
		// Guesses taken are in the cache, and tokens of the sequence.
		seq.computed += len(res.Accepted)
		toks := res.Accepted
		if res.End == "" {
			toks = append(slices.Clip(toks), res.Token)
		}
		if len(toks) > 0 {
			s.tokensLocked(r, seq, toks, res.Out, end)
		}
		if res.End != "" {
			s.finishSeqLocked(seq, nil, res.End, "")
			s.releaseLocked(r, seq)
			continue
		}
		switch {
		case res.Stop:
			s.finishSeqLocked(seq, nil, FinishStop, "")
		case res.Full || seq.generated >= seq.maxNew:
			s.finishSeqLocked(seq, nil, FinishLength, "")
		}
		if seq.finished {
			s.releaseLocked(r, seq)
		}
	}
}

// tokensLocked adds the tokens a step sampled for seq (one, or more when
// it took guesses) and their output as one event. Tokens that came
// together share the time since the last: each counts its part of it as
// its inter-token latency.
func (s *Scheduler) tokensLocked(r *genReplica, seq *sequence, toks []int32, out any, end time.Time) {
	gq := r.gq
	seq.tokens = append(seq.tokens, toks...)
	seq.generated += len(toks)
	r.m.generated.Add(float64(len(toks)))
	var itl time.Duration // each token's share of the time since the last
	if !seq.firstToken.IsZero() {
		itl = end.Sub(seq.lastToken) / time.Duration(len(toks))
	}
	for range toks {
		if seq.firstToken.IsZero() {
			seq.firstToken = end
			ttft := end.Sub(seq.submitted)
			r.m.ttft.Observe(ttft.Seconds())
			gq.stats.token(ttft, true, end)
			r.stats.token(ttft, true, end)
			continue
		}
		r.m.itl.Observe(itl.Seconds())
		gq.stats.token(itl, false, end)
		r.stats.token(itl, false, end)
	}
	seq.lastToken = end
	seq.events = append(seq.events, GenEvent{HasToken: true, Token: toks[len(toks)-1], Out: out})
	seq.wake()
}

// genReplicaMetrics are the generation series of one (model, device).
type genReplicaMetrics struct {
	ttft, itl, step, stepTokens    prometheus.Observer
	prompt, generated, preemptions prometheus.Counter
	drafted, accepted, deferred    prometheus.Counter
	cost                           prometheus.Counter
}

// KVCacheReporter is what an executor with a paged KV cache may report of
// it (lifecycle's engine adapter does): Stats and the metrics show its
// blocks. The scheduler asks between steps, from the replica's loop.
type KVCacheReporter interface {
	// CacheBlocks returns the blocks held by sequences and the blocks in
	// all; cached blocks no sequence holds count as free.
	CacheBlocks() (used, total int)
}

// KVCacheTyper is what an executor may report of its KV cache's element
// type ("bf16", "q8_0", ...), which Stats shows beside its blocks.
type KVCacheTyper interface {
	KVCacheDType() string
}

// KVCache is a replica's KV cache in blocks, and its element type (empty
// when the executor does not say; a model's row: its replicas' distinct
// types, comma-separated).
type KVCache struct {
	UsedBlocks, TotalBlocks int
	DType                   string
	// PrefixHitTokens are the prompt tokens the prefix cache mapped
	// instead of computing, since the executor started (PrefixCacheReporter).
	PrefixHitTokens int64
}

// PrefixCacheReporter is what an executor with a prefix cache may report:
// the prompt tokens it mapped from blocks already computed (by an earlier
// sequence, or one earlier in the same step) instead of computing them.
type PrefixCacheReporter interface {
	PrefixHitTokens() int64
}

// sampleKVLocked reads r's KV cache, when its executor reports one.
func (s *Scheduler) sampleKVLocked(r *genReplica) {
	if kv, ok := r.exec.(KVCacheReporter); ok {
		r.kv.UsedBlocks, r.kv.TotalBlocks = kv.CacheBlocks()
	}
	if t, ok := r.exec.(KVCacheTyper); ok {
		r.kv.DType = t.KVCacheDType()
	}
	if p, ok := r.exec.(PrefixCacheReporter); ok {
		r.kv.PrefixHitTokens = p.PrefixHitTokens()
	}
}
