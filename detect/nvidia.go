package detect

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is the part of go-nvml the NVIDIA detector uses. Both nvml.New() and
// go-nvml's mocks satisfy it, so the detector is tested without a driver.
type NVML interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	SystemGetDriverVersion() (string, nvml.Return)
	SystemGetCudaDriverVersion() (int, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(index int) (nvml.Device, nvml.Return)
	EventSetCreate() (nvml.EventSet, nvml.Return)
}

// DefaultNVMLLibrary is the library go-nvml opens when no path is given.
const DefaultNVMLLibrary = "libnvidia-ml.so.1"

const (
	// maxXIDDrain bounds one drain so a storm of events cannot stall a refresh.
	maxXIDDrain = 1024
	// recentXIDLimit is how many drained events XIDEvents keeps for the report.
	recentXIDLimit = 64
)

// XIDEvent is one XID critical error NVML reported for a GPU.
type XIDEvent struct {
	// DeviceID is "gpu:<NVML index>" as Detect named it (the registry may
	// assign another ID; match on UUID); empty for a GPU Detect did not find.
	DeviceID string
	UUID     string
	XID      uint64
	// Name is the XID's short description; empty for XIDs not in the table.
	Name string
	// Application is true for XIDs caused by the running program rather
	// than the device (13, 31, 43, 45, 68, 109); they leave a GPU healthy.
	Application bool
	Time        time.Time
}

// String describes the event as it appears in a HealthReason.
func (e XIDEvent) String() string {
	at := e.Time.UTC().Format(time.RFC3339)
	if e.Name == "" {
		return fmt.Sprintf("XID %d at %s", e.XID, at)
	}
	return fmt.Sprintf("XID %d (%s) at %s", e.XID, e.Name, at)
}

// xidInfo names the well-known XIDs and says which are application errors,
// following NVIDIA's XID catalogue and the k8s-device-plugin's skip list.
func xidInfo(xid uint64) (name string, application bool) {
	switch xid {
	case 13:
		return "graphics engine exception", true
	case 31:
		return "GPU memory page fault", true
	case 43:
		return "GPU stopped processing", true
	case 45:
		return "preemptive cleanup", true
	case 68:
		return "video processor exception", true
	case 109:
		return "context switch timeout", true
	case 48:
		return "double-bit ECC error", false
	case 63:
		return "ECC row remapping recorded", false
	case 64:
		return "ECC row remapping failed", false
	case 74:
		return "NVLink error", false
	case 79:
		return "fallen off the bus", false
	case 92:
		return "high single-bit ECC error rate", false
	case 94:
		return "contained ECC error", false
	case 95:
		return "uncontained ECC error", false
	case 119:
		return "GSP RPC timeout", false
	case 120:
		return "GSP error", false
	}
	return "", false
}

// nvmlGPU is a GPU Detect found, kept so Refresh can read it again.
type nvmlGPU struct {
	id       string
	uuid     string
	pciBusID string
	handle   nvml.Device
}

// NVIDIADetector finds NVIDIA GPUs through NVML and keeps their telemetry
// and health fresh. It is safe for concurrent use; Refresh mutates the
// devices it is given, so callers serialise access to those.
type NVIDIADetector struct {
	lib     NVML
	libName string // shown in the "not found" note
	roots   Roots
	now     func() time.Time
	selfPID int

	mu          sync.Mutex
	initialized bool // Init succeeded, so Close must Shutdown
	events      nvml.EventSet
	gpus        []nvmlGPU
	recent      []XIDEvent
}

var (
	_ Detector  = (*NVIDIADetector)(nil)
	_ Refresher = (*NVIDIADetector)(nil)
)

// NewNVIDIADetector returns a detector over lib: the real library
// (NewNVMLDetector) or a mock in tests.
func NewNVIDIADetector(lib NVML, roots Roots) *NVIDIADetector {
	return &NVIDIADetector{lib: lib, libName: DefaultNVMLLibrary, roots: roots, now: time.Now, selfPID: os.Getpid()}
}

// NewNVMLDetector returns a detector over the host's NVML library, opened
// from libraryPath when given, else from DefaultNVMLLibrary on the loader
// path. Nothing is loaded until Detect.
func NewNVMLDetector(roots Roots, libraryPath string) *NVIDIADetector {
	var opts []nvml.LibraryOption
	name := DefaultNVMLLibrary
	if libraryPath != "" {
		opts = append(opts, nvml.WithLibraryPath(libraryPath))
		name = libraryPath
	}
	d := NewNVIDIADetector(nvml.New(opts...), roots)
	d.libName = name
	return d
}

// Name implements Detector.
func (d *NVIDIADetector) Name() string { return "nvidia" }

// Detect starts NVML (once) and describes every GPU it reports. NVML that
// cannot start yields no devices and a note, never an error, so a CPU-only
// host carries on.
func (d *NVIDIADetector) Detect(ctx context.Context) Result {
	d.mu.Lock()
	defer d.mu.Unlock()

	var res Result
	note := func(format string, args ...any) { res.Notes = append(res.Notes, fmt.Sprintf(format, args...)) }
	if err := ctx.Err(); err != nil {
		note("NVIDIA detection skipped: %v", err)
		return res
	}

	if !d.initialized {
		switch ret := d.lib.Init(); ret {
		case nvml.SUCCESS:
			d.initialized = true
		case nvml.ERROR_LIBRARY_NOT_FOUND:
			note("NVML not found (%s): no NVIDIA GPUs detected", d.libName)
			return res
		default:
			note("NVML failed to start (%v): no NVIDIA GPUs detected", ret)
			return res
		}
	}
	// A repeated Detect re-enumerates from scratch with a fresh event set.
	if err := d.freeEventsLocked(); err != nil {
		note("%v", err)
	}
	d.gpus = nil

	driver := ""
	if v, ret := d.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		driver = v
	} else if ret != nvml.ERROR_NOT_SUPPORTED {
		note("NVML driver version unavailable: %v", ret)
	}
	cuda := ""
	if v, ret := d.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		cuda = cudaVersionString(v)
	} else if ret != nvml.ERROR_NOT_SUPPORTED {
		note("NVML CUDA driver version unavailable: %v", ret)
	}

	count, ret := d.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		note("NVML could not count GPUs (%v): no NVIDIA GPUs detected", ret)
		return res
	}
	if count == 0 {
		note("NVML reports no NVIDIA GPUs")
		return res
	}

	events, ret := d.lib.EventSetCreate()
	if ret == nvml.SUCCESS {
		d.events = events
	} else {
		note("NVML event set unavailable (%v): XID health events are not monitored", ret)
	}

	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			note("NVIDIA detection stopped after %d of %d GPUs: %v", i, count, err)
			break
		}
		handle, ret := d.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			note("NVIDIA GPU %d skipped: cannot get its NVML handle: %v", i, ret)
			continue
		}
		dev, devNotes := d.describe(i, handle, driver, cuda)
		res.Notes = append(res.Notes, devNotes...)
		if d.events != nil {
			switch ret := handle.RegisterEvents(nvml.EventTypeXidCriticalError, d.events); ret {
			case nvml.SUCCESS:
			case nvml.ERROR_NOT_SUPPORTED:
				note("%s: XID events not supported; health follows ECC counters only", dev.ID)
			default:
				note("%s: XID event registration failed: %v", dev.ID, ret)
			}
		}
		d.gpus = append(d.gpus, nvmlGPU{id: dev.ID, uuid: dev.UUID, pciBusID: dev.PCIBusID, handle: handle})
		res.Devices = append(res.Devices, dev)
	}
	return res
}

// describe reads one GPU. Fields NVML does not support stay empty; other
// failures leave the field empty and add a note.
func (d *NVIDIADetector) describe(index int, h nvml.Device, driver, cuda string) (Device, []string) {
	dev := Device{
		ID:            "gpu:" + strconv.Itoa(index),
		Type:          TypeGPU,
		Index:         index,
		Vendor:        "NVIDIA",
		NUMANode:      -1,
		DriverVersion: driver,
		CUDAVersion:   cuda,
		MultiDevice:   true,
		Health:        Healthy,
		GPU:           &GPUInfo{},
	}
	var notes []string
	ok := func(what string, ret nvml.Return) bool {
		if ret == nvml.SUCCESS {
			return true
		}
		if ret != nvml.ERROR_NOT_SUPPORTED {
			notes = append(notes, fmt.Sprintf("%s: NVML %s failed: %v", dev.ID, what, ret))
		}
		return false
	}

	if v, ret := h.GetName(); ok("GetName", ret) {
		dev.Name = v
	}
	if v, ret := h.GetUUID(); ok("GetUUID", ret) {
		dev.UUID = v
	}
	if v, ret := h.GetPciInfo(); ok("GetPciInfo", ret) {
		dev.PCIBusID = normalizePCIBusID(cString(v.BusId[:]))
	}
	if dev.PCIBusID != "" {
		dev.NUMANode = readNUMANode(d.roots, dev.PCIBusID)
	}
	if major, minor, ret := h.GetCudaComputeCapability(); ok("GetCudaComputeCapability", ret) {
		dev.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
		dev.BF16 = major >= 8
		dev.FP16 = major >= 6
	}
	if v, ret := h.GetArchitecture(); ok("GetArchitecture", ret) {
		dev.Architecture = architectureName(v)
	}
	if v, ret := h.GetMinorNumber(); ok("GetMinorNumber", ret) {
		dev.DevicePaths = []string{d.roots.DevPath("nvidia" + strconv.Itoa(v))}
	}
	if current, _, ret := h.GetMigMode(); ok("GetMigMode", ret) {
		dev.GPU.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
	}

	r := readGPU(h, d.now(), d.selfPID)
	for _, e := range r.errs {
		notes = append(notes, fmt.Sprintf("%s: %s", dev.ID, e))
	}
	dev.Telemetry = r.tel
	dev.MemoryTotal = r.tel.MemoryTotal
	dev.MemoryFree = r.memFree
	dev.GPU.ECCUncorrectedErrors = r.ecc
	if r.lost {
		dev.Health = Unhealthy
		dev.HealthReason = "NVML reports the GPU is lost"
	}
	return dev, notes
}

// gpuReadings is one pass over a GPU's changing values.
type gpuReadings struct {
	tel     Telemetry
	memFree uint64
	ecc     uint64
	eccOK   bool
	lost    bool     // some call returned ERROR_GPU_IS_LOST
	errs    []string // failures other than NOT_SUPPORTED
}

// selfPID is brokerd's own process, whose GPU memory is not "used by others".
func readGPU(h nvml.Device, now time.Time, selfPID int) gpuReadings {
	var r gpuReadings
	ok := func(what string, ret nvml.Return) bool {
		if ret == nvml.SUCCESS {
			return true
		}
		switch ret {
		case nvml.ERROR_NOT_SUPPORTED:
		case nvml.ERROR_GPU_IS_LOST:
			r.lost = true
		default:
			r.errs = append(r.errs, fmt.Sprintf("NVML %s failed: %v", what, ret))
		}
		return false
	}

	if m, ret := h.GetMemoryInfo(); ok("GetMemoryInfo", ret) {
		r.tel.MemoryTotal = m.Total
		r.tel.MemoryUsed = m.Used
		r.memFree = m.Free
	}
	if u, ret := h.GetUtilizationRates(); ok("GetUtilizationRates", ret) {
		r.tel.UtilizationPercent = float64(u.Gpu)
		r.tel.MemoryUtilizationPercent = float64(u.Memory)
	}
	if v, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ok("GetTemperature", ret) {
		r.tel.TemperatureC = float64(v)
	}
	if mw, ret := h.GetPowerUsage(); ok("GetPowerUsage", ret) {
		r.tel.PowerW = float64(mw) / 1000
	}
	if mw, ret := h.GetEnforcedPowerLimit(); ok("GetEnforcedPowerLimit", ret) {
		r.tel.PowerLimitW = float64(mw) / 1000
	}
	if v, ret := h.GetClockInfo(nvml.CLOCK_SM); ok("GetClockInfo(SM)", ret) {
		r.tel.SMClockMHz = v
	}
	if v, ret := h.GetClockInfo(nvml.CLOCK_MEM); ok("GetClockInfo(MEM)", ret) {
		r.tel.MemClockMHz = v
	}
	if v, ret := h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ok("GetTotalEccErrors", ret) {
		r.ecc, r.eccOK = v, true
	}
	// Memory other processes hold tells the report that the GPU is shared,
	// which matters for how much of it brokerd should plan to use.
	if procs, ret := h.GetComputeRunningProcesses(); ok("GetComputeRunningProcesses", ret) {
		for _, p := range procs {
			if int(p.Pid) != selfPID {
				r.tel.MemoryUsedByOthers += p.UsedGpuMemory
			}
		}
	}
	r.tel.UpdatedAt = now
	return r
}

// Refresh implements Refresher: it drains pending XID events and re-reads
// the telemetry of the GPUs Detect found, matched by UUID (else PCI
// address). Devices it does not know are left untouched. Health only moves
// to Unhealthy here; a faulted GPU stays so until brokerd restarts.
func (d *NVIDIADetector) Refresh(ctx context.Context, devices []*Device) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialized {
		return
	}

	events := d.drainLocked(ctx)
	now := d.now()
	for _, dev := range devices {
		if ctx.Err() != nil {
			return
		}
		if dev == nil || dev.Type != TypeGPU {
			continue
		}
		g, found := d.lookupLocked(dev)
		if !found {
			continue
		}
		r := readGPU(g.handle, now, d.selfPID)
		dev.Telemetry = r.tel
		if r.tel.MemoryTotal != 0 {
			dev.MemoryTotal = r.tel.MemoryTotal
			dev.MemoryFree = r.memFree
		}
		if r.lost {
			markUnhealthy(dev, "NVML reports the GPU is lost at "+now.UTC().Format(time.RFC3339))
		}
		if r.eccOK {
			if dev.GPU == nil {
				dev.GPU = &GPUInfo{ECCUncorrectedErrors: r.ecc}
			}
			// The volatile counter only falls when the driver reloads; a
			// rise is a new uncorrectable error.
			if r.ecc > dev.GPU.ECCUncorrectedErrors {
				markUnhealthy(dev, fmt.Sprintf("uncorrected ECC errors rose from %d to %d at %s",
					dev.GPU.ECCUncorrectedErrors, r.ecc, now.UTC().Format(time.RFC3339)))
			}
			dev.GPU.ECCUncorrectedErrors = r.ecc
		}
	}

	for _, ev := range events {
		for _, dev := range devices {
			if dev == nil || dev.Type != TypeGPU || ev.UUID == "" || dev.UUID != ev.UUID {
				continue
			}
			if dev.GPU == nil {
				dev.GPU = &GPUInfo{}
			}
			dev.GPU.LastXID = ev.XID
			if !ev.Application {
				markUnhealthy(dev, ev.String())
			}
		}
	}
}

// markUnhealthy keeps the first reason: it is the root cause, and later
// faults on a broken GPU are usually its consequences.
func markUnhealthy(dev *Device, reason string) {
	if dev.Health == Unhealthy {
		return
	}
	dev.Health = Unhealthy
	dev.HealthReason = reason
}

func (d *NVIDIADetector) lookupLocked(dev *Device) (nvmlGPU, bool) {
	for _, g := range d.gpus {
		if dev.UUID != "" && g.uuid == dev.UUID {
			return g, true
		}
	}
	if dev.UUID == "" && dev.PCIBusID != "" {
		for _, g := range d.gpus {
			if g.pciBusID == dev.PCIBusID {
				return g, true
			}
		}
	}
	return nvmlGPU{}, false
}

// drainLocked collects the XID events pending in the event set without
// blocking: Wait(0) returns ERROR_TIMEOUT once the set is empty.
func (d *NVIDIADetector) drainLocked(ctx context.Context) []XIDEvent {
	if d.events == nil {
		return nil
	}
	var out []XIDEvent
	for n := 0; n < maxXIDDrain && ctx.Err() == nil; n++ {
		data, ret := d.events.Wait(0)
		if ret != nvml.SUCCESS {
			break
		}
		if data.EventType != nvml.EventTypeXidCriticalError {
			continue
		}
		ev := XIDEvent{XID: data.EventData, Time: d.now()}
		ev.Name, ev.Application = xidInfo(ev.XID)
		if data.Device != nil {
			if uuid, ret := data.Device.GetUUID(); ret == nvml.SUCCESS {
				ev.UUID = uuid
			}
		}
		for _, g := range d.gpus {
			if ev.UUID != "" && g.uuid == ev.UUID {
				ev.DeviceID = g.id
			}
		}
		out = append(out, ev)
	}
	d.recent = append(d.recent, out...)
	if extra := len(d.recent) - recentXIDLimit; extra > 0 {
		d.recent = append([]XIDEvent(nil), d.recent[extra:]...)
	}
	return out
}

// XIDEvents returns the latest XID events Refresh drained, oldest first, for
// the report. It does not consume events; Refresh does.
func (d *NVIDIADetector) XIDEvents() []XIDEvent {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]XIDEvent(nil), d.recent...)
}

// Close frees the event set and shuts NVML down if Detect started it. It is
// safe to call more than once, and on a host where NVML never loaded.
func (d *NVIDIADetector) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.freeEventsLocked()
	d.gpus = nil
	if d.initialized {
		// Shutdown on a library that never loaded would call a missing
		// symbol, so it is only called after a successful Init.
		d.initialized = false
		if ret := d.lib.Shutdown(); ret != nvml.SUCCESS {
			err = errors.Join(err, fmt.Errorf("nvml shutdown: %w", ret))
		}
	}
	return err
}

func (d *NVIDIADetector) freeEventsLocked() error {
	if d.events == nil {
		return nil
	}
	ret := d.events.Free()
	d.events = nil
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml free event set: %w", ret)
	}
	return nil
}

// cString converts NVML's NUL-terminated char array.
func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// normalizePCIBusID turns NVML's "00000000:1B:00.0" into the sysfs form
// "0000:1b:00.0" so it matches /sys/bus/pci/devices and other detectors.
func normalizePCIBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	domain, rest, found := strings.Cut(id, ":")
	if !found || rest == "" {
		return id
	}
	if strings.Count(rest, ":") == 0 {
		// No domain given ("1b:00.0"): the domain is 0.
		return "0000:" + id
	}
	v, err := strconv.ParseUint(domain, 16, 32)
	if err != nil {
		return id
	}
	return fmt.Sprintf("%04x:%s", v, rest)
}

// readNUMANode reads the GPU's NUMA node from sysfs; -1 when unknown.
func readNUMANode(roots Roots, busID string) int {
	b, err := os.ReadFile(roots.SysPath("bus", "pci", "devices", busID, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// cudaVersionString formats NVML's CUDA driver version (12040) as "12.4".
func cudaVersionString(v int) string {
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
}

// architectureName names an NVML architecture; empty when NVML does not know it.
func architectureName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada Lovelace"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	case nvml.DEVICE_ARCH_RUBIN:
		return "Rubin"
	case nvml.DEVICE_ARCH_UNKNOWN:
		return ""
	}
	return fmt.Sprintf("architecture %d", uint32(a))
}
