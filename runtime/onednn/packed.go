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

// Matmul weights are rewritten in place into the layout oneDNN's kernel
// reads. Left row-major, brgemm matmul copies them into that layout on every
// execution, which a product of few rows cannot amortise: 16 rows × 384×384
// ran 2.1× faster prepacked, 1 row × 896×896 3.4× (bench/RESULTS.md). In
// place, so a model takes no more memory than its estimate; a buffer goes
// back to row-major before anything else reads it (another op, CopyOut) and
// stops being packed when it is written.

// packedLayout is the layout a packed buffer's contents are in, and the
// row-major (possibly transposed) layout they came from.
type packedLayout struct {
	plain, packed C.dnnl_memory_desc_t
}

func sameMD(a, b *C.dnnl_memory_desc_t) bool { return C.dnnl_memory_desc_equal(a, b) != 0 }

// packWeights leaves w's contents in p's packed layout. It returns false
// (read them row-major) when the packed layout does not fit w's
// allocation. Runs on the worker thread.
func (d *Device) packWeights(s *runtime.Step, p *C.bd_prim, w *buffer) (bool, error) {
	d.mu.Lock()
	cur := w.packed
	d.mu.Unlock()
	if cur != nil && sameMD(&cur.packed, &p.wpacked) && sameMD(&cur.plain, &p.wplain) {
		return true, nil
	}
	if cur != nil {
		if err := d.unpack(w); err != nil {
			return false, fmt.Errorf("%s: %w", s, err)
		}
	}
	if int64(C.dnnl_memory_desc_get_size(&p.wpacked)) > w.bytes {
		return false, nil
	}
	began := time.Now()
	var where *C.char
	if st := C.bd_relayout(d.c, &p.wplain, &p.wpacked, w.ptr, &where); st != C.dnnl_success {
		return false, fmt.Errorf("%s: %w", s, statusError(where, st))
	}
	d.relaid(layoutPacked, w.bytes, began)
	d.mu.Lock()
	w.packed = &packedLayout{plain: p.wplain, packed: p.wpacked}
	d.mu.Unlock()
	return true, nil
}

// unpack puts a packed buffer's contents back in row-major order, for
// good. Runs on the worker thread.
func (d *Device) unpack(w *buffer) error {
	d.mu.Lock()
	l, x16 := w.packed, w.x16
	if l != nil || x16 {
		w.rowMajorOnly = true
	}
	d.mu.Unlock()
	if x16 {
		return d.relayoutX16(w, false)
	}
	if l == nil {
		return nil
	}
	began := time.Now()
	var where *C.char
	if st := C.bd_relayout(d.c, &l.packed, &l.plain, w.ptr, &where); st != C.dnnl_success {
		return statusError(where, st)
	}
	d.relaid(layoutRowMajor, w.bytes, began)
	d.mu.Lock()
	w.packed = nil
	d.mu.Unlock()
	return nil
}
