package onednn

/*
#include "dnnl_ops.h"
*/
import "C"

import (
	"unsafe"

	"github.com/brokerd/brokerd/runtime"
)

// quantKV converts x into f16, or quantizes its whole blocks of 32 into
// blocks of dt (Q8_0 or Q4_0), as OpKVWrite writes a cache's rows
// (kvquant.c): in vector code where vec is set and the CPU has AVX-512,
// else in the portable code. The tests hold both to ggml's bits.
func quantKV(dt runtime.DType, x []float32, vec bool) []byte {
	n := len(x)
	if dt != runtime.F16 {
		n = n / 32 * 32
	}
	y := make([]byte, dt.Bytes(int64(n)))
	if n == 0 {
		return y
	}
	C.bd_quant_kv(kvType(dt), (*C.float)(unsafe.Pointer(&x[0])), C.int64_t(n), (*C.uint8_t)(unsafe.Pointer(&y[0])), cbool(vec))
	return y
}

// kvqLd16Row widens n values of the dt (Q8_0 or Q4_0) row b from element
// off, both multiples of 16, with the AMX attention's loader
// (bd_kvq_ld16); false on a CPU without AVX-512.
func kvqLd16Row(dt runtime.DType, b []byte, off, n int) ([]float32, bool) {
	y := make([]float32, n)
	if n == 0 || int64(len(b)) < dt.Bytes(int64((off+n+31)/32*32)) {
		return y, false
	}
	ok := C.bd_kvq_ld16_row(unsafe.Pointer(&b[0]), kvType(dt), C.int64_t(off), (*C.float)(unsafe.Pointer(&y[0])), C.int64_t(n)) == 1
	return y, ok
}
