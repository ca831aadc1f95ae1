package pjrt

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	xpjrt "github.com/gomlx/go-xla/pjrt"

	"github.com/brokerd/brokerd/runtime"
)

// ErrClosed is returned by a Device's methods after Close.
var ErrClosed = errors.New("pjrt: device closed")

// alignment is the granularity buffers are counted in against the budget,
// as runtime/onednn allocates (and the models' MemoryBytes count).
const alignment = 64

// Device is one PJRT device opened by the adapter. It implements
// runtime.Device.
//
// PJRT allocates device memory itself: a buffer gets device memory when it
// is first written (CopyIn, or as a Run's output) and Alloc only admits its
// size against the budget. Runs are serialised (one stream per device, as
// runtime.Device says); copies are not, so a replica's CopyIn of the next
// batch overlaps another replica's running program (PJRT transfers on its
// own streams).
type Device struct {
	id      string
	c       *client
	dev     *xpjrt.Device
	info    DeviceInfo
	matched string // how MatchDevice found it
	compute runtime.DType
	lower   LowerOptions

	runMu sync.Mutex // held while a program runs

	mu     sync.Mutex // guards the fields below
	closed bool
	budget uint64
	used   uint64
	live   map[*buffer]struct{}
}

var _ runtime.Device = (*Device)(nil)

func newDevice(spec runtime.DeviceSpec, c *client, index int, matched string, lower LowerOptions) *Device {
	compute := spec.DType
	if compute == 0 {
		compute = runtime.F32
	}
	return &Device{
		id: spec.ID, c: c, dev: c.devices[index], info: c.info.Devices[index], matched: matched,
		compute: compute, lower: lower, budget: spec.Budget, live: map[*buffer]struct{}{},
	}
}

// ID returns brokerd's device ID ("gpu:0").
func (d *Device) ID() string { return d.id }

// ComputeType is the type the device was opened to compute in: models store
// matmul weights and run matmuls in it (see runtime/models).
func (d *Device) ComputeType() runtime.DType { return d.compute }

// PadBuckets returns the batch and sequence sizes models should pad to, so
// XLA compiles one program per bucket rather than per size: powers of two
// up to MaxBatchBucket (a model caps them at its own max batch, see
// BatchBuckets), and SeqBuckets.
func (d *Device) PadBuckets() (batch, seq []int) {
	return BatchBuckets(MaxBatchBucket), SeqBuckets()
}

// MaxInFlight is how many batches a model replica runs on the device at
// once: two, so that the next batch's inputs are copied in (uploads take no
// device lock) while the current batch executes.
func (d *Device) MaxInFlight() int { return 2 }

// Info returns the PJRT device behind this one, and how it was matched
// (MatchPCIBusID, MatchUUID or MatchIndex).
func (d *Device) Info() (DeviceInfo, string) { return d.info, d.matched }

// Platform is the client's platform name ("cuda", "tpu").
func (d *Device) Platform() string { return d.c.info.Platform }

// CacheStats returns the client's compile cache entries, hits and misses.
func (d *Device) CacheStats() (entries int, hits, misses uint64) { return d.c.cache.stats() }

// buffer is a runtime.Buffer of a Device. x, the PJRT buffer holding its
// values, is replaced by every write; a replaced or freed one is destroyed
// once no Run or CopyOut is reading it (pins).
type buffer struct {
	d     *Device
	dt    runtime.DType
	shape []int
	bytes int64

	mu    sync.Mutex
	x     *xpjrt.Buffer
	pins  int
	stale []*xpjrt.Buffer
	freed bool
	// donated: x is being consumed by a Run that updates it in place
	// (Program.Aliased); nothing else may read it until the Run swaps the
	// result in.
	donated bool
}

// donate marks x, pinned once by the caller, as consumed by the caller's
// Run. It refuses when anyone else holds a pin: their read must finish on
// the old values, so that Run copies instead.
func (b *buffer) donate() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pins != 1 || b.freed {
		return false
	}
	b.donated = true
	return true
}

func (b *buffer) DType() runtime.DType { return b.dt }
func (b *buffer) Shape() []int         { return b.shape }
func (b *buffer) Bytes() int64         { return b.bytes }

func (b *buffer) numel() int {
	n := 1
	for _, s := range b.shape {
		n *= s
	}
	return n
}

// undonate ends a donation whose Run failed: the values may be gone with
// it (PJRT may have consumed them), which later reads report.
func (b *buffer) undonate() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.donated = false
}

// swap makes nx the buffer's values.
func (b *buffer) swap(nx *xpjrt.Buffer) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		_ = nx.Destroy()
		return errors.New("pjrt: buffer freed while being written")
	}
	old := b.x
	b.x = nx
	b.donated = false
	if old != nil {
		if b.pins > 0 {
			b.stale = append(b.stale, old)
		} else {
			_ = old.Destroy()
		}
	}
	return nil
}

// written says whether the buffer has device memory (a copy or a run
// wrote it).
func (b *buffer) written() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.x != nil || b.freed
}

// zeros gives b device memory of zeros through a program of no inputs (a
// broadcast constant, compiled once per type and shape), so no host copy
// of the buffer's size is made: a KV cache can be gigabytes.
func (d *Device) zeros(ctx context.Context, b *buffer) error {
	t := TensorType{DType: b.dt, Shape: b.shape}
	comp, err := d.c.cache.get(ctx, fmt.Sprintf("zeros %s %v", b.dt, b.shape), func() (*compiled, error) {
		text, err := zeroProgram(t)
		if err != nil {
			return nil, err
		}
		exe, err := d.c.x.Compile().WithStableHLO(text).Done()
		if err != nil {
			return nil, fmt.Errorf("compile: %w", err)
		}
		return &compiled{prog: &Program{Outputs: []string{"zeros"}, Types: map[string]TensorType{"zeros": t}, Aliased: map[int]int{}}, exe: exe}, nil
	})
	if err != nil {
		return err
	}
	d.runMu.Lock()
	outs, err := comp.exe.Execute().OnDevice(d.dev).DonateNone().Done()
	d.runMu.Unlock()
	if err != nil {
		return fmt.Errorf("zeros: execute: %w", err)
	}
	if len(outs) != 1 {
		for _, x := range outs {
			_ = x.Destroy()
		}
		return fmt.Errorf("zeros: %d outputs", len(outs))
	}
	return b.swap(outs[0])
}

// pin returns the buffer's values, kept alive until unpin.
func (b *buffer) pin() (*xpjrt.Buffer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return nil, errors.New("buffer was freed")
	}
	if b.x == nil {
		return nil, errors.New("buffer was never written")
	}
	if b.donated {
		return nil, errors.New("buffer is being updated in place by a run")
	}
	b.pins++
	return b.x, nil
}

func (b *buffer) unpin() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pins--
	if b.pins > 0 {
		return
	}
	for _, s := range b.stale {
		_ = s.Destroy()
	}
	b.stale = nil
	if b.freed && b.x != nil {
		_ = b.x.Destroy()
		b.x = nil
	}
}

// release destroys the device memory now, or when the last pin goes.
func (b *buffer) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.freed = true
	if b.pins > 0 {
		return
	}
	if b.x != nil {
		_ = b.x.Destroy()
		b.x = nil
	}
	for _, s := range b.stale {
		_ = s.Destroy()
	}
	b.stale = nil
}

// Alloc admits a buffer of dt and shape against the budget.
func (d *Device) Alloc(dt runtime.DType, shape ...int) (runtime.Buffer, error) {
	switch dt {
	case runtime.F32, runtime.BF16, runtime.I32:
	default:
		return nil, fmt.Errorf("pjrt: %s: alloc: dtype %s: %w", d.id, dt, runtime.ErrUnsupported)
	}
	if len(shape) == 0 {
		return nil, fmt.Errorf("pjrt: %s: alloc: no dimensions", d.id)
	}
	n := int64(1)
	for _, s := range shape {
		if s <= 0 {
			return nil, fmt.Errorf("pjrt: %s: alloc: shape %v", d.id, shape)
		}
		n *= int64(s)
	}
	bytes := (n*int64(dt.Size()) + alignment - 1) / alignment * alignment
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if d.budget > 0 && d.used+uint64(bytes) > d.budget {
		return nil, fmt.Errorf("pjrt: %s: %d bytes with %d of %d in use: %w", d.id, bytes, d.used, d.budget, runtime.ErrOutOfMemory)
	}
	d.used += uint64(bytes)
	b := &buffer{d: d, dt: dt, shape: append([]int(nil), shape...), bytes: bytes}
	d.live[b] = struct{}{}
	return b, nil
}

// Free releases b's device memory and its share of the budget.
func (d *Device) Free(rb runtime.Buffer) {
	b, ok := rb.(*buffer)
	if !ok || b.d != d {
		return
	}
	d.mu.Lock()
	if _, live := d.live[b]; !live {
		d.mu.Unlock()
		return
	}
	delete(d.live, b)
	d.used -= uint64(b.bytes)
	d.mu.Unlock()
	b.release()
}

// own checks that rb is a live buffer of this device.
func (d *Device) own(rb runtime.Buffer) (*buffer, error) {
	b, ok := rb.(*buffer)
	if !ok || b.d != d {
		return nil, fmt.Errorf("%w: buffer %T is not from %s", runtime.ErrInvalidGraph, rb, d.id)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if _, live := d.live[b]; !live {
		return nil, fmt.Errorf("%w: buffer was freed", runtime.ErrInvalidGraph)
	}
	return b, nil
}

// CopyIn writes values into dst, converting to its type (f32 or bf16).
func (d *Device) CopyIn(ctx context.Context, dst runtime.Buffer, src []float32) error {
	b, err := d.own(dst)
	if err != nil {
		return err
	}
	if b.dt != runtime.F32 && b.dt != runtime.BF16 {
		return fmt.Errorf("pjrt: %s: CopyIn into a %s buffer: %w", d.id, b.dt, runtime.ErrInvalidGraph)
	}
	if len(src) != b.numel() {
		return fmt.Errorf("pjrt: %s: CopyIn of %d values into %v: %w", d.id, len(src), b.shape, runtime.ErrInvalidGraph)
	}
	var raw []byte
	if b.dt == runtime.BF16 {
		raw = bf16Bytes(src)
	} else {
		raw = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(src))), 4*len(src))
	}
	return d.upload(ctx, b, raw)
}

// CopyInInt32 writes indices into an I32 buffer.
func (d *Device) CopyInInt32(ctx context.Context, dst runtime.Buffer, src []int32) error {
	b, err := d.own(dst)
	if err != nil {
		return err
	}
	if b.dt != runtime.I32 {
		return fmt.Errorf("pjrt: %s: CopyInInt32 into a %s buffer: %w", d.id, b.dt, runtime.ErrInvalidGraph)
	}
	if len(src) != b.numel() {
		return fmt.Errorf("pjrt: %s: CopyInInt32 of %d values into %v: %w", d.id, len(src), b.shape, runtime.ErrInvalidGraph)
	}
	return d.upload(ctx, b, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(src))), 4*len(src)))
}

// upload copies raw (little-endian values of b's type) to the device, as b's
// new values. The transfer completes before it returns.
func (d *Device) upload(ctx context.Context, b *buffer, raw []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	x, err := d.c.x.BufferFromHost().FromRawData(raw, xlaType(b.dt), b.shape).ToDevice(d.dev).Done()
	if err != nil {
		return fmt.Errorf("pjrt: %s: copy in %v %s: %w", d.id, b.shape, b.dt, err)
	}
	return b.swap(x)
}

// CopyOut reads src into host values, converting to float32.
func (d *Device) CopyOut(ctx context.Context, dst []float32, src runtime.Buffer) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := d.own(src)
	if err != nil {
		return err
	}
	if len(dst) != b.numel() {
		return fmt.Errorf("pjrt: %s: CopyOut of %v into %d values: %w", d.id, b.shape, len(dst), runtime.ErrInvalidGraph)
	}
	x, err := b.pin()
	if err != nil {
		return fmt.Errorf("pjrt: %s: CopyOut: %w: %w", d.id, runtime.ErrInvalidGraph, err)
	}
	defer b.unpin()
	switch b.dt {
	case runtime.F32:
		err = x.ToHost(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), 4*len(dst)))
	case runtime.BF16:
		h := make([]uint16, len(dst))
		if err = x.ToHost(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(h))), 2*len(h))); err == nil {
			for i, v := range h {
				dst[i] = math.Float32frombits(uint32(v) << 16)
			}
		}
	case runtime.I32:
		v := make([]int32, len(dst))
		if err = x.ToHost(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))); err == nil {
			for i, n := range v {
				dst[i] = float32(n)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("pjrt: %s: copy out %v %s: %w", d.id, b.shape, b.dt, err)
	}
	return nil
}

// compiled is a lowered graph and its executable.
type compiled struct {
	prog *Program
	exe  *xpjrt.LoadedExecutable
}

// Run lowers g for the bound buffers' types, compiles it once per (graph,
// types) through the client's cache, and executes it with the bound buffers:
// weights stay where they are, the outputs' buffers receive the results.
func (d *Device) Run(ctx context.Context, g *runtime.Graph, bind map[string]runtime.Buffer) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if g == nil {
		return fmt.Errorf("pjrt: %s: %w: nil graph", d.id, runtime.ErrInvalidGraph)
	}
	bufs := make(map[string]*buffer, len(bind))
	types := make(map[string]TensorType, len(bind))
	for name, rb := range bind {
		b, err := d.own(rb)
		if err != nil {
			return fmt.Errorf("pjrt: %s: binding %q: %w", d.id, name, err)
		}
		bufs[name] = b
		types[name] = TensorType{DType: b.dt, Shape: b.shape}
	}
	comp, err := d.c.cache.get(ctx, programKey(g, types, d.lower), func() (*compiled, error) {
		prog, err := Lower(g, types, d.lower)
		if err != nil {
			return nil, err
		}
		exe, err := d.c.x.Compile().WithStableHLO(prog.Text).Done()
		if err != nil {
			return nil, fmt.Errorf("compile: %w", err)
		}
		return &compiled{prog: prog, exe: exe}, nil
	})
	if err != nil {
		return fmt.Errorf("pjrt: %s: %w", d.id, err)
	}

	inputs := make([]*xpjrt.Buffer, 0, len(comp.prog.Inputs))
	defer func() {
		for _, name := range comp.prog.Inputs[:len(inputs)] {
			bufs[name].unpin()
		}
	}()
	for _, name := range comp.prog.Inputs {
		if !bufs[name].written() {
			// Allocated and never written (an LLM's KV cache): it reads
			// as zeros, made on the device.
			if err := d.zeros(ctx, bufs[name]); err != nil {
				return fmt.Errorf("pjrt: %s: input %q: %w", d.id, name, err)
			}
		}
		x, err := bufs[name].pin()
		if err != nil {
			return fmt.Errorf("pjrt: %s: input %q: %w: %w", d.id, name, runtime.ErrInvalidGraph, err)
		}
		inputs = append(inputs, x)
	}
	// A KV cache the program updates in place is donated, so XLA writes
	// into its memory instead of copying the whole cache each step; only
	// when no one else is reading it (else XLA copies it, as without).
	var donate []int
	for i, name := range comp.prog.Inputs {
		if _, ok := comp.prog.Aliased[i]; ok && bufs[name].donate() {
			donate = append(donate, i)
		}
	}
	d.runMu.Lock()
	outs, err := comp.exe.Execute(inputs...).OnDevice(d.dev).DonateNone().Donate(donate...).Done()
	d.runMu.Unlock()
	if err != nil {
		for _, i := range donate {
			bufs[comp.prog.Inputs[i]].undonate()
		}
		return fmt.Errorf("pjrt: %s: execute: %w", d.id, err)
	}
	if len(outs) != len(comp.prog.Outputs) {
		for _, x := range outs {
			_ = x.Destroy()
		}
		return fmt.Errorf("pjrt: %s: execute returned %d outputs, want %d", d.id, len(outs), len(comp.prog.Outputs))
	}
	for i, name := range comp.prog.Outputs {
		if err := bufs[name].swap(outs[i]); err != nil {
			for _, x := range outs[i+1:] {
				_ = x.Destroy()
			}
			return fmt.Errorf("pjrt: %s: output %q: %w", d.id, name, err)
		}
	}
	return nil
}

// Synchronize waits for the running program: copies and runs complete
// before they return.
func (d *Device) Synchronize(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.runMu.Lock()
	defer d.runMu.Unlock()
	return nil
}

// MemoryUsed is the bytes admitted for live buffers.
func (d *Device) MemoryUsed() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// Close frees every buffer after the running program. The client and its
// compiled programs stay with the adapter, for other devices and reopening.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	live := d.live
	d.live = map[*buffer]struct{}{}
	d.used = 0
	d.mu.Unlock()
	d.runMu.Lock()
	defer d.runMu.Unlock()
	for b := range live {
		b.release()
	}
	return nil
}

// bf16Bytes converts values to bfloat16 (round to nearest even, NaN kept
// quiet), little-endian.
func bf16Bytes(src []float32) []byte {
	out := make([]uint16, len(src))
	for i, f := range src {
		out[i] = toBF16(f)
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(out))), 2*len(out))
}

func toBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}
