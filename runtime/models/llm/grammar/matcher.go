package grammar

import (
	"fmt"
	"slices"
)

// Matcher follows one sequence through a Grammar. Not safe for concurrent
// use; one per sequence. Its methods never panic on bad token ids.
type Matcher struct {
	g          *Grammar
	a          *arena
	cur        []int32 // stacks; 0 = the grammar may end here
	terminated bool
	hist       []histEntry // the last maxHist accepted tokens' states
	dropped    int         // accepted tokens whose states hist no longer keeps
	scratch    [2][]int32
	sorted     []int32
	states     []int32 // per depth, for checking uncertain tokens
	tmp        []uint64
	workStart  int // arena.total when the current Mask or Accept began

	// memo of steps: interned stack sets and their transitions, so that
	// the steps a Mask takes to check context-dependent tokens are shared
	// with the next Masks and with Accept (the stacks below a string or a
	// number stay the same node ids while it is written)
	msets  [][]int32
	mindex map[string]int32
	mtrans map[uint64]int32
	key    []byte
	// memoBytes approximates the memory of the memo (its sets, their
	// keys, the transitions), which an ambiguous grammar grows by many
	// megabytes a token.
	memoBytes int64
}

type histEntry struct {
	set        []int32
	terminated bool
}

// Between calls a matcher holds at most these, so that what it holds is
// bounded (MatcherBytes) whatever the grammar: the arena and the step memo
// are compacted at the end of a Mask or an Accept that grew them past
// compactNodes or memoBytes (the JSON schemas of agents' tools stay under a
// quarter of both), and a parse state that keeps more than maxLiveNodes
// nodes after compacting ends the sequence (ErrStackLimit). Within one
// call they grow as far as Limits.MaxMaskWork lets them.
const (
	compactNodes = 1 << 13
	maxLiveNodes = compactNodes
	memoSteps    = 1 << 14
	memoBytes    = 128 << 10
	// maxHist accepted tokens can be rolled back: a speculative guess
	// (at most 16 tokens) undoes its own.
	maxHist = 32
	// nodeBytes is an arena node's memory: the node, its index entry
	// and its mark.
	nodeBytes = 12 + 40 + 6
)

// MatcherBytes bounds the memory a Matcher holds between calls under
// limits l: its step memo, arena, current and kept stack sets. (A call in
// progress holds more, as Limits.MaxMaskWork allows.)
func (l Limits) MatcherBytes() int64 {
	l = l.withDefaults()
	sets := int64(maxHist+1) * (4*int64(l.MaxStacks) + 32)
	return memoBytes + 512 + int64(maxLiveNodes)*nodeBytes + sets
}

// overgrown says whether the arena or the memo should be compacted.
func (m *Matcher) overgrown() bool {
	return len(m.a.nodes) > compactNodes || len(m.mtrans) > memoSteps || m.memoBytes > memoBytes
}

// settle compacts an overgrown matcher between calls.
func (m *Matcher) settle() error {
	if !m.overgrown() {
		return nil
	}
	m.compact()
	if n := len(m.a.nodes); n > maxLiveNodes {
		return fmt.Errorf("%w: %d parse-stack nodes kept between tokens (limit %d): the grammar is too ambiguous", ErrStackLimit, n, maxLiveNodes)
	}
	return nil
}

// NewMatcher starts a matcher at the beginning of the grammar.
func (g *Grammar) NewMatcher() (*Matcher, error) {
	m := &Matcher{g: g, a: newArena(g.prog, false, g.lim)}
	m.resetMemo()
	m.cur = m.a.start(nil)
	if err := m.checkStep(m.cur); err != nil {
		return nil, err
	}
	if len(m.cur) == 0 {
		return nil, invalidf("grammar matches nothing")
	}
	return m, nil
}

// Reset returns the matcher to the beginning of the grammar.
func (m *Matcher) Reset() {
	m.a = newArena(m.g.prog, false, m.g.lim)
	m.resetMemo()
	m.cur = m.a.start(nil)
	m.terminated = false
	m.hist = m.hist[:0]
	m.dropped = 0
}

func (m *Matcher) checkStep(set []int32) error {
	if m.a.overflow && m.a.work <= m.a.maxWork {
		return fmt.Errorf("%w: parse stack deeper than %d (nesting too deep)", ErrStackLimit, m.a.maxDepth)
	}
	if m.a.work > m.a.maxWork {
		return fmt.Errorf("%w: more than %d parse-stack steps for one byte", ErrStackLimit, m.a.maxWork)
	}
	if m.a.total-m.workStart > m.g.lim.MaxMaskWork {
		return fmt.Errorf("%w: more than %d parse-stack steps for one mask", ErrStackLimit, m.g.lim.MaxMaskWork)
	}
	if len(set) > m.g.lim.MaxStacks {
		return fmt.Errorf("%w: %d parse stacks (limit %d): the grammar is too ambiguous", ErrStackLimit, len(set), m.g.lim.MaxStacks)
	}
	return nil
}

// CanEnd reports whether the output so far is a complete sentence of the
// grammar, so that an end-of-sequence token is allowed.
func (m *Matcher) CanEnd() bool {
	return !m.terminated && slices.Contains(m.cur, 0)
}

// IsTerminated reports whether an end-of-sequence token was accepted.
func (m *Matcher) IsTerminated() bool { return m.terminated }

// Accept advances the matcher over token id. A token the grammar does not
// allow returns an error wrapping ErrTokenRejected and leaves the matcher
// unchanged; ErrStackLimit means the grammar exceeded its run-time bounds
// (finish the sequence).
func (m *Matcher) Accept(id int32) error {
	if m.terminated {
		return ErrTerminated
	}
	v := m.g.vocab
	if v.isEOSID(id) {
		if !m.CanEnd() {
			return fmt.Errorf("%w: end of sequence before the grammar is complete", ErrTokenRejected)
		}
		m.remember()
		m.terminated = true
		return nil
	}
	m.workStart = m.a.total
	t := v.Token(id)
	if len(t) == 0 {
		return fmt.Errorf("%w: token %d has no text", ErrTokenRejected, id)
	}
	s := m.intern(m.cur)
	for i, b := range t {
		var err error
		if s, err = m.step(s, b); err != nil {
			return err
		}
		if s == 0 {
			return fmt.Errorf("%w: token %d (%q) at byte %d", ErrTokenRejected, id, t, i)
		}
	}
	m.remember()
	m.cur = m.msets[s]
	return m.settle()
}

// remember keeps the current state for Rollback, forgetting the oldest
// beyond maxHist.
func (m *Matcher) remember() {
	if len(m.hist) == maxHist {
		copy(m.hist, m.hist[1:])
		m.hist = m.hist[:maxHist-1]
		m.dropped++
	}
	m.hist = append(m.hist, histEntry{m.cur, m.terminated})
}

// Rollback undoes the last n accepted tokens (EOS included), at most the
// last 32.
func (m *Matcher) Rollback(n int) error {
	if n < 0 || n > len(m.hist) {
		return fmt.Errorf("grammar: cannot roll back %d tokens (%d accepted, the last %d kept)", n, m.Accepted(), maxHist)
	}
	for ; n > 0; n-- {
		h := m.hist[len(m.hist)-1]
		m.hist = m.hist[:len(m.hist)-1]
		m.cur, m.terminated = h.set, h.terminated
	}
	return nil
}

// Accepted is the number of tokens accepted (and not rolled back).
func (m *Matcher) Accepted() int { return m.dropped + len(m.hist) }

// Mask writes into dst (Vocab.MaskWords() words) the bitset of tokens
// allowed next: bit id is set iff token id may be sampled. EOS tokens are
// allowed exactly when CanEnd. It returns the number of allowed tokens; 0
// means a dead end (nothing allowed and the grammar cannot end, or already
// terminated): finish the sequence.
func (m *Matcher) Mask(dst []uint64) (int, error) {
	v := m.g.vocab
	if len(dst) < v.words {
		return 0, fmt.Errorf("grammar: mask of %d words, need %d", len(dst), v.words)
	}
	dst = dst[:v.words]
	clear(dst)
	if err := m.settle(); err != nil { // no step holds an id yet
		return 0, err
	}
	m.workStart = m.a.total
	if m.terminated {
		return 0, nil
	}
	// group stacks by top position
	m.sorted = append(m.sorted[:0], m.cur...)
	nodes := m.a.nodes
	slices.SortFunc(m.sorted, func(x, y int32) int { return int(nodes[x].pos) - int(nodes[y].pos) })
	canEnd := false
	for i := 0; i < len(m.sorted); {
		n := m.sorted[i]
		if n == 0 {
			canEnd = true
			i++
			continue
		}
		pos := nodes[n].pos
		j := i + 1
		for j < len(m.sorted) && nodes[m.sorted[j]].pos == pos {
			j++
		}
		ts, err := m.g.entry(pos)
		if err != nil {
			return 0, err
		}
		switch ts.mode {
		case setAccept:
			for _, id := range ts.ids {
				dst[id>>6] |= 1 << (id & 63)
			}
		case setBits:
			for w, x := range ts.bits {
				dst[w] |= x
			}
		case setReject:
			if m.tmp == nil {
				m.tmp = make([]uint64, v.words)
			}
			copy(m.tmp, v.usable)
			for _, id := range ts.ids {
				m.tmp[id>>6] &^= 1 << (id & 63)
			}
			for w, x := range m.tmp {
				dst[w] |= x
			}
		}
		if len(ts.uncertain) > 0 {
			if err := m.checkUncertain(ts.uncertain, m.sorted[i:j], dst); err != nil {
				return 0, err
			}
		}
		i = j
	}
	if canEnd {
		for _, e := range v.eos {
			dst[e>>6] |= 1 << (e & 63)
		}
	}
	if err := m.settle(); err != nil {
		return 0, err
	}
	return MaskCount(dst), nil
}

// checkUncertain runs the context-dependent tokens (in byte order, so
// that consecutive tokens share the steps of their common prefix) against
// the real stacks.
func (m *Matcher) checkUncertain(unc []int32, stacks []int32, dst []uint64) error {
	v := m.g.vocab
	m.states = append(m.states[:0], m.intern(stacks))
	var prev []byte
	valid := 0 // m.states[1..valid] are the states after prev's first bytes
	dead := -1 // prev's prefix of this length leaves no stack
	for _, id := range unc {
		t := v.tokens[id]
		if dst[id>>6]&(1<<(id&63)) != 0 {
			continue // already allowed by another stack
		}
		l := 0
		for l < len(t) && l < len(prev) && t[l] == prev[l] {
			l++
		}
		if dead >= 0 && dead <= l {
			prev = t
			valid = min(valid, l)
			continue
		}
		dead = -1
		valid = min(valid, l)
		for d := valid; d < len(t); d++ {
			s, err := m.step(m.states[d], t[d])
			if err != nil {
				return err
			}
			m.states = append(m.states[:d+1], s)
			valid = d + 1
			if s == 0 {
				dead = d + 1
				break
			}
		}
		if dead < 0 {
			dst[id>>6] |= 1 << (id & 63)
		}
		prev = t
	}
	return nil
}

func (m *Matcher) resetMemo() {
	m.msets = [][]int32{nil}
	m.mindex = map[string]int32{"": 0}
	m.mtrans = map[uint64]int32{}
	m.memoBytes = 0
}

// intern returns the id of a stack set (0: the empty set).
func (m *Matcher) intern(set []int32) int32 {
	if len(set) == 0 {
		return 0
	}
	if !slices.IsSorted(set) {
		set = slices.Clone(set)
		slices.Sort(set)
	}
	m.key = m.key[:0]
	for _, n := range set {
		m.key = append(m.key, byte(n), byte(n>>8), byte(n>>16), byte(n>>24))
	}
	if id, ok := m.mindex[string(m.key)]; ok {
		return id
	}
	id := int32(len(m.msets))
	m.msets = append(m.msets, slices.Clone(set))
	m.mindex[string(m.key)] = id
	m.memoBytes += 8*int64(len(set)) + 96 // the set, its key, their headers and map slot
	return id
}

// step is the memoized arena step of an interned set over byte b.
func (m *Matcher) step(s int32, b byte) (int32, error) {
	k := uint64(s)<<8 | uint64(b)
	if r, ok := m.mtrans[k]; ok {
		return r, nil
	}
	out := m.a.step(m.msets[s], b, m.scratch[0][:0])
	m.scratch[0] = out
	if err := m.checkStep(out); err != nil {
		return 0, err
	}
	r := m.intern(out)
	m.mtrans[k] = r
	m.memoBytes += 32
	return r, nil
}

// remaining is the fewest bytes that complete the grammar from here (0 if
// it can end now).
func (m *Matcher) remaining() int {
	best := -1
	for _, n := range m.cur {
		if r := m.a.remaining(n); best < 0 || r < best {
			best = r
		}
	}
	return best
}

// compact rebuilds the arena with only the nodes the matcher still uses.
func (m *Matcher) compact() {
	old := m.a
	a := newArena(m.g.prog, false, m.g.lim)
	remap := map[int32]int32{0: 0}
	var cp func(n int32) int32
	cp = func(n int32) int32 {
		if r, ok := remap[n]; ok {
			return r
		}
		nd := old.nodes[n]
		r := a.node(nd.pos, cp(nd.parent))
		remap[n] = r
		return r
	}
	mapSet := func(s []int32) []int32 {
		out := make([]int32, len(s))
		for i, n := range s {
			out[i] = cp(n)
		}
		return out
	}
	m.cur = mapSet(m.cur)
	for i := range m.hist {
		m.hist[i].set = mapSet(m.hist[i].set)
	}
	m.a = a
	m.resetMemo()
}
