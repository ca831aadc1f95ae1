package pjrt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/hashenc"
	"github.com/brokerd/brokerd/runtime/models"
)

func f32(shape ...int) TensorType  { return TensorType{DType: runtime.F32, Shape: shape} }
func bf16(shape ...int) TensorType { return TensorType{DType: runtime.BF16, Shape: shape} }
func i32(shape ...int) TensorType  { return TensorType{DType: runtime.I32, Shape: shape} }

// loweringCase is a one-op graph: its op, the bound types ("y" is the
// output), and what its program must and must not contain.
type loweringCase struct {
	name  string
	op    runtime.Op
	bound map[string]TensorType
	want  []string // substrings of the program, in order
	not   []string // substrings it must not have
}

// loweringCases covers every op kind and its variants. TestAgainstCPU runs
// them on a plugin too.
func loweringCases() []loweringCase {
	op := func(kind runtime.OpKind, in ...string) runtime.Op { return runtime.Op{Kind: kind, In: in, Out: "y"} }
	return []loweringCase{
		{
			name:  "matmul",
			op:    op(runtime.OpMatMul, "x", "w"),
			bound: map[string]TensorType{"x": f32(4, 3), "w": f32(3, 5), "y": f32(4, 5)},
			want: []string{"func.func @main(%in0: tensor<3x5xf32>, %in1: tensor<4x3xf32>) -> tensor<4x5xf32>",
				"stablehlo.dot_general\"(%in1, %in0)", "lhs_contracting_dimensions = [1]", "rhs_contracting_dimensions = [0]",
				"precision HIGHEST", "(tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>"},
			not: []string{"stablehlo.add"},
		},
		{
			name:  "matmul transB with bias and relu",
			op:    runtime.Op{Kind: runtime.OpMatMul, In: []string{"x", "w", "b"}, Out: "y", TransB: true, Act: runtime.ActReLU},
			bound: map[string]TensorType{"x": f32(4, 3), "w": f32(5, 3), "b": f32(5), "y": f32(4, 5)},
			want: []string{"rhs_contracting_dimensions = [1]", "broadcast_dimensions = array<i64: 1> } : (tensor<5xf32>) -> tensor<4x5xf32>",
				"stablehlo.add", "dense<0.0>", "stablehlo.maximum"},
		},
		{
			name:  "matmul with bias, gelu and a residual",
			op:    runtime.Op{Kind: runtime.OpMatMul, In: []string{"x", "w", "b", "r"}, Out: "y", TransB: true, Act: runtime.ActGELU},
			bound: map[string]TensorType{"x": f32(2, 7, 3), "w": f32(5, 3), "b": f32(5), "r": f32(2, 7, 5), "y": f32(2, 7, 5)},
			want:  []string{"stablehlo.dot_general", "stablehlo.add", "chlo.erf", "stablehlo.add\"(%", ", %in"},
		},
		{
			name:  "matmul of a 3-D input with gelu",
			op:    runtime.Op{Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y", Act: runtime.ActGELU},
			bound: map[string]TensorType{"x": f32(2, 7, 3), "w": f32(3, 5), "y": f32(2, 7, 5)},
			want:  []string{"lhs_contracting_dimensions = [2]", "-> tensor<2x7x5xf32>", "chlo.erf", "dense<0.5>"},
		},
		{
			name:  "matmul with tanh, tf32 allowed",
			op:    runtime.Op{Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y", Act: runtime.ActTanh},
			bound: map[string]TensorType{"x": f32(2, 3), "w": f32(3, 5), "y": f32(2, 5)},
			want:  []string{"precision DEFAULT", "stablehlo.tanh"},
			not:   []string{"HIGHEST"},
		},
		{
			name:  "bf16 matmul accumulates to f32",
			op:    runtime.Op{Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y", TransB: true},
			bound: map[string]TensorType{"x": bf16(4, 3), "w": bf16(5, 3), "y": f32(4, 5)},
			want:  []string{"precision DEFAULT", "(tensor<4x3xbf16>, tensor<5x3xbf16>) -> tensor<4x5xf32>"},
		},
		{
			name:  "bf16 product",
			op:    runtime.Op{Kind: runtime.OpMatMul, In: []string{"x", "w", "b"}, Out: "y", TransB: true, Act: runtime.ActReLU, DType: runtime.BF16},
			bound: map[string]TensorType{"x": bf16(4, 3), "w": bf16(5, 3), "b": f32(5), "y": bf16(4, 5)},
			want: []string{"(tensor<4x3xbf16>, tensor<5x3xbf16>) -> tensor<4x5xf32>", "stablehlo.add", "stablehlo.maximum",
				"stablehlo.convert", "(tensor<4x5xf32>) -> tensor<4x5xbf16>"},
		},
		{
			name:  "bf16 batch product with scale",
			op:    runtime.Op{Kind: runtime.OpBatchMatMul, In: []string{"p", "v"}, Out: "y", Scale: 0.5, DType: runtime.BF16},
			bound: map[string]TensorType{"p": bf16(3, 6, 6), "v": bf16(3, 6, 8), "y": bf16(3, 6, 8)},
			want:  []string{"-> tensor<3x6x8xf32>", "stablehlo.multiply", "(tensor<3x6x8xf32>) -> tensor<3x6x8xbf16>"},
		},
		{
			name:  "gather from a bf16 table",
			op:    op(runtime.OpGather, "table", "ids"), // the names TestAgainstCPU's inputs know
			bound: map[string]TensorType{"table": bf16(10, 4), "ids": {DType: runtime.I32, Shape: []int{2, 3}}, "y": bf16(2, 3, 4)},
			want:  []string{"stablehlo.gather", "-> tensor<2x3x4xbf16>"},
		},
		{
			name:  "batch matmul with scale",
			op:    runtime.Op{Kind: runtime.OpBatchMatMul, In: []string{"q", "k"}, Out: "y", TransB: true, Scale: 0.125},
			bound: map[string]TensorType{"q": f32(2, 4, 6, 8), "k": f32(2, 4, 6, 8), "y": f32(2, 4, 6, 6)},
			want: []string{"lhs_batching_dimensions = [0, 1]", "rhs_batching_dimensions = [0, 1]",
				"lhs_contracting_dimensions = [3]", "rhs_contracting_dimensions = [3]", "-> tensor<2x4x6x6xf32>", "dense<0.125>", "stablehlo.multiply"},
		},
		{
			name:  "batch matmul",
			op:    op(runtime.OpBatchMatMul, "p", "v"),
			bound: map[string]TensorType{"p": f32(3, 6, 6), "v": f32(3, 6, 8), "y": f32(3, 6, 8)},
			want:  []string{"lhs_batching_dimensions = [0]", "rhs_contracting_dimensions = [1]", "-> tensor<3x6x8xf32>"},
			not:   []string{"stablehlo.multiply"},
		},
		{
			name:  "fused attention",
			op:    runtime.Op{Kind: runtime.OpAttention, In: []string{"x", "m"}, Out: "y", Heads: 2},
			bound: map[string]TensorType{"x": f32(3, 5, 24), "m": f32(3, 5), "y": f32(3, 5, 8)},
			want: []string{"(tensor<3x5x24xf32>) -> tensor<3x5x3x2x4xf32>", "stablehlo.slice",
				"lhs_batching_dimensions = [0, 2]", "rhs_batching_dimensions = [0, 2]", "lhs_contracting_dimensions = [3]",
				"-> tensor<3x2x5x5xf32>", "dense<0.5>", "stablehlo.select", "stablehlo.exponential",
				"lhs_batching_dimensions = [0, 1]", "rhs_batching_dimensions = [0, 2]", "rhs_contracting_dimensions = [1]",
				"-> tensor<3x2x5x4xf32>", "stablehlo.transpose", "-> tensor<3x5x8xf32>"},
		},
		{
			name:  "fused attention in bf16, i32 mask, bf16 out",
			op:    runtime.Op{Kind: runtime.OpAttention, In: []string{"x", "m"}, Out: "y", Heads: 4, Scale: 0.25, DType: runtime.BF16},
			bound: map[string]TensorType{"x": bf16(2, 7, 48), "m": i32(2, 7), "y": bf16(2, 7, 16)},
			want: []string{"-> tensor<2x4x7x7xf32>", "dense<0.25>", "comparison_type SIGNED",
				"(tensor<2x4x7x7xf32>) -> tensor<2x4x7x7xbf16>", "(tensor<2x4x7x7xbf16>, tensor<2x7x4x4xbf16>) -> tensor<2x4x7x4xf32>",
				"(tensor<2x7x16xf32>) -> tensor<2x7x16xbf16>"},
		},
		{
			name:  "add",
			op:    op(runtime.OpAdd, "a", "b"),
			bound: map[string]TensorType{"a": f32(2, 3), "b": f32(2, 3), "y": f32(2, 3)},
			want:  []string{"stablehlo.add\"(%in0, %in1)"},
			not:   []string{"broadcast_in_dim"},
		},
		{
			name:  "add broadcasting a row",
			op:    op(runtime.OpAdd, "a", "b"),
			bound: map[string]TensorType{"a": f32(2, 5, 3), "b": f32(3), "y": f32(2, 5, 3)},
			want:  []string{"broadcast_dimensions = array<i64: 2> } : (tensor<3xf32>) -> tensor<2x5x3xf32>", "stablehlo.add"},
		},
		{
			name:  "layer norm",
			op:    runtime.Op{Kind: runtime.OpLayerNorm, In: []string{"x", "g", "b"}, Out: "y", Eps: 1e-5},
			bound: map[string]TensorType{"x": f32(4, 8), "g": f32(8), "b": f32(8), "y": f32(4, 8)},
			want: []string{"stablehlo.reduce", "dimensions = array<i64: 1>", "dense<0.125>", "stablehlo.subtract",
				"dense<9.99999974", "stablehlo.rsqrt", "stablehlo.multiply", "stablehlo.add"},
		},
		{
			name:  "softmax",
			op:    op(runtime.OpSoftmax, "x"),
			bound: map[string]TensorType{"x": f32(4, 8), "y": f32(4, 8)},
			want:  []string{"dense<0xff800000>", "stablehlo.maximum", "stablehlo.subtract", "stablehlo.exponential", "stablehlo.add", "stablehlo.divide"},
			not:   []string{"stablehlo.select"},
		},
		{
			name:  "masked softmax, f32 mask",
			op:    op(runtime.OpMaskedSoftmax, "x", "m"),
			bound: map[string]TensorType{"x": f32(2, 4, 6, 6), "m": f32(2, 6), "y": f32(2, 4, 6, 6)},
			want: []string{"comparison_direction NE", "broadcast_dimensions = array<i64: 0, 3> } : (tensor<2x6xi1>) -> tensor<2x4x6x6xi1>",
				"stablehlo.select", "stablehlo.is_finite", "stablehlo.exponential", "stablehlo.divide", "comparison_direction GT",
				"dense<0.16666667"},
		},
		{
			name:  "masked softmax, i32 mask",
			op:    op(runtime.OpMaskedSoftmax, "x", "m"),
			bound: map[string]TensorType{"x": f32(2, 3), "m": i32(2, 3), "y": f32(2, 3)},
			want:  []string{"comparison_type SIGNED", "comparison_direction NE", "(tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<2x3xi1>"},
		},
		{
			name:  "gelu",
			op:    op(runtime.OpGELU, "x"),
			bound: map[string]TensorType{"x": f32(3, 4), "y": f32(3, 4)},
			want:  []string{"dense<0.70710676", "chlo.erf", "dense<1.0>", "stablehlo.add", "stablehlo.multiply", "dense<0.5>"},
		},
		{
			name:  "relu",
			op:    op(runtime.OpReLU, "x"),
			bound: map[string]TensorType{"x": f32(3, 4), "y": f32(3, 4)},
			want:  []string{"stablehlo.maximum\"(%in0"},
		},
		{
			name:  "tanh",
			op:    op(runtime.OpTanh, "x"),
			bound: map[string]TensorType{"x": f32(3, 4), "y": f32(3, 4)},
			want:  []string{"stablehlo.tanh\"(%in0) : (tensor<3x4xf32>) -> tensor<3x4xf32>"},
		},
		{
			name:  "gather",
			op:    op(runtime.OpGather, "table", "ids"),
			bound: map[string]TensorType{"table": f32(100, 16), "ids": i32(2, 7), "y": f32(2, 7, 16)},
			want: []string{"(tensor<2x7xi32>) -> tensor<2x7x1xi32>", "stablehlo.gather", "offset_dims = [2]", "collapsed_slice_dims = [0]",
				"index_vector_dim = 2", "slice_sizes = array<i64: 1, 16>", "-> tensor<2x7x16xf32>"},
		},
		{
			name:  "masked mean pool",
			op:    op(runtime.OpMaskedMeanPool, "x", "m"),
			bound: map[string]TensorType{"x": f32(2, 7, 16), "m": f32(2, 7), "y": f32(2, 16)},
			want: []string{"comparison_direction NE", "stablehlo.convert", "(tensor<2x7xi1>) -> tensor<2x7xf32>", "stablehlo.multiply",
				"(tensor<2x7x16xf32>, tensor<f32>) -> tensor<2x16xf32>", "stablehlo.maximum", "stablehlo.divide"},
		},
		{
			name:  "l2 normalise",
			op:    op(runtime.OpL2Normalize, "x"),
			bound: map[string]TensorType{"x": f32(3, 8), "y": f32(3, 8)},
			want:  []string{"stablehlo.multiply\"(%in0, %in0)", "stablehlo.reduce", "stablehlo.sqrt", "stablehlo.divide", "comparison_direction GT", "stablehlo.select"},
		},
		{
			name:  "permute with a view",
			op:    runtime.Op{Kind: runtime.OpPermute, In: []string{"x"}, Out: "y", Shape: []int{2, 5, 4, 8}, Perm: []int{0, 2, 1, 3}},
			bound: map[string]TensorType{"x": f32(2, 5, 32), "y": f32(2, 4, 5, 8)},
			want:  []string{"(tensor<2x5x32xf32>) -> tensor<2x5x4x8xf32>", "stablehlo.transpose", "permutation = array<i64: 0, 2, 1, 3>", "-> tensor<2x4x5x8xf32>"},
		},
		{
			name:  "permute bf16",
			op:    runtime.Op{Kind: runtime.OpPermute, In: []string{"x"}, Out: "y", Perm: []int{1, 0}},
			bound: map[string]TensorType{"x": bf16(2, 5), "y": bf16(5, 2)},
			want:  []string{"stablehlo.transpose", "(tensor<2x5xbf16>) -> tensor<5x2xbf16>"},
			not:   []string{"stablehlo.reshape"},
		},
		{
			name:  "reshape with an inferred dimension",
			op:    runtime.Op{Kind: runtime.OpReshape, In: []string{"x"}, Out: "y", Shape: []int{2, -1}},
			bound: map[string]TensorType{"x": f32(2, 4, 5, 8), "y": f32(2, 160)},
			want:  []string{"stablehlo.reshape\"(%in0) : (tensor<2x4x5x8xf32>) -> tensor<2x160xf32>"},
		},
		{
			name:  "convert to bf16",
			op:    runtime.Op{Kind: runtime.OpConvert, In: []string{"x"}, Out: "y", DType: runtime.BF16},
			bound: map[string]TensorType{"x": f32(3, 4), "y": bf16(3, 4)},
			want:  []string{"stablehlo.convert\"(%in0) : (tensor<3x4xf32>) -> tensor<3x4xbf16>"},
		},
		{
			name:  "rms-norm",
			op:    runtime.Op{Kind: runtime.OpRMSNorm, In: []string{"x", "w"}, Out: "y", Eps: 1e-6},
			bound: map[string]TensorType{"x": f32(3, 2, 8), "w": f32(8), "y": f32(3, 2, 8)},
			want: []string{"stablehlo.multiply\"(%in1, %in1)", "stablehlo.reduce", "dense<0.125>",
				"stablehlo.rsqrt", "broadcast_dimensions = array<i64: 2> } : (tensor<8xf32>) -> tensor<3x2x8xf32>"},
			not: []string{"stablehlo.subtract", "stablehlo.convert"},
		},
		{
			name:  "rms-norm bf16",
			op:    runtime.Op{Kind: runtime.OpRMSNorm, In: []string{"x", "w"}, Out: "y", Eps: 1e-5},
			bound: map[string]TensorType{"x": bf16(3, 8), "w": f32(8), "y": bf16(3, 8)},
			want:  []string{"(tensor<3x8xbf16>) -> tensor<3x8xf32>", "stablehlo.rsqrt", "(tensor<3x8xf32>) -> tensor<3x8xbf16>"},
		},
		{
			name:  "silu",
			op:    op(runtime.OpSiLU, "x"),
			bound: map[string]TensorType{"x": f32(3, 4), "y": f32(3, 4)},
			want:  []string{"stablehlo.logistic\"(%in0)", "stablehlo.multiply\"(%in0"},
		},
		{
			name:  "swiglu",
			op:    op(runtime.OpSwiGLU, "x"),
			bound: map[string]TensorType{"x": f32(3, 10), "y": f32(3, 5)},
			want: []string{"stablehlo.slice", "limit_indices = array<i64: 3, 5>", "stablehlo.slice", "start_indices = array<i64: 0, 5>",
				"stablehlo.logistic", "stablehlo.multiply", "-> tensor<3x5xf32>"},
		},
		{
			name:  "rope bf16",
			op:    op(runtime.OpRoPE, "x", "pos", "f"),
			bound: map[string]TensorType{"x": bf16(4, 2, 8), "pos": i32(4), "f": f32(4), "y": bf16(4, 2, 8)},
			want: []string{"(tensor<4xi32>) -> tensor<4xf32>", "stablehlo.multiply", "stablehlo.cosine", "stablehlo.sine",
				"stablehlo.subtract", "stablehlo.add", "stablehlo.concatenate", "(tensor<4x2x8xf32>) -> tensor<4x2x8xbf16>"},
		},
		{
			// The cache is bound as "y": the op's output and an input.
			name:  "kv-write",
			op:    runtime.Op{Kind: runtime.OpKVWrite, In: []string{"k", "slots"}, Out: "y"},
			bound: map[string]TensorType{"k": f32(5, 2, 4), "slots": i32(5), "y": f32(3, 4, 2, 4)},
			want: []string{"%in2: tensor<3x4x2x4xf32> { tf.aliasing_output = 0 : i32 }",
				"(tensor<3x4x2x4xf32>) -> tensor<12x2x4xf32>", "(tensor<5xi32>) -> tensor<5x1xi32>", "stablehlo.scatter",
				"update_window_dims = [1, 2]", "inserted_window_dims = [0]", "(tensor<12x2x4xf32>) -> tensor<3x4x2x4xf32>"},
		},
		{
			name: "paged-attention gqa2",
			op:   op(runtime.OpPagedAttention, "q", "kc", "vc", "table", "seq", "pos"),
			bound: map[string]TensorType{"q": f32(5, 4, 8), "kc": f32(6, 4, 2, 8), "vc": f32(6, 4, 2, 8), "table": i32(3, 2),
				"seq": i32(5), "pos": i32(5), "y": f32(5, 4, 8)},
			want: []string{"stablehlo.gather", "-> tensor<5x2xi32>", "stablehlo.iota", "comparison_direction LE", "stablehlo.gather",
				"-> tensor<5x2x4x2x8xf32>", "stablehlo.select", "(tensor<5x4x8xf32>) -> tensor<5x2x2x8xf32>",
				"lhs_batching_dimensions = [0, 1]", "rhs_batching_dimensions = [0, 2]", "-> tensor<5x2x2x8xf32>",
				"stablehlo.exponential", "stablehlo.dot_general", "-> tensor<5x2x2x8xf32>", "-> tensor<5x4x8xf32>"},
		},
		{
			name: "paged-attention bf16 cache",
			op:   runtime.Op{Kind: runtime.OpPagedAttention, In: []string{"q", "kc", "vc", "table", "seq", "pos"}, Out: "y", Scale: 0.5},
			bound: map[string]TensorType{"q": bf16(2, 7, 4), "kc": bf16(3, 16, 1, 4), "vc": bf16(3, 16, 1, 4), "table": i32(2, 3),
				"seq": i32(2), "pos": i32(2), "y": bf16(2, 7, 4)},
			want: []string{"(tensor<2x48x1x4xbf16>) -> tensor<2x48x1x4xf32>", "dense<0.5>", "-> tensor<2x7x4xbf16>"},
		},
	}
}

// TestLowerOps lowers a one-op graph for every op kind and its variants, and
// checks the program's signature and the StableHLO ops it is made of.
func TestLowerOps(t *testing.T) {
	tests := loweringCases()
	covered := map[runtime.OpKind]bool{}
	for _, tt := range tests {
		covered[tt.op.Kind] = true
	}
	for k := runtime.OpMatMul; k <= runtime.OpPagedAttention; k++ {
		if !covered[k] {
			t.Errorf("op kind %s has no lowering test", k)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := LowerOptions{AllowTF32: strings.Contains(tt.name, "tf32")}
			p, err := Lower(&runtime.Graph{Ops: []runtime.Op{tt.op}}, tt.bound, opts)
			if err != nil {
				t.Fatalf("Lower: %v", err)
			}
			text := string(p.Text)
			if !strings.HasPrefix(text, "module @brokerd_graph {") {
				t.Errorf("program does not start with the module:\n%s", text)
			}
			at := 0
			for _, w := range tt.want {
				i := strings.Index(text[at:], w)
				if i < 0 {
					t.Fatalf("program lacks %q after offset %d:\n%s", w, at, text)
				}
				at += i + len(w)
			}
			for _, n := range tt.not {
				if strings.Contains(text, n) {
					t.Errorf("program has %q:\n%s", n, text)
				}
			}
			if !slices.Equal(p.Outputs, []string{"y"}) {
				t.Errorf("Outputs = %v, want [y]", p.Outputs)
			}
			var wantIn []string
			for name := range tt.bound {
				if name != "y" || tt.op.Kind == runtime.OpKVWrite { // the cache is read too
					wantIn = append(wantIn, name)
				}
			}
			slices.Sort(wantIn)
			if !slices.Equal(p.Inputs, wantIn) {
				t.Errorf("Inputs = %v, want %v", p.Inputs, wantIn)
			}
			// Only a buffer the program reads and writes is updated in place.
			wantAliased := map[int]int{}
			if tt.op.Kind == runtime.OpKVWrite {
				wantAliased[slices.Index(p.Inputs, "y")] = 0
			} else if strings.Contains(text, "aliasing_output") {
				t.Errorf("program aliases an input:\n%s", text)
			}
			if fmt.Sprint(p.Aliased) != fmt.Sprint(wantAliased) {
				t.Errorf("Aliased = %v, want %v", p.Aliased, wantAliased)
			}
			again, err := Lower(&runtime.Graph{Ops: []runtime.Op{tt.op}}, tt.bound, opts)
			if err != nil || !bytes.Equal(again.Text, p.Text) {
				t.Errorf("a second Lower gave different text (err %v)", err)
			}
		})
	}
}

func TestLowerErrors(t *testing.T) {
	mm := runtime.Op{Kind: runtime.OpMatMul, In: []string{"x", "w"}, Out: "y"}
	tests := []struct {
		name  string
		g     *runtime.Graph
		bound map[string]TensorType
		want  string
	}{
		{"nil graph", nil, nil, "empty graph"},
		{"unbound input", &runtime.Graph{Ops: []runtime.Op{mm}}, map[string]TensorType{"x": f32(2, 3), "y": f32(2, 4)},
			`reads "w", which is neither bound nor written`},
		{"inner dimensions", &runtime.Graph{Ops: []runtime.Op{mm}}, map[string]TensorType{"x": f32(2, 3), "w": f32(4, 4), "y": f32(2, 4)},
			"inner dimensions differ"},
		{"output bound to the wrong shape", &runtime.Graph{Ops: []runtime.Op{mm}}, map[string]TensorType{"x": f32(2, 3), "w": f32(3, 4), "y": f32(2, 5)},
			`output "y" is bound to [2,5] f32, want [2,4] f32`},
		{"no output", &runtime.Graph{Ops: []runtime.Op{mm}}, map[string]TensorType{"x": f32(2, 3), "w": f32(3, 4)},
			"no op writes a bound name"},
		{"written twice", &runtime.Graph{Ops: []runtime.Op{mm, mm}}, map[string]TensorType{"x": f32(2, 3), "w": f32(3, 4), "y": f32(2, 4)},
			`writes "y", already written by op 0`},
		{"field the op does not use", &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpSoftmax, In: []string{"x"}, Out: "y", Scale: 2}}},
			map[string]TensorType{"x": f32(2, 3), "y": f32(2, 3)}, "Scale is only for batch-matmul"},
		{"gather with f32 indices", &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpGather, In: []string{"t", "i"}, Out: "y"}}},
			map[string]TensorType{"t": f32(5, 3), "i": f32(2), "y": f32(2, 3)}, "indices are f32, want i32"},
		{"mask of the wrong shape", &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpMaskedSoftmax, In: []string{"x", "m"}, Out: "y"}}},
			map[string]TensorType{"x": f32(2, 3, 4), "m": f32(2, 3), "y": f32(2, 3, 4)}, "mask is [2,3], want [2,4]"},
		{"reshape to another count", &runtime.Graph{Ops: []runtime.Op{{Kind: runtime.OpReshape, In: []string{"x"}, Out: "y", Shape: []int{5}}}},
			map[string]TensorType{"x": f32(2, 3), "y": f32(5)}, "Shape [5] has 5 elements, In[0] 6"},
		{"mixed matmul types", &runtime.Graph{Ops: []runtime.Op{mm}}, map[string]TensorType{"x": bf16(2, 3), "w": f32(3, 4), "y": f32(2, 4)},
			"both must be the same type"},
		{"unknown op", &runtime.Graph{Ops: []runtime.Op{{Kind: 99, In: []string{"x"}, Out: "y"}}}, map[string]TensorType{"x": f32(1), "y": f32(1)},
			"unknown op kind 99"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Lower(tt.g, tt.bound, LowerOptions{})
			if !errors.Is(err, runtime.ErrInvalidGraph) {
				t.Fatalf("Lower = %v, want ErrInvalidGraph", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

// recorder is a runtime.Device that runs nothing: it lowers every graph it
// is asked to run with the bound buffers' types and keeps the programs, so
// the models' real graphs can be lowered without a plugin. CopyOut gives
// zeros.
type recorder struct {
	compute runtime.DType

	mu    sync.Mutex
	progs []*Program
	errs  []error
}

// PadBuckets asks for the padding a real Device asks for, so the models
// build the graphs PJRT gets.
func (r *recorder) PadBuckets() (batch, seq []int) { return BatchBuckets(MaxBatchBucket), SeqBuckets() }

type recBuf struct {
	dt    runtime.DType
	shape []int
}

func (b *recBuf) DType() runtime.DType { return b.dt }
func (b *recBuf) Shape() []int         { return b.shape }
func (b *recBuf) Bytes() int64         { return 0 }

func (r *recorder) ID() string { return "gpu:0" }
func (r *recorder) ComputeType() runtime.DType {
	if r.compute == 0 {
		return runtime.F32
	}
	return r.compute
}
func (r *recorder) Alloc(dt runtime.DType, shape ...int) (runtime.Buffer, error) {
	return &recBuf{dt, append([]int(nil), shape...)}, nil
}
func (r *recorder) Free(runtime.Buffer)                                        {}
func (r *recorder) CopyIn(context.Context, runtime.Buffer, []float32) error    { return nil }
func (r *recorder) CopyInInt32(context.Context, runtime.Buffer, []int32) error { return nil }
func (r *recorder) CopyOut(_ context.Context, dst []float32, _ runtime.Buffer) error {
	clear(dst)
	return nil
}
func (r *recorder) Synchronize(context.Context) error { return nil }
func (r *recorder) MemoryUsed() uint64                { return 0 }
func (r *recorder) Close() error                      { return nil }
func (r *recorder) Run(_ context.Context, g *runtime.Graph, bind map[string]runtime.Buffer) error {
	types := map[string]TensorType{}
	for name, b := range bind {
		types[name] = TensorType{DType: b.DType(), Shape: b.Shape()}
	}
	p, err := Lower(g, types, LowerOptions{})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progs = append(r.progs, p)
	r.errs = append(r.errs, err)
	return err
}

// last returns the last program lowered, failing the test on a lowering error.
func (r *recorder) last(t *testing.T) string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.progs) == 0 {
		t.Fatal("the model ran no graph")
	}
	if err := r.errs[len(r.errs)-1]; err != nil {
		t.Fatalf("lowering the model's graph: %v", err)
	}
	return string(r.progs[len(r.progs)-1].Text)
}

func randTensor(rng *rand.Rand, shape ...int) models.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * 0.05)
	}
	return models.Tensor{Shape: shape, Data: v}
}

// tinyBERT returns random weights of a BERT with the given sizes, pooler
// and a classifier of labels outputs included (an encoder drops them).
func tinyBERT(cfg models.BERTConfig, labels int, seed uint64) map[string]models.Tensor {
	rng := rand.New(rand.NewPCG(seed, 1))
	h, in := cfg.HiddenSize, cfg.IntermediateSize
	w := map[string]models.Tensor{
		"embeddings.word_embeddings.weight":       randTensor(rng, cfg.VocabSize, h),
		"embeddings.position_embeddings.weight":   randTensor(rng, cfg.MaxPositionEmbeddings, h),
		"embeddings.token_type_embeddings.weight": randTensor(rng, 2, h),
		"embeddings.LayerNorm.weight":             randTensor(rng, h),
		"embeddings.LayerNorm.bias":               randTensor(rng, h),
		"pooler.dense.weight":                     randTensor(rng, h, h),
		"pooler.dense.bias":                       randTensor(rng, h),
		"classifier.weight":                       randTensor(rng, labels, h),
		"classifier.bias":                         randTensor(rng, labels),
	}
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		for name, shape := range map[string][]int{
			"attention.self.query.weight": {h, h}, "attention.self.query.bias": {h},
			"attention.self.key.weight": {h, h}, "attention.self.key.bias": {h},
			"attention.self.value.weight": {h, h}, "attention.self.value.bias": {h},
			"attention.output.dense.weight": {h, h}, "attention.output.dense.bias": {h},
			"attention.output.LayerNorm.weight": {h}, "attention.output.LayerNorm.bias": {h},
			"intermediate.dense.weight": {in, h}, "intermediate.dense.bias": {in},
			"output.dense.weight": {h, in}, "output.dense.bias": {h},
			"output.LayerNorm.weight": {h}, "output.LayerNorm.bias": {h},
		} {
			w[p+name] = randTensor(rng, shape...)
		}
	}
	return w
}

// tinyMLP returns an MLP spec using every layer type, and its weights.
func tinyMLP(seed uint64) (models.MLPSpec, map[string]models.Tensor) {
	rng := rand.New(rand.NewPCG(seed, 2))
	spec := models.MLPSpec{Name: "tiny-mlp", InputDim: 12, Layers: []models.MLPLayer{
		{Type: models.LayerLinear, Weight: "l0.w", Bias: "l0.b"}, {Type: models.LayerReLU},
		{Type: models.LayerLayerNorm, Weight: "ln.w", Bias: "ln.b"},
		{Type: models.LayerLinear, Weight: "l1.w", Bias: "l1.b"}, {Type: models.LayerGELU},
		{Type: models.LayerTanh},
		{Type: models.LayerLinear, Weight: "l2.w"}, {Type: models.LayerSoftmax},
	}}
	return spec, map[string]models.Tensor{
		"l0.w": randTensor(rng, 16, 12), "l0.b": randTensor(rng, 16),
		"ln.w": randTensor(rng, 16), "ln.b": randTensor(rng, 16),
		"l1.w": randTensor(rng, 8, 16), "l1.b": randTensor(rng, 8),
		"l2.w": randTensor(rng, 3, 8),
	}
}

var tinyBERTConfig = models.BERTConfig{
	VocabSize: 50, HiddenSize: 16, NumHiddenLayers: 2, NumAttentionHeads: 4,
	IntermediateSize: 32, MaxPositionEmbeddings: 64,
}

// TestLowerModels runs every model kind's replica on a recorder, so the
// graphs are the ones the models build, and checks their programs.
func TestLowerModels(t *testing.T) {
	ctx := context.Background()
	texts := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			ids := make([]int32, 3+4*i) // lengths 3, 7, ...: one batch padded to the 32 bucket
			for j := range ids {
				ids[j] = int32(1 + (i+j)%40)
			}
			out[i] = models.TextInput{IDs: ids, TypeIDs: make([]int32, len(ids)), Normalize: true}
		}
		return out
	}
	bert := func(kind models.Kind) func(t *testing.T, dev runtime.Device) {
		return func(t *testing.T, dev runtime.Device) {
			m, err := models.NewBERT(tinyBERTConfig, tinyBERT(tinyBERTConfig, 3, 7), nil, models.BERTOptions{Name: "tiny", Kind: kind})
			if err != nil {
				t.Fatal(err)
			}
			r, err := m.NewReplica(ctx, dev, 8)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Execute(ctx, texts(2)); err != nil {
				t.Fatalf("Execute: %v", err)
			}
		}
	}
	tests := []struct {
		name    string
		compute runtime.DType
		run     func(t *testing.T, dev runtime.Device)
		want    []string
	}{
		{
			name: "hash encoder",
			run: func(t *testing.T, dev runtime.Device) {
				// The self-check's run is recorded; its zeros then fail the
				// exactness check, as a device that ran nothing must.
				_, err := hashenc.New().NewReplica(ctx, dev)
				if !errors.Is(err, hashenc.ErrInexactDevice) {
					t.Fatalf("NewReplica = %v, want ErrInexactDevice from the recorder's zeros", err)
				}
			},
			want: []string{
				fmt.Sprintf("-> (tensor<2x%dxf32>, tensor<2x%dxf32>)", hashenc.Dim, hashenc.Dim),
				"precision HIGHEST",
				fmt.Sprintf("(tensor<2x%[1]dxf32>, tensor<%[1]dx%[1]dxf32>) -> tensor<2x%[1]dxf32>", hashenc.Dim),
				"stablehlo.sqrt", "stablehlo.select"},
		},
		{
			name: "mlp",
			run: func(t *testing.T, dev runtime.Device) {
				spec, w := tinyMLP(3)
				m, err := models.NewMLP(spec, w)
				if err != nil {
					t.Fatal(err)
				}
				r, err := m.NewReplica(ctx, dev, 8)
				if err != nil {
					t.Fatal(err)
				}
				in := make([]any, 3)
				for i := range in {
					in[i] = models.RowInput{Values: make([]float32, 12)}
				}
				if _, err := r.Execute(ctx, in); err != nil {
					t.Fatalf("Execute: %v", err)
				}
			},
			want: []string{"-> tensor<4x3xf32>", "(tensor<4x12xf32>, tensor<16x12xf32>) -> tensor<4x16xf32>", "stablehlo.maximum",
				"stablehlo.rsqrt", "(tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>", "chlo.erf", "stablehlo.tanh",
				"(tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32>", "stablehlo.exponential", "stablehlo.divide"},
		},
		{
			name: "bert encoder",
			run:  bert(models.KindBERT),
			want: []string{"-> (tensor<2x16xf32>, tensor<2x16xf32>)",
				"stablehlo.gather", "-> tensor<2x32x16xf32>", "stablehlo.rsqrt",
				"(tensor<2x32x16xf32>, tensor<48x16xf32>) -> tensor<2x32x48xf32>",
				"(tensor<2x32x48xf32>) -> tensor<2x32x3x4x4xf32>", "lhs_batching_dimensions = [0, 2]", "-> tensor<2x4x32x32xf32>",
				"tensor<2x32xi1>) -> tensor<2x4x32x32xi1>", "stablehlo.exponential",
				"lhs_batching_dimensions = [0, 1]", "permutation = array<i64: 0, 2, 1, 3>",
				"(tensor<2x32x4x4xf32>) -> tensor<2x32x16xf32>", "(tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>", "chlo.erf",
				"(tensor<2x32x16xf32>, tensor<f32>) -> tensor<2x16xf32>", "stablehlo.sqrt"},
		},
		{
			name: "bert classifier",
			run:  bert(models.KindBERTClassifier),
			want: []string{"-> tensor<2x3xf32>", "stablehlo.gather", "(tensor<2x32x16xf32>, tensor<f32>) -> tensor<2x16xf32>",
				"stablehlo.tanh", "(tensor<2x16xf32>, tensor<3x16xf32>) -> tensor<2x3xf32>"},
		},
		{
			name:    "bert encoder in bf16",
			compute: runtime.BF16,
			run:     bert(models.KindBERT),
			want: []string{"tensor<16x16xbf16>", "(tensor<2x32x16xf32>) -> tensor<2x32x16xbf16>",
				"(tensor<2x32x16xbf16>, tensor<16x16xbf16>) -> tensor<2x32x16xf32>", "precision DEFAULT"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{compute: tt.compute}
			tt.run(t, rec)
			text := rec.last(t)
			at := 0
			for _, w := range tt.want {
				i := strings.Index(text[at:], w)
				if i < 0 {
					t.Fatalf("program lacks %q after offset %d:\n%s", w, at, text)
				}
				at += i + len(w)
			}
		})
	}
}
