package llm

import (
	"fmt"
	"testing"

	"github.com/brokerd/brokerd/runtime"
)

// peakStepBytes is the most memory one step of shape sh holds besides the
// resident weights and cache, the way runtime/onednn runs a graph: the
// step's bound inputs and logits for the whole run, each intermediate
// from its op until its last reader, 64-byte granules.
func peakStepBytes(t *testing.T, e *Engine, sh stepShape) int64 {
	t.Helper()
	bound := map[string]runtime.TensorType{}
	for n, b := range e.resident {
		dt := b.DType()
		if matmulWeight(n) {
			dt = e.mmDT // as a device computing in it would hold them
		}
		bound[n] = runtime.TensorType{DType: dt, Shape: b.Shape()}
	}
	inputs := map[string][]int{
		gIDs: {sh.T}, gPos: {sh.T}, gSlots: {sh.T}, gSeqIdx: {sh.T}, gBlocks: {sh.S, e.maxBlks}, gRows: {sh.R},
	}
	var fixed int64
	for n, shape := range inputs {
		bound[n] = runtime.TensorType{DType: runtime.I32, Shape: shape}
		fixed += alignedBytes(runtime.I32, shape)
	}
	bound[gLogits] = runtime.TensorType{DType: runtime.F32, Shape: []int{sh.R, e.spec.Vocab}}
	fixed += alignedBytes(runtime.F32, []int{sh.R, e.spec.Vocab})
	p, err := runtime.PlanGraph(stepGraph(e.spec, e.mmDT, e.opts.KVDType, e.quant, sh), bound)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	for i, s := range p.Steps {
		for _, n := range s.Op.In {
			last[n] = i
		}
	}
	var live, peak int64
	for i, s := range p.Steps {
		if _, ok := bound[s.Op.Out]; !ok {
			live += alignedBytes(s.Out.DType, s.Out.Shape)
		}
		peak = max(peak, live)
		for _, n := range s.Op.In {
			if _, ok := bound[n]; !ok && last[n] == i {
				live -= alignedBytes(p.Types[n].DType, p.Types[n].Shape)
			}
		}
	}
	return fixed + peak
}

// TestStepBytesBound checks that StepBytes, which placement admits
// against the device budget, covers a step's real peak for every
// architecture, both matmul types and full steps of several sizes.
func TestStepBytesBound(t *testing.T) {
	specs := map[string]netSpec{"llama": tinyNet("llama"), "qwen2": tinyNet("qwen2"), "qwen3": tinyNet("qwen3"), "qwen2.5-0.5b": qwen05()}
	for name, s := range specs {
		for _, dt := range []runtime.DType{runtime.F32, runtime.BF16} {
			m := &Model{spec: s}
			e := shapeEngine(s, dt)
			for _, sh := range []stepShape{{1, 1, 1}, {64, 8, 8}, {512, 64, 64}, {2048, 32, 32}} {
				t.Run(fmt.Sprintf("%s/%s/%d", name, dt, sh.T), func(t *testing.T) {
					peak := peakStepBytes(t, e, sh)
					got := m.StepBytes(dt, sh.T, sh.S)
					if got < peak {
						t.Errorf("StepBytes(%s, %d, %d) = %d, a step holds %d", dt, sh.T, sh.S, got, peak)
					}
					t.Logf("StepBytes %d, peak %d (%.2f×)", got, peak, float64(got)/float64(peak))
				})
			}
		}
	}
}

// shapeBuf is a buffer with a type and shape only.
type shapeBuf struct {
	dt    runtime.DType
	shape []int
}

func (b shapeBuf) DType() runtime.DType { return b.dt }
func (b shapeBuf) Shape() []int         { return b.shape }
func (b shapeBuf) Bytes() int64         { return alignedBytes(b.dt, b.shape) }

// shapeEngine is an engine's resident set as types and shapes only, for a
// model too large to allocate in a test.
func shapeEngine(s netSpec, dt runtime.DType) *Engine {
	e := &Engine{spec: s, mmDT: dt, maxBlks: (s.Context + DefaultBlockSize - 1) / DefaultBlockSize, resident: map[string]runtime.Buffer{}}
	h, d, qd, kd := s.Hidden, s.HeadDim, s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	put := func(name string, shape ...int) {
		e.resident[name] = shapeBuf{runtime.F32, shape}
	}
	put(wEmbed, s.Vocab, h)
	put(wLMHead, s.Vocab, h)
	put(wNorm, h)
	put(wInvFreq, d/2)
	for l := range s.Layers {
		put(lw(l, lLN1), h)
		put(lw(l, lLN2), h)
		put(lw(l, lWQ), qd, h)
		put(lw(l, lWK), kd, h)
		put(lw(l, lWV), kd, h)
		put(lw(l, lBQ), qd)
		put(lw(l, lBK), kd)
		put(lw(l, lBV), kd)
		put(lw(l, lQNorm), d)
		put(lw(l, lKNorm), d)
		put(lw(l, lWO), h, qd)
		put(lw(l, lGateUp), 2*s.Inter, h)
		put(lw(l, lDown), h, s.Inter)
		put(lw(l, lKCache), 64, DefaultBlockSize, s.KVHeads, d)
		put(lw(l, lVCache), 64, DefaultBlockSize, s.KVHeads, d)
	}
	return e
}
