package onednn

/*
#include "dequant.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/brokerd/brokerd/runtime/quant"
)

// isa names dequant.c's instruction-set variants.
type isa int

const (
	isaAuto   isa = C.BD_ISA_AUTO
	isaBase   isa = C.BD_ISA_BASE
	isaAVX2   isa = C.BD_ISA_AVX2
	isaAVX512 isa = C.BD_ISA_AVX512
)

func (i isa) String() string {
	switch i {
	case isaAuto:
		return "auto"
	case isaBase:
		return "base"
	case isaAVX2:
		return "avx2"
	case isaAVX512:
		return "avx512"
	}
	return fmt.Sprintf("isa(%d)", int(i))
}

// dequantISA is the variant dequantizeRow runs on this CPU.
func dequantISA() isa { return isa(C.bd_dequant_isa()) }

// dequantizeRow is dequant.c's bd_dequant_row: len(dst) elements of type t
// from src, the same bits as quant.Dequantize, with the variant v
// (isaAuto: the widest this CPU has). The C kernels for GGUF weights build
// on these loops; the Go wrapper is here for the tests (test files cannot
// use cgo). src and dst are Go memory: C reads and writes them only during
// the call.
func dequantizeRow(t quant.Type, src []byte, dst []float32, v isa) error {
	if uint64(t) > 1<<30 {
		return fmt.Errorf("onednn: dequantize: %w: %v", quant.ErrUnsupported, t)
	}
	var sp unsafe.Pointer
	var dp *C.float
	if len(src) > 0 {
		sp = unsafe.Pointer(&src[0])
	}
	if len(dst) > 0 {
		dp = (*C.float)(unsafe.Pointer(&dst[0]))
	}
	switch rc := C.bd_dequant_row(C.int(t), sp, C.int64_t(len(src)), dp, C.int64_t(len(dst)), C.int(v)); rc {
	case C.BD_DEQUANT_OK:
		return nil
	case C.BD_DEQUANT_UNSUPPORTED:
		return fmt.Errorf("onednn: dequantize: %w: %v", quant.ErrUnsupported, t)
	case C.BD_DEQUANT_LENGTH:
		return fmt.Errorf("onednn: dequantize: %w: %d bytes for %d elements of %v", quant.ErrLength, len(src), len(dst), t)
	case C.BD_DEQUANT_NO_ISA:
		return fmt.Errorf("onednn: dequantize: this CPU has no %v (it has %v)", v, dequantISA())
	default:
		return fmt.Errorf("onednn: dequantize: status %d", int(rc))
	}
}
