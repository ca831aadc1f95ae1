package onednn

import (
	"fmt"
	"slices"
	"time"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
)

// Weights of the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and
// the K types (Q4_K, Q5_K, Q6_K) relaid by 16 rows (x16Type, qgemm.h's BD_X16). In GGUF's layout qgemm's
// VNNI kernel spends a dpbusd, a conversion and an FMA on every 64
// products of one output, and a few shuffles more for the scales;
// relaid, one dpbusd adds four products to each of 16 outputs, and a
// block's conversion and FMA are shared by its 32: Qwen2.5-0.5B's
// 4864x896 Q8_0 product ran 3.6-5x faster on one thread at 1 to 16 rows
// (bench/RESULTS.md). At 16 rows a thread's products run at about 290
// GFLOP/s, more than oneDNN's bf16 on dequantized slices, so relaid
// weights take this kernel for prefill's rows too: a 512-token llama1024
// prefill 358-363 ms against 472-494 (BenchmarkPrefill512/q8_0,
// -llm.nox16 alternating, 2 Zen 4 cores). The relayout is in place (the
// same 34 bytes a block), on a weight's first product, as packed.go packs
// f32 weights. A gather reads a relaid table from its tiles (qgather), so
// a tied embedding stays relaid; a buffer read otherwise (CopyOut) goes
// back to GGUF's layout first and stays there. Q4_K's
// kernel sums a sub-block's products in int32 times the lanes' scales
// (qgemm_avx512.h's kz_k16): llama1024's 16 streams 1.3x and its prefill
// 1.2x faster relaid. Q6_K's sums its 16-element sub-blocks the same way
// (kz_q6x16), its quants laid out a sub-block at a time so that a tile's
// block is read in one sequential pass: llama1024 all Q6_K, 16 streams
// 1.2-1.3x faster, one stream as fast. Q5_K's is Q4_K's with its fifth
// bits as masks (kz_k5x16).

// x16Eligible says whether s's weights wb (nil: not a weight only
// matmuls read) take x16Type on this device: a type it relays, rows by
// 16, and no AMX path that would read them in GGUF's layout on other
// steps (qamx reads them relaid only with Options.AMXRelaid, and not
// Q6_K's).
func (d *Device) x16Eligible(s *runtime.Step, q quant.Type, wb *buffer) bool {
	if wb == nil || !d.x16 || d.qAMXRows != 0 && !(d.amxX16 && qamxSupports(x16Type(q))) || !slices.Contains(x16Types, q) {
		return false
	}
	wt := s.In[1]
	in, _ := q.Info()
	return len(wt.Shape) == 2 && wt.Shape[0]%16 == 0 && wt.Shape[1]%in.BlockElems == 0
}

// layoutFor puts wb in the layout s's product reads and returns the weight
// type to multiply it as: x16Type(q) for an eligible weight, else q with
// wb in GGUF's layout. Runs on the worker thread.
func (d *Device) layoutFor(s *runtime.Step, q quant.Type, wb *buffer) (quant.Type, error) {
	want := d.x16Eligible(s, q, wb)
	if wb == nil {
		return q, nil
	}
	d.mu.Lock()
	have := wb.x16
	d.mu.Unlock()
	if have != want {
		if err := d.relayoutX16(wb, want); err != nil {
			return q, fmt.Errorf("%s: %w", s, err)
		}
	}
	if want {
		return x16Type(q), nil
	}
	return q, nil
}

// relayoutX16 rewrites w's contents into x16Type's layout (toX16) or
// back. Runs on the worker thread.
func (d *Device) relayoutX16(w *buffer, toX16 bool) error {
	q, ok := w.dt.GGML()
	if !ok || len(w.shape) != 2 {
		return fmt.Errorf("onednn: relayout by 16 rows of a %s %s buffer", shapeString(w.shape), w.dt)
	}
	began := time.Now()
	if err := x16Relayout(q, w.ptr, int64(w.shape[0]), int64(w.shape[1]), toX16, d.threads); err != nil {
		return err
	}
	layout := layoutRowMajor
	if toX16 {
		layout = layoutRelaid16
	}
	d.relaid(layout, w.bytes, began)
	d.mu.Lock()
	w.x16 = toX16
	d.mu.Unlock()
	return nil
}

// isX16 says whether weight type t is one of x16Type's.
func isX16(t quant.Type) bool { return slices.Contains(x16Types, t-x16Type(0)) }
