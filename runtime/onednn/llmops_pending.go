package onednn

/*
#include "llmops_pending.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/brokerd/brokerd/runtime"
)

// runPending runs the provisional decoder ops (runtime/llmops_pending.go)
// with the C loops of llmops_pending.c; ok is false for any other op. It
// goes when h/llmops is merged.
func (d *Device) runPending(s *runtime.Step, ptrs map[string]unsafe.Pointer) (ok bool, err error) {
	op := s.Op
	in := func(i int) unsafe.Pointer { return ptrs[op.In[i]] }
	f := func(p unsafe.Pointer) *C.float { return (*C.float)(p) }
	i32 := func(p unsafe.Pointer) *C.int32_t { return (*C.int32_t)(p) }
	out := ptrs[op.Out]
	x := s.In[0]
	bad := func(what string, row C.int64_t) error {
		return fmt.Errorf("%w: %s: row %d: %s out of range", runtime.ErrInvalidGraph, s, int64(row), what)
	}
	switch op.Kind {
	case runtime.OpRMSNorm:
		n := x.Last()
		C.bd_rms_norm(d.c, f(in(0)), f(in(1)), C.int64_t(x.NumElements()/n), C.int64_t(n), C.float(op.Eps), f(out))
	case runtime.OpSiLU:
		C.bd_silu(d.c, f(in(0)), C.int64_t(x.NumElements()), f(out))
	case runtime.OpSwiGLU:
		n := x.Last()
		C.bd_swiglu(d.c, f(in(0)), C.int64_t(x.NumElements()/n), C.int64_t(n/2), f(out))
	case runtime.OpRoPE:
		if r := C.bd_rope(d.c, f(in(0)), i32(in(1)), f(in(2)), C.int64_t(x.Shape[0]), C.int64_t(x.Shape[1]), C.int64_t(x.Shape[2]), f(out)); r >= 0 {
			return true, bad("position", r)
		}
	case runtime.OpKVWrite:
		c := s.Out.Shape
		if r := C.bd_kv_write(d.c, f(in(0)), i32(in(1)), C.int64_t(x.Shape[0]), C.int64_t(x.Shape[1]*x.Shape[2]), C.int64_t(c[0]*c[1]), f(out)); r >= 0 {
			return true, bad("slot", r)
		}
	case runtime.OpPagedAttention:
		k, bt := s.In[1].Shape, s.In[3].Shape
		scale := op.Scale
		if scale == 0 {
			scale = 1
		}
		if r := C.bd_paged_attention(d.c, f(in(0)), f(in(1)), f(in(2)), i32(in(3)), i32(in(4)), i32(in(5)),
			C.int64_t(x.Shape[0]), C.int64_t(x.Shape[1]), C.int64_t(x.Shape[2]),
			C.int64_t(k[0]), C.int64_t(k[1]), C.int64_t(k[2]), C.int64_t(bt[0]), C.int64_t(bt[1]), C.float(scale), f(out)); r >= 0 {
			return true, bad("sequence, position or block", r)
		}
	default:
		return false, nil
	}
	return true, nil
}
