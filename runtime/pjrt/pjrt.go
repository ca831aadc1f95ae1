// Package pjrt is brokerd's runtime for TPUs and GPUs through PJRT, the plugin
// C API behind JAX, TensorFlow and PyTorch/XLA: libtpu.so is a PJRT plugin,
// and so is XLA's CUDA plugin (xla_cuda_plugin.so).
//
// Discover finds plugin libraries and Probe checks that each one loads and
// speaks the PJRT C API. The Adapter (New) opens "gpu:N" and
// "tpu:N" devices on a plugin's client through go-xla's pjrt package; a
// Device lowers each runtime.Graph to StableHLO (Lower, a pure function),
// compiles it once per graph and bound types (a bounded LRU per client) and
// runs it on buffers that stay on the device.
//
// Building needs only cgo and libdl: plugins are loaded with dlopen at run
// time, and pjrt_c_api.h (OpenXLA, Apache 2.0, as go-xla v0.3.0 ships it)
// is in this directory.
package pjrt

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/brokerd/brokerd/runtime"
)

// Name is the adapter's name in runtime.Info.
const Name = "pjrt"

// ErrBadPluginSpec is wrapped by every error of ParsePluginSpec.
var ErrBadPluginSpec = errors.New("bad PJRT plugin spec")

// ParsePluginSpec parses comma-separated name=path pairs, the form of
// --pjrt-plugin and BROKERD_PJRT_PLUGINS:
//
//	tpu=/usr/lib/libtpu.so,cuda=/opt/jax/xla_cuda_plugin.so
//
// Names are lowercased and may hold letters, digits, '_' and '-'; paths must be
// absolute, because a bare name would make dlopen search the library path.
// An empty or blank spec gives an empty map.
func ParsePluginSpec(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for i, entry := range strings.Split(s, ",") {
		name, path, err := parsePluginEntry(entry)
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d %q: %w", ErrBadPluginSpec, i+1, strings.TrimSpace(entry), err)
		}
		if prev, dup := out[name]; dup {
			return nil, fmt.Errorf("%w: plugin %q given twice (%s and %s)", ErrBadPluginSpec, name, prev, path)
		}
		out[name] = path
	}
	return out, nil
}

func parsePluginEntry(entry string) (name, path string, err error) {
	entry = strings.TrimSpace(entry)
	if entry == "" {
		return "", "", errors.New("empty entry")
	}
	name, path, ok := strings.Cut(entry, "=")
	if !ok {
		return "", "", errors.New("want name=path")
	}
	name = strings.ToLower(strings.TrimSpace(name))
	path = strings.TrimSpace(path)
	if err := checkPluginName(name); err != nil {
		return "", "", err
	}
	if path == "" {
		return "", "", errors.New("empty path")
	}
	if !filepath.IsAbs(path) {
		return "", "", fmt.Errorf("path %q is not absolute", path)
	}
	return name, filepath.Clean(path), nil
}

func checkPluginName(name string) error {
	if name == "" {
		return errors.New("empty plugin name")
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Errorf("plugin name %q: only letters, digits, '_' and '-' are allowed", name)
		}
	}
	return nil
}

// Platform returns the platform a plugin name stands for: "tpu", "cuda"
// ("gpu" is XLA's older name for its CUDA plugin), "cpu", "rocm", or the name
// itself for any other plugin.
//
// It comes from the name alone: asking the plugin would mean creating a PJRT
// client, which initialises the devices; the adapter does that.
func Platform(name string) string {
	switch name {
	case "gpu":
		return "cuda"
	default:
		return name
	}
}

// deviceType is the brokerd device type a platform drives; empty for platforms
// brokerd has no device model for (rocm: AMD GPUs are listed, not driven).
func deviceType(platform string) string {
	switch platform {
	case "tpu":
		return runtime.DeviceTPU
	case "cuda":
		return runtime.DeviceGPU
	case "cpu":
		return runtime.DeviceCPU
	}
	return ""
}

// Probe finds the PJRT plugins opts describe, loads each one (see Discover
// for the search) and checks that its function table has every function the
// adapter calls: a plugin lacking one is reported as not loaded, with
// ErrIncompleteAPI's message, so its devices are listed as not runnable
// rather than failing when opened. The adapter is available when at least
// one plugin loaded; its device types are those of the loaded plugins. It
// creates no client: that initialises the devices (seconds, and GPU
// memory), which the adapter does when a device is opened. Plugins are
// never unloaded: a second Probe reuses what the first one loaded.
func Probe(ctx context.Context, opts Options) runtime.Info {
	info := runtime.Info{Name: Name}
	found, err := Discover(opts)
	if err != nil {
		info.Reason = err.Error()
		return info
	}
	seenType := map[string]bool{}
	var failed []string
	for _, c := range found.Plugins {
		p := runtime.PluginInfo{Name: c.Name, Path: c.Path, Platform: Platform(c.Name)}
		if err := ctx.Err(); err != nil {
			p.Error = fmt.Sprintf("not loaded: %v", err)
		} else if lib, err := load(c.Path); err != nil {
			p.Error = err.Error()
		} else if err := checkAPI(lib.api); err != nil {
			// The version says whether the plugin is too old or broken.
			p.Error = fmt.Sprintf("%v (PJRT C API %s)", err, lib.APIVersion)
		} else {
			p.Loaded = true
			p.APIVersion = lib.APIVersion
		}
		info.Plugins = append(info.Plugins, p)
		if !p.Loaded {
			failed = append(failed, fmt.Sprintf("%s (%s): %s", p.Name, p.Path, p.Error))
			continue
		}
		info.Available = true
		if t := deviceType(p.Platform); t != "" && !seenType[t] {
			seenType[t] = true
			info.DeviceTypes = append(info.DeviceTypes, t)
		}
	}
	switch {
	case info.Available:
	case len(found.Plugins) == 0:
		info.Reason = "no PJRT plugin found (searched: " + strings.Join(found.Searched, ", ") + ")"
	default:
		info.Reason = "no PJRT plugin loaded: " + strings.Join(failed, "; ")
	}
	return info
}

// sortedNames returns m's keys in order, so explicit plugins are listed stably.
func sortedNames(m map[string]string) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
