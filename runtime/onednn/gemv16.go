package onednn

/*
#include "dnnl_ops.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
)

// Decode steps of a bf16 model: a product of one row by bf16 weights reads
// every weight once, so it runs at the memory's read rate or below.
// oneDNN 2.6's bf16 brgemm streamed the weights at 0.59 of that rate
// (issue 21). One row therefore runs here: with bf16 activations on a CPU
// with AVX512-BF16, gemv_bf16.c's vdpbf16ps multiplies them as they are;
// else bd_qgemm widens both to f32. On Qwen2.5-0.5B's shape one row took
// 0.8 of oneDNN's CPU time, and 4 rows 1.15 times it, as AMX adds little
// per further row (BenchmarkDecode -llm.threads=1, cpu-ms/step, beside a
// busy tenant): from 2 rows on, oneDNN. Those matmuls' weights stay
// row-major for good (never packed for oneDNN), so decode and prefill
// steps never relayout them back and forth; oneDNN multiplies them
// row-major, as it does the dequantized slices of a quantized prefill.
const defaultGemv16Rows = 2

// gemv16 reports whether s (an OpMatMul) runs here rather than on oneDNN:
// bf16 weights with TransB, no fused activation, fewer than d.gemv16Rows
// rows. The planner has the rest: the activations are bf16 as the
// weights, the output f32 or bf16, a bias and a residual f32.
func (d *Device) gemv16(s *runtime.Step) bool {
	op := s.Op
	if d.gemv16Rows <= 0 || s.In[1].DType != runtime.BF16 || !op.TransB || op.Act != runtime.ActNone {
		return false
	}
	k := s.In[0].Last()
	return k > 0 && s.In[0].NumElements()/k < d.gemv16Rows
}

// gemv16Weights reports whether a matmul's bf16 weights stay row-major:
// every TransB one while gemv16 is on, whatever its row count.
func (d *Device) gemv16Weights(s *runtime.Step) bool {
	return d.gemv16Rows > 0 && s.In[1].DType == runtime.BF16 && s.Op.TransB
}

// runGemv16 is s on gemv_bf16.c (AVX512-BF16, the activations as they are)
// or on bd_qgemm (the activations widened to f32): y = x·Wᵀ (+ bias)
// (+ residual), the output rounded to its type.
func (d *Device) runGemv16(s *runtime.Step, in func(int) unsafe.Pointer, out unsafe.Pointer) error {
	a := s.In[0]
	k := a.Last()
	m, n := a.NumElements()/k, s.Out.Last()
	x := in(0)
	dot := avx512BF16()
	if !dot {
		xf, err := d.scratch(&d.gx, int64(m*k)*4)
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
		fromBF16(unsafe.Slice((*float32)(xf), m*k), unsafe.Slice((*uint16)(x), m*k))
		x = xf
	}
	y := out // f32 output: the product, bias and residual in place
	if s.Out.DType == runtime.BF16 {
		yf, err := d.scratch(&d.gy, int64(m*n)*4)
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
		y = yf
	}
	if dot {
		C.bd_gemv_bf16((*C.uint16_t)(in(1)), C.int64_t(n), C.int64_t(k), (*C.uint16_t)(x), C.int64_t(m),
			(*C.float)(y), C.int(d.threads))
	} else if err := qgemmWork(quant.BF16, in(1), int64(n)*int64(k)*2, int64(n), int64(k), x, int64(m), y, int64(n),
		isaAuto, d.threads, nil, 0); err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	ys := unsafe.Slice((*float32)(y), m*n)
	if len(s.Op.In) >= 3 { // bias, one row of n
		b := unsafe.Slice((*float32)(in(2)), n)
		for i := range m {
			row := ys[i*n : (i+1)*n]
			for j := range row {
				row[j] += b[j]
			}
		}
	}
	if len(s.Op.In) == 4 { // residual, m rows of n
		for i, r := range unsafe.Slice((*float32)(in(3)), m*n) {
			ys[i] += r
		}
	}
	if s.Out.DType == runtime.BF16 {
		toBF16(unsafe.Slice((*uint16)(out), m*n), ys)
	}
	return nil
}

// avx512BF16 says whether the CPU has AVX512-BF16's vdpbf16ps (with
// AVX-512 F, BW, VL and DQ).
func avx512BF16() bool { return C.bd_have_avx512bf16() != 0 }
