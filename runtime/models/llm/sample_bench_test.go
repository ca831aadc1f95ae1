package llm

import (
	"math"
	"testing"
)

// BenchmarkSample is one token's sampling over Qwen's vocabulary, per
// sampling mode: it runs on the step's path once per sequence. The
// sequence borrows its buffers from a pool, as a Model's do.
func BenchmarkSample(b *testing.B) {
	const v = 151936
	logits := make([]float32, v)
	for i := range logits {
		logits[i] = float32(math.Sin(float64(i)*0.37)*4 + math.Cos(float64(i)*0.011)*3)
	}
	for _, tc := range []struct {
		name string
		p    Sampling
	}{
		{"greedy", Sampling{}},
		{"temperature", Sampling{Temperature: 0.8, Seeded: true}},
		{"top-k-20-top-p-0.8", Sampling{Temperature: 0.7, TopK: 20, TopP: 0.8, Seeded: true}},
		{"top-p-0.9", Sampling{Temperature: 0.6, TopP: 0.9, Seeded: true}},
		{"logprobs-5", Sampling{Logprobs: true, TopLogprobs: 5}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := newSequence(tc.p, nil, v, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			s.scratch = NewScratchPool(v)
			for range b.N {
				s.counts = map[int32]int{} // keep the penalties' state from growing
				if _, err := s.next(logits); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
