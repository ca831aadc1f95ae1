package pjrt

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/brokerd/brokerd/runtime"
)

// DeviceInfo is one device a PJRT client lists.
type DeviceInfo struct {
	Index           int    // position among the client's addressable devices
	ID              int    // PJRT device id (global across hosts)
	LocalHardwareID int    // the CUDA ordinal, the TPU chip; -1 when undefined
	Kind            string // "NVIDIA H100 80GB HBM3", "TPU v5 lite"
	// Attributes are the plugin's device attributes, formatted as text
	// (lists comma-separated): compute_capability, coords, core_on_chip, ...
	Attributes map[string]string
}

// Target is a device brokerd detected, to be found among a client's devices.
type Target struct {
	Type     string // runtime.DeviceGPU or runtime.DeviceTPU
	Index    int    // N of "gpu:N" (NVML index) or "tpu:N" (chip index)
	PCIBusID string // from NVML; empty when unknown
	UUID     string // from NVML; empty when unknown
}

// ParseDeviceID splits a brokerd device ID ("gpu:3") into type and index.
func ParseDeviceID(id string) (typ string, index int, err error) {
	typ, n, ok := strings.Cut(id, ":")
	if !ok || typ == "" {
		return "", 0, fmt.Errorf("device ID %q: want type:index", id)
	}
	index, err = strconv.Atoi(n)
	if err != nil || index < 0 {
		return "", 0, fmt.Errorf("device ID %q: index %q is not a non-negative integer", id, n)
	}
	return typ, index, nil
}

// Attribute names under which plugins may expose a device's PCI address or
// UUID. XLA's CUDA plugin exposes neither today (its attributes are
// compute_capability, core_count, device_vendor, slice_index); a plugin that
// does is matched exactly instead of by index.
var (
	pciAttrs  = []string{"pci_bus_id", "pci_bus", "pcie_bus_id"}
	uuidAttrs = []string{"uuid", "device_uuid", "gpu_uuid"}
)

// Match methods, as MatchDevice reports them.
const (
	MatchPCIBusID = "pci bus id"
	MatchUUID     = "uuid"
	MatchIndex    = "index"
)

// MatchDevice returns the position in devs of the device t names and how it
// was matched. GPUs match by PCI bus ID, then UUID, where both sides have
// one; otherwise by index: the CUDA ordinal (LocalHardwareID) equals the
// NVML index when CUDA enumerates in PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID,
// which the adapter sets) and CUDA_VISIBLE_DEVICES hides nothing. TPU chips
// match by chip index: among the devices that are a chip's first core (a
// core_on_chip attribute of 0, or none), the Index-th in LocalHardwareID
// order (in list order where that is undefined).
func MatchDevice(t Target, devs []DeviceInfo) (int, string, error) {
	if t.Index < 0 {
		return -1, "", fmt.Errorf("%s:%d: negative index", t.Type, t.Index)
	}
	switch t.Type {
	case runtime.DeviceGPU:
		if t.PCIBusID != "" {
			if i, exposed := matchAttr(devs, pciAttrs, normalizePCI(t.PCIBusID), normalizePCI); exposed {
				if i < 0 {
					return -1, "", fmt.Errorf("%s:%d: no PJRT device has PCI bus id %s", t.Type, t.Index, t.PCIBusID)
				}
				return i, MatchPCIBusID, nil
			}
		}
		if t.UUID != "" {
			if i, exposed := matchAttr(devs, uuidAttrs, normalizeUUID(t.UUID), normalizeUUID); exposed {
				if i < 0 {
					return -1, "", fmt.Errorf("%s:%d: no PJRT device has UUID %s", t.Type, t.Index, t.UUID)
				}
				return i, MatchUUID, nil
			}
		}
		return byIndex(t, devs, nil)
	case runtime.DeviceTPU:
		return byIndex(t, devs, func(d DeviceInfo) bool {
			core, ok := d.Attributes["core_on_chip"]
			return !ok || core == "0"
		})
	}
	return -1, "", fmt.Errorf("%s:%d: PJRT drives gpu and tpu devices only", t.Type, t.Index)
}

// matchAttr finds the device whose attribute (any of names) normalises to
// want. exposed is false when no device has any of the attributes.
func matchAttr(devs []DeviceInfo, names []string, want string, norm func(string) string) (index int, exposed bool) {
	index = -1
	for i, d := range devs {
		for _, n := range names {
			v, ok := d.Attributes[n]
			if !ok {
				continue
			}
			exposed = true
			if norm(v) == want && index < 0 {
				index = i
			}
		}
	}
	return index, exposed
}

// byIndex picks the t.Index-th of the devices keep accepts (all when nil),
// ordered by LocalHardwareID when every one has it, else in list order.
func byIndex(t Target, devs []DeviceInfo, keep func(DeviceInfo) bool) (int, string, error) {
	var cand []int
	hw := true
	for i, d := range devs {
		if keep == nil || keep(d) {
			cand = append(cand, i)
			hw = hw && d.LocalHardwareID >= 0
		}
	}
	if hw {
		for _, i := range cand {
			if devs[i].LocalHardwareID == t.Index {
				return i, MatchIndex, nil
			}
		}
		return -1, "", fmt.Errorf("%s:%d: no PJRT device has hardware id %d (the plugin sees %d device(s))", t.Type, t.Index, t.Index, len(cand))
	}
	if t.Index >= len(cand) {
		return -1, "", fmt.Errorf("%s:%d: the plugin sees %d device(s)", t.Type, t.Index, len(cand))
	}
	return cand[t.Index], MatchIndex, nil
}

// normalizePCI brings PCI addresses to one form: NVML's
// "00000000:3B:00.0" and sysfs's "0000:3b:00.0" are the same device.
func normalizePCI(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || !strings.Contains(rest, ":") {
		return "0000:" + s // bus:dev.fn without a domain
	}
	d, err := strconv.ParseUint(dom, 16, 32)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%s", d, rest)
}

// normalizeUUID drops NVML's "GPU-" prefix and case.
func normalizeUUID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	return strings.TrimPrefix(s, "gpu-")
}
