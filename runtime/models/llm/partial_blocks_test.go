package llm

import (
	"errors"
	"testing"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
)

// TestPartialBlockRowsRefused: a file whose block-quantized matrices have
// rows that end inside a block (64-value rows of Q4_K, whose blocks hold
// 256; the tensor's bytes are still whole blocks) is refused at load as
// invalid weights, not at its first step as an invalid graph (a bug's
// INTERNAL).
func TestPartialBlockRowsRefused(t *testing.T) {
	c := Config{Architectures: []string{ArchLlama}, VocabSize: 72, HiddenSize: 64, NumHiddenLayers: 1,
		NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 16, IntermediateSize: 128, MaxPositionEmbeddings: 32}
	s, _, _, err := c.spec()
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []runtime.DType{runtime.Q4_K, runtime.Q6_K} {
		q := map[string]models.Tensor{}
		for n, x := range randomCheckpoint(s, 2) {
			if len(x.Shape) == 2 && len(x.Data)%256 == 0 {
				x = models.Tensor{Shape: x.Shape, Stored: typ, Raw: [][]byte{make([]byte, typ.Bytes(int64(len(x.Data))))}}
			}
			q[n] = x
		}
		if _, err := engineWeights(s, q); !errors.Is(err, models.ErrInvalidWeights) {
			t.Errorf("%s rows of 64 values: %v, want ErrInvalidWeights", typ, err)
		}
	}
}
