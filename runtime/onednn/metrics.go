package onednn

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/runtime"
)

// primMetrics are the primitive cache's Prometheus series, and the weight
// relayouts'. Creating a primitive JIT-compiles its kernel (milliseconds
// for a large matmul), so a workload whose shapes keep changing shows up
// here before it shows up as latency. Weights are relaid in place on their
// first product (packed.go, qx16.go) and back when something else reads
// them: a model's load (its warm-up step) relays each weight once, and
// relayouts that keep growing afterwards mean a weight is read two ways.
type primMetrics struct {
	create       *prometheus.HistogramVec // by device
	lookups      *prometheus.CounterVec   // by device, result: hit or miss
	relaid       *prometheus.CounterVec   // bytes, by device and layout: packed, relaid16, row-major
	relaySeconds *prometheus.CounterVec   // by device
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
		relaid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brokerd_onednn_weight_relayout_bytes_total",
			Help: "Weight bytes rewritten in place into a layout (packed: oneDNN's kernel; relaid16: quantized blocks by 16 rows; row-major: back).",
		}, []string{"device", "layout"}),
		relaySeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brokerd_onednn_weight_relayout_seconds_total",
			Help: "Time spent rewriting weights into another layout.",
		}, []string{"device"}),
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
	if m.relaid, err = runtime.RegisterCollector(reg, m.relaid); err != nil {
		return nil, fmt.Errorf("onednn: register metrics: %w", err)
	}
	if m.relaySeconds, err = runtime.RegisterCollector(reg, m.relaySeconds); err != nil {
		return nil, fmt.Errorf("onednn: register metrics: %w", err)
	}
	return m, nil
}

// Layouts a weight is relaid into, brokerd_onednn_weight_relayout_bytes_total's
// layout label.
const (
	layoutPacked   = "packed"
	layoutRelaid16 = "relaid16"
	layoutRowMajor = "row-major"
)

// relaid counts a relayout of n bytes into layout that began at began.
// Runs on the worker thread.
func (d *Device) relaid(layout string, n int64, began time.Time) {
	d.relayBytes[layout].Add(float64(n))
	d.relaySeconds.Add(time.Since(began).Seconds())
}
