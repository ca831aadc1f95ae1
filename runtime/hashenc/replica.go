package hashenc

import (
	"context"
	"errors"
	"fmt"
	"math"
	goruntime "runtime"
	"sync"

	"github.com/brokerd/brokerd/runtime"
)

// ErrClosed is returned by Execute on a closed replica.
var ErrClosed = errors.New("hashenc: replica closed")

// ErrInexactDevice means a device's float32 matmul did not reproduce the
// exact integer result, so its vectors would not be bit-for-bit stable.
var ErrInexactDevice = errors.New("hashenc: device matmul is not exact in float32")

// Buffer names of the device graphs.
const (
	bufX = "x" // [rows, Dim] quantised sparse projections
	bufW = "w" // [Dim, Dim] dense projection, resident
	bufY = "y" // [rows, Dim] x·w
	bufZ = "z" // [rows, Dim] y, L2-normalised
)

// Replica is the model on one opened device. It implements the scheduler's
// executor; Execute may be called concurrently.
type Replica struct {
	m   *Model
	dev runtime.Device

	project   runtime.Graph // y = x·w
	normalize runtime.Graph // y = x·w, z = l2norm(y)

	// deviceNorm is set by the self-check: the device normalises exactly as
	// l2NormalizeRow does.
	deviceNorm bool

	mu sync.RWMutex   // Close against running batches
	w  runtime.Buffer // resident weights; nil once closed
}

// NewReplica uploads the weights to dev, where they stay until Close. It
// fails when the device's budget refuses the weights or a full batch's
// workspace, or when the device's matmul is not exact (ErrInexactDevice).
func (m *Model) NewReplica(ctx context.Context, dev runtime.Device) (*Replica, error) {
	w, err := dev.Alloc(runtime.F32, Dim, Dim)
	if err != nil {
		return nil, fmt.Errorf("hashenc: weights on %s: %w", dev.ID(), err)
	}
	if err := dev.CopyIn(ctx, w, m.w); err != nil {
		dev.Free(w)
		return nil, fmt.Errorf("hashenc: weights on %s: %w", dev.ID(), err)
	}
	matmul := runtime.Op{Kind: runtime.OpMatMul, In: []string{bufX, bufW}, Out: bufY}
	r := &Replica{
		m:         m,
		dev:       dev,
		w:         w,
		project:   runtime.Graph{Ops: []runtime.Op{matmul}},
		normalize: runtime.Graph{Ops: []runtime.Op{matmul, {Kind: runtime.OpL2Normalize, In: []string{bufY}, Out: bufZ}}},
	}
	if err := r.admitWorkspace(); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.selfCheck(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// admitWorkspace allocates and frees a full batch's buffers, so a budget
// too small for them refuses the replica now rather than a batch later.
func (r *Replica) admitWorkspace() error {
	var bufs []runtime.Buffer
	defer func() {
		for _, b := range bufs {
			r.dev.Free(b)
		}
	}()
	for range 3 { // x, y, z
		b, err := r.dev.Alloc(runtime.F32, MaxBatch, Dim)
		if err != nil {
			return fmt.Errorf("hashenc: workspace on %s: %w", r.dev.ID(), err)
		}
		bufs = append(bufs, b)
	}
	return nil
}

// selfCheck runs probe rows whose exact product needs all of float32's 24
// bits and compares them with the host's integer result: a device that
// computes the matmul in bf16 or tf32 fails. It then compares the device's
// L2 normalisation of those rows with the package's recipe (float64 sum of
// squares, IEEE sqrt and division), and normalises on the host when they
// differ, so that a vector never depends on which device encoded it.
func (r *Replica) selfCheck(ctx context.Context) error {
	const rows = 2
	x := make([]float32, rows*Dim)
	want := make([][Dim]float32, rows)
	rng := splitmix64{state: seed ^ 0x5c}
	for i, mag := range [rows]uint64{MaxL1 / Dim, 1 << 10} {
		var q [Dim]int32
		for k := range q {
			v := int32(rng.below(mag)) | 1
			if rng.next()&1 == 1 {
				v = -v
			}
			q[k] = v
			x[i*Dim+k] = float32(v)
		}
		want[i] = r.m.matmulExact(&q)
	}
	y, z, err := r.runRows(ctx, x, rows, true)
	if err != nil {
		return fmt.Errorf("hashenc: self-check on %s: %w", r.dev.ID(), err)
	}
	r.deviceNorm = true
	for i := range rows {
		wantZ := l2NormalizeRow(want[i][:])
		for j := range Dim {
			if got := y[i*Dim+j]; got != want[i][j] {
				return fmt.Errorf("%w: %s gave %v for dimension %d of probe %d, want %v",
					ErrInexactDevice, r.dev.ID(), got, j, i, want[i][j])
			}
			if math.Float32bits(z[i*Dim+j]) != math.Float32bits(wantZ[j]) {
				r.deviceNorm = false
			}
		}
	}
	return nil
}

// NormalizesOnDevice reports whether the device's OpL2Normalize follows the
// package's recipe bit for bit (on the self-check's probes), so normalised
// vectors are computed there; otherwise the replica normalises on the host.
func (r *Replica) NormalizesOnDevice() bool { return r.deviceNorm }

// Close frees the device buffers. It is idempotent and waits for running
// batches.
func (r *Replica) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w != nil {
		r.dev.Free(r.w)
		r.w = nil
	}
	return nil
}

// Execute encodes a batch: each input must be an Input, and each output is
// a []float32 of length Dim. A vector does not depend on the other items of
// the batch.
func (r *Replica) Execute(ctx context.Context, inputs []any) ([]any, error) {
	items := make([]Input, len(inputs))
	for i, in := range inputs {
		v, ok := in.(Input)
		if !ok {
			return nil, fmt.Errorf("%w: input %d is %T, want hashenc.Input", ErrBadInput, i, in)
		}
		items[i] = v
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.w == nil {
		return nil, ErrClosed
	}
	out := make([]any, len(items))
	for start := 0; start < len(items); start += MaxBatch {
		end := min(start+MaxBatch, len(items))
		if err := r.encode(ctx, items[start:end], out[start:end]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// encode runs at most MaxBatch items on the device.
func (r *Replica) encode(ctx context.Context, items []Input, out []any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Pad to a power of two so the device's pool sees few buffer sizes;
	// zero rows change nothing in the others.
	rows := 1
	for rows < len(items) {
		rows *= 2
	}
	x := make([]float32, rows*Dim)
	shifts := make([]int, len(items))
	anyNorm := false
	featurizeRows(items, x, shifts)
	for _, it := range items {
		anyNorm = anyNorm || it.Normalize
	}
	y, z, err := r.runRows(ctx, x, rows, anyNorm && r.deviceNorm)
	if err != nil {
		return fmt.Errorf("hashenc: %d items on %s: %w", len(items), r.dev.ID(), err)
	}
	for i, it := range items {
		switch {
		case it.Normalize && r.deviceNorm:
			out[i] = z[i*Dim : (i+1)*Dim : (i+1)*Dim]
		case it.Normalize:
			out[i] = l2NormalizeRow(y[i*Dim : (i+1)*Dim])
		default:
			out[i] = scaleRow(y[i*Dim:(i+1)*Dim], shifts[i])
		}
	}
	return nil
}

// featurizeRows fills x's first rows with the items' quantised projections,
// on up to GOMAXPROCS goroutines (featurizing is the host's share of the
// work and each item is independent).
func featurizeRows(items []Input, x []float32, shifts []int) {
	one := func(i int) {
		q, s := items[i].row, items[i].shift
		if q == nil {
			q, s = project(items[i].Data)
		}
		row := x[i*Dim : (i+1)*Dim]
		for k := range q { // not k, v: that would copy q
			row[k] = float32(q[k])
		}
		shifts[i] = s
	}
	unprepared := 0
	for i := range items {
		if items[i].row == nil {
			unprepared++
		}
	}
	workers := min(goruntime.GOMAXPROCS(0), unprepared)
	if workers <= 1 {
		for i := range items {
			one(i)
		}
		return
	}
	var wg sync.WaitGroup
	per := (len(items) + workers - 1) / workers
	for start := 0; start < len(items); start += per {
		end := min(start+per, len(items))
		wg.Go(func() {
			for i := start; i < end; i++ {
				one(i)
			}
		})
	}
	wg.Wait()
}

// runRows runs x [rows, Dim] through the device, returning y = x·w and, when
// norm is set, z = l2norm(y) (otherwise nil).
func (r *Replica) runRows(ctx context.Context, x []float32, rows int, norm bool) (y, z []float32, err error) {
	var bufs []runtime.Buffer
	defer func() {
		for _, b := range bufs {
			r.dev.Free(b)
		}
	}()
	alloc := func() (runtime.Buffer, error) {
		b, err := r.dev.Alloc(runtime.F32, rows, Dim)
		if err == nil {
			bufs = append(bufs, b)
		}
		return b, err
	}
	xb, err := alloc()
	if err != nil {
		return nil, nil, err
	}
	yb, err := alloc()
	if err != nil {
		return nil, nil, err
	}
	if err := r.dev.CopyIn(ctx, xb, x); err != nil {
		return nil, nil, err
	}
	bind := map[string]runtime.Buffer{bufX: xb, bufW: r.w, bufY: yb}
	g := &r.project
	var zb runtime.Buffer
	if norm {
		if zb, err = alloc(); err != nil {
			return nil, nil, err
		}
		bind[bufZ] = zb
		g = &r.normalize
	}
	if err := r.dev.Run(ctx, g, bind); err != nil {
		return nil, nil, err
	}
	y = make([]float32, rows*Dim)
	if err := r.dev.CopyOut(ctx, y, yb); err != nil {
		return nil, nil, err
	}
	if norm {
		z = make([]float32, rows*Dim)
		if err := r.dev.CopyOut(ctx, z, zb); err != nil {
			return nil, nil, err
		}
	}
	return y, z, nil
}
