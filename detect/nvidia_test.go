package detect

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// dgxBusIDs are the GPU PCI addresses of a DGX H100, as NVML spells them.
var dgxBusIDs = []string{
	"00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
	"00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0",
}

var testNow = time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)

// gpuState is what one mocked GPU reports for the calls the mocks leave unset.
type gpuState struct {
	busID      string
	util, mem  uint32
	tempC      uint32
	powerMW    uint32
	limitMW    uint32
	smMHz      uint32
	memMHz     uint32
	ecc        uint64
	tempRet    nvml.Return // returned by GetTemperature when not SUCCESS
	archRet    nvml.Return // returned by GetArchitecture when not SUCCESS
	registered bool
	procs      []nvml.ProcessInfo
}

// fakeEvents is an nvml.EventSet whose Wait pops queued events.
type fakeEvents struct {
	*mock.EventSet
	mu    sync.Mutex
	queue []nvml.EventData
}

func newFakeEvents() *fakeEvents {
	f := &fakeEvents{}
	f.EventSet = &mock.EventSet{
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.queue) == 0 {
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
			ev := f.queue[0]
			f.queue = f.queue[1:]
			return ev, nvml.SUCCESS
		},
	}
	return f
}

func (f *fakeEvents) push(dev nvml.Device, eventType, xid uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue = append(f.queue, nvml.EventData{Device: dev, EventType: eventType, EventData: xid})
}

// fixture is a mocked DGX with the telemetry functions set and a sysfs tree.
type fixture struct {
	srv    *server.Server
	state  []*gpuState
	events *fakeEvents
	roots  Roots
}

func newFixture(t *testing.T, srv *server.Server) *fixture {
	t.Helper()
	f := &fixture{srv: srv, events: newFakeEvents()}
	f.roots = Roots{Sys: t.TempDir(), Proc: "/nonexistent/proc", Dev: "/dev"}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return f.events, nvml.SUCCESS }
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		st := &gpuState{
			busID: dgxBusIDs[i], util: uint32(10 + i), mem: uint32(20 + i), tempC: uint32(40 + i),
			powerMW: uint32(300000 + 1000*i), limitMW: 700000, smMHz: 1980, memMHz: 2619,
		}
		f.state = append(f.state, st)
		dev.MemoryInfo = nvml.Memory{Total: dev.MemoryInfo.Total, Used: uint64(i+1) << 30, Free: dev.MemoryInfo.Total - uint64(i+1)<<30}
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j := 0; j < len(st.busID); j++ {
				p.BusId[j] = int8(st.busID[j])
			}
			return p, nvml.SUCCESS
		}
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: st.util, Memory: st.mem}, nvml.SUCCESS
		}
		dev.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) {
			if s != nvml.TEMPERATURE_GPU {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if st.tempRet != nvml.SUCCESS {
				return 0, st.tempRet
			}
			return st.tempC, nvml.SUCCESS
		}
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return st.powerMW, nvml.SUCCESS }
		dev.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return st.limitMW, nvml.SUCCESS }
		dev.GetClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
			switch c {
			case nvml.CLOCK_SM:
				return st.smMHz, nvml.SUCCESS
			case nvml.CLOCK_MEM:
				return st.memMHz, nvml.SUCCESS
			}
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		dev.GetTotalEccErrorsFunc = func(m nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
			if m != nvml.MEMORY_ERROR_TYPE_UNCORRECTED || c != nvml.VOLATILE_ECC {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return st.ecc, nvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			return st.procs, nvml.SUCCESS
		}
		archFunc := dev.GetArchitectureFunc
		dev.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) {
			if st.archRet != nvml.SUCCESS {
				return 0, st.archRet
			}
			return archFunc()
		}
		dev.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
			if types&nvml.EventTypeXidCriticalError == 0 || set != nvml.EventSet(f.events) {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			st.registered = true
			return nvml.SUCCESS
		}
		// NUMA node files for the first half only: the rest must read as -1.
		if i < len(srv.Devices)/2 {
			dir := filepath.Join(f.roots.Sys, "bus", "pci", "devices", normalizePCIBusID(st.busID))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte("1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

func (f *fixture) detector() *NVIDIADetector {
	d := NewNVIDIADetector(f.srv, f.roots)
	d.now = func() time.Time { return testNow }
	return d
}

func (f *fixture) device(i int) *server.Device { return f.srv.Devices[i].(*server.Device) }

func devicePtrs(devs []Device) []*Device {
	out := make([]*Device, len(devs))
	for i := range devs {
		out[i] = &devs[i]
	}
	return out
}

func TestNVIDIADetectDGX(t *testing.T) {
	tests := []struct {
		name     string
		srv      *server.Server
		wantName string
		wantCC   string
		wantArch string
		wantMem  uint64
		wantBF16 bool
	}{
		{"dgx-h100", dgxh100.New(), "NVIDIA H100 80GB HBM3", "9.0", "Hopper", 80 << 30, true},
		{"dgx-a100", dgxa100.New(), "Mock NVIDIA A100-SXM4-40GB", "8.0", "Ampere", 40 << 30, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.srv)
			// MIG on for GPU 1 only.
			if _, ret := f.device(1).SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
				t.Fatalf("SetMigMode: %v", ret)
			}
			d := f.detector()
			res := d.Detect(context.Background())
			t.Cleanup(func() { _ = d.Close() })

			if len(res.Notes) != 0 {
				t.Errorf("notes = %q, want none", res.Notes)
			}
			if len(res.Devices) != 8 {
				t.Fatalf("got %d devices, want 8", len(res.Devices))
			}
			for i, got := range res.Devices {
				mockDev := f.device(i)
				wantNUMA := -1
				if i < 4 {
					wantNUMA = 1
				}
				used := uint64(i+1) << 30
				checks := []struct {
					field     string
					got, want any
				}{
					{"ID", got.ID, fmt.Sprintf("gpu:%d", i)},
					{"Type", got.Type, TypeGPU},
					{"Index", got.Index, i},
					{"Vendor", got.Vendor, "NVIDIA"},
					{"Name", got.Name, tc.wantName},
					{"UUID", got.UUID, mockDev.UUID},
					{"PCIBusID", got.PCIBusID, strings.ToLower(dgxBusIDs[i][4:])},
					{"NUMANode", got.NUMANode, wantNUMA},
					{"MemoryTotal", got.MemoryTotal, tc.wantMem},
					{"MemoryFree", got.MemoryFree, tc.wantMem - used},
					{"ComputeCapability", got.ComputeCapability, tc.wantCC},
					{"DriverVersion", got.DriverVersion, "550.54.15"},
					{"CUDAVersion", got.CUDAVersion, "12.4"},
					{"Architecture", got.Architecture, tc.wantArch},
					{"BF16", got.BF16, tc.wantBF16},
					{"FP16", got.FP16, true},
					{"MultiDevice", got.MultiDevice, true},
					{"DevicePaths", fmt.Sprint(got.DevicePaths), fmt.Sprintf("[/dev/nvidia%d]", i)},
					{"Health", got.Health, Healthy},
					{"MIGEnabled", got.GPU.MIGEnabled, i == 1},
					{"ECCUncorrectedErrors", got.GPU.ECCUncorrectedErrors, uint64(0)},
					{"Telemetry.MemoryUsed", got.Telemetry.MemoryUsed, used},
					{"Telemetry.MemoryTotal", got.Telemetry.MemoryTotal, tc.wantMem},
					{"Telemetry.UtilizationPercent", got.Telemetry.UtilizationPercent, float64(10 + i)},
					{"Telemetry.TemperatureC", got.Telemetry.TemperatureC, float64(40 + i)},
					{"Telemetry.PowerW", got.Telemetry.PowerW, float64(300 + i)},
					{"Telemetry.UpdatedAt", got.Telemetry.UpdatedAt, testNow},
					{"events registered", f.state[i].registered, true},
				}
				for _, c := range checks {
					if c.got != c.want {
						t.Errorf("gpu %d %s = %v, want %v", i, c.field, c.got, c.want)
					}
				}
			}
		})
	}
}

func TestNVIDIANVMLInitFailure(t *testing.T) {
	tests := []struct {
		name     string
		ret      nvml.Return
		wantNote string
	}{
		{"library not found", nvml.ERROR_LIBRARY_NOT_FOUND, "NVML not found (libnvidia-ml.so.1): no NVIDIA GPUs detected"},
		{"driver not loaded", nvml.ERROR_DRIVER_NOT_LOADED, "NVML failed to start (ERROR_DRIVER_NOT_LOADED): no NVIDIA GPUs detected"},
		{"no permission", nvml.ERROR_NO_PERMISSION, "NVML failed to start (ERROR_NO_PERMISSION): no NVIDIA GPUs detected"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := &mock.Interface{
				InitFunc:     func() nvml.Return { return tc.ret },
				ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
			}
			d := NewNVIDIADetector(lib, DefaultRoots())
			res := d.Detect(context.Background())
			if len(res.Devices) != 0 {
				t.Errorf("got %d devices, want none", len(res.Devices))
			}
			if len(res.Notes) != 1 || res.Notes[0] != tc.wantNote {
				t.Errorf("notes = %q, want [%q]", res.Notes, tc.wantNote)
			}
			// Refresh on a detector that never started must not touch NVML.
			d.Refresh(context.Background(), []*Device{{Type: TypeGPU, UUID: "GPU-x"}})
			if err := d.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if n := len(lib.ShutdownCalls()); n != 0 {
				t.Errorf("Shutdown called %d times after a failed Init, want 0", n)
			}
		})
	}
}

// TestNVMLRealLibrary calls the real go-nvml: on a host without the NVIDIA
// driver it must report the missing library rather than crash.
func TestNVMLRealLibrary(t *testing.T) {
	t.Run("missing path", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
		d := NewNVMLDetector(DefaultRoots(), path)
		res := d.Detect(context.Background())
		want := "NVML not found (" + path + "): no NVIDIA GPUs detected"
		if len(res.Devices) != 0 || len(res.Notes) != 1 || res.Notes[0] != want {
			t.Errorf("Detect = %d devices, notes %q; want none and [%q]", len(res.Devices), res.Notes, want)
		}
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	t.Run("default library", func(t *testing.T) {
		d := NewNVMLDetector(DefaultRoots(), "")
		res := d.Detect(context.Background())
		defer func() {
			if err := d.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}()
		want := "NVML not found (libnvidia-ml.so.1): no NVIDIA GPUs detected"
		if len(res.Devices) == 0 {
			if _, err := os.Stat("/dev/nvidiactl"); err == nil {
				t.Logf("driver present but no GPUs: notes %q", res.Notes)
				return
			}
			if len(res.Notes) != 1 || res.Notes[0] != want {
				t.Errorf("notes = %q, want [%q]", res.Notes, want)
			}
			return
		}
		// A host with the driver: every GPU must be described.
		for _, dev := range res.Devices {
			if !strings.HasPrefix(dev.UUID, "GPU-") || dev.Name == "" || dev.PCIBusID == "" || dev.MemoryTotal == 0 || dev.ComputeCapability == "" {
				t.Errorf("incomplete device %+v", dev)
			}
		}
		d.Refresh(context.Background(), devicePtrs(res.Devices))
		for _, dev := range res.Devices {
			if dev.Telemetry.UpdatedAt.IsZero() || dev.Telemetry.MemoryTotal == 0 {
				t.Errorf("%s: telemetry not refreshed: %+v", dev.ID, dev.Telemetry)
			}
			t.Logf("%s %s %s pci=%s numa=%d cc=%s arch=%s mem=%d driver=%s cuda=%s health=%s tel=%+v",
				dev.ID, dev.Name, dev.UUID, dev.PCIBusID, dev.NUMANode, dev.ComputeCapability, dev.Architecture,
				dev.MemoryTotal, dev.DriverVersion, dev.CUDAVersion, dev.Health, dev.Telemetry)
		}
	})
}

func TestNVIDIAHandleErrorSkipsGPU(t *testing.T) {
	f := newFixture(t, dgxh100.New())
	byIndex := f.srv.DeviceGetHandleByIndexFunc
	f.srv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 3 {
			return nil, nvml.ERROR_UNKNOWN
		}
		return byIndex(i)
	}
	d := f.detector()
	res := d.Detect(context.Background())
	t.Cleanup(func() { _ = d.Close() })

	var ids []string
	for _, dev := range res.Devices {
		ids = append(ids, dev.ID)
	}
	if got, want := strings.Join(ids, ","), "gpu:0,gpu:1,gpu:2,gpu:4,gpu:5,gpu:6,gpu:7"; got != want {
		t.Errorf("IDs = %s, want %s", got, want)
	}
	want := "NVIDIA GPU 3 skipped: cannot get its NVML handle: ERROR_UNKNOWN"
	if len(res.Notes) != 1 || res.Notes[0] != want {
		t.Errorf("notes = %q, want [%q]", res.Notes, want)
	}
}

func TestNVIDIAUnsupportedFields(t *testing.T) {
	tests := []struct {
		name      string
		ret       nvml.Return
		wantNotes []string
	}{
		{"not supported is silent", nvml.ERROR_NOT_SUPPORTED, nil},
		{"other errors are noted", nvml.ERROR_UNKNOWN, []string{
			"gpu:0: NVML GetArchitecture failed: ERROR_UNKNOWN",
			"gpu:0: NVML GetTemperature failed: ERROR_UNKNOWN",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, dgxh100.NewWithGPUs(dgxh100.NewDevice(0).Config))
			f.state[0].tempRet = tc.ret
			f.state[0].archRet = tc.ret
			d := f.detector()
			res := d.Detect(context.Background())
			t.Cleanup(func() { _ = d.Close() })
			if len(res.Devices) != 1 {
				t.Fatalf("got %d devices, want 1", len(res.Devices))
			}
			dev := res.Devices[0]
			if dev.Architecture != "" || dev.Telemetry.TemperatureC != 0 {
				t.Errorf("Architecture %q, TemperatureC %v; want both empty", dev.Architecture, dev.Telemetry.TemperatureC)
			}
			if dev.Name != "NVIDIA H100 80GB HBM3" || dev.Health != Healthy || dev.Telemetry.PowerW != 300 {
				t.Errorf("device = %+v, want the other fields read and healthy", dev)
			}
			if fmt.Sprint(res.Notes) != fmt.Sprint(tc.wantNotes) {
				t.Errorf("notes = %q, want %q", res.Notes, tc.wantNotes)
			}
		})
	}
}

func TestNVIDIAXIDHealth(t *testing.T) {
	tests := []struct {
		name       string
		xid        uint64
		wantHealth Health
		wantReason string
	}{
		{"13 graphics exception is the application's", 13, Healthy, ""},
		{"31 page fault is the application's", 31, Healthy, ""},
		{"43 stopped processing is the application's", 43, Healthy, ""},
		{"45 preemptive cleanup is the application's", 45, Healthy, ""},
		{"68 video processor is the application's", 68, Healthy, ""},
		{"109 context switch timeout is the application's", 109, Healthy, ""},
		{"48 double-bit ECC", 48, Unhealthy, "XID 48 (double-bit ECC error) at 2025-03-04T05:06:07Z"},
		{"74 NVLink", 74, Unhealthy, "XID 74 (NVLink error) at 2025-03-04T05:06:07Z"},
		{"79 fallen off the bus", 79, Unhealthy, "XID 79 (fallen off the bus) at 2025-03-04T05:06:07Z"},
		{"95 uncontained ECC", 95, Unhealthy, "XID 95 (uncontained ECC error) at 2025-03-04T05:06:07Z"},
		{"119 GSP", 119, Unhealthy, "XID 119 (GSP RPC timeout) at 2025-03-04T05:06:07Z"},
		{"unnamed XID", 61, Unhealthy, "XID 61 at 2025-03-04T05:06:07Z"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, dgxh100.New())
			d := f.detector()
			res := d.Detect(context.Background())
			t.Cleanup(func() { _ = d.Close() })
			devs := devicePtrs(res.Devices)

			f.events.push(f.device(2), nvml.EventTypeXidCriticalError, tc.xid)
			// Another event type on GPU 5 must be ignored.
			f.events.push(f.device(5), nvml.EventTypeSingleBitEccError, 79)
			d.Refresh(context.Background(), devs)

			for i, dev := range devs {
				wantHealth, wantReason, wantXID := Healthy, "", uint64(0)
				if i == 2 {
					wantHealth, wantReason, wantXID = tc.wantHealth, tc.wantReason, tc.xid
				}
				if dev.Health != wantHealth || dev.HealthReason != wantReason || dev.GPU.LastXID != wantXID {
					t.Errorf("gpu %d: health %s %q, LastXID %d; want %s %q, %d",
						i, dev.Health, dev.HealthReason, dev.GPU.LastXID, wantHealth, wantReason, wantXID)
				}
			}
			evs := d.XIDEvents()
			if len(evs) != 1 || evs[0].DeviceID != "gpu:2" || evs[0].XID != tc.xid || evs[0].UUID != f.device(2).UUID {
				t.Errorf("XIDEvents = %+v, want one XID %d on gpu:2", evs, tc.xid)
			}
		})
	}
}

func TestNVIDIAXIDFaultAndApplicationError(t *testing.T) {
	f := newFixture(t, dgxh100.New())
	d := f.detector()
	res := d.Detect(context.Background())
	t.Cleanup(func() { _ = d.Close() })
	devs := devicePtrs(res.Devices)

	f.events.push(f.device(6), nvml.EventTypeXidCriticalError, 79)
	f.events.push(f.device(1), nvml.EventTypeXidCriticalError, 13)
	d.Refresh(context.Background(), devs)

	var unhealthy []string
	for _, dev := range devs {
		if dev.Health != Healthy {
			unhealthy = append(unhealthy, dev.ID+": "+dev.HealthReason)
		}
	}
	want := "gpu:6: XID 79 (fallen off the bus) at 2025-03-04T05:06:07Z"
	if len(unhealthy) != 1 || unhealthy[0] != want {
		t.Errorf("unhealthy = %q, want [%q]", unhealthy, want)
	}
	if devs[1].GPU.LastXID != 13 || devs[6].GPU.LastXID != 79 {
		t.Errorf("LastXID gpu:1 %d, gpu:6 %d; want 13 and 79", devs[1].GPU.LastXID, devs[6].GPU.LastXID)
	}

	// A later fault keeps the first reason: it is the root cause.
	f.events.push(f.device(6), nvml.EventTypeXidCriticalError, 48)
	d.Refresh(context.Background(), devs)
	if devs[6].HealthReason != want[len("gpu:6: "):] || devs[6].GPU.LastXID != 48 {
		t.Errorf("gpu:6 after a second fault: %q LastXID %d", devs[6].HealthReason, devs[6].GPU.LastXID)
	}
}

func TestNVIDIARefreshTelemetry(t *testing.T) {
	f := newFixture(t, dgxh100.New())
	d := f.detector()
	res := d.Detect(context.Background())
	t.Cleanup(func() { _ = d.Close() })

	later := testNow.Add(5 * time.Second)
	d.now = func() time.Time { return later }
	for i, st := range f.state {
		st.util, st.mem, st.tempC = uint32(90-i), uint32(70-i), uint32(60+i)
		st.powerMW, st.limitMW = uint32(650500+i), 690000
		st.smMHz, st.memMHz = uint32(1755+i), 2619
		// Another process holds 3 GiB on every GPU; brokerd's own 1 GiB
		// on GPU 0 is not counted as someone else's.
		st.procs = []nvml.ProcessInfo{{Pid: uint32(os.Getpid() + 1), UsedGpuMemory: 3 << 30}}
		if i == 0 {
			st.procs = append(st.procs, nvml.ProcessInfo{Pid: uint32(os.Getpid()), UsedGpuMemory: 1 << 30})
		}
		dev := f.device(i)
		dev.MemoryInfo.Used = 70 << 30
		dev.MemoryInfo.Free = dev.MemoryInfo.Total - 70<<30
	}
	// The refresher must leave devices it does not know alone.
	cpu := &Device{ID: "cpu:0", Type: TypeCPU, Health: Healthy}
	stranger := &Device{ID: "gpu:9", Type: TypeGPU, UUID: "GPU-not-here", Health: Healthy}
	devs := append(devicePtrs(res.Devices), cpu, stranger)
	d.Refresh(context.Background(), devs)

	for i, dev := range devs[:8] {
		want := Telemetry{
			MemoryUsed:               70 << 30,
			MemoryTotal:              80 << 30,
			UtilizationPercent:       float64(90 - i),
			MemoryUtilizationPercent: float64(70 - i),
			TemperatureC:             float64(60 + i),
			PowerW:                   float64(650500+i) / 1000,
			PowerLimitW:              690,
			SMClockMHz:               uint32(1755 + i),
			MemClockMHz:              2619,
			MemoryUsedByOthers:       3 << 30,
			UpdatedAt:                later,
		}
		if dev.Telemetry != want {
			t.Errorf("gpu %d telemetry\n got %+v\nwant %+v", i, dev.Telemetry, want)
		}
		if dev.MemoryFree != 10<<30 {
			t.Errorf("gpu %d MemoryFree = %d, want %d", i, dev.MemoryFree, uint64(10<<30))
		}
	}
	if (cpu.Telemetry != Telemetry{}) || (stranger.Telemetry != Telemetry{}) || stranger.GPU != nil {
		t.Errorf("unknown devices changed: cpu %+v, stranger %+v", cpu, stranger)
	}
}

func TestNVIDIAEccIncreaseMarksUnhealthy(t *testing.T) {
	tests := []struct {
		name       string
		before     uint64
		after      uint64
		wantHealth Health
		wantReason string
	}{
		{"unchanged", 2, 2, Healthy, ""},
		{"rose", 2, 3, Unhealthy, "uncorrected ECC errors rose from 2 to 3 at 2025-03-04T05:06:07Z"},
		{"reset by driver reload", 2, 0, Healthy, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, dgxh100.New())
			f.state[4].ecc = tc.before
			d := f.detector()
			res := d.Detect(context.Background())
			t.Cleanup(func() { _ = d.Close() })
			devs := devicePtrs(res.Devices)
			if devs[4].GPU.ECCUncorrectedErrors != tc.before {
				t.Fatalf("ECC at detect = %d, want %d", devs[4].GPU.ECCUncorrectedErrors, tc.before)
			}

			f.state[4].ecc = tc.after
			d.Refresh(context.Background(), devs)
			for i, dev := range devs {
				wantHealth, wantReason := Healthy, ""
				if i == 4 {
					wantHealth, wantReason = tc.wantHealth, tc.wantReason
				}
				if dev.Health != wantHealth || dev.HealthReason != wantReason {
					t.Errorf("gpu %d: %s %q, want %s %q", i, dev.Health, dev.HealthReason, wantHealth, wantReason)
				}
			}
			if devs[4].GPU.ECCUncorrectedErrors != tc.after {
				t.Errorf("ECC after refresh = %d, want %d", devs[4].GPU.ECCUncorrectedErrors, tc.after)
			}
		})
	}
}

func TestNVIDIACloseAndRedetect(t *testing.T) {
	f := newFixture(t, dgxh100.New())
	var created []*fakeEvents
	f.srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		created = append(created, newFakeEvents())
		f.events = created[len(created)-1]
		return f.events, nvml.SUCCESS
	}
	d := f.detector()
	first := d.Detect(context.Background())
	second := d.Detect(context.Background())
	if len(first.Devices) != 8 || len(second.Devices) != 8 {
		t.Fatalf("devices %d then %d, want 8 both times", len(first.Devices), len(second.Devices))
	}
	if n := len(f.srv.InitCalls()); n != 1 {
		t.Errorf("Init called %d times, want 1", n)
	}
	if n := len(created[0].FreeCalls()); n != 1 {
		t.Errorf("first event set freed %d times by the second Detect, want 1", n)
	}
	for i := 0; i < 2; i++ {
		if err := d.Close(); err != nil {
			t.Errorf("Close #%d: %v", i+1, err)
		}
	}
	if n := len(f.srv.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
	if n := len(created[1].FreeCalls()); n != 1 {
		t.Errorf("second event set freed %d times, want 1", n)
	}

	// Close reports a failing Shutdown as a wrapped nvml.Return.
	f2 := newFixture(t, dgxa100.New())
	f2.srv.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
	d2 := f2.detector()
	d2.Detect(context.Background())
	err := d2.Close()
	var ret nvml.Return
	if err == nil || !errors.As(err, &ret) || ret != nvml.ERROR_UNKNOWN {
		t.Errorf("Close = %v, want a wrapped ERROR_UNKNOWN", err)
	}
}

func TestNVIDIAConcurrentRefresh(t *testing.T) {
	f := newFixture(t, dgxh100.New())
	d := f.detector()
	res := d.Detect(context.Background())
	t.Cleanup(func() { _ = d.Close() })
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		// Each goroutine refreshes its own copies, as an inventory snapshot would.
		devs := devicePtrs(append([]Device(nil), res.Devices...))
		wg.Add(2)
		go func() {
			defer wg.Done()
			for n := 0; n < 20; n++ {
				d.Refresh(context.Background(), devs)
			}
		}()
		go func() {
			defer wg.Done()
			for n := 0; n < 20; n++ {
				f.events.push(f.device(n%8), nvml.EventTypeXidCriticalError, 13)
				_ = d.XIDEvents()
			}
		}()
	}
	wg.Wait()
	d.Refresh(context.Background(), devicePtrs(res.Devices))
	if got := len(d.XIDEvents()); got != recentXIDLimit {
		t.Errorf("kept %d XID events, want the last %d", got, recentXIDLimit)
	}
}

func TestNVIDIAHelpers(t *testing.T) {
	t.Run("normalizePCIBusID", func(t *testing.T) {
		for in, want := range map[string]string{
			"00000000:1B:00.0": "0000:1b:00.0",
			"00000001:DB:00.0": "0001:db:00.0",
			"0000:1b:00.0":     "0000:1b:00.0",
			"1B:00.0":          "0000:1b:00.0",
			"":                 "",
		} {
			if got := normalizePCIBusID(in); got != want {
				t.Errorf("normalizePCIBusID(%q) = %q, want %q", in, got, want)
			}
		}
	})
	t.Run("cudaVersionString", func(t *testing.T) {
		for in, want := range map[int]string{12040: "12.4", 11080: "11.8", 12090: "12.9", 13000: "13.0", 0: ""} {
			if got := cudaVersionString(in); got != want {
				t.Errorf("cudaVersionString(%d) = %q, want %q", in, got, want)
			}
		}
	})
	t.Run("architectureName", func(t *testing.T) {
		for in, want := range map[nvml.DeviceArchitecture]string{
			nvml.DEVICE_ARCH_HOPPER: "Hopper", nvml.DEVICE_ARCH_AMPERE: "Ampere", nvml.DEVICE_ARCH_BLACKWELL: "Blackwell",
			nvml.DEVICE_ARCH_ADA: "Ada Lovelace", nvml.DEVICE_ARCH_UNKNOWN: "", 14: "architecture 14",
		} {
			if got := architectureName(in); got != want {
				t.Errorf("architectureName(%d) = %q, want %q", in, got, want)
			}
		}
	})
}
