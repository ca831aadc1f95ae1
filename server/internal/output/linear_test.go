package output

import (
	"runtime"
	"strings"
	"testing"
)

// allocated is how many bytes f allocates on the heap: a measure of its
// work that, unlike time, does not depend on the machine's load.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHeldTextIsLinear: text that the parsers hold back (whitespace a tag
// may follow, an open call) is appended to, not copied and re-scanned on
// every push. A model that writes a long run of whitespace in pieces (its
// tokens, or a client's regex constraint such as " *") must cost work
// linear in the run: four times the pieces, about four times the bytes
// allocated, where copying what is held costs sixteen times.
func TestHeldTextIsLinear(t *testing.T) {
	const n = 1024
	ws := strings.Repeat(" ", 32)
	for _, tc := range []struct {
		name  string
		start func() func(string) // a parser after its first text, and its Push
		piece string
	}{
		{"thinking block", func() func(string) {
			p := NewThinking(Qwen3Tags, true)
			p.Push("reasoning")
			return func(s string) { p.Push(s) }
		}, ws},
		{"before a thinking block", func() func(string) {
			p := NewThinking(Qwen3Tags, false)
			return func(s string) { p.Push(s) }
		}, ws},
		{"hermes content", func() func(string) {
			p := NewToolCalls(Hermes)
			p.Push("answer")
			return func(s string) { p.Push(s) }
		}, ws},
		{"hermes open call", func() func(string) {
			p := NewToolCalls(Hermes)
			p.Push("<tool_call>")
			return func(s string) { p.Push(s) }
		}, `{"a":`},
		{"llama leading whitespace", func() func(string) {
			p := NewToolCalls(Llama3JSON)
			return func(s string) { p.Push(s) }
		}, ws},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work := func(pieces int) uint64 {
				push := tc.start()
				return allocated(func() {
					for range pieces {
						push(tc.piece)
					}
				})
			}
			small, large := work(n), work(4*n)
			t.Logf("%d pieces: %d bytes allocated; %d pieces: %d", n, small, 4*n, large)
			if large > 8*small {
				t.Errorf("%d pieces of %q allocated %d bytes, %d pieces %d: the work grows quadratically with the text held",
					4*n, tc.piece, large, n, small)
			}
		})
	}
}
