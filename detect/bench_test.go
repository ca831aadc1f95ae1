package detect

import (
	"context"
	"testing"
	"time"
)

// BenchmarkDiscoverCPUOnlyHost runs a whole discovery against the real host's
// roots, as brokerd does at start on a host without NVIDIA GPUs: every
// detector (NVML included, which fails to load here), IDs, budgets, costs.
// Target: under 100 ms; the "of-target" metric is the time over 100 ms.
func BenchmarkDiscoverCPUOnlyHost(b *testing.B) {
	roots := DefaultRoots()
	ctx := context.Background()
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		nv := NewNVMLDetector(roots, "")
		inv := NewInventory(InventoryOptions{Detectors: []Detector{
			NewCPUDetector(roots), nv, NewTPUDetector(roots, nil), NewAMDDetector(roots), NewCoralDetector(roots),
		}})
		if err := inv.Discover(ctx); err != nil {
			b.Fatal(err)
		}
		if len(inv.Devices()) == 0 {
			b.Fatal("discovery found no devices; the CPU is always one")
		}
		nv.Close()
	}
	perOp := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(float64(perOp)/float64(100*time.Millisecond), "of-target")
}
