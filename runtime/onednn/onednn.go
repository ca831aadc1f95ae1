// Package onednn is brokerd's CPU runtime on oneDNN 2.6 (Debian libdnnl-dev),
// linked with cgo. For now it holds the probe: the library version, a CPU
// engine created and destroyed to prove the library works, and the widest
// instruction set oneDNN will use on this CPU.
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
