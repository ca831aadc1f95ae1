package grammar

import "testing"

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
