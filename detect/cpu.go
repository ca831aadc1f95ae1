package detect

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CPU limit sources, as CPUInfo.LimitSource reports them.
const (
	LimitSourceCgroupV2 = "cgroup v2 cpu.max"
	LimitSourceCgroupV1 = "cgroup v1 cfs quota"
	LimitSourceCpuset   = "cpuset"
	LimitSourceNone     = "none"
)

// cgroupV1Unlimited is the smallest v1 memory limit treated as "no limit": the
// kernel reports an unlimited cgroup as PAGE_COUNTER_MAX pages, about 2^63
// bytes rounded down to the page size.
const cgroupV1Unlimited = 1 << 62

// CPUDetector reports the host CPU as the single device cpu:0, with the core
// and memory limits the process's own cgroup imposes. It is also a Refresher:
// utilisation comes from /proc/stat deltas between calls, so the detector
// keeps the previous sample.
type CPUDetector struct {
	roots Roots

	mu       sync.Mutex
	prev     cpuTimes
	havePrev bool
}

// NewCPUDetector returns a CPU detector reading the given roots.
func NewCPUDetector(roots Roots) *CPUDetector { return &CPUDetector{roots: roots} }

// Name implements Detector.
func (d *CPUDetector) Name() string { return "cpu" }

// Detect implements Detector. It always returns the CPU device: whatever
// cannot be read is left unknown and explained in a note.
func (d *CPUDetector) Detect(ctx context.Context) Result {
	var notes []string
	info, infoNotes := parseCPUInfo(d.roots.ProcPath("cpuinfo"))
	notes = append(notes, infoNotes...)

	logical, lnotes := d.logicalCores(info)
	notes = append(notes, lnotes...)

	cg, cgNotes := readOwnCgroup(d.roots.ProcPath("self", "cgroup"))
	notes = append(notes, cgNotes...)

	quota, quotaSource, qnotes := d.cgroupCPUQuota(cg)
	notes = append(notes, qnotes...)
	cpusetCount, cnotes := d.cgroupCpusetCount(cg)
	notes = append(notes, cnotes...)
	effective, source := effectiveCores(logical, quota, quotaSource, cpusetCount)

	numaNodes, nnotes := countNUMANodes(d.roots.SysPath("devices", "system", "node"))
	notes = append(notes, nnotes...)
	numaNode := -1
	if numaNodes == 1 {
		numaNode = 0
	}

	mem, mnotes := d.readMemory(cg)
	notes = append(notes, mnotes...)

	// Seed the utilisation sample so the first Refresh already has a delta.
	if t, err := readCPUTimes(d.roots.ProcPath("stat")); err == nil {
		d.mu.Lock()
		d.prev, d.havePrev = t, true
		d.mu.Unlock()
	} else {
		notes = append(notes, fmt.Sprintf("CPU utilisation unavailable: %v.", err))
	}

	arch := d.architecture()
	name := info.model
	if name == "" {
		name = arch + " CPU"
	}
	flags := keptISAFlags(info.flags)
	dev := Device{
		ID:           "cpu:0",
		Type:         TypeCPU,
		Index:        0,
		Vendor:       cpuVendor(info.vendor),
		Name:         name,
		NUMANode:     numaNode,
		MemoryTotal:  mem.total,
		MemoryFree:   mem.avail,
		Architecture: arch,
		BF16:         hasAny(flags, "avx512_bf16", "amx_bf16"),
		FP16:         hasAny(flags, "avx512_fp16", "amx_fp16"),
		MultiDevice:  false,
		Health:       Healthy,
		CPU: &CPUInfo{
			ModelName:       info.model,
			LogicalCores:    logical,
			EffectiveCores:  effective,
			LimitSource:     source,
			Flags:           flags,
			NUMANodes:       numaNodes,
			MemoryAvailable: mem.avail,
		},
		Telemetry: Telemetry{
			MemoryUsed:  mem.total - mem.avail,
			MemoryTotal: mem.total,
			UpdatedAt:   time.Now(),
		},
	}
	return Result{Devices: []Device{dev}, Notes: notes}
}

// Refresh implements Refresher: it updates the memory and utilisation of the
// CPU devices among devices and leaves all others alone. Readings that fail
// keep their previous values.
func (d *CPUDetector) Refresh(ctx context.Context, devices []*Device) {
	var cpus []*Device
	for _, dev := range devices {
		if dev != nil && dev.Type == TypeCPU {
			cpus = append(cpus, dev)
		}
	}
	if len(cpus) == 0 || ctx.Err() != nil {
		return
	}
	cg, _ := readOwnCgroup(d.roots.ProcPath("self", "cgroup"))
	mem, _ := d.readMemory(cg)
	util, haveUtil := d.sampleUtilization()
	now := time.Now()
	for _, dev := range cpus {
		if mem.total > 0 {
			dev.MemoryTotal = mem.total
			dev.MemoryFree = mem.avail
			dev.Telemetry.MemoryTotal = mem.total
			dev.Telemetry.MemoryUsed = mem.total - mem.avail
			if dev.CPU != nil {
				dev.CPU.MemoryAvailable = mem.avail
			}
		}
		if haveUtil {
			dev.Telemetry.UtilizationPercent = util
		}
		dev.Telemetry.UpdatedAt = now
	}
}

// sampleUtilization reads /proc/stat and returns the busy share since the
// previous sample. It reports false on the first sample, on a read error and
// when no time has passed.
func (d *CPUDetector) sampleUtilization() (float64, bool) {
	cur, err := readCPUTimes(d.roots.ProcPath("stat"))
	if err != nil {
		return 0, false
	}
	d.mu.Lock()
	prev, havePrev := d.prev, d.havePrev
	d.prev, d.havePrev = cur, true
	d.mu.Unlock()
	if !havePrev || cur.total <= prev.total {
		return 0, false
	}
	dTotal := cur.total - prev.total
	var dIdle uint64
	// iowait may go backwards on some kernels; never count more idle than time.
	if cur.idle > prev.idle {
		dIdle = min(cur.idle-prev.idle, dTotal)
	}
	return 100 * float64(dTotal-dIdle) / float64(dTotal), true
}

// cpuInfo is what /proc/cpuinfo says about the first processor, plus the count.
type cpuInfo struct {
	vendor     string
	model      string
	flags      []string
	processors int  // processor entries with a valid number
	malformed  bool // some processor entry was malformed, so the count is doubtful
}

func parseCPUInfo(p string) (cpuInfo, []string) {
	var info cpuInfo
	b, err := os.ReadFile(p)
	if err != nil {
		return info, []string{fmt.Sprintf("Could not read %s: %v; CPU model and flags unknown.", p, err)}
	}
	var (
		notes      []string
		badLines   int
		haveFlags  bool
		haveModel  bool
		haveVendor bool
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024) // flags lines are long
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			badLines++
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "processor":
			if n, err := strconv.Atoi(val); err != nil || n < 0 {
				info.malformed = true
				notes = append(notes, fmt.Sprintf("%s has a malformed processor entry %q.", p, val))
				continue
			}
			info.processors++
		case "vendor_id":
			if !haveVendor {
				info.vendor, haveVendor = val, true
			}
		case "model name":
			if !haveModel {
				info.model, haveModel = val, true
			}
		case "flags", "Features": // x86, arm64
			if !haveFlags {
				info.flags, haveFlags = strings.Fields(val), true
			}
		}
	}
	if err := sc.Err(); err != nil {
		notes = append(notes, fmt.Sprintf("Could not parse %s: %v.", p, err))
	}
	if badLines > 0 {
		notes = append(notes, fmt.Sprintf("%s has %d malformed lines; they were ignored.", p, badLines))
	}
	return info, notes
}

// logicalCores counts logical CPUs: the processor entries of cpuinfo, else the
// sysfs online list, else what the Go runtime sees.
func (d *CPUDetector) logicalCores(info cpuInfo) (int, []string) {
	if info.processors > 0 && !info.malformed {
		return info.processors, nil
	}
	online := d.roots.SysPath("devices", "system", "cpu", "online")
	s, err := readSysfsString(online)
	if err == nil {
		n, perr := parseCPUList(s)
		if perr == nil && n > 0 {
			return n, nil
		}
		err = fmt.Errorf("%s has %w %q", online, errMalformed, s)
	}
	if info.processors > 0 {
		return info.processors, []string{fmt.Sprintf("Logical cores counted from the valid cpuinfo entries only (%v).", err)}
	}
	n := runtime.NumCPU()
	return n, []string{fmt.Sprintf("Logical cores unknown from cpuinfo and %v; using the Go runtime's count of %d.", err, n)}
}

// architecture reads the kernel's machine name (uname -m), falling back to the
// build's GOARCH in the kernel's spelling.
func (d *CPUDetector) architecture() string {
	if s, err := readSysfsString(d.roots.ProcPath("sys", "kernel", "arch")); err == nil && s != "" {
		return s
	}
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	default:
		return runtime.GOARCH
	}
}

func cpuVendor(id string) string {
	switch id {
	case "GenuineIntel":
		return "Intel"
	case "AuthenticAMD":
		return "AMD"
	default:
		return id
	}
}

// keptISAFlags returns, in a fixed order, the ISA flags that matter to the
// CPU runtime (vector width and bf16/fp16 matmul paths).
func keptISAFlags(all []string) []string {
	var kept []string
	for _, f := range [...]string{"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16"} {
		if hasAny(all, f) {
			kept = append(kept, f)
		}
	}
	return kept
}

func hasAny(list []string, want ...string) bool {
	for _, s := range list {
		for _, w := range want {
			if s == w {
				return true
			}
		}
	}
	return false
}

// parseCPUList counts the CPUs in a kernel list such as "0-3,8,10-11".
func parseCPUList(s string) (int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0, fmt.Errorf("bad CPU list element %q: %w", part, errMalformed)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0, fmt.Errorf("bad CPU list range %q: %w", part, errMalformed)
			}
		}
		n += b - a + 1
	}
	return n, nil
}

var numaNodeDirRE = regexp.MustCompile(`^node[0-9]+$`)

func countNUMANodes(dir string) (int, []string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, []string{fmt.Sprintf("Could not list NUMA nodes in %s: %v.", dir, err)}
	}
	n := 0
	for _, e := range entries {
		if numaNodeDirRE.MatchString(e.Name()) {
			n++
		}
	}
	return n, nil
}

// effectiveCores bounds the logical count by the cgroup quota and cpuset; on a
// tie the quota is named, since it is the tighter kind of limit to change.
func effectiveCores(logical int, quota float64, quotaSource string, cpuset int) (float64, string) {
	eff, src := float64(logical), LimitSourceNone
	if quota > 0 && quota < eff {
		eff, src = quota, quotaSource
	}
	if cpuset > 0 && float64(cpuset) < eff {
		eff, src = float64(cpuset), LimitSourceCpuset
	}
	return eff, src
}

// cgroupPaths is the process's place in each cgroup hierarchy, from /proc/self/cgroup.
type cgroupPaths struct {
	v1    map[string]string // v1 controller -> path
	v2    string
	hasV2 bool
}

func readOwnCgroup(p string) (cgroupPaths, []string) {
	cg := cgroupPaths{v1: map[string]string{}}
	b, err := os.ReadFile(p)
	if err != nil {
		return cg, []string{fmt.Sprintf("Could not read %s: %v; cgroup limits not applied.", p, err)}
	}
	var notes []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			notes = append(notes, fmt.Sprintf("%s has a malformed line %q.", p, line))
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			cg.v2, cg.hasV2 = parts[2], true
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			cg.v1[ctrl] = parts[2]
		}
	}
	return cg, notes
}

// cgroupLevels lists the directories of a cgroup and its ancestors, leaf
// first, under a hierarchy mount. Limits of every ancestor apply, and in a
// container whose cgroup is mounted as the root the leaf path does not exist,
// so the walk ends at the mount itself.
func cgroupLevels(mount, cgPath string) []string {
	p := path.Clean("/" + cgPath)
	var dirs []string
	for {
		dirs = append(dirs, filepath.Join(mount, filepath.FromSlash(p)))
		if p == "/" {
			return dirs
		}
		p = path.Dir(p)
	}
}

// v1Mount returns the first existing mount directory of a v1 hierarchy.
func (d *CPUDetector) v1Mount(names ...string) (string, bool) {
	for _, n := range names {
		m := d.roots.SysPath("fs", "cgroup", n)
		if st, err := os.Stat(m); err == nil && st.IsDir() {
			return m, true
		}
	}
	return "", false
}

// cgroupCPUQuota returns the tightest CFS quota in cores over the cgroup and
// its ancestors (0 when none) and which cgroup version set it. Controllers
// bound in a v1 hierarchy win over the unified one (hybrid hosts).
func (d *CPUDetector) cgroupCPUQuota(cg cgroupPaths) (float64, string, []string) {
	var notes []string
	best := 0.0
	consider := func(cores float64) {
		if cores > 0 && (best == 0 || cores < best) {
			best = cores
		}
	}
	if p, ok := cg.v1["cpu"]; ok {
		mount, ok := d.v1Mount("cpu,cpuacct", "cpu", "cpuacct,cpu")
		if !ok {
			return 0, LimitSourceCgroupV1, nil
		}
		for _, dir := range cgroupLevels(mount, p) {
			qf := filepath.Join(dir, "cpu.cfs_quota_us")
			qs, err := readSysfsString(qf)
			if err != nil {
				if !errors.Is(err, os.ErrNotExist) {
					notes = append(notes, fmt.Sprintf("%v; CPU quota ignored.", err))
				}
				continue
			}
			quota, err := strconv.ParseInt(qs, 10, 64)
			if err != nil {
				notes = append(notes, fmt.Sprintf("%s has malformed contents %q; CPU quota ignored.", qf, qs))
				continue
			}
			if quota < 0 { // -1: no quota at this level
				continue
			}
			pf := filepath.Join(dir, "cpu.cfs_period_us")
			ps, err := readSysfsString(pf)
			if err != nil {
				notes = append(notes, fmt.Sprintf("%v; CPU quota ignored.", err))
				continue
			}
			period, err := strconv.ParseInt(ps, 10, 64)
			if err != nil || period <= 0 {
				notes = append(notes, fmt.Sprintf("%s has malformed contents %q; CPU quota ignored.", pf, ps))
				continue
			}
			consider(float64(quota) / float64(period))
		}
		return best, LimitSourceCgroupV1, notes
	}
	if !cg.hasV2 {
		return 0, LimitSourceNone, nil
	}
	for _, dir := range cgroupLevels(d.roots.SysPath("fs", "cgroup"), cg.v2) {
		f := filepath.Join(dir, "cpu.max")
		s, err := readSysfsString(f)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				notes = append(notes, fmt.Sprintf("%v; CPU quota ignored.", err))
			}
			continue
		}
		cores, err := parseCPUMax(s)
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s has malformed contents %q; CPU quota ignored.", f, s))
			continue
		}
		consider(cores)
	}
	return best, LimitSourceCgroupV2, notes
}

// parseCPUMax parses a v2 cpu.max, "$MAX $PERIOD", into cores (0 for "max").
func parseCPUMax(s string) (float64, error) {
	f := strings.Fields(s)
	if len(f) == 0 || len(f) > 2 {
		return 0, errMalformed
	}
	period := 100000.0 // the kernel default, when only the quota is given
	if len(f) == 2 {
		p, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil || p == 0 {
			return 0, errMalformed
		}
		period = float64(p)
	}
	if f[0] == "max" {
		return 0, nil
	}
	q, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || q == 0 {
		return 0, errMalformed
	}
	return float64(q) / period, nil
}

// cgroupCpusetCount returns the number of CPUs in the leaf-most cpuset found
// (0 when none). Child cpusets are subsets of their parents, so the first one
// found is the binding one.
func (d *CPUDetector) cgroupCpusetCount(cg cgroupPaths) (int, []string) {
	var (
		levels []string
		files  []string
	)
	if p, ok := cg.v1["cpuset"]; ok {
		mount, ok := d.v1Mount("cpuset")
		if !ok {
			return 0, nil
		}
		levels, files = cgroupLevels(mount, p), []string{"cpuset.effective_cpus", "cpuset.cpus"}
	} else if cg.hasV2 {
		levels, files = cgroupLevels(d.roots.SysPath("fs", "cgroup"), cg.v2), []string{"cpuset.cpus.effective"}
	}
	var notes []string
	for _, dir := range levels {
		for _, name := range files {
			f := filepath.Join(dir, name)
			s, err := readSysfsString(f)
			if err != nil {
				if !errors.Is(err, os.ErrNotExist) {
					notes = append(notes, fmt.Sprintf("%v; cpuset ignored.", err))
				}
				continue
			}
			n, err := parseCPUList(s)
			if err != nil {
				notes = append(notes, fmt.Sprintf("%s: %v; cpuset ignored.", f, err))
				continue
			}
			if n > 0 {
				return n, notes
			}
		}
	}
	return 0, notes
}

// memLimit is the tightest cgroup memory limit and the usage of the cgroup that sets it.
type memLimit struct {
	limit, usage uint64
	ok           bool
}

func (d *CPUDetector) cgroupMemoryLimit(cg cgroupPaths) (memLimit, []string) {
	var (
		levels               []string
		limitFile, usageFile string
	)
	if p, ok := cg.v1["memory"]; ok {
		mount, ok := d.v1Mount("memory")
		if !ok {
			return memLimit{}, nil
		}
		levels, limitFile, usageFile = cgroupLevels(mount, p), "memory.limit_in_bytes", "memory.usage_in_bytes"
	} else if cg.hasV2 {
		levels, limitFile, usageFile = cgroupLevels(d.roots.SysPath("fs", "cgroup"), cg.v2), "memory.max", "memory.current"
	}
	var (
		best  memLimit
		notes []string
	)
	for _, dir := range levels {
		f := filepath.Join(dir, limitFile)
		s, err := readSysfsString(f)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				notes = append(notes, fmt.Sprintf("%v; memory limit ignored.", err))
			}
			continue
		}
		if s == "max" {
			continue
		}
		limit, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s has malformed contents %q; memory limit ignored.", f, s))
			continue
		}
		if limit >= cgroupV1Unlimited || (best.ok && limit >= best.limit) {
			continue
		}
		uf := filepath.Join(dir, usageFile)
		var usage uint64
		if us, err := readSysfsString(uf); err != nil {
			notes = append(notes, fmt.Sprintf("%v; memory usage taken as 0.", err))
		} else if usage, err = strconv.ParseUint(us, 10, 64); err != nil {
			notes = append(notes, fmt.Sprintf("%s has malformed contents %q; memory usage taken as 0.", uf, us))
			usage = 0
		}
		best = memLimit{limit: limit, usage: usage, ok: true}
	}
	return best, notes
}

// memInfo is the host memory from /proc/meminfo, in bytes.
type memInfo struct {
	total, avail         uint64
	haveTotal, haveAvail bool
}

func parseMemInfo(p string) (memInfo, []string) {
	var m memInfo
	b, err := os.ReadFile(p)
	if err != nil {
		return m, []string{fmt.Sprintf("Could not read %s: %v; host memory unknown.", p, err)}
	}
	var (
		notes     []string
		free      uint64
		haveFree  bool
		seenTotal bool
	)
	for _, line := range strings.Split(string(b), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *uint64
		var have *bool
		switch key {
		case "MemTotal":
			dst, have = &m.total, &m.haveTotal
		case "MemAvailable":
			dst, have = &m.avail, &m.haveAvail
		case "MemFree":
			dst, have = &free, &haveFree
		default:
			continue
		}
		seenTotal = seenTotal || key == "MemTotal"
		f := strings.Fields(val)
		kb, err := strconv.ParseUint(firstOr(f, ""), 10, 64)
		if err != nil || len(f) > 2 || (len(f) == 2 && f[1] != "kB") || kb > math.MaxUint64/1024 {
			notes = append(notes, fmt.Sprintf("%s has a malformed %s value %q.", p, key, strings.TrimSpace(val)))
			continue
		}
		*dst, *have = kb*1024, true
	}
	if !m.haveAvail && haveFree {
		// Kernels before 3.14 have no MemAvailable; free memory is the safe lower bound.
		m.avail, m.haveAvail = free, true
	}
	if !seenTotal {
		notes = append(notes, fmt.Sprintf("%s has no MemTotal.", p))
	}
	return m, notes
}

func firstOr(f []string, def string) string {
	if len(f) == 0 {
		return def
	}
	return f[0]
}

type memReading struct{ total, avail uint64 }

// readMemory combines /proc/meminfo with the cgroup limit: a limit below the
// host total becomes the total, and available memory is what is left under it.
func (d *CPUDetector) readMemory(cg cgroupPaths) (memReading, []string) {
	mi, notes := parseMemInfo(d.roots.ProcPath("meminfo"))
	lim, lnotes := d.cgroupMemoryLimit(cg)
	notes = append(notes, lnotes...)
	r := memReading{total: mi.total, avail: mi.avail}
	if !mi.haveAvail {
		r.avail = r.total
	}
	if lim.ok && (!mi.haveTotal || lim.limit < mi.total) {
		room := uint64(0)
		if lim.usage < lim.limit {
			room = lim.limit - lim.usage
		}
		r.total = lim.limit
		if !mi.haveAvail || room < r.avail {
			r.avail = room
		}
	}
	r.avail = min(r.avail, r.total)
	return r, notes
}

// cpuTimes is the aggregate line of /proc/stat, in USER_HZ ticks.
type cpuTimes struct{ total, idle uint64 }

func readCPUTimes(p string) (cpuTimes, error) {
	f, err := os.Open(p)
	if err != nil {
		return cpuTimes{}, fmt.Errorf("could not read %s: %w", p, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuTimes{}, fmt.Errorf("%s is empty: %w", p, errMalformed)
	}
	fields := strings.Fields(sc.Text())
	// cpu user nice system idle iowait irq softirq steal [guest guest_nice]
	if len(fields) < 5 || fields[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("%s has %w %q", p, errMalformed, sc.Text())
	}
	var t cpuTimes
	// guest and guest_nice are already counted in user and nice.
	for i, s := range fields[1:min(len(fields), 9)] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("%s has %w %q", p, errMalformed, sc.Text())
		}
		t.total += v
		if i == 3 || i == 4 { // idle, iowait
			t.idle += v
		}
	}
	return t, nil
}
