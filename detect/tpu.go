package detect

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"
)

const tpuGiB = uint64(1) << 30

// tpuGeneration is what brokerd knows of one Cloud TPU chip generation.
type tpuGeneration struct {
	name string // v2 … v6e, 7x
	hbm  uint64 // bytes per chip
	vfio bool   // v5e and later are driven through VFIO, older through /dev/accelN
}

// tpuGenerationOf maps a Google PCI function to a TPU generation. v2 and v3
// share a device ID and differ by subsystem device. ok is false for Google
// functions that are not TPUs (gVNIC, NVMe) and for an unknown v2/v3 subsystem.
// HBM figures are per chip (v2 and v3 documents quote them per core; a chip has two).
func tpuGenerationOf(d PCIDevice) (tpuGeneration, bool) {
	switch d.Device {
	case 0x0027:
		switch d.SubsystemDevice {
		case 0x004e:
			return tpuGeneration{"v2", 16 * tpuGiB, false}, true
		case 0x004f:
			return tpuGeneration{"v3", 32 * tpuGiB, false}, true
		}
	case 0x005e:
		return tpuGeneration{"v4", 32 * tpuGiB, false}, true
	case 0x0063:
		return tpuGeneration{"v5e", 16 * tpuGiB, true}, true
	case 0x0062:
		return tpuGeneration{"v5p", 95 * tpuGiB, true}, true
	case 0x006f:
		return tpuGeneration{"v6e", 32 * tpuGiB, true}, true
	case 0x0076:
		return tpuGeneration{"7x", 192 * tpuGiB, true}, true
	}
	return tpuGeneration{}, false
}

// TPUDetector finds Google Cloud TPU chips on the PCI bus and describes them
// with the TPU VM environment (TPU_ACCELERATOR_TYPE, TPU_WORKER_ID, ...).
type TPUDetector struct {
	roots  Roots
	getenv Getenv
}

// NewTPUDetector returns a TPU detector; a nil getenv reads the process environment.
func NewTPUDetector(roots Roots, getenv Getenv) *TPUDetector {
	if getenv == nil {
		getenv = os.Getenv
	}
	return &TPUDetector{roots: roots, getenv: getenv}
}

// Name implements Detector.
func (t *TPUDetector) Name() string { return "tpu" }

// Detect implements Detector. Chips are numbered in PCI address order; a chip
// whose device node is missing is still listed, marked unhealthy, with a note.
func (t *TPUDetector) Detect(ctx context.Context) Result {
	pci, notes := ScanPCI(ctx, t.roots, PCIVendorGoogle)
	type chip struct {
		pci PCIDevice
		gen tpuGeneration
	}
	var chips []chip
	for _, d := range pci {
		gen, ok := tpuGenerationOf(d)
		if !ok {
			if d.Device == 0x0027 {
				notes = append(notes, fmt.Sprintf("Skipped TPU at %s: subsystem device %#04x is neither v2 (0x004e) nor v3 (0x004f).", d.Address, d.SubsystemDevice))
			}
			continue
		}
		chips = append(chips, chip{d, gen})
	}
	if len(chips) == 0 {
		return Result{Notes: notes}
	}

	env := t.readEnv(chips[0].gen.name)
	notes = append(notes, env.notes...)
	visible, vnotes := parseVisibleChips(env.visibleChips, len(chips))
	notes = append(notes, vnotes...)

	var devs []Device
	for i, c := range chips {
		if visible != nil && !visible[i] {
			continue
		}
		dev := Device{
			ID:           "tpu:" + strconv.Itoa(i),
			Type:         TypeTPU,
			Index:        i,
			Vendor:       "Google",
			Name:         "TPU " + c.gen.name,
			PCIBusID:     c.pci.Address,
			NUMANode:     c.pci.NUMANode,
			MemoryTotal:  c.gen.hbm,
			MemoryFree:   c.gen.hbm,
			Architecture: c.gen.name,
			BF16:         true,
			MultiDevice:  true,
			Health:       Healthy,
			TPU: &TPUInfo{
				ChipIndex:          i,
				Generation:         c.gen.name,
				AcceleratorType:    env.acceleratorType,
				Topology:           env.topology,
				WorkerID:           env.workerID,
				ChipsPerHostBounds: env.chipsPerHostBounds,
				TPUName:            env.tpuName,
				VisibleChips:       env.visibleChips,
			},
			Attributes: map[string]string{"pci_device_id": fmt.Sprintf("%#04x", c.pci.Device)},
		}
		if c.pci.IOMMUGroup != "" {
			dev.Attributes["iommu_group"] = c.pci.IOMMUGroup
		}
		node, err := t.deviceNode(c.gen, i, c.pci)
		if err != nil {
			dev.Health, dev.HealthReason = Unhealthy, err.Error()
			notes = append(notes, fmt.Sprintf("TPU chip %d (%s): %v.", i, c.pci.Address, err))
		} else {
			dev.DevicePaths = []string{node}
		}
		devs = append(devs, dev)
	}
	return Result{Devices: devs, Notes: notes}
}

// deviceNode returns the chip's device node: /dev/accel<chip> before v5e,
// /dev/vfio/<iommu group> from v5e on.
func (t *TPUDetector) deviceNode(gen tpuGeneration, chip int, d PCIDevice) (string, error) {
	var node string
	if gen.vfio {
		if d.IOMMUGroup == "" {
			return "", fmt.Errorf("no iommu_group link in %s, so its VFIO device node is unknown", d.Path)
		}
		node = t.roots.DevPath("vfio", d.IOMMUGroup)
	} else {
		node = t.roots.DevPath("accel" + strconv.Itoa(chip))
	}
	if _, err := os.Stat(node); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("device node %s not found", node)
		}
		return "", fmt.Errorf("device node %s: %w", node, err)
	}
	return node, nil
}

// tpuEnv is the TPU VM environment as it applies to this host.
type tpuEnv struct {
	acceleratorType    string
	topology           string
	workerID           int
	chipsPerHostBounds string
	tpuName            string
	visibleChips       string
	notes              []string
}

func (t *TPUDetector) readEnv(generation string) tpuEnv {
	e := tpuEnv{
		acceleratorType:    strings.TrimSpace(t.getenv("TPU_ACCELERATOR_TYPE")),
		topology:           strings.TrimSpace(t.getenv("TPU_TOPOLOGY")),
		workerID:           -1,
		chipsPerHostBounds: strings.TrimSpace(t.getenv("TPU_CHIPS_PER_HOST_BOUNDS")),
		tpuName:            strings.TrimSpace(t.getenv("TPU_NAME")),
		visibleChips:       strings.TrimSpace(t.getenv("TPU_VISIBLE_CHIPS")),
	}
	if s := strings.TrimSpace(t.getenv("TPU_WORKER_ID")); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			e.workerID = n
		} else {
			e.notes = append(e.notes, fmt.Sprintf("TPU_WORKER_ID %q is not a worker number; worker left unknown.", s))
		}
	}
	if e.acceleratorType != "" {
		family, topo := topologyFromAcceleratorType(e.acceleratorType)
		if family != "" && family != generation {
			e.notes = append(e.notes, fmt.Sprintf("TPU_ACCELERATOR_TYPE %q names %s chips but this host has %s chips.", e.acceleratorType, family, generation))
		} else if e.topology == "" {
			e.topology = topo
		}
	}
	return e
}

// parseVisibleChips turns TPU_VISIBLE_CHIPS into the set of chip indexes to
// report; nil means all. An unusable value is ignored with a note rather than
// hiding every chip.
func parseVisibleChips(s string, chips int) (map[int]bool, []string) {
	if s == "" {
		return nil, nil
	}
	set := map[int]bool{}
	var notes []string
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 0 {
			return nil, []string{fmt.Sprintf("TPU_VISIBLE_CHIPS %q is not a comma-separated list of chip indexes; all chips are listed.", s)}
		}
		if n >= chips {
			notes = append(notes, fmt.Sprintf("TPU_VISIBLE_CHIPS names chip %d but this host has %d chips.", n, chips))
			continue
		}
		set[n] = true
	}
	return set, notes
}

// topologyFromAcceleratorType derives the generation and the default slice
// topology from an accelerator type such as v5litepod-8 or v4-32. The number
// counts TensorCores for v2, v3, v4 and v5p (two per chip) and chips for v5e
// and v6e. Only power-of-two slices have a default shape; others yield "".
func topologyFromAcceleratorType(accel string) (generation, topology string) {
	prefix, count, ok := strings.Cut(strings.ToLower(accel), "-")
	if !ok {
		return "", ""
	}
	n, err := strconv.Atoi(count)
	if err != nil || n <= 0 {
		return "", ""
	}
	var threeD, perCore bool
	switch prefix {
	case "v2", "v3":
		generation, perCore = prefix, true
	case "v4", "v5p":
		generation, perCore, threeD = prefix, true, true
	case "v5litepod", "v5e":
		generation = "v5e"
	case "v6e":
		generation = "v6e"
	default:
		return "", ""
	}
	chips := n
	if perCore {
		if n%2 != 0 {
			return generation, ""
		}
		chips = n / 2
	}
	if chips&(chips-1) != 0 {
		return generation, ""
	}
	e := bits.TrailingZeros(uint(chips))
	if !threeD {
		// As square as possible, the longer side last: 2x4, 4x4, 4x8, 8x8, ...
		a := e / 2
		return generation, fmt.Sprintf("%dx%d", 1<<a, 1<<(e-a))
	}
	// 3D slices grow z, then y, then x: 2x2x1 (4 chips), 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...
	var exp [3]int
	if e < 3 {
		for i := 0; i < e; i++ {
			exp[i]++
		}
	} else {
		for i := range exp {
			exp[i] = e / 3
		}
		for i := 0; i < e%3; i++ {
			exp[2-i]++
		}
	}
	return generation, fmt.Sprintf("%dx%dx%d", 1<<exp[0], 1<<exp[1], 1<<exp[2])
}
