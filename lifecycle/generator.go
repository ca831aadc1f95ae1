package lifecycle

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/scheduler"
)

// Decoder LLMs in the model lifecycle: a generator model is placed as one
// engine per device (weights, KV cache) behind a generation replica of the
// scheduler, sized by the device's batch plan and memory budget.

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

func (x EngineExecutor) Step(ctx context.Context, items []scheduler.StepItem) ([]scheduler.StepResult, error) {
	in := make([]llm.SeqStep, len(items))
	for i, it := range items {
		in[i] = llm.SeqStep{Seq: it.Seq, State: it.State, Tokens: it.Tokens, Pos: it.Pos, Sample: it.Sample}
	}
	res, err := x.Engine.Step(ctx, in)
	if err != nil {
		return nil, err
	}
	out := make([]scheduler.StepResult, len(res))
	for i, r := range res {
		out[i] = scheduler.StepResult{Token: r.Token, Out: r.Out, Stop: r.Stop, Full: r.Full, End: r.End}
	}
	return out, nil
}

// placeGenLocked gives a generator a replica on every usable device of the
// most preferred type that admits its weights, one step's workspace and a
// KV cache for at least one full-length sequence. The cache gets what the
// budget has left, up to enough for the whole running set at full length.
func (ms *Set) placeGenLocked(ctx context.Context, s *Served, m *llm.Model) error {
	current := map[string]detect.Entry{}
	if ms.opts.Entries != nil {
		for _, e := range ms.opts.Entries() {
			current[e.ID] = e
		}
	}
	var refusals []string
	var failures []error
	var minNeed int64
	blockBytes := m.CacheBlockBytes(genBlockSize)
	blocksPerSeq := int64((m.ContextLength() + genBlockSize - 1) / genBlockSize)
	for _, t := range placementOrder(ms.opts.Select) {
		for _, od := range ms.devices {
			e := od.entry
			if e.Type != t {
				continue
			}
			if c, ok := current[e.ID]; ok && (c.Cordoned || c.Health == detect.Unhealthy) {
				continue
			}
			running, err := ms.maxBatch(s.Info, t)
			if err != nil {
				return err
			}
			fixed := m.WeightBytesOn(od.dev, od.dtype) + m.StepBytes(od.dtype, genStepTokens, running)
			need := fixed + blocksPerSeq*blockBytes
			if minNeed == 0 || need < minNeed {
				minNeed = need
			}
			cache := int64(running) * blocksPerSeq * blockBytes
			if e.Budget > 0 {
				free := ms.freeLocked(od)
				if need > free {
					refusals = append(refusals, fmt.Sprintf("%s has %d bytes free of its %d-byte budget (needs %d: weights, a step, and one full-length sequence's cache)", e.ID, free, e.Budget, need))
					continue
				}
				cache = min(cache, free-fixed)
			}
			for _, q := range m.Quantized() {
				if !runtime.HoldsQuantized(od.dev, q) {
					ms.log.Info("dequantizing weights for a device that cannot hold them", zap.String("model", s.Info.Name),
						zap.String("device", e.ID), zap.Stringer("from", q), zap.Stringer("to", od.dtype))
				}
			}
			eng, err := m.NewEngine(ctx, od.dev, llm.EngineOptions{CacheBytes: cache, BlockSize: genBlockSize, MaxStepTokens: genStepTokens, MaxSeqs: running})
			if err != nil {
				if errors.Is(err, runtime.ErrOutOfMemory) {
					refusals = append(refusals, fmt.Sprintf("%s: %v", e.ID, err))
				} else {
					failures = append(failures, fmt.Errorf("engine on %s: %w", e.ID, err))
				}
				continue
			}
			x := EngineExecutor{eng}
			dev := scheduler.Device{ID: e.ID, Type: string(e.Type), CostPerHour: e.CostPerHour}
			if err := ms.sched.AddGenReplica(s.Key, dev, scheduler.GenOptions{MaxRunning: running, MaxStepTokens: max(genStepTokens, running), MaxChunk: genChunk}, x,
				scheduler.WithName(s.Label)); err != nil {
				x.Close()
				return fmt.Errorf("generator replica of %s on %s: %w", s.Key, e.ID, err)
			}
			bytes := fixed + cache
			s.replicas = append(s.replicas, placed{deviceID: e.ID, r: x, bytes: bytes, maxBatch: running, gen: true})
			ms.reserved[e.ID] += bytes
			used, total := eng.CacheBlocks()
			ms.log.Info("generator placed", zap.String("model", s.Info.Name), zap.Int64("version", s.Info.Version), zap.String("device", e.ID),
				zap.Int("max_running", running), zap.Int("cache_blocks", total-used), zap.Int("block_tokens", genBlockSize),
				zap.Int64("memory_bytes", bytes))
		}
		if len(s.replicas) > 0 {
			return nil
		}
	}
	switch {
	case len(failures) > 0:
		return fmt.Errorf("model %s version %d: %w", s.Info.Name, s.Info.Version, errors.Join(failures...))
	case len(refusals) > 0:
		return &AdmissionError{Model: s.Info.Name, Version: s.Info.Version, Need: minNeed, Devices: refusals}
	}
	return fmt.Errorf("model %s version %d: no open device can take a replica: %w", s.Info.Name, s.Info.Version, scheduler.ErrNoDevice)
}
