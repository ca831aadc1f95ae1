package grammar

import "slices"

// specialize copies small shared rules at each place they are used, so that
// most rules are entered from one place only and the mask precomputation
// knows what follows them (a token such as `",` that finishes a string and
// goes on is then decided at compile time instead of checked per step).
// Only rules whose reachable closure is small are copied, within a budget.
func specialize(g *irGrammar, lim Limits) {
	const maxClosure = 384 // syms reachable from a rule that may be copied
	budget := min(lim.MaxElements/4, 4*g.nsyms+8192)
	n := len(g.rules)
	reach := make([]bool, n)
	reach[g.root] = true
	work := []int32{g.root}
	for len(work) > 0 {
		r := work[len(work)-1]
		work = work[:len(work)-1]
		for _, a := range g.rules[r].alts {
			for _, s := range a {
				if s.ref >= 0 && !reach[s.ref] {
					reach[s.ref] = true
					work = append(work, s.ref)
				}
			}
		}
	}
	scc := tarjan(g)
	refs := make([]int, n)
	for q := range n {
		if !reach[q] {
			continue
		}
		for _, a := range g.rules[q].alts {
			for _, s := range a {
				if s.ref >= 0 && scc[s.ref] != scc[q] {
					refs[s.ref]++
				}
			}
		}
	}
	// size of the tree of copies clone(r) makes (a rule reached again
	// on the current path is not copied again), or more than maxClosure
	onPath := map[int32]bool{}
	var treeSize func(r int32, budget int) int
	treeSize = func(r int32, budget int) int {
		onPath[r] = true
		defer delete(onPath, r)
		size := 0
		for _, a := range g.rules[r].alts {
			size += len(a) + 1
			for _, s := range a {
				if size > budget {
					return size
				}
				if s.ref >= 0 && !onPath[s.ref] {
					size += treeSize(s.ref, budget-size)
				}
			}
		}
		return size
	}
	// clone copies r and every rule below it, each place a rule is used
	// getting its own copy; a rule reached again on the current path (a
	// cycle) refers back to its copy
	var clone func(r int32, path map[int32]int32) int32
	clone = func(r int32, path map[int32]int32) int32 {
		if c, ok := path[r]; ok {
			return c
		}
		c := int32(len(g.rules))
		path[r] = c
		origin := g.rules[r].origin
		if origin < 0 {
			origin = r
		}
		g.rules = append(g.rules, irRule{name: g.rules[r].name, defined: true, origin: origin})
		alts := make([][]irSym, len(g.rules[r].alts))
		for i, a := range g.rules[r].alts {
			na := slices.Clone(a)
			for j, s := range na {
				if s.ref >= 0 {
					na[j].ref = clone(s.ref, path)
				}
			}
			alts[i] = na
		}
		g.rules[c].alts = alts
		delete(path, r)
		return c
	}
	// a rule is copied at all of its uses or at none, so that the
	// original, used nowhere, is a template whose precomputed masks every
	// copy shares (see Compile)
	copyAll := make([]bool, n)
	for r := range n {
		if !reach[r] || refs[r] < 2 {
			continue
		}
		size := treeSize(int32(r), maxClosure)
		if size > maxClosure || size*refs[r] > budget || len(g.rules)+size*refs[r] > lim.MaxRules {
			continue
		}
		budget -= size * refs[r]
		copyAll[r] = true
	}
	for q := range n { // the original rules only: copies are specialized already
		if !reach[q] {
			continue
		}
		for _, a := range g.rules[q].alts {
			for j, s := range a {
				if s.ref < 0 || scc[s.ref] == scc[q] || !copyAll[s.ref] {
					continue
				}
				before := len(g.rules)
				a[j].ref = clone(s.ref, map[int32]int32{})
				for _, r := range g.rules[before:] {
					for _, x := range r.alts {
						g.nsyms += len(x) + 1
					}
				}
				if len(g.rules) > lim.MaxRules {
					return
				}
			}
		}
	}
}

// tarjan returns the strongly connected component of each rule in the
// reference graph.
func tarjan(g *irGrammar) []int32 {
	n := len(g.rules)
	index := make([]int32, n)
	low := make([]int32, n)
	comp := make([]int32, n)
	on := make([]bool, n)
	for i := range index {
		index[i] = -1
	}
	var stack []int32
	next, ncomp := int32(0), int32(0)
	var visit func(v int32)
	visit = func(v int32) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		on[v] = true
		for _, a := range g.rules[v].alts {
			for _, s := range a {
				w := s.ref
				if w < 0 {
					continue
				}
				if index[w] < 0 {
					visit(w)
					low[v] = min(low[v], low[w])
				} else if on[w] {
					low[v] = min(low[v], index[w])
				}
			}
		}
		if low[v] == index[v] {
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[w] = false
				comp[w] = ncomp
				if w == v {
					break
				}
			}
			ncomp++
		}
	}
	for v := range n {
		if index[v] < 0 {
			visit(int32(v))
		}
	}
	return comp
}
