package runtime

import (
	"fmt"
	"slices"
)

// The decoder ops h/llmops is adding, provisionally here (with oneDNN
// kernels in runtime/onednn/llmops_pending.*) so the LLM engine runs on the
// CPU before that branch lands. These files go when it is merged; its
// declarations replace them.
const (
	// OpRMSNorm: In[0] [rows..., N] scaled by 1/sqrt(mean(x²)+Eps) and In[1]
	// gain [N], over the last dimension.
	OpRMSNorm OpKind = 200 + iota
	// OpSiLU: x·sigmoid(x), pointwise.
	OpSiLU
	// OpSwiGLU: In[0] [rows..., 2I] read as [gate|up] → silu(gate)·up [rows..., I].
	OpSwiGLU
	// OpRoPE: In[0] [T,H,D] rotated (rotate-half) by In[1] positions I32 [T]
	// times In[2] inverse frequencies [D/2].
	OpRoPE
	// OpKVWrite: In[0] new K or V [T,Hkv,D] written in place into the bound
	// Out cache [NumBlocks,BlockSize,Hkv,D] at In[1] slots I32 [T]
	// (block·BlockSize+offset; negative: skipped). Out keeps its other rows.
	OpKVWrite
	// OpPagedAttention: In[0] Q [T,Hq,D] attends, causally and with grouped
	// query heads, over In[1] K and In[2] V caches [NumBlocks,BlockSize,Hkv,D]
	// through In[3] block tables I32 [S,MaxBlocks], In[4] each row's
	// sequence I32 [T] and In[5] each row's position I32 [T]: row t sees its
	// sequence's positions 0..pos[t]. Scale multiplies the scores. → [T,Hq,D].
	OpPagedAttention
)

func pendingOp(k OpKind) bool { return k >= OpRMSNorm && k <= OpPagedAttention }

// inferAny is inferOp, with the provisional decoder ops, whose KVWrite
// takes its output's type from the binding (it writes in place).
func inferAny(op Op, in []TensorType, bound map[string]TensorType) (TensorType, error) {
	if !pendingOp(op.Kind) {
		return inferOp(op, in)
	}
	want := map[OpKind]int{OpRMSNorm: 2, OpSiLU: 1, OpSwiGLU: 1, OpRoPE: 3, OpKVWrite: 2, OpPagedAttention: 6}[op.Kind]
	if len(in) != want {
		return TensorType{}, fmt.Errorf("takes %d inputs, got %d", want, len(in))
	}
	switch {
	case op.Act != ActNone || op.TransB || op.Perm != nil || op.Shape != nil || op.DType != 0:
		return TensorType{}, fmt.Errorf("only Eps (rms-norm) and Scale (paged attention) apply")
	case op.Eps != 0 && op.Kind != OpRMSNorm:
		return TensorType{}, fmt.Errorf("Eps is only for rms-norm")
	case op.Scale != 0 && op.Kind != OpPagedAttention:
		return TensorType{}, fmt.Errorf("Scale is only for paged attention")
	}
	for i, t := range in {
		isIdx := (op.Kind == OpRoPE && i == 1) || (op.Kind == OpKVWrite && i == 1) || (op.Kind == OpPagedAttention && i >= 3)
		if isIdx && t.DType != I32 {
			return TensorType{}, fmt.Errorf("In[%d] must be i32", i)
		}
		if !isIdx && t.DType != F32 {
			return TensorType{}, fmt.Errorf("In[%d] must be f32", i)
		}
		if len(t.Shape) == 0 {
			return TensorType{}, fmt.Errorf("In[%d] is a scalar", i)
		}
	}
	x := in[0]
	rank := func(t TensorType, n int, what string) error {
		if len(t.Shape) != n {
			return fmt.Errorf("%s must have %d dimensions, has %v", what, n, t.Shape)
		}
		return nil
	}
	switch op.Kind {
	case OpRMSNorm:
		if !(op.Eps > 0) {
			return TensorType{}, fmt.Errorf("Eps %g must be positive", op.Eps)
		}
		if !slices.Equal(in[1].Shape, []int{x.Last()}) {
			return TensorType{}, fmt.Errorf("gain %v, want [%d]", in[1].Shape, x.Last())
		}
		return TensorType{F32, slices.Clone(x.Shape)}, nil
	case OpSiLU:
		return TensorType{F32, slices.Clone(x.Shape)}, nil
	case OpSwiGLU:
		if x.Last()%2 != 0 {
			return TensorType{}, fmt.Errorf("last dimension %d is not even", x.Last())
		}
		out := slices.Clone(x.Shape)
		out[len(out)-1] /= 2
		return TensorType{F32, out}, nil
	case OpRoPE:
		if err := rank(x, 3, "In[0]"); err != nil {
			return TensorType{}, err
		}
		if x.Shape[2]%2 != 0 || !slices.Equal(in[1].Shape, x.Shape[:1]) || !slices.Equal(in[2].Shape, []int{x.Shape[2] / 2}) {
			return TensorType{}, fmt.Errorf("want [T,H,D even], positions [T], frequencies [D/2]")
		}
		return TensorType{F32, slices.Clone(x.Shape)}, nil
	case OpKVWrite:
		c, ok := bound[op.Out]
		if !ok {
			return TensorType{}, fmt.Errorf("writes in place: its output must be a bound cache")
		}
		if err := rank(x, 3, "In[0]"); err != nil {
			return TensorType{}, err
		}
		if c.DType != F32 || len(c.Shape) != 4 || !slices.Equal(c.Shape[2:], x.Shape[1:]) || !slices.Equal(in[1].Shape, x.Shape[:1]) {
			return TensorType{}, fmt.Errorf("cache %s does not take rows %v at slots %v", c, x.Shape, in[1].Shape)
		}
		return c, nil
	case OpPagedAttention:
		k, v, bt := in[1], in[2], in[3]
		if err := rank(x, 3, "Q"); err != nil {
			return TensorType{}, err
		}
		if err := rank(k, 4, "K cache"); err != nil {
			return TensorType{}, err
		}
		if !slices.Equal(k.Shape, v.Shape) || k.Shape[3] != x.Shape[2] || x.Shape[1]%k.Shape[2] != 0 {
			return TensorType{}, fmt.Errorf("Q %v, caches %v and %v: want the same head size and a multiple of the KV heads", x.Shape, k.Shape, v.Shape)
		}
		if err := rank(bt, 2, "block tables"); err != nil {
			return TensorType{}, err
		}
		if !slices.Equal(in[4].Shape, x.Shape[:1]) || !slices.Equal(in[5].Shape, x.Shape[:1]) {
			return TensorType{}, fmt.Errorf("sequence indices %v and positions %v, want [%d]", in[4].Shape, in[5].Shape, x.Shape[0])
		}
		return TensorType{F32, slices.Clone(x.Shape)}, nil
	}
	return TensorType{}, fmt.Errorf("unknown op kind %d", uint8(op.Kind))
}
