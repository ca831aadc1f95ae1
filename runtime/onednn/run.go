package onednn

/*
#include "dnnl_ops.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/brokerd/brokerd/runtime"
)

// Run checks g against the bound buffers, then executes it on the device's
// worker. Intermediates are allocated from the pool when their op runs and
// returned to it after their last reader. Runs on one device are serialised;
// ctx is honoured while waiting and between ops.
//
// A decode step runs a few hundred small ops, so what a run does per name
// is done once per graph: the plan numbers every name (planned.slot), and
// a run keeps its buffers and pointers in slices by that number rather
// than in maps built each time.
func (d *Device) Run(ctx context.Context, g *runtime.Graph, bind map[string]runtime.Buffer) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.life.RLock()
	defer d.life.RUnlock()
	pe, err := d.plans.get(g, func() (*planned, error) { return d.planBound(g, bind) })
	if err != nil {
		return fmt.Errorf("onednn: run on %s: %w", d.id, err)
	}
	bufs, err := d.bindSlots(pe, bind)
	if errors.Is(err, errRebound) {
		// The same graph bound to other shapes: planned again, not cached.
		if pe, err = d.planBound(g, bind); err == nil {
			bufs, err = d.bindSlots(pe, bind)
		}
	}
	if err != nil {
		return fmt.Errorf("onednn: run on %s: %w", d.id, err)
	}
	// oneDNN's matmul and the C kernels cannot write over their own input.
	for i, ss := range pe.steps {
		out := bufs[ss.out]
		if out == nil {
			continue
		}
		for j, id := range ss.in {
			if bufs[id] == out {
				s := &pe.plan.Steps[i]
				return fmt.Errorf("onednn: run on %s: %w: %s writes %q into the buffer it reads as %q",
					d.id, runtime.ErrInvalidGraph, s, s.Op.Out, s.Op.In[j])
			}
		}
	}
	return d.do(ctx, func() error { return d.execute(ctx, pe, bufs) })
}

// errRebound says a run's bindings differ from those its cached plan was
// checked against.
var errRebound = errors.New("bindings differ from the plan's")

// planBound checks that every binding is a live buffer of d, then plans g
// against their types.
func (d *Device) planBound(g *runtime.Graph, bind map[string]runtime.Buffer) (*planned, error) {
	bound := make(map[string]runtime.TensorType, len(bind))
	for name, b := range bind {
		bb, err := d.own(b)
		if err != nil {
			return nil, fmt.Errorf("bind %q: %w", name, err)
		}
		bound[name] = runtime.TensorType{DType: bb.dt, Shape: bb.shape}
	}
	return plan(g, bound)
}

// bindSlots returns bind's buffers by pe's slots, checking that each is a
// live buffer of d; errRebound when the names or types are not those pe
// was planned with.
func (d *Device) bindSlots(pe *planned, bind map[string]runtime.Buffer) ([]*buffer, error) {
	if len(bind) != pe.nBound {
		return nil, errRebound
	}
	bufs := make([]*buffer, len(pe.names))
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	for name, b := range bind {
		bb, ok := b.(*buffer)
		switch {
		case !ok || bb == nil:
			return nil, fmt.Errorf("bind %q: %w: buffer %T is not a oneDNN buffer", name, runtime.ErrInvalidGraph, b)
		case bb.dev != d:
			return nil, fmt.Errorf("bind %q: %w: buffer belongs to device %s, not %s", name, runtime.ErrInvalidGraph, bb.dev.id, d.id)
		case bb.freed:
			return nil, fmt.Errorf("bind %q: %w: buffer %s %s was freed", name, runtime.ErrInvalidGraph, bb.dt, shapeString(bb.shape))
		}
		id, ok := pe.slot[name]
		if !ok || !pe.isBound[id] {
			return nil, errRebound
		}
		if t := pe.bound[id]; t.DType != bb.dt || !slices.Equal(t.Shape, bb.shape) {
			return nil, errRebound
		}
		bufs[id] = bb
	}
	return bufs, nil
}

// planned is a checked graph and what execute derives from its plan alone.
type planned struct {
	plan *runtime.Plan
	// slot numbers every name the graph reads or writes, and every
	// binding; names is its inverse. The tables below, and a run's
	// buffers and pointers, are indexed by it.
	slot    map[string]int
	names   []string
	bound   []runtime.TensorType // the bindings' types it was checked against
	isBound []bool
	nBound  int
	steps   []stepSlots // by step
	// lastUse is the last step reading each name (-1: none); otherUse
	// says a name is read other than as a matmul's weights, or written.
	lastUse  []int
	otherUse []bool
	// groups is, by step, the steps of the group that step starts (nil
	// for the others): a run of consecutive matmuls by quantized weights
	// of one type over the same activations (a decoder's q, k and v
	// projections), which execute may run as one product (qmatmulGroup).
	// The slice is nil when the plan has no group.
	groups [][]int
}

// maxGroup bounds a group's products (bd_qgemm_multi's BD_QGEMM_PARTS).
const maxGroup = 8

// groupable says whether step s may join a group of quantized products
// over x: no activation, no residual, TransB weights of type dt.
func groupable(s *runtime.Step, ss *stepSlots, x int, dt runtime.DType) bool {
	return s.Op.Kind == runtime.OpMatMul && s.Op.TransB && s.Op.Act == runtime.ActNone && len(s.In) <= 3 &&
		s.In[1].DType.Quantized() && s.In[1].DType == dt && ss.in[0] == x
}

// stepSlots are a step's operands and output by slot.
type stepSlots struct {
	in  []int
	out int
}

func plan(g *runtime.Graph, bound map[string]runtime.TensorType) (*planned, error) {
	p, err := runtime.PlanGraph(g, bound)
	if err != nil {
		return nil, err
	}
	pe := &planned{plan: p, slot: map[string]int{}, nBound: len(bound), steps: make([]stepSlots, len(p.Steps))}
	id := func(name string) int {
		i, ok := pe.slot[name]
		if !ok {
			i = len(pe.names)
			pe.slot[name] = i
			pe.names = append(pe.names, name)
			pe.bound = append(pe.bound, runtime.TensorType{})
			pe.isBound = append(pe.isBound, false)
			pe.lastUse = append(pe.lastUse, -1)
			pe.otherUse = append(pe.otherUse, false)
		}
		return i
	}
	// Slots in a fixed order (the graph's, then the sorted bindings), so a
	// plan's numbering does not depend on map iteration.
	for i, s := range p.Steps {
		ss := &pe.steps[i]
		ss.in = make([]int, len(s.Op.In))
		for j, name := range s.Op.In {
			ss.in[j] = id(name)
		}
		ss.out = id(s.Op.Out)
	}
	for _, name := range slices.Sorted(maps.Keys(bound)) {
		i := id(name)
		pe.bound[i], pe.isBound[i] = bound[name], true
	}
	for i := 0; i < len(p.Steps); {
		s, ss := &p.Steps[i], &pe.steps[i]
		j := i + 1
		if s.Op.Kind == runtime.OpMatMul {
			x, dt := ss.in[0], s.In[1].DType
			written := map[int]bool{ss.out: true}
			for groupable(s, ss, x, dt) && j < len(p.Steps) && j-i < maxGroup &&
				groupable(&p.Steps[j], &pe.steps[j], x, dt) && !written[pe.steps[j].in[1]] &&
				(len(pe.steps[j].in) < 3 || !written[pe.steps[j].in[2]]) {
				written[pe.steps[j].out] = true
				j++
			}
		}
		if j-i > 1 {
			if pe.groups == nil {
				pe.groups = make([][]int, len(p.Steps))
			}
			for k := i; k < j; k++ {
				pe.groups[i] = append(pe.groups[i], k)
			}
		}
		i = j
	}
	for i, s := range p.Steps {
		ss := pe.steps[i]
		pe.otherUse[ss.out] = true
		for j, in := range ss.in {
			pe.lastUse[in] = i
			// A block-quantized gather table is read in either layout
			// (qgather), so a tied embedding stays relaid for its matmul.
			if (s.Op.Kind != runtime.OpMatMul || j != 1) && !(s.Op.Kind == runtime.OpGather && j == 0 && s.In[0].DType.Quantized()) {
				pe.otherUse[in] = true
			}
		}
	}
	return pe, nil
}

// execute runs a plan on the worker thread; bufs are the bound buffers by
// slot (nil for intermediates).
func (d *Device) execute(ctx context.Context, pe *planned, bufs []*buffer) error {
	p := pe.plan
	// The live intermediates' memory and sizes by slot.
	temps, sizes := make([]unsafe.Pointer, len(pe.names)), make([]int64, len(pe.names))
	defer func() {
		for i, t := range temps {
			if t != nil {
				d.freeTemp(t, sizes[i])
			}
		}
	}()
	ptrs := make([]unsafe.Pointer, len(pe.names))
	for i, b := range bufs {
		if b != nil {
			ptrs[i] = b.ptr
		}
	}
	// Weights: bound buffers the run reads only as a matmul's right
	// operand, which that matmul may pack in place. Any other use needs
	// row-major contents.
	rc := &runContext{weights: make([]*buffer, len(pe.names)), bound: bufs, rope: map[ropeKey]*buffer{}}
	defer func() {
		for _, b := range rc.rope {
			d.Free(b)
		}
	}()
	var unpack []int // packed by an earlier run, used otherwise in this one
	d.mu.Lock()
	for i := range p.Steps {
		if p.Steps[i].Op.Kind == runtime.OpMatMul {
			w := pe.steps[i].in[1]
			if b := bufs[w]; b != nil && !pe.otherUse[w] && !b.rowMajorOnly {
				rc.weights[w] = b
			}
		}
	}
	for i, b := range bufs {
		if b != nil && pe.otherUse[i] && (b.packed != nil || b.x16) {
			unpack = append(unpack, i)
		}
	}
	d.mu.Unlock()
	for _, id := range unpack {
		if err := d.unpack(bufs[id]); err != nil {
			return fmt.Errorf("onednn: run on %s: %q back to row-major: %w", d.id, pe.names[id], err)
		}
	}
	var done []bool // steps a group has run
	if pe.groups != nil {
		done = make([]bool, len(p.Steps))
	}
	for i := range p.Steps {
		s, ss := &p.Steps[i], &pe.steps[i]
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("onednn: run on %s: before %s: %w", d.id, s, err)
		}
		if done != nil && done[i] {
			d.freeAfter(pe, i, temps, sizes)
			continue
		}
		if s.Op.Kind == runtime.OpReshape {
			// A reshape of an intermediate read by nothing later takes
			// its buffer over rather than copying it.
			from := ss.in[0]
			if t := temps[from]; t != nil && pe.lastUse[from] == i && bufs[ss.out] == nil {
				temps[ss.out], sizes[ss.out] = t, sizes[from]
				temps[from] = nil
				ptrs[ss.out] = t
				continue
			}
		}
		group := []int{i}
		if pe.groups != nil && pe.groups[i] != nil {
			group = pe.groups[i]
		}
		for _, j := range group { // a group's outputs are all written at its first step
			s, out := &p.Steps[j], pe.steps[j].out
			if bufs[out] != nil || temps[out] != nil {
				continue
			}
			t, size, err := d.allocTemp(s.Out.DType, s.Out.Shape)
			if err != nil {
				return fmt.Errorf("onednn: run on %s: intermediate %q of %s: %w", d.id, s.Op.Out, s, err)
			}
			temps[out], sizes[out] = t, size
			ptrs[out] = t
		}
		if len(group) > 1 {
			ran, err := d.runGroup(p, pe, group, ptrs, rc)
			if err != nil {
				return fmt.Errorf("onednn: run on %s: %w", d.id, err)
			}
			if ran {
				for _, j := range group {
					done[j] = true
				}
				d.freeAfter(pe, i, temps, sizes)
				continue
			}
		}
		if err := d.runStep(s, ss, ptrs, rc); err != nil {
			return fmt.Errorf("onednn: run on %s: %w", d.id, err)
		}
		d.freeAfter(pe, i, temps, sizes)
	}
	return nil
}

// freeAfter returns the intermediates no step after step i reads, so the
// next op's output can reuse their memory.
func (d *Device) freeAfter(pe *planned, i int, temps []unsafe.Pointer, sizes []int64) {
	for _, id := range pe.steps[i].in {
		if t := temps[id]; t != nil && pe.lastUse[id] == i {
			d.freeTemp(t, sizes[id])
			temps[id] = nil
		}
	}
}

// runGroup runs a group of quantized products as one call where
// qmatmulGroup can, reporting whether it did. Running them at once is
// the same as one by one: no product reads another's output (plan), and
// no output can share a bound buffer with what another reads, as a
// buffer has one type and shape (f32 [M,N] against the shared x, which
// Run refuses to see written, block-quantized weights and [N] biases).
func (d *Device) runGroup(p *runtime.Plan, pe *planned, group []int, ptrs []unsafe.Pointer, rc *runContext) (bool, error) {
	steps := make([]*runtime.Step, len(group))
	ws, biases, ys := make([]unsafe.Pointer, len(group)), make([]unsafe.Pointer, len(group)), make([]unsafe.Pointer, len(group))
	wbs := make([]*buffer, len(group))
	for k, j := range group {
		steps[k] = &p.Steps[j]
		ss := &pe.steps[j]
		ws[k], ys[k], wbs[k] = ptrs[ss.in[1]], ptrs[ss.out], rc.weights[ss.in[1]]
		if len(ss.in) == 3 {
			biases[k] = ptrs[ss.in[2]]
		}
	}
	return d.qmatmulGroup(steps, ptrs[pe.steps[group[0]].in[0]], ws, wbs, biases, ys)
}

// eltwiseAlg maps an activation to oneDNN's eltwise algorithm; GELU is the
// erf form, as BERT uses.
func eltwiseAlg(a runtime.Activation) C.dnnl_alg_kind_t {
	switch a {
	case runtime.ActReLU:
		return C.dnnl_eltwise_relu
	case runtime.ActGELU:
		return C.dnnl_eltwise_gelu_erf
	case runtime.ActTanh:
		return C.dnnl_eltwise_tanh
	}
	return C.dnnl_alg_kind_undef
}

func dnnlType(dt runtime.DType) C.dnnl_data_type_t {
	if dt == runtime.BF16 {
		return C.dnnl_bf16
	}
	return C.dnnl_f32
}

// primitive returns the cached primitive for key, creating it with create.
func (d *Device) primitive(s *runtime.Step, key primKey, create func(out **C.bd_prim, step **C.char) C.dnnl_status_t) (*C.bd_prim, error) {
	missed := false
	p, err := d.prims.get(key, func() (*C.bd_prim, error) {
		missed = true
		start := time.Now()
		var p *C.bd_prim
		var where *C.char
		if st := create(&p, &where); st != C.dnnl_success {
			return nil, fmt.Errorf("%s: %w", s, statusError(where, st))
		}
		d.create.Observe(time.Since(start).Seconds())
		return p, nil
	})
	if missed {
		d.miss.Inc()
	} else {
		d.hit.Inc()
	}
	return p, err
}

// exec runs a primitive on the given arguments, in its creation order.
func (d *Device) exec(s *runtime.Step, p *C.bd_prim, args ...unsafe.Pointer) error {
	var h [C.BD_MAX_ARGS]unsafe.Pointer
	copy(h[:], args)
	var where *C.char
	if st := C.bd_exec(d.c, p, h[0], h[1], h[2], h[3], h[4], &where); st != C.dnnl_success {
		return fmt.Errorf("%s: %w", s, statusError(where, st))
	}
	return nil
}

// runContext is what runStep knows of the whole run.
type runContext struct {
	weights []*buffer // by slot: bound buffers the run reads only as matmul weights
	// (or, block-quantized, as gather tables)
	bound []*buffer // by slot: the bound buffers (nil for intermediates)
	// rope holds the RoPE tables of the run: a decoder's every layer
	// rotates q and k by the same positions, and computing their sines
	// and cosines in every op was a quarter of OpRoPE's time
	// (BenchmarkRoPEPrefill).
	rope map[ropeKey]*buffer
}

// ropeKey names a RoPE table by its operands' names: the planner lets no
// op write a buffer that an earlier op reads, so once a RoPE has read
// them they stay as they are for the rest of the run.
type ropeKey struct {
	pos, invFreq string
	t, half      int
}

// runStep runs one op: a cached oneDNN primitive, or a C kernel for the ops
// oneDNN has none for.
func (d *Device) runStep(s *runtime.Step, ss *stepSlots, ptrs []unsafe.Pointer, rc *runContext) error {
	op := s.Op
	in := func(i int) unsafe.Pointer { return ptrs[ss.in[i]] }
	out := ptrs[ss.out]
	dc := d.c

	switch op.Kind {
	case runtime.OpMatMul:
		if s.In[1].DType.Quantized() {
			var bias unsafe.Pointer
			if len(op.In) >= 3 {
				bias = in(2)
			}
			return d.qmatmul(s, in(0), in(1), rc.weights[ss.in[1]], bias, out)
		}
		a := s.In[0]
		k := a.Last()
		w := rc.weights[ss.in[1]]
		isWeight := w != nil
		if d.gemv16(s) {
			if isWeight {
				if err := d.unpack(w); err != nil {
					return fmt.Errorf("%s: %w", s, err)
				}
			}
			return d.runGemv16(s, in, out)
		}
		key := primKey{kind: op.Kind, dt: a.DType, outDT: s.Out.DType, m: a.NumElements() / k, k: k, n: s.Out.Last(),
			transB: op.TransB, bias: len(op.In) >= 3, res: len(op.In) == 4, act: op.Act, pack: isWeight && !d.gemv16Weights(s)}
		if key.pack && d.unpackable[key] {
			key.pack = false
		}
		p, err := d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
			return C.bd_matmul_create(dc, 0, C.int64_t(key.m), C.int64_t(key.k), C.int64_t(key.n),
				cbool(key.transB), dnnlType(key.dt), dnnlType(key.outDT), cbool(key.bias), eltwiseAlg(key.act), 1,
				cbool(key.res), cbool(key.pack), o, w)
		})
		if err != nil {
			return err
		}
		if p.wpack != 0 {
			packed, err := d.packWeights(s, p, w)
			if err != nil {
				return err
			}
			if !packed {
				// The packed layout pads beyond the buffer's allocation: a
				// primitive that reads row-major weights, from now on.
				d.unpackable[key] = true
				key.pack = false
				if p, err = d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
					return C.bd_matmul_create(dc, 0, C.int64_t(key.m), C.int64_t(key.k), C.int64_t(key.n),
						cbool(key.transB), dnnlType(key.dt), dnnlType(key.outDT), cbool(key.bias), eltwiseAlg(key.act), 1,
						cbool(key.res), 0, o, w)
				}); err != nil {
					return err
				}
			}
		}
		switch {
		case key.res:
			return d.exec(s, p, in(0), in(1), in(2), in(3), out)
		case key.bias:
			return d.exec(s, p, in(0), in(1), in(2), out)
		}
		return d.exec(s, p, in(0), in(1), out)

	case runtime.OpBatchMatMul:
		a := s.In[0]
		r := len(a.Shape)
		scale := op.Scale
		if scale == 0 {
			scale = 1
		}
		key := primKey{kind: op.Kind, dt: a.DType, outDT: s.Out.DType, m: a.Shape[r-2], k: a.Shape[r-1], n: s.Out.Last(),
			transB: op.TransB, scale: scale}
		key.batch = a.NumElements() / (key.m * key.k)
		p, err := d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
			return C.bd_matmul_create(dc, C.int64_t(key.batch), C.int64_t(key.m), C.int64_t(key.k), C.int64_t(key.n),
				cbool(key.transB), dnnlType(key.dt), dnnlType(key.outDT), 0, C.dnnl_alg_kind_undef, C.float(key.scale), 0, 0, o, w)
		})
		if err != nil {
			return err
		}
		return d.exec(s, p, in(0), in(1), out)

	case runtime.OpAttention:
		return d.attention(s, in(0), in(1), out)

	case runtime.OpAdd:
		if slices.Equal(s.In[0].Shape, s.In[1].Shape) {
			// A residual: a loop, not a oneDNN binary primitive, whose
			// execution cost several microseconds on a decode step's rows.
			C.bd_add(dc, (*C.float)(in(0)), (*C.float)(in(1)), C.int64_t(s.In[0].NumElements()), (*C.float)(out))
			return nil
		}
		n := s.In[0].Last()
		key := primKey{kind: op.Kind, m: s.In[0].NumElements() / n, n: n, bcast: true}
		p, err := d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
			return C.bd_add_create(dc, C.int64_t(key.m), C.int64_t(key.n), cbool(key.bcast), o, w)
		})
		if err != nil {
			return err
		}
		return d.exec(s, p, in(0), in(1), out)

	case runtime.OpLayerNorm:
		n := s.In[0].Last()
		key := primKey{kind: op.Kind, m: s.In[0].NumElements() / n, n: n, eps: op.Eps}
		p, err := d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
			return C.bd_layernorm_create(dc, C.int64_t(key.m), C.int64_t(key.n), C.float(key.eps), o, w)
		})
		if err != nil {
			return err
		}
		return d.exec(s, p, in(0), in(1), in(2), out)

	case runtime.OpSoftmax:
		n := s.In[0].Last()
		key := primKey{kind: op.Kind, m: s.In[0].NumElements() / n, n: n}
		p, err := d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
			return C.bd_softmax_create(dc, C.int64_t(key.m), C.int64_t(key.n), o, w)
		})
		if err != nil {
			return err
		}
		return d.exec(s, p, in(0), out)

	case runtime.OpGELU, runtime.OpReLU, runtime.OpTanh:
		act := map[runtime.OpKind]runtime.Activation{
			runtime.OpGELU: runtime.ActGELU, runtime.OpReLU: runtime.ActReLU, runtime.OpTanh: runtime.ActTanh,
		}[op.Kind]
		key := primKey{kind: op.Kind, m: s.In[0].NumElements(), act: act}
		p, err := d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
			return C.bd_eltwise_create(dc, C.int64_t(key.m), eltwiseAlg(key.act), 0, o, w)
		})
		if err != nil {
			return err
		}
		return d.exec(s, p, in(0), out)

	case runtime.OpGather:
		table, idx := s.In[0], s.In[1]
		n := idx.NumElements()
		if table.DType.Quantized() {
			pos, err := d.qgather(s, in(0), rc.bound[ss.in[0]], in(1), out)
			if err != nil {
				return err
			}
			if pos >= 0 {
				return fmt.Errorf("%w: %s: index %d at position %d is outside the table's %d rows",
					runtime.ErrInvalidGraph, s, unsafe.Slice((*int32)(in(1)), n)[pos], pos, table.Shape[0])
			}
			return nil
		}
		pos := C.bd_gather(dc, in(0), C.int64_t(table.Shape[0]), C.int64_t(table.Shape[1]), C.int64_t(table.DType.Size()),
			(*C.int32_t)(in(1)), C.int64_t(n), out)
		if pos >= 0 {
			bad := unsafe.Slice((*int32)(in(1)), n)[pos]
			return fmt.Errorf("%w: %s: index %d at position %d is outside the table's %d rows",
				runtime.ErrInvalidGraph, s, bad, int64(pos), table.Shape[0])
		}
		return nil

	case runtime.OpMaskedMeanPool:
		x := s.In[0]
		C.bd_masked_mean_pool(dc, (*C.float)(in(0)), in(1), cbool(s.In[1].DType == runtime.I32),
			C.int64_t(x.Shape[0]), C.int64_t(x.Shape[1]), C.int64_t(x.Shape[2]), (*C.float)(out))
		return nil

	case runtime.OpL2Normalize:
		n := s.In[0].Last()
		C.bd_l2_normalize(dc, (*C.float)(in(0)), C.int64_t(s.In[0].NumElements()/n), C.int64_t(n), (*C.float)(out))
		return nil

	case runtime.OpPermute:
		view := s.In[0].Shape
		if op.Shape != nil {
			view = op.Shape
		}
		key := primKey{kind: op.Kind, dt: s.In[0].DType, layout: fmt.Sprint(view, op.Perm)}
		p, err := d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
			var dims [runtime.MaxPermuteDims]C.int64_t
			var perm [runtime.MaxPermuteDims]C.int
			for i := range view {
				dims[i], perm[i] = C.int64_t(view[i]), C.int(op.Perm[i])
			}
			return C.bd_permute_create(dc, C.int(len(view)), &dims[0], &perm[0], dnnlType(key.dt), o, w)
		})
		if err != nil {
			return err
		}
		return d.exec(s, p, in(0), out)

	case runtime.OpReshape:
		C.bd_copy(dc, in(0), out, C.int64_t(s.In[0].NumElements()*s.In[0].DType.Size()))
		return nil

	case runtime.OpMaskedSoftmax:
		x := s.In[0]
		n := x.Last()
		rows := x.NumElements() / n
		C.bd_mask_fill(dc, (*C.float)(in(0)), in(1), cbool(s.In[1].DType == runtime.I32),
			C.int64_t(x.Shape[0]), C.int64_t(rows), C.int64_t(n), (*C.float)(out))
		// The same primitive as OpSoftmax of this shape, run in place.
		key := primKey{kind: runtime.OpSoftmax, m: rows, n: n}
		p, err := d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
			return C.bd_softmax_create(dc, C.int64_t(key.m), C.int64_t(key.n), o, w)
		})
		if err != nil {
			return err
		}
		return d.exec(s, p, out, out)

	case runtime.OpConvert:
		from, to := s.In[0].DType, s.Out.DType
		n := s.In[0].NumElements()
		if from == to {
			C.bd_copy(dc, in(0), out, C.int64_t(n*from.Size()))
			return nil
		}
		key := primKey{kind: op.Kind, dt: from, m: n, layout: to.String()}
		p, err := d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
			return C.bd_convert_create(dc, C.int64_t(n), dnnlType(from), dnnlType(to), o, w)
		})
		if err != nil {
			return err
		}
		return d.exec(s, p, in(0), out)

	case runtime.OpSiLU:
		// oneDNN's swish is x·sigmoid(αx); α = 1 is SiLU.
		key := primKey{kind: op.Kind, m: s.In[0].NumElements()}
		p, err := d.primitive(s, key, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
			return C.bd_eltwise_create(dc, C.int64_t(key.m), C.dnnl_eltwise_swish, 1, o, w)
		})
		if err != nil {
			return err
		}
		return d.exec(s, p, in(0), out)

	case runtime.OpRMSNorm:
		x := s.In[0]
		n := x.Last()
		C.bd_rms_norm(dc, in(0), cbool(x.DType == runtime.BF16), (*C.float)(in(1)),
			C.int64_t(x.NumElements()/n), C.int64_t(n), C.float(op.Eps), out)
		return nil

	case runtime.OpSwiGLU:
		x := s.In[0]
		inter := s.Out.Last()
		C.bd_swiglu(dc, in(0), cbool(x.DType == runtime.BF16), C.int64_t(x.NumElements()/(2*inter)), C.int64_t(inter), out)
		return nil

	case runtime.OpRoPE:
		x := s.In[0]
		t, half := x.Shape[0], x.Shape[2]/2
		key := ropeKey{op.In[1], op.In[2], t, half}
		tab := rc.rope[key]
		if tab == nil {
			var err error
			if tab, err = d.alloc(runtime.F32, []int{t, 2 * half}); err != nil {
				return fmt.Errorf("%s: rotation table: %w", s, err)
			}
			C.bd_rope_table(dc, (*C.int32_t)(in(1)), (*C.float)(in(2)), C.int64_t(t), C.int64_t(half), (*C.float)(tab.ptr))
			rc.rope[key] = tab
		}
		C.bd_rope(dc, in(0), cbool(x.DType == runtime.BF16), (*C.float)(tab.ptr),
			C.int64_t(t), C.int64_t(x.Shape[1]), C.int64_t(x.Shape[2]), out)
		return nil

	case runtime.OpKVWrite:
		x, cache := s.In[0], s.Out
		t := x.Shape[0]
		nslots := cache.Shape[0] * cache.Shape[1]
		var pos C.int64_t
		if runtime.KVStoreType(cache.DType) {
			pos = C.bd_kv_write_q(dc, kvType(cache.DType), in(0), cbool(x.DType == runtime.BF16), (*C.int32_t)(in(1)), C.int64_t(t),
				C.int64_t(x.NumElements()/t), out, C.int64_t(nslots))
		} else {
			pos = C.bd_kv_write(dc, in(0), (*C.int32_t)(in(1)), C.int64_t(t), C.int64_t(x.NumElements()/t),
				C.int64_t(x.DType.Size()), out, C.int64_t(nslots))
		}
		if pos >= 0 {
			bad := unsafe.Slice((*int32)(in(1)), t)[pos]
			return fmt.Errorf("%w: %s: slot %d of token %d is outside the cache's %d slots",
				runtime.ErrInvalidGraph, s, bad, int64(pos), nslots)
		}
		return nil

	case runtime.OpPagedAttention:
		q, kc, table := s.In[0], s.In[1], s.In[3]
		t, hq, dim := q.Shape[0], q.Shape[1], q.Shape[2]
		scale := op.Scale
		if scale == 0 {
			scale = float32(1 / math.Sqrt(float64(dim)))
		}
		var why C.int
		pos := C.bd_paged_attention(dc, in(0), cbool(q.DType == runtime.BF16), in(1), in(2), kvType(kc.DType),
			(*C.int32_t)(in(3)), (*C.int32_t)(in(4)), (*C.int32_t)(in(5)),
			C.int64_t(t), C.int64_t(hq), C.int64_t(kc.Shape[2]), C.int64_t(dim),
			C.int64_t(kc.Shape[0]), C.int64_t(kc.Shape[1]), C.int64_t(table.Shape[0]), C.int64_t(table.Shape[1]),
			C.float(scale), cbool(op.BF16Products && d.qAMXRows != 0 && qamxAvailable()), cbool(op.BF16Products), out, &why)
		if pos >= 0 {
			seq := unsafe.Slice((*int32)(in(4)), t)[pos]
			p := unsafe.Slice((*int32)(in(5)), t)[pos]
			reason := map[C.int]string{
				1: fmt.Sprintf("sequence index %d is outside the block table's %d rows", seq, table.Shape[0]),
				2: fmt.Sprintf("position %d is negative or past the %d blocks of %d a sequence may have", p, table.Shape[1], kc.Shape[1]),
				3: fmt.Sprintf("the block table row %d names a block outside the cache's %d for position %d", seq, kc.Shape[0], p),
			}[why]
			return fmt.Errorf("%w: %s: token %d: %s", runtime.ErrInvalidGraph, s, int64(pos), reason)
		}
		return nil
	}
	return fmt.Errorf("%w: %s: unknown op", runtime.ErrInvalidGraph, s)
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// kvType is a KV cache's type as bd_paged_attention takes it.
func kvType(dt runtime.DType) C.int {
	switch dt {
	case runtime.BF16:
		return C.BD_KV_BF16
	case runtime.Q8_0:
		return C.BD_KV_Q8_0
	case runtime.Q4_0:
		return C.BD_KV_Q4_0
	case runtime.F16:
		return C.BD_KV_F16
	}
	return C.BD_KV_F32
}

// attention runs OpAttention as two strided matmuls around a masked
// softmax: the heads are read in place from the fused [B,S,3·H·D]
// projection and the context is written merged into [B,S,H·D], so no
// head is ever permuted or copied. The scores live in a pooled scratch
// buffer for the op's duration.
func (d *Device) attention(s *runtime.Step, qkv, mask, out unsafe.Pointer) error {
	op := s.Op
	x := s.In[0]
	b, n, h := x.Shape[0], x.Shape[1], op.Heads
	hd := x.Last() / 3
	dh := hd / h
	es := x.DType.Size()
	scale := op.Scale
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(dh)))
	}
	dc := d.c
	i64 := func(v ...int) *C.int64_t {
		a := make([]C.int64_t, 4)
		for i := range v {
			a[i] = C.int64_t(v[i])
		}
		return &a[0]
	}
	// A head's rows in the fused projection: [b,h,s,j] at b·S·3HD + s·3HD + h·D + j.
	headStrides := func(row int) []int { return []int{n * row, dh, row, 1} }
	qs, ks := headStrides(3*hd), headStrides(3*hd)

	// The two products are told apart by transB (Q·Kᵀ, then P·V).
	qk := primKey{kind: op.Kind, dt: x.DType, outDT: runtime.F32, batch: b * h, heads: h, m: n, k: dh, n: n, transB: true, scale: scale}
	p, err := d.primitive(s, qk, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
		// Kᵀ: [b,h,j,t] at the key of token t, element j.
		return C.bd_matmul4_create(dc, i64(b, h, n, dh), i64(qs...), i64(b, h, dh, n), i64(ks[0], ks[1], ks[3], ks[2]),
			i64(b, h, n, n), i64(h*n*n, n*n, n, 1), dnnlType(x.DType), C.dnnl_f32, C.float(scale), o, w)
	})
	if err != nil {
		return err
	}
	scores, err := d.alloc(runtime.F32, []int{b, h, n, n})
	if err != nil {
		return fmt.Errorf("%s: scores: %w", s, err)
	}
	defer d.Free(scores)
	if err := d.exec(s, p, qkv, unsafe.Add(qkv, hd*es), scores.ptr); err != nil {
		return err
	}
	C.bd_mask_fill(dc, (*C.float)(scores.ptr), mask, cbool(s.In[1].DType == runtime.I32),
		C.int64_t(b), C.int64_t(b*h*n), C.int64_t(n), (*C.float)(scores.ptr))

	probs := scores
	if x.DType == runtime.BF16 {
		if probs, err = d.alloc(runtime.BF16, []int{b, h, n, n}); err != nil {
			return fmt.Errorf("%s: probabilities: %w", s, err)
		}
		defer d.Free(probs)
	}
	// dt and outDT set: not the plain softmax's primitive (those leave them 0).
	sm := primKey{kind: runtime.OpSoftmax, dt: runtime.F32, outDT: x.DType, m: b * h * n, n: n}
	if p, err = d.primitive(s, sm, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
		return C.bd_softmax_to_create(dc, C.int64_t(sm.m), C.int64_t(sm.n), dnnlType(sm.outDT), o, w)
	}); err != nil {
		return err
	}
	if err := d.exec(s, p, scores.ptr, probs.ptr); err != nil {
		return err
	}

	pv := primKey{kind: op.Kind, dt: x.DType, outDT: s.Out.DType, batch: b * h, heads: h, m: n, k: n, n: dh}
	if p, err = d.primitive(s, pv, func(o **C.bd_prim, w **C.char) C.dnnl_status_t {
		return C.bd_matmul4_create(dc, i64(b, h, n, n), i64(h*n*n, n*n, n, 1), i64(b, h, n, dh), i64(qs...),
			i64(b, h, n, dh), i64(n*hd, dh, hd, 1), dnnlType(x.DType), dnnlType(s.Out.DType), 1, o, w)
	}); err != nil {
		return err
	}
	return d.exec(s, p, probs.ptr, unsafe.Add(qkv, 2*hd*es), out)
}
