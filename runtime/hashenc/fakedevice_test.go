package hashenc

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/brokerd/brokerd/runtime"
)

// fakeDevice is a plain-Go runtime.Device with the two ops the encoder uses.
// Its matmul adds in a different order from the host reference (reversed,
// in blocks, or interleaved, by setting), to show that the encoder's
// exactness makes the order irrelevant; its L2 normalisation follows the
// recipe of the package doc.
type fakeDevice struct {
	id     string
	budget int64
	order  sumOrder

	mu    sync.Mutex
	used  int64
	live  map[*fakeBuffer]bool
	runs  int
	maxM  int
	runFn func() error // injected failure; nil for none
	bf16  bool         // round matmul outputs to bfloat16, like a reduced-precision device
	// fp32Norm normalises with float32 sums in eight lanes, as a vectorised
	// C loop does, instead of the package's recipe.
	fp32Norm bool
}

type sumOrder int

const (
	orderForward sumOrder = iota
	orderReverse
	orderBlocked // 16-wide lanes summed separately, then combined, as SIMD code does
)

type fakeBuffer struct {
	dt    runtime.DType
	shape []int
	data  []float32
}

func (b *fakeBuffer) DType() runtime.DType { return b.dt }
func (b *fakeBuffer) Shape() []int         { return b.shape }
func (b *fakeBuffer) Bytes() int64         { return int64(len(b.data)) * int64(b.dt.Size()) }

func newFakeDevice(budget int64, order sumOrder) *fakeDevice {
	return &fakeDevice{id: "fake:0", budget: budget, order: order, live: map[*fakeBuffer]bool{}}
}

func (d *fakeDevice) ID() string { return d.id }

func (d *fakeDevice) Alloc(dt runtime.DType, shape ...int) (runtime.Buffer, error) {
	n := 1
	for _, s := range shape {
		n *= s
	}
	b := &fakeBuffer{dt: dt, shape: slices.Clone(shape), data: make([]float32, n)}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.budget > 0 && d.used+b.Bytes() > d.budget {
		return nil, fmt.Errorf("alloc %v %v: %w", dt, shape, runtime.ErrOutOfMemory)
	}
	d.used += b.Bytes()
	d.live[b] = true
	return b, nil
}

func (d *fakeDevice) Free(rb runtime.Buffer) {
	b := rb.(*fakeBuffer)
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.live[b] {
		panic("fakeDevice: double free")
	}
	delete(d.live, b)
	d.used -= b.Bytes()
}

func (d *fakeDevice) CopyIn(ctx context.Context, dst runtime.Buffer, src []float32) error {
	b := dst.(*fakeBuffer)
	if len(src) != len(b.data) {
		return fmt.Errorf("CopyIn: %d values into %v", len(src), b.shape)
	}
	copy(b.data, src)
	return nil
}

func (d *fakeDevice) CopyInInt32(ctx context.Context, dst runtime.Buffer, src []int32) error {
	return fmt.Errorf("CopyInInt32: not used by the encoder")
}

func (d *fakeDevice) CopyOut(ctx context.Context, dst []float32, src runtime.Buffer) error {
	b := src.(*fakeBuffer)
	if len(dst) != len(b.data) {
		return fmt.Errorf("CopyOut: %v into %d values", b.shape, len(dst))
	}
	copy(dst, b.data)
	return nil
}

func (d *fakeDevice) Run(ctx context.Context, g *runtime.Graph, bind map[string]runtime.Buffer) error {
	d.mu.Lock()
	defer d.mu.Unlock() // one stream: runs are serialised
	d.runs++
	if d.runFn != nil {
		if err := d.runFn(); err != nil {
			return err
		}
	}
	for _, op := range g.Ops {
		in := make([]*fakeBuffer, len(op.In))
		for i, name := range op.In {
			b, ok := bind[name]
			if !ok {
				return fmt.Errorf("op %d: unbound input %q", op.Kind, name)
			}
			in[i] = b.(*fakeBuffer)
		}
		ob, ok := bind[op.Out]
		if !ok {
			return fmt.Errorf("op %d: unbound output %q", op.Kind, op.Out)
		}
		out := ob.(*fakeBuffer)
		switch op.Kind {
		case runtime.OpMatMul:
			if err := d.matmul(in[0], in[1], out); err != nil {
				return err
			}
		case runtime.OpL2Normalize:
			cols := in[0].shape[len(in[0].shape)-1]
			for r := 0; r < len(in[0].data)/cols; r++ {
				row := in[0].data[r*cols : (r+1)*cols]
				if d.fp32Norm {
					copy(out.data[r*cols:(r+1)*cols], l2NormalizeRowFloat32(row))
				} else {
					copy(out.data[r*cols:(r+1)*cols], l2NormalizeRowOrder(row, d.order))
				}
			}
		default:
			return fmt.Errorf("fakeDevice: op %d not implemented", op.Kind)
		}
	}
	return nil
}

func (d *fakeDevice) matmul(a, b, c *fakeBuffer) error {
	m, k := a.shape[0], a.shape[1]
	k2, n := b.shape[0], b.shape[1]
	if k != k2 || c.shape[0] != m || c.shape[1] != n {
		return fmt.Errorf("matmul shapes %v × %v → %v", a.shape, b.shape, c.shape)
	}
	d.maxM = max(d.maxM, m)
	terms := make([]float32, k)
	for i := range m {
		for j := range n {
			for p := range k {
				terms[p] = a.data[i*k+p] * b.data[p*n+j]
			}
			v := sum32(terms, d.order)
			if d.bf16 {
				v = math.Float32frombits((math.Float32bits(v) + 0x8000) &^ 0xffff)
			}
			c.data[i*n+j] = v
		}
	}
	return nil
}

// sum32 adds float32 terms in the given order, rounding every partial sum
// to float32 as SIMD code does.
func sum32(t []float32, order sumOrder) float32 {
	var s float32
	switch order {
	case orderReverse:
		for i := len(t) - 1; i >= 0; i-- {
			s += t[i]
		}
	case orderBlocked:
		var lanes [16]float32
		for i, v := range t {
			lanes[i%16] += v
		}
		for w := 8; w >= 1; w /= 2 { // tree reduction of the lanes
			for l := range w {
				lanes[l] += lanes[l+w]
			}
		}
		s = lanes[0]
	default:
		for _, v := range t {
			s += v
		}
	}
	return s
}

// l2NormalizeRowOrder is the normalisation recipe with the sum of squares in
// the given order (float64, exact for the encoder's rows in any order).
func l2NormalizeRowOrder(y []float32, order sumOrder) []float32 {
	idx := make([]int, len(y))
	for i := range idx {
		idx[i] = i
	}
	if order == orderReverse {
		slices.Reverse(idx)
	}
	var ss float64
	for _, i := range idx {
		ss += float64(y[i]) * float64(y[i])
	}
	out := make([]float32, len(y))
	if ss == 0 {
		return out
	}
	n := math.Sqrt(ss)
	for j, v := range y {
		out[j] = float32(float64(v) / n)
	}
	return out
}

// l2NormalizeRowFloat32 sums squares in float32, eight lanes then the lanes
// in order: deterministic, but not the package's recipe.
func l2NormalizeRowFloat32(y []float32) []float32 {
	var acc [8]float32
	for j, v := range y {
		acc[j%8] += v * v
	}
	var ss float32
	for _, a := range acc {
		ss += a
	}
	out := make([]float32, len(y))
	if ss == 0 {
		return out
	}
	n := float32(math.Sqrt(float64(ss)))
	for j, v := range y {
		out[j] = v / n
	}
	return out
}

func (d *fakeDevice) Synchronize(ctx context.Context) error { return nil }

func (d *fakeDevice) MemoryUsed() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return uint64(d.used)
}

func (d *fakeDevice) Close() error { return nil }

func (d *fakeDevice) liveBuffers() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.live)
}

var _ runtime.Device = (*fakeDevice)(nil)
