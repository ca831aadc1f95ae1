package detect

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

const invGiB = 1 << 30

// invDetector is a fake Detector returning a fixed result.
type invDetector struct {
	name  string
	res   Result
	calls atomic.Int32
}

func (d *invDetector) Name() string { return d.name }

func (d *invDetector) Detect(ctx context.Context) Result {
	d.calls.Add(1)
	return d.res
}

// invRefresher is a fake Refresher running a function.
type invRefresher func(ctx context.Context, devs []*Device)

func (f invRefresher) Refresh(ctx context.Context, devs []*Device) { f(ctx, devs) }

// invClock advances by step on every reading.
type invClock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *invClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(c.step)
	return c.t
}

func invDetectors() []Detector {
	return []Detector{
		&invDetector{name: "cpu", res: Result{Devices: []Device{{
			Type: TypeCPU, Name: "Test CPU", MemoryTotal: 64 * invGiB,
			CPU: &CPUInfo{LogicalCores: 8, EffectiveCores: 8, Flags: []string{"avx2"}},
		}}}},
		&invDetector{name: "nvidia", res: Result{Devices: []Device{
			// Enumerated out of order; one leaves Health empty.
			{Type: TypeGPU, Index: 1, UUID: "GPU-B", Name: "NVIDIA A100-SXM4-80GB", MemoryTotal: 80 * invGiB, Health: Healthy,
				GPU: &GPUInfo{}, DevicePaths: []string{"/dev/nvidia1"}, Attributes: map[string]string{"k": "v"}},
			{Type: TypeGPU, Index: 0, UUID: "GPU-A", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 * invGiB,
				GPU: &GPUInfo{}, DevicePaths: []string{"/dev/nvidia0"}},
		}}},
		&invDetector{name: "tpu", res: Result{Devices: []Device{
			{Type: TypeTPU, Index: 0, PCIBusID: "0000:00:04.0", Name: "TPU v5e", MemoryTotal: 16 * invGiB, Health: Healthy, TPU: &TPUInfo{}},
		}}},
		&invDetector{name: "amd", res: Result{Devices: []Device{
			{Type: TypeAMDGPU, Index: 0, PCIBusID: "0000:03:00.0", Name: "AMD Instinct MI300X", Health: Healthy},
		}}},
		&invDetector{name: "coral", res: Result{
			Devices: []Device{{Type: TypeEdgeTPU, Index: 0, PCIBusID: "0000:05:00.0", Health: Healthy, RuntimeReason: "apex driver missing"}},
			Notes:   []string{"Coral Edge TPU found; it is listed but cannot run work."},
		}},
		&invDetector{name: "empty", res: Result{Notes: []string{"NVML not found."}}},
	}
}

func invRuntimes() []RuntimeStatus {
	return []RuntimeStatus{
		{Name: "onednn", Types: []Type{TypeCPU}, Available: true, Version: "2.6"},
		{Name: "pjrt", Types: []Type{TypeGPU}, Available: true, Version: "0.54"},
		{Name: "pjrt", Types: []Type{TypeTPU}, Available: false, Reason: "no PJRT plugin for tpu found"},
	}
}

func newTestInventory(t *testing.T, log *zap.Logger, refreshers ...Refresher) *Inventory {
	t.Helper()
	costs := DefaultCostTable()
	costs.PerName["NVIDIA H100 80GB HBM3"] = 4.5
	inv := NewInventory(InventoryOptions{
		Detectors:  invDetectors(),
		Refreshers: refreshers,
		Runtimes:   invRuntimes(),
		Memory:     MemoryConservative,
		Costs:      costs,
		Logger:     log,
		Now:        (&invClock{t: time.Unix(0, 0), step: 5 * time.Millisecond}).Now,
	})
	if err := inv.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	return inv
}

func TestInventoryDiscover(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	inv := newTestInventory(t, zap.New(core))

	tests := []struct {
		id            string
		key           string
		runtime       string
		runtimeReason string
		budget        uint64
		cost          float64
	}{
		{"cpu:0", "cpu:0", "onednn", "", 41231686041, 0}, // 0.6 × 64 GiB, truncated
		{"gpu:0", "uuid:GPU-A", "pjrt", "", 51539607552, 4.5},
		{"gpu:1", "uuid:GPU-B", "pjrt", "", 51539607552, 0.5},
		{"tpu:0", "pci:0000:00:04.0", "", "pjrt: no PJRT plugin for tpu found", 10307921510, 2},
		{"amdgpu:0", "pci:0000:03:00.0", "", NoAdapterReason, 0, 0},
		{"edgetpu:0", "pci:0000:05:00.0", "", "apex driver missing", 0, 0},
	}
	devs := inv.Devices()
	if len(devs) != len(tests) {
		t.Fatalf("got %d devices, want %d", len(devs), len(tests))
	}
	for i, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			e := devs[i]
			if e.ID != tt.id || e.StableKey() != tt.key {
				t.Fatalf("position %d: %s (%s), want %s (%s)", i, e.ID, e.StableKey(), tt.id, tt.key)
			}
			if e.Runtime != tt.runtime || e.RuntimeReason != tt.runtimeReason {
				t.Errorf("runtime %q reason %q, want %q %q", e.Runtime, e.RuntimeReason, tt.runtime, tt.runtimeReason)
			}
			if e.Budget != tt.budget {
				t.Errorf("budget %d, want %d", e.Budget, tt.budget)
			}
			if e.CostPerHour != tt.cost {
				t.Errorf("cost %v, want %v", e.CostPerHour, tt.cost)
			}
			if e.Health != Healthy {
				t.Errorf("health %q, want healthy", e.Health)
			}
			got, err := inv.Device(tt.id)
			if err != nil || got.StableKey() != tt.key {
				t.Errorf("Device(%s) = %s, %v", tt.id, got.StableKey(), err)
			}
		})
	}

	t.Run("notes", func(t *testing.T) {
		notes := inv.Notes()
		if len(notes) != 2 || !strings.Contains(notes[0], "Coral") || notes[1] != "NVML not found." {
			t.Errorf("notes = %q", notes)
		}
	})
	t.Run("logs", func(t *testing.T) {
		if n := logs.FilterMessage("device discovered").FilterLevelExact(zapcore.InfoLevel).Len(); n != len(tests) {
			t.Errorf("%d device info lines, want %d", n, len(tests))
		}
		timed := logs.FilterMessage("detector finished").FilterLevelExact(zapcore.DebugLevel).All()
		if len(timed) != 6 {
			t.Fatalf("%d detector debug lines, want 6", len(timed))
		}
		if got := timed[0].ContextMap()["took"]; got != 5*time.Millisecond {
			t.Errorf("took = %v, want 5ms from the injected clock", got)
		}
		if got := timed[1].ContextMap()["detector"]; got != "nvidia" {
			t.Errorf("second detector = %v", got)
		}
	})
	t.Run("not found", func(t *testing.T) {
		_, err := inv.Device("gpu:7")
		if !errors.Is(err, ErrDeviceNotFound) || !strings.Contains(err.Error(), `"gpu:7"`) {
			t.Errorf("Device(gpu:7) err = %v", err)
		}
	})
}

func TestInventoryRediscoverKeepsIDsAndCordons(t *testing.T) {
	dir := t.TempDir()
	reg, err := OpenRegistry(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	gpus := &invDetector{name: "nvidia", res: Result{Devices: []Device{
		{Type: TypeGPU, Index: 0, UUID: "GPU-A", Health: Healthy},
		{Type: TypeGPU, Index: 1, UUID: "GPU-B", Health: Healthy},
	}}}
	inv := NewInventory(InventoryOptions{Detectors: []Detector{gpus}, Registry: reg, Runtimes: invRuntimes()})
	if err := inv.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.Cordon("gpu:1", "maintenance"); err != nil {
		t.Fatal(err)
	}

	// The GPUs swap NVML indexes; a restarted daemon (new registry on the
	// same dir) and a rediscovery both keep the IDs.
	gpus.res.Devices[0].UUID, gpus.res.Devices[1].UUID = "GPU-B", "GPU-A"
	if err := inv.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	reg2, err := OpenRegistry(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	inv2 := NewInventory(InventoryOptions{Detectors: []Detector{gpus}, Registry: reg2, Runtimes: invRuntimes()})
	if err := inv2.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		inv  *Inventory
	}{{"rediscovered", inv}, {"restarted", inv2}} {
		t.Run(tt.name, func(t *testing.T) {
			for _, e := range tt.inv.Devices() {
				want := map[string]string{"GPU-A": "gpu:0", "GPU-B": "gpu:1"}[e.UUID]
				if e.ID != want {
					t.Errorf("%s has ID %s, want %s", e.UUID, e.ID, want)
				}
			}
		})
	}
	e, err := inv.Device("gpu:1")
	if err != nil || !e.Cordoned || e.CordonReason != "maintenance" {
		t.Errorf("cordon lost on rediscovery: %+v, %v", e, err)
	}
}

func TestInventoryDetectorRuntimeReasonWins(t *testing.T) {
	det := &invDetector{name: "tpu", res: Result{Devices: []Device{
		{Type: TypeTPU, Index: 0, PCIBusID: "0000:00:04.0", RuntimeReason: "/dev/vfio/12 is not accessible"},
		{Type: TypeTPU, Index: 1, PCIBusID: "0000:00:05.0"},
	}}}
	inv := NewInventory(InventoryOptions{
		Detectors: []Detector{det},
		Runtimes:  []RuntimeStatus{{Name: "pjrt", Types: []Type{TypeTPU}, Available: true}},
	})
	if err := inv.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ id, runtime, reason string }{
		{"tpu:0", "", "/dev/vfio/12 is not accessible"},
		{"tpu:1", "pjrt", ""},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			e, err := inv.Device(tt.id)
			if err != nil {
				t.Fatal(err)
			}
			if e.Runtime != tt.runtime || e.RuntimeReason != tt.reason {
				t.Errorf("runtime %q reason %q, want %q %q", e.Runtime, e.RuntimeReason, tt.runtime, tt.reason)
			}
		})
	}
}

func TestInventoryRuntimeReasons(t *testing.T) {
	tests := []struct {
		name     string
		runtimes []RuntimeStatus
		want     string
	}{
		{"no runtime covers the type", nil, NoAdapterReason},
		{"reason gets the runtime name", []RuntimeStatus{{Name: "onednn", Types: []Type{TypeCPU}, Reason: "libdnnl.so.2 not found"}}, "onednn: libdnnl.so.2 not found"},
		{"name not doubled", []RuntimeStatus{{Name: "onednn", Types: []Type{TypeCPU}, Reason: "onednn: libdnnl.so.2 not found"}}, "onednn: libdnnl.so.2 not found"},
		{"no reason given", []RuntimeStatus{{Name: "onednn", Types: []Type{TypeCPU}}}, "onednn: not available"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := NewInventory(InventoryOptions{
				Detectors: []Detector{&invDetector{name: "cpu", res: Result{Devices: []Device{{Type: TypeCPU}}}}},
				Runtimes:  tt.runtimes,
			})
			if err := inv.Discover(context.Background()); err != nil {
				t.Fatal(err)
			}
			e, err := inv.Device("cpu:0")
			if err != nil {
				t.Fatal(err)
			}
			if e.Runtime != "" || e.RuntimeReason != tt.want {
				t.Errorf("runtime %q reason %q, want reason %q", e.Runtime, e.RuntimeReason, tt.want)
			}
		})
	}
}

func TestInventoryDevicesAreCopies(t *testing.T) {
	inv := newTestInventory(t, nil)
	got := inv.Devices()
	gpu1 := &got[2]
	if gpu1.ID != "gpu:1" {
		t.Fatalf("devices[2] = %s, want gpu:1", gpu1.ID)
	}
	gpu1.Attributes["k"] = "changed"
	gpu1.DevicePaths[0] = "/dev/changed"
	gpu1.GPU.LastXID = 79
	got[0].CPU.Flags[0] = "changed"
	gpu1.Name = "changed"
	one, _ := inv.Device("gpu:1")
	one.Attributes["k"] = "changed too"

	again := inv.Devices()
	if again[2].Attributes["k"] != "v" || again[2].DevicePaths[0] != "/dev/nvidia1" || again[2].GPU.LastXID != 0 ||
		again[0].CPU.Flags[0] != "avx2" || again[2].Name != "NVIDIA A100-SXM4-80GB" {
		t.Errorf("callers changed the inventory: %+v %+v", again[0], again[2])
	}
}

func TestInventoryCordon(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	inv := newTestInventory(t, zap.New(core))
	auto := Policy{Prefer: PreferGPU}

	e, err := inv.Cordon("gpu:0", "maintenance")
	if err != nil || !e.Cordoned || e.CordonReason != "maintenance" {
		t.Fatalf("Cordon = %+v, %v", e, err)
	}
	if logs.FilterMessage("device cordoned").Len() != 1 {
		t.Error("no log line for the cordon")
	}
	tests := []struct {
		name    string
		pinType Type
		pinID   string
		wantID  string
		wantErr error
	}{
		{name: "select skips cordoned", wantID: "gpu:1"},
		{name: "pinned type skips cordoned", pinType: TypeGPU, wantID: "gpu:1"},
		{name: "pinned cordoned id", pinID: "gpu:0", wantErr: ErrDeviceCordoned},
		{name: "pinned unknown id", pinID: "gpu:9", wantErr: ErrDeviceNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := inv.SelectFor(auto, tt.pinType, tt.pinID)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || got.ID != tt.wantID {
				t.Fatalf("SelectFor = %s, %v; want %s", got.ID, err, tt.wantID)
			}
		})
	}
	sel := inv.Select(auto)
	if sel.Device == nil || sel.Device.ID != "gpu:1" || !strings.Contains(sel.Reason, "gpu:0 is cordoned: maintenance") {
		t.Errorf("Select = %+v", sel)
	}

	if _, err := inv.Cordon("gpu:9", "x"); !errors.Is(err, ErrDeviceNotFound) {
		t.Errorf("Cordon(gpu:9) err = %v", err)
	}
	if _, err := inv.Uncordon("gpu:9"); !errors.Is(err, ErrDeviceNotFound) {
		t.Errorf("Uncordon(gpu:9) err = %v", err)
	}
	e, err = inv.Uncordon("gpu:0")
	if err != nil || e.Cordoned || e.CordonReason != "" {
		t.Fatalf("Uncordon = %+v, %v", e, err)
	}
	if got, err := inv.SelectFor(auto, "", "gpu:0"); err != nil || got.ID != "gpu:0" {
		t.Errorf("after uncordon SelectFor(gpu:0) = %s, %v", got.ID, err)
	}
	if _, err := inv.Uncordon("gpu:0"); err != nil {
		t.Errorf("second Uncordon err = %v, want none", err)
	}
}

func TestInventoryRefresh(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	var sick atomic.Bool
	ref := invRefresher(func(ctx context.Context, devs []*Device) {
		for _, d := range devs {
			if d.UUID != "GPU-B" {
				continue
			}
			d.Telemetry.MemoryUsed = 3 * invGiB
			d.Telemetry.TemperatureC = 61
			d.MemoryTotal = 40 * invGiB
			d.ID = "gpu:99" // refreshers must not renumber devices
			if sick.Load() {
				d.Health, d.HealthReason = Unhealthy, "XID 79"
			} else {
				d.Health, d.HealthReason = Healthy, ""
			}
		}
	})
	inv := newTestInventory(t, zap.New(core), ref)

	steps := []struct {
		name      string
		sick      bool
		wantWarns int
		wantMsg   string
	}{
		{"healthy stays quiet", false, 0, ""},
		{"becomes unhealthy", true, 1, "device became unhealthy"},
		{"stays unhealthy quietly", true, 1, ""},
		{"recovers", false, 2, "device is healthy again"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			sick.Store(st.sick)
			if err := inv.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			e, err := inv.Device("gpu:1")
			if err != nil {
				t.Fatalf("gpu:1 lost its ID: %v", err)
			}
			if e.Telemetry.MemoryUsed != 3*invGiB || e.Telemetry.TemperatureC != 61 {
				t.Errorf("telemetry not refreshed: %+v", e.Telemetry)
			}
			if e.Budget != MemoryConservative.Budget(40*invGiB) {
				t.Errorf("budget %d not recomputed from the new total", e.Budget)
			}
			if (e.Health == Unhealthy) != st.sick {
				t.Errorf("health = %s", e.Health)
			}
			all := logs.All()
			if len(all) != st.wantWarns {
				t.Fatalf("%d warn lines, want %d: %v", len(all), st.wantWarns, all)
			}
			if st.wantMsg != "" {
				last := all[len(all)-1]
				if last.Message != st.wantMsg || last.ContextMap()["device"] != "gpu:1" {
					t.Errorf("last warn = %q %v", last.Message, last.ContextMap())
				}
			}
		})
	}

	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := inv.Refresh(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("Refresh err = %v", err)
		}
		if err := inv.Discover(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("Discover err = %v", err)
		}
	})
}

func TestInventoryRun(t *testing.T) {
	var refreshes atomic.Int32
	ref := invRefresher(func(ctx context.Context, devs []*Device) {
		refreshes.Add(1)
		for _, d := range devs {
			d.Telemetry.UtilizationPercent++
		}
	})
	inv := newTestInventory(t, nil, ref)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	seen := make(chan []Entry, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		inv.Run(ctx, time.Millisecond, func(es []Entry) {
			select {
			case seen <- es:
			default:
			}
		})
	}()
	var last []Entry
	for i := 0; i < 3; i++ {
		select {
		case last = <-seen:
		case <-time.After(5 * time.Second):
			t.Fatal("onRefresh not called")
		}
	}
	if last[0].Telemetry.UtilizationPercent < 3 {
		t.Errorf("snapshot after 3 refreshes shows %v", last[0].Telemetry.UtilizationPercent)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	n := refreshes.Load()
	time.Sleep(10 * time.Millisecond)
	if refreshes.Load() != n {
		t.Error("refreshes continued after Run returned")
	}
}

func TestInventoryConcurrentUse(t *testing.T) {
	ref := invRefresher(func(ctx context.Context, devs []*Device) {
		for _, d := range devs {
			d.Telemetry.UtilizationPercent++
			if d.Attributes != nil {
				d.Attributes["seen"] = "yes"
			}
			if d.GPU != nil {
				d.GPU.ECCUncorrectedErrors++
			}
		}
	})
	inv := newTestInventory(t, nil, ref)
	ctx := context.Background()
	var wg sync.WaitGroup
	ops := []func(){
		func() { _ = inv.Refresh(ctx) },
		func() { _ = inv.Discover(ctx) },
		func() { _, _ = inv.Cordon("gpu:1", "x") },
		func() { _, _ = inv.Uncordon("gpu:1") },
		func() {
			for _, e := range inv.Devices() {
				_ = e.Attributes["seen"]
				if e.GPU != nil {
					_ = e.GPU.ECCUncorrectedErrors
				}
			}
		},
		func() { _, _ = inv.Device("gpu:1") },
		func() { _ = inv.Notes() },
		func() { _ = inv.Select(Policy{Prefer: PreferAuto}) },
		func() { _, _ = inv.SelectFor(Policy{}, TypeGPU, "") },
	}
	for i := 0; i < 8; i++ {
		for _, op := range ops {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 20; j++ {
					op()
				}
			}()
		}
	}
	wg.Wait()
	if got := len(inv.Devices()); got != 6 {
		t.Errorf("%d devices after concurrent use, want 6", got)
	}
}

func TestInventoryDefaults(t *testing.T) {
	inv := NewInventory(InventoryOptions{
		Detectors: []Detector{&invDetector{name: "gpu", res: Result{Devices: []Device{{Type: TypeGPU, UUID: "A", MemoryTotal: 100}}}}},
	})
	if err := inv.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	e, err := inv.Device("gpu:0")
	if err != nil {
		t.Fatal(err)
	}
	if e.Budget != 75 || e.CostPerHour != 0.5 || e.RuntimeReason != NoAdapterReason {
		t.Errorf("defaults not applied: budget %d cost %v reason %q", e.Budget, e.CostPerHour, e.RuntimeReason)
	}
	if inv.MemoryStrategy() != MemoryBalanced {
		t.Errorf("MemoryStrategy = %v", inv.MemoryStrategy())
	}
}
