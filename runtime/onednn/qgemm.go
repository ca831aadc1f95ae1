package onednn

/*
#include "qgemm.h"
*/
import "C"

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"unsafe"

	"github.com/brokerd/brokerd/runtime/quant"
)

// qgemmISA is the variant qgemm's isaAuto runs on this CPU (isaAVX512 only
// with AVX512-VNNI).
func qgemmISA() isa { return isa(C.bd_qgemm_isa()) }

// errQgemmSize is qgemm's refusal of sizes that do not fit together.
var errQgemmSize = errors.New("onednn: qgemm: sizes do not fit")

// qgemm is qgemm.c's bd_qgemm: y[i*ldy+j] = Σ_l x[i*k+l] · W[j][l] for i < m,
// j < nOut, W being w's nOut rows of k elements of type t in GGUF block
// layout. threads OpenMP threads share the work; v picks the variant. The
// device calls qgemmWork on its own buffers (qmatmul.go); this wrapper is
// for the tests and benchmarks (test files cannot use cgo): it checks the
// Go slices' lengths, and C checks the sizes against each other. x, w and y are Go memory: C reads and writes them only during the
// call.
func qgemm(t quant.Type, w []byte, nOut, k int, x []float32, m int, y []float32, ldy int, v isa, threads int) error {
	if m < 0 || k < 0 || nOut < 0 || ldy < 0 ||
		(m > 0 && k > 0 && len(x)/m < k) ||
		(m > 0 && nOut > 0 && (len(y) < nOut || (len(y)-nOut)/max(ldy, 1) < m-1)) {
		return fmt.Errorf("%w: %d x %d activations in %d, %d x %d outputs (stride %d) in %d",
			errQgemmSize, m, k, len(x), m, nOut, ldy, len(y))
	}
	var wp, xp, yp unsafe.Pointer
	if len(w) > 0 {
		wp = unsafe.Pointer(&w[0])
	}
	if len(x) > 0 {
		xp = unsafe.Pointer(&x[0])
	}
	if len(y) > 0 {
		yp = unsafe.Pointer(&y[0])
	}
	return qgemmC(t, wp, int64(len(w)), int64(nOut), int64(k), xp, int64(m), yp, int64(ldy), v, threads)
}

// qgemmC passes its arguments to bd_qgemm as they are, so the tests can
// hand C sizes that no slice backs and see that it refuses them before
// touching anything.
func qgemmC(t quant.Type, w unsafe.Pointer, wBytes, nOut, k int64, x unsafe.Pointer, m int64, y unsafe.Pointer, ldy int64, v isa, threads int) error {
	return qgemmWork(t, w, wBytes, nOut, k, x, m, y, ldy, v, threads, nil, 0)
}

// qgemmWork is qgemmC with scratch for the quantized activations (nil: the
// call allocates its own).
func qgemmWork(t quant.Type, w unsafe.Pointer, wBytes, nOut, k int64, x unsafe.Pointer, m int64, y unsafe.Pointer, ldy int64, v isa, threads int, work unsafe.Pointer, workBytes int64) error {
	return qgemmParts(t, []qpart{{w: w, wBytes: wBytes, n: nOut, y: y, ldy: ldy}}, k, x, m, v, threads, work, workBytes)
}

// qpart is one product of qgemmParts: n rows of W (wBytes) into y (row
// stride ldy), plus bias (n f32) unless it is nil.
type qpart struct {
	w         unsafe.Pointer
	wBytes, n int64
	bias, y   unsafe.Pointer
	ldy       int64
}

// qgemmParts is bd_qgemm_multi: the products of several matrices of type t
// by one x [m,k], x quantized once and their rows shared among threads.
func qgemmParts(t quant.Type, parts []qpart, k int64, x unsafe.Pointer, m int64, v isa, threads int, work unsafe.Pointer, workBytes int64) error {
	if uint64(t) > 1<<30 {
		return fmt.Errorf("onednn: qgemm: %w: %v", quant.ErrUnsupported, t)
	}
	if len(parts) == 0 || len(parts) > C.BD_QGEMM_PARTS {
		return fmt.Errorf("%w: %d products in one call", errQgemmSize, len(parts))
	}
	// The parts array is Go memory holding the pointers: the tests' are
	// Go slices, which cgo allows inside it only pinned (a device's
	// buffers are C memory, which Pin leaves alone).
	var pin goruntime.Pinner
	defer pin.Unpin()
	var cp [C.BD_QGEMM_PARTS]C.bd_qgemm_part
	for i, p := range parts {
		for _, ptr := range []unsafe.Pointer{p.w, p.bias, p.y} {
			if ptr != nil {
				pin.Pin(ptr)
			}
		}
		cp[i] = C.bd_qgemm_part{w: p.w, w_bytes: C.int64_t(p.wBytes), n_out: C.int64_t(p.n),
			bias: (*C.float)(p.bias), y: (*C.float)(p.y), ldy: C.int64_t(p.ldy)}
	}
	rc := C.bd_qgemm_multi(C.int(t), &cp[0], C.int(len(parts)), C.int64_t(k), (*C.float)(x), C.int64_t(m),
		C.int(v), C.int(threads), work, C.int64_t(workBytes))
	switch rc {
	case C.BD_QGEMM_OK:
		return nil
	case C.BD_QGEMM_UNSUPPORTED:
		return fmt.Errorf("onednn: qgemm: %w: %v", quant.ErrUnsupported, t)
	case C.BD_QGEMM_SIZE:
		p := parts[0]
		return fmt.Errorf("%w: %v, %d bytes for %d rows of %d (%d products), %d rows of activations, output stride %d, %d threads",
			errQgemmSize, t, p.wBytes, p.n, k, len(parts), m, p.ldy, threads)
	case C.BD_QGEMM_NO_ISA:
		return fmt.Errorf("onednn: qgemm: this CPU has no %v (it has %v)", v, qgemmISA())
	case C.BD_QGEMM_NOMEM:
		return errors.New("onednn: qgemm: out of memory for the quantized activations")
	default:
		return fmt.Errorf("onednn: qgemm: status %d", int(rc))
	}
}

// x16Type is BD_X16(t) as qgemm's weight type: ggml type t (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, Q4_K) relaid in place by 16 rows for the AVX-512 VNNI
// kernel (qgemm.h). Not a GGUF type: only this package's buffers hold it,
// and only while buffer.x16 says so.
func x16Type(t quant.Type) quant.Type { return t + quant.Type(C.BD_X16_BASE) }

// x16Types are the types x16Type relays.
var x16Types = []quant.Type{quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q8_0, quant.Q4_K, quant.Q5_K, quant.Q6_K}

// x16Relayout is bd_x16_relayout: n rows of k weights of type t at w into
// x16Type(t)'s layout (toX16) or back, in place.
func x16Relayout(t quant.Type, w unsafe.Pointer, n, k int64, toX16 bool, threads int) error {
	to := C.int(0)
	if toX16 {
		to = 1
	}
	switch rc := C.bd_x16_relayout(C.int(t), w, C.int64_t(n), C.int64_t(k), to, C.int(threads)); rc {
	case C.BD_QGEMM_OK:
		return nil
	case C.BD_QGEMM_UNSUPPORTED:
		return fmt.Errorf("onednn: relayout by 16 rows: %w: %v", quant.ErrUnsupported, t)
	case C.BD_QGEMM_SIZE:
		return fmt.Errorf("%w: %d rows of %d as %v by 16 rows", errQgemmSize, n, k, t)
	case C.BD_QGEMM_NOMEM:
		return errors.New("onednn: relayout by 16 rows: out of memory for a tile's copy")
	default:
		return fmt.Errorf("onednn: relayout by 16 rows: status %d", int(rc))
	}
}

// x16Row is bd_x16_row: row id of an x16Type(t) matrix of n rows of k at
// w, dequantized into out (k f32).
func x16Row(t quant.Type, w unsafe.Pointer, n, k, id int64, out unsafe.Pointer) error {
	switch rc := C.bd_x16_row(C.int(t), w, C.int64_t(n), C.int64_t(k), C.int64_t(id), (*C.float)(out)); rc {
	case C.BD_QGEMM_OK:
		return nil
	case C.BD_QGEMM_UNSUPPORTED:
		return fmt.Errorf("onednn: a row of %v relaid by 16 rows: %w", t, quant.ErrUnsupported)
	default:
		return fmt.Errorf("%w: row %d of %d rows of %d as %v by 16 rows", errQgemmSize, id, n, k, t)
	}
}

// qgemmWorkBytes is bd_qgemm_work_bytes: the scratch bd_qgemm takes for m
// rows of k activations against weights of type t, or a negative
// BD_QGEMM_* code for sizes it refuses.
func qgemmWorkBytes(t quant.Type, k, m int64) int64 {
	if uint64(t) > 1<<30 {
		return int64(C.BD_QGEMM_UNSUPPORTED)
	}
	return int64(C.bd_qgemm_work_bytes(C.int(t), C.int64_t(k), C.int64_t(m)))
}

// readSum is bd_qgemm_read_sum over b (its length rounded down to 128
// bytes) with threads threads: BenchmarkQgemmDecode times it as the host's
// read bandwidth.
func readSum(b []byte, threads int) uint64 {
	n := len(b) &^ 127
	if n == 0 {
		return 0
	}
	return uint64(C.bd_qgemm_read_sum(unsafe.Pointer(&b[0]), C.int64_t(n), C.int(threads)))
}
