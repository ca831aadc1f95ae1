package detect

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// AMDDetector lists AMD GPUs from the KFD topology that ROCm itself
// enumerates. This build has no runtime for them, so they are listed only.
type AMDDetector struct {
	roots Roots
}

// NewAMDDetector returns an AMD GPU detector reading the given roots.
func NewAMDDetector(roots Roots) *AMDDetector { return &AMDDetector{roots: roots} }

// Name implements Detector.
func (a *AMDDetector) Name() string { return "amdgpu" }

// Detect implements Detector. GPU nodes are numbered in KFD node order, which
// is the order ROCm gives them.
func (a *AMDDetector) Detect(ctx context.Context) Result {
	base := a.roots.SysPath("class", "kfd", "kfd", "topology", "nodes")
	entries, err := os.ReadDir(base)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Result{} // no amdgpu driver loaded
		}
		return Result{Notes: []string{fmt.Sprintf("Could not list KFD topology nodes in %s: %v.", base, err)}}
	}
	type node struct {
		id  int
		dir string
	}
	var nodes []node
	for _, e := range entries {
		if id, err := strconv.Atoi(e.Name()); err == nil && id >= 0 {
			nodes = append(nodes, node{id, filepath.Join(base, e.Name())})
		}
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].id < nodes[j].id })

	var (
		devs  []Device
		notes []string
	)
	kfd := a.roots.DevPath("kfd")
	_, kfdErr := os.Stat(kfd)
	if len(nodes) > 0 && kfdErr != nil {
		notes = append(notes, fmt.Sprintf("KFD device node %s not found.", kfd))
	}
	for _, n := range nodes {
		if err := ctx.Err(); err != nil {
			notes = append(notes, fmt.Sprintf("KFD scan stopped early: %v.", err))
			break
		}
		propsFile := filepath.Join(n.dir, "properties")
		props, err := readKFDProperties(propsFile)
		if err != nil {
			notes = append(notes, fmt.Sprintf("Skipped KFD node %d: %v.", n.id, err))
			continue
		}
		simd, ok := props["simd_count"]
		if !ok {
			notes = append(notes, fmt.Sprintf("Skipped KFD node %d: %s has no simd_count.", n.id, propsFile))
			continue
		}
		if simd == 0 {
			continue // a CPU node
		}
		idx := len(devs)
		dev := Device{
			ID:            "amdgpu:" + strconv.Itoa(idx),
			Type:          TypeAMDGPU,
			Index:         idx,
			Vendor:        "AMD",
			NUMANode:      -1,
			Health:        Healthy,
			RuntimeReason: NoAdapterReason,
			Attributes: map[string]string{
				"kfd_node":   strconv.Itoa(n.id),
				"simd_count": strconv.FormatUint(simd, 10),
			},
		}
		deviceID, haveDeviceID := props["device_id"]
		if haveDeviceID {
			dev.Attributes["device_id"] = fmt.Sprintf("%#04x", deviceID)
		}
		if s, err := readSysfsString(filepath.Join(n.dir, "name")); err == nil && s != "" {
			dev.Name = s
		} else if haveDeviceID {
			dev.Name = fmt.Sprintf("AMD GPU %#04x", deviceID)
		} else {
			dev.Name = "AMD GPU"
		}
		if v, ok := props["gfx_target_version"]; ok && v > 0 {
			dev.Architecture = gfxTarget(v)
		}
		if loc, ok := props["location_id"]; ok {
			dev.PCIBusID = kfdPCIAddress(props["domain"], loc)
			numa, err := readSysfsNUMANode(a.roots.SysPath("bus", "pci", "devices", dev.PCIBusID, "numa_node"))
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				notes = append(notes, fmt.Sprintf("AMD GPU %d: %v; NUMA node left unknown.", idx, err))
			}
			dev.NUMANode = numa
		}
		mem, mnotes := kfdMemory(filepath.Join(n.dir, "mem_banks"))
		notes = append(notes, mnotes...)
		dev.MemoryTotal, dev.MemoryFree = mem, mem
		if kfdErr == nil {
			dev.DevicePaths = append(dev.DevicePaths, kfd)
		}
		if minor, ok := props["drm_render_minor"]; ok {
			render := a.roots.DevPath("dri", "renderD"+strconv.FormatUint(minor, 10))
			if _, err := os.Stat(render); err == nil {
				dev.DevicePaths = append(dev.DevicePaths, render)
			}
		}
		devs = append(devs, dev)
	}
	return Result{Devices: devs, Notes: notes}
}

// kfdPCIAddress spells a KFD node's PCI location, where
// location_id = bus<<8 | device<<3 | function, as a canonical address.
func kfdPCIAddress(domain, locationID uint64) string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, (locationID>>8)&0xff, (locationID>>3)&0x1f, locationID&0x7)
}

// gfxTarget spells a KFD gfx_target_version (major*10000 + minor*100 +
// stepping) as the LLVM target name: 90010 is gfx90a, 110000 is gfx1100.
func gfxTarget(v uint64) string {
	return fmt.Sprintf("gfx%d%x%x", v/10000, (v/100)%100, v%100)
}

// kfdMemory sums the sizes of a node's memory banks.
func kfdMemory(dir string) (uint64, []string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, []string{fmt.Sprintf("Could not list memory banks in %s: %v.", dir, err)}
	}
	var (
		total uint64
		notes []string
	)
	for _, e := range entries {
		f := filepath.Join(dir, e.Name(), "properties")
		props, err := readKFDProperties(f)
		if err != nil {
			notes = append(notes, fmt.Sprintf("Memory bank skipped: %v.", err))
			continue
		}
		size, ok := props["size_in_bytes"]
		if !ok {
			notes = append(notes, fmt.Sprintf("Memory bank skipped: %s has no size_in_bytes.", f))
			continue
		}
		total += size
	}
	return total, notes
}

// readKFDProperties parses a KFD properties file of "name value" lines. All
// KFD values are unsigned integers; a malformed line fails the whole file so
// that a half-read node is not mistaken for a CPU node.
func readKFDProperties(path string) (map[string]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("could not read %s: %w", path, err)
	}
	defer f.Close()
	props := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s has %w line %q", path, errMalformed, line)
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s has %w line %q", path, errMalformed, line)
		}
		props[fields[0]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("could not read %s: %w", path, err)
	}
	return props, nil
}
