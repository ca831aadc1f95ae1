package bpe

import (
	"cmp"
	"slices"
)

// Added tokens (the chat markers, and whatever else a file marks as
// control or user-defined) are found in the text before BPE: at the
// leftmost position where one starts, the longest one there, the first
// added of equal ones; then again after it (tokenizers' LeftmostLongest).
//
// A file chooses the tokens, and trying each at each byte costs text ×
// tokens × token length: 1,000 tokens of 1,000 'a's made a 1 MB prompt
// of 'a's take minutes. addedMatcher is linear in the text instead: an
// Aho–Corasick automaton over the tokens reversed, run backwards over the
// text, is at each position in the state whose outputs are the tokens
// starting there, the longest one first.

// maxAddedBytes bounds the added tokens' bytes together, which bound the
// automaton's nodes: it takes about 13 bytes a node, and as much again
// while it is built. Real files hold a few KB (Llama 3's 256 added
// tokens: 7.5 KB; Qwen 3's 26: 340 bytes).
const maxAddedBytes = 4 << 20

// addedMatcher is the automaton. Its nodes are the added tokens' reversed
// prefixes (their suffixes, read backwards), numbered breadth first, so
// that node v's children are the nodes first[v] to first[v+1]-1, in
// increasing order of their label, the byte that leads to them.
type addedMatcher struct {
	tokens []addedToken // in the order they were added
	maxLen int          // the longest token's bytes
	label  []byte
	first  []int32 // one more than the nodes
	fail   []int32 // the node of the longest proper suffix of v's string that is a node
	out    []int32 // the longest token v's string ends with (reversed: starts with), or -1
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	m := &addedMatcher{tokens: tokens}
	for _, a := range tokens {
		m.maxLen = max(m.maxLen, len(a.content))
	}
	// The tokens sorted by their reversed content (ties: in the order
	// added), so that a node's tokens are a run of them, those that end
	// at the node first.
	order := make([]int32, len(tokens))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return compareReversed(tokens[a].content, tokens[b].content) })

	// Build the trie a level at a time: node v stands for the run
	// order[lo[v]:hi[v]] and its string has depth[v] bytes.
	m.label, m.first, m.out = []byte{0}, []int32{}, []int32{-1}
	lo, hi, depth := []int32{0}, []int32{int32(len(order))}, []int32{0}
	for v := 0; v < len(m.label); v++ {
		i, d := lo[v], int(depth[v])
		m.first = append(m.first, int32(len(m.label)))
		if i < hi[v] && len(tokens[order[i]].content) == d {
			m.out[v] = order[i] // equal tokens: the first added wins
		}
		for i < hi[v] && len(tokens[order[i]].content) == d {
			i++
		}
		for i < hi[v] {
			c := reversedByte(tokens[order[i]].content, d)
			j := i + 1
			for j < hi[v] && reversedByte(tokens[order[j]].content, d) == c {
				j++
			}
			m.label = append(m.label, c)
			m.out = append(m.out, -1)
			lo, hi, depth = append(lo, i), append(hi, j), append(depth, int32(d+1))
			i = j
		}
	}
	m.first = append(m.first, int32(len(m.label)))

	// Failure links, breadth first: a child's is found from its parent's.
	// A node that ends no token of its own outputs its failure's.
	m.fail = make([]int32, len(m.label))
	for v := range int32(len(m.label)) {
		for u := m.first[v]; u < m.first[v+1]; u++ {
			if v != 0 {
				m.fail[u], _ = m.step(m.fail[v], m.label[u])
			}
			if m.out[u] < 0 {
				m.out[u] = m.out[m.fail[u]]
			}
		}
	}
	return m
}

// compareReversed orders strings by their bytes read from the end.
func compareReversed(a, b string) int {
	for i := 1; i <= min(len(a), len(b)); i++ {
		if c := cmp.Compare(a[len(a)-i], b[len(b)-i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// reversedByte is s's byte d from the end (0: the last).
func reversedByte(s string, d int) byte { return s[len(s)-1-d] }

// child is v's child by c, or -1.
func (m *addedMatcher) child(v int32, c byte) int32 {
	lo, hi := m.first[v], m.first[v+1]
	for lo < hi {
		mid := int32(uint32(lo+hi) >> 1)
		switch l := m.label[mid]; {
		case l == c:
			return mid
		case l < c:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return -1
}

// step is the state after v reads c: the longest suffix of v's string
// and c that is a node; and how many nodes it looked c up in (their
// depth falls with each, so a read of n bytes looks up at most 2n).
func (m *addedMatcher) step(v int32, c byte) (int32, int) {
	for n := 1; ; n++ {
		if u := m.child(v, c); u >= 0 {
			return u, n
		}
		if v == 0 {
			return 0, n
		}
		v = m.fail[v]
	}
}

// addedChunk is how much text a scan reads ahead of the position asked
// for, at least (and at least four times the longest token): each read
// starts maxLen-1 bytes after its chunk, so that the tokens starting near
// the chunk's end are seen whole, and that overlap is a small part of it.
const addedChunk = 16 << 10

// addedScan finds the added tokens in s left to right.
type addedScan struct {
	m     *addedMatcher
	s     string
	chunk int        // the least a read reads
	done  int        // s[:done] is read
	hits  []addedHit // tokens starting in the last chunk read, the leftmost last
	steps int        // nodes looked up (a measure of the work, for tests)
}

type addedHit struct {
	at  int
	tok int32
}

func (m *addedMatcher) scan(s string) *addedScan {
	return &addedScan{m: m, s: s, chunk: max(addedChunk, 4*m.maxLen)}
}

// next returns the leftmost position from from on where an added token
// starts and the longest one there, or len(s) and nil when there is none.
func (sc *addedScan) next(from int) (int, *addedToken) {
	for {
		for n := len(sc.hits); n > 0; n = len(sc.hits) {
			if h := sc.hits[n-1]; h.at >= from {
				return h.at, &sc.m.tokens[h.tok]
			}
			sc.hits = sc.hits[:n-1]
		}
		start := max(sc.done, from)
		if start >= len(sc.s) || len(sc.m.tokens) == 0 {
			return len(sc.s), nil
		}
		end := min(len(sc.s), start+sc.chunk)
		sc.read(start, end)
		sc.done = end
	}
}

// read runs the automaton backwards from s[end+maxLen-2] (or the text's
// end) to s[start], keeping the tokens that start before end.
func (sc *addedScan) read(start, end int) {
	m := sc.m
	v := int32(0)
	for at := min(len(sc.s), end+m.maxLen-1) - 1; at >= start; at-- {
		var n int
		v, n = m.step(v, sc.s[at])
		sc.steps += n
		if tok := m.out[v]; tok >= 0 && at < end {
			sc.hits = append(sc.hits, addedHit{at, tok})
		}
	}
}
