package onednn

/*
#include "dnnl_ops.h"
*/
import "C"

import (
	"fmt"
	"time"

	"github.com/brokerd/brokerd/runtime"
)

// DirectMatMul is the baseline the adapter's matmul is measured against
// (issue 3, benchmark 1): an [m,k]×[k,n] matmul with dt inputs (F32 or BF16)
// and an f32 result, created and executed straight through oneDNN's C API
// with its own engine and stream and the given OpenMP thread count, with no
// adapter, graph or pool in between. Inputs are filled with small non-zero
// values. It runs once to warm up, then iters times, and returns the time
// those iters took in total. It lives outside the tests because test files
// cannot use cgo.
func DirectMatMul(m, n, k, iters, threads int, dt runtime.DType) (time.Duration, error) {
	if m <= 0 || n <= 0 || k <= 0 || iters <= 0 || threads <= 0 {
		return 0, fmt.Errorf("onednn: direct matmul: m=%d n=%d k=%d iters=%d threads=%d must all be positive", m, n, k, iters, threads)
	}
	if dt != runtime.F32 && dt != runtime.BF16 {
		return 0, fmt.Errorf("onednn: direct matmul: inputs of type %s: %w", dt, runtime.ErrUnsupported)
	}
	var secs C.double
	var step *C.char
	st := C.bd_direct_matmul(C.int64_t(m), C.int64_t(n), C.int64_t(k), C.int(iters), C.int(threads),
		dnnlType(dt), &secs, &step)
	if st != C.dnnl_success {
		return 0, fmt.Errorf("onednn: direct matmul [%d,%d]x[%d,%d] %s: %w", m, k, k, n, dt, statusError(step, st))
	}
	return time.Duration(float64(secs) * float64(time.Second)), nil
}
