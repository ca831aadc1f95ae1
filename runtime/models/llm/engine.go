package llm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
)

// ErrInvalidStep means a step's items do not fit the engine: an unknown or
// repeated sequence, a position that does not continue its cache, more
// tokens than were reserved, a token outside the vocabulary. It is a bug of
// the caller (the scheduler), not of the request.
var ErrInvalidStep = errors.New("llm: invalid step")

// ErrClosed is returned by a closed engine.
var ErrClosed = errors.New("llm: engine closed")

// Defaults of EngineOptions left zero.
const (
	DefaultBlockSize     = 16
	DefaultMaxStepTokens = 512
	DefaultMaxSeqs       = 64
)

// EngineOptions size an engine on its device.
type EngineOptions struct {
	// CacheBytes is the device memory for the KV cache (every layer's K and
	// V); it sets the number of blocks. Required.
	CacheBytes int64
	// BlockSize is the tokens per cache block (DefaultBlockSize when 0).
	BlockSize int
	// MaxStepTokens bounds the rows of one step (DefaultMaxStepTokens when 0).
	MaxStepTokens int
	// MaxSeqs bounds the sequences of one step (DefaultMaxSeqs when 0).
	MaxSeqs int
	// DisablePrefixCache turns off the sharing of full blocks between
	// sequences with the same tokens before them (see blockPool).
	DisablePrefixCache bool
	// KVDType is the cache's element type: F32, BF16, F16 (llama.cpp's and
	// Ollama's default, on devices that hold it), Q8_0 or Q4_0 (ggml's
	// blocks of 32 along each head, 17/32 and 9/32 of bf16's memory, as
	// llama.cpp's and Ollama's q8_0 and q4_0 caches: on devices that hold
	// block-quantized buffers, for head dims divisible by 32; see
	// Model.CheckKVDType). 0 picks kvCacheDType's.
	KVDType runtime.DType
	// MaxDrafts bounds the draft tokens one step verifies in all
	// (speculative decoding, SeqStep.Draft): each is a sampled row, so
	// a step's logits are at most MaxSeqs + MaxDrafts rows. 0: none.
	MaxDrafts int
	// DeferSampling lets a step answer a constrained sequence whose
	// grammar mask is not done SeqResult.Pending instead of waiting for
	// it with every other sequence of the step (masks.go). The caller
	// must then run the sequence's last token again once Pending closes:
	// the scheduler does.
	DeferSampling bool
}

// SeqStep is one sequence's part of a step, with the fields of the
// scheduler's StepItem (runtime does not import scheduler).
type SeqStep struct {
	Seq    uint64
	State  any // a *Sequence when Sample is set
	Tokens []int32
	Pos    int
	Sample bool
	// Draft is the most tokens the step may guess after Tokens (Sample
	// only): the engine looks them up in the sequence's own tokens
	// (draft.go), runs them in the same pass and keeps those the
	// sequence samples anyway (SeqResult.Accepted). The caller reserved
	// cache room for them; the engine may guess fewer or none.
	Draft int
	// History is the sequence's tokens up to the end of Tokens (with
	// Draft; the caller's, read only): where guesses are looked up.
	History []int32
}

// SeqResult is a SeqStep's outcome, with the fields of the scheduler's
// StepResult. Out is a Delta.
type SeqResult struct {
	Token int32
	Out   any
	Stop  bool
	Full  bool
	End   string // ends the sequence without a token, with this finish reason (FinishConstraint)
	// Pending, with EngineOptions.DeferSampling, means the sequence
	// sampled nothing: its grammar's mask is still being computed. Its
	// item's tokens ran, but the cache holds all but the last: the next
	// step that samples it runs that token again (at the same position),
	// best once Pending is closed.
	Pending <-chan struct{}
	// Drafted is how many guessed tokens the step ran after the item's
	// Tokens; Accepted those the sequence took, in order, before Token
	// (with End, the tokens it took before it ended). Out covers them
	// all.
	Drafted  int
	Accepted []int32
	// Cached is how many of the item's tokens the prefix cache held:
	// mapped from blocks another sequence (or an earlier one) wrote with
	// the same history, not computed.
	Cached int
}

// Engine runs a decoder on one device: resident weights, a paged KV cache
// and a step graph per step shape. Reserve, Release and CacheBlocks may be
// called at any time; Steps run one at a time.
type Engine struct {
	spec    netSpec
	dev     runtime.Device
	mmDT    runtime.DType
	quant   map[string]runtime.DType // resident weights held block-quantized
	opts    EngineOptions
	blocks  *blockPool
	maxBlks int   // block table width: the context length's blocks
	bucket  []int // row buckets on devices that compile per shape; nil on oneDNN

	mu       sync.Mutex // Step, Close
	closed   bool
	resident map[string]runtime.Buffer // weights and caches, bound every step
	// bind is resident plus the step's inputs and logits, which each
	// step rebinds: copying a few hundred resident names into a new map
	// every step was a visible share of a small model's decode step.
	bind   map[string]runtime.Buffer
	graphs map[stepShape]*runtime.Graph
	// logits lends the host buffers steps copy their logits into (8 MB
	// for 16 rows of a 128k vocabulary): a fresh one each step cost its
	// clearing and page faults every step.
	logits sync.Pool
	// Counters read without the step's lock (a metrics scrape must not
	// wait for a step).
	computed, cached atomic.Int64
	// masks computes constrained sequences' masks beside the forward;
	// forwardNs is the last step's forward time, how long a step waits
	// for a mask before it defers it (DeferSampling).
	masks     *maskRunner
	forwardNs atomic.Int64
}

// EngineStats count the prompt and generated tokens the engine's steps
// ran (ComputedTokens) and those whose cache blocks were shared instead
// (CachedTokens, the prefix cache's hits).
type EngineStats struct {
	ComputedTokens, CachedTokens int64
}

// Stats returns the engine's counters.
func (e *Engine) Stats() EngineStats {
	return EngineStats{ComputedTokens: e.computed.Load(), CachedTokens: e.cached.Load()}
}

// bucketDevice is a device that compiles one program per shape
// (runtime/pjrt): steps are padded to its sizes. Matched by method so this
// package imports no adapter.
type bucketDevice interface {
	PadBuckets() (batch, seq []int)
}

// newEngine uploads weights (named as in graph.go) to dev and allocates the
// cache. On failure nothing stays allocated.
func newEngine(ctx context.Context, dev runtime.Device, spec netSpec, weights map[string]models.Tensor, opts EngineOptions) (*Engine, error) {
	if err := spec.check(); err != nil {
		return nil, fmt.Errorf("llm: engine: %w", err)
	}
	if opts.BlockSize <= 0 {
		opts.BlockSize = DefaultBlockSize
	}
	if opts.MaxStepTokens <= 0 {
		opts.MaxStepTokens = DefaultMaxStepTokens
	}
	if opts.MaxSeqs <= 0 {
		opts.MaxSeqs = DefaultMaxSeqs
	}
	opts.MaxSeqs = min(opts.MaxSeqs, opts.MaxStepTokens)
	if opts.KVDType == 0 {
		opts.KVDType = kvCacheDType(dev, weights)
	}
	if err := spec.checkKVDType(dev, opts.KVDType); err != nil {
		return nil, fmt.Errorf("llm: engine: %w", err)
	}
	perBlock := spec.cacheBlockBytes(opts.BlockSize, opts.KVDType)
	nBlocks := opts.CacheBytes / perBlock
	if nBlocks < 1 {
		return nil, fmt.Errorf("llm: engine on %s: %w: cache of %d bytes holds no block of %d bytes", dev.ID(), runtime.ErrOutOfMemory, opts.CacheBytes, perBlock)
	}
	nBlocks = min(nBlocks, 1<<30/int64(opts.BlockSize)) // slots are I32
	e := &Engine{
		spec: spec, dev: dev, mmDT: computeType(dev), opts: opts,
		maxBlks:  (spec.Context + opts.BlockSize - 1) / opts.BlockSize,
		resident: map[string]runtime.Buffer{}, graphs: map[stepShape]*runtime.Graph{},
		masks: newMaskRunner(),
	}
	e.blocks = newBlockPool(int(nBlocks), opts.BlockSize, e.maxBlks, !opts.DisablePrefixCache)
	if bd, ok := dev.(bucketDevice); ok {
		batch, _ := bd.PadBuckets()
		e.bucket = slices.Sorted(slices.Values(batch))
	}
	if err := e.upload(ctx, weights); err != nil {
		e.free()
		return nil, err
	}
	for l := range spec.Layers {
		for _, n := range []string{lKCache, lVCache} {
			buf, err := dev.Alloc(opts.KVDType, int(nBlocks), opts.BlockSize, spec.KVHeads, spec.HeadDim)
			if err != nil {
				e.free()
				return nil, fmt.Errorf("llm: engine: cache on %s: %w", dev.ID(), err)
			}
			e.resident[lw(l, n)] = buf
		}
	}
	return e, nil
}

// cacheBlockBytes is one KV-cache block of blockSize tokens over all
// layers, K and V, in type kv.
func (s netSpec) cacheBlockBytes(blockSize int, kv runtime.DType) int64 {
	return int64(2*s.Layers) * kv.Bytes(int64(blockSize*s.KVHeads*s.HeadDim))
}

// checkKVDType says whether an engine on dev can hold its cache in kv.
func (s netSpec) checkKVDType(dev runtime.Device, kv runtime.DType) error {
	switch kv {
	case runtime.F32, runtime.BF16:
		return nil
	case runtime.F16:
		if !runtime.HoldsQuantized(dev, kv) {
			return fmt.Errorf("%w: an f16 KV cache on %s, which holds no f16 buffers (f32 or bf16 there)", runtime.ErrUnsupported, dev.ID())
		}
		return nil
	case runtime.Q8_0, runtime.Q4_0:
		if !runtime.HoldsQuantized(dev, kv) {
			return fmt.Errorf("%w: a %s KV cache on %s, which holds no block-quantized buffers (f32 or bf16 there)", runtime.ErrUnsupported, kv, dev.ID())
		}
		if s.HeadDim%32 != 0 {
			return fmt.Errorf("%w: a %s KV cache holds blocks of 32 along each head, and this model's heads have %d dims (f32 or bf16 for it)", runtime.ErrUnsupported, kv, s.HeadDim)
		}
		return nil
	}
	return fmt.Errorf("%w: a KV cache of %s (f32, bf16, f16, q8_0 or q4_0)", runtime.ErrUnsupported, kv)
}

// kvCacheDType is the KV cache's type on dev for these weights: bf16 where
// the matrices stay block-quantized on dev (the CPU), whose rounding of
// the weights is far coarser than bf16's of K and V (llama.cpp's cache is
// f16 by default, vLLM's the model's dtype), so a cache takes half the
// memory and a decode step's attention reads half the bytes, and where
// dev computes in bf16 (the model's dtype, as vLLM's); f32 otherwise, so
// float checkpoints in f32 and devices that dequantize the weights (PJRT)
// keep their exact results.
func kvCacheDType(dev runtime.Device, weights map[string]models.Tensor) runtime.DType {
	if computeType(dev) == runtime.BF16 {
		return runtime.BF16
	}
	for _, t := range weights {
		if t.Quantized() && runtime.HoldsQuantized(dev, t.Stored) {
			return runtime.BF16
		}
	}
	return runtime.F32
}

// computeType is the matmul operand type: bf16 where the device computes
// in bf16 (runtime/onednn says so by method), f32 otherwise.
func computeType(dev runtime.Device) runtime.DType {
	if ct, ok := dev.(interface{ ComputeType() runtime.DType }); ok && ct.ComputeType() == runtime.BF16 {
		return runtime.BF16
	}
	return runtime.F32
}

// matmulWeight says whether a resident weight is stored in the device's
// compute type: the matmul operands, and the embedding table, whose rows
// the step gathers in that type and converts (it is the tied lm_head, and
// checkpoints hold it in bf16 anyway), rather than a norm's gain, a bias
// or a frequency table (always f32).
func matmulWeight(name string) bool {
	switch name {
	case wLMHead, wEmbed:
		return true
	case wNorm, wInvFreq:
		return false
	}
	for _, s := range []string{lWQ, lWK, lWV, lWO, lGateUp, lDown} {
		if len(name) > len(s) && name[len(name)-len(s)-1:] == "."+s {
			return true
		}
	}
	return false
}

// upload copies the weights to the device: block-quantized ones as
// stored where the device holds their type (runtime.RawDevice), else
// dequantized on the host to the type a float weight of that name gets.
func (e *Engine) upload(ctx context.Context, weights map[string]models.Tensor) error {
	names := make([]string, 0, len(weights))
	for n := range weights {
		names = append(names, n)
	}
	sort.Strings(names)
	e.quant = map[string]runtime.DType{}
	for _, n := range names {
		t := weights[n]
		if n == wLMHead && e.spec.Tied {
			continue // the embedding table, in the same type
		}
		if err := readMapped(func() error { return e.uploadOne(ctx, n, t) }); err != nil {
			return fmt.Errorf("llm: engine: weight %q on %s: %w", n, e.dev.ID(), err)
		}
	}
	if _, ok := e.resident[wLMHead]; !ok {
		e.resident[wLMHead] = e.resident[wEmbed]
		if dt, ok := e.quant[wEmbed]; ok {
			e.quant[wLMHead] = dt
		}
	}
	return nil
}

func (e *Engine) uploadOne(ctx context.Context, n string, t models.Tensor) error {
	if t.Quantized() && runtime.HoldsQuantized(e.dev, t.Stored) {
		buf, err := e.dev.Alloc(t.Stored, t.Shape...)
		if err != nil {
			return err
		}
		e.resident[n] = buf
		e.quant[n] = t.Stored
		var off int64
		for _, p := range t.Raw {
			if err := e.dev.(runtime.RawDevice).CopyInRaw(ctx, buf, off, p); err != nil {
				return err
			}
			off += int64(len(p))
		}
		return nil
	}
	data, err := t.Float32()
	if err != nil {
		return err
	}
	dt := runtime.F32
	if matmulWeight(n) {
		dt = e.mmDT
	}
	buf, err := e.dev.Alloc(dt, t.Shape...)
	if err != nil {
		return err
	}
	e.resident[n] = buf
	return e.dev.CopyIn(ctx, buf, data)
}

// readMapped runs f, turning a fault on a file's mapping (the weights of a
// GGUF file stay mapped, and a file truncated after load faults past its
// new end) into an error instead of the process's end.
func readMapped(f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, fault := r.(interface{ Addr() uintptr }); !fault {
				panic(r)
			}
			err = fmt.Errorf("%w: the weights' file changed while it was read: %v", models.ErrInvalidWeights, r)
		}
	}()
	return f()
}

func (e *Engine) free() {
	seen := map[runtime.Buffer]bool{}
	for _, b := range e.resident {
		if !seen[b] {
			seen[b] = true
			e.dev.Free(b)
		}
	}
	e.resident, e.bind = nil, nil
}

// Close frees the weights and the cache. Steps after it fail with ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	e.free()
	return nil
}

// warmSeq is WarmUp's sequence, an id the scheduler never gives: it
// numbers sequences from 1.
const warmSeq = math.MaxUint64

// WarmUp runs one step of one token for a sequence of its own and drops
// it, so that the device puts every weight in the layout its products
// read before a request waits on it: runtime/onednn relays quantized
// weights by 16 rows and packs float ones on their first product, tens
// of milliseconds for a 0.5B model and seconds for a 7B one on two cores.
// The token is not counted in Stats; its cache block goes back to the
// pool (a partial block is never shared).
func (e *Engine) WarmUp(ctx context.Context) error {
	if !e.Reserve(warmSeq, 1) {
		return fmt.Errorf("llm: warm-up: %w: no cache block free", runtime.ErrOutOfMemory)
	}
	defer e.Release(warmSeq)
	if _, err := e.stepLogits(ctx, []SeqStep{{Seq: warmSeq, Tokens: []int32{0}}}); err != nil {
		return fmt.Errorf("llm: warm-up: %w", err)
	}
	e.computed.Add(-1)
	return nil
}

// Reserve makes sure sequence seq has cache blocks for tokens positions in
// all; false when the free blocks do not suffice now, or tokens exceed the
// context length.
func (e *Engine) Reserve(seq uint64, tokens int) bool {
	if tokens > e.spec.Context {
		return false
	}
	return e.blocks.reserve(seq, tokens)
}

// Release frees seq's cache blocks.
func (e *Engine) Release(seq uint64) { e.blocks.release(seq) }

// CacheBlocks returns the blocks held by sequences and the cache's size.
func (e *Engine) CacheBlocks() (used, total int) { return e.blocks.used() }

// Options returns the engine's options with the defaults filled in: the
// scheduler's running set and step budget must fit MaxSeqs and
// MaxStepTokens.
func (e *Engine) Options() EngineOptions { return e.opts }

// pad returns n rounded up to the device's next bucket (n on oneDNN, which
// runs any shape).
func (e *Engine) pad(n int) int {
	for _, b := range e.bucket {
		if b >= n {
			return b
		}
	}
	return n
}

// tableWidth is the block table's width for items: the context's blocks on
// devices that run any shape (their attention reads only the blocks it
// needs), and the step's longest sequence rounded up to a power of two on
// devices that compile per shape, whose attention gathers the table's
// whole window for every row (runtime/pjrt).
func (e *Engine) tableWidth(items []SeqStep) int {
	if e.bucket == nil {
		return e.maxBlks
	}
	need := 1
	for _, it := range items {
		need = max(need, (it.Pos+len(it.Tokens)+e.opts.BlockSize-1)/e.opts.BlockSize)
	}
	w := 1
	for w < need {
		w *= 2
	}
	return min(w, e.maxBlks)
}

// stepPlan is a step's host-side inputs.
type stepPlan struct {
	shape                   stepShape
	ids, pos, slots, seqIdx []int32
	btab                    []int32
	rows                    []int32
	commits                 []commit
	cached                  int // rows skipped: their blocks were shared
	real                    int // rows before padding
	width                   int // block table columns
}

// commit is what a step writes of one sequence, recorded once it succeeds
// (a plan has one per item, in item order).
type commit struct {
	seq    uint64
	pos    int
	tokens []int32
	draft  int // guessed tokens at the end of tokens: only those accepted are kept
}

// plan lays out a step of items, whose last drafts[i] tokens (drafts may
// be nil) are guesses that sample a row each.
func (e *Engine) plan(items []SeqStep, drafts []int) (*stepPlan, error) {
	if len(items) == 0 {
		return nil, fmt.Errorf("%w: no items", ErrInvalidStep)
	}
	if len(items) > e.opts.MaxSeqs {
		return nil, fmt.Errorf("%w: %d sequences, at most %d", ErrInvalidStep, len(items), e.opts.MaxSeqs)
	}
	t := 0
	for _, it := range items {
		t += len(it.Tokens)
	}
	if t > e.opts.MaxStepTokens {
		return nil, fmt.Errorf("%w: %d tokens, at most %d", ErrInvalidStep, t, e.opts.MaxStepTokens)
	}
	p := &stepPlan{}
	p.shape.S = e.pad(len(items))
	p.width = e.tableWidth(items)
	p.btab = make([]int32, p.shape.S*p.width)
	p.ids = make([]int32, 0, t)
	p.pos = make([]int32, 0, t)
	p.slots = make([]int32, 0, t)
	p.seqIdx = make([]int32, 0, t)
	seen := make(map[uint64]bool, len(items))
	bs := e.opts.BlockSize
	e.blocks.startStep()
	for i, it := range items {
		if seen[it.Seq] {
			return nil, fmt.Errorf("%w: sequence %d twice", ErrInvalidStep, it.Seq)
		}
		seen[it.Seq] = true
		if len(it.Tokens) == 0 {
			return nil, fmt.Errorf("%w: sequence %d has no tokens", ErrInvalidStep, it.Seq)
		}
		for _, tok := range it.Tokens {
			if tok < 0 || int(tok) >= e.spec.Vocab {
				return nil, fmt.Errorf("%w: sequence %d: token %d outside the vocabulary of %d", ErrInvalidStep, it.Seq, tok, e.spec.Vocab)
			}
		}
		if it.Sample {
			if _, ok := it.State.(*Sequence); !ok {
				return nil, fmt.Errorf("%w: sequence %d samples with state %T, want *llm.Sequence", ErrInvalidStep, it.Seq, it.State)
			}
		}
		// Leading blocks another sequence already holds with the same
		// history, or writes in this step, are mapped, not computed.
		// A draft is never skipped: its rows sample.
		nd := draftAt(drafts, i)
		blocks, filled, skip, ok := e.blocks.begin(it.Seq, it.Pos, it.Tokens[:len(it.Tokens)-nd], it.Sample)
		if !ok {
			return nil, fmt.Errorf("%w: sequence %d holds no cache blocks", ErrInvalidStep, it.Seq)
		}
		end := it.Pos + len(it.Tokens)
		pos, toks := it.Pos+skip, it.Tokens[skip:]
		switch {
		case pos != filled:
			return nil, fmt.Errorf("%w: sequence %d at position %d, its cache holds %d", ErrInvalidStep, it.Seq, it.Pos, filled)
		case end > len(blocks)*bs:
			return nil, fmt.Errorf("%w: sequence %d runs to position %d with %d reserved", ErrInvalidStep, it.Seq, end, len(blocks)*bs)
		}
		// Entries past the step's last block may hold anything.
		copy(p.btab[i*p.width:(i+1)*p.width], blocks)
		for j, tok := range toks {
			at := pos + j
			p.ids = append(p.ids, tok)
			p.pos = append(p.pos, int32(at))
			p.slots = append(p.slots, blocks[at/bs]*int32(bs)+int32(at%bs))
			p.seqIdx = append(p.seqIdx, int32(i))
		}
		p.commits = append(p.commits, commit{seq: it.Seq, pos: pos, tokens: toks, draft: nd})
		p.cached += skip
		if it.Sample {
			for r := nd; r >= 0; r-- {
				p.rows = append(p.rows, int32(len(p.ids)-1-r))
			}
		}
	}
	// Padding rows write nowhere (slot -1) and attend as position 0 of
	// sequence 0; their outputs are never read.
	p.real = len(p.ids)
	p.shape.T = e.pad(len(p.ids))
	for len(p.ids) < p.shape.T {
		p.ids = append(p.ids, 0)
		p.pos = append(p.pos, 0)
		p.slots = append(p.slots, -1)
		p.seqIdx = append(p.seqIdx, 0)
	}
	p.shape.R = e.pad(max(len(p.rows), 1))
	for len(p.rows) < p.shape.R {
		p.rows = append(p.rows, 0)
	}
	return p, nil
}

// forward runs the step graph and returns the logits of the sampled rows,
// [R·V] row-major.
func (e *Engine) forward(ctx context.Context, p *stepPlan) ([]float32, error) {
	g := e.graphs[p.shape]
	if g == nil {
		g = stepGraph(e.spec, e.mmDT, e.opts.KVDType, e.quant, p.shape)
		if len(e.graphs) >= 256 {
			clear(e.graphs) // bounded: shapes vary with the step on oneDNN
		}
		e.graphs[p.shape] = g
	}
	if e.bind == nil {
		e.bind = maps.Clone(e.resident)
	}
	bind := e.bind
	var allocated []runtime.Buffer
	defer func() {
		for _, b := range allocated {
			e.dev.Free(b)
		}
	}()
	in := func(name string, vals []int32, shape ...int) error {
		b, err := e.dev.Alloc(runtime.I32, shape...)
		if err != nil {
			return err
		}
		allocated = append(allocated, b)
		bind[name] = b
		return e.dev.CopyInInt32(ctx, b, vals)
	}
	sh := p.shape
	for _, f := range []struct {
		name  string
		vals  []int32
		shape []int
	}{
		{gIDs, p.ids, []int{sh.T}}, {gPos, p.pos, []int{sh.T}}, {gSlots, p.slots, []int{sh.T}},
		{gSeqIdx, p.seqIdx, []int{sh.T}}, {gBlocks, p.btab, []int{sh.S, p.width}}, {gRows, p.rows, []int{sh.R}},
	} {
		if err := in(f.name, f.vals, f.shape...); err != nil {
			return nil, fmt.Errorf("llm: step input %s on %s: %w", f.name, e.dev.ID(), err)
		}
	}
	out, err := e.dev.Alloc(runtime.F32, sh.R, e.spec.Vocab)
	if err != nil {
		return nil, fmt.Errorf("llm: step logits on %s: %w", e.dev.ID(), err)
	}
	allocated = append(allocated, out)
	bind[gLogits] = out
	if err := e.dev.Run(ctx, g, bind); err != nil {
		return nil, fmt.Errorf("llm: step on %s: %w", e.dev.ID(), err)
	}
	logits := e.logitsBuf(sh.R * e.spec.Vocab)
	if err := e.dev.CopyOut(ctx, logits, out); err != nil {
		e.logits.Put(&logits)
		return nil, fmt.Errorf("llm: step logits from %s: %w", e.dev.ID(), err)
	}
	return logits, nil
}

// logitsBuf returns a buffer of n float32 from e.logits, or a new one; the
// caller hands it back with e.logits.Put once nothing reads it.
func (e *Engine) logitsBuf(n int) []float32 {
	if p, ok := e.logits.Get().(*[]float32); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]float32, n)
}

// Step runs one forward pass over items (prefill chunks and decode tokens
// of distinct sequences, each continuing its cache) and samples the next
// token of every item with Sample set, with that sequence's sampler; an
// item with Draft set may give more (SeqResult.Accepted). Results are one
// per item; those without Sample are zero.
func (e *Engine) Step(ctx context.Context, items []SeqStep) ([]SeqResult, error) {
	masks := e.startMasks(items)
	items, drafts := e.withDrafts(items, masks)
	e.mu.Lock()
	defer e.mu.Unlock()
	start := time.Now()
	logits, commits, err := e.stepLogitsLocked(ctx, items, drafts)
	took := time.Since(start)
	late := e.waitMasks(masks, took)
	if err != nil {
		return nil, err
	}
	e.forwardNs.Store(int64(took))
	defer e.logits.Put(&logits) // sampling keeps no reference to the logits
	out, err := e.sample(items, drafts, logits, late)
	// A guess the sequence did not take leaves its cache rows unwritten
	// as far as the pool knows: the next step writes over them. So does
	// a deferred sequence's last token, which it runs again.
	for i, c := range commits {
		switch {
		case c.draft > 0:
			kept := 0
			if err == nil {
				kept = len(out[i].Accepted)
			}
			commits[i].tokens = c.tokens[:len(c.tokens)-c.draft+kept]
		case late != nil && late[i] != nil:
			commits[i].tokens = c.tokens[:len(c.tokens)-1]
		}
	}
	if err == nil {
		for i, c := range commits {
			out[i].Cached = c.pos - items[i].Pos
		}
	}
	e.commit(commits)
	// Their room goes back too: held until the sequence ends, it could
	// make the next prompt chunk preempt a sequence.
	for _, c := range commits {
		if c.draft > 0 {
			e.blocks.trim(c.seq)
		}
	}
	return out, err
}

// withDrafts returns items with each sampling item's guessed tokens
// appended (Draft at most; a copy where any is), and how many each has:
// nil when none. Guesses stop short of the context's last position (the
// token sampled after the last guess must have one), and of the step's
// token budget, EngineOptions.MaxDrafts and the cache room the sequence
// holds (a Draft past it is the caller's slip, not worth failing a step).
//
// A constrained sequence guesses with its current mask: with
// DeferSampling, one whose mask (masks[i], startMasks') is not done
// within the last forward's time guesses nothing (the step may defer it).
func (e *Engine) withDrafts(items []SeqStep, masks []<-chan struct{}) ([]SeqStep, []int) {
	if e.opts.MaxDrafts <= 0 {
		return items, nil
	}
	room := e.opts.MaxStepTokens
	for _, it := range items {
		room -= len(it.Tokens)
	}
	rows := e.opts.MaxDrafts
	// Each sequence's most guesses first (its share of the budget), then
	// the guesses, in parallel: a constrained sequence's cost its
	// grammar's masks, as many as it guesses.
	ks := make([]int, len(items))
	var want []int
	for i, it := range items {
		s, ok := it.State.(*Sequence)
		end := it.Pos + len(it.Tokens)
		k := min(it.Draft, room, rows, e.spec.Context-1-end, e.blocks.room(it.Seq)-end)
		if !it.Sample || !ok || s.stopped || k <= 0 {
			continue
		}
		ks[i] = k
		want = append(want, i)
		room -= k
		rows -= k
	}
	guesses := make([][]int32, len(items))
	grace := time.Duration(e.forwardNs.Load())
	guess := func(i int) {
		if e.opts.DeferSampling && masks != nil && !waitMask(masks[i], grace) {
			return
		}
		guesses[i] = items[i].State.(*Sequence).draft(ks[i], items[i].History)
	}
	if len(want) == 1 {
		guess(want[0])
	} else {
		var wg sync.WaitGroup
		for _, i := range want {
			wg.Go(func() { guess(i) })
		}
		wg.Wait()
	}
	var drafts []int
	var out []SeqStep
	for _, i := range want {
		d := guesses[i]
		if len(d) == 0 {
			continue
		}
		if drafts == nil {
			drafts = make([]int, len(items))
			out = slices.Clone(items)
		}
		out[i].Tokens = append(slices.Clip(items[i].Tokens), d...)
		drafts[i] = len(d)
	}
	if drafts == nil {
		return items, nil
	}
	return out, drafts
}

// draftAt is item i's guesses in withDrafts' counts (nil: none).
func draftAt(drafts []int, i int) int {
	if drafts == nil {
		return 0
	}
	return drafts[i]
}

// sample picks the next token of each sampling item from its rows of
// logits (item order) with the item's sequence: one row, or one more than
// the item's guesses, which it takes while they equal what it samples.
// Sequences are independent (each has its own RNG), so they sample in
// parallel: at a 150k vocabulary a token costs up to a few milliseconds of
// host time per sequence. An item late[i] (waitMasks') samples nothing:
// it is answered Pending.
func (e *Engine) sample(items []SeqStep, drafts []int, logits []float32, late []<-chan struct{}) ([]SeqResult, error) {
	type job struct{ item, row int }
	var jobs []job
	out := make([]SeqResult, len(items))
	row := 0
	for i, it := range items {
		if !it.Sample {
			continue
		}
		if late != nil && late[i] != nil {
			out[i].Pending = late[i]
		} else {
			jobs = append(jobs, job{i, row})
		}
		row += 1 + draftAt(drafts, i)
	}
	errs := make([]error, len(items))
	v := e.spec.Vocab
	next := make(chan job)
	var wg sync.WaitGroup
	for range min(goruntime.GOMAXPROCS(0), len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				it, nd := items[j.item], draftAt(drafts, j.item)
				out[j.item], errs[j.item] = e.verify(it, nd, logits[j.row*v:(j.row+1+nd)*v])
			}
		}()
	}
	for _, j := range jobs {
		next <- j
	}
	close(next)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("llm: sequence %d: %w", items[i].Seq, err)
		}
	}
	return out, nil
}

// verify samples item's rows of logits in order: after its known tokens,
// then after each of its last nd tokens (guesses) while the one before
// was sampled as guessed. A single row (nd 0) is plain sampling.
func (e *Engine) verify(it SeqStep, nd int, logits []float32) (SeqResult, error) {
	s := it.State.(*Sequence)
	v := e.spec.Vocab
	guess := it.Tokens[len(it.Tokens)-nd:]
	first := it.Pos + len(it.Tokens) - nd // the position of the first token sampled
	var acc []int32
	var all Delta
	for r := 0; ; r++ {
		res, err := s.next(logits[r*v : (r+1)*v])
		if err != nil {
			return SeqResult{}, err
		}
		if res.End != "" {
			if len(acc) > 0 {
				res.Out = all
			}
			if nd > 0 {
				res.Drafted, res.Accepted = nd, acc
				s.guessed(nd, len(acc))
			}
			return res, nil
		}
		if nd > 0 {
			d := res.Out.(Delta)
			all.Text += d.Text
			all.TokenIDs = append(all.TokenIDs, d.TokenIDs...)
			all.Logprobs = append(all.Logprobs, d.Logprobs...)
			// A guess's position is below the context's last (withDrafts),
			// so only the last token sampled can fill the context.
			if r < nd && !res.Stop && res.Token == guess[r] {
				acc = append(acc, res.Token)
				continue
			}
			res.Out, res.Drafted, res.Accepted = all, nd, acc
			s.guessed(nd, len(acc))
		}
		res.Full = !res.Stop && first+r+1 >= e.spec.Context
		return res, nil
	}
}

// stepLogits runs a step of items without guesses, for WarmUp, and
// records what it wrote.
func (e *Engine) stepLogits(ctx context.Context, items []SeqStep) ([]float32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	logits, commits, err := e.stepLogitsLocked(ctx, items, nil)
	if err == nil {
		e.commit(commits)
	}
	return logits, err
}

// stepLogitsLocked runs a step and returns the sampled rows' logits in
// item order, [R·V], and what each item wrote of its cache, for commit
// once the guesses taken are known.
func (e *Engine) stepLogitsLocked(ctx context.Context, items []SeqStep, drafts []int) ([]float32, []commit, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if e.closed {
		return nil, nil, ErrClosed
	}
	p, err := e.plan(items, drafts)
	if err != nil {
		return nil, nil, err
	}
	var logits []float32
	if p.real > 0 { // a step whose rows were all shared has nothing to run
		if logits, err = e.forward(ctx, p); err != nil {
			return nil, nil, err
		}
	}
	e.cached.Add(int64(p.cached))
	return logits, p.commits, nil
}

// commit records the cache rows steps wrote: the blocks they filled become
// shareable (prefix caching).
func (e *Engine) commit(commits []commit) {
	for _, c := range commits {
		e.computed.Add(int64(len(c.tokens)))
		e.blocks.commit(c.seq, c.pos, c.tokens)
	}
}
