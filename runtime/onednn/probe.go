package onednn

/*
#cgo LDFLAGS: -ldnnl
#include <dnnl.h>
#include <dnnl_debug.h>
*/
import "C"

import (
	"fmt"
	"strings"

	"github.com/brokerd/brokerd/runtime"
)

// LibraryVersion returns the version of the oneDNN library linked into this
// binary (which may differ from the headers it was built against).
func LibraryVersion() Version {
	v := C.dnnl_version()
	ver := Version{
		Major:      int(v.major),
		Minor:      int(v.minor),
		Patch:      int(v.patch),
		CPURuntime: C.GoString(C.dnnl_runtime2str(v.cpu_runtime)),
	}
	// Distribution builds (Debian's among them) record "N/A" instead of a hash.
	if v.hash != nil {
		if h := C.GoString(v.hash); h != "N/A" {
			ver.Hash = h
		}
	}
	return ver
}

// MaxISA returns the widest CPU instruction set oneDNN will generate code for
// on this host: "avx2", "avx512_core", "avx512_core_bf16", "avx512_core_amx", ...
// It reflects both the CPU and any ONEDNN_MAX_CPU_ISA limit.
func MaxISA() string {
	return isaName(uint32(C.dnnl_get_effective_cpu_isa()))
}

// isaName maps a dnnl_cpu_isa_t to a stable name, independent of the strings
// the library's debug helpers print.
func isaName(isa uint32) string {
	switch isa {
	case C.dnnl_cpu_isa_all:
		return "all"
	case C.dnnl_cpu_isa_sse41:
		return "sse41"
	case C.dnnl_cpu_isa_avx:
		return "avx"
	case C.dnnl_cpu_isa_avx2:
		return "avx2"
	case C.dnnl_cpu_isa_avx2_vnni:
		return "avx2_vnni"
	case C.dnnl_cpu_isa_avx512_mic:
		return "avx512_mic"
	case C.dnnl_cpu_isa_avx512_mic_4ops:
		return "avx512_mic_4ops"
	case C.dnnl_cpu_isa_avx512_core:
		return "avx512_core"
	case C.dnnl_cpu_isa_avx512_core_vnni:
		return "avx512_core_vnni"
	case C.dnnl_cpu_isa_avx512_core_bf16:
		return "avx512_core_bf16"
	case C.dnnl_cpu_isa_avx512_core_amx:
		return "avx512_core_amx"
	}
	// A newer library than these headers: use its own name for the value.
	if s := C.dnnl_cpu_isa2str(C.dnnl_cpu_isa_t(isa)); s != nil {
		if name := strings.TrimPrefix(C.GoString(s), "cpu_isa_"); name != "" && name != "unknown cpu_isa" {
			return name
		}
	}
	return fmt.Sprintf("isa(0x%x)", isa)
}

// Probe reports whether oneDNN works on this host: it reads the library
// version and creates and destroys a CPU engine, the first thing every
// primitive needs.
func Probe() runtime.Info {
	info := runtime.Info{Name: Name, Version: LibraryVersion().String()}
	if err := checkCPUEngine(); err != nil {
		info.Reason = err.Error()
		return info
	}
	info.Available = true
	info.DeviceTypes = []string{runtime.DeviceCPU}
	return info
}

func checkCPUEngine() error {
	if n := C.dnnl_engine_get_count(C.dnnl_cpu); n == 0 {
		return fmt.Errorf("oneDNN reports no CPU engine")
	}
	var e C.dnnl_engine_t
	if st := C.dnnl_engine_create(&e, C.dnnl_cpu, 0); st != C.dnnl_success {
		return fmt.Errorf("create oneDNN CPU engine: %s", C.GoString(C.dnnl_status2str(st)))
	}
	if st := C.dnnl_engine_destroy(e); st != C.dnnl_success {
		return fmt.Errorf("destroy oneDNN CPU engine: %s", C.GoString(C.dnnl_status2str(st)))
	}
	return nil
}
