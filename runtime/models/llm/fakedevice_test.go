package llm

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/brokerd/brokerd/runtime"
)

// goDevice is a pure-Go runtime.Device in float32 for the engine's tests:
// the ops the step graph uses, computed the plain way, so the engine's
// bookkeeping (block tables, slots, chunking, row gathers) is tested apart
// from any adapter. Buckets, when set, make it pose as a device that
// compiles per shape.
type goDevice struct {
	buckets []int

	mu   sync.Mutex
	used uint64
}

type goBuf struct {
	dt    runtime.DType
	shape []int
	f     []float32
	i     []int32
}

func (b *goBuf) DType() runtime.DType { return b.dt }
func (b *goBuf) Shape() []int         { return append([]int(nil), b.shape...) }
func (b *goBuf) Bytes() int64         { return int64(b.n() * 4) }
func (b *goBuf) n() int {
	n := 1
	for _, d := range b.shape {
		n *= d
	}
	return n
}

func (d *goDevice) ID() string { return "go:0" }

func (d *goDevice) Alloc(dt runtime.DType, shape ...int) (runtime.Buffer, error) {
	b := &goBuf{dt: dt, shape: append([]int(nil), shape...)}
	if dt == runtime.I32 {
		b.i = make([]int32, b.n())
	} else {
		b.f = make([]float32, b.n())
	}
	d.mu.Lock()
	d.used += uint64(b.Bytes())
	d.mu.Unlock()
	return b, nil
}

func (d *goDevice) Free(b runtime.Buffer) {
	d.mu.Lock()
	d.used -= uint64(b.Bytes())
	d.mu.Unlock()
}

func (d *goDevice) CopyIn(_ context.Context, dst runtime.Buffer, src []float32) error {
	copy(dst.(*goBuf).f, src)
	return nil
}

func (d *goDevice) CopyInInt32(_ context.Context, dst runtime.Buffer, src []int32) error {
	copy(dst.(*goBuf).i, src)
	return nil
}

func (d *goDevice) CopyOut(_ context.Context, dst []float32, src runtime.Buffer) error {
	copy(dst, src.(*goBuf).f)
	return nil
}

func (d *goDevice) Synchronize(context.Context) error { return nil }
func (d *goDevice) MemoryUsed() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}
func (d *goDevice) Close() error { return nil }

// PadBuckets makes the engine pad steps when buckets are set.
func (d *goDevice) PadBuckets() (batch, seq []int) { return d.buckets, nil }

func (d *goDevice) Run(_ context.Context, g *runtime.Graph, bind map[string]runtime.Buffer) error {
	vals := map[string]*goBuf{}
	for k, v := range bind {
		vals[k] = v.(*goBuf)
	}
	for i, op := range g.Ops {
		in := make([]*goBuf, len(op.In))
		for j, n := range op.In {
			if in[j] = vals[n]; in[j] == nil {
				return fmt.Errorf("op %d (%v): no value %q", i, op.Kind, n)
			}
		}
		out, err := goOp(op, in, vals[op.Out])
		if err != nil {
			return fmt.Errorf("op %d (%v): %w", i, op.Kind, err)
		}
		if b, ok := bind[op.Out]; ok && out != b.(*goBuf) {
			copy(b.(*goBuf).f, out.f)
			continue
		}
		vals[op.Out] = out
	}
	return nil
}

func newF(shape ...int) *goBuf {
	b := &goBuf{dt: runtime.F32, shape: shape}
	b.f = make([]float32, b.n())
	return b
}

func goOp(op runtime.Op, in []*goBuf, out *goBuf) (*goBuf, error) {
	last := func(b *goBuf) int { return b.shape[len(b.shape)-1] }
	switch op.Kind {
	case runtime.OpGather:
		tab, idx := in[0], in[1]
		w := last(tab)
		o := newF(append(append([]int(nil), idx.shape...), w)...)
		for r, id := range idx.i {
			if id < 0 || int(id)*w >= len(tab.f) {
				return nil, fmt.Errorf("index %d out of range", id)
			}
			copy(o.f[r*w:(r+1)*w], tab.f[int(id)*w:(int(id)+1)*w])
		}
		return o, nil
	case runtime.OpMatMul:
		a, w := in[0], in[1]
		k := last(a)
		m := a.n() / k
		n := w.shape[0]
		o := newF(append(append([]int(nil), a.shape[:len(a.shape)-1]...), n)...)
		for r := range m {
			for c := range n {
				var acc float32
				for i := range k {
					acc += a.f[r*k+i] * w.f[c*k+i]
				}
				if len(in) == 3 {
					acc += in[2].f[c]
				}
				o.f[r*n+c] = acc
			}
		}
		return o, nil
	case runtime.OpAdd:
		o := newF(in[0].shape...)
		for i := range o.f {
			o.f[i] = in[0].f[i] + in[1].f[i]
		}
		return o, nil
	case runtime.OpReshape:
		return &goBuf{dt: in[0].dt, shape: op.Shape, f: in[0].f}, nil
	case runtime.OpConvert:
		return in[0], nil
	case runtime.OpRMSNorm:
		x, g := in[0], in[1]
		w := last(x)
		o := newF(x.shape...)
		for r := 0; r < x.n()/w; r++ {
			row := x.f[r*w : (r+1)*w]
			var ss float32
			for _, v := range row {
				ss += v * v
			}
			inv := 1 / float32(math.Sqrt(float64(ss/float32(w)+op.Eps)))
			for i, v := range row {
				o.f[r*w+i] = v * inv * g.f[i]
			}
		}
		return o, nil
	case runtime.OpRoPE:
		x, pos, freq := in[0], in[1], in[2]
		t, h, dd := x.shape[0], x.shape[1], x.shape[2]
		half := dd / 2
		o := newF(x.shape...)
		copy(o.f, x.f)
		for r := range t {
			for hd := range h {
				v := o.f[(r*h+hd)*dd : (r*h+hd+1)*dd]
				for i := range half {
					a := float64(pos.i[r]) * float64(freq.f[i])
					c, s := float32(math.Cos(a)), float32(math.Sin(a))
					x1, x2 := v[i], v[i+half]
					v[i], v[i+half] = x1*c-x2*s, x2*c+x1*s
				}
			}
		}
		return o, nil
	case runtime.OpKVWrite:
		src, slots := in[0], in[1]
		row := src.n() / src.shape[0]
		for r, sl := range slots.i {
			if sl < 0 {
				continue
			}
			copy(out.f[int(sl)*row:(int(sl)+1)*row], src.f[r*row:(r+1)*row])
		}
		return out, nil
	case runtime.OpPagedAttention:
		q, kc, vc, bt, si, pos := in[0], in[1], in[2], in[3], in[4], in[5]
		t, hq, dd := q.shape[0], q.shape[1], q.shape[2]
		bs, hkv := kc.shape[1], kc.shape[2]
		mb := bt.shape[1]
		o := newF(q.shape...)
		for r := range t {
			s, p := int(si.i[r]), int(pos.i[r])
			for h := range hq {
				kv := h / (hq / hkv)
				qv := q.f[(r*hq+h)*dd : (r*hq+h+1)*dd]
				sc := make([]float32, p+1)
				m := float32(math.Inf(-1))
				for j := 0; j <= p; j++ {
					slot := int(bt.i[s*mb+j/bs])*bs + j%bs
					kv0 := (slot*hkv + kv) * dd
					var dot float32
					for i := range dd {
						dot += qv[i] * kc.f[kv0+i]
					}
					sc[j] = dot * op.Scale
					m = max(m, sc[j])
				}
				var sum float32
				for j := range sc {
					sc[j] = float32(math.Exp(float64(sc[j] - m)))
					sum += sc[j]
				}
				ov := o.f[(r*hq+h)*dd : (r*hq+h+1)*dd]
				for j := range sc {
					slot := int(bt.i[s*mb+j/bs])*bs + j%bs
					v0 := (slot*hkv + kv) * dd
					for i := range dd {
						ov[i] += sc[j] / sum * vc.f[v0+i]
					}
				}
			}
		}
		return o, nil
	case runtime.OpSwiGLU:
		x := in[0]
		w := last(x) / 2
		rows := x.n() / last(x)
		o := newF(append(append([]int(nil), x.shape[:len(x.shape)-1]...), w)...)
		for r := range rows {
			for i := range w {
				g, u := x.f[r*2*w+i], x.f[r*2*w+w+i]
				o.f[r*w+i] = g / (1 + float32(math.Exp(float64(-g)))) * u
			}
		}
		return o, nil
	}
	return nil, fmt.Errorf("op %v not in the test device", op.Kind)
}
