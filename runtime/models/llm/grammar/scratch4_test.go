package grammar

import (
	"context"
	"testing"
	"time"
	"sort"
)

func TestScratch4(t *testing.T) {
	v := getBigVocab(t)
	gb, _ := SchemaToGBNF([]byte(toolSchema), Limits{})
	t.Log(gb)
	g, err := Compile(context.Background(), v, KindJSONSchema, toolSchema, Limits{})
	if err != nil { t.Fatal(err) }
	// time each position's scan again
	a := newArena(g.prog, true, g.lim)
	d := newDFA(a, 1<<20)
	sc := &scanner{g: g, d: d, accepted: make([]uint64, v.words)}
	type pt struct{ pos int; d time.Duration }
	var l []pt
	var total time.Duration
	for pos, e := range g.prog.elems {
		if e.kind != eTerm || !g.prog.reach[g.prog.ruleOf[pos]] { continue }
		t0 := time.Now()
		sc.scan(int32(pos))
		l = append(l, pt{pos, time.Since(t0)})
		total += time.Since(t0)
	}
	sort.Slice(l, func(i, j int) bool { return l[i].d > l[j].d })
	t.Logf("total %v n %d", total, len(l))
	var top time.Duration
	for i, x := range l[:40] {
		top += x.d
		if i < 15 { t.Logf("pos %d rule %s set %x d %v", x.pos, g.prog.names[g.prog.ruleOf[x.pos]], g.prog.sets[g.prog.elems[x.pos].arg], x.d) }
	}
	t.Logf("top40 %v", top)
}
