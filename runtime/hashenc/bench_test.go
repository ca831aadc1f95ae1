package hashenc

import (
	"context"
	"fmt"
	"testing"
)

// shortTexts are memory-record-sized sentences for the benchmarks.
func shortTexts(n int) []Input {
	items := make([]Input, n)
	for i := range items {
		p := paraphrases[i%len(paraphrases)]
		items[i] = Input{Data: []byte(fmt.Sprintf("%s %d %s", p[0], i, p[1])), Normalize: i%2 == 0}
	}
	return items
}

// BenchmarkFeaturize measures the host's share of an item (Featurize,
// Sparse, Quantize) on sentence-sized texts, with the reference
// implementations first so that new reports its speed-up in the same run.
func BenchmarkFeaturize(b *testing.B) {
	items := shortTexts(64)
	var bytes int64
	for _, it := range items {
		bytes += int64(len(it.Data))
	}
	benchPair(b, bytes/int64(len(items)), map[string]func(int){
		"reference": func(i int) {
			h := sparseReference(featurizeReference(items[i%len(items)].Data))
			Quantize(&h)
		},
		"new": func(i int) {
			h := Sparse(Featurize(items[i%len(items)].Data))
			Quantize(&h)
		},
		// Input.Prepare's path: no Features allocated.
		"prepare": func(i int) { project(items[i%len(items)].Data) },
	})
}

// BenchmarkSparse measures the sparse projection alone on the features of
// sentence-sized texts.
func BenchmarkSparse(b *testing.B) {
	items := shortTexts(64)
	fs := make([]Features, len(items))
	for i, it := range items {
		fs[i] = Featurize(it.Data)
	}
	benchPair(b, 0, map[string]func(int){
		"reference": func(i int) { sparseReference(fs[i%len(fs)]) },
		"new":       func(i int) { Sparse(fs[i%len(fs)]) },
	})
}

// benchPair runs fns["reference"] and then the others as sub-benchmarks;
// each other reports its speed-up over the reference as the metric
// "speedup" (when the reference ran in this process).
func benchPair(b *testing.B, bytes int64, fns map[string]func(int)) {
	var refNs float64
	for _, name := range []string{"reference", "new", "prepare"} {
		fn, ok := fns[name]
		if !ok {
			continue
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(bytes)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				fn(i)
				i++
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(i)
			b.ReportMetric(1e9/ns, "items/s")
			if name == "reference" {
				refNs = ns
			} else if refNs > 0 {
				b.ReportMetric(refNs/ns, "speedup")
			}
		})
	}
}

func BenchmarkExecute(b *testing.B) {
	m := New()
	r := newTestReplica(b, m, openOneDNN(b, 0))
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprint("batch", n), func(b *testing.B) {
			in := itemsAsAny(shortTexts(n))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Execute(ctx, in); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "items/s")
		})
	}
}
