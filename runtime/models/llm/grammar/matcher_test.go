package grammar

import (
	goruntime "runtime"
	"testing"
)

// TestMatcherStaysCompact: an ambiguous grammar grows the parse-state
// arena and the step memo every token; between tokens (after Accept, and
// before a Mask) the matcher keeps them under its compaction bounds, so a
// long constrained answer holds megabytes, not what every token built.
func TestMatcherStaysCompact(t *testing.T) {
	v := getByteVocab()
	g := mustCompile(t, v, KindRegex, `(a|aa|aaa|[a-z]|[a-z][a-z]){0,1000}`)
	m, err := g.NewMatcher()
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]uint64, v.words)
	grew := false
	for i := range 600 {
		if _, err := m.Mask(dst); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		nodes, memo := len(m.a.nodes), m.memoBytes
		grew = grew || nodes > compactNodes/2 || memo > memoBytes/2
		if err := m.Accept(int32('a')); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		if m.overgrown() {
			t.Fatalf("token %d: %d arena nodes and %d memo bytes held after Accept (bounds %d and %d)", i, len(m.a.nodes), m.memoBytes, compactNodes, memoBytes)
		}
	}
	if !grew {
		t.Skip("the grammar did not grow the matcher near its bounds: nothing to check")
	}
}

// TestMatcherHoldsAtMostMatcherBytes: matchers under an ambiguous grammar,
// measured on the heap between tokens, hold no more than MatcherBytes each
// (what the server charges a constrained sequence), the ones the grammar's
// limits have ended included.
func TestMatcherHoldsAtMostMatcherBytes(t *testing.T) {
	v := getByteVocab()
	g := mustCompile(t, v, KindRegex, `(a|aa|aaa|aaaa|[a-z]|[a-z][a-z]|[a-z][a-z][a-z]){0,1000}`)
	const n = 8
	heap := func() int64 {
		goruntime.GC()
		var ms goruntime.MemStats
		goruntime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	dst := make([]uint64, v.words)
	ms := make([]*Matcher, n)
	base := heap()
	for i := range ms {
		var err error
		if ms[i], err = g.NewMatcher(); err != nil {
			t.Fatal(err)
		}
	}
	bound := Limits{}.MatcherBytes()
	if bound > 1<<20 {
		// A constrained sequence is charged this; n of them per request.
		t.Errorf("MatcherBytes %d: more than 1 MiB a constrained sequence", bound)
	}
	worst, ended := int64(0), 0
	for step := range 400 {
		for _, m := range ms {
			if m.IsTerminated() {
				continue
			}
			if _, err := m.Mask(dst); err != nil {
				ended++
				m.terminated = true // keep it, as a finished sequence is kept
				continue
			}
			if err := m.Accept(int32('a' + step%3)); err != nil {
				ended++
				m.terminated = true
			}
		}
		if step%40 == 39 {
			worst = max(worst, (heap()-base)/n)
		}
	}
	t.Logf("at most %d KiB a matcher (bound %d KiB); %d ended by the limits", worst>>10, bound>>10, ended)
	if worst > bound {
		t.Errorf("a matcher holds %d bytes between tokens, more than MatcherBytes %d", worst, bound)
	}
	if worst < bound/8 {
		t.Skipf("the grammar grew the matchers to %d bytes only: nothing to check", worst)
	}
	goruntime.KeepAlive(ms)
}

// TestRollbackKeepsTheLast32: Rollback undoes up to the last 32 tokens
// (what a speculative guess of at most 16 needs); Accepted counts them all.
func TestRollbackKeepsTheLast32(t *testing.T) {
	v := getByteVocab()
	g := mustCompile(t, v, KindRegex, `[a-z]{0,100}`)
	m, err := g.NewMatcher()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if err := m.Accept(int32('a' + i%26)); err != nil {
			t.Fatal(err)
		}
	}
	if m.Accepted() != 40 {
		t.Fatalf("Accepted %d, want 40", m.Accepted())
	}
	if err := m.Rollback(33); err == nil {
		t.Error("rolled back 33 tokens: only the last 32 are kept")
	}
	if err := m.Rollback(32); err != nil || m.Accepted() != 8 {
		t.Fatalf("Rollback(32): %v, Accepted %d", err, m.Accepted())
	}
	// The state is the one after 8 tokens: 92 more letters fit, not 93.
	for i := range 92 {
		if err := m.Accept('z'); err != nil {
			t.Fatalf("letter %d after the rollback: %v", 9+i, err)
		}
	}
	if err := m.Accept('z'); err == nil {
		t.Error("a 101st letter accepted")
	}
}
