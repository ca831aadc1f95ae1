package onednn

/*
#cgo CFLAGS: -O3 -fopenmp
#cgo LDFLAGS: -ldnnl -fopenmp -lm
#include "dnnl_ops.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
)

// ErrClosed is returned by a Device's methods after Close.
var ErrClosed = errors.New("onednn: device closed")

// alignment of every buffer and multiple of its size: a cache line and an
// AVX-512 vector (bd_alloc page-aligns large ones).
const alignment = 64

// Device is one opened oneDNN CPU device. It implements runtime.Device.
//
// All oneDNN work of the device (primitive creation and execution, and the
// C kernels) runs on one goroutine locked to one OS thread. OpenMP keeps its
// thread count and its pool of worker threads per calling OS thread, so this
// gives the device exactly one pool of spec.Threads threads, warm between
// runs, whatever goroutine calls Run; it also serialises runs (one stream).
// Memory calls (Alloc, Free, copies) run on the caller's goroutine.
type Device struct {
	id      string
	threads int
	compute runtime.DType // DeviceSpec.DType; F32 when unset
	bf16Err error         // why bf16 matmuls cannot run here; nil when they can

	c *C.bd_device // used only on the worker thread
	// unpackable: matmuls whose packed weights layout is larger than the
	// weights (padded); they read row-major weights. Worker thread only.
	unpackable map[primKey]bool
	// qwork is qgemm's scratch for quantized activations (qmatmul.go).
	// Worker thread only, as the scratch below.
	qwork scratchBuf
	// Prefill products of quantized weights (qmatmul.go): from
	// qPrefillRows rows on, W is dequantized by slices into qdeq (and x
	// converted into qx) for oneDNN; qy holds a slice's output.
	qPrefillRows int
	qSliceBytes  int64 // the most bytes of W one slice dequantizes
	qdeq, qx, qy scratchBuf
	// Where the CPU has AMX, products of quantized weights from a few rows
	// on (qamxFromRows, or qAMXRows when positive; 0 turns it off) run
	// qamx.c instead of either path above: 16-row panels dequantized into
	// tiles. qamxWork is its scratch.
	qAMXRows int
	// qamxFlags are bd_qamx's flags: BD_QAMX_NO_INT8 keeps Q8_0's
	// products of up to 16 rows on bf16 panels (Options.NoAMXInt8).
	qamxFlags int
	qamxWork  scratchBuf
	// x16: matmul weights of x16Types are relaid by 16 rows for qgemm's
	// VNNI kernels on first use (qx16.go): on by default where qgemm runs
	// AVX-512 VNNI, off with Options.NoX16. Used only while qAMXRows is 0
	// unless amxX16 (Options.AMXRelaid) says qamx reads them relaid too,
	// so no weight changes layout between decode and AMX steps.
	x16, amxX16 bool
	// swigluWork holds a SwiGLU matmul's product where qamx.c cannot
	// apply SwiGLU itself (qmatmulSwiGLU).
	swigluWork scratchBuf
	// Products of a few rows by bf16 weights run on bd_qgemm below
	// gemv16Rows rows (gemv16.go); gx and gy hold their f32 activations
	// and output.
	gemv16Rows int
	gx, gy     scratchBuf
	prims      *lru[primKey, *C.bd_prim]
	// Checked plans by graph address (runtime.Device.Run: a graph does not
	// change once run); the key keeps the graph alive, so an address is
	// never reused while cached.
	plans *lru[*runtime.Graph, *planned]
	// Primitive cache metrics, this device's series.
	hit, miss prometheus.Counter
	create    prometheus.Observer
	// Weight relayout metrics: bytes by layout, and time.
	relayBytes   map[string]prometheus.Counter
	relaySeconds prometheus.Counter

	work      chan func()
	quit      chan struct{}
	done      chan struct{} // closed when the worker has released the device
	closeOnce sync.Once

	// life is held shared while a call touches buffer memory and exclusively
	// by Close while it frees that memory.
	life sync.RWMutex

	mu     sync.Mutex // guards the fields below
	closed bool
	budget uint64
	used   uint64                     // live and pooled bytes
	pooled uint64                     // bytes in idle
	idle   map[int64][]unsafe.Pointer // pooled allocations by byte size
	live   map[*buffer]struct{}
}

var _ runtime.Device = (*Device)(nil)

// primKey identifies a created primitive: the op, its operand sizes and
// types, and its attributes.
type primKey struct {
	kind           runtime.OpKind
	dt             runtime.DType // operand type
	outDT          runtime.DType // matmul: the product's type
	batch, m, k, n int
	transB, bias   bool
	res            bool // matmul: a residual added after the activation
	pack           bool // matmul: weights read in the kernel's packed layout
	bcast          bool // add: In[1] is one row, broadcast
	act            runtime.Activation
	scale, eps     float32
	heads          int    // attention: heads (with batch = B·heads, the strides)
	layout         string // permute: the input view and the permutation
}

func openDevice(spec runtime.DeviceSpec, cacheSize int, m *primMetrics) (*Device, error) {
	if m == nil {
		m, _ = newPrimMetrics(nil) // unregistered: never fails
	}
	d := &Device{
		hit:    m.lookups.WithLabelValues(spec.ID, "hit"),
		miss:   m.lookups.WithLabelValues(spec.ID, "miss"),
		create: m.create.WithLabelValues(spec.ID),
		relayBytes: map[string]prometheus.Counter{
			layoutPacked:   m.relaid.WithLabelValues(spec.ID, layoutPacked),
			layoutRelaid16: m.relaid.WithLabelValues(spec.ID, layoutRelaid16),
			layoutRowMajor: m.relaid.WithLabelValues(spec.ID, layoutRowMajor),
		},
		relaySeconds: m.relaySeconds.WithLabelValues(spec.ID),
		id:           spec.ID,
		threads:      spec.Threads,
		compute:      spec.DType,
		budget:       spec.Budget,
		work:         make(chan func()),
		quit:         make(chan struct{}),
		done:         make(chan struct{}),
		idle:         map[int64][]unsafe.Pointer{},
		live:         map[*buffer]struct{}{},

		unpackable: map[primKey]bool{}, qPrefillRows: defaultQPrefillRows, qSliceBytes: defaultQSliceBytes, gemv16Rows: defaultGemv16Rows,
		x16:      qgemmISA() == isaAVX512,
		qAMXRows: defaultQAMXRows(),
	}
	// Eviction runs on the worker (the cache is only used there), so an
	// evicted primitive is never one being executed.
	d.prims = newLRU[primKey](cacheSize, func(p *C.bd_prim) { C.bd_prim_destroy(p) })
	d.plans = newLRU[*runtime.Graph](maxPlans, func(*planned) {})
	ready := make(chan error, 1)
	go d.loop(ready)
	if err := <-ready; err != nil {
		return nil, fmt.Errorf("onednn: open %s: %w", spec.ID, err)
	}
	if d.compute == 0 {
		d.compute = runtime.F32
	}
	return d, nil
}

// loop is the device's worker: it owns the OS thread, the engine and the
// stream, and runs submitted work until Close.
func (d *Device) loop(ready chan<- error) {
	// Never unlocked: when the loop returns the thread exits with it, and
	// OpenMP's pool for it goes too.
	goruntime.LockOSThread()
	var step *C.char
	var c *C.bd_device
	if st := C.bd_device_open(C.int(d.threads), &c, &step); st != C.dnnl_success {
		ready <- statusError(step, st)
		close(d.done)
		return
	}
	d.c = c
	d.bf16Err = bf16Check(c)
	ready <- nil
	for {
		// Quit first, so queued work cannot keep a closing device alive.
		select {
		case <-d.quit:
			d.release()
			return
		default:
		}
		select {
		case f := <-d.work:
			f()
		case <-d.quit:
			d.release()
			return
		}
	}
}

// bf16Check tries to create a small bf16 matmul on c. oneDNN 2.6 runs bf16
// on avx512_core and newer (natively from avx512_core_bf16 and AMX); on
// narrower ISAs it has no kernel.
func bf16Check(c *C.bd_device) error {
	var step *C.char
	if st := C.bd_bf16_matmul_works(c, &step); st != C.dnnl_success {
		return fmt.Errorf("bf16 matmul needs avx512_core or newer, oneDNN uses %s on this CPU: %w", MaxISA(), statusError(step, st))
	}
	return nil
}

// BF16Support reports whether bf16 matmuls run on this host without opening
// a device: nil when they do, otherwise why not, wrapping
// runtime.ErrUnsupported. For capability reports (detect/).
func BF16Support() error {
	var step *C.char
	var c *C.bd_device
	if st := C.bd_device_open(1, &c, &step); st != C.dnnl_success {
		return fmt.Errorf("onednn: bf16 check: %w", statusError(step, st))
	}
	defer C.bd_device_close(c)
	return bf16Check(c)
}

func (d *Device) release() {
	d.prims.clear()
	d.qwork.free()
	d.qdeq.free()
	d.qx.free()
	d.qy.free()
	d.qamxWork.free()
	d.swigluWork.free()
	d.gx.free()
	d.gy.free()
	C.bd_device_close(d.c)
	d.c = nil
	close(d.done)
}

// do runs f on the worker and returns its error. A cancelled ctx or a closed
// device stops the wait for the worker; once f has started it runs to the end.
func (d *Device) do(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	errc := make(chan error, 1)
	select {
	case d.work <- func() { errc <- f() }:
		return <-errc
	case <-ctx.Done():
		return ctx.Err()
	case <-d.quit:
		return ErrClosed
	}
}

// statusError turns a failed oneDNN call into an error naming the step,
// wrapping runtime.ErrUnsupported or runtime.ErrOutOfMemory where they apply.
func statusError(step *C.char, st C.dnnl_status_t) error {
	what := "oneDNN call"
	if step != nil {
		what = C.GoString(step)
	}
	msg := C.GoString(C.dnnl_status2str(st))
	switch st {
	case C.dnnl_unimplemented:
		return fmt.Errorf("%s: %s: %w", what, msg, runtime.ErrUnsupported)
	case C.dnnl_out_of_memory:
		return fmt.Errorf("%s: %s: %w", what, msg, runtime.ErrOutOfMemory)
	}
	return fmt.Errorf("%s: %s", what, msg)
}

// ID returns the brokerd device ID ("cpu:0").
func (d *Device) ID() string { return d.id }

// Threads returns the OpenMP thread count the device runs with.
func (d *Device) Threads() int { return d.threads }

// ComputeType is the type the device was opened to compute in
// (DeviceSpec.DType): models feed their matmuls bf16 operands when it is
// BF16.
func (d *Device) ComputeType() runtime.DType { return d.compute }

// BF16 returns nil when bf16 matmuls run on this device, or why not (wrapping
// runtime.ErrUnsupported: oneDNN 2.6 needs avx512_core or newer).
func (d *Device) BF16() error { return d.bf16Err }

// buffer is device memory: C memory (the cgo rules forbid handing Go memory
// to C to keep), 64-byte aligned.
type buffer struct {
	dev   *Device
	ptr   unsafe.Pointer
	dt    runtime.DType
	shape []int
	n     int   // elements
	bytes int64 // allocation size, a multiple of alignment
	freed bool  // guarded by dev.mu
	// packed, when set, says the contents are a matmul's weights in its
	// kernel's layout, not row-major (see packedWeights). Guarded by dev.mu.
	packed *packedLayout
	// rowMajorOnly: the buffer was read otherwise than as a matmul's weights
	// after a matmul packed it, so it stays row-major from then on rather
	// than being rewritten back and forth (an LLM's embedding table is both a
	// gather table and, tied, the lm_head's weights). Guarded by dev.mu.
	rowMajorOnly bool
	// x16, when set, says the contents are block-quantized weights relaid
	// by 16 rows for the VNNI kernels (x16Type, qx16.go). Guarded by dev.mu.
	x16 bool
}

func (b *buffer) DType() runtime.DType { return b.dt }
func (b *buffer) Shape() []int         { return clone(b.shape) }
func (b *buffer) Bytes() int64         { return b.bytes }

// Alloc returns a buffer of dt and shape, reusing a pooled allocation of the
// same byte size when there is one. When a new allocation would exceed the
// budget, pooled allocations of other sizes are released first; if it still
// does not fit, the error wraps runtime.ErrOutOfMemory.
func (d *Device) Alloc(dt runtime.DType, shape ...int) (runtime.Buffer, error) {
	return d.alloc(dt, shape)
}

func (d *Device) alloc(dt runtime.DType, shape []int) (*buffer, error) {
	n, size, err := d.allocSize(dt, shape)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	ptr, err := d.takeLocked(size)
	if err != nil {
		return nil, fmt.Errorf("onednn: alloc %s %s on %s: %w", dt, shapeString(shape), d.id, err)
	}
	b := &buffer{dev: d, ptr: ptr, dt: dt, shape: clone(shape), n: n, bytes: size}
	d.live[b] = struct{}{}
	return b, nil
}

// allocSize is the element count and the allocation in bytes of a buffer
// of dt and shape, or why the device cannot hold one.
func (d *Device) allocSize(dt runtime.DType, shape []int) (int, int64, error) {
	n, err := runtime.Elements(shape)
	if err != nil {
		return 0, 0, fmt.Errorf("onednn: alloc %s %s: %w", dt, shapeString(shape), err)
	}
	switch dt {
	case runtime.F32, runtime.I32, runtime.F16:
	case runtime.BF16:
		if d.bf16Err != nil {
			return 0, 0, fmt.Errorf("onednn: alloc %s %s: %w", dt, shapeString(shape), d.bf16Err)
		}
	default:
		if !d.Holds(dt) {
			return 0, 0, fmt.Errorf("onednn: alloc %s %s: %w", dt, shapeString(shape), runtime.ErrUnsupported)
		}
	}
	raw := dt.Bytes(int64(n))
	if raw < 0 {
		return 0, 0, fmt.Errorf("onednn: alloc %s %s: %w: not whole blocks of %d", dt, shapeString(shape), runtime.ErrInvalidGraph, dt.BlockElems())
	}
	return n, (raw + alignment - 1) / alignment * alignment, nil
}

// takeLocked returns a pooled allocation of size bytes (a multiple of
// alignment), or a new one within the budget.
func (d *Device) takeLocked(size int64) (unsafe.Pointer, error) {
	if free := d.idle[size]; len(free) > 0 {
		ptr := free[len(free)-1]
		d.idle[size] = free[:len(free)-1]
		d.pooled -= uint64(size)
		return ptr, nil
	}
	if d.budget > 0 && d.used+uint64(size) > d.budget {
		// Release pooled memory only when that makes room.
		if d.used-d.pooled+uint64(size) > d.budget {
			return nil, fmt.Errorf("%w: need %d bytes, %d of %d in use", runtime.ErrOutOfMemory, size, d.used, d.budget)
		}
		d.trimLocked(uint64(size))
	}
	ptr := C.bd_alloc(C.size_t(size))
	if ptr == nil {
		return nil, fmt.Errorf("%w: the host has no %d bytes free", runtime.ErrOutOfMemory, size)
	}
	d.used += uint64(size)
	return ptr, nil
}

// allocTemp and freeTemp are alloc and Free for a run's intermediates,
// which need only memory: no Buffer, no entry among the live buffers (a
// decode step allocates a few hundred). Close cannot run meanwhile:
// execute holds d.life.
func (d *Device) allocTemp(dt runtime.DType, shape []int) (unsafe.Pointer, int64, error) {
	_, size, err := d.allocSize(dt, shape)
	if err != nil {
		return nil, 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, 0, ErrClosed
	}
	ptr, err := d.takeLocked(size)
	if err != nil {
		return nil, 0, fmt.Errorf("onednn: alloc %s %s on %s: %w", dt, shapeString(shape), d.id, err)
	}
	return ptr, size, nil
}

func (d *Device) freeTemp(ptr unsafe.Pointer, size int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.idle[size] = append(d.idle[size], ptr)
	d.pooled += uint64(size)
}

// trimLocked releases pooled allocations until need more bytes fit the
// budget or the pool is empty.
func (d *Device) trimLocked(need uint64) {
	for size, ptrs := range d.idle {
		for len(ptrs) > 0 && d.used+need > d.budget {
			C.bd_free(ptrs[len(ptrs)-1])
			ptrs = ptrs[:len(ptrs)-1]
			d.used -= uint64(size)
			d.pooled -= uint64(size)
		}
		if len(ptrs) == 0 {
			delete(d.idle, size)
		} else {
			d.idle[size] = ptrs
		}
		if d.used+need <= d.budget {
			return
		}
	}
}

func shapeString(shape []int) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func clone(s []int) []int { return append([]int(nil), s...) }

// Free returns b to the pool; its bytes still count as used. Freeing a buffer
// twice, or after Close, does nothing.
func (d *Device) Free(b runtime.Buffer) {
	bb, ok := b.(*buffer)
	if !ok || bb == nil || bb.dev != d {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.freeLocked(bb)
}

func (d *Device) freeLocked(b *buffer) {
	if b.freed || d.closed {
		return
	}
	b.freed = true
	delete(d.live, b)
	d.idle[b.bytes] = append(d.idle[b.bytes], b.ptr)
	d.pooled += uint64(b.bytes)
}

// own checks that b is a live buffer of this device.
func (d *Device) own(b runtime.Buffer) (*buffer, error) {
	bb, ok := b.(*buffer)
	if !ok || bb == nil {
		return nil, fmt.Errorf("%w: buffer %T is not a oneDNN buffer", runtime.ErrInvalidGraph, b)
	}
	if bb.dev != d {
		return nil, fmt.Errorf("%w: buffer belongs to device %s, not %s", runtime.ErrInvalidGraph, bb.dev.id, d.id)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if bb.freed {
		return nil, fmt.Errorf("%w: buffer %s %s was freed", runtime.ErrInvalidGraph, bb.dt, shapeString(bb.shape))
	}
	return bb, nil
}

// copyTarget checks ctx and that buf is a live buffer of d, and holds d open
// (release lets it go) while the caller copies.
func (d *Device) copyTarget(ctx context.Context, buf runtime.Buffer, what string) (*buffer, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	d.life.RLock()
	b, err := d.own(buf)
	if err != nil {
		d.life.RUnlock()
		return nil, nil, fmt.Errorf("onednn: %s: %w", what, err)
	}
	return b, d.life.RUnlock, nil
}

// CopyIn writes src into dst, converting to bf16 for BF16 buffers.
func (d *Device) CopyIn(ctx context.Context, dst runtime.Buffer, src []float32) error {
	b, release, err := d.copyTarget(ctx, dst, "copy in")
	if err != nil {
		return err
	}
	defer release()
	d.mu.Lock()
	b.packed = nil // overwritten whole, in row-major order
	d.mu.Unlock()
	if len(src) != b.n {
		return fmt.Errorf("onednn: copy in: %w: %d values for a %s buffer of %d", runtime.ErrInvalidGraph, len(src), shapeString(b.shape), b.n)
	}
	switch b.dt {
	case runtime.F32:
		copy(unsafe.Slice((*float32)(b.ptr), b.n), src)
	case runtime.BF16:
		toBF16(unsafe.Slice((*uint16)(b.ptr), b.n), src)
	case runtime.F16:
		if b.n > 0 {
			C.bd_quant_kv(C.BD_KV_F16, (*C.float)(unsafe.Pointer(&src[0])), C.int64_t(b.n), (*C.uint8_t)(b.ptr), 1)
		}
	default:
		return fmt.Errorf("onednn: copy in: %w: float values for a %s buffer (use CopyInInt32)", runtime.ErrInvalidGraph, b.dt)
	}
	return nil
}

// Holds says whether the device keeps type dt as stored: every block type,
// which qgemm.c multiplies and dequant.c gathers, and f16 (a KV cache's
// type only).
func (d *Device) Holds(dt runtime.DType) bool { return dt.Quantized() || dt == runtime.F16 }

var _ runtime.RawDevice = (*Device)(nil)

// CopyInRaw writes stored bytes of a block-quantized buffer at byte offset
// off.
func (d *Device) CopyInRaw(ctx context.Context, dst runtime.Buffer, off int64, src []byte) error {
	b, release, err := d.copyTarget(ctx, dst, "copy in")
	if err != nil {
		return err
	}
	defer release()
	if !b.dt.Quantized() {
		return fmt.Errorf("onednn: copy in: %w: stored bytes for a %s buffer (use CopyIn)", runtime.ErrInvalidGraph, b.dt)
	}
	// The bytes are GGUF's layout: a relaid weight goes back first (and may
	// be relaid again by its next product).
	d.mu.Lock()
	x16 := b.x16
	d.mu.Unlock()
	if x16 {
		if err := d.do(ctx, func() error { return d.relayoutX16(b, false) }); err != nil {
			return fmt.Errorf("onednn: copy in: %w", err)
		}
	}
	size := b.dt.Bytes(int64(b.n))
	if off < 0 || off > size || int64(len(src)) > size-off {
		return fmt.Errorf("onednn: copy in: %w: %d bytes at %d for a %s %s buffer of %d", runtime.ErrInvalidGraph, len(src), off, shapeString(b.shape), b.dt, size)
	}
	copy(unsafe.Slice((*byte)(b.ptr), size)[off:], src)
	return nil
}

// CopyInInt32 writes indices into an I32 buffer.
func (d *Device) CopyInInt32(ctx context.Context, dst runtime.Buffer, src []int32) error {
	b, release, err := d.copyTarget(ctx, dst, "copy in")
	if err != nil {
		return err
	}
	defer release()
	d.mu.Lock()
	b.packed = nil // overwritten whole, in row-major order
	d.mu.Unlock()
	if b.dt != runtime.I32 {
		return fmt.Errorf("onednn: copy in: %w: int32 values for a %s buffer", runtime.ErrInvalidGraph, b.dt)
	}
	if len(src) != b.n {
		return fmt.Errorf("onednn: copy in: %w: %d values for a %s buffer of %d", runtime.ErrInvalidGraph, len(src), shapeString(b.shape), b.n)
	}
	copy(unsafe.Slice((*int32)(b.ptr), b.n), src)
	return nil
}

// CopyOut reads src into dst as float32, whatever src's type.
func (d *Device) CopyOut(ctx context.Context, dst []float32, src runtime.Buffer) error {
	b, release, err := d.copyTarget(ctx, src, "copy out")
	if err != nil {
		return err
	}
	defer release()
	if err := d.rowMajor(ctx, b); err != nil {
		return fmt.Errorf("onednn: copy out: %w", err)
	}
	if len(dst) != b.n {
		return fmt.Errorf("onednn: copy out: %w: %d values for a %s buffer of %d", runtime.ErrInvalidGraph, len(dst), shapeString(b.shape), b.n)
	}
	switch b.dt {
	case runtime.F32:
		copy(dst, unsafe.Slice((*float32)(b.ptr), b.n))
	case runtime.BF16:
		fromBF16(dst, unsafe.Slice((*uint16)(b.ptr), b.n))
	case runtime.F16:
		for i, h := range unsafe.Slice((*uint16)(b.ptr), b.n) {
			dst[i] = quant.F16ToF32(h)
		}
	case runtime.I32:
		for i, v := range unsafe.Slice((*int32)(b.ptr), b.n) {
			dst[i] = float32(v)
		}
	default:
		q, _ := b.dt.GGML()
		if err := quant.Dequantize(q, unsafe.Slice((*byte)(b.ptr), b.dt.Bytes(int64(b.n))), dst); err != nil {
			return fmt.Errorf("onednn: copy out: %w", err)
		}
	}
	return nil
}

// Synchronize waits until the work submitted before it has finished.
func (d *Device) Synchronize(ctx context.Context) error {
	return d.do(ctx, func() error {
		var step *C.char
		if st := C.bd_device_wait(d.c, &step); st != C.dnnl_success {
			return fmt.Errorf("onednn: synchronize %s: %w", d.id, statusError(step, st))
		}
		return nil
	})
}

// MemoryUsed is the bytes allocated, pooled allocations included.
func (d *Device) MemoryUsed() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// Close stops the device's worker after the work it has started, destroys
// its primitives, stream and engine, and frees all its memory, including
// buffers not yet freed. Calls after Close fail with ErrClosed.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		close(d.quit)
		<-d.done
		d.life.Lock()
		defer d.life.Unlock()
		d.mu.Lock()
		defer d.mu.Unlock()
		for b := range d.live {
			C.bd_free(b.ptr)
			b.freed = true
		}
		for _, ptrs := range d.idle {
			for _, p := range ptrs {
				C.bd_free(p)
			}
		}
		d.live, d.idle = nil, nil
		d.used, d.pooled = 0, 0
		d.closed = true
	})
	return nil
}

// toBF16 rounds src to bf16 (nearest even) into dst; len(dst) >= len(src).
func toBF16(dst []uint16, src []float32) {
	if len(src) == 0 {
		return
	}
	C.bd_f32_to_bf16((*C.float)(unsafe.Pointer(&src[0])), (*C.uint16_t)(unsafe.Pointer(&dst[0])), C.int64_t(len(src)))
}

// fromBF16 widens src into dst; len(src) >= len(dst).
func fromBF16(dst []float32, src []uint16) {
	if len(dst) == 0 {
		return
	}
	C.bd_bf16_to_f32((*C.uint16_t)(unsafe.Pointer(&src[0])), (*C.float)(unsafe.Pointer(&dst[0])), C.int64_t(len(dst)))
}

// rowMajor puts b's contents back in row-major order if a matmul packed them.
func (d *Device) rowMajor(ctx context.Context, b *buffer) error {
	d.mu.Lock()
	packed := b.packed != nil || b.x16
	d.mu.Unlock()
	if !packed {
		return nil
	}
	return d.do(ctx, func() error { return d.unpack(b) })
}
