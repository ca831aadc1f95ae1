package onednn

/*
#include "dnnl_ops.h"
*/
import "C"

import "unsafe"

// quantQ8_0 quantizes x (whole blocks of 32) as OpKVWrite writes a Q8_0
// cache's rows (kvq8.c): in vector code where vec is set and the CPU has
// AVX-512, else in the portable code. The tests hold both to ggml's bits.
func quantQ8_0(x []float32, vec bool) []byte {
	y := make([]byte, len(x)/32*34)
	if len(x) < 32 {
		return y
	}
	C.bd_quant_q8_0((*C.float)(unsafe.Pointer(&x[0])), C.int64_t(len(x)/32*32), (*C.uint8_t)(unsafe.Pointer(&y[0])), cbool(vec))
	return y
}
