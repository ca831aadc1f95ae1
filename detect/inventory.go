package detect

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// DefaultRefreshInterval is how often Run refreshes telemetry and health.
const DefaultRefreshInterval = 5 * time.Second

// RuntimeStatus is what the daemon learned from probing one runtime adapter
// (or one plugin of it): which device types it covers and whether it loads.
type RuntimeStatus struct {
	Name      string // "onednn", "pjrt"
	Types     []Type
	Available bool
	Version   string
	Reason    string // why it is not available
}

// InventoryOptions configure an Inventory. Zero values get defaults: an
// in-memory registry, the balanced memory strategy, the default cost table,
// a no-op logger and time.Now.
type InventoryOptions struct {
	Detectors  []Detector
	Refreshers []Refresher
	Registry   *Registry
	Runtimes   []RuntimeStatus
	Memory     MemoryStrategy
	Costs      CostTable
	Logger     *zap.Logger
	Now        func() time.Time
}

// Entry is one device as the inventory serves it: the detected device plus
// what brokerd decided about it.
type Entry struct {
	Device
	Budget       uint64  // bytes of memory brokerd admits work against
	CostPerHour  float64 // dollars
	Cordoned     bool
	CordonReason string
}

// Inventory owns the device list: it runs discovery, keeps telemetry fresh
// and holds cordons. All methods are safe for concurrent use, and what they
// return is a copy the caller may keep.
type Inventory struct {
	detectors  []Detector
	refreshers []Refresher
	registry   *Registry
	runtimes   []RuntimeStatus
	memory     MemoryStrategy
	costs      CostTable
	log        *zap.Logger
	now        func() time.Time

	discoverMu sync.Mutex // one discovery at a time; detectors run outside mu

	mu      sync.RWMutex
	entries []Entry
	notes   []string
	cordons map[string]string // ID → reason; kept across rediscovery
}

// NewInventory returns an empty inventory; call Discover to fill it.
func NewInventory(opts InventoryOptions) *Inventory {
	inv := &Inventory{
		detectors:  append([]Detector(nil), opts.Detectors...),
		refreshers: append([]Refresher(nil), opts.Refreshers...),
		registry:   opts.Registry,
		memory:     opts.Memory,
		costs:      opts.Costs,
		log:        opts.Logger,
		now:        opts.Now,
		cordons:    map[string]string{},
	}
	for _, rt := range opts.Runtimes {
		rt.Types = append([]Type(nil), rt.Types...)
		inv.runtimes = append(inv.runtimes, rt)
	}
	if inv.log == nil {
		inv.log = zap.NewNop()
	}
	if inv.registry == nil {
		// An in-memory registry cannot fail to open.
		inv.registry, _ = OpenRegistry("", inv.log)
	}
	if inv.memory.Fraction == 0 {
		inv.memory = MemoryBalanced
	}
	if inv.costs.PerType == nil && inv.costs.PerName == nil {
		inv.costs = DefaultCostTable()
	} else {
		inv.costs = inv.costs.Clone()
	}
	if inv.now == nil {
		inv.now = time.Now
	}
	return inv
}

// Discover runs every detector, gives the devices stable IDs, runtime status,
// memory budgets and prices, and replaces the device list. A detector that
// finds nothing is not an error; only a cancelled ctx is.
func (inv *Inventory) Discover(ctx context.Context) error {
	inv.discoverMu.Lock()
	defer inv.discoverMu.Unlock()

	var devs []Device
	var notes []string
	for _, det := range inv.detectors {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("discover: %w", err)
		}
		start := inv.now()
		res := det.Detect(ctx)
		inv.log.Debug("detector finished", zap.String("detector", det.Name()),
			zap.Duration("took", inv.now().Sub(start)),
			zap.Int("devices", len(res.Devices)), zap.Int("notes", len(res.Notes)))
		for i := range res.Devices {
			devs = append(devs, cloneDevice(&res.Devices[i]))
		}
		notes = append(notes, res.Notes...)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("discover: %w", err)
	}
	for i := range devs {
		inv.applyRuntime(&devs[i])
		if devs[i].Health == "" {
			devs[i].Health = Healthy
		}
	}
	if err := inv.registry.Assign(devs); err != nil {
		// The IDs are set for this run; only remembering them failed.
		inv.log.Warn("device registry not saved; device IDs may change after a restart", zap.Error(err))
		notes = append(notes, "The device registry could not be saved ("+err.Error()+"); device IDs may change after a restart.")
	}
	sortDevices(devs)

	inv.mu.Lock()
	defer inv.mu.Unlock()
	prev := make(map[string]Health, len(inv.entries))
	for i := range inv.entries {
		prev[inv.entries[i].ID] = inv.entries[i].Health
	}
	entries := make([]Entry, len(devs))
	for i := range devs {
		e := &entries[i]
		e.Device = devs[i]
		e.Budget = inv.memory.Budget(e.MemoryTotal)
		e.CostPerHour = inv.costs.PerHour(&e.Device)
		e.CordonReason, e.Cordoned = inv.cordons[e.ID]
		if h, ok := prev[e.ID]; ok {
			inv.logHealthChange(&e.Device, h)
		}
		inv.logDevice(e)
	}
	inv.entries, inv.notes = entries, notes
	return nil
}

// applyRuntime records which runtime drives d, or why none can. A reason the
// detector set (a device node it cannot open, say) wins over the probe.
func (inv *Inventory) applyRuntime(d *Device) {
	if d.Runtime != "" || d.RuntimeReason != "" {
		return
	}
	var reasons []string
	for _, rt := range inv.runtimes {
		if !containsType(rt.Types, d.Type) {
			continue
		}
		if rt.Available {
			d.Runtime = rt.Name
			return
		}
		reasons = append(reasons, runtimeUnavailableReason(rt))
	}
	if len(reasons) == 0 {
		d.RuntimeReason = NoAdapterReason
		return
	}
	d.RuntimeReason = strings.Join(reasons, "; ")
}

func runtimeUnavailableReason(rt RuntimeStatus) string {
	switch {
	case rt.Reason == "":
		return rt.Name + ": not available"
	case strings.HasPrefix(rt.Reason, rt.Name+":"):
		return rt.Reason
	default:
		return rt.Name + ": " + rt.Reason
	}
}

func (inv *Inventory) logDevice(e *Entry) {
	fields := []zap.Field{
		zap.String("device", e.ID), zap.String("type", string(e.Type)), zap.String("name", e.Name),
		zap.String("health", string(e.Health)),
		zap.Uint64("memory_total", e.MemoryTotal), zap.Uint64("budget", e.Budget),
		zap.Float64("cost_per_hour", e.CostPerHour),
	}
	if e.UUID != "" {
		fields = append(fields, zap.String("uuid", e.UUID))
	}
	if e.PCIBusID != "" {
		fields = append(fields, zap.String("pci_bus_id", e.PCIBusID))
	}
	if e.Runtime != "" {
		fields = append(fields, zap.String("runtime", e.Runtime))
	} else {
		fields = append(fields, zap.String("runtime_reason", e.RuntimeReason))
	}
	if e.Cordoned {
		fields = append(fields, zap.String("cordoned", e.CordonReason))
	}
	inv.log.Info("device discovered", fields...)
}

// logHealthChange warns when d crossed between healthy and unhealthy.
func (inv *Inventory) logHealthChange(d *Device, before Health) {
	wasBad, isBad := before == Unhealthy, d.Health == Unhealthy
	switch {
	case isBad && !wasBad:
		inv.log.Warn("device became unhealthy", zap.String("device", d.ID),
			zap.String("name", d.Name), zap.String("reason", d.HealthReason))
	case wasBad && !isBad:
		inv.log.Warn("device is healthy again", zap.String("device", d.ID), zap.String("name", d.Name))
	}
}

// typeOrder is the listing order of device types.
func typeOrder(t Type) int {
	switch t {
	case TypeCPU:
		return 0
	case TypeGPU:
		return 1
	case TypeTPU:
		return 2
	case TypeAMDGPU:
		return 3
	case TypeEdgeTPU:
		return 4
	default:
		return 5
	}
}

// sortDevices orders by type (cpu, gpu, tpu, amdgpu, edgetpu) then ID number.
func sortDevices(devs []Device) {
	sort.SliceStable(devs, func(i, j int) bool {
		a, b := &devs[i], &devs[j]
		if oa, ob := typeOrder(a.Type), typeOrder(b.Type); oa != ob {
			return oa < ob
		}
		if a.Type != b.Type {
			return a.Type < b.Type
		}
		return idNumber(a) < idNumber(b)
	})
}

// Refresh updates telemetry and health through every Refresher. It holds the
// inventory lock while they run, so refreshers must be quick (cached NVML
// handles, a few sysfs reads); readers wait for the whole refresh.
func (inv *Inventory) Refresh(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("refresh: %w", err)
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if len(inv.entries) == 0 || len(inv.refreshers) == 0 {
		return nil
	}
	ptrs := make([]*Device, len(inv.entries))
	before := make([]Health, len(inv.entries))
	ids := make([]string, len(inv.entries))
	for i := range inv.entries {
		ptrs[i] = &inv.entries[i].Device
		before[i], ids[i] = inv.entries[i].Health, inv.entries[i].ID
	}
	for _, r := range inv.refreshers {
		r.Refresh(ctx, ptrs)
	}
	for i := range inv.entries {
		e := &inv.entries[i]
		e.ID = ids[i] // the registry owns IDs, whatever a refresher does
		if e.Health == "" {
			e.Health = Healthy
		}
		e.Budget = inv.memory.Budget(e.MemoryTotal)
		inv.logHealthChange(&e.Device, before[i])
	}
	return nil
}

// Run refreshes every interval (DefaultRefreshInterval when ≤ 0), starting
// now, and calls onRefresh with a snapshot after each refresh, until ctx is
// done.
func (inv *Inventory) Run(ctx context.Context, interval time.Duration, onRefresh func([]Entry)) {
	if interval <= 0 {
		interval = DefaultRefreshInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := inv.Refresh(ctx); err == nil && onRefresh != nil {
			onRefresh(inv.Devices())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Devices returns a copy of every device, in listing order.
func (inv *Inventory) Devices() []Entry {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	out := make([]Entry, len(inv.entries))
	for i := range inv.entries {
		out[i] = cloneEntry(&inv.entries[i])
	}
	return out
}

// Device returns a copy of the device with this ID.
func (inv *Inventory) Device(id string) (Entry, error) {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	i := inv.indexLocked(id)
	if i < 0 {
		return Entry{}, fmt.Errorf("device %q: %w", id, ErrDeviceNotFound)
	}
	return cloneEntry(&inv.entries[i]), nil
}

// Notes returns the detectors' notes from the last discovery.
func (inv *Inventory) Notes() []string {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	return append([]string(nil), inv.notes...)
}

// Runtimes returns the runtime statuses the inventory was built with.
func (inv *Inventory) Runtimes() []RuntimeStatus {
	out := make([]RuntimeStatus, len(inv.runtimes))
	for i, rt := range inv.runtimes {
		rt.Types = append([]Type(nil), rt.Types...)
		out[i] = rt
	}
	return out
}

// MemoryStrategy returns the strategy budgets are computed with.
func (inv *Inventory) MemoryStrategy() MemoryStrategy { return inv.memory }

// Cordon stops new work from going to a device. Cordoning again replaces the
// reason. Cordons are kept in memory and survive rediscovery, not restarts.
func (inv *Inventory) Cordon(id, reason string) (Entry, error) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	i := inv.indexLocked(id)
	if i < 0 {
		return Entry{}, fmt.Errorf("cordon device %q: %w", id, ErrDeviceNotFound)
	}
	inv.cordons[id] = reason
	e := &inv.entries[i]
	e.Cordoned, e.CordonReason = true, reason
	inv.log.Info("device cordoned", zap.String("device", id), zap.String("reason", reason))
	return cloneEntry(e), nil
}

// Uncordon lets work go to a device again; uncordoning a device that is not
// cordoned is not an error.
func (inv *Inventory) Uncordon(id string) (Entry, error) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	i := inv.indexLocked(id)
	if i < 0 {
		return Entry{}, fmt.Errorf("uncordon device %q: %w", id, ErrDeviceNotFound)
	}
	e := &inv.entries[i]
	if e.Cordoned {
		inv.log.Info("device uncordoned", zap.String("device", id))
	}
	delete(inv.cordons, id)
	e.Cordoned, e.CordonReason = false, ""
	return cloneEntry(e), nil
}

// Select is the package Select over the current devices, also skipping
// cordoned devices. Selection.Device points to a copy.
func (inv *Inventory) Select(p Policy) Selection {
	devs, cordons := inv.snapshotForSelect()
	return selectDevice(devs, p, cordons)
}

// SelectFor is the package SelectFor over the current devices; a cordoned
// device fails with ErrDeviceCordoned (which wraps ErrDeviceUnavailable).
func (inv *Inventory) SelectFor(p Policy, pinType Type, pinID string) (Entry, error) {
	devs, cordons := inv.snapshotForSelect()
	d, err := selectFor(devs, p, cordons, pinType, pinID)
	if err != nil {
		return Entry{}, err
	}
	return inv.Device(d.ID)
}

func (inv *Inventory) snapshotForSelect() ([]Device, map[string]string) {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	devs := make([]Device, len(inv.entries))
	for i := range inv.entries {
		devs[i] = cloneDevice(&inv.entries[i].Device)
	}
	cordons := make(map[string]string, len(inv.cordons))
	for id, why := range inv.cordons {
		cordons[id] = why
	}
	return devs, cordons
}

func (inv *Inventory) indexLocked(id string) int {
	for i := range inv.entries {
		if inv.entries[i].ID == id {
			return i
		}
	}
	return -1
}

func cloneEntry(e *Entry) Entry {
	out := *e
	out.Device = cloneDevice(&e.Device)
	return out
}

// cloneDevice copies d deeply enough that the copy shares nothing mutable.
func cloneDevice(d *Device) Device {
	out := *d
	out.DevicePaths = append([]string(nil), d.DevicePaths...)
	if d.CPU != nil {
		c := *d.CPU
		c.Flags = append([]string(nil), d.CPU.Flags...)
		out.CPU = &c
	}
	if d.GPU != nil {
		g := *d.GPU
		out.GPU = &g
	}
	if d.TPU != nil {
		t := *d.TPU
		out.TPU = &t
	}
	if d.Attributes != nil {
		out.Attributes = make(map[string]string, len(d.Attributes))
		for k, v := range d.Attributes {
			out.Attributes[k] = v
		}
	}
	return out
}
