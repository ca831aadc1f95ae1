package detect

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// hwRoots returns the roots of a host tree under testdata/hosts.
func hwRoots(host string) Roots {
	base := filepath.Join("testdata", "hosts", host)
	return Roots{Sys: filepath.Join(base, "sys"), Proc: filepath.Join(base, "proc"), Dev: filepath.Join(base, "dev")}
}

// hwEmptyRoots returns roots of a host with nothing at all mounted.
func hwEmptyRoots(t *testing.T) Roots {
	dir := t.TempDir()
	return Roots{Sys: filepath.Join(dir, "sys"), Proc: filepath.Join(dir, "proc"), Dev: filepath.Join(dir, "dev")}
}

// hwCheckNotes fails unless every wanted fragment appears in some note, and,
// when none are wanted, unless there are no notes at all.
func hwCheckNotes(t *testing.T, notes, want []string) {
	t.Helper()
	if len(want) == 0 && len(notes) > 0 {
		t.Errorf("unexpected notes:\n%s", strings.Join(notes, "\n"))
	}
	for _, w := range want {
		found := false
		for _, n := range notes {
			if strings.Contains(n, w) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("no note mentions %q; notes:\n%s", w, strings.Join(notes, "\n"))
		}
	}
}

const testGiB = uint64(1) << 30

func TestCPUDetect(t *testing.T) {
	tests := []struct {
		name        string
		roots       Roots
		logical     int
		effective   float64
		source      string
		numaNodes   int
		numaNode    int
		vendor      string
		model       string
		flags       []string
		bf16, fp16  bool
		total, free uint64
		notes       []string
	}{
		{
			name: "cgroup v1 pod with cfs quota and pod memory limit", roots: hwRoots("cpu-cgroup-v1"),
			logical: 4, effective: 1.5, source: LimitSourceCgroupV1, numaNodes: 1, numaNode: 0,
			vendor: "Intel", model: "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
			flags: []string{"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"},
			bf16:  true, fp16: true,
			total: 4 * testGiB, free: 3 * testGiB, // limit 4 GiB minus the pod's 1 GiB usage
		},
		{
			name: "cgroup v2 service with cpu.max and memory.max", roots: hwRoots("cpu-cgroup-v2"),
			logical: 8, effective: 2, source: LimitSourceCgroupV2, numaNodes: 2, numaNode: -1,
			vendor: "AMD", model: "AMD EPYC 9B14",
			flags: []string{"avx2", "avx512f", "avx512_bf16"},
			bf16:  true,
			total: 8 * testGiB, free: 6 * testGiB,
		},
		{
			name: "cgroup v2 container bound by its cpuset", roots: hwRoots("cpu-cgroup-v2-cpuset"),
			logical: 8, effective: 2, source: LimitSourceCpuset, numaNodes: 1, numaNode: 0,
			vendor: "AMD", model: "AMD EPYC 9B14",
			flags: []string{"avx2", "avx512f", "avx512_bf16"},
			bf16:  true,
			total: 32768000 * 1024, free: 30000000 * 1024, // memory.max is "max": the host's meminfo
		},
		{
			name: "broken files", roots: hwRoots("broken"),
			// One processor entry is malformed, so the sysfs online list (0-1) counts.
			logical: 2, effective: 2, source: LimitSourceNone, numaNodes: 1, numaNode: 0,
			vendor: "Intel", model: "Intel(R) Xeon(R) CPU @ 2.20GHz",
			flags: []string{"avx2", "avx512f"},
			// MemTotal is garbage, so the cgroup limit is the total.
			total: 2 * testGiB, free: 2*testGiB - 512<<20,
			notes: []string{"cpuinfo has a malformed processor entry", "cpuinfo has 1 malformed lines",
				"meminfo has a malformed MemTotal", "cpu.max has malformed contents", "self/cgroup has a malformed line",
				"CPU utilisation unavailable"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := NewCPUDetector(tc.roots).Detect(context.Background())
			hwCheckNotes(t, res.Notes, tc.notes)
			if len(res.Devices) != 1 {
				t.Fatalf("got %d devices, want 1", len(res.Devices))
			}
			d := res.Devices[0]
			if d.ID != "cpu:0" || d.Type != TypeCPU || d.Index != 0 || d.MultiDevice || d.Health != Healthy {
				t.Errorf("identity = %s %s %d multi=%v health=%s", d.ID, d.Type, d.Index, d.MultiDevice, d.Health)
			}
			if d.CPU == nil {
				t.Fatal("CPU info missing")
			}
			c := d.CPU
			if c.LogicalCores != tc.logical || c.EffectiveCores != tc.effective || c.LimitSource != tc.source {
				t.Errorf("cores = %d logical, %v effective (%s), want %d, %v (%s)",
					c.LogicalCores, c.EffectiveCores, c.LimitSource, tc.logical, tc.effective, tc.source)
			}
			if c.NUMANodes != tc.numaNodes || d.NUMANode != tc.numaNode {
				t.Errorf("NUMA = %d nodes, node %d; want %d, %d", c.NUMANodes, d.NUMANode, tc.numaNodes, tc.numaNode)
			}
			if d.Vendor != tc.vendor || d.Name != tc.model || c.ModelName != tc.model {
				t.Errorf("vendor/name = %q/%q/%q, want %q/%q", d.Vendor, d.Name, c.ModelName, tc.vendor, tc.model)
			}
			if !reflect.DeepEqual(c.Flags, tc.flags) {
				t.Errorf("flags = %v, want %v", c.Flags, tc.flags)
			}
			if d.BF16 != tc.bf16 || d.FP16 != tc.fp16 {
				t.Errorf("bf16/fp16 = %v/%v, want %v/%v", d.BF16, d.FP16, tc.bf16, tc.fp16)
			}
			if d.MemoryTotal != tc.total || d.MemoryFree != tc.free || c.MemoryAvailable != tc.free {
				t.Errorf("memory = %d total, %d free, %d available; want %d, %d", d.MemoryTotal, d.MemoryFree, c.MemoryAvailable, tc.total, tc.free)
			}
			if d.Telemetry.MemoryTotal != tc.total || d.Telemetry.MemoryUsed != tc.total-tc.free {
				t.Errorf("telemetry memory = %d used of %d", d.Telemetry.MemoryUsed, d.Telemetry.MemoryTotal)
			}
			if d.Architecture != "x86_64" {
				t.Errorf("architecture = %q, want x86_64 from proc/sys/kernel/arch", d.Architecture)
			}
		})
	}
}

func TestCPUDetectEmptyHost(t *testing.T) {
	res := NewCPUDetector(hwEmptyRoots(t)).Detect(context.Background())
	hwCheckNotes(t, res.Notes, []string{"cpuinfo", "meminfo", "self/cgroup", "Go runtime's count"})
	if len(res.Devices) != 1 {
		t.Fatalf("got %d devices, want the CPU even with nothing readable", len(res.Devices))
	}
	d := res.Devices[0]
	if d.CPU.LogicalCores != runtime.NumCPU() || d.CPU.EffectiveCores != float64(runtime.NumCPU()) || d.CPU.LimitSource != LimitSourceNone {
		t.Errorf("cores = %d/%v (%s), want the runtime's %d", d.CPU.LogicalCores, d.CPU.EffectiveCores, d.CPU.LimitSource, runtime.NumCPU())
	}
	if d.MemoryTotal != 0 || d.MemoryFree != 0 || d.Name == "" || d.NUMANode != -1 {
		t.Errorf("memory %d/%d, name %q, NUMA %d: want unknown memory, a fallback name and NUMA -1", d.MemoryTotal, d.MemoryFree, d.Name, d.NUMANode)
	}
}

// hwCopyHost copies a host tree (without symlinks) so a test may change it.
func hwCopyHost(t *testing.T, host string) Roots {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(filepath.Join("testdata", "hosts", host))); err != nil {
		t.Fatalf("copy %s: %v", host, err)
	}
	return Roots{Sys: filepath.Join(dir, "sys"), Proc: filepath.Join(dir, "proc"), Dev: filepath.Join(dir, "dev")}
}

func hwWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCPURefresh(t *testing.T) {
	roots := hwCopyHost(t, "cpu-cgroup-v2")
	det := NewCPUDetector(roots)
	res := det.Detect(context.Background())
	if len(res.Devices) != 1 {
		t.Fatalf("detect: %d devices", len(res.Devices))
	}
	cpu := res.Devices[0]
	other := Device{ID: "tpu:0", Type: TypeTPU, MemoryTotal: 16 * testGiB, MemoryFree: 16 * testGiB}
	otherBefore := other
	statFile := roots.ProcPath("stat")
	usageFile := roots.SysPath("fs", "cgroup", "system.slice", "brokerd.service", "memory.current")

	// The testdata sample is user 84215, nice 113, system 23911, idle 3216680,
	// iowait 2712, irq 0, softirq 1402, steal 310.
	steps := []struct {
		name     string
		stat     string // new /proc/stat first line; empty keeps the file
		usage    string // new memory.current of the service; empty keeps it
		wantUtil float64
		wantFree uint64
	}{
		{
			name: "busy 400 of 1000 ticks", stat: "cpu  84515 113 24011 3217230 2762 0 1402 310 0 0\n",
			wantUtil: 40, wantFree: 6 * testGiB,
		},
		{
			name: "no time passed keeps the last reading", usage: "4294967296\n",
			wantUtil: 40, wantFree: 4 * testGiB,
		},
		{
			name: "fully busy", stat: "cpu  85515 113 24011 3217230 2762 0 1402 310 0 0\n",
			wantUtil: 100, wantFree: 4 * testGiB,
		},
		{
			// Seen on kernels whose iowait goes backwards: never more idle than elapsed time.
			name: "idle counted beyond elapsed time", stat: "cpu  85415 113 24011 3217430 2762 0 1402 310 0 0\n",
			wantUtil: 0, wantFree: 4 * testGiB,
		},
		{
			name: "over the limit leaves nothing free", stat: "cpu  85415 113 24011 3218430 2762 0 1402 310 0 0\n", usage: "9663676416\n",
			wantUtil: 0, wantFree: 0,
		},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.stat != "" {
				hwWrite(t, statFile, st.stat)
			}
			if st.usage != "" {
				hwWrite(t, usageFile, st.usage)
			}
			before := time.Now()
			det.Refresh(context.Background(), []*Device{&other, &cpu})
			if cpu.Telemetry.UtilizationPercent != st.wantUtil {
				t.Errorf("utilization = %v, want %v", cpu.Telemetry.UtilizationPercent, st.wantUtil)
			}
			if cpu.MemoryFree != st.wantFree || cpu.CPU.MemoryAvailable != st.wantFree {
				t.Errorf("free = %d (available %d), want %d", cpu.MemoryFree, cpu.CPU.MemoryAvailable, st.wantFree)
			}
			if cpu.MemoryTotal != 8*testGiB || cpu.Telemetry.MemoryTotal != 8*testGiB || cpu.Telemetry.MemoryUsed != 8*testGiB-st.wantFree {
				t.Errorf("telemetry = %d used of %d, device total %d", cpu.Telemetry.MemoryUsed, cpu.Telemetry.MemoryTotal, cpu.MemoryTotal)
			}
			if cpu.Telemetry.UpdatedAt.Before(before) {
				t.Errorf("UpdatedAt %v not refreshed", cpu.Telemetry.UpdatedAt)
			}
			if !reflect.DeepEqual(other, otherBefore) {
				t.Errorf("Refresh changed a non-CPU device: %+v", other)
			}
		})
	}
}

// TestCPURefreshConcurrent exercises the guarded sample under -race.
func TestCPURefreshConcurrent(t *testing.T) {
	det := NewCPUDetector(hwRoots("cpu-cgroup-v1"))
	res := det.Detect(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		dev := res.Devices[0]
		dev.CPU = &CPUInfo{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				det.Refresh(context.Background(), []*Device{&dev})
			}
			if dev.MemoryFree != 3*testGiB {
				t.Errorf("free = %d, want 3 GiB", dev.MemoryFree)
			}
		}()
	}
	wg.Wait()
}

func TestCPURefreshCancelled(t *testing.T) {
	det := NewCPUDetector(hwRoots("cpu-cgroup-v1"))
	dev := Device{ID: "cpu:0", Type: TypeCPU}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	det.Refresh(ctx, []*Device{&dev})
	if !dev.Telemetry.UpdatedAt.IsZero() || dev.MemoryTotal != 0 {
		t.Errorf("a cancelled refresh changed the device: %+v", dev)
	}
}

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr bool
	}{
		{"0-3", 4, false},
		{"0", 1, false},
		{"0-3,8,10-11", 7, false},
		{" 2-3\n", 2, false},
		{"", 0, false},
		{"3-1", 0, true},
		{"a-b", 0, true},
		{"0,,1", 0, true},
		{"-1", 0, true},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			got, err := parseCPUList(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseCPUList(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseCPUMax(t *testing.T) {
	tests := []struct {
		in      string
		want    float64
		wantErr bool
	}{
		{"max 100000", 0, false},
		{"200000 100000", 2, false},
		{"150000 100000", 1.5, false},
		{"50000 100000", 0.5, false},
		{"300000", 3, false},
		{"max", 0, false},
		{"garbage", 0, true},
		{"100000 0", 0, true},
		{"0 100000", 0, true},
		{"", 0, true},
		{"1 2 3", 0, true},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			got, err := parseCPUMax(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseCPUMax(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestCPUEffectiveCores(t *testing.T) {
	tests := []struct {
		name       string
		logical    int
		quota      float64
		cpuset     int
		want       float64
		wantSource string
	}{
		{"no limits", 8, 0, 0, 8, LimitSourceNone},
		{"quota binds", 8, 2, 4, 2, LimitSourceCgroupV2},
		{"cpuset binds", 8, 6, 4, 4, LimitSourceCpuset},
		{"tie names the quota", 8, 4, 4, 4, LimitSourceCgroupV2},
		{"quota above logical", 4, 16, 0, 4, LimitSourceNone},
		{"cpuset of every CPU", 4, 0, 4, 4, LimitSourceNone},
		{"fractional quota", 4, 0.5, 2, 0.5, LimitSourceCgroupV2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, src := effectiveCores(tc.logical, tc.quota, LimitSourceCgroupV2, tc.cpuset)
			if got != tc.want || src != tc.wantSource {
				t.Errorf("effectiveCores = %v (%s), want %v (%s)", got, src, tc.want, tc.wantSource)
			}
		})
	}
}

func TestCPUCgroupLevels(t *testing.T) {
	tests := []struct {
		path string
		want []string
	}{
		{"/", []string{"/m"}},
		{"/a/b", []string{"/m/a/b", "/m/a", "/m"}},
		{"/a/../../etc", []string{"/m/etc", "/m"}}, // never climbs out of the mount
		{"a", []string{"/m/a", "/m"}},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			if got := cgroupLevels("/m", tc.path); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("cgroupLevels(%q) = %v, want %v", tc.path, got, tc.want)
			}
		})
	}
}

func TestCPUReadOwnCgroup(t *testing.T) {
	tests := []struct {
		name      string
		content   string
		wantV1    map[string]string
		wantV2    string
		wantHasV2 bool
		wantNotes int
	}{
		{"unified", "0::/system.slice/brokerd.service\n", map[string]string{}, "/system.slice/brokerd.service", true, 0},
		{
			"hybrid", "4:memory:/user.slice\n2:cpu,cpuacct:/\n1:name=systemd:/user.slice\n0::/user.slice\n",
			map[string]string{"memory": "/user.slice", "cpu": "/", "cpuacct": "/", "name=systemd": "/user.slice"}, "/user.slice", true, 0,
		},
		{"garbage", "nonsense\n3:cpuset\n", map[string]string{}, "", false, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "cgroup")
			hwWrite(t, p, tc.content)
			cg, notes := readOwnCgroup(p)
			if !reflect.DeepEqual(cg.v1, tc.wantV1) || cg.v2 != tc.wantV2 || cg.hasV2 != tc.wantHasV2 || len(notes) != tc.wantNotes {
				t.Errorf("readOwnCgroup = %+v, notes %q", cg, notes)
			}
		})
	}
}

func TestCPUReadTimes(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    cpuTimes
		wantErr bool
	}{
		{"modern", "cpu  10 1 5 100 4 0 2 3 7 0\ncpu0 1 1 1 1\n", cpuTimes{total: 125, idle: 104}, false},
		{"old kernel", "cpu  10 1 5 100\n", cpuTimes{total: 116, idle: 100}, false},
		{"garbage", "cpu  10 x 5 100\n", cpuTimes{}, true},
		{"wrong line", "intr 1 2 3 4 5\n", cpuTimes{}, true},
		{"empty", "", cpuTimes{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "stat")
			hwWrite(t, p, tc.content)
			got, err := readCPUTimes(p)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("readCPUTimes = %+v, %v; want %+v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestCPUMemory(t *testing.T) {
	const meminfo16G = "MemTotal:       16777216 kB\nMemFree:         8388608 kB\nMemAvailable:   12582912 kB\n"
	tests := []struct {
		name        string
		files       map[string]string // relative to a host root holding proc/ and sys/
		total, free uint64
		notes       []string
	}{
		{
			name: "no cgroup limit",
			files: map[string]string{"proc/meminfo": meminfo16G, "proc/self/cgroup": "0::/\n",
				"sys/fs/cgroup/memory.max": "max\n"},
			total: 16 * testGiB, free: 12 * testGiB,
		},
		{
			name: "v2 limit with room above MemAvailable",
			files: map[string]string{"proc/meminfo": meminfo16G, "proc/self/cgroup": "0::/app\n",
				"sys/fs/cgroup/app/memory.max": "15032385536\n", "sys/fs/cgroup/app/memory.current": "1073741824\n"},
			total: 14 * testGiB, free: 12 * testGiB,
		},
		{
			name: "v2 limit above MemTotal is ignored",
			files: map[string]string{"proc/meminfo": meminfo16G, "proc/self/cgroup": "0::/app\n",
				"sys/fs/cgroup/app/memory.max": "34359738368\n", "sys/fs/cgroup/app/memory.current": "1073741824\n"},
			total: 16 * testGiB, free: 12 * testGiB,
		},
		{
			name: "v2 usage above the limit",
			files: map[string]string{"proc/meminfo": meminfo16G, "proc/self/cgroup": "0::/app\n",
				"sys/fs/cgroup/app/memory.max": "1073741824\n", "sys/fs/cgroup/app/memory.current": "1073745920\n"},
			total: testGiB, free: 0,
		},
		{
			name: "v1 unlimited with unknown MemTotal stays unknown",
			files: map[string]string{"proc/meminfo": "MemAvailable:   12582912 kB\n", "proc/self/cgroup": "5:memory:/\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n", "sys/fs/cgroup/memory/memory.usage_in_bytes": "1073741824\n"},
			total: 0, free: 0, notes: []string{"meminfo has no MemTotal"},
		},
		{
			name: "v1 limit without a usage file",
			files: map[string]string{"proc/meminfo": meminfo16G, "proc/self/cgroup": "5:memory:/\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "2147483648\n"},
			total: 2 * testGiB, free: 2 * testGiB, notes: []string{"memory.usage_in_bytes"},
		},
		{
			name: "no meminfo, v2 limit",
			files: map[string]string{"proc/self/cgroup": "0::/app\n",
				"sys/fs/cgroup/app/memory.max": "2147483648\n", "sys/fs/cgroup/app/memory.current": "536870912\n"},
			total: 2 * testGiB, free: 2*testGiB - 512<<20, notes: []string{"meminfo"},
		},
		{
			name:  "kernel without MemAvailable",
			files: map[string]string{"proc/meminfo": "MemTotal:       16777216 kB\nMemFree:         8388608 kB\n", "proc/self/cgroup": "0::/\n"},
			total: 16 * testGiB, free: 8 * testGiB,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for rel, content := range tc.files {
				p := filepath.Join(dir, filepath.FromSlash(rel))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				hwWrite(t, p, content)
			}
			det := NewCPUDetector(Roots{Sys: filepath.Join(dir, "sys"), Proc: filepath.Join(dir, "proc"), Dev: filepath.Join(dir, "dev")})
			cg, cgNotes := readOwnCgroup(det.roots.ProcPath("self", "cgroup"))
			got, notes := det.readMemory(cg)
			hwCheckNotes(t, append(cgNotes, notes...), tc.notes)
			if got.total != tc.total || got.avail != tc.free {
				t.Errorf("memory = %d total, %d free; want %d, %d", got.total, got.avail, tc.total, tc.free)
			}
		})
	}
}

// TestCPUTPUAMDCoralOnEveryHost runs every sysfs detector on every host tree:
// none may panic, and what they return must be well formed.
func TestCPUTPUAMDCoralOnEveryHost(t *testing.T) {
	hosts, err := os.ReadDir(filepath.Join("testdata", "hosts"))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		t.Run(h.Name(), func(t *testing.T) {
			roots := hwRoots(h.Name())
			seen := map[string]bool{}
			for _, det := range []Detector{NewCPUDetector(roots), NewTPUDetector(roots, hwEnv(nil)), NewAMDDetector(roots), NewCoralDetector(roots)} {
				res := det.Detect(context.Background())
				for _, n := range res.Notes {
					if n == "" || !strings.HasSuffix(n, ".") && !strings.HasSuffix(n, "?") {
						t.Errorf("%s: note is not a sentence: %q", det.Name(), n)
					}
				}
				for _, d := range res.Devices {
					if seen[d.ID] {
						t.Errorf("%s: duplicate ID %s", det.Name(), d.ID)
					}
					seen[d.ID] = true
					if d.ID != fmt.Sprintf("%s:%d", d.Type, d.Index) || d.Health == "" || d.NUMANode < -1 || d.MemoryFree > d.MemoryTotal {
						t.Errorf("%s: malformed device %+v", det.Name(), d)
					}
					if d.PCIBusID != "" && !pciAddressRE.MatchString(d.PCIBusID) {
						t.Errorf("%s: %s has PCI address %q", det.Name(), d.ID, d.PCIBusID)
					}
					for _, p := range d.DevicePaths {
						if _, err := os.Stat(p); err != nil {
							t.Errorf("%s: %s lists a device path that does not exist: %v", det.Name(), d.ID, err)
						}
					}
				}
			}
			if !seen["cpu:0"] {
				t.Error("no cpu:0")
			}
		})
	}
}
