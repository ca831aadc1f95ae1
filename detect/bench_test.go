package detect

import (
	"context"
	"testing"
)

// BenchmarkDiscoverCPUOnlyHost runs the sysfs/procfs detectors against the
// real host's roots, as brokerd does at start on a host without NVIDIA GPUs.
// Target: under 100 ms per discovery.
func BenchmarkDiscoverCPUOnlyHost(b *testing.B) {
	roots := DefaultRoots()
	detectors := []Detector{
		NewCPUDetector(roots),
		NewTPUDetector(roots, nil),
		NewAMDDetector(roots),
		NewCoralDetector(roots),
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		devices := 0
		for _, d := range detectors {
			devices += len(d.Detect(ctx).Devices)
		}
		if devices == 0 {
			b.Fatal("discovery found no devices; the CPU is always one")
		}
	}
}
