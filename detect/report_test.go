package detect

import (
	"strings"
	"testing"
)

func repEntry(d Device) Entry { return Entry{Device: d} }

func TestRecommendations(t *testing.T) {
	cpu := repEntry(polCPU())
	gpu0 := repEntry(polGPU(0))
	gpu0.MemoryTotal = 80 * invGiB
	sharedGPU := gpu0
	sharedGPU.Telemetry.MemoryUsedByOthers = 2 * invGiB
	sickGPU := repEntry(polGPUUnhealthy(1))
	cordonedGPU := gpu0
	cordonedGPU.Cordoned, cordonedGPU.CordonReason = true, "maintenance"
	tpuNoPlugin := repEntry(polTPU(0))
	tpuNoPlugin.Runtime, tpuNoPlugin.RuntimeReason = "", "pjrt: no PJRT plugin for tpu found"
	tpuVetoed := tpuNoPlugin
	tpuVetoed.RuntimeReason = "/dev/vfio/12 is not accessible"
	tpuOK := repEntry(polTPU(0))
	limitedCPU := cpu
	limitedCPU.CPU = &CPUInfo{LogicalCores: 8, EffectiveCores: 2, LimitSource: "cgroup v2 cpu.max"}
	fractionCPU := cpu
	fractionCPU.CPU = &CPUInfo{LogicalCores: 4, EffectiveCores: 1.5, LimitSource: "cgroup v1 cfs quota"}
	unlimitedCPU := cpu
	unlimitedCPU.CPU = &CPUInfo{LogicalCores: 8, EffectiveCores: 8, LimitSource: "none"}
	unknownCPU := cpu
	unknownCPU.CPU = &CPUInfo{LogicalCores: 8}

	pjrtTPUMissing := []RuntimeStatus{
		{Name: "onednn", Types: []Type{TypeCPU}, Available: true},
		{Name: "pjrt", Types: []Type{TypeGPU}, Available: true},
		{Name: "pjrt", Types: []Type{TypeTPU}, Reason: "no PJRT plugin for tpu found"},
	}
	pjrtAll := []RuntimeStatus{
		{Name: "onednn", Types: []Type{TypeCPU}, Available: true},
		{Name: "pjrt", Types: []Type{TypeGPU, TypeTPU}, Available: true},
	}
	allow := Policy{Prefer: PreferAuto, AllowTPU: true}
	custom95 := MemoryStrategy{Name: "custom", Fraction: 0.95}

	tests := []struct {
		name     string
		entries  []Entry
		p        Policy
		ms       MemoryStrategy
		runtimes []RuntimeStatus
		want     []string // one key phrase per sentence, in order
	}{
		{name: "healthy host says nothing", entries: []Entry{unlimitedCPU, gpu0}, p: allow, ms: MemoryBalanced, runtimes: pjrtAll},
		{
			name: "tpu without plugin", entries: []Entry{cpu, tpuNoPlugin}, p: allow, ms: MemoryBalanced, runtimes: pjrtTPUMissing,
			want: []string{"A TPU is present (tpu:0) but no PJRT plugin was found, so brokerd cannot run work on it: " +
				"point brokerd at libtpu.so with --pjrt-plugin tpu=/path/to/libtpu.so or TPU_LIBRARY_PATH=/path/to/libtpu.so."},
		},
		{
			name: "tpu without plugin and no runtime statuses at all", entries: []Entry{cpu, tpuNoPlugin}, p: allow, ms: MemoryBalanced,
			want: []string{"no PJRT plugin was found"},
		},
		{name: "tpu the detector vetoed is not a plugin problem", entries: []Entry{cpu, tpuVetoed}, p: allow, ms: MemoryBalanced, runtimes: pjrtAll},
		{
			name: "tpu not allowed", entries: []Entry{cpu, tpuOK}, p: Policy{Prefer: PreferAuto}, ms: MemoryBalanced, runtimes: pjrtAll,
			want: []string{"A TPU is present (tpu:0) but COMPUTE_ALLOW_TPU=false, so no work runs on it: set COMPUTE_ALLOW_TPU=true (--allow-tpu) to use it."},
		},
		{
			name: "tpu without plugin and not allowed", entries: []Entry{cpu, tpuNoPlugin}, p: Policy{Prefer: PreferAuto}, ms: MemoryBalanced, runtimes: pjrtTPUMissing,
			want: []string{"no PJRT plugin was found", "COMPUTE_ALLOW_TPU=false"},
		},
		{
			name: "preference not met", entries: []Entry{cpu}, p: Policy{Prefer: PreferGPU}, ms: MemoryBalanced, runtimes: pjrtAll,
			want: []string{"COMPUTE_PREFER=gpu could not be met (prefer=gpu but no GPU present; using cpu:0)."},
		},
		{name: "preference met", entries: []Entry{cpu, gpu0}, p: Policy{Prefer: PreferGPU}, ms: MemoryBalanced, runtimes: pjrtAll},
		{name: "auto never unmet", entries: []Entry{cpu}, p: allow, ms: MemoryBalanced, runtimes: pjrtAll},
		{
			name: "nothing can run", entries: []Entry{sickGPU}, p: allow, ms: MemoryBalanced, runtimes: pjrtAll,
			want: []string{"No device can run work (auto (TPU > GPU > CPU); no TPU present; no runnable GPU (gpu:1 is unhealthy: XID 79); no CPU present; no runnable device).",
				"gpu:1 (NVIDIA H100 80GB HBM3) is unhealthy"},
		},
		{
			name: "aggressive on a shared gpu", entries: []Entry{cpu, sharedGPU}, p: allow, ms: MemoryAggressive, runtimes: pjrtAll,
			want: []string{"Memory strategy aggressive lets brokerd take 90% of 80.0 GiB on gpu:0, which other processes also use (2.0 GiB now): " +
				"they or brokerd may run out of memory; use --memory-strategy balanced or conservative."},
		},
		{
			name: "custom fraction above aggressive on a shared gpu", entries: []Entry{cpu, sharedGPU}, p: allow, ms: custom95, runtimes: pjrtAll,
			want: []string{"Memory strategy custom lets brokerd take 95% of 80.0 GiB on gpu:0"},
		},
		{name: "balanced on a shared gpu is fine", entries: []Entry{cpu, sharedGPU}, p: allow, ms: MemoryBalanced, runtimes: pjrtAll},
		{name: "aggressive on an unshared gpu is fine", entries: []Entry{cpu, gpu0}, p: allow, ms: MemoryAggressive, runtimes: pjrtAll},
		{
			name: "unhealthy device", entries: []Entry{cpu, gpu0, sickGPU}, p: allow, ms: MemoryBalanced, runtimes: pjrtAll,
			want: []string{"gpu:1 (NVIDIA H100 80GB HBM3) is unhealthy (XID 79); no work goes to it until it recovers."},
		},
		{
			name: "cordoned device", entries: []Entry{cpu, cordonedGPU}, p: allow, ms: MemoryBalanced, runtimes: pjrtAll,
			want: []string{"gpu:0 is cordoned (maintenance); no new work goes to it until `brokerctl uncordon gpu:0`."},
		},
		{
			name: "cpu limited by cgroup", entries: []Entry{limitedCPU}, p: allow, ms: MemoryBalanced, runtimes: pjrtAll,
			want: []string{"cpu:0 is limited to 2 of its 8 cores by cgroup v2 cpu.max; CPU work runs no faster than that, so raise the container's CPU limit to use the rest."},
		},
		{
			name: "cpu limited to a fraction", entries: []Entry{fractionCPU}, p: allow, ms: MemoryBalanced, runtimes: pjrtAll,
			want: []string{"cpu:0 is limited to 1.5 of its 4 cores by cgroup v1 cfs quota"},
		},
		{name: "cpu limit unknown", entries: []Entry{unknownCPU}, p: allow, ms: MemoryBalanced, runtimes: pjrtAll},
		{
			name: "everything at once, in order", entries: []Entry{limitedCPU, sharedGPU, sickGPU, tpuNoPlugin},
			p: Policy{Prefer: PreferTPU}, ms: MemoryAggressive, runtimes: pjrtTPUMissing,
			want: []string{"no PJRT plugin", "COMPUTE_ALLOW_TPU=false", "COMPUTE_PREFER=tpu could not be met", "Memory strategy aggressive",
				"gpu:1 (NVIDIA H100 80GB HBM3) is unhealthy", "cpu:0 is limited to 2 of its 8 cores"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devs := make([]Device, len(tt.entries))
			cordons := map[string]string{}
			for i, e := range tt.entries {
				devs[i] = e.Device
				if e.Cordoned {
					cordons[e.ID] = e.CordonReason
				}
			}
			sel := selectDevice(devs, tt.p, cordons)
			got := Recommendations(tt.entries, sel, tt.p, tt.ms, tt.runtimes)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d sentences, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("sentence %d = %q\nwant it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

func TestRecommendFormatBytes(t *testing.T) {
	tests := []struct {
		n    uint64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1536, "1.5 KiB"}, {5 << 20, "5.0 MiB"}, {80 * invGiB, "80.0 GiB"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := formatBytesIEC(tt.n); got != tt.want {
				t.Errorf("formatBytesIEC(%d) = %q, want %q", tt.n, got, tt.want)
			}
		})
	}
}
