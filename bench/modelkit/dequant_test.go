package modelkit

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/brokerd/brokerd/runtime/safetensors"
)

// TestWriteDequantized: an f32 GGUF comes back as the checkpoint it was
// written from, value for value (Llama's q/k rows back in Hugging Face's
// order); a q8_0 one within Q8_0's rounding, with the config and
// tokenizer beside it.
func TestWriteDequantized(t *testing.T) {
	tok := filepath.Join("..", "..", "runtime", "models", "tokenizer", "bpe", "testdata")
	for _, c := range []struct{ arch, tok, ftype string }{
		{"llama", "llama3", "f32"},
		{"qwen2", "qwen3", "q8_0"},
	} {
		t.Run(c.arch+"-"+c.ftype, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "m", "1")
			s := LLM{Arch: c.arch, Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, Intermediate: 96, DType: "f32", TokenizerDir: filepath.Join(tok, c.tok)}
			if _, err := WriteLLM(dir, s); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "m.gguf")
			if _, err := WriteGGUF(dir, path, c.ftype); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "deq")
			types, err := WriteDequantized(path, dir, out)
			if err != nil {
				t.Fatal(err)
			}
			if c.ftype == "q8_0" && types["q8_0"] == 0 || types["f32"] == 0 {
				t.Errorf("types %v", types)
			}
			for _, f := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
				if _, err := os.Stat(filepath.Join(out, f)); err != nil {
					t.Error(err)
				}
			}
			want, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer want.Close()
			got, err := safetensors.Open(filepath.Join(out, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer got.Close()
			if !slices.Equal(got.Names(), want.Names()) {
				t.Fatalf("names %v, want %v", got.Names(), want.Names())
			}
			for _, n := range want.Names() {
				w, err := want.Float32(n)
				if err != nil {
					t.Fatal(err)
				}
				g, err := got.Float32(n)
				if err != nil {
					t.Fatal(err)
				}
				if gi, _ := got.Info(n); gi.DType != "F32" || !slices.Equal(g.Shape, w.Shape) {
					t.Fatalf("%s: %s %v, want F32 %v", n, gi.DType, g.Shape, w.Shape)
				}
				worst := 0.0
				amax := 0.0
				for i := range w.Data {
					worst = max(worst, math.Abs(float64(g.Data[i]-w.Data[i])))
					amax = max(amax, math.Abs(float64(w.Data[i])))
				}
				// Q8_0: half a step of max|x|/127 per block, and the
				// scale's f16 rounding.
				if limit := map[string]float64{"f32": 0, "q8_0": amax / 127}[c.ftype]; worst > limit {
					t.Errorf("%s: max abs difference %g, want at most %g", n, worst, limit)
				}
			}
		})
	}
}
