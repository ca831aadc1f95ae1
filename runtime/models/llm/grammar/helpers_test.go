package grammar

import (
	"context"
	"fmt"
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
// whenever allowed with probability 1/8, and after soft tokens, only
// single-byte tokens that bring the end closest. It fails the test on a
// dead end.
func walk(tb testing.TB, g *Grammar, r *rand.Rand, soft, hard int) ([]byte, []int32) {
	tb.Helper()
	out, ids, err := walkE(g, r, soft, hard)
	if err != nil {
		tb.Fatal(err)
	}
	return out, ids
}

func walkE(g *Grammar, r *rand.Rand, soft, hard int) ([]byte, []int32, error) {
	v := g.Vocab()
	m, err := g.NewMatcher()
	if err != nil {
		return nil, nil, err
	}
	mask := make([]uint64, v.MaskWords())
	var out []byte
	var ids []int32
	for step := 0; ; step++ {
		if step > hard {
			return nil, nil, fmt.Errorf("no end after %d tokens: %q", hard, out)
		}
		n, err := m.Mask(mask)
		if err != nil {
			return nil, nil, err
		}
		if n == 0 {
			return nil, nil, fmt.Errorf("dead end after %q", out)
		}
		if m.CanEnd() && (step >= soft || r.IntN(8) == 0) {
			if err := m.Accept(v.eos[0]); err != nil {
				return nil, nil, err
			}
			return out, ids, nil
		}
		var id int32
		if step >= soft {
			if id, err = closer(m, mask, r); err != nil {
				return nil, nil, err
			}
		} else {
			id = nthSet(mask, r.IntN(n))
		}
		if err := m.Accept(id); err != nil {
			return nil, nil, fmt.Errorf("accept of allowed token %d %q after %q: %v", id, v.tokens[id], out, err)
		}
		if v.isEOSID(id) {
			return out, ids, nil
		}
		out = append(out, v.tokens[id]...)
		ids = append(ids, id)
	}
}

// closer picks, among allowed single-byte tokens, one that leaves the
// fewest bytes to the end (ties broken at random).
func closer(m *Matcher, mask []uint64, r *rand.Rand) (int32, error) {
	v := m.g.vocab
	best, bestID, ties := -1, int32(-1), 0
	for id := int32(0); id < int32(len(v.tokens)); id++ {
		if !MaskAllows(mask, id) || len(v.tokens[id]) != 1 {
			continue
		}
		if err := m.Accept(id); err != nil {
			return 0, err
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
		return nthSet(mask, 0), nil
	}
	return bestID, nil
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
