package grammar_test

import (
	"context"
	"fmt"
	"math"

	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
)

// A sampler's loop: mask the logits, sample, Accept, stop at EOS or at a
// dead end.
func Example() {
	// a toy vocabulary: token i's bytes (after byte-level decoding), EOS
	// as a control token with no bytes
	tokens := [][]byte{[]byte(`{"`), []byte(`ok`), []byte(`":`), []byte(` true`), []byte(`}`), []byte(`"`), []byte(`x`), []byte(`:`), nil}
	eos := int32(len(tokens) - 1)
	vocab, err := grammar.NewVocab(tokens, []int32{eos})
	if err != nil {
		panic(err)
	}
	cache := grammar.NewCache(64<<20, grammar.Limits{})
	schema := `{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}`
	g, err := cache.Get(context.Background(), vocab, grammar.KindJSONSchema, schema)
	if err != nil {
		panic(err) // wraps ErrInvalidGrammar, ErrUnsupportedSchema or ErrGrammarTooLarge
	}
	m, err := g.NewMatcher()
	if err != nil {
		panic(err)
	}
	mask := make([]uint64, vocab.MaskWords())
	// a "model" that prefers the last tokens of the vocabulary
	logits := make([]float32, vocab.Size())
	for i := range logits {
		logits[i] = float32(i)
	}
	var out []byte
	for !m.IsTerminated() {
		n, err := m.Mask(mask)
		if err != nil || n == 0 {
			fmt.Println("grammar dead end")
			return
		}
		masked := make([]float32, len(logits))
		for id := range logits {
			masked[id] = logits[id]
			if !grammar.MaskAllows(mask, int32(id)) {
				masked[id] = float32(math.Inf(-1))
			}
		}
		best := int32(0) // greedy sampling over what the mask left
		for id := range masked {
			if masked[id] > masked[best] {
				best = int32(id)
			}
		}
		if err := m.Accept(best); err != nil {
			panic(err)
		}
		out = append(out, vocab.Token(best)...)
	}
	fmt.Println(string(out))
	// Output: {"ok": true}
}
