package onednn

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/runtime"
)

// primMetrics are the primitive cache's Prometheus series. Creating a
// primitive JIT-compiles its kernel (milliseconds for a large matmul), so a
// workload whose shapes keep changing shows up here before it shows up as
// latency.
type primMetrics struct {
	create  *prometheus.HistogramVec // by device
	lookups *prometheus.CounterVec   // by device, result: hit or miss
}

func newPrimMetrics(reg prometheus.Registerer) (*primMetrics, error) {
	m := &primMetrics{
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "brokerd_onednn_primitive_create_seconds",
			Help:    "Time to create (JIT-compile) one oneDNN primitive for a new shape.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 8), // 100µs to ~1.6s
		}, []string{"device"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brokerd_onednn_primitive_cache_lookups_total",
			Help: "Primitive cache lookups by result (hit or miss).",
		}, []string{"device", "result"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.create, err = runtime.RegisterCollector(reg, m.create); err != nil {
		return nil, fmt.Errorf("onednn: register metrics: %w", err)
	}
	if m.lookups, err = runtime.RegisterCollector(reg, m.lookups); err != nil {
		return nil, fmt.Errorf("onednn: register metrics: %w", err)
	}
	return m, nil
}
