package detect

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// PCI vendor IDs the sysfs detectors look for.
const (
	PCIVendorGoogle        uint16 = 0x1ae0 // Cloud TPU chips (and gVNIC, NVMe on GCE)
	PCIVendorGlobalUnichip uint16 = 0x1ac1 // Coral Edge TPU (Global Unichip Corp.)
)

// PCIDevice is one PCI function as sysfs describes it under bus/pci/devices.
type PCIDevice struct {
	// Address is the canonical lowercase domain:bus:device.function, e.g. 0000:00:04.0.
	Address         string
	Vendor          uint16
	Device          uint16
	SubsystemVendor uint16
	SubsystemDevice uint16
	Class           uint32 // 24-bit class code, e.g. 0x120000
	NUMANode        int    // -1 when unknown
	IOMMUGroup      string // basename of the iommu_group link; empty when there is none
	// Path is the sysfs directory of the function.
	Path string
}

// pciAddressRE matches a canonical PCI address; the domain may be wider than
// four digits (VMD domains are 10000 and up).
var pciAddressRE = regexp.MustCompile(`^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$`)

// ScanPCI lists the PCI functions under <sys>/bus/pci/devices, sorted by
// address. When vendors are given, functions of other vendors are passed over
// before their other files are read. A function whose identity cannot be read
// is skipped and a malformed optional field is left unknown; either way a
// note naming the file is returned, never an error, so a bad sysfs entry
// cannot stop detection.
func ScanPCI(ctx context.Context, roots Roots, vendors ...uint16) ([]PCIDevice, []string) {
	base := roots.SysPath("bus", "pci", "devices")
	entries, err := os.ReadDir(base)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			// No PCI bus in sysfs (some containers, non-PCI platforms): nothing to find.
			return nil, nil
		}
		return nil, []string{fmt.Sprintf("Could not list PCI devices in %s: %v.", base, err)}
	}
	var (
		devs  []PCIDevice
		notes []string
	)
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			notes = append(notes, fmt.Sprintf("PCI scan of %s stopped early: %v.", base, err))
			break
		}
		d, ok, dnotes := readPCIDevice(filepath.Join(base, e.Name()), e.Name(), vendors)
		notes = append(notes, dnotes...)
		if ok {
			devs = append(devs, d)
		}
	}
	sort.Slice(devs, func(i, j int) bool { return pciAddressLess(devs[i].Address, devs[j].Address) })
	return devs, notes
}

// readPCIDevice reads one function. ok is false when the function is skipped,
// either because it belongs to another vendor or because it cannot be read.
func readPCIDevice(dir, name string, vendors []uint16) (PCIDevice, bool, []string) {
	addr := strings.ToLower(name)
	if !pciAddressRE.MatchString(addr) {
		return PCIDevice{}, false, []string{fmt.Sprintf("Skipped PCI entry %s: %q is not a PCI address.", dir, name)}
	}
	d := PCIDevice{Address: addr, NUMANode: -1, Path: dir}
	vendor, err := readSysfsHex(filepath.Join(dir, "vendor"), 16)
	if err != nil {
		return d, false, []string{fmt.Sprintf("Skipped PCI device %s: %v.", addr, err)}
	}
	d.Vendor = uint16(vendor)
	if len(vendors) > 0 && !slices.Contains(vendors, d.Vendor) {
		return d, false, nil
	}
	device, err := readSysfsHex(filepath.Join(dir, "device"), 16)
	if err != nil {
		return d, false, []string{fmt.Sprintf("Skipped PCI device %s: %v.", addr, err)}
	}
	d.Device = uint16(device)

	var notes []string
	// The remaining fields refine what the device is; without them it is still listed.
	optional := []struct {
		file string
		bits int
		set  func(uint64)
	}{
		{"subsystem_vendor", 16, func(v uint64) { d.SubsystemVendor = uint16(v) }},
		{"subsystem_device", 16, func(v uint64) { d.SubsystemDevice = uint16(v) }},
		{"class", 24, func(v uint64) { d.Class = uint32(v) }},
	}
	for _, f := range optional {
		v, err := readSysfsHex(filepath.Join(dir, f.file), f.bits)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				notes = append(notes, fmt.Sprintf("PCI device %s: %v; field left unknown.", addr, err))
			}
			continue
		}
		f.set(v)
	}
	numa, err := readSysfsNUMANode(filepath.Join(dir, "numa_node"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		notes = append(notes, fmt.Sprintf("PCI device %s: %v; NUMA node left unknown.", addr, err))
	}
	d.NUMANode = numa
	if target, err := os.Readlink(filepath.Join(dir, "iommu_group")); err == nil {
		d.IOMMUGroup = filepath.Base(target)
	}
	return d, true, notes
}

// readSysfsString reads a small sysfs or procfs attribute without its trailing newline.
func readSysfsString(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("could not read %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// errMalformed marks a file whose contents could not be parsed.
var errMalformed = errors.New("malformed contents")

// readSysfsHex reads a hex attribute such as "0x1ae0" that must fit in bits.
func readSysfsHex(path string, bits int) (uint64, error) {
	s, err := readSysfsString(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(s), "0x"), 16, bits)
	if err != nil {
		return 0, fmt.Errorf("%s has %w %q", path, errMalformed, s)
	}
	return v, nil
}

// readSysfsNUMANode reads a numa_node attribute; -1 means unknown, as the kernel writes it.
func readSysfsNUMANode(path string) (int, error) {
	s, err := readSysfsString(path)
	if err != nil {
		return -1, err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < -1 {
		return -1, fmt.Errorf("%s has %w %q", path, errMalformed, s)
	}
	return n, nil
}

// pciAddressLess orders canonical PCI addresses numerically, so that a wide
// VMD domain sorts after domain 0000 rather than by string.
func pciAddressLess(a, b string) bool {
	ka, kb := pciAddressKey(a), pciAddressKey(b)
	for i := range ka {
		if ka[i] != kb[i] {
			return ka[i] < kb[i]
		}
	}
	return a < b
}

func pciAddressKey(addr string) [4]uint64 {
	var k [4]uint64
	m := pciAddressRE.FindStringSubmatch(addr)
	if m == nil {
		return k
	}
	for i := range k {
		k[i], _ = strconv.ParseUint(m[i+1], 16, 32)
	}
	return k
}
