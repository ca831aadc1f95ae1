package grammar

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
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
	cache []atomic.Pointer[tokenSet] // by terminal position
	size  atomic.Int64
	stats CompileStats

	// positions left by Compile are computed on first use, under mu
	mu      sync.Mutex
	sc      *scanner // nil once every position is computed
	scBytes int64    // sc.bytes() as counted in size
	left    int
	counted map[*tokenSet]bool
}

// CompileStats describe a compilation.
type CompileStats struct {
	Rules, Elements, Terminals int
	States                     int // compile-time DFA states
	Uncertain                  int // context-dependent (position, token) pairs
	Deferred                   int // terminal positions left for first use (Limits.Precompute)
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
	a       *arena
	states  [][]int32 // stack nodes of each state
	flags   []uint8   // per state: flagEnded, flagExit, flagDead
	trans   []int32   // state<<8 | byte → state, -1 unknown
	loop    []uint64  // per state: byte classes whose every byte steps back to it
	first   []byteSet // per state: bytes some stack can take (others go to state 0)
	loopOK  []bool
	index   map[string]int32
	key     []byte
	buf     []int32
	max     int
	maxWork int
	bytes   int64 // the states' memory (see intern)
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
	// the node list, its key and the index slot; 256 transitions; the
	// first bytes; flags
	d.bytes += 8*int64(len(nodes)) + 96 + 256*4 + 32 + 16
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
	if d.a.work > d.a.maxWork {
		return 0, tooLargef("grammar too ambiguous: more than %d parse-stack steps for one byte", d.a.maxWork)
	}
	if d.a.total > d.maxWork {
		return 0, tooLargef("precomputing the grammar's masks takes more than %d parse-stack steps", d.maxWork)
	}
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
	if err := ctx.Err(); err != nil {
		// the caller has gone: not even the source is read
		return nil, fmt.Errorf("compiling a %s constraint: %w", kind, err)
	}
	lim = lim.withDefaults()
	gbnf, err := ToGBNF(ctx, kind, src, lim)
	if err != nil {
		return nil, err
	}
	return compileGBNF(ctx, v, gbnf, lim)
}

func compileGBNF(ctx context.Context, v *Vocab, gbnf string, lim Limits) (*Grammar, error) {
	// Checked first as well: the loop below checks only every 16th terminal
	// it precomputes, and a slow host can pass lim.Precompute before one.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
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
	if err := ctx.Err(); err != nil {
		// checked before the precomputing, the costliest part
		return nil, fmt.Errorf("compiling a grammar: %w", err)
	}
	g := &Grammar{vocab: v, prog: prog, lim: lim, cache: make([]atomic.Pointer[tokenSet], len(prog.elems)),
		counted: map[*tokenSet]bool{}}
	g.stats.Rules, g.stats.Elements = len(prog.ruleAlts), len(prog.elems)
	a := newArena(prog, true, lim)
	d := newDFA(a, lim.MaxStates)
	d.maxWork = lim.MaxCompileWork
	g.sc = &scanner{g: g, d: d, accepted: make([]uint64, v.words), base: map[int32]*tokenSet{}}
	start := time.Now()
	for pos, e := range prog.elems {
		if e.kind != eTerm || !prog.reach[prog.ruleOf[pos]] {
			continue
		}
		g.stats.Terminals++
		if lim.Precompute >= 0 && time.Since(start) > lim.Precompute {
			g.left++
			continue
		}
		if pos%16 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		ts, err := g.sc.position(int32(pos))
		if err != nil {
			return nil, err
		}
		g.store(int32(pos), ts)
	}
	g.stats.Deferred = g.left
	g.stats.States = len(d.states)
	// per position its element, rule, distance to the end and token-set
	// pointer; per rule its alternatives, name, return, origin; the sets
	g.size.Add(int64(len(prog.elems))*24 + int64(len(prog.sets))*32 + int64(len(prog.ruleAlts))*96)
	if g.left == 0 {
		g.sc = nil
	} else {
		// the compile-time DFA stays for the positions left, and grows as
		// they are computed (entry)
		g.scBytes = g.sc.bytes()
		g.size.Add(g.scBytes)
	}
	return g, nil
}

func (g *Grammar) store(pos int32, ts *tokenSet) {
	g.cache[pos].Store(ts)
	g.stats.Uncertain += len(ts.uncertain)
	if !g.counted[ts] {
		g.counted[ts] = true
		g.size.Add(tokenSetBytes(ts) + 48) // and its slot in counted
	}
}

func tokenSetBytes(ts *tokenSet) int64 {
	return int64(len(ts.ids)+len(ts.uncertain))*4 + int64(len(ts.bits))*8 + 64
}

// entry returns the token sets of terminal position pos, computing them on
// first use if Compile left them.
func (g *Grammar) entry(pos int32) (*tokenSet, error) {
	if ts := g.cache[pos].Load(); ts != nil {
		return ts, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if ts := g.cache[pos].Load(); ts != nil {
		return ts, nil
	}
	ts, err := g.sc.position(pos)
	if err != nil {
		return nil, err
	}
	g.store(pos, ts)
	if g.left--; g.left == 0 {
		g.sc = nil
		g.counted = nil
		g.size.Add(-g.scBytes)
		g.scBytes = 0
	} else {
		b := g.sc.bytes()
		g.size.Add(b - g.scBytes)
		g.scBytes = b
	}
	return ts, nil
}

// Stats describe the compilation.
func (g *Grammar) Stats() CompileStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stats
}

// SizeBytes approximates the memory the compiled grammar holds.
func (g *Grammar) SizeBytes() int64 { return g.size.Load() }

// Vocab is the vocabulary the grammar was compiled for.
func (g *Grammar) Vocab() *Vocab { return g.vocab }
