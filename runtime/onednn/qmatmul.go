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
// the worker thread: y = x·Wᵀ (+ bias), or with ActSwiGLU silu(gate)·up
// of that product's two halves.
// wb is W's buffer when it is a weight only matmuls read (run.go's
// rc.weights), which may be relaid for the kernel (qx16.go); nil otherwise.
func (d *Device) qmatmul(s *runtime.Step, x, w unsafe.Pointer, wb *buffer, bias, y unsafe.Pointer) error {
	wt := s.In[1] // [N,K] (TransB)
	q, ok := wt.DType.GGML()
	if !ok {
		return fmt.Errorf("%w: %s: weights of %s", runtime.ErrUnsupported, s, wt.DType)
	}
	q, err := d.layoutFor(s, q, wb)
	if err != nil {
		return err
	}
	if s.Op.Act == runtime.ActSwiGLU {
		return d.qmatmulSwiGLU(s, q, x, w, y)
	}
	return d.qmatmulInto(s, q, x, w, bias, y)
}

// qmatmulSwiGLU is qmatmul with ActSwiGLU: y [M,N/2] = silu(gate)·up of
// the product's halves. qamx.c does it in its group passes, writing only
// y; other paths write the product to scratch for bd_swiglu.
func (d *Device) qmatmulSwiGLU(s *runtime.Step, q quant.Type, x, w, y unsafe.Pointer) error {
	a, wt := s.In[0], s.In[1]
	k := a.Last()
	m, n := a.NumElements()/k, wt.Shape[0]
	if d.useAMX(q, m) && k%32 == 0 && m >= qamxSwiGLURows && n%32 == 0 {
		return d.runQamx(s, q, x, w, y, n/2, d.qamxFlags|qamxSwiGLU)
	}
	p, err := d.scratch(&d.swigluWork, int64(m)*int64(n)*4)
	if err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	if err := d.qmatmulInto(s, q, x, w, nil, p); err != nil {
		return err
	}
	C.bd_swiglu(d.c, p, 0, C.int64_t(m), C.int64_t(n/2), y)
	return nil
}

// runQamx is s's product on qamx.c into y (row stride ldy) with flags,
// in the device's qamx scratch.
func (d *Device) runQamx(s *runtime.Step, q quant.Type, x, w, y unsafe.Pointer, ldy, flags int) error {
	a, wt := s.In[0], s.In[1]
	k := a.Last()
	m, n := a.NumElements()/k, wt.Shape[0]
	need := qamxWorkBytes(q, int64(k), int64(m), d.threads)
	if need < 0 {
		return fmt.Errorf("%s: %w: %d rows of %d against %v", s, errQgemmSize, m, k, q)
	}
	work, err := d.scratch(&d.qamxWork, need)
	if err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	if err := qamx(q, w, wt.DType.Bytes(int64(wt.NumElements())), int64(n), int64(k), x, int64(m), y, int64(ldy),
		d.threads, flags, work, need); err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	return nil
}

// qmatmulInto is qmatmul's product (+ bias) into y [M,N].
func (d *Device) qmatmulInto(s *runtime.Step, q quant.Type, x, w, bias, y unsafe.Pointer) error {
	a, wt := s.In[0], s.In[1]
	k := a.Last()
	m, n := a.NumElements()/k, wt.Shape[0]
	switch {
	case d.useAMX(q, m) && k%32 == 0:
		if err := d.runQamx(s, q, x, w, y, n, d.qamxFlags); err != nil {
			return err
		}
		d.addBias(y, bias, m, n)
		return nil
	case m >= d.qPrefillRows && d.qPrefillRows > 0 && !isX16(q): // relaid weights: their kernel at every row count (qx16.go)
		return d.qmatmulDequant(s, q, x, w, bias, y)
	}
	work, err := d.qgemmScratch(q, int64(k), int64(m))
	if err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	part := []qpart{{w: w, wBytes: wt.DType.Bytes(int64(wt.NumElements())), n: int64(n), bias: bias, y: y, ldy: int64(n)}}
	if err := qgemmParts(q, part, int64(k), x, int64(m), isaAuto, d.threads, work, d.qwork.bytes); err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	return nil
}

// qmatmulGroup runs steps, matmuls of one activation x by quantized
// weights of one type (a decoder's q, k and v projections), as one
// bd_qgemm_multi call when their rows take qgemm's path: x is quantized
// once and one team of threads shares all their rows. It reports false,
// having run nothing, for products that take another path (qamx, the
// dequantized slices of prefill). ws, biases (nil for none) and ys are by
// step.
func (d *Device) qmatmulGroup(steps []*runtime.Step, x unsafe.Pointer, ws []unsafe.Pointer, wbs []*buffer, biases, ys []unsafe.Pointer) (bool, error) {
	s := steps[0]
	a, wt := s.In[0], s.In[1]
	q, ok := wt.DType.GGML()
	k := a.Last()
	m := a.NumElements() / k
	if !ok {
		return false, nil
	}
	// One layout for all: weights that take x16Type alone run so in a group
	// of such; a mix runs one by one, each in its own layout.
	x16 := 0
	for i, st := range steps {
		if d.x16Eligible(st, q, wbs[i]) {
			x16++
		}
	}
	if x16 == len(steps) && d.useAMX(x16Type(q), m) || x16 == 0 && d.useAMX(q, m) {
		return false, nil
	}
	if x16 != 0 && x16 != len(steps) || x16 == 0 && m >= d.qPrefillRows && d.qPrefillRows > 0 {
		// (relaid weights run their kernel for prefill rows too, so those
		// still group)
		return false, nil
	}
	lq := q
	for i, st := range steps {
		var err error
		if lq, err = d.layoutFor(st, q, wbs[i]); err != nil {
			return false, err
		}
	}
	q = lq
	parts := make([]qpart, len(steps))
	for i, st := range steps {
		w := st.In[1]
		n := w.Shape[0]
		parts[i] = qpart{w: ws[i], wBytes: w.DType.Bytes(int64(w.NumElements())), n: int64(n), bias: biases[i], y: ys[i], ldy: int64(n)}
	}
	work, err := d.qgemmScratch(q, int64(k), int64(m))
	if err == nil {
		err = qgemmParts(q, parts, int64(k), x, int64(m), isaAuto, d.threads, work, d.qwork.bytes)
	}
	if err != nil {
		return false, fmt.Errorf("%s and %d more: %w", s, len(steps)-1, err)
	}
	return true, nil
}

// addBias adds bias (n f32, or nil) to each of y's m rows of n (in C: a
// Go loop took about 10 ms of a 512-token Qwen2.5-0.5B prefill's q, k
// and v biases).
func (d *Device) addBias(y, bias unsafe.Pointer, m, n int) {
	if bias == nil {
		return
	}
	C.bd_add_bias(d.c, (*C.float)(y), (*C.float)(bias), C.int64_t(m), C.int64_t(n))
}

// Prefill: a product of many rows is compute-bound, and oneDNN's bf16
// kernels (AMX, AVX512-BF16) run several times qgemm's int8 rate (bench/
// RESULTS.md: 650-1070 GFLOP/s against 100-200 on an AMX Xeon). So from
// defaultQPrefillRows rows on, the weights are dequantized a slice of rows
// at a time into scratch (bf16 where the CPU has it, else f32) and
// multiplied there; the scratch is bounded, never a dequantized model.
// BenchmarkQmatmulPaths put the crossing at 16-32 rows for Q8_0 and 64-128
// for Q4_K on an AMX Xeon (2 cores, shared): 64 sits between. Weights
// relaid by 16 rows are the exception: their kernel outruns the slices
// (qx16.go).
const (
	defaultQPrefillRows = 64
	defaultQSliceBytes  = 32 << 20 // one slice of dequantized weights
)

// qamxAuto as Device.qAMXRows picks qamx's crossing by weight type
// (qamxFromRows); 0 turns qamx off; a positive number is the crossing for
// every type (the tests and benchmarks).
const qamxAuto = -1

func defaultQAMXRows() int {
	if !qamxAvailable() {
		return 0
	}
	return qamxAuto
}

// qamxFromRows is where qamx overtakes qgemm. qamx costs about the same
// for 1 to 16 rows (decoding the panel dominates), qgemm grows with the
// rows: single-thread CPU time on an AMX Xeon (Q4_K 2816x1024, Q5_K, Q6_K
// 1024x2816, Q8_0 4864x896) put the crossing between 4 and 8 rows for
// Q8_0, 8 and 16 for the K types, whose qgemm kernels do more per byte.
// The float types keep their own paths (gemv16, oneDNN).
func qamxFromRows(q quant.Type) int {
	switch q {
	case quant.Q8_0, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1:
		return 6
	case quant.Q4_K, quant.Q5_K, quant.Q6_K:
		return 12
	}
	return 0
}

// qamxX16Rows is where qamx takes over relaid weights (x16Type) from
// qgemm's VNNI kernel, whose tiles were as fast as AMX-INT8 at 16 rows
// and half qamx's bf16 tiles' speed at 512 on a 16-core AMX host
// (bench/RESULTS.md); between the two, a guess to be measured.
const qamxX16Rows = 32

// useAMX says whether a product of m rows by weights of q (relaid ones
// as x16Type) runs on qamx.
func (d *Device) useAMX(q quant.Type, m int) bool {
	switch {
	case d.qAMXRows == 0:
		return false
	case d.qAMXRows > 0:
		return m >= d.qAMXRows && qamxSupports(q)
	case isX16(q):
		return m >= qamxX16Rows && qamxSupports(q)
	}
	from := qamxFromRows(q)
	return from > 0 && m >= from
}

// qmatmulDequant is qmatmul by dequantized slices of W through oneDNN.
func (d *Device) qmatmulDequant(s *runtime.Step, q quant.Type, x, w, bias, y unsafe.Pointer) error {
	a, wt := s.In[0], s.In[1]
	k := a.Last()
	m, n := a.NumElements()/k, wt.Shape[0]
	ct := runtime.F32
	if d.bf16Err == nil {
		ct = runtime.BF16
	}
	es := int64(ct.Size())
	rowBytes := wt.DType.Bytes(int64(k))
	slice := int(max(1, min(int64(n), d.qSliceBytes/(int64(k)*es))))
	if slice < n {
		slice = max(16, slice/16*16) // whole 16-row groups, for the kernels' tiles
	}
	xin := x
	if ct == runtime.BF16 {
		xb, err := d.scratch(&d.qx, int64(m*k)*2)
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
		C.bd_f32_to_bf16((*C.float)(x), (*C.uint16_t)(xb), C.int64_t(m*k))
		xin = xb
	}
	wd, err := d.scratch(&d.qdeq, int64(min(slice, n))*int64(k)*es)
	if err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	var tmp unsafe.Pointer
	if slice < n {
		if tmp, err = d.scratch(&d.qy, int64(m*slice)*4); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	for c0 := 0; c0 < n; c0 += slice {
		rows := min(slice, n-c0)
		rc := C.bd_dequant_rows(C.int(q), unsafe.Add(w, int64(c0)*rowBytes), C.int64_t(rows), C.int64_t(k), wd,
			cbool(ct == runtime.BF16), C.int(d.threads))
		if rc != C.BD_DEQUANT_OK {
			return fmt.Errorf("%s: dequantize rows %d..%d: status %d", s, c0, c0+rows, int(rc))
		}
		key := primKey{kind: runtime.OpMatMul, dt: ct, outDT: runtime.F32, m: m, k: k, n: rows, transB: true, bias: bias != nil}
		p, err := d.primitive(s, key, func(o **C.bd_prim, wh **C.char) C.dnnl_status_t {
			return C.bd_matmul_create(d.c, 0, C.int64_t(key.m), C.int64_t(key.k), C.int64_t(key.n),
				1, dnnlType(key.dt), C.dnnl_f32, cbool(key.bias), C.dnnl_alg_kind_undef, 1, 0, 0, o, wh)
		})
		if err != nil {
			return err
		}
		out := y
		if tmp != nil {
			out = tmp
		}
		if bias != nil {
			err = d.exec(s, p, xin, wd, unsafe.Add(bias, c0*4), out)
		} else {
			err = d.exec(s, p, xin, wd, out)
		}
		if err != nil {
			return err
		}
		if tmp != nil {
			// The slice's columns into y's rows.
			ys := unsafe.Slice((*float32)(y), m*n)
			ts := unsafe.Slice((*float32)(tmp), m*rows)
			for i := range m {
				copy(ys[i*n+c0:i*n+c0+rows], ts[i*rows:(i+1)*rows])
			}
		}
	}
	return nil
}

// scratch returns *slot grown to hold bytes (C memory reused by every
// product on the worker thread; freed with the device).
func (d *Device) scratch(slot *scratchBuf, bytes int64) (unsafe.Pointer, error) {
	if bytes > slot.bytes {
		if slot.ptr != nil {
			C.bd_free(slot.ptr)
			*slot = scratchBuf{}
		}
		p := C.bd_alloc(C.size_t(bytes))
		if p == nil {
			return nil, fmt.Errorf("%w: the host has no %d bytes free for dequantized weights", runtime.ErrOutOfMemory, bytes)
		}
		*slot = scratchBuf{ptr: p, bytes: bytes}
	}
	return slot.ptr, nil
}

// scratchBuf is C memory one kind of product reuses.
type scratchBuf struct {
	ptr   unsafe.Pointer
	bytes int64
}

func (b *scratchBuf) free() {
	if b.ptr != nil {
		C.bd_free(b.ptr)
		*b = scratchBuf{}
	}
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
	return d.scratch(&d.qwork, need)
}

// qgather is an OpGather from a block-quantized table (tb its bound
// buffer, or nil): each index's row dequantized to f32, read from the
// table's tiles where a matmul relaid it. It returns the position of an
// index outside the table, or -1.
func (d *Device) qgather(s *runtime.Step, table unsafe.Pointer, tb *buffer, idx, out unsafe.Pointer) (int, error) {
	tt := s.In[0]
	rows, cols := tt.Shape[0], tt.Shape[1]
	q, _ := tt.DType.GGML()
	rowBytes := tt.DType.Bytes(int64(cols))
	x16 := false // the table relaid by 16 rows (qx16.go): its rows are read from their tiles
	if tb != nil {
		d.mu.Lock()
		x16 = tb.x16
		d.mu.Unlock()
	}
	ids := unsafe.Slice((*int32)(idx), s.In[1].NumElements())
	for i, id := range ids {
		if id < 0 || int(id) >= rows {
			return i, nil
		}
		dst := unsafe.Add(out, i*cols*4)
		if x16 {
			if err := x16Row(q, table, int64(rows), int64(cols), int64(id), dst); err != nil {
				return -1, fmt.Errorf("%s: row %d: %w", s, id, err)
			}
			continue
		}
		src := unsafe.Add(table, int64(id)*rowBytes)
		if rc := C.bd_dequant_row(C.int(q), src, C.int64_t(rowBytes), (*C.float)(dst), C.int64_t(cols), C.int(isaAuto)); rc != C.BD_DEQUANT_OK {
			return -1, fmt.Errorf("%s: dequantize row %d: status %d", s, id, int(rc))
		}
	}
	return -1, nil
}
