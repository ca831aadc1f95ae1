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
	states [][]int32 // stack nodes of each state
	flags  []uint8   // per state: flagEnded, flagExit, flagDead
	trans  []int32   // state<<8 | byte → state, -1 unknown
	loop   []uint64  // per state: byte classes whose every byte steps back to it
	first  []byteSet // per state: bytes some stack can take (others go to state 0)
	loopOK []bool
	index  map[string]int32
	key    []byte
	buf    []int32
	max    int
}

const (
	flagEnded uint8 = 1 << iota
	flagExit
	flagDead // no stack left
)

func newDFA(a *arena, max int) *dfa {
	d := &dfa{a: a, index: map[string]int32{}, max: max}
	d.intern(nil, 0) // state 0: dead
	return d
}

func (d *dfa) intern(nodes []int32, flags uint8) int32 {
	slices.Sort(nodes)
	if len(nodes) == 0 {
		flags |= flagDead
	}
	d.key = append(d.key[:0], flags)
	for _, n := range nodes {
		d.key = binary.LittleEndian.AppendUint32(d.key, uint32(n))
	}
	if id, ok := d.index[unsafe.String(unsafe.SliceData(d.key), len(d.key))]; ok {
		return id
	}
	id := int32(len(d.states))
	d.states = append(d.states, slices.Clone(nodes))
	d.flags = append(d.flags, flags)
	d.loop = append(d.loop, 0)
	var first byteSet
	for _, n := range nodes {
		if n != 0 {
			set := &d.a.prog.sets[d.a.prog.elems[d.a.nodes[n].pos].arg]
			for w := range first {
				first[w] |= set[w]
			}
		}
	}
	d.first = append(d.first, first)
	d.loopOK = append(d.loopOK, false)
	for range 256 {
		d.trans = append(d.trans, -1)
	}
	d.index[string(d.key)] = id
	return id
}

func (d *dfa) step(s int32, b byte) (int32, error) {
	if r := d.trans[int(s)<<8|int(b)]; r >= 0 {
		return r, nil
	}
	if !d.first[s].has(b) {
		d.trans[int(s)<<8|int(b)] = 0
		return 0, nil
	}
	if len(d.states) >= d.max {
		return 0, tooLargef("grammar needs more than %d compile states", d.max)
	}
	d.buf = d.a.step(d.states[s], b, d.buf[:0])
	var f uint8
	if d.a.ended {
		f |= flagEnded
	}
	if d.a.exit {
		f |= flagExit
	}
	r := d.intern(d.buf, f)
	d.trans[int(s)<<8|int(b)] = r
	return r, nil
}

// loopClasses are the byte classes all of whose bytes step s back to s.
func (d *dfa) loopClasses(s int32) (uint64, error) {
	if d.loopOK[s] {
		return d.loop[s], nil
	}
	var m uint64
	for c, bs := range classBytes {
		if len(bs) == 0 {
			continue
		}
		ok := true
		for _, b := range bs {
			r, err := d.step(s, b)
			if err != nil {
				return 0, err
			}
			if r != s {
				ok = false
				break
			}
		}
		if ok {
			m |= 1 << c
		}
	}
	d.loop[s], d.loopOK[s] = m, true
	return m, nil
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
	g        *Grammar
	d        *dfa
	st       []int32
	ex       []bool
	acc, unc []int32
	accepted []uint64
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

// Stats describe the compilation.
func (g *Grammar) Stats() CompileStats { return g.stats }

// SizeBytes approximates the memory the compiled grammar holds.
func (g *Grammar) SizeBytes() int64 { return g.size }

// Vocab is the vocabulary the grammar was compiled for.
func (g *Grammar) Vocab() *Vocab { return g.vocab }
