package pjrt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/runtime"
)

// ErrNoPlugin means no PJRT plugin for a device type was found or loaded.
var ErrNoPlugin = errors.New("no usable PJRT plugin")

// AdapterOptions configure the adapter.
type AdapterOptions struct {
	// Discovery says where plugins are found, as for Probe.
	Discovery Options
	// Registerer receives the compile metrics (brokerd_pjrt_compile_seconds
	// and brokerd_pjrt_compile_cache_lookups_total); nil keeps them
	// unexported.
	Registerer prometheus.Registerer
	// CacheSize bounds each client's compiled programs; 0 means
	// DefaultCacheSize.
	CacheSize int
	// Lower changes how graphs are lowered (AllowTF32).
	Lower LowerOptions
	// Identify returns what brokerd detected of a device ID (NVML's PCI bus
	// ID and UUID), so GPUs are matched exactly where a plugin exposes
	// them; nil, or empty strings, match by index.
	Identify func(id string) (pciBusID, uuid string)
	// ClientOptions replace PJRT_Client_Create's options per platform
	// ("cuda", "tpu"); values are string, int64, []int64, float32 or bool.
	ClientOptions map[string]map[string]any
}

// Adapter opens TPUs and GPUs through PJRT plugins. It implements
// runtime.Adapter. New loads nothing: a plugin is loaded and its client
// created on the first Open of a device of its type, so a host without
// plugins pays nothing.
type Adapter struct {
	opts    AdapterOptions
	metrics *compileMetrics

	mu      sync.Mutex
	clients map[string]*client // by device type
}

var _ runtime.Adapter = (*Adapter)(nil)

// New returns the PJRT adapter. It registers the compile metrics with
// opts.Registerer and panics if that registry holds different series of the
// same names, as prometheus.MustRegister does: a programming error.
func New(opts AdapterOptions) *Adapter {
	m, err := newCompileMetrics(opts.Registerer)
	if err != nil {
		panic(err)
	}
	return &Adapter{opts: opts, metrics: m, clients: map[string]*client{}}
}

// Name returns "pjrt".
func (a *Adapter) Name() string { return Name }

// Open opens a GPU ("gpu:N") or TPU ("tpu:N") through the first plugin of
// its platform that loads and creates a client, matching the device as
// MatchDevice says. spec.DType may be F32 (or 0) or BF16; spec.Threads is
// ignored.
func (a *Adapter) Open(ctx context.Context, spec runtime.DeviceSpec) (runtime.Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	typ, idx, err := ParseDeviceID(spec.ID)
	if err != nil {
		return nil, fmt.Errorf("pjrt: open: %w", err)
	}
	switch spec.DType {
	case 0, runtime.F32, runtime.BF16:
	default:
		return nil, fmt.Errorf("pjrt: open %s: compute type %s: %w", spec.ID, spec.DType, runtime.ErrUnsupported)
	}
	c, err := a.client(ctx, typ)
	if err != nil {
		return nil, fmt.Errorf("pjrt: open %s: %w", spec.ID, err)
	}
	t := Target{Type: typ, Index: idx}
	if a.opts.Identify != nil {
		t.PCIBusID, t.UUID = a.opts.Identify(spec.ID)
	}
	i, how, err := MatchDevice(t, c.info.Devices)
	if err != nil {
		return nil, fmt.Errorf("pjrt: open %s on %s (%s): %w", spec.ID, c.info.Plugin, c.info.Path, err)
	}
	return newDevice(spec, c, i, how, a.opts.Lower), nil
}

// Describe creates (or reuses) the client for a device type and returns what
// it reports: platform, versions and devices.
func (a *Adapter) Describe(ctx context.Context, deviceType string) (ClientInfo, error) {
	c, err := a.client(ctx, deviceType)
	if err != nil {
		return ClientInfo{}, fmt.Errorf("pjrt: %s: %w", deviceType, err)
	}
	return c.info, nil
}

// client returns the client for a device type, creating it from the first
// plugin of that type that works. A failure is not cached: the next Open
// tries again.
func (a *Adapter) client(ctx context.Context, typ string) (*client, error) {
	if typ != runtime.DeviceGPU && typ != runtime.DeviceTPU {
		return nil, fmt.Errorf("PJRT drives gpu and tpu devices, not %q", typ)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.clients[typ]; ok {
		return c, nil
	}
	found, err := Discover(a.opts.Discovery)
	if err != nil {
		return nil, err
	}
	var tried pluginErrors
	for _, cand := range found.Plugins {
		if deviceType(Platform(cand.Name)) != typ {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c, err := a.newClient(cand)
		if err != nil {
			tried = append(tried, fmt.Errorf("%s (%s): %w", cand.Name, cand.Path, err))
			continue
		}
		a.clients[typ] = c
		return c, nil
	}
	if len(tried) == 0 {
		return nil, fmt.Errorf("%w for %s (searched: %s)", ErrNoPlugin, typ, strings.Join(found.Searched, ", "))
	}
	return nil, fmt.Errorf("%w for %s: %w", ErrNoPlugin, typ, tried)
}

// pluginErrors are the failures of every plugin tried, on one line, each
// one reachable with errors.Is.
type pluginErrors []error

func (e pluginErrors) Error() string {
	parts := make([]string, len(e))
	for i, err := range e {
		parts[i] = err.Error()
	}
	return strings.Join(parts, "; ")
}

func (e pluginErrors) Unwrap() []error { return e }

func (a *Adapter) newClient(cand Candidate) (*client, error) {
	p, err := openPlugin(cand.Path)
	if err != nil {
		return nil, err
	}
	return newClient(p, cand, a.opts, a.metrics)
}
