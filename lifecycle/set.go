package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/repo"
	"github.com/brokerd/brokerd/scheduler"
)

// Repository is what model management needs of the model repository
// (runtime/models/repo): what it holds, and a loaded model of it.
type Repository interface {
	// List describes every model directory, loadable or not.
	List() ([]RepoEntry, error)
	// Load reads one version of a model (0: the highest loadable one).
	Load(ctx context.Context, name string, version int64) (Loaded, error)
	// Fingerprint identifies a version's files as they are on disk now,
	// without reading them: a change means a reload must read them again.
	Fingerprint(name string, version int64) (string, error)
	// Canonical is the name a model is served under: an Ollama store's
	// model answers to several (qwen2.5, qwen2.5:latest,
	// library/qwen2.5:latest); other names are their own.
	Canonical(name string) string
}

// Loaded is a model read from the repository and the version it is:
// a batch model, or a decoder LLM.
type Loaded struct {
	Model       models.Model
	LLM         *llm.Model
	Version     int64
	Fingerprint string // of the files it was read from (Repository.Fingerprint)
}

// RepoEntry is one model of the repository.
type RepoEntry struct {
	Name     string
	Kind     string
	Versions []int64 // loadable versions, ascending
	Err      string  // why the model (or its newest version) cannot load
	// Details describe the newest loadable version's files (format, size,
	// parameters, quantization).
	Details repo.Details
}

// Host is what placement needs of the scheduler.
type Host interface {
	AddReplica(model string, dev scheduler.Device, maxBatch int, exec scheduler.Executor, opts ...scheduler.ReplicaOption) error
	RemoveReplica(ctx context.Context, model, deviceID string) error
	AddGenReplica(model string, dev scheduler.Device, opts scheduler.GenOptions, exec scheduler.GenExecutor, ropts ...scheduler.ReplicaOption) error
	RemoveGenReplica(ctx context.Context, model, deviceID string) error
}

// Errors of model management; the gRPC edge (server) maps them to codes.
var (
	ErrModelNotFound  = errors.New("model not found")
	ErrModelNotLoaded = errors.New("model not loaded")
	ErrBuiltinModel   = errors.New("built-in model")
)

// missingError is a model (or version) that does not serve, explained in
// one message that says "not found" or "not loaded" once: it matches its
// sentinel (ErrModelNotFound or ErrModelNotLoaded) without repeating the
// sentinel's text after its own.
type missingError struct {
	msg      string
	sentinel error
}

func (e *missingError) Error() string        { return e.msg }
func (e *missingError) Is(target error) bool { return target == e.sentinel }

func notFound(format string, args ...any) error {
	return &missingError{msg: fmt.Sprintf(format, args...), sentinel: ErrModelNotFound}
}

func notLoaded(format string, args ...any) error {
	return &missingError{msg: fmt.Sprintf(format, args...), sentinel: ErrModelNotLoaded}
}

// AdmissionError refuses a load no device's memory budget can take.
type AdmissionError struct {
	Model   string
	Version int64
	Need    int64    // bytes one Replica needs (the smallest over device types)
	Devices []string // "cpu:0 has N of its M-byte budget free"
}

func (e *AdmissionError) Error() string {
	return fmt.Sprintf("model %s version %d needs %d bytes of device memory for a Replica, more than any device has free: %s",
		e.Model, e.Version, e.Need, strings.Join(e.Devices, "; "))
}

// gate counts a Served version's requests in flight, so that a reload or an
// unload can wait for them; once retired it lets no new request in. It is
// lock-free because every Infer and Encode passes through it.
type gate struct {
	state atomic.Int64 // requests in flight, plus retiredBit once retired
	once  sync.Once
	idle  chan struct{} // closed once retired with nothing in flight
}

const retiredBit = int64(1) << 62

func newGate() *gate { return &gate{idle: make(chan struct{})} }

func (g *gate) enter() bool {
	if g.state.Add(1)&retiredBit != 0 {
		g.leave()
		return false
	}
	return true
}

func (g *gate) leave() {
	if g.state.Add(-1) == retiredBit {
		g.once.Do(func() { close(g.idle) })
	}
}

// retire refuses new requests; the channel closes when the last one left.
func (g *gate) retire() <-chan struct{} {
	if g.state.Or(retiredBit) == 0 {
		g.once.Do(func() { close(g.idle) })
	}
	return g.idle
}

// placed is one Replica of a Served version.
type placed struct {
	deviceID string
	r        interface{ Close() error } // a batch Replica, or a generator's engine
	gen      bool                       // a generation Replica of the scheduler
	bytes    int64                      // reserved against the device's budget
	maxBatch int
}

// Served is one loaded model version: the built-in encoder or a model of
// the repository, with its replicas.
//
// Its fields are set before it is published and never change after, so the
// request path and ListModels read them without a lock.
type Served struct {
	Info models.Info
	Key  string // the scheduler's queue name
	// Label is the model version's name, as Stats rows and the metrics'
	// model label show it: NAME@VERSION for a repository model (a hot
	// reload's instance too: its queue key differs, its label does not),
	// the name alone for a built-in.
	Label   string
	Builtin Encoder      // the built-in encoder; nil for repository models
	Model   models.Model // a repository model; nil for the built-in
	LLM     *llm.Model   // a decoder LLM (served through Generate and Chat); nil otherwise

	fingerprint string // of the repository files it was read from
	replicas    []placed
	gate        *gate
}

// Costs are the items' shares of a batch's token budget (nil: 1 each).
func (s *Served) Costs(payloads []any) []int {
	if s.Model == nil || s.Info.MaxSeqLen <= 0 {
		return nil
	}
	c := make([]int, len(payloads))
	for i, p := range payloads {
		c[i] = s.Model.Cost(p)
	}
	return c
}

// DeviceIDs are the devices its replicas run on.
func (s *Served) DeviceIDs() []string {
	ids := make([]string, len(s.replicas))
	for i, p := range s.replicas {
		ids[i] = p.deviceID
	}
	return ids
}

// Replicas is how many replicas serve it.
func (s *Served) Replicas() int { return len(s.replicas) }

// ReplicaInfo describes one replica of a served version.
type ReplicaInfo struct {
	DeviceID string
	// MaxBatch is its batch limit in items, or its running set of
	// sequences for a generator.
	MaxBatch int
}

// ReplicaInfos describes its replicas.
func (s *Served) ReplicaInfos() []ReplicaInfo {
	out := make([]ReplicaInfo, len(s.replicas))
	for i, p := range s.replicas {
		out[i] = ReplicaInfo{DeviceID: p.deviceID, MaxBatch: p.maxBatch}
	}
	return out
}

// MemoryBytes is the device memory its replicas reserve.
func (s *Served) MemoryBytes() int64 {
	var n int64
	for _, p := range s.replicas {
		n += p.bytes
	}
	return n
}

// openDevice is a device opened at start; models get replicas on it.
type openDevice struct {
	dev   runtime.Device
	entry detect.Entry
	dtype runtime.DType // what it computes in: the setting's, or F32 after a fallback
	// inFlight is how many batches a model Replica on it runs at once: more
	// than one where the device overlaps a batch's copy-in with another's
	// run (PJRT), one elsewhere.
	inFlight int
}

// pipelinedDevice is a runtime device that overlaps one batch's copy-in with
// another's run (runtime/pjrt's Device), matched by method so lifecycle needs
// no adapter's types.
type pipelinedDevice interface {
	MaxInFlight() int
}

func inFlightOf(dev runtime.Device) int {
	if p, ok := dev.(pipelinedDevice); ok {
		return max(p.MaxInFlight(), 1)
	}
	return 1
}

// catalog is an immutable view of what is Served, swapped atomically so the
// request path never takes a lock.
type catalog struct {
	byName map[string]*Served
}

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
}

// Set is what brokerd serves: the built-in encoder and the loaded
// repository models, the devices they run on, and their replicas.
type Set struct {
	defaultModel string
	cat          atomic.Pointer[catalog]
	repo         Repository // nil: the built-in encoder only
	sched        Host
	opts         Options
	log          *zap.Logger

	// dtypes is each open device's compute type by ID. Written by
	// openDevices only, before anything serves, so ListDevices reads it
	// without mu (which a load holds for seconds).
	dtypes map[string]runtime.DType

	// mu serialises loads, unloads and close, and guards what follows.
	mu       sync.Mutex
	devices  []openDevice
	reserved map[string]int64 // device ID → bytes reserved by replicas
	reloads  int              // reloads of a served version so far: queue keys of their own
	closed   bool

	stMu    sync.Mutex
	pending map[string]string // name → "loading" or "unloading"
	lastErr map[string]string // name → why its last load failed
}

// openDevices opens every runnable device whose runtime this build has.
// Devices are opened once and shared by every model placed on them.
func openDevices(ctx context.Context, entries []detect.Entry, sched Host, repo Repository, opts Options, log *zap.Logger) *Set {
	ms := &Set{repo: repo, sched: sched, opts: opts, log: log, reserved: map[string]int64{},
		pending: map[string]string{}, lastErr: map[string]string{}, dtypes: map[string]runtime.DType{}}
	ms.cat.Store(&catalog{byName: map[string]*Served{}})
	for _, e := range entries {
		if !e.Runnable() || e.Health == detect.Unhealthy {
			continue
		}
		ad, ok := opts.Adapters[e.Runtime]
		if !ok {
			log.Info("device not opened: no adapter of this build", zap.String("device", e.ID), zap.String("runtime", e.Runtime))
			continue
		}
		spec := runtime.DeviceSpec{ID: e.ID, Budget: e.Budget, DType: opts.DTypes[e.Type]}
		if spec.DType == 0 {
			spec.DType = runtime.F32
		}
		if e.CPU != nil && e.CPU.EffectiveCores > 0 {
			spec.Threads = int(math.Ceil(e.CPU.EffectiveCores))
		}
		dev, err := ad.Open(ctx, spec)
		if err != nil && spec.DType != runtime.F32 && errors.Is(err, runtime.ErrUnsupported) {
			// A setting for a whole device type may not suit every host
			// (bf16 on a CPU without the instructions): serve in f32
			// rather than not at all.
			log.Warn("device cannot compute in the configured dtype: falling back to f32", zap.String("device", e.ID),
				zap.Stringer("compute_dtype", spec.DType), zap.Error(err))
			spec.DType = runtime.F32
			dev, err = ad.Open(ctx, spec)
		}
		if err != nil {
			log.Warn("device could not be opened", zap.String("device", e.ID), zap.Error(err))
			continue
		}
		ms.devices = append(ms.devices, openDevice{dev: dev, entry: e, dtype: spec.DType, inFlight: inFlightOf(dev)})
		ms.dtypes[e.ID] = spec.DType
		log.Info("device opened", zap.String("device", e.ID), zap.String("runtime", e.Runtime), zap.Stringer("compute_dtype", spec.DType))
	}
	return ms
}

// DefaultModel is the model Encode serves when a request names none.
func (ms *Set) DefaultModel() string { return ms.defaultModel }

// Catalog is a snapshot of what is served, what the repository holds and
// the loads in progress, for listings.
type Catalog struct {
	Served  map[string]*Served // by name
	Repo    []RepoEntry        // nil without a repository
	Pending map[string]string  // name → "loading" or "unloading"
	LastErr map[string]string  // name → why its last load failed
}

// Catalog returns the current snapshot.
func (ms *Set) Catalog() (Catalog, error) {
	var c Catalog
	if ms.repo != nil {
		var err error
		if c.Repo, err = ms.repo.List(); err != nil {
			return c, err
		}
	}
	ms.stMu.Lock()
	c.Pending, c.LastErr = maps.Clone(ms.pending), maps.Clone(ms.lastErr)
	ms.stMu.Unlock()
	c.Served = ms.cat.Load().byName // immutable once published
	return c, nil
}

// ComputeDType is the type an open device computes in; false for a device
// that is not open.
func (ms *Set) ComputeDType(id string) (runtime.DType, bool) {
	dt, ok := ms.dtypes[id]
	return dt, ok
}

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
		s := &Served{
			Info: models.Info{Name: m.Name(), Version: m.Version(), Kind: models.Kind(m.Kind()), BaseBatch: m.BaseBatch()},
			Key:  m.Name(), Label: m.Name(), Builtin: m, gate: newGate(),
		}
		for _, od := range ms.devices {
			e := od.entry
			maxBatch, err := ms.maxBatch(s.Info, e.Type)
			if err != nil {
				return ms, err
			}
			need := m.MemoryBytes()
			if free := ms.freeLocked(od); e.Budget > 0 && need > free {
				log.Warn("model not placed: device budget too small", zap.String("model", m.Name()), zap.String("device", e.ID),
					zap.Int64("need_bytes", need), zap.Int64("free_budget_bytes", free))
				continue
			}
			r, err := m.NewReplica(ctx, od.dev)
			if err != nil {
				log.Warn("model Replica failed", zap.String("model", m.Name()), zap.String("device", e.ID), zap.Error(err))
				continue
			}
			if err := ms.addReplicaLocked(s, od, maxBatch, need, r); err != nil {
				return ms, err
			}
		}
		ms.publishLocked(s.Info.Name, s)
	}
	return ms, nil
}

// maxBatch is a model's batch limit in items on a device type: the plan's,
// capped by --max-batch. (Text models are bounded by tokens too: maxTokens.)
func (ms *Set) maxBatch(info models.Info, t detect.Type) (int, error) {
	plan, err := detect.PlanBatch(info.BaseBatch, t, ms.opts.Factors)
	if err != nil {
		return 0, fmt.Errorf("batch plan of %s on %s: %w", info.Name, t, err)
	}
	n := plan.Max
	if ms.opts.MaxBatch > 0 {
		n = min(n, ms.opts.MaxBatch)
	}
	return n, nil
}

// maxTokens is a text model's batch token budget (0 for other models): its
// own max_batch_tokens, else --max-batch-tokens.
func (ms *Set) maxTokens(info models.Info) int {
	if info.MaxSeqLen <= 0 {
		return 0
	}
	if info.MaxBatchTokens > 0 {
		return info.MaxBatchTokens
	}
	return ms.opts.MaxBatchTokens
}

// freeLocked is the part of a device's budget no Replica holds or reserved:
// a Replica reserves its batch workspace too, which it allocates only while
// it runs.
func (ms *Set) freeLocked(od openDevice) int64 {
	used := max(int64(od.dev.MemoryUsed()), ms.reserved[od.entry.ID])
	return max(int64(od.entry.Budget)-used, 0)
}

func (ms *Set) addReplicaLocked(s *Served, od openDevice, maxBatch int, need int64, r Replica) error {
	e := od.entry
	opts := []scheduler.ReplicaOption{scheduler.WithName(s.Label)}
	if tokens := ms.maxTokens(s.Info); tokens > 0 {
		// Items cost their tokens (Served.costs): a batch stays within the budget.
		opts = append(opts, scheduler.WithMaxBatchCost(tokens))
	}
	inFlight := 1
	if s.Builtin == nil && od.inFlight > 1 {
		// The next batch is copied in while this one runs. (The built-in
		// hash encoder's budget counts one batch, so it keeps to one.)
		inFlight = od.inFlight
		opts = append(opts, scheduler.WithMaxInFlight(inFlight))
	}
	if err := ms.sched.AddReplica(s.Key, scheduler.Device{ID: e.ID, Type: string(e.Type), CostPerHour: e.CostPerHour}, maxBatch, r, opts...); err != nil {
		r.Close()
		return fmt.Errorf("Replica of %s on %s: %w", s.Key, e.ID, err)
	}
	s.replicas = append(s.replicas, placed{deviceID: e.ID, r: r, bytes: need, maxBatch: maxBatch})
	ms.reserved[e.ID] += need
	ms.log.Info("model placed", zap.String("model", s.Info.Name), zap.Int64("version", s.Info.Version), zap.String("device", e.ID),
		zap.Int("max_batch", maxBatch), zap.Int("batches_in_flight", inFlight), zap.Int64("memory_bytes", need))
	return nil
}

// publishLocked makes s serve name (nil: name is Served no more).
func (ms *Set) publishLocked(name string, s *Served) {
	old := ms.cat.Load()
	next := &catalog{byName: make(map[string]*Served, len(old.byName)+1)}
	for k, v := range old.byName {
		next.byName[k] = v
	}
	if s == nil {
		delete(next.byName, name)
	} else {
		next.byName[name] = s
	}
	ms.cat.Store(next)
}

// Builtin returns the built-in encoder Encode serves under name.
func (ms *Set) Builtin(name string) (Encoder, bool) {
	s := ms.cat.Load().byName[name]
	if s == nil || s.Builtin == nil {
		return nil, false
	}
	return s.Builtin, true
}

// Lookup returns what serves name, without entering its gate.
func (ms *Set) Lookup(name string) *Served {
	return ms.cat.Load().byName[name]
}

// LookupLabel returns the version whose Label (NAME@VERSION, as Stats rows
// and the metrics name it) is label, while it serves.
func (ms *Set) LookupLabel(label string) *Served {
	for _, s := range ms.cat.Load().byName {
		if s.Label == label {
			return s
		}
	}
	return nil
}

// names lists the Served names for error messages.
func (ms *Set) Names() string {
	var n []string
	for k := range ms.cat.Load().byName {
		n = append(n, k)
	}
	sort.Strings(n)
	return strings.Join(n, ", ")
}

// Acquire returns the version serving name (version 0: whichever does) with
// its gate entered; the caller calls release when its work is done.
func (ms *Set) Acquire(name string, version int64) (*Served, error) {
	for {
		s := ms.cat.Load().byName[name]
		if s == nil {
			if version != 0 {
				return nil, ms.versionMissing(name, version, 0)
			}
			return nil, ms.Missing(name)
		}
		if version != 0 && version != s.Info.Version {
			return nil, ms.versionMissing(name, version, s.Info.Version)
		}
		if s.gate.enter() {
			return s, nil
		}
		// A reload or unload retired s after it was looked up; the catalog
		// already shows what replaced it.
	}
}

// Release ends a request's hold on s (Acquire's).
func (ms *Set) Release(s *Served) { s.gate.leave() }

// Missing explains why name is not Served: ErrModelNotLoaded when the
// repository holds it, else ErrModelNotFound.
func (ms *Set) Missing(name string) error {
	if ms.repo != nil {
		if entries, err := ms.repo.List(); err == nil {
			for _, e := range entries {
				if e.Name == name {
					return notLoaded("model %s is in the repository but not loaded (brokerctl load %s)", name, name)
				}
			}
		}
	}
	return notFound("model %q not found (Served: %s)", name, ms.Names())
}

// versionMissing explains why version of name does not serve (serving:
// the version that does, 0 if none): ErrModelNotFound when the repository
// does not hold that version (or the model), ErrModelNotLoaded when it
// does, as Triton answers. A repository that cannot be listed leaves it
// "not loaded".
func (ms *Set) versionMissing(name string, version, serving int64) error {
	serves := ""
	if serving != 0 {
		serves = fmt.Sprintf("; version %d serves", serving)
	}
	if ms.repo == nil {
		if serving == 0 {
			return ms.Missing(name)
		}
		return notFound("model %s version %d not found: only version %d serves (there is no model repository)", name, version, serving)
	}
	entries, err := ms.repo.List()
	if err != nil {
		return notLoaded("model %s version %d is not loaded (%v%s)", name, version, err, serves)
	}
	i := slices.IndexFunc(entries, func(e RepoEntry) bool { return e.Name == name })
	switch {
	case i < 0 && serving == 0:
		return ms.Missing(name)
	case i < 0:
		return notFound("model %s version %d not found: the model is not in the repository, and version %d serves", name, version, serving)
	case !slices.Contains(entries[i].Versions, version):
		return notFound("model %s version %d not found: the model repository holds version(s) %s%s", name, version, joinVersions(entries[i].Versions), serves)
	case serving == 0:
		return notLoaded("model %s version %d is in the repository but not loaded (brokerctl load %s --version %d)", name, version, name, version)
	}
	return notLoaded("model %s version %d is not loaded (version %d serves; brokerctl load %s --version %d switches)", name, version, serving, name, version)
}

// joinVersions lists versions for a message ("1, 2"; "none").
func joinVersions(vs []int64) string {
	if len(vs) == 0 {
		return "none"
	}
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

func (ms *Set) setPending(name, state string) {
	ms.stMu.Lock()
	defer ms.stMu.Unlock()
	if state == "" {
		delete(ms.pending, name)
	} else {
		ms.pending[name] = state
	}
}

func (ms *Set) setLastErr(name string, err error) {
	ms.stMu.Lock()
	defer ms.stMu.Unlock()
	if err == nil {
		delete(ms.lastErr, name)
	} else {
		ms.lastErr[name] = err.Error()
	}
}

// Action says what a Load did.
type Action int

const (
	// ActionLoaded: the model was not served and now is.
	ActionLoaded Action = iota + 1
	// ActionSwitched: another version replaced the one served.
	ActionSwitched
	// ActionReloaded: the served version's files changed on disk, and an
	// instance read from them replaced the one serving.
	ActionReloaded
	// ActionUnchanged: the version asked for is served from the files on disk
	// as they are: nothing was done.
	ActionUnchanged
)

func (a Action) String() string {
	switch a {
	case ActionLoaded:
		return "loaded"
	case ActionSwitched:
		return "switched"
	case ActionReloaded:
		return "reloaded"
	case ActionUnchanged:
		return "unchanged"
	}
	return "unknown"
}

// Load loads a version of a repository model (0: the highest loadable),
// places it and makes it serve name. Asked for the version already
// serving, it compares the files' fingerprint: unchanged files are a
// no-op, changed ones are read again. A switch or reload never drops a
// request: the new instance's replicas join the scheduler first (admitted
// against what the devices have free while the old instance still holds
// its memory), the name switches to them, and the old instance's replicas
// go once the requests that entered its gate are done.
func (ms *Set) Load(ctx context.Context, name string, version int64) (*Served, Action, error) {
	if s := ms.Lookup(name); s != nil && s.Builtin != nil {
		return s, ActionUnchanged, nil
	}
	if ms.repo == nil {
		return nil, 0, notFound("model %q not found: brokerd has no model repository (--model-repo)", name)
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.closed {
		return nil, 0, fmt.Errorf("model %s: brokerd is stopping: %w", name, scheduler.ErrDraining)
	}
	ms.setPending(name, "loading")
	defer ms.setPending(name, "")
	s, act, err := ms.loadLocked(ctx, name, version)
	ms.setLastErr(name, err)
	return s, act, err
}

// unchangedLocked reports whether cur serves version of name (0: the
// highest loadable) from the files on disk as they are now.
func (ms *Set) unchangedLocked(cur *Served, name string, version int64) bool {
	if version == 0 {
		entries, err := ms.repo.List()
		if err != nil {
			return false
		}
		for _, e := range entries {
			if e.Name == name && len(e.Versions) > 0 {
				version = e.Versions[len(e.Versions)-1]
			}
		}
	}
	if version != cur.Info.Version || cur.fingerprint == "" {
		return false
	}
	fp, err := ms.repo.Fingerprint(name, version)
	return err == nil && fp == cur.fingerprint
}

func (ms *Set) loadLocked(ctx context.Context, name string, version int64) (*Served, Action, error) {
	cur := ms.Lookup(name)
	if cur != nil && ms.unchangedLocked(cur, name, version) {
		ms.log.Info("model unchanged: this version is served from these files already", zap.String("model", name), zap.Int64("version", cur.Info.Version))
		return cur, ActionUnchanged, nil
	}
	l, err := ms.repo.Load(ctx, name, version)
	if errors.Is(err, ErrModelNotFound) {
		return nil, 0, err // the repository's message names the model and says "not found"
	}
	if err != nil {
		return nil, 0, fmt.Errorf("model %s: %w", name, err)
	}
	var info models.Info
	if l.LLM != nil {
		info = l.LLM.Info()
	} else {
		info = l.Model.Info()
	}
	// The repository's name and version directory are the model's identity.
	info.Name, info.Version = name, l.Version
	act := ActionLoaded
	label := fmt.Sprintf("%s@%d", name, info.Version)
	key := label
	if cur != nil {
		act = ActionSwitched
		if cur.Info.Version == info.Version {
			if cur.fingerprint != "" && cur.fingerprint == l.Fingerprint {
				return cur, ActionUnchanged, nil
			}
			// Both instances are in the scheduler while requests move
			// over: the new one queues under a key of its own.
			act = ActionReloaded
			ms.reloads++
			key = fmt.Sprintf("%s@%d.r%d", name, info.Version, ms.reloads)
		}
	}
	s := &Served{Info: info, Key: key, Label: label, Model: l.Model, LLM: l.LLM, fingerprint: l.Fingerprint, gate: newGate()}
	place := func() error { return ms.placeLocked(ctx, s) }
	if l.LLM != nil {
		place = func() error { return ms.placeGenLocked(ctx, s, l.LLM) }
	}
	if err := place(); err != nil {
		ms.removeReplicasLocked(context.WithoutCancel(ctx), s)
		return nil, 0, err
	}
	ms.publishLocked(name, s)
	if cur != nil {
		ms.log.Info("model "+act.String(), zap.String("model", name), zap.Int64("from", cur.Info.Version), zap.Int64("to", info.Version),
			zap.String("queue", key))
		ms.retireLocked(ctx, cur)
	}
	return s, act, nil
}

// placementOrder is the device types a repository model may go to, most
// preferred first: the selection chain of the preference, then the rest, so
// a preference never leaves a model without a device while another could run it.
func placementOrder(p detect.Policy) []detect.Type {
	var order []detect.Type
	switch p.Prefer {
	case detect.PreferCPU:
		order = []detect.Type{detect.TypeCPU}
	case detect.PreferGPU:
		order = []detect.Type{detect.TypeGPU, detect.TypeCPU}
	}
	for _, t := range []detect.Type{detect.TypeTPU, detect.TypeGPU, detect.TypeCPU} {
		if !slices.Contains(order, t) {
			order = append(order, t)
		}
	}
	if !p.AllowTPU {
		order = slices.DeleteFunc(order, func(t detect.Type) bool { return t == detect.TypeTPU })
	}
	return order
}

// placeLocked gives s a Replica on every usable device of the most preferred
// type where at least one device's budget admits it.
func (ms *Set) placeLocked(ctx context.Context, s *Served) error {
	current := map[string]detect.Entry{}
	if ms.opts.Entries != nil {
		for _, e := range ms.opts.Entries() {
			current[e.ID] = e
		}
	}
	var (
		refusals []string
		failures []error
		minNeed  int64
	)
	for _, t := range placementOrder(ms.opts.Select) {
		for _, od := range ms.devices {
			e := od.entry
			if e.Type != t {
				continue
			}
			if c, ok := current[e.ID]; ok && (c.Cordoned || c.Health == detect.Unhealthy) {
				continue
			}
			maxBatch, err := ms.maxBatch(s.Info, t)
			if err != nil {
				return err
			}
			// Each batch in flight holds its own buffers: a pipelined
			// Replica needs about that many batches' workspace.
			need := s.Model.MemoryBytes(od.dtype, maxBatch*od.inFlight)
			if minNeed == 0 || need < minNeed {
				minNeed = need
			}
			free := ms.freeLocked(od)
			if e.Budget > 0 && need > free {
				refusals = append(refusals, fmt.Sprintf("%s has %d bytes free of its %d-byte budget (needs %d)", e.ID, free, e.Budget, need))
				continue
			}
			r, err := s.Model.NewReplica(ctx, od.dev, maxBatch)
			if err != nil {
				if errors.Is(err, runtime.ErrOutOfMemory) {
					refusals = append(refusals, fmt.Sprintf("%s: %v", e.ID, err))
				} else {
					failures = append(failures, fmt.Errorf("Replica on %s: %w", e.ID, err))
				}
				continue
			}
			if err := ms.addReplicaLocked(s, od, maxBatch, need, r); err != nil {
				return err
			}
		}
		if len(s.replicas) > 0 {
			return nil
		}
	}
	switch {
	case len(failures) > 0:
		return fmt.Errorf("model %s version %d: %w", s.Info.Name, s.Info.Version, errors.Join(failures...))
	case len(refusals) > 0:
		return &AdmissionError{Model: s.Info.Name, Version: s.Info.Version, Need: minNeed, Devices: refusals}
	}
	return fmt.Errorf("model %s version %d: no open device can take a Replica: %w", s.Info.Name, s.Info.Version, scheduler.ErrNoDevice)
}

// retireLocked waits until the requests that entered s's gate are done,
// then removes its replicas. It goes on when ctx ends: s no longer serves,
// so its memory must come back.
func (ms *Set) retireLocked(ctx context.Context, s *Served) {
	<-s.gate.retire()
	ms.removeReplicasLocked(context.WithoutCancel(ctx), s)
}

func (ms *Set) removeReplicasLocked(ctx context.Context, s *Served) {
	for _, p := range s.replicas {
		remove := ms.sched.RemoveReplica
		if p.gen {
			remove = ms.sched.RemoveGenReplica
		}
		if err := remove(ctx, s.Key, p.deviceID); err != nil {
			ms.log.Warn("removing a Replica", zap.String("model", s.Key), zap.String("device", p.deviceID), zap.Error(err))
		}
		if err := p.r.Close(); err != nil {
			ms.log.Warn("closing a Replica", zap.String("model", s.Key), zap.String("device", p.deviceID), zap.Error(err))
		}
		ms.reserved[p.deviceID] -= p.bytes
	}
}

// Unload stops serving name once the work it accepted is done, and frees
// its replicas.
func (ms *Set) Unload(ctx context.Context, name string) (*Served, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	s := ms.Lookup(name)
	if s == nil {
		return nil, ms.Missing(name)
	}
	if s.Builtin != nil {
		return nil, fmt.Errorf("model %s is built in and always Served: %w", name, ErrBuiltinModel)
	}
	ms.setPending(name, "unloading")
	defer ms.setPending(name, "")
	ms.publishLocked(name, nil)
	ms.retireLocked(ctx, s)
	ms.log.Info("model unloaded", zap.String("model", name), zap.Int64("version", s.Info.Version))
	return s, nil
}

// LoadAtStart loads the models of --load-models: names, or "all" of the
// repository. Named models must load; with "all" a model that cannot load
// is logged and skipped.
func (ms *Set) LoadAtStart(ctx context.Context, spec string) error {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil
	}
	if spec == "all" {
		if ms.repo == nil {
			return nil
		}
		entries, err := ms.repo.List()
		if err != nil {
			return fmt.Errorf("load-models: listing the repository: %w", err)
		}
		for _, e := range entries {
			if _, _, err := ms.Load(ctx, e.Name, 0); err != nil {
				ms.log.Warn("model not loaded at start", zap.String("model", e.Name), zap.Error(err))
			}
		}
		return nil
	}
	for _, name := range strings.Split(spec, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		if _, _, err := ms.Load(ctx, name, 0); err != nil {
			return fmt.Errorf("load-models: %w", err)
		}
	}
	return nil
}

// Close frees every Replica, then the devices.
func (ms *Set) Close() error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.closed = true
	var errs []error
	for _, s := range ms.cat.Load().byName {
		for _, p := range s.replicas {
			errs = append(errs, p.r.Close())
		}
	}
	ms.cat.Store(&catalog{byName: map[string]*Served{}})
	for _, od := range ms.devices {
		errs = append(errs, od.dev.Close())
	}
	return errors.Join(errs...)
}
