// Package detect discovers this host's devices (CPU, NVIDIA GPUs through NVML,
// Google TPUs and other accelerators through sysfs), keeps their telemetry and
// health fresh, and holds the policy that picks among them: selection, batch
// plans, memory budgets and cost.
//
// Filesystem roots are settings (Roots) so every detector is tested against a
// host tree under testdata/.
package detect

import (
	"context"
	"path/filepath"
	"strconv"
	"time"
)

// Type is the kind of a device.
type Type string

// Device types. The strings are used in IDs ("gpu:0"), settings and metrics labels.
const (
	TypeCPU     Type = "cpu"
	TypeGPU     Type = "gpu"
	TypeTPU     Type = "tpu"
	TypeAMDGPU  Type = "amdgpu"
	TypeEdgeTPU Type = "edgetpu"
)

// Health is a device's health as brokerd sees it.
type Health string

// Health values.
const (
	Healthy   Health = "healthy"
	Unhealthy Health = "unhealthy"
)

// NoAdapterReason is the runtime reason of devices this build lists but cannot drive.
const NoAdapterReason = "no runtime adapter on this build"

// Device is one detected device. Detectors fill what they can learn; the
// Inventory assigns stable IDs, budgets, cost and runtime status.
type Device struct {
	ID     string // stable: cpu:0, gpu:N, tpu:N, amdgpu:N, edgetpu:N
	Type   Type
	Index  int // index within its type as enumerated (NVML index, TPU chip index)
	Vendor string
	Name   string
	UUID   string
	// PCIBusID is the canonical domain:bus:device.function, e.g. 0000:1b:00.0.
	PCIBusID string
	NUMANode int // -1 when unknown

	MemoryTotal uint64 // bytes
	MemoryFree  uint64 // bytes

	ComputeCapability string // "9.0"
	DriverVersion     string
	CUDAVersion       string // CUDA driver API version, "12.4"
	Architecture      string // "Hopper", "v5e", "x86_64"

	BF16, FP16  bool
	MultiDevice bool

	// DevicePaths are device nodes under the devfs root (/dev/nvidia0, /dev/accel0, /dev/vfio/12).
	DevicePaths []string

	Health       Health
	HealthReason string

	// Runtime is the adapter that drives this device ("onednn", "pjrt"); empty
	// when none can, with RuntimeReason saying why.
	Runtime       string
	RuntimeReason string

	CPU *CPUInfo
	GPU *GPUInfo
	TPU *TPUInfo

	Telemetry Telemetry

	// Attributes holds anything else detection learned.
	Attributes map[string]string
}

// StableKey identifies the physical device across restarts and re-enumeration:
// its UUID, else its PCI address, else its type and index.
func (d *Device) StableKey() string {
	switch {
	case d.UUID != "":
		return "uuid:" + d.UUID
	case d.PCIBusID != "":
		return "pci:" + d.PCIBusID
	default:
		return string(d.Type) + ":" + strconv.Itoa(d.Index)
	}
}

// Runnable reports whether a runtime adapter of this build can run work on d.
func (d *Device) Runnable() bool { return d.Runtime != "" }

// CPUInfo describes the host CPU.
type CPUInfo struct {
	ModelName       string
	LogicalCores    int
	EffectiveCores  float64 // from cgroup quota and cpuset, never above LogicalCores
	LimitSource     string  // "cgroup v2 cpu.max", "cgroup v1 cfs quota", "cpuset", "none"
	Flags           []string
	NUMANodes       int
	MemoryAvailable uint64 // bytes, honouring the cgroup memory limit
}

// GPUInfo describes an NVIDIA GPU.
type GPUInfo struct {
	MIGEnabled           bool
	ECCUncorrectedErrors uint64
	LastXID              uint64
}

// TPUInfo describes one Google TPU chip.
type TPUInfo struct {
	ChipIndex          int
	Generation         string // v2, v3, v4, v5e, v5p, v6e, 7x
	AcceleratorType    string // TPU_ACCELERATOR_TYPE, e.g. v5litepod-8
	Topology           string
	WorkerID           int // -1 when unknown
	ChipsPerHostBounds string
	TPUName            string
	VisibleChips       string
}

// Telemetry is a device's latest readings.
type Telemetry struct {
	MemoryUsed               uint64
	MemoryTotal              uint64
	UtilizationPercent       float64
	MemoryUtilizationPercent float64
	TemperatureC             float64
	PowerW                   float64
	PowerLimitW              float64
	SMClockMHz               uint32
	MemClockMHz              uint32
	UpdatedAt                time.Time

	// MemoryUsedByOthers is memory held by processes other than brokerd
	// (NVML's running processes); 0 when unknown. The report warns about an
	// aggressive memory strategy on a GPU that others use.
	MemoryUsedByOthers uint64
}

// Roots are the filesystem roots detection reads, so tests and simulations can
// point them at a tree under testdata/.
type Roots struct {
	Sys  string // default /sys
	Proc string // default /proc
	Dev  string // default /dev
}

// DefaultRoots are the real host's roots.
func DefaultRoots() Roots { return Roots{Sys: "/sys", Proc: "/proc", Dev: "/dev"} }

// SysPath joins p under the sysfs root.
func (r Roots) SysPath(p ...string) string { return filepath.Join(append([]string{r.Sys}, p...)...) }

// ProcPath joins p under the procfs root.
func (r Roots) ProcPath(p ...string) string { return filepath.Join(append([]string{r.Proc}, p...)...) }

// DevPath joins p under the devfs root.
func (r Roots) DevPath(p ...string) string { return filepath.Join(append([]string{r.Dev}, p...)...) }

// Result is what one detector found. Notes are plain sentences for the report
// (NVML not found, a file that could not be read, ...); a detector that fails
// returns no devices and says why in Notes rather than failing the daemon.
type Result struct {
	Devices []Device
	Notes   []string
}

// Detector finds devices of one kind.
type Detector interface {
	Name() string
	Detect(ctx context.Context) Result
}

// Refresher updates the telemetry and health of devices a detector found. It
// changes only the devices it recognises (by UUID or PCI address).
type Refresher interface {
	Refresh(ctx context.Context, devices []*Device)
}

// Getenv looks up an environment variable; detectors take it as a setting so
// tests can simulate a TPU VM's environment.
type Getenv func(key string) string
