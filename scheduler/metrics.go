package scheduler

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// metrics are the scheduler's Prometheus series. They exist whether or not
// a Registerer was given, so the code that moves them has no nil checks.
//
// The model label is the model version's name (WithName), the same in
// every series; queues that share it (the instances of a hot reload) share
// their series. Gauges of state are read at scrape time (stateCollector).
type metrics struct {
	requestDur, queueDur, computeDur, batchSize *prometheus.HistogramVec
	running                                     *prometheus.GaugeVec
	failures, items, cost, abandoned            *prometheus.CounterVec
	gen                                         genMetrics
	state                                       *stateCollector
}

// genMetrics are the generation series (continuous batching).
type genMetrics struct {
	ttft, itl, step, stepTokens    *prometheus.HistogramVec
	prompt, generated, preemptions *prometheus.CounterVec
	// Speculative decoding: tokens guessed and run, and those taken
	// (vLLM's spec_decode_num_draft_tokens and _accepted_tokens).
	drafted, accepted *prometheus.CounterVec
	// Samples a step put off for the executor's sake (a grammar's mask
	// not done: StepResult.Pending).
	deferred *prometheus.CounterVec
	cost     *prometheus.CounterVec // shared with batches
	// Per model: sequences that ended well by finish reason, and their
	// end-to-end latency (vLLM's request_success_total and
	// e2e_request_latency_seconds).
	success *prometheus.CounterVec
	e2e     *prometheus.HistogramVec
}

// finished counts a sequence that ended well.
func (g genMetrics) finished(model, reason string, total time.Duration) {
	g.success.WithLabelValues(model, reason).Inc()
	g.e2e.WithLabelValues(model).Observe(total.Seconds())
}

func (g genMetrics) forReplica(model, device string) genReplicaMetrics {
	return genReplicaMetrics{
		ttft:        g.ttft.WithLabelValues(model, device),
		itl:         g.itl.WithLabelValues(model, device),
		step:        g.step.WithLabelValues(model, device),
		stepTokens:  g.stepTokens.WithLabelValues(model, device),
		prompt:      g.prompt.WithLabelValues(model, device),
		generated:   g.generated.WithLabelValues(model, device),
		preemptions: g.preemptions.WithLabelValues(model, device),
		drafted:     g.drafted.WithLabelValues(model, device),
		accepted:    g.accepted.WithLabelValues(model, device),
		deferred:    g.deferred.WithLabelValues(model, device),
		cost:        g.cost.WithLabelValues(model, device),
	}
}

// replicaMetrics are the series of one (model, device), resolved once so the
// hot path does no label lookups.
type replicaMetrics struct {
	request, queue, compute, batch prometheus.Observer
	items, cost, abandoned         prometheus.Counter
	running                        prometheus.Gauge
}

// latencyBuckets span 100µs to about 52s.
var latencyBuckets = prometheus.ExponentialBuckets(100e-6, 2, 20)

func newMetrics(reg prometheus.Registerer, log *zap.Logger) *metrics {
	md := []string{"model", "device"}
	hist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "brokerd", Name: name, Help: help, Buckets: buckets,
		}, md)
	}
	m := &metrics{
		requestDur: hist("request_duration_seconds", "Time from Submit until a request's last item was done, by the device that ran most of it.", latencyBuckets),
		queueDur:   hist("queue_duration_seconds", "Time each item waited in the queue before its batch started.", latencyBuckets),
		computeDur: hist("compute_duration_seconds", "Executor time per batch.", latencyBuckets),
		batchSize:  hist("batch_size", "Items per executed batch.", prometheus.ExponentialBuckets(1, 2, 13)),
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "brokerd", Name: "running_batches", Help: "Batches executing now.",
		}, md),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "brokerd", Name: "request_failures_total", Help: "Failed requests by reason: rejected, cancelled, timeout, backend.",
		}, []string{"model", "reason"}),
		items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "brokerd", Name: "items_completed_total", Help: "Items executed successfully.",
		}, md),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "brokerd", Name: "cost_usd_total", Help: "Device cost of executed batches, in US dollars.",
		}, md),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "brokerd", Name: "batches_abandoned_total", Help: "Batches that ran past the batch timeout: their items were retried elsewhere or failed, and the replica marked unhealthy.",
		}, md),
	}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "brokerd", Subsystem: "generation", Name: name, Help: help}, md)
	}
	genHist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "brokerd", Subsystem: "generation", Name: name, Help: help, Buckets: buckets}, md)
	}
	m.gen = genMetrics{
		ttft:        genHist("time_to_first_token_seconds", "Time from Generate until a sequence's first token.", latencyBuckets),
		itl:         genHist("inter_token_seconds", "Time between consecutive tokens of a sequence.", latencyBuckets),
		step:        genHist("step_seconds", "Executor time per generation step.", latencyBuckets),
		stepTokens:  genHist("step_tokens", "Tokens per generation step (decode tokens and prefill chunks).", prometheus.ExponentialBuckets(1, 2, 15)),
		prompt:      counter("prompt_tokens_total", "Prompt tokens prefilled (recomputation after a preemption not counted)."),
		generated:   counter("generated_tokens_total", "Tokens generated."),
		preemptions: counter("preemptions_total", "Running sequences preempted for KV-cache room (recomputed later)."),
		drafted:     counter("spec_decode_draft_tokens_total", "Tokens guessed by prompt lookup and run after a decoding sequence's token (speculative decoding)."),
		accepted:    counter("spec_decode_accepted_tokens_total", "Guessed tokens the sequence sampled anyway: tokens gained without a step of their own."),
		deferred:    counter("deferred_samples_total", "Sequences a step ran without sampling them, because their grammar's mask was not done when the step's other sequences were (each runs its last token again once it is): a grammar slower than the model slows its own sequences only."),
		cost:        m.cost,
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "brokerd", Subsystem: "generation", Name: "request_success_total",
			Help: "Sequences that ended well, by finish reason: stop (an end-of-sequence token or a stop string), length (max tokens, or the context or KV cache full), deadline. Failed ones are in brokerd_request_failures_total.",
		}, []string{"model", "finished_reason"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "brokerd", Subsystem: "generation", Name: "e2e_request_latency_seconds",
			Help: "Time from Generate until a sequence's last token, of the sequences that ended well.", Buckets: latencyBuckets,
		}, []string{"model"}),
	}
	m.state = newStateCollector()
	if reg == nil {
		return m
	}
	// A second Scheduler on the same registry (tests, a restart in
	// process) shares the first one's series instead of failing.
	m.requestDur = register(reg, log, m.requestDur)
	m.queueDur = register(reg, log, m.queueDur)
	m.computeDur = register(reg, log, m.computeDur)
	m.batchSize = register(reg, log, m.batchSize)
	m.running = register(reg, log, m.running)
	m.failures = register(reg, log, m.failures)
	m.items = register(reg, log, m.items)
	m.cost = register(reg, log, m.cost)
	m.abandoned = register(reg, log, m.abandoned)
	m.gen.cost = m.cost
	m.gen.ttft = register(reg, log, m.gen.ttft)
	m.gen.itl = register(reg, log, m.gen.itl)
	m.gen.step = register(reg, log, m.gen.step)
	m.gen.stepTokens = register(reg, log, m.gen.stepTokens)
	m.gen.prompt = register(reg, log, m.gen.prompt)
	m.gen.generated = register(reg, log, m.gen.generated)
	m.gen.preemptions = register(reg, log, m.gen.preemptions)
	m.gen.drafted = register(reg, log, m.gen.drafted)
	m.gen.deferred = register(reg, log, m.gen.deferred)
	m.gen.accepted = register(reg, log, m.gen.accepted)
	m.gen.success = register(reg, log, m.gen.success)
	m.gen.e2e = register(reg, log, m.gen.e2e)
	m.state = register(reg, log, m.state)
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, log *zap.Logger, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	log.Warn("scheduler metric not registered", zap.Error(err))
	return c
}

func (m *metrics) forReplica(model, device string) replicaMetrics {
	return replicaMetrics{
		request:   m.requestDur.WithLabelValues(model, device),
		queue:     m.queueDur.WithLabelValues(model, device),
		compute:   m.computeDur.WithLabelValues(model, device),
		batch:     m.batchSize.WithLabelValues(model, device),
		items:     m.items.WithLabelValues(model, device),
		cost:      m.cost.WithLabelValues(model, device),
		abandoned: m.abandoned.WithLabelValues(model, device),
		running:   m.running.WithLabelValues(model, device),
	}
}

// deleter is what every vector has for removing a series.
type deleter interface {
	DeleteLabelValues(lvs ...string) bool
	DeletePartialMatch(labels prometheus.Labels) int
}

// forgetReplica removes the (model, device) series of a replica that was
// removed, batch and generation alike.
func (m *metrics) forgetReplica(model, device string) {
	for _, v := range []deleter{
		m.requestDur, m.queueDur, m.computeDur, m.batchSize, m.running, m.items, m.cost, m.abandoned,
		m.gen.ttft, m.gen.itl, m.gen.step, m.gen.stepTokens, m.gen.prompt, m.gen.generated, m.gen.preemptions,
		m.gen.drafted, m.gen.accepted, m.gen.deferred,
	} {
		v.DeleteLabelValues(model, device)
	}
}

// forgetModel removes the per-model series of a model no queue serves.
func (m *metrics) forgetModel(model string) {
	for _, v := range []deleter{m.failures, m.gen.success, m.gen.e2e} {
		v.DeletePartialMatch(prometheus.Labels{"model": model})
	}
}

func (m *metrics) requestDuration(model, device string) prometheus.Observer {
	return m.requestDur.WithLabelValues(model, device)
}

func (m *metrics) failed(model, reason string) { m.failures.WithLabelValues(model, reason).Inc() }

// stateCollector reports the gauges of state at scrape time, from the
// schedulers' queues and replicas: what is queued, running and held now.
// Series of a model or replica that is gone are not reported, and queues
// that share a model name (a hot reload's instances, schedulers sharing a
// registry) are summed.
//
// The generation gauges per model are the model-server protocol's (the
// Gateway API Inference Extension's endpoint picker reads them):
// TotalQueuedRequests is brokerd_generation_waiting_sequences,
// TotalRunningRequests brokerd_generation_model_running_sequences, and
// KVCacheUtilization brokerd_generation_kv_cache_usage_ratio (0 to 1).
type stateCollector struct {
	depth, running, waiting, kvBlocks, modelRunning, kvUsage, prefixHits *prometheus.Desc

	mu     sync.Mutex
	scheds []*Scheduler
}

func newStateCollector() *stateCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &stateCollector{
		depth:   d("brokerd_queue_depth_items", "Items queued per model.", "model"),
		running: d("brokerd_generation_running_sequences", "Sequences in a replica's running set.", "model", "device"),
		waiting: d("brokerd_generation_waiting_sequences",
			"Sequences waiting to be admitted, preempted ones included, per model: the model-server protocol's TotalQueuedRequests.", "model"),
		kvBlocks: d("brokerd_generation_kv_cache_blocks",
			"KV-cache blocks of each generator replica: used (held by sequences; cached blocks no sequence holds count as free) and total.",
			"model", "device", "state"),
		modelRunning: d("brokerd_generation_model_running_sequences",
			"Sequences in the running sets of all the model's replicas: the model-server protocol's TotalRunningRequests.", "model"),
		kvUsage: d("brokerd_generation_kv_cache_usage_ratio",
			"Fraction of the model's KV-cache blocks held by sequences, over all its replicas, 0 to 1 (cached blocks no sequence holds count as free): the model-server protocol's KVCacheUtilization.",
			"model"),
		prefixHits: d("brokerd_generation_prefix_cache_hit_tokens_total",
			"Prompt tokens each generator replica's prefix cache mapped from blocks already computed instead of computing them (vLLM's prefix_cache_hits), since the replica started.",
			"model", "device"),
	}
}

func (c *stateCollector) add(s *Scheduler) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scheds = append(c.scheds, s)
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.depth, c.running, c.waiting, c.kvBlocks, c.modelRunning, c.kvUsage, c.prefixHits} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	type dev struct{ model, device string }
	type genModel struct {
		waiting, running int
		kv               KVCache
	}
	depth := map[string]int{}
	gens := map[string]*genModel{}
	running := map[dev]int{}
	kv := map[dev]KVCache{}
	c.mu.Lock()
	scheds := slices.Clone(c.scheds)
	c.mu.Unlock()
	for _, s := range scheds {
		s.mu.Lock()
		for _, mq := range s.models {
			depth[mq.label] += mq.depth
		}
		for _, gq := range s.gens {
			g := gens[gq.label]
			if g == nil {
				g = &genModel{}
				gens[gq.label] = g
			}
			g.waiting += gq.waiting.Len()
			for _, r := range gq.replicas {
				k := dev{gq.label, r.dev.ID}
				running[k] += len(r.running)
				g.running += len(r.running)
				if r.kv.TotalBlocks > 0 {
					b := kv[k]
					b.UsedBlocks += r.kv.UsedBlocks
					b.TotalBlocks += r.kv.TotalBlocks
					b.PrefixHitTokens += r.kv.PrefixHitTokens
					kv[k] = b
					g.kv.UsedBlocks += r.kv.UsedBlocks
					g.kv.TotalBlocks += r.kv.TotalBlocks
				}
			}
		}
		s.mu.Unlock()
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, model := range slices.Sorted(maps.Keys(depth)) {
		gauge(c.depth, float64(depth[model]), model)
	}
	for _, model := range slices.Sorted(maps.Keys(gens)) {
		g := gens[model]
		gauge(c.waiting, float64(g.waiting), model)
		gauge(c.modelRunning, float64(g.running), model)
		if g.kv.TotalBlocks > 0 {
			gauge(c.kvUsage, float64(g.kv.UsedBlocks)/float64(g.kv.TotalBlocks), model)
		}
	}
	for k, n := range running {
		gauge(c.running, float64(n), k.model, k.device)
	}
	for k, b := range kv {
		gauge(c.kvBlocks, float64(b.UsedBlocks), k.model, k.device, "used")
		gauge(c.kvBlocks, float64(b.TotalBlocks), k.model, k.device, "total")
		ch <- prometheus.MustNewConstMetric(c.prefixHits, prometheus.CounterValue, float64(b.PrefixHitTokens), k.model, k.device)
	}
}
