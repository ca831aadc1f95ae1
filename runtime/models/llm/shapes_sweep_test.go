package llm

// The shape sweep: shapes a model file may state that Config.spec and
// engineWeights accept, run through the oneDNN CPU engine (C kernels) and
// compared with the float64 reference. Minutes of work, so it runs only
// when asked, meant under AddressSanitizer (SHAPES picks shapes by name):
//
//	BROKERD_SHAPE_SWEEP=1 go test -asan -count=1 -run 'TestSweep' ./runtime/models/llm/

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/quant/ggmlref"
)

type auditShape struct {
	arch                                 string // llama, qwen2, qwen3
	hidden, heads, kv, dim, inter, vocab int
	ctx                                  int
}

func (a auditShape) String() string {
	return fmt.Sprintf("%s_h%d_q%d_kv%d_d%d_i%d_v%d", a.arch, a.hidden, a.heads, a.kv, a.dim, a.inter, a.vocab)
}

// auditSpec is a's netSpec as Config.spec makes it from a config.json: the
// shapes the checks accept (the test fails if they refuse one).
func auditSpec(t *testing.T, a auditShape) netSpec {
	t.Helper()
	arch := map[string]string{"llama": ArchLlama, "qwen2": ArchQwen2, "qwen3": ArchQwen3}[a.arch]
	c := Config{Architectures: []string{arch}, VocabSize: a.vocab, HiddenSize: a.hidden, NumHiddenLayers: 1,
		NumAttentionHeads: a.heads, NumKeyValueHeads: a.kv, HeadDim: a.dim, IntermediateSize: a.inter,
		MaxPositionEmbeddings: a.ctx, TieWordEmbeddings: a.arch != "qwen2"}
	s, _, _, err := c.spec()
	if err != nil {
		t.Fatalf("config refused: %v", err)
	}
	return s
}

func auditKVTypes(dim int) []runtime.DType {
	kts := []runtime.DType{runtime.F32, runtime.BF16, runtime.F16}
	if dim%32 == 0 {
		kts = append(kts, runtime.Q8_0, runtime.Q4_0)
	}
	return kts
}

func auditTol(kt runtime.DType, quantized bool) float64 {
	tol := map[runtime.DType]float64{runtime.F32: 2e-3, runtime.BF16: 4e-2, runtime.F16: 4e-2, runtime.Q8_0: 5e-2, runtime.Q4_0: 1.5e-1}[kt]
	if quantized {
		tol = max(tol, 6e-2)
	}
	return tol
}

// auditJobs: prefill lengths that cross block boundaries (block size bs),
// chunks of 1..17 rows mixed in the same steps, and one sequence that
// fills the context exactly.
func auditJobs(v, bs, ctx int) []*job {
	js := []*job{
		{seq: 1, prompt: prompt(2*bs+1, 1, v), gen: 3, chunk: 1},
		{seq: 2, prompt: prompt(bs, 2, v), gen: 3, chunk: bs},
		{seq: 3, prompt: prompt(bs+1, 3, v), gen: 2, chunk: 17, join: 1},
		{seq: 4, prompt: prompt(bs-1, 4, v), gen: 4, chunk: 3, join: 2},
		{seq: 5, prompt: prompt(1, 5, v), gen: bs + 2, chunk: 1},
		{seq: 6, prompt: prompt(3*bs+5, 6, v), gen: 2, chunk: 9, join: 1},
		{seq: 7, prompt: prompt(ctx-2, 7, v), gen: 2, chunk: 16},
	}
	return js
}

func auditCompare(t *testing.T, s netSpec, ref map[string]models.Tensor, jobs []*job, tol float64, what string) {
	t.Helper()
	worst := 0.0
	for _, j := range jobs {
		full := append(slices.Clone(j.prompt), j.out...)
		r := refForward(s, ref, full[:len(full)-1])
		for i, got := range j.logits {
			e := logitError(got, r[len(j.prompt)-1+i])
			if math.IsNaN(e) {
				e = math.Inf(1)
			}
			worst = math.Max(worst, e)
		}
	}
	t.Logf("%s: worst logit error %.3g (bound %.3g)", what, worst, tol)
	if worst > tol {
		t.Errorf("%s: worst relative logit error %g > %g", what, worst, tol)
	}
}

var auditFloatShapes = []auditShape{
	{"llama", 24, 3, 1, 2, 40, 7, 72},      // head dim 2, group 3
	{"qwen2", 20, 2, 2, 6, 30, 5, 72},      // head dim 6, no GQA
	{"llama", 16, 4, 2, 8, 24, 3, 72},      // head dim 8
	{"qwen3", 32, 7, 1, 16, 40, 11, 72},    // head dim 16, group 7 (group kernel)
	{"llama", 40, 9, 3, 40, 56, 33, 72},    // head dim 40 (not /16), group 3
	{"qwen2", 48, 6, 2, 72, 64, 17, 72},    // head dim 72
	{"llama", 40, 8, 1, 80, 48, 19, 72},    // head dim 80 (/16, not /32), group 8
	{"qwen3", 40, 12, 1, 96, 48, 9, 72},    // head dim 96, group 12 (rows kernel, chunk 12)
	{"llama", 24, 4, 2, 100, 32, 13, 72},   // head dim 100
	{"qwen2", 32, 17, 1, 32, 40, 21, 72},   // group 17 (> 16: two chunks)
	{"llama", 32, 32, 1, 64, 40, 16, 72},   // group 32
	{"qwen3", 32, 9, 1, 128, 40, 15, 72},   // group 9, dim 128
	{"llama", 32, 2, 1, 160, 40, 15, 72},   // head dim 160 (> group kernel's 128)
	{"qwen2", 32, 2, 2, 256, 40, 15, 72},   // head dim 256 (row kernel's max)
	{"llama", 32, 3, 1, 288, 40, 15, 72},   // head dim 288 (> 256: attend_body)
	{"llama", 32, 2, 1, 1024, 40, 15, 72},  // head dim 1024 (plan's max)
	{"llama", 32, 32, 1, 1024, 40, 15, 72}, // head dim 1024, group 32 (attend_body's largest stack)
}

func auditFilter(name string) bool {
	f := os.Getenv("SHAPES")
	return f == "" || strings.Contains(name, f)
}

// sweep skips the shape sweep unless BROKERD_SHAPE_SWEEP is set.
func sweep(t *testing.T) {
	t.Helper()
	if os.Getenv("BROKERD_SHAPE_SWEEP") == "" {
		t.Skip("the shape sweep runs with BROKERD_SHAPE_SWEEP=1 (minutes; meant under -asan)")
	}
}

// TestSweepEdgeShapesFloat: float checkpoints of the shapes above, f32 and
// bf16 compute, every KV cache type the head dim allows.
func TestSweepEdgeShapesFloat(t *testing.T) {
	sweep(t)
	devs := []struct {
		name string
		dt   runtime.DType
	}{{"f32", runtime.F32}, {"bf16", runtime.BF16}}
	for _, a := range auditFloatShapes {
		if !auditFilter(a.String()) {
			continue
		}
		for _, d := range devs {
			for _, kt := range auditKVTypes(a.dim) {
				for _, bs := range []int{16, 5} {
					name := fmt.Sprintf("%s/%s/kv_%s/bs%d", a, d.name, kt, bs)
					t.Run(name, func(t *testing.T) {
						s := auditSpec(t, a)
						dev := openCPU(t, d.dt)
						ck := randomCheckpoint(s, 3)
						ew, err := engineWeights(s, ck)
						if err != nil {
							t.Fatal(err)
						}
						e, err := newEngine(context.Background(), dev, s, ew, EngineOptions{CacheBytes: 64 << 20, BlockSize: bs, KVDType: kt})
						if err != nil {
							t.Fatal(err)
						}
						defer e.Close()
						jobs := auditJobs(s.Vocab, bs, s.Context)
						simulate(t, e, jobs)
						tol := auditTol(kt, false)
						if d.dt == runtime.BF16 {
							tol = max(tol, 6e-2)
						}
						auditCompare(t, s, ck, jobs, tol, name)
					})
				}
			}
		}
	}
}

// TestSweepLongDecode: contexts past BD_FA_PART (512) so that decode steps
// take decode_parts (flash-decoding over parts) and prefill spans many
// blocks; group kernel shapes.
func TestSweepLongDecode(t *testing.T) {
	sweep(t)
	for _, a := range []auditShape{
		{"qwen2", 32, 4, 2, 64, 40, 19, 700},
		{"llama", 32, 8, 1, 128, 40, 19, 700},
		{"llama", 32, 3, 3, 16, 40, 19, 700},
		{"qwen3", 32, 6, 2, 40, 40, 19, 700},
	} {
		if !auditFilter(a.String()) {
			continue
		}
		for _, kt := range auditKVTypes(a.dim) {
			for _, dt := range []runtime.DType{runtime.F32, runtime.BF16} {
				name := fmt.Sprintf("%s/%s/kv_%s", a, dt, kt)
				t.Run(name, func(t *testing.T) {
					s := auditSpec(t, a)
					dev := openCPU(t, dt)
					ck := randomCheckpoint(s, 4)
					ew, err := engineWeights(s, ck)
					if err != nil {
						t.Fatal(err)
					}
					e, err := newEngine(context.Background(), dev, s, ew, EngineOptions{CacheBytes: 64 << 20, KVDType: kt})
					if err != nil {
						t.Fatal(err)
					}
					defer e.Close()
					jobs := []*job{
						{seq: 1, prompt: prompt(520, 1, s.Vocab), gen: 3, chunk: 512},
						{seq: 2, prompt: prompt(s.Context-3, 2, s.Vocab), gen: 3, chunk: 250, join: 1},
					}
					simulate(t, e, jobs)
					tol := auditTol(kt, false)
					if dt == runtime.BF16 {
						tol = max(tol, 6e-2)
					}
					auditCompare(t, s, ck, jobs, tol, name)
				})
			}
		}
	}
}

// auditQuantize stores every matmul weight (and the embedding) of ck whose
// rows are whole blocks of dt as dt, quantized by ggml; mixed assigns some
// tensors other types (as Q4_K_M files do). Returns the checkpoint and its
// dequantized twin.
func auditQuantize(t *testing.T, lib *ggmlref.Lib, ck map[string]models.Tensor, pick func(name string) runtime.DType) (q, deq map[string]models.Tensor) {
	t.Helper()
	q, deq = map[string]models.Tensor{}, map[string]models.Tensor{}
	for name, x := range ck {
		dt := pick(name)
		if dt == 0 || len(x.Shape) != 2 || x.Shape[1]%dt.BlockElems() != 0 {
			q[name], deq[name] = x, x
			continue
		}
		g, _ := dt.GGML()
		raw, err := lib.Quantize(uint32(g), x.Data, x.Shape[0], x.Shape[1])
		if err != nil {
			t.Fatal(err)
		}
		qt := models.Tensor{Shape: x.Shape, Stored: dt, Raw: [][]byte{raw}}
		v, err := qt.Float32()
		if err != nil {
			t.Fatal(err)
		}
		q[name], deq[name] = qt, models.Tensor{Shape: x.Shape, Data: v}
	}
	return q, deq
}

// TestSweepQuantizedShapes: every block type with row lengths of one and
// of odd multiples of its block, output rows not multiples of 16 (k and v
// projections of one narrow kv head, tiny vocabularies), 1..17 rows a step
// and a 70-row prefill (the dequantized-slices path).
func TestSweepQuantizedShapes(t *testing.T) {
	sweep(t)
	lib := ggmlref.Find(t)
	small := []runtime.DType{runtime.Q4_0, runtime.Q4_1, runtime.Q5_0, runtime.Q5_1, runtime.Q8_0}
	kq := []runtime.DType{runtime.Q4_K, runtime.Q5_K, runtime.Q6_K}
	type qcase struct {
		a   auditShape
		dts []runtime.DType
	}
	cases := []qcase{
		{auditShape{"llama", 32, 2, 1, 16, 32, 5, 72}, small},       // k rows 16, vocab 5, one block a row
		{auditShape{"qwen2", 96, 3, 1, 32, 160, 3, 72}, small},      // 3 and 5 blocks a row, q rows 96
		{auditShape{"qwen2", 96, 3, 1, 32, 160, 33, 72}, small[:2]}, // the same, vocab 33
		{auditShape{"qwen2", 96, 3, 1, 32, 160, 3, 72}, nil},        // the same, float weights
		{auditShape{"qwen3", 64, 5, 5, 8, 96, 33, 72}, small},       // o_proj rows of 40: not whole blocks (stays float? plan refuses?)
		{auditShape{"llama", 64, 4, 1, 40, 96, 17, 72}, small},      // k rows 40 (not /16), o_proj in 160 = 5 blocks
		{auditShape{"llama", 256, 4, 1, 64, 768, 7, 72}, kq},        // K types: one block a row, inter 3 blocks, k rows 64
		{auditShape{"qwen2", 256, 2, 1, 128, 256, 5, 72}, kq},       // K types: vocab 5
		{auditShape{"qwen3", 256, 8, 2, 32, 1280, 19, 72}, kq},      // inter 5 blocks, q rows 256
		{auditShape{"llama", 512, 2, 2, 256, 256, 3, 72}, kq},       // 2 blocks a row, dim 256
		{auditShape{"llama", 256, 3, 1, 96, 256, 9, 72}, append(slices.Clone(small), kq...)},
	}
	for _, c := range cases {
		if !auditFilter(c.a.String()) {
			continue
		}
		dts := c.dts
		if dts == nil {
			dts = []runtime.DType{0}
		}
		for _, dt := range dts {
			for _, cdt := range []runtime.DType{runtime.F32, runtime.BF16} {
				name := fmt.Sprintf("%s/%s/%s", c.a, dt, cdt)
				t.Run(name, func(t *testing.T) {
					s := auditSpec(t, c.a)
					ck := randomCheckpoint(s, 9)
					qw, deq := auditQuantize(t, lib, ck, func(string) runtime.DType { return dt })
					if dt == 0 {
						qw, deq = ck, ck
					}
					ew, err := engineWeights(s, qw)
					if err != nil {
						t.Fatal(err)
					}
					dev := openCPU(t, cdt)
					kts := []runtime.DType{0}
					if s.HeadDim%32 == 0 {
						kts = append(kts, runtime.Q8_0, runtime.Q4_0)
					}
					kts = append(kts, runtime.F16)
					for _, kt := range kts {
						e, err := newEngine(context.Background(), dev, s, ew, EngineOptions{CacheBytes: 64 << 20, KVDType: kt})
						if err != nil {
							t.Fatal(err)
						}
						jobs := append(auditJobs(s.Vocab, 16, s.Context)[:6],
							&job{seq: 9, prompt: prompt(70, 9, s.Vocab), gen: 2, chunk: 70})
						simulate(t, e, jobs)
						e.Close()
						tol := auditTol(max(kt, runtime.BF16), true) * 2
						if s.Vocab < 8 { // logits near 0: the relative error of a few logits is large
							tol *= 2
						}
						auditCompare(t, s, deq, jobs, tol, fmt.Sprintf("%s/kv_%s", name, kt))
					}
				})
			}
		}
	}
}

// TestSweepMixedTypes: a Q4_K_M-like mix (down and v in Q6_K, the rest
// Q4_K; gate in Q4_K and up in Q6_K so gate_up is fused from floats) and
// a Q8_0 embedding with a K-type lm_head.
func TestSweepMixedTypes(t *testing.T) {
	sweep(t)
	lib := ggmlref.Find(t)
	a := auditShape{"qwen2", 256, 4, 2, 64, 512, 21, 72}
	s := auditSpec(t, a)
	ck := randomCheckpoint(s, 12)
	qw, deq := auditQuantize(t, lib, ck, func(n string) runtime.DType {
		switch {
		case strings.Contains(n, "down_proj"), strings.Contains(n, "v_proj"), strings.Contains(n, "up_proj"):
			return runtime.Q6_K
		case strings.Contains(n, "embed"):
			return runtime.Q8_0
		case strings.Contains(n, "lm_head"):
			return runtime.Q5_K
		}
		return runtime.Q4_K
	})
	ew, err := engineWeights(s, qw)
	if err != nil {
		t.Fatal(err)
	}
	for _, cdt := range []runtime.DType{runtime.F32, runtime.BF16} {
		dev := openCPU(t, cdt)
		e, err := newEngine(context.Background(), dev, s, ew, EngineOptions{CacheBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		jobs := auditJobs(s.Vocab, 16, s.Context)
		simulate(t, e, jobs)
		e.Close()
		auditCompare(t, s, deq, jobs, 0.12, "mixed/"+cdt.String())
	}
}
