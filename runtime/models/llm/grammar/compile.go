package grammar

import (
	"context"
	"encoding/binary"
	"slices"
	"unsafe"
)

// Grammar is a grammar compiled for one vocabulary: the byte program and,
// for every terminal position, the tokens accepted or rejected whatever the
// parse stack below it holds (xgrammar's adaptive token mask cache), plus
// the few context-dependent tokens that Mask checks against the real
// stacks. Immutable and safe for concurrent use; make a Matcher per
// sequence.
type Grammar struct {
	vocab *Vocab
	prog  *program
	lim   Limits
	cache []*tokenSet // by position; nil for non-terminals
	size  int64
	stats CompileStats
}

// CompileStats describe a compilation.
type CompileStats struct {
	Rules, Elements, Terminals int
	States                     int // compile-time DFA states
	Uncertain                  int // context-dependent (position, token) pairs
}

const (
	setAccept uint8 = iota // ids are the accepted tokens
	setReject              // ids are the usable tokens not accepted
	setBits                // bits is the accepted bitset
)

type tokenSet struct {
	mode      uint8
	ids       []int32
	bits      []uint64
	uncertain []int32 // context-dependent tokens in trie (byte) order
}

// dfa memoizes steps of the static arena: a state is a set of stacks plus
// whether a path just completed the grammar or left the known context.
type dfa struct {
	a      *arena
	states []dstate
	trans  []*[256]int32
	index  map[string]int32
	key    []byte
	buf    []int32
	max    int
}

type dstate struct {
	nodes []int32
	flags uint8 // 1: ended, 2: exit
}

func newDFA(a *arena, max int) *dfa {
	d := &dfa{a: a, index: map[string]int32{}, max: max}
	d.intern(nil, 0) // state 0: dead
	return d
}

func (d *dfa) intern(nodes []int32, flags uint8) int32 {
	slices.Sort(nodes)
	d.key = append(d.key[:0], flags)
	for _, n := range nodes {
		d.key = binary.LittleEndian.AppendUint32(d.key, uint32(n))
	}
	if id, ok := d.index[unsafe.String(unsafe.SliceData(d.key), len(d.key))]; ok {
		return id
	}
	id := int32(len(d.states))
	d.states = append(d.states, dstate{nodes: slices.Clone(nodes), flags: flags})
	d.trans = append(d.trans, nil)
	d.index[string(d.key)] = id
	return id
}

func (d *dfa) step(s int32, b byte) (int32, error) {
	t := d.trans[s]
	if t == nil {
		t = new([256]int32)
		for i := range t {
			t[i] = -1
		}
		d.trans[s] = t
	}
	if r := t[b]; r >= 0 {
		return r, nil
	}
	if len(d.states) >= d.max {
		return 0, tooLargef("grammar needs more than %d compile states", d.max)
	}
	d.buf = d.a.step(d.states[s].nodes, b, d.buf[:0])
	var f uint8
	if d.a.ended {
		f |= 1
	}
	if d.a.exit {
		f |= 2
	}
	r := d.intern(d.buf, f)
	t[b] = r
	return r, nil
}

// Compile parses src as kind and compiles it for v. Use a Cache to compile
// each (vocabulary, source) once.
func Compile(ctx context.Context, v *Vocab, kind Kind, src string, lim Limits) (*Grammar, error) {
	lim = lim.withDefaults()
	gbnf, err := ToGBNF(kind, src, lim)
	if err != nil {
		return nil, err
	}
	return compileGBNF(ctx, v, gbnf, lim)
}

func compileGBNF(ctx context.Context, v *Vocab, gbnf string, lim Limits) (*Grammar, error) {
	ir, err := parseGBNF(gbnf, lim)
	if err != nil {
		return nil, err
	}
	if err := checkIR(ir); err != nil {
		return nil, err
	}
	specialize(ir, lim)
	prog, err := lower(ir, lim)
	if err != nil {
		return nil, err
	}
	g := &Grammar{vocab: v, prog: prog, lim: lim, cache: make([]*tokenSet, len(prog.elems))}
	g.stats.Rules, g.stats.Elements = len(prog.ruleAlts), len(prog.elems)
	a := newArena(prog, true, lim)
	d := newDFA(a, lim.MaxStates)
	sc := &scanner{g: g, d: d, accepted: make([]uint64, v.words)}
	for pos, e := range prog.elems {
		if e.kind != eTerm || !prog.reach[prog.ruleOf[pos]] {
			continue
		}
		if pos%16 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		ts, err := sc.scan(int32(pos))
		if err != nil {
			return nil, err
		}
		g.cache[pos] = ts
		g.stats.Terminals++
		g.stats.Uncertain += len(ts.uncertain)
		g.size += int64(len(ts.ids)+len(ts.uncertain))*4 + int64(len(ts.bits))*8 + 64
	}
	g.stats.States = len(d.states)
	g.size += int64(len(prog.elems))*12 + int64(len(prog.sets))*32 + int64(len(prog.ruleAlts))*48
	return g, nil
}

type scanner struct {
	g         *Grammar
	d         *dfa
	st        []int32
	ex        []bool
	acc, unc  []int32
	accepted  []uint64
}

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
		var s int32
		if t := d.trans[prev]; t != nil && t[nd.b] >= 0 {
			s = t[nd.b]
		} else {
			var err error
			if s, err = d.step(prev, nd.b); err != nil {
				return nil, err
			}
		}
		ds := &d.states[s]
		exitHere := ds.flags&2 != 0
		exitPath := sc.ex[dep-1] || exitHere
		if len(ds.nodes) == 0 {
			// nothing continues inside the known context
			if exitPath {
				// tokens ending here are accepted if a path left the
				// context exactly here; all longer ones are uncertain
				if nd.tokN > 0 {
					ids := v.ids[nd.tokStart : nd.tokStart+nd.tokN]
					if exitHere || ds.flags&1 != 0 {
						sc.acc = append(sc.acc, ids...)
					} else {
						sc.unc = append(sc.unc, ids...)
					}
				}
				for j := i + 1; j < int(nd.end); j++ {
					if n := &nodes[j]; n.tokN > 0 {
						sc.unc = append(sc.unc, v.ids[n.tokStart:n.tokStart+n.tokN]...)
					}
				}
			} else if nd.tokN > 0 && ds.flags&1 != 0 {
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

// Stats describe the compilation.
func (g *Grammar) Stats() CompileStats { return g.stats }

// SizeBytes approximates the memory the compiled grammar holds.
func (g *Grammar) SizeBytes() int64 { return g.size }

// Vocab is the vocabulary the grammar was compiled for.
func (g *Grammar) Vocab() *Vocab { return g.vocab }
