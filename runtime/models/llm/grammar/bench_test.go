package grammar

import (
	"context"
	"math/rand/v2"
	"slices"
	"syscall"
	"testing"
	"time"
)

// toolSchema is a tool's parameters as agents write them.
const toolSchema = `{"type":"object","properties":{
 "name":{"type":"string","description":"who"},"age":{"type":"integer","minimum":0,"maximum":150},
 "email":{"type":"string","maxLength":40},"tags":{"type":"array","items":{"type":"string"},"maxItems":5},
 "active":{"type":"boolean"},"score":{"type":"number"},"kind":{"enum":["a","b","c"]},
 "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city"]},
 "when":{"type":"string","format":"date-time"},"id":{"type":"string","format":"uuid"}
},"required":["name","age","kind"]}`

// toolSchema20 has 20 properties of the usual kinds.
const toolSchema20 = `{"type":"object","properties":{
 "query":{"type":"string","description":"search terms"},"limit":{"type":"integer","minimum":1,"maximum":100},
 "offset":{"type":"integer","minimum":0},"sort":{"type":"string","enum":["relevance","date","popularity"]},
 "ascending":{"type":"boolean"},"language":{"type":"string"},"region":{"type":"string"},
 "from_date":{"type":"string","format":"date"},"to_date":{"type":"string","format":"date"},
 "include_domains":{"type":"array","items":{"type":"string"}},"exclude_domains":{"type":"array","items":{"type":"string"}},
 "safe_search":{"type":"string","enum":["off","moderate","strict"]},"min_score":{"type":"number"},
 "user":{"type":"object","properties":{"id":{"type":"string"},"role":{"type":"string","enum":["admin","user"]}},"required":["id"]},
 "fields":{"type":"array","items":{"type":"string","enum":["title","url","snippet","date"]},"maxItems":4},
 "timeout_ms":{"type":"integer"},"retry":{"type":"boolean"},"format":{"type":"string","enum":["json","text"]},
 "note":{"type":["string","null"]},"page_token":{"type":"string"}
},"required":["query","limit","sort"],"additionalProperties":false}`

// BenchmarkCompile is the cold compile of a 20-property tool schema for the
// 151,936-token vocabulary (what a cache miss costs).
// "default" precomputes for Limits.Precompute and leaves the rest for
// first use; "full" precomputes every position.
func BenchmarkCompile(b *testing.B) {
	v := getBigVocab(b)
	for _, c := range []struct {
		name string
		src  string
		pre  time.Duration
	}{
		{"schema20/default", toolSchema20, 0}, {"schema20/full", toolSchema20, -1},
		{"schema/default", toolSchema, 0}, {"schema/full", toolSchema, -1},
	} {
		b.Run(c.name, func(b *testing.B) {
			cpu0 := cpuTime()
			for range b.N {
				g, err := Compile(context.Background(), v, KindJSONSchema, c.src, Limits{Precompute: c.pre})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(g.Stats().Deferred), "deferred")
			}
			// CPU time, less sensitive than wall time to a loaded machine
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}

// BenchmarkMask is one Mask (plus the Accept of a random allowed token)
// over the 151,936-token vocabulary, walking sentences of each grammar
// (compiled with every position precomputed: the steady state of a cached
// grammar). It reports the per-step p50 and p99 of Mask alone.
func BenchmarkMask(b *testing.B) {
	v := getBigVocab(b)
	for _, c := range []struct {
		name string
		kind Kind
		src  string
	}{
		{"schema20", KindJSONSchema, toolSchema20},
		{"schema", KindJSONSchema, toolSchema},
		{"json", KindJSON, ""},
		{"regex", KindRegex, `[A-Z][a-z]+( [a-z]+){2,8}\.`},
	} {
		b.Run(c.name, func(b *testing.B) {
			g, err := Compile(context.Background(), v, c.kind, c.src, Limits{Precompute: -1})
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			mask := make([]uint64, v.MaskWords())
			var m *Matcher
			steps := 0
			times := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				if m == nil || steps > 200 {
					m, _ = g.NewMatcher()
					steps = 0
				}
				t0 := time.Now()
				n, err := m.Mask(mask)
				times = append(times, time.Since(t0))
				if err != nil || n == 0 {
					b.Fatal(err, n)
				}
				id := nthSet(mask, r.IntN(n))
				if v.isEOSID(id) || (m.CanEnd() && r.IntN(10) == 0) {
					m = nil
					continue
				}
				if err := m.Accept(id); err != nil {
					b.Fatal(err)
				}
				steps++
			}
			b.StopTimer()
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(times[len(times)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStep16 is one decode step's grammar work for 16 concurrent
// sequences under the 20-property tool schema on the 151,936-token
// vocabulary: 16 Masks and 16 Accepts, on one goroutine (ns/op is per
// step; compare with a decode step's time). Every position is precomputed.
func BenchmarkStep16(b *testing.B) {
	v := getBigVocab(b)
	for _, c := range []struct {
		name string
		kind Kind
		src  string
	}{{"schema20", KindJSONSchema, toolSchema20}, {"json", KindJSON, ""}} {
		b.Run(c.name, func(b *testing.B) {
			g, err := Compile(context.Background(), v, c.kind, c.src, Limits{Precompute: -1})
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(3, 4))
			ms := make([]*Matcher, 16)
			mask := make([]uint64, v.MaskWords())
			times := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				for i := range ms {
					if ms[i] == nil || ms[i].Accepted() > 300 {
						ms[i], _ = g.NewMatcher()
					}
					n, err := ms[i].Mask(mask)
					if err != nil || n == 0 {
						b.Fatal(err, n)
					}
					id := nthSet(mask, r.IntN(n))
					if v.isEOSID(id) || (ms[i].CanEnd() && r.IntN(10) == 0) {
						ms[i] = nil
						continue
					}
					if err := ms[i].Accept(id); err != nil {
						b.Fatal(err)
					}
				}
				times = append(times, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(times[len(times)*99/100].Microseconds()), "p99-µs")
		})
	}
}
