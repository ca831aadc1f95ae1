package lifecycle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
)

// Options are the inputs of model placement.
type Options struct {
	Adapters map[string]runtime.Adapter // runtime name → adapter
	Factors  detect.Factors
	// MaxBatch caps every plan's max batch when > 0 (benchmarks compare
	// batching against max_batch 1 with it).
	MaxBatch int
	// Select orders the device types a repository model is placed on.
	Select detect.Policy
	// MaxBatchTokens bounds the tokens of one batch of a text model whose
	// own configuration sets no bound.
	MaxBatchTokens int
	// Entries returns the devices' current state (cordons, health) at load
	// time; nil keeps the state seen at start.
	Entries func() []detect.Entry
	// DTypes is the compute type to open each device type with
	// (--compute-dtype); F32 for types it lacks.
	DTypes map[detect.Type]runtime.DType
	// KVCacheDType is generators' KV cache type (--kv-cache-dtype): F32,
	// BF16, F16, Q8_0 or Q4_0, or 0 for each engine's own choice (bf16 for
	// block-quantized weights a device keeps so or a device computing in
	// bf16, else f32). A device that cannot hold the type asked for (f16
	// or a block type on a GPU) gets its own choice, with a warning.
	KVCacheDType runtime.DType
	// SpecTokens is the most tokens a generator's decoding sequence guesses
	// per step by prompt lookup (--speculative-tokens; 0: off), while a
	// replica runs at most SpecMaxRunning sequences
	// (--speculative-max-running; 0: scheduler.DefaultSpecMaxRunning).
	SpecTokens, SpecMaxRunning int
}

// Set is what brokerd serves: the built-in encoder and the loaded
// repository models, the devices they run on, and their replicas.
type Set struct {
	defaultModel string
	table        atomic.Pointer[nameTable]
	repo         Repository // nil: the built-in encoder only
	sched        Host
	opts         Options
	log          *zap.Logger

	// dtypes is each open device's compute type by ID. Written by
	// openDevices only, before anything serves, so ListDevices reads it
	// without mu (which a load holds for seconds).
	dtypes map[string]runtime.DType

	// mu serialises the changes to what serves (a load's placement, an
	// unload, close) and guards what follows. A load reads its files
	// without it (loads): a model of gigabytes takes minutes to verify and
	// read, and other models' loads and unloads need not wait for that.
	mu sync.Mutex
	// loads are the loads under way, by name, each closed when it ends: a
	// second load or an unload of the name waits for it.
	loads    map[string]chan struct{}
	devices  []openDevice
	reserved map[string]int64 // device ID → bytes reserved by replicas
	reloads  int              // reloads of a served version so far: queue keys of their own
	closed   bool
	// retiring are instances out of service whose accepted requests are
	// still running (retireLocked): they keep their replicas and memory
	// until those are done.
	retiring map[*Served]chan struct{}

	stMu    sync.Mutex
	pending map[string]string // name → "loading" or "unloading"
	lastErr map[string]string // name → why its last load failed
}

// DefaultModel is the model Encode serves when a request names none.
func (ms *Set) DefaultModel() string { return ms.defaultModel }

// Open opens the devices and gives each built-in model a Replica on
// every device whose budget admits it.
func Open(ctx context.Context, entries []detect.Entry, builtins []Encoder, sched Host, repo Repository, opts Options, log *zap.Logger) (*Set, error) {
	ms := openDevices(ctx, entries, sched, repo, opts, log)
	if len(builtins) > 0 {
		ms.defaultModel = builtins[0].Name()
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, m := range builtins {
		kind := builtinServable{m}
		s := &Served{Info: kind.info(), Key: m.Name(), Label: m.Name(), kind: kind, gate: newGate()}
		// Every open device is one tier: a built-in goes wherever its
		// budget admits it, not only on the preferred type.
		p, err := ms.placeLocked(ctx, s, [][]openDevice{ms.devices})
		if err != nil {
			return ms, err
		}
		for _, r := range p.refusals {
			log.Warn("model not placed: device budget too small", zap.String("model", m.Name()), zap.String("refusal", r))
		}
		for _, err := range p.failures {
			log.Warn("model Replica failed", zap.String("model", m.Name()), zap.Error(err))
		}
		ms.publishLocked(s.Info.Name, s)
	}
	return ms, nil
}

// Close frees every Replica, then the devices.
func (ms *Set) Close() error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.closed = true
	var errs []error
	for _, s := range ms.table.Load().byName {
		for _, p := range s.replicas {
			errs = append(errs, p.r.Close())
		}
	}
	for s := range ms.retiring {
		for _, p := range s.replicas {
			errs = append(errs, p.r.Close())
		}
	}
	ms.table.Store(&nameTable{byName: map[string]*Served{}})
	for _, od := range ms.devices {
		errs = append(errs, od.dev.Close())
	}
	return errors.Join(errs...)
}
