package onednn

import (
	"fmt"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/quant"
)

// Q8_0 weights relaid by 16 rows (q8x16, qgemm.h's BD_Q8_0_X16). In GGUF's
// layout qgemm's VNNI kernel spends a dpbusd, a conversion and an FMA on
// every 64 products of one output, and a few shuffles more for the
// scales; relaid, one dpbusd adds four products to each of 16 outputs, and
// a block's conversion and FMA are shared by its 32: Qwen2.5-0.5B's
// 4864x896 product ran 3.6-5x faster on one thread at 1 to 16 rows
// (bench/RESULTS.md). At 16 rows a thread's products run at about 290
// GFLOP/s, more than oneDNN's bf16 on dequantized slices, so relaid
// weights take this kernel for prefill's rows too: a 512-token llama1024
// prefill 358-363 ms against 472-494 (BenchmarkPrefill512/q8_0,
// -llm.nox16 alternating, 2 Zen 4 cores). The relayout is in place (the
// same 34 bytes a block), on a weight's first product, as packed.go packs
// f32 weights; a buffer read otherwise (a gather of a tied embedding,
// CopyOut) goes back to GGUF's layout first and stays there.

// x16Eligible says whether s's weights wb (nil: not a weight only
// matmuls read) take q8x16 on this device: Q8_0, rows by 16, and no AMX
// path that would read them in GGUF's layout on other steps.
func (d *Device) x16Eligible(s *runtime.Step, q quant.Type, wb *buffer) bool {
	if wb == nil || !d.x16 || d.qAMXRows != 0 || q != quant.Q8_0 {
		return false
	}
	wt := s.In[1]
	return len(wt.Shape) == 2 && wt.Shape[0]%16 == 0 && wt.Shape[1]%32 == 0
}

// layoutFor puts wb in the layout s's product reads and returns the weight
// type to multiply it as: q8x16 for an eligible Q8_0 weight, else q with
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
		return q8x16, nil
	}
	return q, nil
}

// relayoutX16 rewrites w's Q8_0 contents into q8x16's layout (toX16) or
// back. Runs on the worker thread.
func (d *Device) relayoutX16(w *buffer, toX16 bool) error {
	if len(w.shape) != 2 {
		return fmt.Errorf("onednn: Q8_0 relayout of a %s buffer", shapeString(w.shape))
	}
	if err := q8x16Relayout(w.ptr, int64(w.shape[0]), int64(w.shape[1]), toX16, d.threads); err != nil {
		return err
	}
	d.mu.Lock()
	w.x16 = toX16
	d.mu.Unlock()
	return nil
}
