package hashenc

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func BenchmarkSparseShape(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, n := range []int{0, 1, 16, 122, 500} {
		for _, ws := range [][]int32{{8}, {8, 8, 14, 14, 14, 32, 64, 112, 56}} {
			f := randomFeatures(rng, n, func() int32 { return ws[rng.IntN(len(ws))] })
			b.Run(fmt.Sprint(n, "/", len(ws)), func(b *testing.B) {
				for b.Loop() {
					Sparse(f)
				}
			})
		}
	}
}

func BenchmarkFeaturesOnly(b *testing.B) {
	items := shortTexts(64)
	z := getFeaturizer()
	i := 0
	for b.Loop() {
		z.features(items[i%len(items)].Data)
		i++
	}
}

func BenchmarkSparseEmpty(b *testing.B) {
	for b.Loop() {
		Sparse(Features{})
	}
}
