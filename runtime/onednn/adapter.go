package onednn

import (
	"context"
	"fmt"
	goruntime "runtime"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/runtime"
)

// DefaultCacheSize is the number of created primitives a device keeps when
// Options.CacheSize is 0.
const DefaultCacheSize = 256

// maxPlans bounds each device's cache of checked graph plans: a model
// keeps one graph per padded shape, and graphs built afresh each run (the
// LLM engine's steps) only cycle through it.
const maxPlans = 128

// Options configure the adapter.
type Options struct {
	// CacheSize bounds each device's cache of created oneDNN primitives
	// (least recently used ones are destroyed); 0 means DefaultCacheSize.
	CacheSize int
	// Registerer receives the primitive cache metrics
	// (brokerd_onednn_primitive_cache_lookups_total and
	// brokerd_onednn_primitive_create_seconds) and the weight relayouts'
	// (brokerd_onednn_weight_relayout_bytes_total and _seconds_total) when
	// non-nil.
	Registerer prometheus.Registerer
	// NoAMX keeps products of quantized weights off the AMX tiles (qamx.c)
	// on a CPU that has them: qgemm and oneDNN's dequantized slices run as
	// on a CPU without AMX (comparisons, troubleshooting).
	NoAMX bool
	// NoAMXInt8 keeps Q8_0's products of up to 16 rows on qamx's bf16
	// panels where they would run on AMX-INT8 (comparisons).
	NoAMXInt8 bool
	// NoX16 keeps block-quantized weights in GGUF's layout, multiplied by
	// qgemm's row kernel, where they would be relaid by 16 rows for its
	// VNNI kernels (comparisons).
	NoX16 bool
	// AMXRelaid relays those weights on a CPU with AMX too, where they
	// otherwise keep GGUF's layout for qamx.c: products of fewer than
	// qamxX16Rows rows then run qgemm's VNNI kernel on the relaid tiles,
	// and larger ones qamx, which decodes its panels from them
	// (bd_qamx_panel's test holds those panels to GGUF's bit for bit).
	// Off by default: on a 16-core AMX Xeon, Q8_0's single-stream decode
	// ran 0.65-0.83 as fast relaid in four runs of five, and the K types'
	// moved no more than two runs of one setting did (bench/RESULTS.md).
	// For comparisons.
	AMXRelaid bool
}

// Adapter opens CPU devices on oneDNN. It implements runtime.Adapter.
type Adapter struct {
	opts    Options
	metrics *primMetrics
}

var _ runtime.Adapter = (*Adapter)(nil)

// New returns the oneDNN adapter. It registers the primitive cache metrics
// with opts.Registerer and panics if that registry holds different series
// of the same names, as prometheus.MustRegister does: a programming error.
func New(opts Options) *Adapter {
	if opts.CacheSize <= 0 {
		opts.CacheSize = DefaultCacheSize
	}
	m, err := newPrimMetrics(opts.Registerer)
	if err != nil {
		panic(err)
	}
	return &Adapter{opts: opts, metrics: m}
}

// Name returns "onednn".
func (a *Adapter) Name() string { return Name }

// Open creates the device's engine and stream on a dedicated OS thread that
// will run all its work. spec.ID must be a CPU device ("cpu:0"; empty means
// that). spec.Threads is the OpenMP thread count for this device's work
// (Debian's oneDNN threads with OpenMP); 0 means every CPU Go may run on.
// A spec.DType of BF16 is refused with runtime.ErrUnsupported where oneDNN
// cannot run bf16 matmuls.
func (a *Adapter) Open(ctx context.Context, spec runtime.DeviceSpec) (runtime.Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if spec.ID == "" {
		spec.ID = runtime.DeviceCPU + ":0"
	}
	if !strings.HasPrefix(spec.ID, runtime.DeviceCPU+":") {
		return nil, fmt.Errorf("onednn: open %q: not a CPU device", spec.ID)
	}
	if spec.Threads < 0 {
		return nil, fmt.Errorf("onednn: open %s: negative thread count %d", spec.ID, spec.Threads)
	}
	if spec.Threads == 0 {
		spec.Threads = goruntime.NumCPU()
	}
	switch spec.DType {
	case 0, runtime.F32, runtime.BF16:
	default:
		return nil, fmt.Errorf("onednn: open %s: compute type %s: %w", spec.ID, spec.DType, runtime.ErrUnsupported)
	}
	d, err := openDevice(spec, a.opts.CacheSize, a.metrics)
	if err != nil {
		return nil, err
	}
	if a.opts.NoAMX {
		d.qAMXRows = 0 // before any Run hands the worker work
	}
	if a.opts.NoX16 {
		d.x16 = false
	}
	d.amxX16 = a.opts.AMXRelaid
	if a.opts.NoAMXInt8 {
		d.qamxFlags = qamxNoInt8
	}
	if spec.DType == runtime.BF16 && d.bf16Err != nil {
		d.Close()
		return nil, fmt.Errorf("onednn: open %s with bf16: %w", spec.ID, d.bf16Err)
	}
	return d, nil
}
