package llm

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
)

// TestWarmUp: WarmUp leaves the engine as it found it (no cache block
// held, nothing counted, the same logits for the requests that follow as
// without it), and on oneDNN it puts every weight in its kernel's layout
// at once, so that the steps after it (decode, batched decode, prefill
// chunks: mixJobs) relay nothing.
func TestWarmUp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quant bool
	}{{"f32", false}, {"q8_0", true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := quantNet("qwen2") // rows by 16 and 32: packed, or relaid where the CPU's kernel reads Q8_0 so
			w := randomCheckpoint(s, 5)
			if tc.quant {
				w, _ = quantCheckpoint(t, w)
			}
			ew, err := engineWeights(s, w)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			open := func(reg prometheus.Registerer) *Engine {
				dev, err := onednn.New(onednn.Options{Registerer: reg}).Open(ctx, runtime.DeviceSpec{ID: "cpu:0", DType: runtime.F32})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { dev.Close() })
				e, err := newEngine(ctx, dev, s, ew, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { e.Close() })
				return e
			}
			reg := prometheus.NewRegistry()
			warm, cold := open(reg), open(nil)
			if err := warm.WarmUp(ctx); err != nil {
				t.Fatal(err)
			}
			if used, _ := warm.CacheBlocks(); used != 0 {
				t.Errorf("%d cache blocks held after the warm-up", used)
			}
			if st := warm.Stats(); st != (EngineStats{}) {
				t.Errorf("the warm-up counted: %+v", st)
			}
			relaid := relayoutBytes(t, reg)
			t.Logf("the warm-up relaid %v", relaid)
			if !tc.quant && relaid[layoutKey("packed")] == 0 {
				t.Error("the warm-up packed no f32 weight")
			}
			jw, jc := mixJobs(s.Vocab, Sampling{}), mixJobs(s.Vocab, Sampling{})
			simulate(t, warm, jw)
			simulate(t, cold, jc)
			for i := range jw {
				if !slices.Equal(jw[i].out, jc[i].out) {
					t.Fatalf("sequence %d: %v after a warm-up, %v without", jw[i].seq, jw[i].out, jc[i].out)
				}
				for k := range jw[i].logits {
					if !slices.Equal(jw[i].logits[k], jc[i].logits[k]) {
						t.Fatalf("sequence %d token %d: logits differ after a warm-up", jw[i].seq, k)
					}
				}
			}
			if after := relayoutBytes(t, reg); !maps.Equal(after, relaid) {
				t.Errorf("steps after the warm-up relaid weights: %v, then %v", relaid, after)
			}
			if st := warm.Stats(); st != cold.Stats() {
				t.Errorf("stats %+v after a warm-up, %+v without", st, cold.Stats())
			}
		})
	}

	t.Run("errors", func(t *testing.T) {
		s := tinyNet("llama")
		perBlock := int64(2 * s.Layers * 4 * s.KVHeads * s.HeadDim * 4)
		e := newTestEngine(t, &goDevice{}, s, 1, EngineOptions{CacheBytes: 2 * perBlock, BlockSize: 4})
		if !e.Reserve(1, 8) {
			t.Fatal("reserve")
		}
		if err := e.WarmUp(context.Background()); !errors.Is(err, runtime.ErrOutOfMemory) {
			t.Errorf("warm-up with the cache full: %v, want ErrOutOfMemory", err)
		}
		e.Release(1)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := e.WarmUp(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("warm-up with its context cancelled: %v", err)
		}
		if used, _ := e.CacheBlocks(); used != 0 {
			t.Errorf("%d cache blocks held after failed warm-ups", used)
		}
		if err := e.WarmUp(context.Background()); err != nil {
			t.Error(err)
		}
	})
}

type layoutKey string

// relayoutBytes reads brokerd_onednn_weight_relayout_bytes_total by layout.
func relayoutBytes(t *testing.T, reg *prometheus.Registry) map[layoutKey]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[layoutKey]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "brokerd_onednn_weight_relayout_bytes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "layout" {
					out[layoutKey(l.GetValue())] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if len(out) != 3 {
		t.Fatalf("relayout series %v, want packed, relaid16 and row-major", out)
	}
	return out
}
