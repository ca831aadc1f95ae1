package grammar

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
)

var (
	bigVocabOnce sync.Once
	bigVocab     *Vocab
	smallOnce    sync.Once
	smallVocab   *Vocab
)

// qwenSize is Qwen2's vocabulary size.
const qwenSize = 151936

func getBigVocab(tb testing.TB) *Vocab {
	bigVocabOnce.Do(func() {
		toks, eos := SyntheticVocab(qwenSize, 1)
		v, err := NewVocab(toks, eos)
		if err != nil {
			panic(err)
		}
		bigVocab = v
	})
	return bigVocab
}

func getSmallVocab(tb testing.TB) *Vocab {
	smallOnce.Do(func() {
		toks, eos := SyntheticVocab(12000, 2)
		v, err := NewVocab(toks, eos)
		if err != nil {
			panic(err)
		}
		smallVocab = v
	})
	return smallVocab
}

func mustCompile(tb testing.TB, v *Vocab, kind Kind, src string) *Grammar {
	tb.Helper()
	g, err := Compile(context.Background(), v, kind, src, Limits{})
	if err != nil {
		tb.Fatalf("compile %s: %v\n%s", kind, err, src)
	}
	return g
}

// walk samples a sentence of g: uniformly among the allowed tokens, EOS
// whenever allowed with probability pEOS, and after soft tokens, only
// single-byte tokens that bring the end closest. It fails the test on a
// dead end.
func walk(tb testing.TB, g *Grammar, r *rand.Rand, soft, hard int) ([]byte, []int32) {
	tb.Helper()
	v := g.Vocab()
	m, err := g.NewMatcher()
	if err != nil {
		tb.Fatal(err)
	}
	mask := make([]uint64, v.MaskWords())
	var out []byte
	var ids []int32
	for step := 0; ; step++ {
		if step > hard {
			tb.Fatalf("no end after %d tokens: %q", hard, out)
		}
		n, err := m.Mask(mask)
		if err != nil {
			tb.Fatal(err)
		}
		if n == 0 {
			tb.Fatalf("dead end after %q", out)
		}
		if m.CanEnd() && (step >= soft || r.IntN(8) == 0) {
			if err := m.Accept(v.eos[0]); err != nil {
				tb.Fatal(err)
			}
			return out, ids
		}
		var id int32
		if step >= soft {
			id = closer(tb, m, mask, r)
		} else {
			k := r.IntN(n)
			id = nthSet(mask, k)
		}
		if v.isEOSID(id) {
			if err := m.Accept(id); err != nil {
				tb.Fatal(err)
			}
			return out, ids
		}
		if err := m.Accept(id); err != nil {
			tb.Fatalf("accept of allowed token %d %q after %q: %v", id, v.tokens[id], out, err)
		}
		out = append(out, v.tokens[id]...)
		ids = append(ids, id)
	}
}

// closer picks, among allowed single-byte tokens, one that leaves the
// fewest bytes to the end (ties broken at random).
func closer(tb testing.TB, m *Matcher, mask []uint64, r *rand.Rand) int32 {
	v := m.g.vocab
	best, bestID, ties := -1, int32(-1), 0
	for id := int32(0); id < int32(len(v.tokens)); id++ {
		if !MaskAllows(mask, id) || len(v.tokens[id]) != 1 {
			continue
		}
		if err := m.Accept(id); err != nil {
			tb.Fatal(err)
		}
		d := m.remaining()
		_ = m.Rollback(1)
		switch {
		case best < 0 || d < best:
			best, bestID, ties = d, id, 1
		case d == best:
			ties++
			if r.IntN(ties) == 0 {
				bestID = id
			}
		}
	}
	if bestID < 0 {
		// no single byte allowed: any allowed token
		return nthSet(mask, 0)
	}
	return bestID
}

func nthSet(mask []uint64, k int) int32 {
	for w, x := range mask {
		c := popcount(x)
		if k >= c {
			k -= c
			continue
		}
		for ; ; x &= x - 1 {
			if k == 0 {
				return int32(w*64 + trailingZeros(x))
			}
			k--
		}
	}
	return -1
}
