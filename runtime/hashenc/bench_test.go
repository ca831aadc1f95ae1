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

func BenchmarkFeaturize(b *testing.B) {
	items := shortTexts(64)
	var bytes int64
	for _, it := range items {
		bytes += int64(len(it.Data))
	}
	b.SetBytes(bytes / int64(len(items)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		h := Sparse(Featurize(items[i%len(items)].Data))
		Quantize(&h)
		i++
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "items/s")
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
