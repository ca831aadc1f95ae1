package pjrt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	xpjrt "github.com/gomlx/go-xla/pjrt"
)

// ErrNoDevices means a plugin's client lists no device this process can use.
var ErrNoDevices = errors.New("PJRT client has no addressable device")

// plugin is a plugin library loaded, checked and initialised for go-xla.
type plugin struct {
	lib *library
	x   *xpjrt.Plugin
}

type pluginResult struct {
	p   *plugin
	err error
}

// plugins caches initialised plugins by real path. Registration state, like
// load's cache: PJRT_Plugin_Initialize runs once per process, success or
// failure, and go-xla keeps its own process-wide registry of plugins.
var plugins = struct {
	sync.Mutex
	byPath map[string]pluginResult
}{byPath: map[string]pluginResult{}}

// openPlugin loads the plugin at path (see load), checks that its function
// table has everything go-xla calls, and hands the table to go-xla, which
// initialises the plugin. go-xla is given the table rather than the path so
// that brokerd does the dlopen and the checks, and go-xla's own plugin
// search and CUDA environment adjustments never run.
func openPlugin(path string) (*plugin, error) {
	lib, err := load(path)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("resolve path: %w", err)
	}
	plugins.Lock()
	defer plugins.Unlock()
	if r, ok := plugins.byPath[real]; ok {
		return r.p, r.err
	}
	p, err := initPlugin(real, lib)
	plugins.byPath[real] = pluginResult{p, err}
	return p, err
}

func initPlugin(real string, lib *library) (*plugin, error) {
	if err := checkAPI(lib.api); err != nil {
		return nil, err
	}
	// Registered under a name of brokerd's so that go-xla's search for
	// plugins by platform name never finds these.
	name := "brokerd:" + real
	if err := xpjrt.RegisterPreloadedPlugin(name, uintptr(lib.api)); err != nil {
		return nil, fmt.Errorf("initialise plugin: %w", err)
	}
	x, err := xpjrt.GetPlugin(name)
	if err != nil {
		return nil, fmt.Errorf("initialise plugin: %w", err)
	}
	return &plugin{lib: lib, x: x}, nil
}

// ClientInfo describes a plugin's client and its devices.
type ClientInfo struct {
	Plugin          string // plugin name: "cuda", "tpu"
	Path            string
	APIVersion      string // PJRT C API version of the plugin: "0.67"
	Platform        string // the client's platform name: "cuda", "tpu"
	PlatformVersion string // the plugin's own version string
	// Attributes are the plugin's (xla_version, stablehlo_current_version).
	Attributes map[string]string
	Devices    []DeviceInfo
}

// client is one PJRT client of a plugin: its devices and compiled programs.
// It lives as long as the adapter that created it (go-xla destroys a client
// once it is garbage).
type client struct {
	info    ClientInfo
	x       *xpjrt.Client
	devices []*xpjrt.Device
	cache   *compileCache[*compiled]
}

// clientOptionsFor returns the PJRT_Client_Create options for a platform:
// the settings' own when given. XLA's CUDA client otherwise reserves 75% of
// GPU memory at start; brokerd admits work against its own budget, so it
// asks for memory as it goes.
func clientOptionsFor(platform string, set map[string]map[string]any) xpjrt.NamedValuesMap {
	if o, ok := set[platform]; ok {
		return o
	}
	if platform == "cuda" {
		return xpjrt.NamedValuesMap{"preallocate": false}
	}
	return nil
}

// newClient creates a client of p. For CUDA it sets CUDA_DEVICE_ORDER to
// PCI_BUS_ID when unset, before CUDA initialises, so CUDA ordinals follow
// NVML's indices and index matching pairs the right GPUs.
func newClient(p *plugin, cand Candidate, opts AdapterOptions, m *compileMetrics) (*client, error) {
	platform := Platform(cand.Name)
	if platform == "cuda" && os.Getenv("CUDA_DEVICE_ORDER") == "" {
		if err := os.Setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID"); err != nil {
			return nil, fmt.Errorf("set CUDA_DEVICE_ORDER: %w", err)
		}
	}
	x, err := p.x.NewClient(clientOptionsFor(platform, opts.ClientOptions))
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	c := &client{
		x:       x,
		devices: x.AddressableDevices(),
		info: ClientInfo{
			Plugin: cand.Name, Path: cand.Path, APIVersion: p.lib.APIVersion,
			Platform: x.Platform(), PlatformVersion: x.PlatformVersion(),
			Attributes: map[string]string{},
		},
	}
	for k, v := range p.x.Attributes() {
		c.info.Attributes[k] = fmt.Sprint(v)
	}
	if len(c.devices) == 0 {
		_ = x.Destroy()
		return nil, fmt.Errorf("%w (platform %q)", ErrNoDevices, c.info.Platform)
	}
	for i, d := range c.devices {
		id, kind, attrs, err := describe(p.lib.api, d)
		if err != nil {
			_ = x.Destroy()
			return nil, fmt.Errorf("describe device %d: %w", i, err)
		}
		c.info.Devices = append(c.info.Devices, DeviceInfo{
			Index: i, ID: id, LocalHardwareID: d.LocalHardwareID(), Kind: kind, Attributes: attrs,
		})
	}
	if c.info.Platform == "" {
		c.info.Platform = platform
	}
	c.cache = newCompileCache[*compiled](opts.CacheSize, c.info.Platform, m)
	return c, nil
}
