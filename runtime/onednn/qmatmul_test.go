package onednn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
)

// TestQuantizedWeightsThroughRun: a matmul whose weights are stored
// block-quantized (CopyInRaw, in two pieces) runs qgemm.c on them through
// Device.Run for few rows, bit-identical to the kernel called directly
// (which TestQgemmMatchesFloat64 holds to float64) plus the bias, and from
// qPrefillRows rows on dequantizes slices of W for oneDNN (one slice or
// several), within bf16's rounding of the float64 product, as qamx.c's
// panels are (where the CPU has AMX); a gather from a
// quantized table gives quant.Dequantize's rows; CopyOut dequantizes; the
// buffer holds the stored bytes, not floats.
func TestQuantizedWeightsThroughRun(t *testing.T) {
	dev := openCPU(t, 2)
	rng := rand.New(rand.NewPCG(7, 21))
	for _, dt := range runtime.QuantizedTypes() {
		q, _ := dt.GGML()
		t.Run(dt.String(), func(t *testing.T) {
			k := 2 * dt.BlockElems()
			if k < 256 {
				k = 256
			}
			const n = 24
			w := randQuantWeights(rng, q, n, k)
			wb, err := dev.Alloc(dt, n, k)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Free(wb)
			if got, want := wb.Bytes(), (int64(len(w))+alignment-1)/alignment*alignment; got != want {
				t.Errorf("Bytes() = %d, want %d (the stored size)", got, want)
			}
			half := len(w) / 2 / (len(w) / n) * (len(w) / n) // whole rows
			raw := dev.(runtime.RawDevice)
			if err := raw.CopyInRaw(t.Context(), wb, 0, w[:half]); err != nil {
				t.Fatal(err)
			}
			if err := raw.CopyInRaw(t.Context(), wb, int64(half), w[half:]); err != nil {
				t.Fatal(err)
			}
			bias := make([]float32, n)
			for i := range bias {
				bias[i] = float32(rng.NormFloat64())
			}
			bb := upload(t, dev, runtime.F32, bias, n)
			wf := make([]float32, n*k)
			if err := quant.Dequantize(q, w, wf); err != nil {
				t.Fatal(err)
			}
			d := dev.(*Device)
			for _, c := range []struct {
				m, prefillRows int
				sliceRows      int  // 0: the default slices
				amx            bool // qamx.c (on a CPU with AMX)
			}{{1, defaultQPrefillRows, 0, false}, {5, defaultQPrefillRows, 0, false}, {33, defaultQPrefillRows, 0, false},
				{5, 1, 16, false}, {40, 1, 7, false}, {3, defaultQPrefillRows, 0, true}, {70, defaultQPrefillRows, 0, true},
				{1400, 1 << 20, 0, false}} { // qgemm with the bias added on the device's threads
				if c.amx && !qamxAvailable() {
					continue
				}
				m := c.m
				d.qPrefillRows, d.qSliceBytes, d.qAMXRows = c.prefillRows, defaultQSliceBytes, 0
				if c.amx {
					d.qAMXRows = 1
				}
				if c.sliceRows > 0 {
					d.qSliceBytes = int64(c.sliceRows * k * 4)
				}
				x := randActs(rng, m, k)
				xb := upload(t, dev, runtime.F32, x, m, k)
				yb, err := dev.Alloc(runtime.F32, m, n)
				if err != nil {
					t.Fatal(err)
				}
				g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"x", "w", "b"}, Out: "y", TransB: true}}}
				if err := dev.Run(t.Context(), g, map[string]runtime.Buffer{"x": xb, "w": wb, "b": bb, "y": yb}); err != nil {
					t.Fatal(err)
				}
				got := make([]float32, m*n)
				if err := dev.CopyOut(t.Context(), got, yb); err != nil {
					t.Fatal(err)
				}
				if m < c.prefillRows && !c.amx || c.amx && qamxInt8(q, int64(m)) {
					// qgemm.c or qamx's AMX-INT8 itself, whose error
					// TestQgemmMatchesFloat64 or TestQamxInt8MatchesFloat64
					// bounds.
					want := make([]float32, m*n)
					var err error
					if c.amx {
						err = qamxSlices(q, w, n, k, x, m, want, n, d.threads, 0)
					} else {
						err = qgemm(q, w, n, k, x, m, want, n, isaAuto, d.threads)
					}
					if err != nil {
						t.Fatal(err)
					}
					for i := range want {
						want[i] += bias[i%n]
					}
					if !slices.Equal(got, want) {
						t.Errorf("m=%d (amx %v): Run differs from the kernel plus bias", m, c.amx)
					}
				} else {
					// Dequantized slices through oneDNN, or qamx's
					// panels: the float64 product within bf16's
					// rounding of both operands (2^-8 each) or f32's
					// over k terms.
					unit := 0x1p-7
					if c.amx {
						unit = qamxGamma(k)
					} else if d.bf16Err != nil {
						unit = float64(k) * 0x1p-23
					}
					for i := range m {
						for j := range n {
							var ref, mag float64
							for l := range k {
								p := float64(wf[j*k+l]) * float64(x[i*k+l])
								ref += p
								mag += math.Abs(p)
							}
							ref += float64(bias[j])
							if diff := math.Abs(float64(got[i*n+j]) - ref); diff > unit*mag+1e-6 {
								t.Fatalf("m=%d slices of %d rows: y[%d][%d] = %g, float64 %g (off %g, bound %g)", m, c.sliceRows, i, j, got[i*n+j], ref, diff, unit*mag)
							}
						}
					}
				}
				dev.Free(xb)
				dev.Free(yb)
			}
			d.qPrefillRows, d.qSliceBytes, d.qAMXRows = defaultQPrefillRows, defaultQSliceBytes, defaultQAMXRows()
			dev.Free(bb)

			// Gather rows 3, 0 and n-1 of the table.
			ids := []int32{3, 0, n - 1}
			ib, err := dev.Alloc(runtime.I32, len(ids))
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Free(ib)
			if err := dev.CopyInInt32(t.Context(), ib, ids); err != nil {
				t.Fatal(err)
			}
			ob, err := dev.Alloc(runtime.F32, len(ids), k)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Free(ob)
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpGather, In: []string{"w", "i"}, Out: "o"}}}
			if err := dev.Run(t.Context(), g, map[string]runtime.Buffer{"w": wb, "i": ib, "o": ob}); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, len(ids)*k)
			if err := dev.CopyOut(t.Context(), got, ob); err != nil {
				t.Fatal(err)
			}
			all := make([]float32, n*k)
			if err := quant.Dequantize(q, w, all); err != nil {
				t.Fatal(err)
			}
			for i, id := range ids {
				if !slices.Equal(got[i*k:(i+1)*k], all[int(id)*k:(int(id)+1)*k]) {
					t.Errorf("gathered row %d differs from quant.Dequantize", id)
				}
			}
			whole := make([]float32, n*k)
			if err := dev.CopyOut(t.Context(), whole, wb); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(whole, all) {
				t.Error("CopyOut of the weights differs from quant.Dequantize")
			}
			// An index past the table is the caller's mistake, not a crash.
			if err := dev.CopyInInt32(t.Context(), ib, []int32{0, n, 1}); err != nil {
				t.Fatal(err)
			}
			if err := dev.Run(t.Context(), g, map[string]runtime.Buffer{"w": wb, "i": ib, "o": ob}); err == nil || !strings.Contains(err.Error(), "outside the table") {
				t.Errorf("gather past the table: err = %v", err)
			}
		})
	}
}

func openCPU(t *testing.T, threads int) runtime.Device {
	return openTest(t, runtime.DeviceSpec{ID: "cpu:0", Threads: threads})
}

// TestQuantizedGroup: consecutive matmuls by quantized weights of one
// type over the same activations (a decoder's q, k and v with their
// biases) are planned as one group, and a fourth of another type is not;
// the run's outputs are bit-identical to each matmul run alone, whether
// the group runs as one qgemm call (a few rows) or falls back to its
// products one by one (prefill rows).
func TestQuantizedGroup(t *testing.T) {
	dev := openCPU(t, 2)
	d := dev.(*Device)
	rng := rand.New(rand.NewPCG(3, 9))
	const k = 256
	type mm struct {
		name string
		dt   runtime.DType
		n    int
	}
	mms := []mm{{"q", runtime.Q8_0, 64}, {"k", runtime.Q8_0, 16}, {"v", runtime.Q8_0, 16}, {"o", runtime.Q4_0, 32}}
	bind := map[string]runtime.Buffer{}
	var g runtime.Graph
	for _, c := range mms {
		q, _ := c.dt.GGML()
		wb, err := dev.Alloc(c.dt, c.n, k)
		if err != nil {
			t.Fatal(err)
		}
		if err := dev.(runtime.RawDevice).CopyInRaw(t.Context(), wb, 0, randQuantWeights(rng, q, c.n, k)); err != nil {
			t.Fatal(err)
		}
		bind["w"+c.name] = wb
		bind["b"+c.name] = upload(t, dev, runtime.F32, randActs(rng, 1, c.n), c.n)
		g.Ops = append(g.Ops, runtime.Op{Kind: runtime.OpMatMul, In: []string{"x", "w" + c.name, "b" + c.name}, Out: "y" + c.name, TransB: true})
	}
	for _, m := range []int{1, 3, defaultQPrefillRows + 6} {
		x := upload(t, dev, runtime.F32, randActs(rng, m, k), m, k)
		bind["x"] = x
		for _, c := range mms {
			y, err := dev.Alloc(runtime.F32, m, c.n)
			if err != nil {
				t.Fatal(err)
			}
			bind["y"+c.name] = y
		}
		if err := dev.Run(t.Context(), &g, bind); err != nil {
			t.Fatal(err)
		}
		pe, _ := d.plans.get(&g, func() (*planned, error) { t.Fatal("the graph's plan is not cached"); return nil, nil })
		if want := [][]int{{0, 1, 2}, nil, nil, nil}; fmt.Sprint(pe.groups) != fmt.Sprint(want) {
			t.Fatalf("groups %v, want %v", pe.groups, want)
		}
		for i, c := range mms {
			got := make([]float32, m*c.n)
			if err := dev.CopyOut(t.Context(), got, bind["y"+c.name]); err != nil {
				t.Fatal(err)
			}
			alone := &runtime.Graph{Ops: []runtime.Op{g.Ops[i]}}
			y, err := dev.Alloc(runtime.F32, m, c.n)
			if err != nil {
				t.Fatal(err)
			}
			if err := dev.Run(t.Context(), alone, map[string]runtime.Buffer{"x": x, "w" + c.name: bind["w"+c.name], "b" + c.name: bind["b"+c.name], "y" + c.name: y}); err != nil {
				t.Fatal(err)
			}
			want := make([]float32, m*c.n)
			if err := dev.CopyOut(t.Context(), want, y); err != nil {
				t.Fatal(err)
			}
			for j := range want {
				if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
					t.Fatalf("%d rows: y%s[%d] = %g in the group, %g alone", m, c.name, j, got[j], want[j])
				}
			}
			dev.Free(y)
			dev.Free(bind["y"+c.name])
		}
		dev.Free(x)
	}
}

// upload allocates a buffer of dt and shape holding v.
func upload(t *testing.T, dev runtime.Device, dt runtime.DType, v []float32, shape ...int) runtime.Buffer {
	t.Helper()
	b, err := dev.Alloc(dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.CopyIn(t.Context(), b, v); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestQuantizedRefusals: what a block type cannot be or take.
func TestQuantizedRefusals(t *testing.T) {
	dev := openCPU(t, 1)
	raw := dev.(runtime.RawDevice)
	if _, err := dev.Alloc(runtime.Q4_K, 4, 100); err == nil {
		t.Error("Alloc of rows that are not whole blocks succeeded")
	}
	wb, err := dev.Alloc(runtime.Q8_0, 2, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(wb)
	for _, c := range []struct {
		off int64
		n   int
	}{{-1, 1}, {0, 69}, {60, 9}, {69, 1}} {
		if err := raw.CopyInRaw(t.Context(), wb, c.off, make([]byte, c.n)); err == nil {
			t.Errorf("CopyInRaw of %d bytes at %d into 68 succeeded", c.n, c.off)
		}
	}
	if err := dev.CopyIn(t.Context(), wb, make([]float32, 64)); err == nil {
		t.Error("CopyIn of floats into a q8_0 buffer succeeded")
	}
	fb := upload(t, dev, runtime.F32, make([]float32, 64), 2, 32)
	defer dev.Free(fb)
	if err := raw.CopyInRaw(t.Context(), fb, 0, make([]byte, 8)); err == nil {
		t.Error("CopyInRaw into an f32 buffer succeeded")
	}
	xb := upload(t, dev, runtime.F32, make([]float32, 32), 1, 32)
	defer dev.Free(xb)
	yb, err := dev.Alloc(runtime.F32, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(yb)
	for name, op := range map[string]runtime.Op{
		"not transposed": {Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y"},
		"activation":     {Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y", TransB: true, Act: runtime.ActGELU},
		"as activations": {Kind: runtime.OpMatMul, In: []string{"w", "f"}, Out: "y", TransB: true},
		"softmax":        {Kind: runtime.OpSoftmax, In: []string{"w"}, Out: "y"},
	} {
		err := dev.Run(t.Context(), &runtime.Graph{Ops: []runtime.Op{op}}, map[string]runtime.Buffer{"x": xb, "w": wb, "f": fb, "y": yb})
		if err == nil || !strings.Contains(err.Error(), "q8_0") {
			t.Errorf("%s: err = %v, want a refusal naming q8_0", name, err)
		}
	}
}

// BenchmarkQmatmulPaths times a quantized matmul through Run both ways,
// qgemm.c ("qgemm") and dequantized slices through oneDNN ("dequant"), for
// the row counts where defaultQPrefillRows switches between them.
func BenchmarkQmatmulPaths(b *testing.B) {
	dev := openTest(b, runtime.DeviceSpec{ID: "cpu:0"})
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		dt   runtime.DType
		k, n int
	}{{runtime.Q8_0, 896, 4864}, {runtime.Q4_K, 1024, 2816}, {runtime.Q6_K, 2816, 1024}, {runtime.Q5_K, 1024, 2816}} {
		q, _ := c.dt.GGML()
		w := randQuantWeights(rng, q, c.n, c.k)
		wb, err := dev.Alloc(c.dt, c.n, c.k)
		if err != nil {
			b.Fatal(err)
		}
		if err := dev.CopyInRaw(b.Context(), wb, 0, w); err != nil {
			b.Fatal(err)
		}
		for _, m := range []int{1, 2, 4, 8, 16, 32, 64, 512} {
			x := randActs(rng, m, c.k)
			xb, _ := dev.Alloc(runtime.F32, m, c.k)
			if err := dev.CopyIn(b.Context(), xb, x); err != nil {
				b.Fatal(err)
			}
			yb, _ := dev.Alloc(runtime.F32, m, c.n)
			g := &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y", TransB: true}}}
			for _, path := range []string{"qgemm", "dequant", "amx"} {
				if path == "amx" && !qamxAvailable() {
					continue
				}
				b.Run(fmt.Sprintf("%v/%dx%d/m=%d/%s", c.dt, c.k, c.n, m, path), func(b *testing.B) {
					dev.qPrefillRows, dev.qAMXRows = 1<<30, 0
					switch path {
					case "dequant":
						dev.qPrefillRows = 1
					case "amx":
						dev.qAMXRows = 1
					}
					defer func() { dev.qPrefillRows, dev.qAMXRows = defaultQPrefillRows, defaultQAMXRows() }()
					bind := map[string]runtime.Buffer{"x": xb, "w": wb, "y": yb}
					for b.Loop() {
						if err := dev.Run(b.Context(), g, bind); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(2*float64(m*c.k*c.n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
			dev.Free(xb)
			dev.Free(yb)
		}
		dev.Free(wb)
	}
}

// TestQmatmulSwiGLU: a quantized matmul with ActSwiGLU gives, bit for bit,
// the plain product followed by OpSwiGLU: in qamx.c's group passes (from
// qamxSwiGLURows rows, N a multiple of 32: several pairs a group and a
// group a thread, a partial last m tile) and through the scratch product
// elsewhere (fewer rows, N not a multiple of 32, no AMX).
func TestQmatmulSwiGLU(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 11))
	for _, threads := range []int{1, 3} {
		dev := openCPU(t, threads)
		d := dev.(*Device)
		for _, dt := range []runtime.DType{runtime.Q8_0, runtime.Q4_K, runtime.Q6_K} {
			q, _ := dt.GGML()
			for _, c := range []struct {
				m, inter int
				amxRows  int // d.qAMXRows: 1 puts every product on qamx.c, 0 none
				k        int
			}{{70, 48, 1, 512}, {130, 176, 1, 512}, {64, 16, 1, 512}, {70, 40, 1, 512}, {5, 48, 1, 512}, {70, 48, 0, 512},
				{150, 48, 1, 4864}} { // (the last: X in slices of rows, qamx.c's QA_X_SLICE)
				k := c.k
				if c.amxRows > 0 && !qamxAvailable() {
					continue
				}
				t.Run(fmt.Sprintf("%d-threads/%s/m=%d/k=%d/inter=%d/amx=%d", threads, dt, c.m, c.k, c.inter, c.amxRows), func(t *testing.T) {
					d.qAMXRows = c.amxRows
					defer func() { d.qAMXRows = defaultQAMXRows() }()
					n := 2 * c.inter
					w := randQuantWeights(rng, q, n, k)
					wb, err := dev.Alloc(dt, n, k)
					if err != nil {
						t.Fatal(err)
					}
					defer dev.Free(wb)
					if err := dev.(runtime.RawDevice).CopyInRaw(t.Context(), wb, 0, w); err != nil {
						t.Fatal(err)
					}
					xb := upload(t, dev, runtime.F32, randActs(rng, c.m, k), c.m, k)
					defer dev.Free(xb)
					run := func(g *runtime.Graph) []float32 {
						yb, err := dev.Alloc(runtime.F32, c.m, c.inter)
						if err != nil {
							t.Fatal(err)
						}
						defer dev.Free(yb)
						if err := dev.Run(t.Context(), g, map[string]runtime.Buffer{"x": xb, "w": wb, "y": yb}); err != nil {
							t.Fatal(err)
						}
						got := make([]float32, c.m*c.inter)
						if err := dev.CopyOut(t.Context(), got, yb); err != nil {
							t.Fatal(err)
						}
						return got
					}
					fused := run(&runtime.Graph{Ops: []runtime.Op{
						{Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y", TransB: true, Act: runtime.ActSwiGLU}}})
					plain := run(&runtime.Graph{Ops: []runtime.Op{
						{Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "p", TransB: true},
						{Kind: runtime.OpSwiGLU, In: []string{"p"}, Out: "y"}}})
					if !slices.Equal(fused, plain) {
						bad := 0
						for i := range fused {
							if fused[i] != plain[i] {
								bad = i
								break
							}
						}
						t.Errorf("fused differs from the product and OpSwiGLU: first at row %d column %d: %g, want %g",
							bad/c.inter, bad%c.inter, fused[bad], plain[bad])
					}
					for _, v := range fused {
						if v != v {
							t.Fatal("NaN in the output")
						}
					}
				})
			}
		}
	}
}
