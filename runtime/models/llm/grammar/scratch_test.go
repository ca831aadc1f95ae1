package grammar

import (
	"context"
	"testing"
	"time"
	"math/rand/v2"
	"sort"
)

const toolSchema = `{"type":"object","properties":{
 "name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},
 "email":{"type":"string","maxLength":40},"tags":{"type":"array","items":{"type":"string"},"maxItems":5},
 "active":{"type":"boolean"},"score":{"type":"number"},"kind":{"enum":["a","b","c"]},
 "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city"]},
 "when":{"type":"string","format":"date-time"},"id":{"type":"string","format":"uuid"}
},"required":["name","age","kind"]}`

func TestScratch(t *testing.T) {
	v := getBigVocab(t)
	t.Logf("vocab nodes %d", len(v.nodes))
	for _, src := range []struct{k Kind; s string}{{KindJSONSchema, toolSchema}, {KindJSON, ""}} {
		t0 := time.Now()
		g, err := Compile(context.Background(), v, src.k, src.s, Limits{})
		if err != nil { t.Fatal(err) }
		t.Logf("%s compile %v stats %+v size %d", src.k, time.Since(t0), g.Stats(), g.SizeBytes())
		r := rand.New(rand.NewPCG(1, 2))
		var ds []time.Duration
		for i := 0; i < 5; i++ {
			m, _ := g.NewMatcher()
			mask := make([]uint64, v.MaskWords())
			for step := 0; step < 60; step++ {
				t1 := time.Now()
				n, err := m.Mask(mask)
				ds = append(ds, time.Since(t1))
				if err != nil || n == 0 { t.Fatal(err, n) }
				id := nthSet(mask, r.IntN(n))
				if v.isEOSID(id) { break }
				if err := m.Accept(id); err != nil { t.Fatal(err) }
			}
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("mask p50 %v p99 %v max %v", ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1])
	}
}
