package quant_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime/quant"
	"github.com/brokerd/brokerd/runtime/quant/ggmlref"
)

// TestModelkitQ8_0MatchesGGML: the Q8_0 files modelkit writes (for the
// GGUF load tests and the llama.cpp bench) hold the bytes ggml's own
// quantizer writes for the same weights.
func TestModelkitQ8_0MatchesGGML(t *testing.T) {
	lib := ggmlref.Find(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, kind := range []string{"normal", "tiny", "mixed", "zero"} {
		x := weights(rng, kind, 4*256)
		want, err := lib.Quantize(uint32(quant.Q8_0), x, 4, 256)
		if err != nil {
			t.Fatal(err)
		}
		if got := modelkit.QuantizeQ8_0(x); !bytes.Equal(got, want) {
			t.Errorf("%s weights: modelkit's Q8_0 differs from ggml's", kind)
		}
	}
}
