package lifecycle

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/scheduler"
)

// Step sizes of generation replicas: a step carries every running
// sequence's next token plus prompt chunks up to genStepTokens, each
// prompt at most genChunk tokens per step (chunked prefill, so a long
// prompt does not stall the running sequences' decoding).
const (
	genStepTokens = 2048
	genChunk      = 512
	genBlockSize  = llm.DefaultBlockSize
)

// EngineExecutor adapts an LLM engine to the scheduler's GenExecutor, as
// generator replicas run; the benchmarks drive engines through it too.
type EngineExecutor struct{ Engine *llm.Engine }

func (x EngineExecutor) Reserve(seq uint64, tokens int) bool { return x.Engine.Reserve(seq, tokens) }
func (x EngineExecutor) Release(seq uint64)                  { x.Engine.Release(seq) }
func (x EngineExecutor) Close() error                        { return x.Engine.Close() }

// CacheBlocks reports the engine's KV-cache blocks to the scheduler
// (scheduler.KVCacheReporter): Stats rows and the KV gauges.
func (x EngineExecutor) CacheBlocks() (used, total int) { return x.Engine.CacheBlocks() }

// PrefixHitTokens are the prompt tokens the engine's prefix cache mapped
// (scheduler.PrefixCacheReporter).
func (x EngineExecutor) PrefixHitTokens() int64 { return x.Engine.Stats().CachedTokens }

// KVCacheDType is the engine's KV cache type (scheduler.KVCacheTyper).
func (x EngineExecutor) KVCacheDType() string { return x.Engine.Options().KVDType.String() }

func (x EngineExecutor) Step(ctx context.Context, items []scheduler.StepItem) ([]scheduler.StepResult, error) {
	in := make([]llm.SeqStep, len(items))
	for i, it := range items {
		in[i] = llm.SeqStep(it) // the same fields, by design
	}
	res, err := x.Engine.Step(ctx, in)
	if err != nil {
		return nil, err
	}
	out := make([]scheduler.StepResult, len(res))
	for i, r := range res {
		out[i] = scheduler.StepResult(r)
	}
	return out, nil
}

// llmServable is a decoder LLM as a servable: one engine per device
// (weights, KV cache) behind a generation replica of the scheduler. A
// replica is admitted where the budget takes its weights, one step's
// workspace and a KV cache for at least one full-length sequence; the
// cache gets what the budget has left, up to enough for the whole running
// set at full length.
type llmServable struct {
	m  *llm.Model
	kv runtime.DType // the KV cache's type (Options.KVCacheDType); 0: the model's choice per device
	// spec is the most tokens a decoding sequence guesses a step, while at
	// most specMaxRunning sequences run (Options.SpecTokens, SpecMaxRunning).
	spec, specMaxRunning int
	log                  *zap.Logger // with the served model's name
}

func (g llmServable) info() models.Info { return g.m.Info() }

// fixed is what a replica running maxRunning sequences needs besides its
// KV cache. Each guessed token a step verifies is a logits row besides
// the sequences' own (StepBytes counts maxSeqs rows; its block tables for
// them too, an over-estimate); rows are step tokens, so never more than
// the step's budget, whatever speculative-max-running allows.
func (g llmServable) fixed(od openDevice, maxRunning int) int64 {
	rows := min(maxRunning+g.maxDrafts(maxRunning), max(genStepTokens, maxRunning))
	return g.m.WeightBytesOn(od.dev, od.dtype) + g.m.StepBytes(od.dtype, genStepTokens, rows)
}

// maxDrafts is the engine's MaxDrafts for a replica running maxRunning
// sequences: every sequence that may guess (at most specMaxRunning run
// while any does) guessing its most. 0 when speculation is off.
func (g llmServable) maxDrafts(maxRunning int) int {
	return max(g.spec, 0) * min(g.specMaxRunningOr(), maxRunning)
}

// specMaxRunningOr is specMaxRunning, or the scheduler's default for 0.
func (g llmServable) specMaxRunningOr() int {
	if g.specMaxRunning <= 0 {
		return scheduler.DefaultSpecMaxRunning
	}
	return g.specMaxRunning
}

// seqCacheBytes is one full-length sequence's KV cache on od.
func (g llmServable) seqCacheBytes(od openDevice) int64 {
	kv, _ := g.kvOn(od)
	return int64((g.m.ContextLength()+genBlockSize-1)/genBlockSize) * g.m.CacheBlockBytes(od.dev, kv, genBlockSize)
}

// kvOn is the KV cache type a replica on od gets: the one asked for
// (--kv-cache-dtype), or the model's own choice (0) where od cannot hold
// that one (an f16, q8_0 or q4_0 cache on a GPU, or a block type for heads not divisible by 32), with
// why, so one setting serves every device.
func (g llmServable) kvOn(od openDevice) (runtime.DType, error) {
	if g.kv == 0 {
		return 0, nil
	}
	if err := g.m.CheckKVDType(od.dev, g.kv); err != nil {
		return 0, err
	}
	return g.kv, nil
}

func (g llmServable) need(od openDevice, maxRunning int) int64 {
	return g.fixed(od, maxRunning) + g.seqCacheBytes(od)
}
func (llmServable) needs() string { return ": weights, a step, and one full-length sequence's cache" }
func (llmServable) unit() string  { return "generator replica" }

func (g llmServable) start(ctx context.Context, od openDevice, maxRunning int, free int64) (instance, int64, error) {
	fixed := g.fixed(od, maxRunning)
	cache := int64(maxRunning) * g.seqCacheBytes(od)
	if free >= 0 {
		cache = min(cache, free-fixed)
	}
	for _, q := range g.m.Quantized() {
		if !runtime.HoldsQuantized(od.dev, q) {
			g.log.Info("dequantizing weights for a device that cannot hold them", zap.String("device", od.entry.ID), zap.Stringer("from", q), zap.Stringer("to", od.dtype))
		}
	}
	kv, why := g.kvOn(od)
	if why != nil {
		g.log.Warn("KV cache type not available on this device: the model's default instead", zap.String("device", od.entry.ID),
			zap.Stringer("asked", g.kv), zap.Stringer("using", g.m.KVCacheDType(od.dev)), zap.Error(why))
	}
	eng, err := g.m.NewEngine(ctx, od.dev, llm.EngineOptions{CacheBytes: cache, BlockSize: genBlockSize, MaxStepTokens: genStepTokens, MaxSeqs: maxRunning, KVDType: kv,
		MaxDrafts: g.maxDrafts(maxRunning), DeferSampling: true}) // the scheduler runs Pending sequences again
	if err != nil {
		return nil, 0, err
	}
	// The first step puts the weights in their kernels' layouts (seconds
	// for a large model): at load, not in a client's first request.
	began := time.Now()
	if err := eng.WarmUp(ctx); err != nil {
		eng.Close()
		return nil, 0, err
	}
	g.log.Info("generator warmed up", zap.String("device", od.entry.ID), zap.Duration("took", time.Since(began)))
	return engineInstance{x: EngineExecutor{eng}, maxRunning: maxRunning, spec: max(g.spec, 0), specMaxRunning: g.specMaxRunningOr()}, fixed + cache, nil
}

// engineInstance is an engine with the running set the scheduler gives it,
// and how its sequences guess (llmServable's spec, specMaxRunning).
type engineInstance struct {
	x                    EngineExecutor
	maxRunning           int
	spec, specMaxRunning int
}

func (r engineInstance) join(h Host, key string, dev scheduler.Device, opts ...scheduler.ReplicaOption) error {
	return h.AddGenReplica(key, dev, scheduler.GenOptions{MaxRunning: r.maxRunning, MaxStepTokens: max(genStepTokens, r.maxRunning), MaxChunk: genChunk,
		SpecTokens: r.spec, SpecMaxRunning: r.specMaxRunning, ChunkAlign: genBlockSize}, r.x, opts...)
}

func (r engineInstance) placed() (string, []zap.Field) {
	used, total := r.x.CacheBlocks()
	return "generator placed", []zap.Field{zap.Int("max_running", r.maxRunning), zap.Int("cache_blocks", total-used), zap.Int("block_tokens", genBlockSize),
		zap.Stringer("kv_cache_dtype", r.x.Engine.Options().KVDType),
		zap.Int("speculative_tokens", r.spec), zap.Int("speculative_max_running", r.specMaxRunning), zap.Int("max_drafts", r.x.Engine.Options().MaxDrafts)}
}

func (r engineInstance) Close() error { return r.x.Close() }
