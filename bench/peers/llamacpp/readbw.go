package main

/*
#cgo CFLAGS: -O2
#cgo LDFLAGS: -lpthread
#include "readbw.h"
*/
import "C"

// readBandwidth is the memory read bandwidth with vector loads on threads
// threads: the best of five reads of a 1 GiB buffer (bytes per second),
// and whether AVX2 loads were used.
func readBandwidth(threads int) (float64, bool) {
	var vec C.int
	bw := C.bd_read_bandwidth(1<<30, C.int(threads), 5, &vec)
	return float64(bw), vec != 0
}
