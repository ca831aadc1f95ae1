package grammar

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// A program is a grammar over bytes, flattened like llama.cpp's: each
// alternative of each rule is a run of elements ending with eEnd; a
// position is an index into elems.
type program struct {
	elems    []elem
	ruleAlts [][]int32 // start positions of each rule's alternatives
	ruleOf   []int32   // rule of each position
	names    []string
	sets     []byteSet // byte sets of terminals
	root     int32
	ret      []int32 // static return position per rule (retEnd, retMulti, retNone or a position)
	minFrom  []int32 // fewest bytes that complete the alternative from each position
	reach    []bool  // rule reachable from root
	origin   []int32 // the template rule a rule is a copy of, or -1 (see specialize)
}

const (
	eTerm uint8 = iota // arg: index into sets
	eRef               // arg: rule
	eEnd
)

type elem struct {
	kind uint8
	arg  int32
}

const (
	retNone  = -1
	retEnd   = -2
	retMulti = -3
)

type byteSet [4]uint64

func (s *byteSet) has(b byte) bool { return s[b>>6]&(1<<(b&63)) != 0 }

func (s *byteSet) addRange(lo, hi byte) {
	for c := int(lo); c <= int(hi); c++ {
		s[c>>6] |= 1 << (c & 63)
	}
}

// checkIR refuses left recursion and removes alternatives that can never
// complete (they reference a rule that derives no finite string).
func checkIR(g *irGrammar) error {
	n := len(g.rules)
	productive := make([]bool, n)
	for changed := true; changed; {
		changed = false
		for i, r := range g.rules {
			if productive[i] {
				continue
			}
			for _, a := range r.alts {
				ok := true
				for _, s := range a {
					if s.ref >= 0 && !productive[s.ref] {
						ok = false
						break
					}
				}
				if ok {
					productive[i], changed = true, true
					break
				}
			}
		}
	}
	if !productive[g.root] {
		return invalidf("rule root derives no finite string")
	}
	for i := range g.rules {
		alts := g.rules[i].alts[:0]
		for _, a := range g.rules[i].alts {
			ok := true
			for _, s := range a {
				if s.ref >= 0 && !productive[s.ref] {
					ok = false
				}
			}
			if ok {
				alts = append(alts, a)
			}
		}
		g.rules[i].alts = alts
	}
	nullable := make([]bool, n)
	for changed := true; changed; {
		changed = false
		for i, r := range g.rules {
			if nullable[i] {
				continue
			}
			for _, a := range r.alts {
				ok := true
				for _, s := range a {
					if s.ref < 0 || !nullable[s.ref] {
						ok = false
						break
					}
				}
				if ok {
					nullable[i], changed = true, true
					break
				}
			}
		}
	}
	// left corners: r -> x when x can start r; a cycle is left recursion
	// (which would grow parse stacks without consuming input)
	corners := make([][]int32, n)
	for i, r := range g.rules {
		for _, a := range r.alts {
			for _, s := range a {
				if s.ref < 0 {
					break
				}
				corners[i] = append(corners[i], s.ref)
				if !nullable[s.ref] {
					break
				}
			}
		}
	}
	color := make([]uint8, n)
	type frame struct{ r, i int32 }
	for start := range n {
		if color[start] != 0 {
			continue
		}
		stack := []frame{{int32(start), 0}}
		color[start] = 1
		for len(stack) > 0 {
			f := &stack[len(stack)-1]
			if int(f.i) >= len(corners[f.r]) {
				color[f.r] = 2
				stack = stack[:len(stack)-1]
				continue
			}
			x := corners[f.r][f.i]
			f.i++
			switch color[x] {
			case 1:
				return invalidf("rule %s is left-recursive (through %s); rewrite it with repetition", userName(g.rules[x].name), userName(g.rules[f.r].name))
			case 0:
				color[x] = 1
				stack = append(stack, frame{x, 0})
			}
		}
	}
	return nil
}

func userName(n string) string {
	if strings.Contains(n, "~") {
		return "(a group or repetition)"
	}
	return n
}

// lower turns the code-point grammar into a byte program: a class of ASCII
// characters is one terminal; a class with other characters becomes a rule
// whose alternatives are the UTF-8 byte sequences of its ranges.
func lower(g *irGrammar, lim Limits) (*program, error) {
	p := &program{root: g.root}
	setIdx := map[byteSet]int32{}
	term := func(s byteSet) elem {
		i, ok := setIdx[s]
		if !ok {
			i = int32(len(p.sets))
			p.sets = append(p.sets, s)
			setIdx[s] = i
		}
		return elem{eTerm, i}
	}
	// rule bodies as element lists first, then flattened
	type ruleBody struct {
		name    string
		alts    [][]elem
		origin  int32
		classes []int32 // the class rules made for this rule's classes, in order
	}
	bodies := make([]ruleBody, len(g.rules))
	for i, r := range g.rules {
		bodies[i].name = r.name
		bodies[i].origin = r.origin
		for _, a := range r.alts {
			var out []elem
			for _, s := range a {
				if s.ref >= 0 {
					out = append(out, elem{eRef, s.ref})
					continue
				}
				if s.cls[len(s.cls)-1].hi < utf8.RuneSelf {
					var set byteSet
					for _, rg := range s.cls {
						set.addRange(byte(rg.lo), byte(rg.hi))
					}
					out = append(out, term(set))
					continue
				}
				// a rule per use, not shared, so that its return position
				// stays known (see specialize)
				id := int32(len(bodies))
				classOrigin := int32(-1)
				if o := r.origin; o >= 0 && len(bodies[o].classes) > len(bodies[i].classes) {
					classOrigin = bodies[o].classes[len(bodies[i].classes)]
				}
				bodies[i].classes = append(bodies[i].classes, id)
				{
					var ascii byteSet
					hasASCII := false
					var alts [][]elem
					for _, seq := range utf8Sequences(s.cls) {
						if len(seq) == 1 {
							ascii.addRange(seq[0][0], seq[0][1])
							hasASCII = true
							continue
						}
						var alt []elem
						for _, br := range seq {
							var set byteSet
							set.addRange(br[0], br[1])
							alt = append(alt, term(set))
						}
						alts = append(alts, alt)
					}
					if hasASCII {
						alts = append([][]elem{{term(ascii)}}, alts...)
					}
					bodies = append(bodies, ruleBody{name: "class~", alts: alts, origin: classOrigin})
				}
				out = append(out, elem{eRef, id})
			}
			bodies[i].alts = append(bodies[i].alts, out)
		}
	}
	if len(bodies) > lim.MaxRules {
		return nil, tooLargef("more than %d rules", lim.MaxRules)
	}
	p.ruleAlts = make([][]int32, len(bodies))
	p.names = make([]string, len(bodies))
	p.origin = make([]int32, len(bodies))
	for i, b := range bodies {
		p.names[i] = b.name
		p.origin[i] = b.origin
		for _, a := range b.alts {
			p.ruleAlts[i] = append(p.ruleAlts[i], int32(len(p.elems)))
			for _, e := range a {
				p.elems = append(p.elems, e)
				p.ruleOf = append(p.ruleOf, int32(i))
			}
			p.elems = append(p.elems, elem{kind: eEnd})
			p.ruleOf = append(p.ruleOf, int32(i))
		}
		if len(p.elems) > lim.MaxElements {
			return nil, tooLargef("more than %d grammar elements", lim.MaxElements)
		}
	}
	p.analyze()
	return p, nil
}

func (p *program) analyze() {
	n := len(p.ruleAlts)
	// reachability
	p.reach = make([]bool, n)
	p.reach[p.root] = true
	work := []int32{p.root}
	for len(work) > 0 {
		r := work[len(work)-1]
		work = work[:len(work)-1]
		for _, s := range p.ruleAlts[r] {
			for pos := s; p.elems[pos].kind != eEnd; pos++ {
				if e := p.elems[pos]; e.kind == eRef && !p.reach[e.arg] {
					p.reach[e.arg] = true
					work = append(work, e.arg)
				}
			}
		}
	}
	// static return positions: where control goes when a rule completes,
	// when that is the same for every way of entering the rule
	p.ret = make([]int32, n)
	for i := range p.ret {
		p.ret[i] = retNone
	}
	join := func(r int32, v int32) bool {
		old := p.ret[r]
		switch {
		case v == retNone || old == v || old == retMulti:
			return false
		case old == retNone:
			p.ret[r] = v
		default:
			p.ret[r] = retMulti
		}
		return true
	}
	// templates (rules others are copies of) get return positions too:
	// their own rules' precomputed masks are shared by the copies
	live := slices.Clone(p.reach)
	for _, o := range p.origin {
		if o >= 0 {
			live[o] = true
		}
	}
	p.ret[p.root] = retEnd
	for changed := true; changed; {
		changed = false
		for r := range n {
			if !live[r] {
				continue
			}
			for _, s := range p.ruleAlts[r] {
				for pos := s; p.elems[pos].kind != eEnd; pos++ {
					e := p.elems[pos]
					if e.kind != eRef {
						continue
					}
					v := pos + 1
					if p.elems[pos+1].kind == eEnd {
						v = p.ret[r] // a tail call returns where r returns
					}
					if join(e.arg, v) {
						changed = true
					}
				}
			}
		}
	}
	// fewest bytes to complete from each position
	const inf = int32(1 << 30)
	minRule := make([]int32, n)
	for i := range minRule {
		minRule[i] = inf
	}
	p.minFrom = make([]int32, len(p.elems))
	for changed := true; changed; {
		changed = false
		for r := range n {
			for _, s := range p.ruleAlts[r] {
				end := s
				for p.elems[end].kind != eEnd {
					end++
				}
				acc := int32(0)
				p.minFrom[end] = 0
				for pos := end - 1; pos >= s; pos-- {
					c := int32(1)
					if e := p.elems[pos]; e.kind == eRef {
						c = minRule[e.arg]
					}
					acc = int32(min(int64(inf), int64(acc)+int64(c)))
					p.minFrom[pos] = acc
				}
				if acc < minRule[r] {
					minRule[r] = acc
					changed = true
				}
			}
		}
	}
}

// utf8Sequences splits code point ranges into runs of UTF-8 byte ranges
// (each run matches the encodings of one sub-range), skipping surrogates.
func utf8Sequences(rs []cpRange) [][][2]byte {
	var out [][][2]byte
	var split func(lo, hi rune)
	split = func(lo, hi rune) {
		if lo > hi {
			return
		}
		if lo <= 0xDFFF && hi >= 0xD800 { // surrogates are not characters
			split(lo, min(hi, 0xD7FF))
			split(max(lo, 0xE000), hi)
			return
		}
		for _, b := range []rune{0x7F, 0x7FF, 0xFFFF} {
			if lo <= b && hi > b {
				split(lo, b)
				split(b+1, hi)
				return
			}
		}
		if hi < utf8.RuneSelf {
			out = append(out, [][2]byte{{byte(lo), byte(hi)}})
			return
		}
		n := utf8.RuneLen(lo)
		for i := 1; i < n; i++ {
			m := rune(1)<<(6*i) - 1
			if lo&^m != hi&^m {
				if lo&m != 0 {
					split(lo, lo|m)
					split((lo|m)+1, hi)
					return
				}
				if hi&m != m {
					split(lo, (hi&^m)-1)
					split(hi&^m, hi)
					return
				}
			}
		}
		var a, b [4]byte
		utf8.EncodeRune(a[:], lo)
		utf8.EncodeRune(b[:], hi)
		seq := make([][2]byte, n)
		for i := range n {
			seq[i] = [2]byte{a[i], b[i]}
		}
		out = append(out, seq)
	}
	for _, r := range rs {
		split(r.lo, r.hi)
	}
	return out
}
