package onednn

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

func TestOpen(t *testing.T) {
	tests := []struct {
		name    string
		spec    runtime.DeviceSpec
		wantErr string
	}{
		{"defaults", runtime.DeviceSpec{}, ""},
		{"one thread", runtime.DeviceSpec{ID: "cpu:0", Threads: 1}, ""},
		{"gpu", runtime.DeviceSpec{ID: "gpu:0"}, "not a CPU device"},
		{"negative threads", runtime.DeviceSpec{ID: "cpu:0", Threads: -1}, "negative thread count"},
		{"i32 compute", runtime.DeviceSpec{DType: runtime.I32}, "not supported"},
	}
	a := New(Options{})
	if a.Name() != "onednn" {
		t.Errorf("Name() = %q", a.Name())
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dev, err := a.Open(t.Context(), tt.spec)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			if want := tt.spec.ID; want != "" && dev.ID() != want {
				t.Errorf("ID() = %q, want %q", dev.ID(), want)
			}
			if tt.spec.ID == "" && dev.ID() != "cpu:0" {
				t.Errorf("ID() = %q, want cpu:0", dev.ID())
			}
			if tt.spec.Threads > 0 && dev.(*Device).Threads() != tt.spec.Threads {
				t.Errorf("Threads() = %d, want %d", dev.(*Device).Threads(), tt.spec.Threads)
			}
		})
	}
	t.Run("cancelled context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := a.Open(ctx, runtime.DeviceSpec{}); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	})
}

func TestAllocErrors(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	tests := []struct {
		name  string
		dt    runtime.DType
		shape []int
		want  string
	}{
		{"no dimensions", runtime.F32, nil, "no dimensions"},
		{"zero dimension", runtime.F32, []int{3, 0}, "dimension 1 is 0"},
		{"negative dimension", runtime.F32, []int{-2}, "dimension 0 is -2"},
		{"overflow", runtime.F32, []int{1 << 40, 1 << 40}, "too many elements"},
		{"unknown type", runtime.DType(99), []int{3}, "not supported"},
		{"part of a block", runtime.Q4_K, []int{3}, "not whole blocks of 256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := d.Alloc(tt.dt, tt.shape...); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	if used := d.MemoryUsed(); used != 0 {
		t.Errorf("MemoryUsed = %d after failed allocations", used)
	}
}

func TestBudget(t *testing.T) {
	const budget = 4096
	d := openTest(t, runtime.DeviceSpec{Budget: budget})
	ctx := t.Context()

	a, err := d.Alloc(runtime.F32, 512) // 2048 bytes
	if err != nil {
		t.Fatal(err)
	}
	if a.Bytes() != 2048 || d.MemoryUsed() != 2048 {
		t.Fatalf("Bytes() = %d, MemoryUsed = %d, want 2048", a.Bytes(), d.MemoryUsed())
	}
	if b, err := d.Alloc(runtime.F32, 3); err != nil || b.Bytes() != 64 {
		t.Fatalf("small alloc: %v, %v (rounded to 64 bytes)", b, err)
	} else {
		d.Free(b)
	}
	_, err = d.Alloc(runtime.F32, 600) // 2432 bytes: 2048 + 64 + 2432 > 4096
	if !errors.Is(err, runtime.ErrOutOfMemory) {
		t.Fatalf("err = %v, want ErrOutOfMemory", err)
	}
	if want := "need 2432 bytes, 2112 of 4096 in use"; !strings.Contains(err.Error(), want) {
		t.Errorf("err = %q, want it to say %q", err, want)
	}

	// Pooled memory counts as used but gives way to a new size that needs it.
	d.Free(a)
	if d.MemoryUsed() != 2112 {
		t.Fatalf("MemoryUsed = %d after Free, want 2112 (pooled)", d.MemoryUsed())
	}
	c, err := d.Alloc(runtime.F32, 1024) // the whole budget: fits once both pooled buffers are released
	if err != nil {
		t.Fatalf("alloc after releasing the pool: %v", err)
	}
	if d.MemoryUsed() != budget {
		t.Errorf("MemoryUsed = %d, want %d", d.MemoryUsed(), budget)
	}
	d.Free(c)

	// A graph whose intermediates do not fit fails with ErrOutOfMemory and
	// returns the intermediates it did allocate to the pool.
	x, err := d.Alloc(runtime.F32, 16, 20) // 1280 bytes
	if err != nil {
		t.Fatal(err)
	}
	y, err := d.Alloc(runtime.F32, 16, 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.CopyIn(ctx, x, make([]float32, 320)); err != nil {
		t.Fatal(err)
	}
	g := &runtime.Graph{Ops: []runtime.Op{
		{Kind: runtime.OpReLU, In: []string{"x"}, Out: "t1"},
		{Kind: runtime.OpTanh, In: []string{"t1"}, Out: "t2"},
		{Kind: runtime.OpAdd, In: []string{"t1", "t2"}, Out: "y"}, // t1 and t2 live at once: 5120 bytes in all
	}}
	err = d.Run(ctx, g, map[string]runtime.Buffer{"x": x, "y": y})
	if !errors.Is(err, runtime.ErrOutOfMemory) {
		t.Fatalf("Run err = %v, want ErrOutOfMemory", err)
	}
	d.mu.Lock()
	live, inUse := len(d.live), d.used-d.pooled
	d.mu.Unlock()
	if live != 2 || inUse != 2*1280 {
		t.Errorf("%d live buffers of %d bytes outside the pool after a failed run, want 2 (x and y) of 2560", live, inUse)
	}
	if got := d.MemoryUsed(); got > budget {
		t.Errorf("MemoryUsed = %d, over the budget %d", got, budget)
	}
}

func TestPoolReuse(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	c := newEncoderCase(r, 2, 17, 64, 100)
	var first uint64
	for i := 0; i < 5; i++ {
		got, err := runGraph(t, d, encoderGraph(), c.ins, "y", []int{c.b, c.s, c.n})
		if err != nil {
			t.Fatal(err)
		}
		checkClose(t, got, c.want, tolF32)
		if i == 0 {
			first = d.MemoryUsed()
			if first == 0 {
				t.Fatal("MemoryUsed = 0 after a run: freed buffers should stay pooled")
			}
		} else if used := d.MemoryUsed(); used != first {
			t.Fatalf("run %d: MemoryUsed = %d, want %d as after the first run", i, used, first)
		}
	}
	n, hits, misses := d.prims.stats()
	// Four primitives (matmul, layer-norm, gelu, softmax; the residual add
	// is bd_add, not a primitive), created once, and a fifth once: the
	// matmul with packed weights, whose layout pads n=100 beyond the
	// weights' allocation, so row-major weights are read.
	if misses != 5 || n != 5 || hits != 16 {
		t.Errorf("primitive cache: %d entries, %d hits, %d misses; want 5, 16, 5", n, hits, misses)
	}
}

func TestPrimitiveCacheBound(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	dev, err := New(Options{CacheSize: 2, Registerer: reg}).Open(t.Context(), runtime.DeviceSpec{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	d := dev.(*Device)
	r := newRand(t)
	g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpTanh, In: []string{"x"}, Out: "y"}}}
	for _, n := range []int{3, 17, 64, 3, 100} {
		x := randVec(r, n)
		got, err := runGraph(t, d, g, []input{f32In("x", x, n)}, "y", []int{n})
		if err != nil {
			t.Fatal(err)
		}
		checkClose(t, got, refPointwise(to64(x), runtime.ActTanh), tolF32)
	}
	// 3 was evicted by 64 before it came back, so every run was a miss.
	if n, hits, misses := d.prims.stats(); n != 2 || hits != 0 || misses != 5 {
		t.Errorf("cache: %d entries, %d hits, %d misses; want 2, 0, 5", n, hits, misses)
	}
	// The metrics say the same, and time each creation.
	x := randVec(r, 100)
	if _, err := runGraph(t, d, g, []input{f32In("x", x, 100)}, "y", []int{100}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`
# HELP brokerd_onednn_primitive_cache_lookups_total Primitive cache lookups by result (hit or miss).
# TYPE brokerd_onednn_primitive_cache_lookups_total counter
brokerd_onednn_primitive_cache_lookups_total{device=%q,result="hit"} 1
brokerd_onednn_primitive_cache_lookups_total{device=%q,result="miss"} 5
`, d.ID(), d.ID())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "brokerd_onednn_primitive_cache_lookups_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "brokerd_onednn_primitive_create_seconds"); n != 1 {
		t.Errorf("%d create-time series, want 1 (this device)", n)
	}
}

func TestInvalidGraph(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	shapes := map[string][]int{
		"a": {4, 8}, "w": {8, 3}, "wt": {3, 8}, "bias": {3}, "bad_bias": {4},
		"y": {4, 3}, "y_wrong": {3, 4}, "v": {8}, "x3": {2, 4, 8}, "i": {5},
	}
	bind := map[string]runtime.Buffer{}
	for name, shape := range shapes {
		b, err := d.Alloc(runtime.F32, shape...)
		if err != nil {
			t.Fatal(err)
		}
		bind[name] = b
	}
	idx, err := d.Alloc(runtime.I32, 5)
	if err != nil {
		t.Fatal(err)
	}
	bind["idx"] = idx
	freed, err := d.Alloc(runtime.F32, 4, 8)
	if err != nil {
		t.Fatal(err)
	}
	d.Free(freed)
	mm := func(in ...string) runtime.Op { return runtime.Op{Kind: runtime.OpMatMul, In: in, Out: "y"} }
	tests := []struct {
		name string
		ops  []runtime.Op
		bind map[string]runtime.Buffer // added to the common bindings
		want string
	}{
		{"empty", nil, nil, "empty graph"},
		{"unknown input", []runtime.Op{mm("a", "nope")}, nil, `reads "nope", which is neither bound`},
		{"read before write", []runtime.Op{{Kind: runtime.OpReLU, In: []string{"t"}, Out: "u"}, {Kind: runtime.OpReLU, In: []string{"a"}, Out: "t"}}, nil, `reads "t" before op 1 writes it`},
		{"written twice", []runtime.Op{{Kind: runtime.OpReLU, In: []string{"a"}, Out: "t"}, {Kind: runtime.OpTanh, In: []string{"a"}, Out: "t"}}, nil, "already written by op 0"},
		{"no output", []runtime.Op{{Kind: runtime.OpReLU, In: []string{"a"}}}, nil, "no output name"},
		{"K mismatch", []runtime.Op{mm("a", "wt")}, nil, "inner dimensions differ: In[0] has K=8, In[1] has K=3"},
		{"bias shape", []runtime.Op{mm("a", "w", "bad_bias")}, nil, "bias is [4], want [3]"},
		{"output shape", []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"a", "w"}, Out: "y_wrong"}}, nil, `output "y_wrong" is bound to [3,4] f32, want [4,3] f32`},
		{"too few inputs", []runtime.Op{mm("a")}, nil, "takes 2 to 4 inputs, got 1"},
		{"1-D matmul", []runtime.Op{mm("v", "w")}, nil, "at least 2 dimensions"},
		{"activation on add", []runtime.Op{{Kind: runtime.OpAdd, In: []string{"a", "a"}, Out: "t", Act: runtime.ActReLU}}, nil, "Act is only for matmul"},
		{"scale on matmul", []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"a", "w"}, Out: "y", Scale: 2}}, nil, "Scale is only for batch-matmul"},
		{"add broadcast", []runtime.Op{{Kind: runtime.OpAdd, In: []string{"a", "bias"}, Out: "t"}}, nil, "In[1] must be [4,8] or [8]"},
		{"layer-norm gamma", []runtime.Op{{Kind: runtime.OpLayerNorm, In: []string{"a", "bias", "v"}, Out: "t"}}, nil, "In[1] is [3], want [8]"},
		{"negative eps", []runtime.Op{{Kind: runtime.OpLayerNorm, In: []string{"a", "v", "v"}, Out: "t", Eps: -1}}, nil, "negative"},
		{"gather float indices", []runtime.Op{{Kind: runtime.OpGather, In: []string{"a", "i"}, Out: "t"}}, nil, "indices are f32, want i32"},
		{"mean-pool 2-D", []runtime.Op{{Kind: runtime.OpMaskedMeanPool, In: []string{"a", "a"}, Out: "t"}}, nil, "must be 3-D"},
		{"mean-pool mask", []runtime.Op{{Kind: runtime.OpMaskedMeanPool, In: []string{"x3", "a"}, Out: "t"}}, nil, "mask is [4,8], want [2,4]"},
		{"softmax on indices", []runtime.Op{{Kind: runtime.OpSoftmax, In: []string{"idx"}, Out: "t"}}, nil, "In[0] is i32, want f32"},
		{"unknown kind", []runtime.Op{{Kind: 99, In: []string{"a"}, Out: "t"}}, nil, "unknown op kind 99"},
		{"not a permutation", []runtime.Op{{Kind: runtime.OpPermute, In: []string{"a"}, Out: "t", Perm: []int{0, 0}}}, nil, "not a permutation"},
		{"permute rank", []runtime.Op{{Kind: runtime.OpPermute, In: []string{"a"}, Out: "t", Perm: []int{1, 0, 2}}}, nil, "3 entries for 2 dimensions"},
		{"permute view count", []runtime.Op{{Kind: runtime.OpPermute, In: []string{"a"}, Out: "t", Shape: []int{4, 4}, Perm: []int{1, 0}}}, nil, "Shape [4 4] has 16 elements, In[0] 32"},
		{"permute indices", []runtime.Op{{Kind: runtime.OpPermute, In: []string{"idx"}, Out: "t", Perm: []int{0}}}, nil, "In[0] is i32, want f32 or bf16"},
		{"perm on relu", []runtime.Op{{Kind: runtime.OpReLU, In: []string{"a"}, Out: "t", Perm: []int{0, 1}}}, nil, "Perm is only for permute"},
		{"shape on add", []runtime.Op{{Kind: runtime.OpAdd, In: []string{"a", "a"}, Out: "t", Shape: []int{32}}}, nil, "Shape is only for permute and reshape"},
		{"reshape count", []runtime.Op{{Kind: runtime.OpReshape, In: []string{"a"}, Out: "t", Shape: []int{5, 6}}}, nil, "Shape [5 6] has 30 elements, In[0] 32"},
		{"reshape two free", []runtime.Op{{Kind: runtime.OpReshape, In: []string{"a"}, Out: "t", Shape: []int{-1, -1}}}, nil, "dimension 1 is -1"},
		{"reshape no shape", []runtime.Op{{Kind: runtime.OpReshape, In: []string{"a"}, Out: "t"}}, nil, "no Shape"},
		{"reshape indivisible", []runtime.Op{{Kind: runtime.OpReshape, In: []string{"a"}, Out: "t", Shape: []int{-1, 5}}}, nil, "does not divide 32"},
		{"masked softmax mask", []runtime.Op{{Kind: runtime.OpMaskedSoftmax, In: []string{"x3", "a"}, Out: "t"}}, nil, "mask is [4,8], want [2,8]"},
		{"masked softmax 1-D", []runtime.Op{{Kind: runtime.OpMaskedSoftmax, In: []string{"v", "v"}, Out: "t"}}, nil, "at least 2 dimensions"},
		{"convert to i32", []runtime.Op{{Kind: runtime.OpConvert, In: []string{"a"}, Out: "t", DType: runtime.I32}}, nil, "DType i32: want f32 or bf16"},
		{"dtype on add", []runtime.Op{{Kind: runtime.OpAdd, In: []string{"a", "a"}, Out: "y2", DType: runtime.F32}}, nil, "DType is only for convert, matmul, batch-matmul and attention"},
		{"in place", []runtime.Op{{Kind: runtime.OpAdd, In: []string{"y", "bias"}, Out: "out"}}, map[string]runtime.Buffer{"out": bind["y"]}, "into the buffer it reads"},
		{"freed buffer", []runtime.Op{{Kind: runtime.OpReLU, In: []string{"gone"}, Out: "t"}}, map[string]runtime.Buffer{"gone": freed}, "was freed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := map[string]runtime.Buffer{}
			for k, v := range bind {
				b[k] = v
			}
			for k, v := range tt.bind {
				b[k] = v
			}
			err := d.Run(t.Context(), &runtime.Graph{Ops: tt.ops}, b)
			if !errors.Is(err, runtime.ErrInvalidGraph) {
				t.Fatalf("err = %v, want ErrInvalidGraph", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %q, want it to contain %q", err, tt.want)
			}
		})
	}
	t.Run("buffer of another device", func(t *testing.T) {
		other := openTest(t, runtime.DeviceSpec{})
		ob, err := other.Alloc(runtime.F32, 4, 8)
		if err != nil {
			t.Fatal(err)
		}
		g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpReLU, In: []string{"a"}, Out: "t"}}}
		if err := d.Run(t.Context(), g, map[string]runtime.Buffer{"a": ob}); !errors.Is(err, runtime.ErrInvalidGraph) {
			t.Fatalf("err = %v, want ErrInvalidGraph", err)
		}
		if err := d.CopyIn(t.Context(), ob, make([]float32, 32)); !errors.Is(err, runtime.ErrInvalidGraph) {
			t.Fatalf("CopyIn err = %v, want ErrInvalidGraph", err)
		}
	})
}

func TestCopyErrors(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	ctx := t.Context()
	f, _ := d.Alloc(runtime.F32, 2, 3)
	i, _ := d.Alloc(runtime.I32, 4)
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"short CopyIn", func() error { return d.CopyIn(ctx, f, make([]float32, 5)) }, "5 values for a [2,3] buffer of 6"},
		{"long CopyOut", func() error { return d.CopyOut(ctx, make([]float32, 7), f) }, "7 values for a [2,3] buffer of 6"},
		{"floats into i32", func() error { return d.CopyIn(ctx, i, make([]float32, 4)) }, "use CopyInInt32"},
		{"ints into f32", func() error { return d.CopyInInt32(ctx, f, make([]int32, 6)) }, "int32 values for a f32 buffer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, runtime.ErrInvalidGraph) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidGraph with %q", err, tt.want)
			}
		})
	}
	t.Run("i32 round trip", func(t *testing.T) {
		if err := d.CopyInInt32(ctx, i, []int32{-3, 0, 7, 1 << 20}); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, 4)
		if err := d.CopyOut(ctx, got, i); err != nil {
			t.Fatal(err)
		}
		if want := []float32{-3, 0, 7, 1 << 20}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("got %v, want %v", got, want)
		}
	})
}

func TestConcurrentRuns(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	r := newRand(t)
	const workers, runs = 6, 8
	cases := make([]encoderCase, workers)
	for w := range cases {
		// Two shapes, so the workers share some primitives and not others.
		cases[w] = newEncoderCase(r, 2, 5+w%2*12, 17, 64)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(c encoderCase) {
			defer wg.Done()
			for i := 0; i < runs; i++ {
				got, err := runGraph(t, d, encoderGraph(), c.ins, "y", []int{c.b, c.s, c.n})
				if err != nil {
					errs <- err
					return
				}
				if e := relErr(got, c.want); !(e <= tolF32) {
					errs <- fmt.Errorf("run %d: relative error %.3g", i, e)
					return
				}
			}
		}(cases[w])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := d.Synchronize(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestCancelledRun(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	x, _ := d.Alloc(runtime.F32, 4)
	y, _ := d.Alloc(runtime.F32, 4)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpReLU, In: []string{"x"}, Out: "y"}}}
	if err := d.Run(ctx, g, map[string]runtime.Buffer{"x": x, "y": y}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestClose(t *testing.T) {
	dev, err := New(Options{}).Open(t.Context(), runtime.DeviceSpec{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	x, _ := dev.Alloc(runtime.F32, 4)
	y, _ := dev.Alloc(runtime.F32, 4)
	pooled, _ := dev.Alloc(runtime.F32, 100)
	dev.Free(pooled)
	g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpReLU, In: []string{"x"}, Out: "y"}}}
	if err := dev.Run(ctx, g, map[string]runtime.Buffer{"x": x, "y": y}); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if used := dev.MemoryUsed(); used != 0 {
		t.Errorf("MemoryUsed = %d after Close", used)
	}
	dev.Free(x) // after Close: nothing to do, and no crash
	checks := []struct {
		name string
		err  error
	}{
		{"Run", dev.Run(ctx, g, map[string]runtime.Buffer{"x": x, "y": y})},
		{"CopyIn", dev.CopyIn(ctx, x, make([]float32, 4))},
		{"Synchronize", dev.Synchronize(ctx)},
	}
	_, allocErr := dev.Alloc(runtime.F32, 4)
	checks = append(checks, struct {
		name string
		err  error
	}{"Alloc", allocErr})
	for _, c := range checks {
		if !errors.Is(c.err, ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", c.name, c.err)
		}
	}
}

// TestBF16 runs bf16 matmuls where the CPU has bf16, and otherwise checks
// that bf16 is refused with runtime.ErrUnsupported, then skips.
func TestBF16(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	if got, want := BF16Support(), d.BF16(); (got == nil) != (want == nil) {
		t.Errorf("BF16Support() = %v, but the device says %v", got, want)
	}
	if reason := d.BF16(); reason != nil {
		if !errors.Is(reason, runtime.ErrUnsupported) {
			t.Errorf("BF16() = %v, want it to wrap ErrUnsupported", reason)
		}
		if _, err := d.Alloc(runtime.BF16, 4); !errors.Is(err, runtime.ErrUnsupported) {
			t.Errorf("Alloc(BF16) err = %v, want ErrUnsupported", err)
		}
		if _, err := New(Options{}).Open(t.Context(), runtime.DeviceSpec{DType: runtime.BF16}); !errors.Is(err, runtime.ErrUnsupported) {
			t.Errorf("Open(DType: BF16) err = %v, want ErrUnsupported", err)
		}
		t.Skipf("bf16 unsupported on this CPU (oneDNN ISA %s): %v", MaxISA(), reason)
	}
	r := newRand(t)
	for _, sh := range [][3]int{{1, 1, 1}, {3, 17, 64}, {17, 100, 3}, {64, 64, 100}, {100, 3, 17}} {
		for _, transB := range []bool{false, true} {
			t.Run(fmt.Sprintf("%dx%dx%d/transB=%v", sh[0], sh[1], sh[2], transB), func(t *testing.T) {
				m, k, n := sh[0], sh[1], sh[2]
				a, w, b := randVec(r, m*k), randVec(r, k*n), randVec(r, n)
				wShape := []int{k, n}
				if transB {
					wShape = []int{n, k}
				}
				ins := []input{
					{name: "a", dt: runtime.BF16, shape: []int{m, k}, f: a},
					{name: "w", dt: runtime.BF16, shape: wShape, f: w},
					f32In("b", b, n),
				}
				g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"a", "w", "b"}, Out: "y", TransB: transB, Act: runtime.ActGELU}}}
				got, err := runGraph(t, d, g, ins, "y", []int{m, n})
				if err != nil {
					t.Fatal(err)
				}
				// Against the bf16 operands the device holds: rounding the
				// operands alone can exceed 1e-2 where a product and the bias
				// nearly cancel (seen with 1×1×1).
				checkClose(t, got, refMatMul(roundBF16(a), m, k, roundBF16(w), n, transB, to64(b), runtime.ActGELU), tolBF16)
			})
		}
	}
}

// TestBF16Products: matmuls and batch matmuls that write bf16 (Op.DType),
// and gathers from bf16 tables, read back through an OpConvert to f32.
func TestBF16Products(t *testing.T) {
	d := openTest(t, runtime.DeviceSpec{})
	if reason := d.BF16(); reason != nil {
		t.Skipf("bf16 unsupported on this CPU: %v", reason)
	}
	r := newRand(t)
	back := runtime.Op{Kind: runtime.OpConvert, In: []string{"h"}, Out: "y", DType: runtime.F32}
	for _, sh := range [][3]int{{1, 1, 1}, {3, 17, 64}, {100, 3, 17}} {
		m, k, n := sh[0], sh[1], sh[2]
		t.Run(fmt.Sprintf("matmul/%dx%dx%d", m, k, n), func(t *testing.T) {
			a, w, b := randVec(r, m*k), randVec(r, n*k), randVec(r, n)
			g := &runtime.Graph{Ops: []runtime.Op{
				{Kind: runtime.OpMatMul, In: []string{"a", "w", "b"}, Out: "h", TransB: true, Act: runtime.ActGELU, DType: runtime.BF16}, back}}
			got, err := runGraph(t, d, g, []input{
				{name: "a", dt: runtime.BF16, shape: []int{m, k}, f: a},
				{name: "w", dt: runtime.BF16, shape: []int{n, k}, f: w},
				f32In("b", b, n),
			}, "y", []int{m, n})
			if err != nil {
				t.Fatal(err)
			}
			// Against the operands as the device holds them (bf16), so the
			// check sees the accumulation and the one rounding of the
			// product; operand rounding on top can exceed 1e-2 for a
			// single product.
			checkClose(t, got, refMatMul(roundBF16(a), m, k, roundBF16(w), n, true, to64(b), runtime.ActGELU), tolBF16)
		})
		t.Run(fmt.Sprintf("batch-matmul/2x%dx%dx%d", m, k, n), func(t *testing.T) {
			a, w := randVec(r, 2*m*k), randVec(r, 2*k*n)
			g := &runtime.Graph{Ops: []runtime.Op{
				{Kind: runtime.OpBatchMatMul, In: []string{"a", "w"}, Out: "h", Scale: 0.5, DType: runtime.BF16}, back}}
			got, err := runGraph(t, d, g, []input{
				{name: "a", dt: runtime.BF16, shape: []int{2, m, k}, f: a},
				{name: "w", dt: runtime.BF16, shape: []int{2, k, n}, f: w},
			}, "y", []int{2, m, n})
			if err != nil {
				t.Fatal(err)
			}
			checkClose(t, got, refBatchMatMul(roundBF16(a), 2, m, k, roundBF16(w), n, false, 0.5), tolBF16)
		})
	}
	t.Run("gather", func(t *testing.T) {
		const v, dim = 9, 33
		table := randVec(r, v*dim)
		idx := []int32{8, 0, 3, 3, 7}
		g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpGather, In: []string{"t", "i"}, Out: "h"}, back}}
		got, err := runGraph(t, d, g, []input{
			{name: "t", dt: runtime.BF16, shape: []int{v, dim}, f: table},
			{name: "i", dt: runtime.I32, shape: []int{len(idx)}, i: idx},
		}, "y", []int{len(idx), dim})
		if err != nil {
			t.Fatal(err)
		}
		// Rows move unchanged: exactly the bf16 values the table holds.
		rounded := make([]float32, len(table))
		fromBF16(rounded, toBF16Slice(table))
		want := refGather(to64(rounded), dim, idx)
		for i := range got {
			if float64(got[i]) != want[i] {
				t.Fatalf("y[%d] = %g, want %g", i, got[i], want[i])
			}
		}
	})
}

// roundBF16 is v rounded to bf16 as CopyIn does, as float64.
func roundBF16(v []float32) []float64 {
	r := make([]float32, len(v))
	fromBF16(r, toBF16Slice(v))
	return to64(r)
}

// toBF16Slice rounds values to bf16 as CopyIn does.
func toBF16Slice(v []float32) []uint16 {
	out := make([]uint16, len(v))
	toBF16(out, v)
	return out
}

func TestBF16Conversion(t *testing.T) {
	tests := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{0, 0},
		{float32(math.Inf(1)), 0x7f80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie: rounds to even (down)
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie: rounds to even (up)
		{math.Float32frombits(0x3f808001), 0x3f81}, // above the tie
		{math.Float32frombits(0x7f7fffff), 0x7f80}, // max float rounds to +Inf
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%g", tt.in), func(t *testing.T) {
			var got [1]uint16
			toBF16(got[:], []float32{tt.in})
			if got[0] != tt.want {
				t.Fatalf("toBF16(%#x) = %#04x, want %#04x", math.Float32bits(tt.in), got[0], tt.want)
			}
			var back [1]float32
			fromBF16(back[:], got[:])
			if math.Float32bits(back[0]) != uint32(tt.want)<<16 {
				t.Fatalf("fromBF16(%#04x) = %#x", tt.want, math.Float32bits(back[0]))
			}
		})
	}
	t.Run("NaN", func(t *testing.T) {
		var got [1]uint16
		toBF16(got[:], []float32{math.Float32frombits(0x7f800001)}) // a NaN whose payload is all in the low bits
		var back [1]float32
		fromBF16(back[:], got[:])
		if !math.IsNaN(float64(back[0])) {
			t.Fatalf("NaN became %#04x", got[0])
		}
	})
	// Arrays go through the AVX-512 loop where the CPU has it, with a
	// masked tail: every bit pattern class, bit for bit as the scalar rule.
	t.Run("random bits by length", func(t *testing.T) {
		r := newRand(t)
		for _, n := range []int{15, 16, 17, 33, 1000} {
			src := make([]float32, n)
			for i := range src {
				src[i] = math.Float32frombits(r.Uint32())
				switch i % 7 {
				case 1:
					src[i] = math.Float32frombits(0x7f800000 | r.Uint32()&0x807fffff) // NaN or Inf
				case 2:
					src[i] = math.Float32frombits(r.Uint32()&0xffff0000 | 0x8000) // a tie
				}
			}
			got := make([]uint16, n)
			toBF16(got, src)
			for i, f := range src {
				if want := safetensors.Float32ToBF16(f); got[i] != want {
					t.Fatalf("n=%d: toBF16(%#x) = %#04x, want %#04x", n, math.Float32bits(f), got[i], want)
				}
			}
		}
	})
	t.Run("random round trip", func(t *testing.T) {
		r := newRand(t)
		src := randVec(r, 1000)
		bf := make([]uint16, len(src))
		toBF16(bf, src)
		back := make([]float32, len(src))
		fromBF16(back, bf)
		for i := range src {
			if e := math.Abs(float64(back[i]-src[i])) / math.Abs(float64(src[i])); e > 1.0/256 {
				t.Fatalf("%g -> %g: relative error %g above bf16's 2^-8", src[i], back[i], e)
			}
		}
	})
}

func TestLRU(t *testing.T) {
	var destroyed []int
	c := newLRU[string](2, func(v int) { destroyed = append(destroyed, v) })
	calls := 0
	get := func(k string, v int) int {
		got, err := c.get(k, func() (int, error) { calls++; return v, nil })
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	steps := []struct {
		key       string
		val, want int
		destroyed string
	}{
		{"a", 1, 1, "[]"},
		{"b", 2, 2, "[]"},
		{"a", 9, 1, "[]"},  // hit: a is now most recent
		{"c", 3, 3, "[2]"}, // evicts b, the least recent
		{"b", 4, 4, "[2 1]"},
	}
	for i, s := range steps {
		t.Run(fmt.Sprintf("%d-%s", i, s.key), func(t *testing.T) {
			if got := get(s.key, s.val); got != s.want {
				t.Errorf("get(%q) = %d, want %d", s.key, got, s.want)
			}
			if fmt.Sprint(destroyed) != s.destroyed {
				t.Errorf("destroyed %v, want %s", destroyed, s.destroyed)
			}
		})
	}
	if _, err := c.get("x", func() (int, error) { return 0, errors.New("boom") }); err == nil {
		t.Error("create error not returned")
	}
	if n, hits, misses := c.stats(); n != 2 || hits != 1 || misses != 5 {
		t.Errorf("stats = %d, %d, %d; want 2, 1, 5", n, hits, misses)
	}
	c.clear()
	if fmt.Sprint(destroyed) != "[2 1 4 3]" {
		t.Errorf("after clear destroyed %v, want [2 1 4 3]", destroyed)
	}
}
