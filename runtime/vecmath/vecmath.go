// Package vecmath is vector math on the host for the samplers: the
// greedy pick, the softmax weights and the log-sum-exp over a row of a
// vocabulary's logits (150k values for Qwen, every token of every
// sequence). In Go, with math.Exp, a temperature draw or a token's
// logprob cost 3-4 ms a token at that vocabulary, as much as a 0.5B
// model's whole decode step on a wide host; here (AVX-512, or AVX2) a
// few tenths of a millisecond.
// The exp is within 3 ulp of math.Exp (equal to it for 83% of a million
// random arguments, within one ulp for 99.4%), so the weights and sums
// are those of the Go loops it replaces but for such rounding and the
// order of the sums.
package vecmath

/*
#cgo CFLAGS: -O3
#cgo LDFLAGS: -lm
#include "vecmath.h"
*/
import "C"

import (
	"math"
	"unsafe"
)

// ArgmaxF32 is the first index of the largest value of x, as a scan that
// keeps the first strictly larger value finds it: a NaN never wins, and a
// NaN x[0] stays the answer. -1 for an empty x.
func ArgmaxF32(x []float32) int {
	if len(x) == 0 {
		return -1
	}
	return int(C.bd_vm_argmax_f32((*C.float)(unsafe.Pointer(&x[0])), C.int64_t(len(x))))
}

// ArgmaxF64 is ArgmaxF32 for float64 values.
func ArgmaxF64(x []float64) int {
	if len(x) == 0 {
		return -1
	}
	return int(C.bd_vm_argmax_f64((*C.double)(unsafe.Pointer(&x[0])), C.int64_t(len(x))))
}

// ExpWeights sets x[i] = exp((x[i]-m)/t) and returns idx[:0] extended
// with the i, in order, whose weight is at least minP and above 0, and
// the sum of their weights. idx needs capacity for len(x) indices (it is
// reallocated otherwise); len(x) must fit an int32 index.
func ExpWeights(x []float64, m, t, minP float64, idx []int32) ([]int32, float64) {
	if cap(idx) < len(x) {
		idx = make([]int32, len(x))
	}
	idx = idx[:len(x)]
	if len(x) == 0 {
		return idx, 0
	}
	var n C.int64_t
	sum := C.bd_vm_exp_weights((*C.double)(unsafe.Pointer(&x[0])), C.int64_t(len(x)), C.double(m), C.double(t), C.double(minP),
		(*C.int32_t)(unsafe.Pointer(&idx[0])), &n)
	return idx[:n], float64(sum)
}

// LogSumExpF32 is m + log(Σ exp(x[i]-m)), m the largest value of x: the
// log of a softmax's denominator. NaN when a value is NaN (or x is empty).
func LogSumExpF32(x []float32) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	return float64(C.bd_vm_logsumexp_f32((*C.float)(unsafe.Pointer(&x[0])), C.int64_t(len(x))))
}

// forceLevel makes the calls use their portable forms (0), the AVX2 ones
// (1) or the AVX-512 ones (2), or the CPU's choice again (-1): for the
// tests, not concurrent with other calls. A level the CPU lacks is the
// caller's to avoid.
func forceLevel(l int) { C.bd_vm_force_level(C.int(l)) }

// cpuLevel is the forms the CPU runs (see forceLevel).
func cpuLevel() int { return int(C.bd_vm_level()) }
