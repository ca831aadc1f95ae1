package llm

import (
	"fmt"
	"math"

	"github.com/brokerd/brokerd/runtime"
)

// netSpec is the shape of a decoder the engine runs: what config.json
// says, resolved (head_dim, GQA groups, the RoPE frequencies).
type netSpec struct {
	Vocab, Hidden, Layers int
	Heads, KVHeads        int
	HeadDim               int
	Inter                 int
	Context               int // positions a sequence may hold
	Eps                   float32
	InvFreq               []float32 // [HeadDim/2], rope_scaling applied
	QKVBias               bool      // Qwen2
	QKNorm                bool      // Qwen3: RMSNorm of each head of q and k
	Tied                  bool      // lm_head is the embedding table
}

func (s netSpec) check() error {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"vocab_size", s.Vocab}, {"hidden_size", s.Hidden}, {"num_hidden_layers", s.Layers},
		{"num_attention_heads", s.Heads}, {"num_key_value_heads", s.KVHeads}, {"head_dim", s.HeadDim},
		{"intermediate_size", s.Inter}, {"max_position_embeddings", s.Context},
	} {
		if f.v <= 0 {
			return fmt.Errorf("%s is %d", f.name, f.v)
		}
	}
	if s.Heads%s.KVHeads != 0 {
		return fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", s.Heads, s.KVHeads)
	}
	if s.HeadDim%2 != 0 || len(s.InvFreq) != s.HeadDim/2 {
		return fmt.Errorf("head_dim %d with %d RoPE frequencies", s.HeadDim, len(s.InvFreq))
	}
	if !(s.Eps > 0) {
		return fmt.Errorf("rms_norm_eps %g", s.Eps)
	}
	return nil
}

// Names of the step graph's per-step inputs and its output.
const (
	gIDs    = "ids"    // I32 [T] token ids of the step's rows
	gPos    = "pos"    // I32 [T] each row's position in its sequence
	gSlots  = "slots"  // I32 [T] each row's cache slot (block·BlockSize+offset); -1 on padding
	gSeqIdx = "seqidx" // I32 [T] each row's sequence: a row of gBlocks
	gBlocks = "btab"   // I32 [S,MaxBlocks] each sequence's block table
	gRows   = "rows"   // I32 [R] the rows that sample (each sampling sequence's last)
	gLogits = "logits" // F32 [R,V]
)

// Resident names: weights (HF names are mapped onto these) and caches.
const (
	wEmbed   = "embed"    // [V,H] f32 (gather table)
	wNorm    = "norm"     // [H]
	wLMHead  = "lm_head"  // [V,H] matmul operand type
	wInvFreq = "inv_freq" // [D/2]
)

func lw(l int, name string) string { return fmt.Sprintf("L%d.%s", l, name) }

// Per-layer resident names.
const (
	lLN1    = "ln1"     // [H]
	lWQ     = "wq"      // [Hq·D, H]
	lWK     = "wk"      // [Hkv·D, H]
	lWV     = "wv"      // [Hkv·D, H]
	lBQ     = "bq"      // [Hq·D] Qwen2
	lBK     = "bk"      // [Hkv·D]
	lBV     = "bv"      // [Hkv·D]
	lQNorm  = "qnorm"   // [D] Qwen3
	lKNorm  = "knorm"   // [D]
	lWO     = "wo"      // [H, Hq·D]
	lLN2    = "ln2"     // [H]
	lGateUp = "gate_up" // [2I, H]: gate rows then up rows
	lDown   = "down"    // [H, I]
	lKCache = "kcache"  // [NumBlocks, BlockSize, Hkv, D]
	lVCache = "vcache"
)

// stepShape is what a compiled step graph is specialised on.
type stepShape struct {
	T, S, R int // rows, sequences, sampled rows (after padding)
}

// graphBuilder appends ops, naming intermediates.
type graphBuilder struct {
	ops  []runtime.Op
	n    int
	mmDT runtime.DType // matmul operand type
	// quant are the weights resident in a block-quantized type: their
	// matmuls take f32 activations, and a quantized embedding table
	// gathers f32 rows.
	quant map[string]runtime.DType
	conv  map[string]string
}

func (b *graphBuilder) add(op runtime.Op) string {
	if op.Out == "" {
		b.n++
		op.Out = fmt.Sprintf("t%d", b.n)
	}
	b.ops = append(b.ops, op)
	return op.Out
}

// operand is x as a matmul operand: itself in f32, its bf16 copy in bf16.
func (b *graphBuilder) operand(x string) string {
	if b.mmDT != runtime.BF16 {
		return x
	}
	if c, ok := b.conv[x]; ok {
		return c
	}
	c := b.add(runtime.Op{Kind: runtime.OpConvert, In: []string{x}, DType: runtime.BF16})
	b.conv[x] = c
	return c
}

// linear is x·wᵀ (+bias) into out ("": a new name): w is a PyTorch
// Linear weight [out,in].
func (b *graphBuilder) linear(x, w, bias, out string) string {
	a := x
	if !b.quant[w].Quantized() {
		a = b.operand(x)
	}
	in := []string{a, w}
	if bias != "" {
		in = append(in, bias)
	}
	return b.add(runtime.Op{Kind: runtime.OpMatMul, In: in, TransB: true, Out: out})
}

// stepGraph is the forward pass of one flattened step: T rows from S
// sequences (prefill chunks and decode tokens mixed), R of which sample.
// Token-wise layers run on [T,·] matrices; attention reads each row's
// sequence's earlier positions from the paged cache after this step's K
// and V are written into it; the final norm and lm_head run on the R
// sampled rows only, gathered first. quant names the weights resident in
// block-quantized types.
func stepGraph(s netSpec, mmDT, kvDT runtime.DType, quant map[string]runtime.DType, sh stepShape) *runtime.Graph {
	b := &graphBuilder{mmDT: mmDT, quant: quant, conv: map[string]string{}}
	d := s.HeadDim
	x := b.add(runtime.Op{Kind: runtime.OpGather, In: []string{wEmbed, gIDs}}) // [T,H]
	if mmDT == runtime.BF16 && !quant[wEmbed].Quantized() {
		// The table is held in bf16: the residual stream is f32.
		x = b.add(runtime.Op{Kind: runtime.OpConvert, In: []string{x}, DType: runtime.F32})
	}
	for l := range s.Layers {
		w := func(name string) string { return lw(l, name) }
		bias := func(name string) string {
			if s.QKVBias {
				return w(name)
			}
			return ""
		}
		clear(b.conv) // operands are per value; names are not reused across layers anyway
		hn := b.add(runtime.Op{Kind: runtime.OpRMSNorm, In: []string{x, w(lLN1)}, Eps: s.Eps})
		// Three products rather than one over [q;k;v]: the runtime has no
		// op to split the columns of a product without copying them.
		q := b.linear(hn, w(lWQ), bias(lBQ), "")
		k := b.linear(hn, w(lWK), bias(lBK), "")
		v := b.linear(hn, w(lWV), bias(lBV), "")
		q = b.add(runtime.Op{Kind: runtime.OpReshape, In: []string{q}, Shape: []int{sh.T, s.Heads, d}})
		k = b.add(runtime.Op{Kind: runtime.OpReshape, In: []string{k}, Shape: []int{sh.T, s.KVHeads, d}})
		v = b.add(runtime.Op{Kind: runtime.OpReshape, In: []string{v}, Shape: []int{sh.T, s.KVHeads, d}})
		if s.QKNorm {
			q = b.add(runtime.Op{Kind: runtime.OpRMSNorm, In: []string{q, w(lQNorm)}, Eps: s.Eps})
			k = b.add(runtime.Op{Kind: runtime.OpRMSNorm, In: []string{k, w(lKNorm)}, Eps: s.Eps})
		}
		q = b.add(runtime.Op{Kind: runtime.OpRoPE, In: []string{q, gPos, wInvFreq}})
		k = b.add(runtime.Op{Kind: runtime.OpRoPE, In: []string{k, gPos, wInvFreq}})
		// The cache's type (kvCacheDType, EngineOptions.KVDType): an f16,
		// Q8_0 or Q4_0 cache converts f32 or bf16 rows as it writes them.
		if kvDT == runtime.BF16 {
			k = b.add(runtime.Op{Kind: runtime.OpConvert, In: []string{k}, DType: runtime.BF16})
			v = b.add(runtime.Op{Kind: runtime.OpConvert, In: []string{v}, DType: runtime.BF16})
		}
		b.add(runtime.Op{Kind: runtime.OpKVWrite, In: []string{k, gSlots}, Out: w(lKCache)})
		b.add(runtime.Op{Kind: runtime.OpKVWrite, In: []string{v, gSlots}, Out: w(lVCache)})
		a := b.add(runtime.Op{Kind: runtime.OpPagedAttention,
			In:    []string{q, w(lKCache), w(lVCache), gBlocks, gSeqIdx, gPos},
			Scale: float32(1 / math.Sqrt(float64(d))),
			// Quantized weights: bf16's rounding of the products is far
			// below theirs; bf16 compute rounds every other product so.
			// AMX runs a prefill's attention 2.3-2.5× faster than the f32
			// kernel, AVX512-BF16 1.5-2.3× (bench/RESULTS.md).
			BF16Products: b.quant[w(lWQ)].Quantized() || b.mmDT == runtime.BF16}) // [T,Hq,D]
		a = b.add(runtime.Op{Kind: runtime.OpReshape, In: []string{a}, Shape: []int{sh.T, s.Heads * d}})
		o := b.linear(a, w(lWO), "", "")
		x = b.add(runtime.Op{Kind: runtime.OpAdd, In: []string{x, o}})
		hn = b.add(runtime.Op{Kind: runtime.OpRMSNorm, In: []string{x, w(lLN2)}, Eps: s.Eps})
		var act string // [T,I]
		if b.quant[w(lGateUp)].Quantized() {
			// One op: the device need not write the [T,2I] product out
			// and read it back (qamx.c applies SwiGLU to its C tiles).
			act = b.add(runtime.Op{Kind: runtime.OpMatMul, In: []string{hn, w(lGateUp)}, TransB: true, Act: runtime.ActSwiGLU})
		} else {
			gu := b.linear(hn, w(lGateUp), "", "") // [T,2I]
			act = b.add(runtime.Op{Kind: runtime.OpSwiGLU, In: []string{gu}})
		}
		dn := b.linear(act, w(lDown), "", "")
		x = b.add(runtime.Op{Kind: runtime.OpAdd, In: []string{x, dn}})
	}
	last := b.add(runtime.Op{Kind: runtime.OpGather, In: []string{x, gRows}}) // [R,H]
	last = b.add(runtime.Op{Kind: runtime.OpRMSNorm, In: []string{last, wNorm}, Eps: s.Eps})
	b.linear(last, wLMHead, "", gLogits)
	return &runtime.Graph{Ops: b.ops}
}
