package grammar

// Parse stacks are persistent linked lists of positions, hash-consed in an
// arena so that equal stacks are one node and a set of stacks is a set of
// node ids (as in xgrammar's persistent stack tree). The top of every stack
// in a set is a terminal; node 0 is the empty stack (the grammar has ended).

type snode struct {
	pos    int32
	parent int32 // 0: bottom of the stack
	depth  int32
}

type arena struct {
	prog     *program
	static   bool // compile-time: a bottom rule returns to its static return position
	maxDepth int32
	maxWork  int
	nodes    []snode
	index    map[uint64]int32
	seen     []uint32
	gen      uint32

	// results of the last step
	ended    bool // (static) some path completed the grammar
	exit     bool // (static) some path left the precomputed context
	overflow bool // some path was cut at maxDepth or maxWork
	work     int  // nodes visited by the last step
	total    int  // nodes visited by all steps
}

func newArena(p *program, static bool, lim Limits) *arena {
	a := &arena{prog: p, static: static, maxDepth: int32(lim.MaxStackDepth), maxWork: lim.MaxStepWork,
		index: make(map[uint64]int32, 1024)}
	a.nodes = append(a.nodes, snode{pos: -1})
	return a
}

func (a *arena) node(pos, parent int32) int32 {
	k := uint64(uint32(pos))<<32 | uint64(uint32(parent))
	if id, ok := a.index[k]; ok {
		return id
	}
	d := a.nodes[parent].depth + 1
	if d > a.maxDepth {
		a.overflow = true
		return -1
	}
	id := int32(len(a.nodes))
	a.nodes = append(a.nodes, snode{pos: pos, parent: parent, depth: d})
	a.index[k] = id
	return id
}

func (a *arena) begin() {
	a.gen++
	if a.gen == 0 {
		clear(a.seen)
		a.gen = 1
	}
	a.ended, a.exit, a.overflow, a.work = false, false, false, 0
}

// closure expands node n until every stack's top is a terminal, appending
// those to out; each node is expanded once per step.
func (a *arena) closure(n int32, out []int32) []int32 {
	if int(n) >= len(a.seen) {
		a.seen = append(a.seen, make([]uint32, int(n)+1-len(a.seen)+len(a.seen)/2)...)
	}
	if a.seen[n] == a.gen {
		return out
	}
	a.seen[n] = a.gen
	a.work++
	a.total++
	if a.work > a.maxWork {
		a.overflow = true
		return out
	}
	if n == 0 {
		return append(out, 0)
	}
	nd := a.nodes[n]
	el := a.prog.elems
	switch e := el[nd.pos]; e.kind {
	case eTerm:
		return append(out, n)
	case eRef:
		parent := nd.parent
		if el[nd.pos+1].kind != eEnd { // not a tail call: remember where to return
			if parent = a.node(nd.pos+1, nd.parent); parent < 0 {
				return out
			}
		}
		for _, s := range a.prog.ruleAlts[e.arg] {
			if c := a.node(s, parent); c >= 0 {
				out = a.closure(c, out)
			}
		}
	default: // end of an alternative: pop
		if nd.parent != 0 {
			return a.closure(nd.parent, out)
		}
		if !a.static {
			return a.closure(0, out)
		}
		switch r := a.prog.ret[a.prog.ruleOf[nd.pos]]; r {
		case retEnd:
			a.ended = true
		case retMulti, retNone:
			a.exit = true
		default:
			if c := a.node(r, 0); c >= 0 {
				out = a.closure(c, out)
			}
		}
	}
	return out
}

// step advances every stack of set over byte b.
func (a *arena) step(set []int32, b byte, out []int32) []int32 {
	a.begin()
	el := a.prog.elems
	for _, n := range set {
		if n == 0 {
			continue
		}
		nd := a.nodes[n]
		if a.prog.sets[el[nd.pos].arg].has(b) {
			if c := a.node(nd.pos+1, nd.parent); c >= 0 {
				out = a.closure(c, out)
			}
		}
	}
	return out
}

// start is the closure of the root rule's alternatives.
func (a *arena) start(out []int32) []int32 {
	a.begin()
	for _, s := range a.prog.ruleAlts[a.prog.root] {
		if c := a.node(s, 0); c >= 0 {
			out = a.closure(c, out)
		}
	}
	return out
}

// remaining is the fewest bytes that complete the stack n.
func (a *arena) remaining(n int32) int {
	t := 0
	for ; n != 0; n = a.nodes[n].parent {
		t += int(a.prog.minFrom[a.nodes[n].pos])
	}
	return t
}
