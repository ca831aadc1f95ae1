package onednn

/*
#include "qamx.h"
#include "qgemm.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/brokerd/brokerd/runtime/quant"
)

// errNoAMX is qamx's refusal on a CPU or kernel without AMX for this process.
var errNoAMX = errors.New("onednn: qamx: this CPU or kernel gives the process no AMX tiles")

// qamxAvailable says whether qamx runs here (AMX-BF16 with AVX512-BF16, and
// the kernel granted the tile data).
func qamxAvailable() bool { return C.bd_qamx_available() == 1 }

// qamxSupports says whether qamx decodes weights of type t.
func qamxSupports(t quant.Type) bool {
	return uint64(t) <= 1<<30 && C.bd_qamx_supports(C.int(t)) == 1
}

// qamxWorkBytes is bd_qamx_work_bytes, or a negative BD_QGEMM_* code.
func qamxWorkBytes(t quant.Type, k, m int64, threads int) int64 {
	if uint64(t) > 1<<30 {
		return int64(C.BD_QGEMM_UNSUPPORTED)
	}
	return int64(C.bd_qamx_work_bytes(C.int(t), C.int64_t(k), C.int64_t(m), C.int(threads)))
}

// qamxInt8 says whether qamx runs m rows by weights of type t on AMX-INT8
// (Q8_0, up to 16 rows, a CPU with AMX-INT8) unless told qamxNoInt8.
func qamxInt8(t quant.Type, m int64) bool {
	return uint64(t) <= 1<<30 && C.bd_qamx_int8(C.int(t), C.int64_t(m)) == 1
}

// qamxNoInt8 is BD_QAMX_NO_INT8, the flag that keeps qamx on bf16 panels.
const qamxNoInt8 = int(C.BD_QAMX_NO_INT8)

// qamxSwiGLU is BD_QAMX_SWIGLU: W's rows are [gate | up] and y gets
// silu(gate)·up, half as wide; from qamxSwiGLURows rows of activations.
const (
	qamxSwiGLU     = int(C.BD_QAMX_SWIGLU)
	qamxSwiGLURows = 64
)

// qamx is qamx.c's bd_qamx on device memory or, for the tests (which cannot
// use cgo), Go memory that C uses only during the call. work may be nil.
func qamx(t quant.Type, w unsafe.Pointer, wBytes, nOut, k int64, x unsafe.Pointer, m int64, y unsafe.Pointer, ldy int64, threads, flags int, work unsafe.Pointer, workBytes int64) error {
	if uint64(t) > 1<<30 {
		return fmt.Errorf("onednn: qamx: %w: %v", quant.ErrUnsupported, t)
	}
	rc := C.bd_qamx(C.int(t), w, C.int64_t(wBytes), C.int64_t(nOut), C.int64_t(k), (*C.float)(x), C.int64_t(m),
		(*C.float)(y), C.int64_t(ldy), C.int(threads), C.int(flags), work, C.int64_t(workBytes))
	switch rc {
	case C.BD_QGEMM_OK:
		return nil
	case C.BD_QGEMM_UNSUPPORTED:
		return fmt.Errorf("onednn: qamx: %w: %v", quant.ErrUnsupported, t)
	case C.BD_QGEMM_SIZE:
		return fmt.Errorf("%w: qamx: %v, %d bytes for %d rows of %d, %d rows of activations, output stride %d, %d threads",
			errQgemmSize, t, wBytes, nOut, k, m, ldy, threads)
	case C.BD_QAMX_NO_AMX:
		return errNoAMX
	case C.BD_QGEMM_NOMEM:
		return errors.New("onednn: qamx: out of memory for its scratch")
	default:
		return fmt.Errorf("onednn: qamx: status %d", int(rc))
	}
}

// qamxSlices is qamx on Go slices, checked, for the tests and benchmarks.
func qamxSlices(t quant.Type, w []byte, nOut, k int, x []float32, m int, y []float32, ldy int, threads, flags int) error {
	if m <= 0 || k <= 0 || nOut <= 0 || ldy < nOut || len(x) < m*k || len(y) < (m-1)*ldy+nOut || len(w) == 0 {
		return fmt.Errorf("%w: qamx: %d x %d activations in %d, %d x %d outputs (stride %d) in %d",
			errQgemmSize, m, k, len(x), m, nOut, ldy, len(y))
	}
	return qamx(t, unsafe.Pointer(&w[0]), int64(len(w)), int64(nOut), int64(k), unsafe.Pointer(&x[0]), int64(m),
		unsafe.Pointer(&y[0]), int64(ldy), threads, flags, nil, 0)
}

// qamxPanel is bd_qamx_panel on Go memory, for the tests: panel p of W (n
// rows of k of type t) as qamx decodes it, bf16 [16][k], filled in steps
// increments. errNoAMX where the CPU lacks AVX512-BF16.
func qamxPanel(t quant.Type, w []byte, n, k, p, steps int) ([]uint16, error) {
	if uint64(t) > 1<<30 || len(w) == 0 || k <= 0 || k > 1<<24 {
		return nil, fmt.Errorf("%w: qamx panel of %v, %d bytes, %d rows of %d", errQgemmSize, t, len(w), n, k)
	}
	out := make([]uint16, 16*k)
	switch rc := C.bd_qamx_panel(C.int(t), unsafe.Pointer(&w[0]), C.int64_t(len(w)), C.int64_t(n), C.int64_t(k), C.int64_t(p),
		C.int(steps), (*C.uint16_t)(unsafe.Pointer(&out[0]))); rc {
	case C.BD_QGEMM_OK:
		return out, nil
	case C.BD_QAMX_NO_AMX:
		return nil, errNoAMX
	case C.BD_QGEMM_UNSUPPORTED:
		return nil, fmt.Errorf("onednn: qamx panel: %w: %v", quant.ErrUnsupported, t)
	case C.BD_QGEMM_SIZE:
		return nil, fmt.Errorf("%w: qamx panel %d of %v, %d bytes, %d rows of %d, %d steps", errQgemmSize, p, t, len(w), n, k, steps)
	default:
		return nil, fmt.Errorf("onednn: qamx panel: status %d", int(rc))
	}
}
