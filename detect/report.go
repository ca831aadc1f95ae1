package detect

import (
	"fmt"
	"strconv"
	"strings"
)

// Recommendations are plain sentences for the report telling an operator what
// keeps brokerd from using this host fully. NVML missing on a GPU host is left
// to the NVIDIA detector's note.
func Recommendations(entries []Entry, sel Selection, p Policy, ms MemoryStrategy, runtimes []RuntimeStatus) []string {
	var out []string
	var tpus, stuckTPUs []string
	for i := range entries {
		if entries[i].Type == TypeTPU {
			tpus = append(tpus, entries[i].ID)
			if !entries[i].Runnable() {
				stuckTPUs = append(stuckTPUs, entries[i].ID)
			}
		}
	}
	if len(stuckTPUs) > 0 && !runtimeAvailableFor(runtimes, TypeTPU) {
		out = append(out, fmt.Sprintf("A TPU is present (%s) but no PJRT plugin was found, so brokerd cannot run work on it: "+
			"point brokerd at libtpu.so with --pjrt-plugin tpu=/path/to/libtpu.so or TPU_LIBRARY_PATH=/path/to/libtpu.so.",
			strings.Join(stuckTPUs, ", ")))
	}
	if len(tpus) > 0 && !p.AllowTPU {
		out = append(out, fmt.Sprintf("A TPU is present (%s) but COMPUTE_ALLOW_TPU=false, so no work runs on it: "+
			"set COMPUTE_ALLOW_TPU=true (--allow-tpu) to use it.", strings.Join(tpus, ", ")))
	}
	switch prefer := p.Prefer; {
	case sel.Device == nil:
		out = append(out, "No device can run work ("+sel.Reason+").")
	case prefer != "" && prefer != PreferAuto && sel.Device.Type != Type(prefer):
		out = append(out, fmt.Sprintf("COMPUTE_PREFER=%s could not be met (%s).", prefer, sel.Reason))
	}
	if ms.Fraction >= MemoryAggressive.Fraction {
		for i := range entries {
			e := &entries[i]
			if e.Type == TypeGPU && e.Telemetry.MemoryUsedByOthers > 0 {
				out = append(out, fmt.Sprintf("Memory strategy %s lets brokerd take %s of %s on %s, which other processes also use (%s now): "+
					"they or brokerd may run out of memory; use --memory-strategy balanced or conservative.",
					ms.Name, formatFraction(ms.Fraction), formatBytesIEC(e.MemoryTotal), e.ID, formatBytesIEC(e.Telemetry.MemoryUsedByOthers)))
			}
		}
	}
	for i := range entries {
		e := &entries[i]
		if e.Health == Unhealthy {
			why := ""
			if e.HealthReason != "" {
				why = " (" + e.HealthReason + ")"
			}
			out = append(out, fmt.Sprintf("%s%s is unhealthy%s; no work goes to it until it recovers.", e.ID, nameSuffix(e.Name), why))
		}
	}
	for i := range entries {
		e := &entries[i]
		if e.Cordoned {
			why := ""
			if e.CordonReason != "" {
				why = " (" + e.CordonReason + ")"
			}
			out = append(out, fmt.Sprintf("%s is cordoned%s; no new work goes to it until `brokerctl uncordon %s`.", e.ID, why, e.ID))
		}
	}
	for i := range entries {
		e := &entries[i]
		c := e.CPU
		if e.Type != TypeCPU || c == nil || c.EffectiveCores <= 0 || c.EffectiveCores >= float64(c.LogicalCores) {
			continue
		}
		src := c.LimitSource
		if src == "" || src == "none" {
			src = "a cgroup limit"
		}
		out = append(out, fmt.Sprintf("%s is limited to %s of its %d cores by %s; CPU work runs no faster than that, so raise the container's CPU limit to use the rest.",
			e.ID, strconv.FormatFloat(c.EffectiveCores, 'g', 4, 64), c.LogicalCores, src))
	}
	return out
}

func runtimeAvailableFor(runtimes []RuntimeStatus, t Type) bool {
	for _, rt := range runtimes {
		if rt.Available && containsType(rt.Types, t) {
			return true
		}
	}
	return false
}

func nameSuffix(name string) string {
	if name == "" {
		return ""
	}
	return " (" + name + ")"
}

func formatFraction(f float64) string {
	return strconv.FormatFloat(f*100, 'g', 4, 64) + "%"
}

// formatBytesIEC writes n in GiB, MiB or KiB with one decimal.
func formatBytesIEC(n uint64) string {
	const unit = 1024
	switch {
	case n >= unit*unit*unit:
		return fmt.Sprintf("%.1f GiB", float64(n)/(unit*unit*unit))
	case n >= unit*unit:
		return fmt.Sprintf("%.1f MiB", float64(n)/(unit*unit))
	case n >= unit:
		return fmt.Sprintf("%.1f KiB", float64(n)/unit)
	default:
		return strconv.FormatUint(n, 10) + " B"
	}
}
