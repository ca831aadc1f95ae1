package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/brokerd/brokerd/runtime/quant"
)

// ErrOutOfMemory means an allocation would exceed the device's memory budget.
var ErrOutOfMemory = errors.New("device memory budget exceeded")

// ErrInvalidGraph means a graph, its bindings or its input values do not fit
// the ops: an unknown name, a shape or dtype an op cannot take, an index out
// of range. It is the runtime caller's mistake: brokerd's models build
// their graphs from requests the edge has checked, so one reaching the edge
// is a bug (INTERNAL), not the client's.
var ErrInvalidGraph = errors.New("invalid op graph")

// ErrUnsupported means the device cannot do what was asked on this host,
// such as bf16 on a CPU without the instructions for it.
var ErrUnsupported = errors.New("not supported by the device")

// DType is the element type of a device buffer.
type DType uint8

// Element types. Compute accumulates in fp32 whatever the storage type.
const (
	F32  DType = iota + 1
	BF16       // bfloat16 storage, on devices that support it
	I32        // indices (embedding gather)

	// Block-quantized weights as GGUF (ggml) stores them: a row of K
	// elements is K/BlockElems blocks of BlockBytes bytes, rows back to
	// back. They are only ever a matmul's weight (In[1] with TransB), a
	// gather's table or (Q8_0, Q4_0) a KV cache, never an activation: see
	// Quantized.
	Q4_0
	Q4_1
	Q5_0
	Q5_1
	Q8_0
	Q4_K
	Q5_K
	Q6_K

	// F16 is IEEE half precision, only ever a KV cache (see KVCacheType):
	// values convert to it as they are written, rounded to nearest even.
	F16
)

// quantTypes maps the block types onto ggml's (runtime/quant): elements
// and bytes per block come from there, so the two cannot disagree.
var quantTypes = map[DType]quant.Type{
	Q4_0: quant.Q4_0, Q4_1: quant.Q4_1, Q5_0: quant.Q5_0, Q5_1: quant.Q5_1, Q8_0: quant.Q8_0,
	Q4_K: quant.Q4_K, Q5_K: quant.Q5_K, Q6_K: quant.Q6_K,
}

// QuantizedTypes lists the block types, in declaration order.
func QuantizedTypes() []DType { return []DType{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K} }

// FromGGML is the block type of a ggml type (false for the float types and
// types brokerd does not run).
func FromGGML(t quant.Type) (DType, bool) {
	for d, q := range quantTypes {
		if q == t {
			return d, true
		}
	}
	return 0, false
}

// GGML is ggml's type for a block type (false for F32, BF16, I32).
func (t DType) GGML() (quant.Type, bool) {
	q, ok := quantTypes[t]
	return q, ok
}

// Quantized says whether t is a block type.
func (t DType) Quantized() bool {
	_, ok := quantTypes[t]
	return ok
}

// KVCacheType says whether t can hold a KV cache (OpKVWrite's Out,
// OpPagedAttention's In[1] and In[2]).
func KVCacheType(t DType) bool { return t == F32 || t == BF16 || t == F16 || t == Q8_0 || t == Q4_0 }

// KVStoreType says whether t is a KV cache type that rows of another type
// are converted into as they are written (f16 and the block types).
func KVStoreType(t DType) bool { return t == F16 || t == Q8_0 || t == Q4_0 }

// BlockElems is the number of elements one block holds: 1 for the scalar
// types.
func (t DType) BlockElems() int {
	if q, ok := quantTypes[t]; ok {
		in, _ := q.Info()
		return in.BlockElems
	}
	return 1
}

// Bytes is the storage of n elements of type t, or -1 when n is negative
// or not whole blocks of a block type.
func (t DType) Bytes(n int64) int64 {
	if q, ok := quantTypes[t]; ok {
		b, err := quant.RowBytes(q, n)
		if err != nil {
			return -1
		}
		return b
	}
	if n < 0 || n > math.MaxInt64/int64(t.Size()) {
		return -1
	}
	return n * int64(t.Size())
}

func (t DType) String() string {
	switch t {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case I32:
		return "i32"
	case F16:
		return "f16"
	}
	if q, ok := quantTypes[t]; ok {
		return q.String()
	}
	return fmt.Sprintf("dtype(%d)", uint8(t))
}

// Size is the size of one element in bytes, for the scalar types (a block
// type's elements have no whole size: use Bytes).
func (t DType) Size() int {
	switch t {
	case BF16, F16:
		return 2
	default:
		return 4
	}
}

// Buffer is memory on a device, owned by the Device that allocated it.
type Buffer interface {
	DType() DType
	Shape() []int
	// Bytes is the memory the buffer holds against the device budget.
	Bytes() int64
}

// Activation is a pointwise function fused into a matmul as a post-op.
type Activation uint8

// Activations.
const (
	ActNone Activation = iota
	ActReLU
	ActGELU // erf form, as BERT uses
	ActTanh
	// ActSwiGLU is not pointwise: the product's columns are [gate | up],
	// and the op's output is silu(gate)·up, half as wide ([M,N/2]). Only
	// for a matmul with block-quantized weights and no bias, where it
	// saves writing the product and reading it back (a gated MLP's
	// largest output).
	ActSwiGLU
)

// OpKind names an op of the op graph.
type OpKind uint8

// The ops every adapter implements. Shapes are row-major; "rows" are all
// leading dimensions flattened.
const (
	// OpMatMul: In[0] [M,K] × In[1] [K,N] (+ In[2] bias [N]) → [M,N], with
	// Act fused. A 3-D In[0] [B,S,K] is treated as [B·S,K]. With TransB,
	// In[1] is [N,K] (PyTorch Linear weight layout). In[3], after a bias,
	// is a residual of the output's shape (f32) added after Act, so a
	// layer's "x + Linear(h)" is one op; the output is then f32.
	OpMatMul OpKind = iota + 1
	// OpBatchMatMul: In[0] [B,M,K] × In[1] [B,K,N] → [B,M,N] (TransB: In[1] is [B,N,K]); Scale multiplies the result.
	OpBatchMatMul
	// OpAdd: In[0] + In[1], same shape (In[1] may also be [N], broadcast over rows).
	OpAdd
	// OpLayerNorm: over the last dimension, In[1] gamma [N], In[2] beta [N], Eps.
	OpLayerNorm
	// OpSoftmax: over the last dimension.
	OpSoftmax
	// OpGELU, OpReLU, OpTanh: pointwise.
	OpGELU
	OpReLU
	OpTanh
	// OpGather: In[0] table [V,D], In[1] I32 indices [any shape] → [indices..., D].
	OpGather
	// OpMaskedMeanPool: In[0] [B,S,D], In[1] mask [B,S] (1 keep, 0 pad) → [B,D].
	OpMaskedMeanPool
	// OpL2Normalize: each row divided by its L2 norm (rows of zeros stay zero).
	OpL2Normalize
	// OpPermute: In[0], read as Shape when Shape is set (a view of the same
	// element count, nothing moves) or as its own shape otherwise, with its
	// dimensions reordered by Perm: output dimension i is input dimension
	// Perm[i], written contiguously. Splitting attention heads is
	// [B,S,H·D] as Shape [B,S,H,D] with Perm [0,2,1,3] → [B,H,S,D]. F32 or
	// BF16; the output keeps In[0]'s type.
	OpPermute
	// OpReshape: In[0] with the dimensions Shape (the same element count; one
	// dimension may be -1, inferred), row-major order unchanged. Merging heads
	// is OpPermute [B,H,S,D] → [B,S,H,D] then OpReshape to [B,S,H·D]. F32 or
	// BF16; the output keeps In[0]'s type.
	OpReshape
	// OpMaskedSoftmax: softmax over the last dimension of In[0] [B,...,N]
	// where In[1] mask [B,N] (f32 or i32; non-zero keeps) excludes positions:
	// a masked position gets probability exactly 0 and the kept ones sum to
	// 1, as if the masked ones were not there (attention over padded keys).
	// The mask of batch element b applies to every row of In[0][b]. A row
	// whose positions are all masked gets 1/N everywhere, as an additive
	// mask of the most negative float would give.
	OpMaskedSoftmax
	// OpConvert: In[0] converted element-wise to DType (F32 ↔ BF16; rounding
	// to nearest even), the same shape. It feeds bf16 matmuls from f32
	// activations.
	OpConvert

	// Decoder-LLM ops (Llama 3, Qwen2, Qwen3). Float operands are f32 or
	// bf16 unless said otherwise; compute accumulates in f32 whatever the
	// storage type, and the output keeps In[0]'s type.

	// OpRMSNorm: In[0] x [..., N], In[1] weight [N] (f32) → x's shape:
	// y = x / sqrt(mean(x²) + Eps) · weight over the last dimension, the
	// mean of squares in f32 as HF computes the variance. Qwen3's per-head
	// q/k norm is x [T,H,D] with weight [D].
	OpRMSNorm
	// OpSiLU: pointwise x·sigmoid(x), f32 (as the other pointwise ops).
	OpSiLU
	// OpSwiGLU: In[0] [..., 2·I] holding [gate | up] (the output of one
	// fused gate_up matmul) → [..., I] = silu(gate)·up.
	OpSwiGLU
	// OpRoPE: In[0] x [T,H,D] (D even), In[1] positions I32 [T], In[2]
	// inv_freq F32 [D/2] → [T,H,D], rotate-half ("neox", HF Llama) layout:
	// for i < D/2, angle = float32(pos)·inv_freq[i] in f32, out[i] =
	// x[i]·cos − x[i+D/2]·sin, out[i+D/2] = x[i+D/2]·cos + x[i]·sin. The
	// model computes inv_freq, so rope_theta and Llama 3's rope_scaling are
	// its business. Positions are not range-checked: any int32 is an angle.
	OpRoPE
	// OpKVWrite appends keys or values to a paged KV cache in place: In[0]
	// new [T,Hkv,D], In[1] slots I32 [T] (slot = block·BlockSize + offset;
	// a negative slot skips the row, for padding), Out the cache
	// [NumBlocks,BlockSize,Hkv,D] of In[0]'s type, or F16 (rounded to
	// nearest even), or Q8_0 or Q4_0 (D a multiple of 32; each row
	// quantized as ggml's quantize_row_q8_0_ref or quantize_row_q4_0_ref,
	// a block holding an infinity or NaN with d = NaN), on devices that
	// hold those types (KVStoreType). Out must be bound (a
	// caller-owned buffer that persists across Runs); it is the one op
	// whose output is also an input: the planner lists the cache in both
	// Plan.Inputs and Plan.Outputs, and ops after it read the updated
	// cache. A slot ≥ NumBlocks·BlockSize is the caller's mistake: the CPU
	// adapter fails the Run with ErrInvalidGraph and writes nothing; PJRT
	// cannot check values on the device and skips the row. Slots must be
	// distinct (which of two rows for one slot lands is adapter-defined).
	OpKVWrite
	// OpPagedAttention: causal grouped-query attention over a paged cache,
	// for a flattened batch mixing prefill chunks and decode steps (as
	// vLLM does). In[0] Q [T,Hq,D], In[1] Kcache and In[2] Vcache
	// [NumBlocks,BlockSize,Hkv,D] (both of one type, f32, bf16, f16, or
	// Q8_0 or Q4_0 with D a multiple of 32, independent of Q's;
	// KVCacheType), In[3] block table I32 [S,MaxBlocksPerSeq],
	// In[4] sequence index I32 [T] (the block-table row of token t), In[5]
	// positions I32 [T] → [T,Hq,D] of Q's type. Token t attends to its
	// sequence's cache positions 0..positions[t] inclusive (position p is
	// in block table[seq][p/BlockSize] at offset p%BlockSize); query head h
	// reads kv head h/(Hq/Hkv), so Hq must be a multiple of Hkv. Scores are
	// scaled by Scale (0 means 1/sqrt(D)); softmax in f32. A sequence index
	// outside [0,S), a negative position, a position past MaxBlocksPerSeq
	// blocks or a block id outside [0,NumBlocks) is the caller's mistake:
	// the CPU adapter fails the Run with ErrInvalidGraph, PJRT clamps it.
	// Block-table entries past a token's last block may hold anything.
	OpPagedAttention

	// OpAttention: an encoder's multi-head self-attention in one op, over
	// the output of one fused q|k|v projection, so no head split or merge
	// is ever copied. In[0] QKV [B,S,3·H·D] (per token: the queries of all
	// Heads = H heads, then the keys, then the values, each [H,D]), In[1]
	// mask [B,S] (f32 or i32; non-zero keeps a key) → [B,S,H·D] with the
	// heads merged: out[b,s,h·D+j] = Σ_t P[b,h,s,t]·V[b,t,h,j], where P is
	// the masked softmax over t (OpMaskedSoftmax's rule) of Scale·Q·Kᵀ
	// (Scale 0 means 1/sqrt(D)), computed in f32. In[0] is f32 or bf16; with
	// bf16, P is rounded to bf16 for the second product, and DType may be
	// BF16 (the output rounded once) as for OpBatchMatMul. Adapters may
	// hold the scores ([B,H,S,S] f32, and a bf16 copy with bf16 operands)
	// for the op's duration; memory estimates count them.
	OpAttention
)

// Op is one node of a graph. It reads named buffers and writes one.
type Op struct {
	Kind   OpKind
	In     []string
	Out    string
	Act    Activation // OpMatMul only
	TransB bool       // OpMatMul, OpBatchMatMul
	Eps    float32    // OpLayerNorm, OpRMSNorm
	Scale  float32    // OpBatchMatMul (0 means 1), OpPagedAttention and OpAttention (0 means 1/sqrt(D))
	Perm   []int      // OpPermute
	Shape  []int      // OpPermute (input view), OpReshape (output shape)
	Heads  int        // OpAttention
	// BF16Products (OpPagedAttention only) lets the adapter round Q, K, the
	// softmax's probabilities and V to bf16 for its two products, which
	// still accumulate in f32 (the softmax stays f32): for models whose
	// weights are block-quantized, whose error is far above bf16's
	// rounding. An adapter without such a kernel computes as without it.
	BF16Products bool
	// DType is OpConvert's output type, and OpMatMul's and OpBatchMatMul's:
	// 0 or F32, or BF16 for bf16 operands (the product still accumulates in
	// f32 and is rounded once), so a product that only feeds other bf16
	// matmuls needs no separate conversion.
	DType DType
}

// Graph is a straight-line program of ops. Buffers named in Run's bindings are
// inputs (weights included) and requested outputs; every other name is an
// intermediate the device allocates from its pool and frees after the run.
type Graph struct {
	Ops []Op
}

// DeviceSpec says which device to open and how much of it brokerd may use.
type DeviceSpec struct {
	ID      string // brokerd's device ID, "cpu:0"
	Budget  uint64 // bytes allocations are admitted against; 0 = unlimited
	Threads int    // compute threads; 0 = the adapter's choice
	DType   DType  // compute/storage type for activations; 0 = F32
}

// Adapter opens devices of one backend (oneDNN on the CPU, PJRT plugins on
// TPUs and GPUs).
type Adapter interface {
	Name() string
	Open(ctx context.Context, spec DeviceSpec) (Device, error)
}

// Device is one opened device: memory, copies and graph execution. Methods are
// safe for concurrent use; Run calls on one device are serialised by the
// device (one stream per device).
type Device interface {
	ID() string
	// Alloc reserves a buffer against the budget (ErrOutOfMemory when it does
	// not fit); buffers are reused from a pool keyed by size.
	Alloc(dt DType, shape ...int) (Buffer, error)
	// Free returns b to the pool.
	Free(b Buffer)
	// CopyIn writes host values into b, converting to b's type. len(src) must
	// equal b's element count.
	CopyIn(ctx context.Context, dst Buffer, src []float32) error
	// CopyInInt32 writes indices into an I32 buffer.
	CopyInInt32(ctx context.Context, dst Buffer, src []int32) error
	// CopyOut reads b into host values, converting to float32.
	CopyOut(ctx context.Context, dst []float32, src Buffer) error
	// Run executes g. bind maps names to buffers: inputs, weights and the
	// outputs the caller wants (allocated by the caller with the right shape).
	// A graph must not change once it has run: a device may keep what it
	// derives from g (its checked plan) by g's address, so a caller that
	// runs one shape again passes the same *Graph and skips that work.
	Run(ctx context.Context, g *Graph, bind map[string]Buffer) error
	// Synchronize waits for all submitted work.
	Synchronize(ctx context.Context) error
	// MemoryUsed is the bytes allocated (pooled buffers included).
	MemoryUsed() uint64
	Close() error
}

// RawDevice is a device that holds block-quantized weights as they are
// stored (the oneDNN adapter on the CPU). Matched by method: a model
// uploads raw bytes where the device is one and Holds the type, and
// dequantizes on the host to the device's compute type elsewhere (PJRT).
type RawDevice interface {
	// Holds says whether Alloc takes dt (a block type, or F16 for a KV
	// cache).
	Holds(dt DType) bool
	// CopyInRaw writes src, stored bytes of dst's type, into dst at byte
	// offset off (a model's weight may come in pieces: gate then up).
	CopyInRaw(ctx context.Context, dst Buffer, off int64, src []byte) error
}

// HoldsQuantized says whether dev keeps block type dt (or F16) as it is
// stored.
func HoldsQuantized(dev Device, dt DType) bool {
	r, ok := dev.(RawDevice)
	return ok && r.Holds(dt)
}
