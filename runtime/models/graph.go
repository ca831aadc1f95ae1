package models

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/brokerd/brokerd/runtime"
)

// ErrInvalidInput means a payload or a model definition does not fit the
// model: a wrong payload type, a token id outside the vocabulary, a row of
// the wrong width, a missing or misshapen weight. The server maps it to
// INVALID_ARGUMENT.
var ErrInvalidInput = errors.New("models: invalid input")

// ErrClosed is returned by Execute on a closed replica.
var ErrClosed = errors.New("models: replica closed")

// Defaults for options left zero.
const (
	// DefaultBaseBatch is the base batch when a spec or option gives none.
	DefaultBaseBatch = 32
	// DefaultMaxBatchTokens bounds a text batch's tokens (TEI's default).
	DefaultMaxBatchTokens = 16384
)

// alignment is the device's allocation granularity (runtime/onednn rounds
// every buffer up to 64 bytes); MemoryBytes counts the same way.
const alignment = 64

func bufferBytes(dt runtime.DType, shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return (n*int64(dt.Size()) + alignment - 1) / alignment * alignment
}

// value is the type and shape of a named value of a graph being built.
type value struct {
	dt    runtime.DType
	shape []int
}

// builder builds a straight-line runtime.Graph and keeps the type and shape
// of every value, so the models know the buffers they bind and can compute
// the workspace the device will allocate for a run (MemoryBytes).
type builder struct {
	ops    []runtime.Op
	vals   map[string]value
	bound  map[string]bool   // inputs and outputs bound by the caller (weights excluded)
	weight map[string]bool   // resident weights: not counted as workspace
	conv   map[string]string // f32 value -> its bf16 copy, made once
	mmType runtime.DType     // operand type of matmuls: F32 or BF16
	n      int
}

func newBuilder(mmType runtime.DType) *builder {
	return &builder{
		vals: map[string]value{}, bound: map[string]bool{}, weight: map[string]bool{},
		conv: map[string]string{}, mmType: mmType,
	}
}

// input declares a per-run input the caller binds.
func (b *builder) input(name string, dt runtime.DType, shape ...int) string {
	b.vals[name] = value{dt, shape}
	b.bound[name] = true
	return name
}

// param declares a resident weight.
func (b *builder) param(name string, dt runtime.DType, shape []int) string {
	b.vals[name] = value{dt, shape}
	b.weight[name] = true
	return name
}

func (b *builder) shape(name string) []int { return b.vals[name].shape }

// add appends op writing a new value of dt and shape; op.Out is named here
// unless set.
func (b *builder) add(op runtime.Op, dt runtime.DType, shape []int) string {
	if op.Out == "" {
		b.n++
		op.Out = fmt.Sprintf("t%d", b.n)
	}
	b.ops = append(b.ops, op)
	b.vals[op.Out] = value{dt, shape}
	return op.Out
}

// output marks name as a result the caller binds and reads back.
func (b *builder) output(name string) { b.bound[name] = true }

// outputLast renames the last op's result to name, a bound output.
func (b *builder) outputLast(name string) {
	last := &b.ops[len(b.ops)-1]
	b.vals[name] = b.vals[last.Out]
	delete(b.vals, last.Out)
	last.Out = name
	b.output(name)
}

// operand returns x as a matmul operand: itself in f32 mode, its bf16 copy
// (converted once) in bf16 mode.
func (b *builder) operand(x string) string {
	if b.mmType != runtime.BF16 || b.vals[x].dt == runtime.BF16 {
		return x
	}
	if c, ok := b.conv[x]; ok {
		return c
	}
	c := b.add(runtime.Op{Kind: runtime.OpConvert, In: []string{x}, DType: runtime.BF16}, runtime.BF16, b.vals[x].shape)
	b.conv[x] = c
	return c
}

// linear is x·wᵀ + bias with act fused: w is a PyTorch Linear weight
// [out,in], read in place with TransB. The result is f32.
func (b *builder) linear(x, w, bias string, act runtime.Activation) string {
	return b.linearTo(x, w, bias, act, runtime.F32)
}

// operandLinear is linear for a result that only feeds other matmuls: it is
// written in the matmul operand type, so in bf16 mode no conversion follows.
func (b *builder) operandLinear(x, w, bias string, act runtime.Activation) string {
	return b.linearTo(x, w, bias, act, b.mmType)
}

// residualLinear is res + x·wᵀ + bias in one matmul (f32).
func (b *builder) residualLinear(x, w, bias, res string) string {
	return b.add(runtime.Op{Kind: runtime.OpMatMul, In: []string{b.operand(x), w, bias, res}, TransB: true}, runtime.F32, b.shape(res))
}

func (b *builder) linearTo(x, w, bias string, act runtime.Activation, dt runtime.DType) string {
	in := []string{b.operand(x), w}
	if bias != "" {
		in = append(in, bias)
	}
	xs := b.shape(x)
	out := append(append([]int(nil), xs[:len(xs)-1]...), b.shape(w)[0])
	return b.add(runtime.Op{Kind: runtime.OpMatMul, In: in, Act: act, TransB: true, DType: productDType(dt)}, dt, out)
}

// productDType is Op.DType for a product of type dt: 0 (f32, the default)
// or BF16.
func productDType(dt runtime.DType) runtime.DType {
	if dt == runtime.BF16 {
		return runtime.BF16
	}
	return 0
}

// dtype is the type of value name.
func (b *builder) dtype(name string) runtime.DType { return b.vals[name].dt }

// workspace is the most memory the device holds for one run of the graph:
// the bound inputs and outputs for the whole run, plus the intermediates
// alive at once (each allocated when its op runs and freed after its last
// reader), as runtime/onednn's Run does.
func (b *builder) workspace() int64 {
	lastUse := map[string]int{}
	for i, op := range b.ops {
		for _, name := range op.In {
			lastUse[name] = i
		}
	}
	var fixed int64
	for name := range b.bound {
		v := b.vals[name]
		fixed += bufferBytes(v.dt, v.shape)
	}
	var live, peak int64
	for i, op := range b.ops {
		if !b.bound[op.Out] {
			v := b.vals[op.Out]
			live += bufferBytes(v.dt, v.shape)
		}
		var scratch int64 // OpAttention's scores, held while it runs
		if x := b.vals[op.In[0]]; op.Kind == runtime.OpAttention {
			scores := []int{x.shape[0], op.Heads, x.shape[1], x.shape[1]}
			scratch = bufferBytes(runtime.F32, scores)
			if x.dt == runtime.BF16 {
				scratch += bufferBytes(runtime.BF16, scores)
			}
		}
		peak = max(peak, live+scratch)
		for _, name := range op.In {
			if lastUse[name] == i && !b.bound[name] && !b.weight[name] {
				v := b.vals[name]
				live -= bufferBytes(v.dt, v.shape)
			}
		}
		// A value nobody reads is freed at the end of the run only.
	}
	return fixed + peak
}

// computeType is the type a device computes in, where the device says so
// (runtime/onednn's Device does); F32 otherwise.
func computeType(dev runtime.Device) runtime.DType {
	if ct, ok := dev.(interface{ ComputeType() runtime.DType }); ok && ct.ComputeType() == runtime.BF16 {
		return runtime.BF16
	}
	return runtime.F32
}

// resident is the weights of one replica on its device, uploaded once.
type resident struct {
	dev runtime.Device
	dt  runtime.DType // matmul operand type

	mu   sync.RWMutex // Close against running batches
	bufs map[string]runtime.Buffer
}

// upload copies weights to dev: those named in mm as dt (the matmul operand
// type), the rest as f32. On failure nothing stays allocated.
func upload(ctx context.Context, dev runtime.Device, dt runtime.DType, weights map[string]Tensor, mm map[string]bool) (*resident, error) {
	r := &resident{dev: dev, dt: dt, bufs: map[string]runtime.Buffer{}}
	names := make([]string, 0, len(weights))
	for name := range weights {
		names = append(names, name)
	}
	sort.Strings(names) // deterministic allocation order
	for _, name := range names {
		t := weights[name]
		wdt := runtime.F32
		if mm[name] {
			wdt = dt
		}
		buf, err := dev.Alloc(wdt, t.Shape...)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("weight %q on %s: %w", name, dev.ID(), err)
		}
		r.bufs[name] = buf
		if err := dev.CopyIn(ctx, buf, t.Data); err != nil {
			r.close()
			return nil, fmt.Errorf("weight %q on %s: %w", name, dev.ID(), err)
		}
	}
	return r, nil
}

func (r *resident) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.bufs {
		r.dev.Free(b)
	}
	r.bufs = nil
}

// weightBytes is the device memory of the weights when those in mm are
// stored as dt.
func weightBytes(weights map[string]Tensor, mm map[string]bool, dt runtime.DType) int64 {
	var n int64
	for name, t := range weights {
		wdt := runtime.F32
		if mm[name] {
			wdt = dt
		}
		n += bufferBytes(wdt, t.Shape)
	}
	return n
}

// run binds the resident weights and the given per-run buffers and runs g.
// The caller holds r.mu for reading.
func (r *resident) run(ctx context.Context, g *runtime.Graph, io map[string]runtime.Buffer) error {
	bind := make(map[string]runtime.Buffer, len(r.bufs)+len(io))
	for k, v := range r.bufs {
		bind[k] = v
	}
	for k, v := range io {
		bind[k] = v
	}
	return r.dev.Run(ctx, g, bind)
}

// checkTensor checks that weights[name] exists with the given shape.
func checkTensor(weights map[string]Tensor, name string, shape ...int) error {
	t, ok := weights[name]
	if !ok {
		return fmt.Errorf("%w: weight %q is missing", ErrInvalidInput, name)
	}
	if len(t.Shape) != len(shape) {
		return fmt.Errorf("%w: weight %q is %v, want %v", ErrInvalidInput, name, t.Shape, shape)
	}
	n := 1
	for i, d := range shape {
		if t.Shape[i] != d {
			return fmt.Errorf("%w: weight %q is %v, want %v", ErrInvalidInput, name, t.Shape, shape)
		}
		n *= d
	}
	if len(t.Data) != n {
		return fmt.Errorf("%w: weight %q has %d values for shape %v", ErrInvalidInput, name, len(t.Data), t.Shape)
	}
	return nil
}
