package runtime

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func f32(shape ...int) TensorType { return TensorType{DType: F32, Shape: shape} }
func i32(shape ...int) TensorType { return TensorType{DType: I32, Shape: shape} }

// TestPlanGraphErrors holds the graph validation cases both adapters share
// (runtime/onednn's TestInvalidGraph and runtime/pjrt's TestLowerErrors run
// theirs through the adapters as well).
func TestPlanGraphErrors(t *testing.T) {
	bound := map[string]TensorType{
		"a": f32(4, 8), "w": f32(8, 3), "wt": f32(3, 8), "bias": f32(3), "bad_bias": f32(4),
		"y": f32(4, 3), "y_wrong": f32(3, 4), "v": f32(8), "x3": f32(2, 4, 8), "i": f32(5),
		"idx": i32(5), "idx2": i32(4, 8), "b16": {DType: BF16, Shape: []int{4, 8}}, "zero": f32(4, 0),
		"b16w": {DType: BF16, Shape: []int{8, 3}},
		"a32":  f32(4, 32), "q8": {DType: Q8_0, Shape: []int{6, 32}}, "q8odd": {DType: Q8_0, Shape: []int{3, 32}}, "bias6": f32(6),
	}
	mm := func(in ...string) Op { return Op{Kind: OpMatMul, In: in, Out: "y"} }
	tests := []struct {
		name string
		ops  []Op
		want string
	}{
		{"empty", nil, "empty graph"},
		{"unknown input", []Op{mm("a", "nope")}, `op 0 (matmul) reads "nope", which is neither bound nor written by an op`},
		{"read before write", []Op{{Kind: OpReLU, In: []string{"t"}, Out: "u"}, {Kind: OpReLU, In: []string{"a"}, Out: "t"}}, `op 0 (relu) reads "t" before op 1 writes it`},
		{"written twice", []Op{{Kind: OpReLU, In: []string{"a"}, Out: "t"}, {Kind: OpTanh, In: []string{"a"}, Out: "t"}}, `op 1 (tanh) writes "t", already written by op 0`},
		{"no output name", []Op{{Kind: OpReLU, In: []string{"a"}}}, "op 0 (relu) has no output name"},
		{"K mismatch", []Op{mm("a", "wt")}, "op 0 (matmul) [4,8] f32, [3,8] f32: inner dimensions differ: In[0] has K=8, In[1] has K=3"},
		{"bias shape", []Op{mm("a", "w", "bad_bias")}, "bias is [4], want [3]"},
		{"output shape", []Op{{Kind: OpMatMul, In: []string{"a", "w"}, Out: "y_wrong"}}, `output "y_wrong" is bound to [3,4] f32, want [4,3] f32`},
		{"too few inputs", []Op{mm("a")}, "takes 2 to 4 inputs, got 1"},
		{"residual shape", []Op{mm("a", "w", "bias", "a")}, "residual is [4,8], want the output's [4,3]"},
		{"residual type", []Op{mm("a", "w", "bias", "idx2")}, "In[3] is i32, want f32"},
		{"bf16 product with a residual", []Op{{Kind: OpMatMul, In: []string{"b16", "b16w", "bias", "y"}, Out: "t", DType: BF16}}, "a matmul with a residual writes f32, not bf16"},
		{"too many inputs", []Op{{Kind: OpReLU, In: []string{"a", "a"}, Out: "t"}}, "takes 1 inputs, got 2"},
		{"1-D matmul", []Op{mm("v", "w")}, "In[0] must have at least 2 dimensions"},
		{"3-D matmul weight", []Op{mm("a", "x3")}, "In[1] must be 2-D"},
		{"mixed matmul types", []Op{mm("b16", "w")}, "In[1] is f32 and In[0] bf16: both must be the same type"},
		{"matmul on indices", []Op{mm("idx2", "w")}, "In[0] is i32, want f32 or bf16"},
		{"batch-matmul rank", []Op{{Kind: OpBatchMatMul, In: []string{"a", "a"}, Out: "t"}}, "In[0] must have at least 3 dimensions"},
		{"batch-matmul batch", []Op{{Kind: OpBatchMatMul, In: []string{"x3", "a"}, Out: "t"}}, "batch dimensions differ"},
		{"batch-matmul K", []Op{{Kind: OpBatchMatMul, In: []string{"x3", "x3"}, Out: "t"}}, "inner dimensions differ: In[0] has K=8, In[1] has K=4"},
		{"activation on add", []Op{{Kind: OpAdd, In: []string{"a", "a"}, Out: "t", Act: ActReLU}}, "Act is only for matmul"},
		{"unknown activation", []Op{{Kind: OpMatMul, In: []string{"a", "w"}, Out: "y", Act: 9}}, "unknown activation 9"},
		{"GELU on quantized weights", []Op{{Kind: OpMatMul, In: []string{"a32", "q8"}, Out: "t", TransB: true, Act: ActGELU}}, "takes a bias or SwiGLU but no other activation or residual"},
		{"SwiGLU on float weights", []Op{{Kind: OpMatMul, In: []string{"a", "wt"}, Out: "t", TransB: true, Act: ActSwiGLU}}, "SwiGLU is only for a matmul with block-quantized weights and no bias"},
		{"SwiGLU with a bias", []Op{{Kind: OpMatMul, In: []string{"a32", "q8", "bias6"}, Out: "t", TransB: true, Act: ActSwiGLU}}, "SwiGLU is only for a matmul with block-quantized weights and no bias"},
		{"SwiGLU on odd columns", []Op{{Kind: OpMatMul, In: []string{"a32", "q8odd"}, Out: "t", TransB: true, Act: ActSwiGLU}}, "SwiGLU needs an even number of columns, not 3"},
		{"SwiGLU's output", []Op{{Kind: OpMatMul, In: []string{"a32", "q8"}, Out: "y_wrong", TransB: true, Act: ActSwiGLU}}, `output "y_wrong" is bound to [3,4] f32, want [4,3] f32`},
		{"transB on add", []Op{{Kind: OpAdd, In: []string{"a", "a"}, Out: "t", TransB: true}}, "TransB is only for matmul and batch-matmul"},
		{"scale on matmul", []Op{{Kind: OpMatMul, In: []string{"a", "w"}, Out: "y", Scale: 2}}, "Scale is only for batch-matmul"},
		{"eps on softmax", []Op{{Kind: OpSoftmax, In: []string{"a"}, Out: "t", Eps: 1e-5}}, "Eps is only for layer-norm"},
		{"add broadcast", []Op{{Kind: OpAdd, In: []string{"a", "bias"}, Out: "t"}}, "In[1] must be [4,8] or [8]"},
		{"layer-norm gamma", []Op{{Kind: OpLayerNorm, In: []string{"a", "bias", "v"}, Out: "t"}}, "In[1] is [3], want [8]"},
		{"negative eps", []Op{{Kind: OpLayerNorm, In: []string{"a", "v", "v"}, Out: "t", Eps: -1}}, "Eps -1 is negative"},
		{"gather float indices", []Op{{Kind: OpGather, In: []string{"a", "i"}, Out: "t"}}, "indices are f32, want i32"},
		{"gather 3-D table", []Op{{Kind: OpGather, In: []string{"x3", "idx"}, Out: "t"}}, "table must be 2-D [V,D]"},
		{"mean-pool 2-D", []Op{{Kind: OpMaskedMeanPool, In: []string{"a", "a"}, Out: "t"}}, "In[0] must be 3-D [B,S,D]"},
		{"mean-pool mask", []Op{{Kind: OpMaskedMeanPool, In: []string{"x3", "a"}, Out: "t"}}, "mask is [4,8], want [2,4]"},
		{"mean-pool bf16 mask", []Op{{Kind: OpMaskedMeanPool, In: []string{"x3", "b16"}, Out: "t"}}, "mask is bf16, want f32 or i32"},
		{"softmax on indices", []Op{{Kind: OpSoftmax, In: []string{"idx"}, Out: "t"}}, "In[0] is i32, want f32"},
		{"unknown kind", []Op{{Kind: 99, In: []string{"a"}, Out: "t"}}, "op 0 (op-kind(99)) [4,8] f32: unknown op kind 99"},
		{"not a permutation", []Op{{Kind: OpPermute, In: []string{"a"}, Out: "t", Perm: []int{0, 0}}}, "Perm [0 0] is not a permutation of 0..1"},
		{"permute rank", []Op{{Kind: OpPermute, In: []string{"a"}, Out: "t", Perm: []int{1, 0, 2}}}, "Perm [1 0 2] has 3 entries for 2 dimensions"},
		{"permute too many dimensions", []Op{{Kind: OpPermute, In: []string{"a"}, Out: "t", Shape: []int{1, 1, 1, 1, 1, 4, 8}, Perm: []int{0, 1, 2, 3, 4, 5, 6}}}, "7 dimensions, at most 6"},
		{"permute view count", []Op{{Kind: OpPermute, In: []string{"a"}, Out: "t", Shape: []int{4, 4}, Perm: []int{1, 0}}}, "Shape [4 4] has 16 elements, In[0] 32"},
		{"permute view dimension", []Op{{Kind: OpPermute, In: []string{"a"}, Out: "t", Shape: []int{32, 0}, Perm: []int{1, 0}}}, "Shape [32 0]: dimension 1 is 0"},
		{"permute indices", []Op{{Kind: OpPermute, In: []string{"idx"}, Out: "t", Perm: []int{0}}}, "In[0] is i32, want f32 or bf16"},
		{"perm on relu", []Op{{Kind: OpReLU, In: []string{"a"}, Out: "t", Perm: []int{0, 1}}}, "Perm is only for permute"},
		{"shape on add", []Op{{Kind: OpAdd, In: []string{"a", "a"}, Out: "t", Shape: []int{32}}}, "Shape is only for permute and reshape"},
		{"reshape count", []Op{{Kind: OpReshape, In: []string{"a"}, Out: "t", Shape: []int{5, 6}}}, "Shape [5 6] has 30 elements, In[0] 32"},
		{"reshape two free", []Op{{Kind: OpReshape, In: []string{"a"}, Out: "t", Shape: []int{-1, -1}}}, "Shape [-1 -1]: dimension 1 is -1"},
		{"reshape no shape", []Op{{Kind: OpReshape, In: []string{"a"}, Out: "t"}}, "no Shape"},
		{"reshape indivisible", []Op{{Kind: OpReshape, In: []string{"a"}, Out: "t", Shape: []int{-1, 5}}}, "Shape [-1 5] does not divide 32 elements"},
		{"masked softmax mask", []Op{{Kind: OpMaskedSoftmax, In: []string{"x3", "a"}, Out: "t"}}, "mask is [4,8], want [2,8]"},
		{"masked softmax 1-D", []Op{{Kind: OpMaskedSoftmax, In: []string{"v", "v"}, Out: "t"}}, "In[0] must have at least 2 dimensions [B,...,N]"},
		{"convert to i32", []Op{{Kind: OpConvert, In: []string{"a"}, Out: "t", DType: I32}}, "DType i32: want f32 or bf16"},
		{"dtype on add", []Op{{Kind: OpAdd, In: []string{"a", "a"}, Out: "t", DType: F32}}, "DType is only for convert, matmul, batch-matmul and attention"},
		{"bf16 products on attention", []Op{{Kind: OpAttention, In: []string{"a", "a"}, Out: "t", BF16Products: true}}, "BF16Products is only for paged-attention"},
		{"bf16 product of f32", []Op{{Kind: OpMatMul, In: []string{"a", "w"}, Out: "t", DType: BF16}}, "a bf16 product needs bf16 operands, not f32"},
		{"i32 product", []Op{{Kind: OpMatMul, In: []string{"b16", "b16w"}, Out: "t", DType: I32}}, "DType i32: a product is f32 or bf16"},
		{"gather i32 table", []Op{{Kind: OpGather, In: []string{"idx2", "idx"}, Out: "t"}}, "In[0] is i32, want f32 or bf16"},
		{"zero dimension", []Op{{Kind: OpReLU, In: []string{"zero"}, Out: "t"}}, "In[0] has shape [4,0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PlanGraph(&Graph{Ops: tt.ops}, bound)
			if !errors.Is(err, ErrInvalidGraph) {
				t.Fatalf("err = %v, want ErrInvalidGraph", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %q, want it to contain %q", err, tt.want)
			}
		})
	}
	t.Run("nil graph", func(t *testing.T) {
		if _, err := PlanGraph(nil, bound); !errors.Is(err, ErrInvalidGraph) || !strings.Contains(err.Error(), "empty graph") {
			t.Fatalf("err = %v, want ErrInvalidGraph: empty graph", err)
		}
	})
}

func TestPlanGraph(t *testing.T) {
	// x [2,5,32] → reshape [2,5,4,8] → permute [2,4,5,8] → matmul with w
	// (bound y) → relu (bound a). "unused" is bound but read by no op, so it
	// is not an input.
	g := &Graph{Ops: []Op{
		{Kind: OpReshape, In: []string{"x"}, Out: "r", Shape: []int{2, 5, 4, -1}},
		{Kind: OpPermute, In: []string{"r"}, Out: "p", Perm: []int{0, 2, 1, 3}},
		{Kind: OpMatMul, In: []string{"p", "w"}, Out: "y", TransB: true},
		{Kind: OpReLU, In: []string{"y"}, Out: "a"},
	}}
	bound := map[string]TensorType{"x": f32(2, 5, 32), "w": f32(3, 8), "y": f32(2, 4, 5, 3), "a": f32(2, 4, 5, 3), "unused": f32(1)}
	p, err := PlanGraph(g, bound)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"w", "x"}; !slices.Equal(p.Inputs, want) {
		t.Errorf("Inputs = %v, want %v", p.Inputs, want)
	}
	if want := []string{"a", "y"}; !slices.Equal(p.Outputs, want) {
		t.Errorf("Outputs = %v, want %v", p.Outputs, want)
	}
	if want := []string{"r", "p"}; !slices.Equal(p.Temps, want) {
		t.Errorf("Temps = %v, want %v", p.Temps, want)
	}
	if len(p.Steps) != 4 {
		t.Fatalf("%d steps, want 4", len(p.Steps))
	}
	for name, want := range map[string][]int{"r": {2, 5, 4, 8}, "p": {2, 4, 5, 8}, "y": {2, 4, 5, 3}, "unused": {1}} {
		if got := p.Types[name]; got.DType != F32 || !slices.Equal(got.Shape, want) {
			t.Errorf("Types[%q] = %s, want %v f32", name, got, want)
		}
	}
	if got, want := p.Steps[2].String(), "op 2 (matmul [2,4,5,8] f32, [3,8] f32, transB -> [2,4,5,3] f32)"; got != want {
		t.Errorf("Step.String() = %q, want %q", got, want)
	}
	if got, want := (&p.Steps[0]).String(), "op 0 (reshape [2,5,32] f32 -> [2,5,4,8] f32)"; got != want {
		t.Errorf("Step.String() = %q, want %q", got, want)
	}

	// bf16 products: a matmul and a batch matmul writing bf16, a bf16 gather.
	b16 := func(shape ...int) TensorType { return TensorType{DType: BF16, Shape: shape} }
	p, err = PlanGraph(&Graph{Ops: []Op{
		{Kind: OpMatMul, In: []string{"x", "w"}, Out: "h", TransB: true, DType: BF16},
		{Kind: OpBatchMatMul, In: []string{"h", "h"}, Out: "s", TransB: true, DType: BF16},
		{Kind: OpGather, In: []string{"w", "i"}, Out: "g"},
	}}, map[string]TensorType{"x": b16(2, 5, 8), "w": b16(3, 8), "i": i32(4)})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]TensorType{"h": b16(2, 5, 3), "s": b16(2, 5, 5), "g": b16(4, 8)} {
		if got := p.Types[name]; got.DType != want.DType || !slices.Equal(got.Shape, want.Shape) {
			t.Errorf("Types[%q] = %s, want %s", name, got, want)
		}
	}

	// A graph whose ops write no bound name plans (runtime/pjrt refuses it).
	p, err = PlanGraph(&Graph{Ops: []Op{{Kind: OpReLU, In: []string{"x"}, Out: "t"}}}, map[string]TensorType{"x": f32(2)})
	if err != nil || len(p.Outputs) != 0 || !slices.Equal(p.Temps, []string{"t"}) {
		t.Errorf("PlanGraph = %+v, %v; want no outputs, temp t", p, err)
	}
}

// TestPlanLLMOps covers the decoder-LLM ops' shape rules, and KVWrite's
// in-place cache: an input and an output of the plan at once.
func TestPlanLLMOps(t *testing.T) {
	b16 := func(shape ...int) TensorType { return TensorType{DType: BF16, Shape: shape} }
	bound := map[string]TensorType{
		"x": f32(5, 32), "w": f32(32), "w8": f32(8), "gu": f32(5, 64), "odd": f32(5, 7),
		"q": f32(5, 4, 8), "k": f32(5, 2, 8), "kb": b16(5, 2, 8), "pos": i32(5), "pos4": i32(4), "freq": f32(4), "freq3": f32(3),
		"kc": f32(6, 16, 2, 8), "vc": f32(6, 16, 2, 8), "kcb": b16(6, 16, 2, 8), "kc3": f32(6, 16, 3, 8),
		"table": i32(3, 2), "seq": i32(5), "slots": i32(5), "y": f32(5, 4, 8), "fslots": f32(5),
		"kq4": {DType: Q4_0, Shape: []int{6, 16, 2, 8}}, "kq4k": {DType: Q4_K, Shape: []int{6, 16, 2, 8}},
	}
	kvw := func(in ...string) Op { return Op{Kind: OpKVWrite, In: in, Out: "kc"} }
	attn := func(in ...string) Op { return Op{Kind: OpPagedAttention, In: in, Out: "y"} }
	errs := []struct {
		name string
		ops  []Op
		want string
	}{
		{"rms-norm weight", []Op{{Kind: OpRMSNorm, In: []string{"x", "w8"}, Out: "t"}}, "weight is [8], want [32]"},
		{"rms-norm bf16 weight", []Op{{Kind: OpRMSNorm, In: []string{"x", "kb"}, Out: "t"}}, "In[1] is bf16, want f32"},
		{"swiglu odd", []Op{{Kind: OpSwiGLU, In: []string{"odd"}, Out: "t"}}, "last dimension 7 is not [gate | up]"},
		{"rope 2-D", []Op{{Kind: OpRoPE, In: []string{"x", "pos", "freq"}, Out: "t"}}, "In[0] must be 3-D [T,H,D]"},
		{"rope positions", []Op{{Kind: OpRoPE, In: []string{"q", "pos4", "freq"}, Out: "t"}}, "positions are [4] i32, want [5] i32"},
		{"rope inv_freq", []Op{{Kind: OpRoPE, In: []string{"q", "pos", "freq3"}, Out: "t"}}, "inv_freq is [3] f32, want [4] f32"},
		{"eps on swiglu", []Op{{Kind: OpSwiGLU, In: []string{"gu"}, Out: "t", Eps: 1}}, "Eps is only for layer-norm and rms-norm"},
		{"kv-write unbound cache", []Op{{Kind: OpKVWrite, In: []string{"k", "slots"}, Out: "t"}}, `the cache "t" must be a bound buffer`},
		{"kv-write type", []Op{kvw("kb", "slots")}, "cache is [6,16,2,8] f32, want [NumBlocks,BlockSize,2,8] bf16"},
		{"kv-write heads", []Op{{Kind: OpKVWrite, In: []string{"k", "slots"}, Out: "kc3"}}, "want [NumBlocks,BlockSize,2,8] f32"},
		{"kv-write float slots", []Op{kvw("k", "fslots")}, "slots are [5] f32, want [5] i32"},
		{"kv-write scale", []Op{{Kind: OpKVWrite, In: []string{"k", "slots"}, Out: "kc", Scale: 1}}, "takes no Act"},
		{"kv-write q4_0 heads of 8", []Op{{Kind: OpKVWrite, In: []string{"k", "slots"}, Out: "kq4"}}, "a q4_0 cache holds whole blocks of 32: head dimension 8"},
		{"kv-write q4_K cache", []Op{{Kind: OpKVWrite, In: []string{"k", "slots"}, Out: "kq4k"}}, "want [NumBlocks,BlockSize,2,8] f32, f16, q8_0 or q4_0"},
		{"attention q4_0 heads of 8", []Op{attn("q", "kq4", "kq4", "table", "seq", "pos")}, "a q4_0 cache holds whole blocks of 32: head dimension 8"},
		{"attention q4_K cache", []Op{attn("q", "kq4k", "kq4k", "table", "seq", "pos")}, "Kcache is q4_K, want f32, bf16, f16, q8_0 or q4_0"},
		{"attention heads", []Op{attn("q", "kc3", "kc3", "table", "seq", "pos")}, "4 query heads are not a multiple of 3 kv heads"},
		{"attention v type", []Op{attn("q", "kc", "kcb", "table", "seq", "pos")}, "want [6,16,2,8] f32 like Kcache"},
		{"attention seq", []Op{attn("q", "kc", "vc", "table", "pos4", "pos")}, "In[4] is [4] i32, want [5] i32"},
		{"attention table", []Op{attn("q", "kc", "vc", "seq", "seq", "pos")}, "block table is [5] i32"},
		{"attention reads the cache before the write", []Op{attn("q", "kc", "vc", "table", "seq", "pos"), kvw("k", "slots")}, `reads "kc" before op 1 writes it`},
		{"attention negative scale", []Op{{Kind: OpPagedAttention, In: []string{"q", "kc", "vc", "table", "seq", "pos"}, Out: "y", Scale: -1}}, "Scale -1"},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PlanGraph(&Graph{Ops: tt.ops}, bound)
			if !errors.Is(err, ErrInvalidGraph) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidGraph containing %q", err, tt.want)
			}
		})
	}

	p, err := PlanGraph(&Graph{Ops: []Op{
		{Kind: OpRMSNorm, In: []string{"q", "w8"}, Out: "qn", Eps: 1e-6},
		{Kind: OpRoPE, In: []string{"qn", "pos", "freq"}, Out: "qr"},
		kvw("k", "slots"),
		{Kind: OpKVWrite, In: []string{"k", "slots"}, Out: "vc"},
		attn("qr", "kc", "vc", "table", "seq", "pos"),
		{Kind: OpSwiGLU, In: []string{"gu"}, Out: "s"},
		{Kind: OpSiLU, In: []string{"s"}, Out: "u"},
	}}, bound)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"freq", "gu", "k", "kc", "pos", "q", "seq", "slots", "table", "vc", "w8"}; !slices.Equal(p.Inputs, want) {
		t.Errorf("Inputs = %v, want %v (the caches are read as well as written)", p.Inputs, want)
	}
	if want := []string{"kc", "vc", "y"}; !slices.Equal(p.Outputs, want) {
		t.Errorf("Outputs = %v, want %v", p.Outputs, want)
	}
	for name, want := range map[string]TensorType{"qn": f32(5, 4, 8), "qr": f32(5, 4, 8), "kc": f32(6, 16, 2, 8), "s": f32(5, 32), "u": f32(5, 32)} {
		if got := p.Types[name]; got.DType != want.DType || !slices.Equal(got.Shape, want.Shape) {
			t.Errorf("Types[%q] = %s, want %s", name, got, want)
		}
	}
	// bf16 data keeps its type through the LLM ops.
	p, err = PlanGraph(&Graph{Ops: []Op{
		{Kind: OpKVWrite, In: []string{"kb", "slots"}, Out: "kcb"},
		{Kind: OpRoPE, In: []string{"kb", "pos", "freq"}, Out: "r"},
	}}, bound)
	if err != nil || p.Types["r"].DType != BF16 || !slices.Equal(p.Outputs, []string{"kcb"}) {
		t.Errorf("bf16 plan = %+v, %v", p, err)
	}
}

func TestOpKindString(t *testing.T) {
	for k := OpMatMul; k <= OpPagedAttention; k++ {
		if s := k.String(); s == "" || strings.HasPrefix(s, "op-kind(") {
			t.Errorf("OpKind %d has no name", uint8(k))
		}
	}
	if s := OpKind(99).String(); s != "op-kind(99)" {
		t.Errorf("OpKind(99) = %q", s)
	}
}
