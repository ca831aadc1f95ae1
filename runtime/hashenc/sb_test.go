package hashenc

import "testing"

func BenchmarkSparseTmp(b *testing.B) {
	items := shortTexts(64)
	fs := make([]Features, len(items))
	n := 0
	for i, it := range items {
		fs[i] = Featurize(it.Data)
		n += fs[i].Len()
	}
	b.Logf("avg features %d", n/len(fs))
	b.Run("new", func(b *testing.B) {
		i := 0
		for b.Loop() {
			Sparse(fs[i%len(fs)])
			i++
		}
	})
	b.Run("ref", func(b *testing.B) {
		i := 0
		for b.Loop() {
			sparseReference(fs[i%len(fs)])
			i++
		}
	})
}
