package onednn

/*
#include "dnnl_ops.h"
#include "dequant.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
)

// Matmuls and gathers whose weights stay block-quantized (GGUF types, issue
// 21). The weights are never dequantized whole: qgemm.c multiplies them as
// stored, and a gather dequantizes only the rows it reads.

// qmatmul is s (an OpMatMul with TransB and a block-quantized In[1]) on
// the worker thread: y = x·Wᵀ (+ bias).
func (d *Device) qmatmul(s *runtime.Step, x, w, bias, y unsafe.Pointer) error {
	a, wt := s.In[0], s.In[1]
	k := a.Last()
	m, n := a.NumElements()/k, s.Out.Last()
	q, ok := wt.DType.GGML()
	if !ok {
		return fmt.Errorf("%w: %s: weights of %s", runtime.ErrUnsupported, s, wt.DType)
	}
	work, err := d.qgemmScratch(q, int64(k), int64(m))
	if err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	err = qgemmWork(q, w, wt.DType.Bytes(int64(wt.NumElements())), int64(n), int64(k), x, int64(m), y, int64(n),
		isaAuto, d.threads, work, d.qworkBytes)
	if err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	if bias != nil {
		ys := unsafe.Slice((*float32)(y), m*n)
		bs := unsafe.Slice((*float32)(bias), n)
		for i := 0; i < m; i++ {
			row := ys[i*n : (i+1)*n]
			for j, b := range bs {
				row[j] += b
			}
		}
	}
	return nil
}

// qgemmScratch returns the device's scratch for qgemm's quantized
// activations, grown to fit m rows of k against weights of type q: one
// allocation reused by every product (a prefill's would otherwise map and
// unmap megabytes per matmul). Worker thread only.
func (d *Device) qgemmScratch(q quant.Type, k, m int64) (unsafe.Pointer, error) {
	need := qgemmWorkBytes(q, k, m)
	if need < 0 {
		return nil, fmt.Errorf("%w: %d rows of %d against %v", errQgemmSize, m, k, q)
	}
	if need > d.qworkBytes {
		if d.qwork != nil {
			C.bd_free(d.qwork)
			d.qwork, d.qworkBytes = nil, 0
		}
		p := C.bd_alloc(C.size_t(need))
		if p == nil {
			return nil, fmt.Errorf("%w: the host has no %d bytes free for quantized activations", runtime.ErrOutOfMemory, need)
		}
		d.qwork, d.qworkBytes = p, need
	}
	return d.qwork, nil
}

// qgather is an OpGather from a block-quantized table: each index's row
// dequantized to f32. It returns the position of an index outside the
// table, or -1.
func (d *Device) qgather(s *runtime.Step, table, idx, out unsafe.Pointer) (int, error) {
	tt := s.In[0]
	rows, cols := tt.Shape[0], tt.Shape[1]
	q, _ := tt.DType.GGML()
	rowBytes := tt.DType.Bytes(int64(cols))
	ids := unsafe.Slice((*int32)(idx), s.In[1].NumElements())
	for i, id := range ids {
		if id < 0 || int(id) >= rows {
			return i, nil
		}
		src := unsafe.Add(table, int64(id)*rowBytes)
		dst := (*C.float)(unsafe.Add(out, i*cols*4))
		if rc := C.bd_dequant_row(C.int(q), src, C.int64_t(rowBytes), dst, C.int64_t(cols), C.int(isaAuto)); rc != C.BD_DEQUANT_OK {
			return -1, fmt.Errorf("%s: dequantize row %d: status %d", s, id, int(rc))
		}
	}
	return -1, nil
}
