package detect

import (
	"context"
	"fmt"
	"os"
	"strconv"
)

// pciDeviceCoralApex is the Edge TPU's PCI device ID (M.2 and mini PCIe Coral modules).
const pciDeviceCoralApex uint16 = 0x089a

// CoralDetector lists PCIe Coral Edge TPUs, driven by the gasket/apex kernel
// driver as /dev/apex_N. This build has no runtime for them, so they are listed only.
type CoralDetector struct {
	roots Roots
}

// NewCoralDetector returns an Edge TPU detector reading the given roots.
func NewCoralDetector(roots Roots) *CoralDetector { return &CoralDetector{roots: roots} }

// Name implements Detector.
func (c *CoralDetector) Name() string { return "edgetpu" }

// Detect implements Detector. Edge TPUs are numbered in PCI address order,
// the order in which the apex driver probes and names them.
func (c *CoralDetector) Detect(ctx context.Context) Result {
	pci, notes := ScanPCI(ctx, c.roots, PCIVendorGlobalUnichip)
	var devs []Device
	for _, d := range pci {
		if d.Device != pciDeviceCoralApex {
			continue
		}
		idx := len(devs)
		dev := Device{
			ID:            "edgetpu:" + strconv.Itoa(idx),
			Type:          TypeEdgeTPU,
			Index:         idx,
			Vendor:        "Google",
			Name:          "Coral Edge TPU",
			PCIBusID:      d.Address,
			NUMANode:      d.NUMANode,
			Health:        Healthy,
			RuntimeReason: NoAdapterReason,
		}
		node := c.roots.DevPath("apex_" + strconv.Itoa(idx))
		if _, err := os.Stat(node); err != nil {
			dev.Health, dev.HealthReason = Unhealthy, fmt.Sprintf("device node %s not found", node)
			notes = append(notes, fmt.Sprintf("Edge TPU %d (%s): device node %s not found; is the apex driver loaded?", idx, d.Address, node))
		} else {
			dev.DevicePaths = []string{node}
		}
		devs = append(devs, dev)
	}
	return Result{Devices: devs, Notes: notes}
}
