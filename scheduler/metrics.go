package scheduler

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// metrics are the scheduler's Prometheus series. They exist whether or not
// a Registerer was given, so the code that moves them has no nil checks.
type metrics struct {
	requestDur, queueDur, computeDur, batchSize *prometheus.HistogramVec
	depth, running                              *prometheus.GaugeVec
	failures, items, cost, abandoned            *prometheus.CounterVec
	gen                                         genMetrics
}

// genMetrics are the generation series (continuous batching).
type genMetrics struct {
	ttft, itl, step, stepTokens    *prometheus.HistogramVec
	prompt, generated, preemptions *prometheus.CounterVec
	running, waiting               *prometheus.GaugeVec
	cost                           *prometheus.CounterVec // shared with batches
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
		cost:        g.cost.WithLabelValues(model, device),
		running:     g.running.WithLabelValues(model, device),
	}
}

// gaugeSetter is the part of a gauge the queue depth needs.
type gaugeSetter interface{ Set(float64) }

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
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "brokerd", Name: "queue_depth_items", Help: "Items queued per model.",
		}, []string{"model"}),
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
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "brokerd", Subsystem: "generation", Name: "running_sequences", Help: "Sequences in a replica's running set.",
		}, md),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "brokerd", Subsystem: "generation", Name: "waiting_sequences", Help: "Sequences waiting to be admitted, per model.",
		}, []string{"model"}),
		cost: m.cost,
	}
	if reg == nil {
		return m
	}
	// A second Scheduler on the same registry (tests, a restart in
	// process) shares the first one's series instead of failing.
	m.requestDur = register(reg, log, m.requestDur)
	m.queueDur = register(reg, log, m.queueDur)
	m.computeDur = register(reg, log, m.computeDur)
	m.batchSize = register(reg, log, m.batchSize)
	m.depth = register(reg, log, m.depth)
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
	m.gen.running = register(reg, log, m.gen.running)
	m.gen.waiting = register(reg, log, m.gen.waiting)
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
		m.gen.ttft, m.gen.itl, m.gen.step, m.gen.stepTokens, m.gen.prompt, m.gen.generated, m.gen.preemptions, m.gen.running,
	} {
		v.DeleteLabelValues(model, device)
	}
}

// forgetModel removes the per-model series of a model no replica serves.
func (m *metrics) forgetModel(model string) {
	m.depth.DeleteLabelValues(model)
	m.gen.waiting.DeleteLabelValues(model)
	m.failures.DeletePartialMatch(prometheus.Labels{"model": model})
}

func (m *metrics) requestDuration(model, device string) prometheus.Observer {
	return m.requestDur.WithLabelValues(model, device)
}

func (m *metrics) depthGauge(model string) gaugeSetter { return m.depth.WithLabelValues(model) }

func (m *metrics) failed(model, reason string) { m.failures.WithLabelValues(model, reason).Inc() }
