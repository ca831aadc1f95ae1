// Package onednn is brokerd's CPU runtime on oneDNN 2.6 (Debian libdnnl-dev),
// linked with cgo. It holds the probe (library version, a CPU engine created
// and destroyed to prove the library works, the widest instruction set oneDNN
// will use here) and the runtime.Adapter that New returns.
//
// Each opened Device has one oneDNN engine and one stream, and runs all its
// oneDNN work on one goroutine locked to one OS thread. Debian builds oneDNN
// with OpenMP, whose thread count (omp_set_num_threads) and worker pool
// belong to the calling OS thread: the device sets DeviceSpec.Threads on its
// thread before creating or executing anything, so it has exactly one pool
// of that many threads, and devices with different counts do not disturb
// each other.
//
// Buffers are C memory (cgo forbids C keeping Go pointers), 64-byte aligned,
// counted against DeviceSpec.Budget and pooled by byte size. oneDNN's own
// scratchpad (library-managed, per thread) is not counted. Matmul, add,
// layer-norm, softmax and the pointwise ops are oneDNN primitives, created
// once per shape and kept in a bounded LRU cache per device; permute is a
// oneDNN reorder between strided and dense layouts (cached the same way);
// masked softmax fills masked positions with -FLT_MAX in C and then runs the
// softmax primitive in place; gather, masked mean-pool, L2-normalize,
// reshape (a copy) and convert are C loops in dnnl_ops.c. bf16 storage is for
// matmul operands and needs avx512_core or newer (Device.BF16 says why not).
//
// It needs cgo, as does the rest of brokerd (NVML, PJRT).
package onednn

import "fmt"

// Name is the adapter's name in runtime.Info.
const Name = "onednn"

// Version is the oneDNN library's version as it reports it at run time.
type Version struct {
	Major, Minor, Patch int
	Hash                string // git hash of the sources; empty when the build did not record one
	CPURuntime          string // threading runtime: "OpenMP", "TBB", "sequential", ...
}

// String returns "2.6.3", with " (git HASH)" appended when the hash is known.
func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Hash != "" {
		s += " (git " + v.Hash + ")"
	}
	return s
}
