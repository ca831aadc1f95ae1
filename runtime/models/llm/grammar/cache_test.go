package grammar

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"sync"
	"testing"
	"time"
)

func TestCacheHitsAndEviction(t *testing.T) {
	v := getByteVocab()
	g1, err := Compile(context.Background(), v, KindGBNF, `root ::= "a"`, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	one := g1.SizeBytes() + 64
	c := NewCache(3*one, Limits{})
	ctx := context.Background()
	get := func(i int) *Grammar {
		g, err := c.Get(ctx, v, KindGBNF, fmt.Sprintf(`root ::= "%c"`, 'a'+i))
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	a := get(0)
	if get(0) != a {
		t.Fatal("second Get compiled again")
	}
	get(1)
	get(2)
	get(0) // a is the most recent now
	get(3) // evicts 1, the least recently used
	if s := c.Stats(); s.Entries != 3 || s.Bytes > 3*one || s.Hits != 2 || s.Misses != 4 {
		t.Fatalf("stats %+v (one %d)", s, one)
	}
	if get(0) != a {
		t.Fatal("the most recently used entry was evicted")
	}
	before := c.Stats().Misses
	get(1)
	if c.Stats().Misses != before+1 {
		t.Fatal("the least recently used entry was not evicted")
	}
	// another vocabulary is another key
	v2, _ := NewVocab([][]byte{[]byte("a"), nil}, []int32{1})
	g2, err := c.Get(ctx, v2, KindGBNF, `root ::= "a"`)
	if err != nil || g2 == a || g2.Vocab() != v2 {
		t.Fatalf("vocabularies share an entry: %v", err)
	}
}

func TestCacheErrorsAndConcurrency(t *testing.T) {
	c := NewCache(1<<30, Limits{})
	v := getSmallVocab(t)
	ctx := context.Background()
	for range 2 {
		if _, err := c.Get(ctx, v, KindGBNF, `root ::= x`); !errors.Is(err, ErrInvalidGrammar) {
			t.Fatalf("got %v", err)
		}
	}
	if s := c.Stats(); s.Entries != 0 || s.Misses != 2 {
		t.Fatalf("an error was cached: %+v", s)
	}
	var wg sync.WaitGroup
	gs := make([]*Grammar, 8)
	for i := range gs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := c.Get(ctx, v, KindJSON, "")
			if err != nil {
				t.Error(err)
			}
			gs[i] = g
		}()
	}
	wg.Wait()
	for _, g := range gs {
		if g != gs[0] {
			t.Fatal("concurrent Gets compiled more than once")
		}
	}
	if s := c.Stats(); s.Misses != 3 {
		t.Fatalf("stats %+v", s)
	}
}

func TestSyntheticVocab(t *testing.T) {
	toks, eos := SyntheticVocab(qwenSize, 1)
	if len(toks) != qwenSize || len(eos) != 2 {
		t.Fatalf("%d tokens, eos %v", len(toks), eos)
	}
	seen := map[string]bool{}
	multi := 0
	for i, tk := range toks {
		if tk == nil {
			continue
		}
		if seen[string(tk)] {
			t.Fatalf("token %d %q twice", i, tk)
		}
		seen[string(tk)] = true
		if tk[0] >= 0x80 {
			multi++
		}
	}
	for b := range 256 {
		if !seen[string([]byte{byte(b)})] {
			t.Fatalf("byte %d missing", b)
		}
	}
	if multi < qwenSize/10 {
		t.Fatalf("only %d multi-byte tokens", multi)
	}
	a, _ := SyntheticVocab(5000, 3)
	b, _ := SyntheticVocab(5000, 3)
	for i := range a {
		if string(a[i]) != string(b[i]) {
			t.Fatal("not deterministic")
		}
	}
}

// computeAll computes every terminal position Compile deferred.
func computeAll(t *testing.T, g *Grammar) {
	t.Helper()
	for pos, e := range g.prog.elems {
		if e.kind == eTerm && g.prog.reach[g.prog.ruleOf[pos]] {
			if _, err := g.entry(int32(pos)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestSizeBytesTracksHeap: a compiled grammar's SizeBytes is close to
// what it holds on the heap, with positions left for first use (its
// compile-time DFA kept) and after they are all computed. It had counted
// a third of it, and nothing of what deferred positions added.
func TestSizeBytesTracksHeap(t *testing.T) {
	v := getBigVocab(t)
	heap := func() int64 {
		goruntime.GC()
		var ms goruntime.MemStats
		goruntime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	const n = 3
	gs := make([]*Grammar, n)
	base := heap()
	for i := range gs {
		var err error
		// Almost nothing precomputed: the DFA stays for first use.
		if gs[i], err = Compile(context.Background(), v, KindJSONSchema, toolSchema20, Limits{Precompute: time.Nanosecond}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		held := (heap() - base) / n
		var size int64
		for _, g := range gs {
			size += g.SizeBytes()
		}
		size /= n
		t.Logf("%s: %d KiB held, SizeBytes %d KiB", when, held>>10, size>>10)
		if size < held*6/10 || size > held*2 {
			t.Errorf("%s: SizeBytes %d for %d bytes held", when, size, held)
		}
	}
	check("compiled")
	for _, g := range gs {
		computeAll(t, g)
	}
	check("every position computed")
	goruntime.KeepAlive(gs)
}

// TestCacheCountsGrowth: a cached grammar that grows as its deferred
// positions are computed is counted at its new size on the next Get, and
// evicted when the cache no longer holds it.
func TestCacheCountsGrowth(t *testing.T) {
	v := getBigVocab(t)
	lim := Limits{Precompute: time.Nanosecond}
	c := NewCache(1<<40, lim)
	ctx := context.Background()
	g, err := c.Get(ctx, v, KindJSONSchema, toolSchema20)
	if err != nil {
		t.Fatal(err)
	}
	before := c.Stats().Bytes
	computeAll(t, g)
	if _, err := c.Get(ctx, v, KindJSONSchema, toolSchema20); err != nil {
		t.Fatal(err)
	}
	after := c.Stats().Bytes
	if after != g.SizeBytes()+int64(len(toolSchema20)) || after <= before {
		t.Fatalf("cache counts %d bytes (%d before the positions), the grammar holds %d", after, before, g.SizeBytes())
	}
	// A cache that held it compiled does not hold it grown.
	c = NewCache(before+1, lim)
	if g, err = c.Get(ctx, v, KindJSONSchema, toolSchema20); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Entries != 1 {
		t.Fatalf("not cached: %+v (limit %d)", s, before+1)
	}
	computeAll(t, g)
	if _, err := c.Get(ctx, v, KindJSONSchema, toolSchema20); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.Entries != 0 || s.Bytes > before+1 {
		t.Fatalf("after growing: %+v (limit %d)", s, before+1)
	}
}
