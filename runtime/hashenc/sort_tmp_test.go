package hashenc

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func BenchmarkSortTmp(b *testing.B) {
	for _, n := range []int{100, 200, 400, 1000} {
		rng := rand.New(rand.NewPCG(1, 2))
		keys := make([]uint32, n)
		for i := range keys {
			keys[i] = rng.Uint32() >> 10
		}
		buf := make([]uint32, n)
		z := &featurizer{}
		b.Run("radix"+string(rune('0'+n/100)), func(b *testing.B) {
			for b.Loop() {
				copy(buf, keys)
				z.sort(buf)
			}
		})
		b.Run("pdq"+string(rune('0'+n/100)), func(b *testing.B) {
			for b.Loop() {
				copy(buf, keys)
				slices.Sort(buf)
			}
		})
	}
}
