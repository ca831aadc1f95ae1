package onednn

import (
	"os"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime"
)

func TestProbe(t *testing.T) {
	info := Probe()
	if info.Name != Name {
		t.Errorf("Name = %q, want %q", info.Name, Name)
	}
	if !info.Available {
		t.Fatalf("oneDNN unavailable: %s", info.Reason)
	}
	if info.Reason != "" {
		t.Errorf("Reason = %q for an available adapter", info.Reason)
	}
	if !strings.HasPrefix(info.Version, "2.") {
		t.Errorf("Version = %q, want oneDNN 2.x", info.Version)
	}
	if len(info.DeviceTypes) != 1 || info.DeviceTypes[0] != runtime.DeviceCPU {
		t.Errorf("DeviceTypes = %v, want [cpu]", info.DeviceTypes)
	}
}

func TestCheckCPUEngine(t *testing.T) {
	// Twice: creating an engine must not depend on state left by the first.
	for i := 0; i < 2; i++ {
		if err := checkCPUEngine(); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
}

func TestLibraryVersion(t *testing.T) {
	v := LibraryVersion()
	if v.Major != 2 {
		t.Errorf("Major = %d, want 2", v.Major)
	}
	if v.CPURuntime == "" {
		t.Error("CPURuntime is empty")
	}
	if v.Hash == "N/A" {
		t.Error(`Hash "N/A" should be reported as empty`)
	}
}

func TestVersionString(t *testing.T) {
	tests := []struct {
		name string
		v    Version
		want string
	}{
		{"no hash", Version{Major: 2, Minor: 6, Patch: 3}, "2.6.3"},
		{"hash", Version{Major: 2, Minor: 6, Patch: 3, Hash: "52b5f107"}, "2.6.3 (git 52b5f107)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.v.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestISAName(t *testing.T) {
	// Values from oneDNN 2.6's dnnl_types.h.
	tests := []struct {
		isa  uint32
		want string
	}{
		{0x0, "all"},
		{0x1, "sse41"},
		{0x3, "avx"},
		{0x7, "avx2"},
		{0x407, "avx2_vnni"},
		{0x27, "avx512_core"},
		{0x67, "avx512_core_vnni"},
		{0xe7, "avx512_core_bf16"},
		{0x3e7, "avx512_core_amx"},
		{0x12345, "isa(0x12345)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := isaName(tt.isa); got != tt.want {
				t.Errorf("isaName(0x%x) = %q, want %q", tt.isa, got, tt.want)
			}
		})
	}
}

// TestMaxISAMatchesCPU checks MaxISA against the CPU flags the kernel reports.
func TestMaxISAMatchesCPU(t *testing.T) {
	for _, env := range []string{"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"} {
		if v := os.Getenv(env); v != "" {
			t.Skipf("%s=%s limits the ISA oneDNN uses", env, v)
		}
	}
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skipf("no /proc/cpuinfo: %v", err)
	}
	flags := map[string]bool{}
	for _, line := range strings.Split(string(cpuinfo), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			for _, f := range strings.Fields(v) {
				flags[f] = true
			}
			break
		}
	}
	if len(flags) == 0 {
		t.Skip("no flags line in /proc/cpuinfo (not x86?)")
	}
	isa := MaxISA()
	t.Logf("MaxISA = %s", isa)
	if strings.HasPrefix(isa, "avx512") && !flags["avx512f"] {
		t.Errorf("MaxISA = %s on a CPU without avx512f", isa)
	}
	if strings.HasSuffix(isa, "_amx") && !flags["amx_tile"] {
		t.Errorf("MaxISA = %s on a CPU without amx_tile", isa)
	}
	if flags["avx2"] && (isa == "all" || isa == "sse41" || isa == "avx") {
		t.Errorf("MaxISA = %s on a CPU with avx2", isa)
	}
}
