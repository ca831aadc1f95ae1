// Package runtime is where brokerd meets the libraries that run tensors. Each
// backend lives in its own sub-package (runtime/onednn for the CPU through
// oneDNN, runtime/pjrt for TPUs and GPUs through PJRT plugins) and reports what
// it can drive as an Info. The Adapter interface that the scheduler calls
// comes with the adapters themselves.
//
// This package holds only the types every backend shares, so the backends can
// import it without a cycle. The aggregate probe that asks every backend of
// this build lives in runtime/probe, which imports them all.
package runtime

// Device types an adapter can drive, as used in device IDs ("gpu:0") and settings.
const (
	DeviceCPU = "cpu"
	DeviceGPU = "gpu" // NVIDIA
	DeviceTPU = "tpu"
)

// Info is what a runtime probe learned about one adapter of this build.
type Info struct {
	Name string // adapter name: "onednn", "pjrt"
	// DeviceTypes are the device types the adapter can drive on this host
	// (DeviceCPU, DeviceGPU, DeviceTPU); empty when it can drive none.
	DeviceTypes []string
	// Available is true when the adapter's library loaded and works.
	Available bool
	// Version is the backend library's version ("2.6.3"); empty where the
	// version belongs to each plugin instead (see Plugins).
	Version string
	// Reason says why the adapter is unavailable; empty when Available.
	Reason string
	// Plugins are the plugin libraries found for adapters that load them
	// (PJRT), loaded or not, in discovery order.
	Plugins []PluginInfo
}

// PluginInfo is one plugin library a probe found and tried to load.
type PluginInfo struct {
	Name       string // "tpu", "cuda", "cpu": from the setting or the file name
	Path       string // the file as found
	Platform   string // "tpu", "cuda", "cpu", "rocm"; the name itself when not a known platform
	APIVersion string // plugin API version, "0.54"; empty when not loaded
	Loaded     bool
	Error      string // why it did not load; empty when Loaded
}
