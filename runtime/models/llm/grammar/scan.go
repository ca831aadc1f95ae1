package grammar

import "slices"

type scanner struct {
	g         *Grammar
	d         *dfa
	st        []int32
	ex        []bool
	acc, unc  []int32
	accepted  []uint64
	base      map[int32]*tokenSet // scans of template positions
	baseBytes int64
}

// bytes approximates the scanner's memory: its DFA's states and arena,
// and the template scans it keeps.
func (sc *scanner) bytes() int64 {
	return sc.d.bytes + int64(len(sc.d.a.nodes))*nodeBytes + sc.baseBytes + int64(len(sc.accepted))*8
}

// reevalMax: a copy re-checks at most this many of its template's
// context-dependent tokens; with more, it is scanned on its own
const reevalMax = 8192

// position computes the token sets of a reachable terminal position. A
// position in a copy of a template rule (see specialize) takes the
// template's sets, which hold in any context, and re-checks only the
// template's context-dependent tokens in its own context.
func (sc *scanner) position(pos int32) (*tokenSet, error) {
	p := sc.g.prog
	r := p.ruleOf[pos]
	o := p.origin[r]
	if o < 0 {
		return sc.scan(pos)
	}
	alts := p.ruleAlts[r]
	a := len(alts) - 1
	for a > 0 && alts[a] > pos {
		a--
	}
	if len(p.ruleAlts[o]) != len(alts) {
		return sc.scan(pos) // cannot happen: a copy has its template's shape
	}
	p0 := p.ruleAlts[o][a] + (pos - alts[a])
	base, ok := sc.base[p0]
	if !ok {
		var err error
		if base, err = sc.scan(p0); err != nil {
			return nil, err
		}
		sc.base[p0] = base
		sc.baseBytes += tokenSetBytes(base)
	}
	if len(base.uncertain) == 0 {
		return base, nil
	}
	if len(base.uncertain) > reevalMax {
		return sc.scan(pos)
	}
	return sc.reeval(pos, base)
}

// reeval classifies base's uncertain tokens from pos, sharing the steps of
// common prefixes, and returns base's sets with those that are accepted
// here added.
func (sc *scanner) reeval(pos int32, base *tokenSet) (*tokenSet, error) {
	v := sc.g.vocab
	d := sc.d
	s0 := d.intern([]int32{d.a.node(pos, 0)}, 0)
	sc.st = append(sc.st[:0], s0)
	sc.ex = append(sc.ex[:0], false)
	var acc, unc []int32
	var prev []byte
	valid := 0 // sc.st[0..valid] are the states after prev's first bytes
	for _, id := range base.uncertain {
		t := v.tokens[id]
		l := 0
		for l < len(t) && l < len(prev) && t[l] == prev[l] {
			l++
		}
		prev = t
		k := min(valid, l)
		for k < len(t) && d.flags[sc.st[k]]&flagDead == 0 {
			s, err := d.step(sc.st[k], t[k])
			if err != nil {
				return nil, err
			}
			sc.st = append(sc.st[:k+1], s)
			sc.ex = append(sc.ex[:k+1], sc.ex[k] || d.flags[s]&flagExit != 0)
			k++
		}
		valid = k
		f := d.flags[sc.st[k]]
		switch {
		case k == len(t) && (f&flagDead == 0 || f&(flagExit|flagEnded) != 0):
			acc = append(acc, id)
		case sc.ex[k]:
			unc = append(unc, id)
		}
	}
	ts := &tokenSet{mode: base.mode, uncertain: unc}
	switch base.mode {
	case setAccept:
		ts.ids = append(slices.Clone(base.ids), acc...)
	case setBits:
		ts.bits = slices.Clone(base.bits)
		for _, id := range acc {
			ts.bits[id>>6] |= 1 << (id & 63)
		}
	case setReject:
		clear(sc.accepted)
		for _, id := range acc {
			sc.accepted[id>>6] |= 1 << (id & 63)
		}
		ts.ids = make([]int32, 0, len(base.ids))
		for _, id := range base.ids {
			if sc.accepted[id>>6]&(1<<(id&63)) == 0 {
				ts.ids = append(ts.ids, id)
			}
		}
	}
	return ts, nil
}

// skipMin: a subtree this large is checked for a self-loop before walking it
const skipMin = 16

// scan walks the vocabulary trie from the stack [pos] and sorts every
// token into accepted (consumed within the known context), rejected, or
// uncertain (it leaves the rule for a caller only known at run time).
func (sc *scanner) scan(pos int32) (*tokenSet, error) {
	v := sc.g.vocab
	d := sc.d
	s0 := d.intern([]int32{d.a.node(pos, 0)}, 0)
	sc.st = append(sc.st[:0], s0)
	sc.ex = append(sc.ex[:0], false)
	sc.acc, sc.unc = sc.acc[:0], sc.unc[:0]
	nodes := v.nodes
	for i := 0; i < len(nodes); {
		nd := &nodes[i]
		dep := int(nd.depth)
		if dep >= len(sc.st) {
			sc.st = append(sc.st, make([]int32, dep+1-len(sc.st))...)
			sc.ex = append(sc.ex, make([]bool, dep+1-len(sc.ex))...)
		}
		prev := sc.st[dep-1]
		s := d.trans[int(prev)<<8|int(nd.b)]
		if s < 0 {
			var err error
			if s, err = d.step(prev, nd.b); err != nil {
				return nil, err
			}
		}
		if s == prev && nd.end-int32(i) >= skipMin {
			// every byte below may loop back here: all accepted
			lc, err := d.loopClasses(s)
			if err != nil {
				return nil, err
			}
			if v.sum[i]&^lc == 0 {
				sc.acc = append(sc.acc, v.subtreeTokens(i)...)
				i = int(nd.end)
				continue
			}
		}
		f := d.flags[s]
		exitHere := f&flagExit != 0
		exitPath := sc.ex[dep-1] || exitHere
		if f&flagDead != 0 {
			// nothing continues inside the known context
			if exitPath {
				// tokens ending here are accepted if a path left the
				// context exactly here; all longer ones are uncertain
				if nd.tokN > 0 {
					ids := v.ids[nd.tokStart : nd.tokStart+nd.tokN]
					if exitHere || f&flagEnded != 0 {
						sc.acc = append(sc.acc, ids...)
					} else {
						sc.unc = append(sc.unc, ids...)
					}
				}
				sc.unc = append(sc.unc, v.subtreeTokens(i)[nd.tokN:]...)
			} else if nd.tokN > 0 && f&flagEnded != 0 {
				sc.acc = append(sc.acc, v.ids[nd.tokStart:nd.tokStart+nd.tokN]...)
			}
			i = int(nd.end)
			continue
		}
		sc.st[dep] = s
		sc.ex[dep] = exitPath
		if nd.tokN > 0 {
			sc.acc = append(sc.acc, v.ids[nd.tokStart:nd.tokStart+nd.tokN]...)
		}
		i++
	}
	ts := &tokenSet{uncertain: slices.Clone(sc.unc)}
	usable := 0
	for _, w := range v.usable {
		usable += popcount(w)
	}
	nAcc := len(sc.acc)
	switch limit := v.words * 2; {
	case nAcc <= limit:
		ts.mode = setAccept
		ts.ids = slices.Clone(sc.acc)
	case usable-nAcc <= limit:
		ts.mode = setReject
		clear(sc.accepted)
		for _, id := range sc.acc {
			sc.accepted[id>>6] |= 1 << (id & 63)
		}
		ts.ids = make([]int32, 0, usable-nAcc)
		for w, bitsw := range v.usable {
			rej := bitsw &^ sc.accepted[w]
			for rej != 0 {
				b := trailingZeros(rej)
				ts.ids = append(ts.ids, int32(w*64+b))
				rej &= rej - 1
			}
		}
	default:
		ts.mode = setBits
		ts.bits = make([]uint64, v.words)
		for _, id := range sc.acc {
			ts.bits[id>>6] |= 1 << (id & 63)
		}
	}
	return ts, nil
}
