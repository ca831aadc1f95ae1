package onednn

/*
#include "dequant.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
)

// Q8_0 weights relaid by 16 rows (q8x16, qgemm.h's BD_Q8_0_X16). In GGUF's
// layout qgemm's VNNI kernel spends a dpbusd, a conversion and an FMA on
// every 64 products of one output, and a few shuffles more for the
// scales; relaid, one dpbusd adds four products to each of 16 outputs, and
// a block's conversion and FMA are shared by its 32: Qwen2.5-0.5B's
// 4864x896 product ran 3.6-5x faster on one thread at 1 to 16 rows
// (bench/RESULTS.md). The relayout is in place (the same 34 bytes a block),
// on a weight's first product, as packed.go packs f32 weights; a buffer
// read otherwise (a gather of a tied embedding, CopyOut) goes back to
// GGUF's layout first and stays there.

// x16Eligible says whether s's weights wb (nil: not a weight only
// matmuls read) take q8x16 on this device: Q8_0, rows by 16, and no AMX
// path that would read them in GGUF's layout on other steps.
func (d *Device) x16Eligible(s *runtime.Step, q quant.Type, wb *buffer) bool {
	if wb == nil || !d.x16 || d.qAMXRows != 0 || q != quant.Q8_0 {
		return false
	}
	wt := s.In[1]
	return len(wt.Shape) == 2 && wt.Shape[0]%16 == 0 && wt.Shape[1]%32 == 0
}

// layoutFor puts wb in the layout s's product reads and returns the weight
// type to multiply it as: q8x16 for an eligible Q8_0 weight, else q with
// wb in GGUF's layout. Runs on the worker thread.
func (d *Device) layoutFor(s *runtime.Step, q quant.Type, wb *buffer) (quant.Type, error) {
	want := d.x16Eligible(s, q, wb)
	if wb == nil {
		return q, nil
	}
	d.mu.Lock()
	have := wb.x16
	d.mu.Unlock()
	if have != want {
		if err := d.relayoutX16(wb, want); err != nil {
			return q, fmt.Errorf("%s: %w", s, err)
		}
	}
	if want {
		return q8x16, nil
	}
	return q, nil
}

// relayoutX16 rewrites w's Q8_0 contents into q8x16's layout (toX16) or
// back. Runs on the worker thread.
func (d *Device) relayoutX16(w *buffer, toX16 bool) error {
	if len(w.shape) != 2 {
		return fmt.Errorf("onednn: Q8_0 relayout of a %s buffer", shapeString(w.shape))
	}
	if err := q8x16Relayout(w.ptr, int64(w.shape[0]), int64(w.shape[1]), toX16, d.threads); err != nil {
		return err
	}
	d.mu.Lock()
	w.x16 = toX16
	d.mu.Unlock()
	return nil
}

// dequantRows is bd_dequant_rows into f32 for the tests (test files
// cannot use cgo): rows rows of k elements of type t at w.
func dequantRows(t quant.Type, w []byte, rows, k int, out []float32, threads int) error {
	if len(out) < rows*k || len(w) == 0 || len(out) == 0 {
		return fmt.Errorf("onednn: dequantize rows: %d rows of %d into %d", rows, k, len(out))
	}
	if rc := C.bd_dequant_rows(C.int(t), unsafe.Pointer(&w[0]), C.int64_t(rows), C.int64_t(k), unsafe.Pointer(&out[0]), 0, C.int(threads)); rc != C.BD_DEQUANT_OK {
		return fmt.Errorf("onednn: dequantize rows: status %d", int(rc))
	}
	return nil
}
