package vecmath

import (
	"math"
	"math/rand/v2"
	"testing"
)

// forms runs f with each form of the calls the CPU runs: AVX-512, AVX2,
// portable.
func forms(t *testing.T, f func(t *testing.T)) {
	for l := cpuLevel(); l >= 0; l-- {
		t.Run([]string{"portable", "avx2", "avx512"}[l], func(t *testing.T) {
			forceLevel(l)
			defer forceLevel(-1)
			f(t)
		})
	}
}

// ulps is how many float64 steps a lies from b (both finite and not
// negative: subnormals count in their own steps).
func ulps(a, b float64) float64 {
	d := math.Float64bits(a) - math.Float64bits(b)
	return math.Abs(float64(int64(d)))
}

// TestExpWeights: the weights are within 4 steps of math.Exp's over the
// whole range a softmax uses (down through the subnormals to 0), -Inf
// gives 0 and NaN stays NaN; the indices are those with a weight at least
// minP and above 0, in order; the sum is theirs.
func TestExpWeights(t *testing.T) {
	forms(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for _, c := range []struct {
			m, temp, minP float64
		}{{0, 1, 0}, {3.5, 0.7, 0}, {10, 1.3, 1e-3}, {0, 1, 0.5}} {
			x := make([]float64, 1003) // not a whole number of vectors
			for i := range x {
				switch i % 7 {
				case 0:
					x[i] = c.m - rng.Float64()*760*c.temp // to past the underflow
				case 1:
					x[i] = c.m - (708+rng.Float64()*38)*c.temp // the subnormal results
				default:
					x[i] = c.m - rng.ExpFloat64()*3
				}
			}
			x[5], x[6], x[7] = math.Inf(-1), math.NaN(), c.m
			want := make([]float64, len(x))
			var wantIdx []int32
			var wantSum float64
			for i, v := range x {
				want[i] = math.Exp((v - c.m) / c.temp)
				if want[i] >= c.minP && want[i] > 0 {
					wantIdx = append(wantIdx, int32(i))
					wantSum += want[i]
				}
			}
			idx, sum := ExpWeights(x, c.m, c.temp, c.minP, make([]int32, 0, len(x)))
			for i, got := range x {
				w := want[i]
				switch {
				case math.IsNaN(w):
					if !math.IsNaN(got) {
						t.Fatalf("%+v: x[%d] = %g, want NaN", c, i, got)
					}
				case ulps(got, w) > 4: // 3 at most in a million draws; subnormal steps below 2^-1022
					t.Fatalf("%+v: x[%d] = %.17g, want %.17g (%g ulp)", c, i, got, w, ulps(got, w))
				}
			}
			if len(idx) != len(wantIdx) {
				t.Fatalf("%+v: %d indices, want %d", c, len(idx), len(wantIdx))
			}
			for i := range idx {
				if idx[i] != wantIdx[i] {
					t.Fatalf("%+v: idx[%d] = %d, want %d", c, i, idx[i], wantIdx[i])
				}
			}
			if math.Abs(sum-wantSum) > 1e-13*wantSum {
				t.Fatalf("%+v: sum %.17g, want %.17g", c, sum, wantSum)
			}
		}
		// idx too small is replaced.
		if idx, _ := ExpWeights([]float64{0, -1}, 0, 1, 0, nil); len(idx) != 2 || idx[1] != 1 {
			t.Fatalf("idx %v", idx)
		}
	})
}

func refArgmax[T float32 | float64](x []T) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// TestArgmax: the first index of the largest, as the scalar scan finds
// it, on ties, NaNs (first or not), infinities, signed zeros, and every
// length around the vector widths.
func TestArgmax(t *testing.T) {
	forms(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		nan, inf := math.NaN(), math.Inf(1)
		cases := [][]float64{{1}, {nan}, {nan, 1, 2}, {1, nan, 5, 5}, {-inf, -inf}, {-inf, nan, -inf},
			{inf, 2, inf}, {math.Copysign(0, -1), 0, -1}, {0, math.Copysign(0, -1)}, {-1, -1, -1}}
		for n := 1; n < 70; n++ {
			x := make([]float64, n)
			for i := range x {
				x[i] = math.Round(rng.NormFloat64() * 2) // ties
				if rng.IntN(9) == 0 {
					x[i] = nan
				}
			}
			cases = append(cases, x)
			one := make([]float64, n) // the largest in one place
			one[rng.IntN(n)] = 1
			cases = append(cases, one)
		}
		for _, x := range cases {
			x32 := make([]float32, len(x))
			for i, v := range x {
				x32[i] = float32(v)
			}
			if got, want := ArgmaxF64(x), refArgmax(x); got != want {
				t.Errorf("f64 %v: %d, want %d", x, got, want)
			}
			if got, want := ArgmaxF32(x32), refArgmax(x32); got != want {
				t.Errorf("f32 %v: %d, want %d", x32, got, want)
			}
		}
		if ArgmaxF32(nil) != -1 || ArgmaxF64(nil) != -1 {
			t.Error("an empty slice has an argmax")
		}
	})
}

// TestLogSumExpF32: against float64 math.Exp sums, for spreads from flat
// to wide and lengths around the vector width; NaN in, NaN out; all -Inf
// gives NaN, as the Go loop it replaces did.
func TestLogSumExpF32(t *testing.T) {
	forms(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 6))
		for _, spread := range []float64{0.01, 3, 40, 300} {
			for _, n := range []int{1, 7, 8, 9, 1000, 151936} {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(rng.NormFloat64()*spread + 5)
				}
				m := float64(x[refArgmax(x)])
				var sum float64
				for _, v := range x {
					sum += math.Exp(float64(v) - m)
				}
				want := m + math.Log(sum)
				if got := LogSumExpF32(x); math.Abs(got-want) > 1e-12*math.Max(1, math.Abs(want)) {
					t.Fatalf("spread %g n %d: %.17g, want %.17g", spread, n, got, want)
				}
			}
		}
		inf := float32(math.Inf(-1))
		for _, x := range [][]float32{{1, float32(math.NaN()), 2}, {inf, inf}, make([]float32, 20)} {
			got := LogSumExpF32(x)
			if x[0] == 0 { // twenty zeros: log 20
				if math.Abs(got-math.Log(20)) > 1e-15 {
					t.Errorf("%v: %g", x, got)
				}
				continue
			}
			if !math.IsNaN(got) {
				t.Errorf("%v: %g, want NaN", x, got)
			}
		}
		x := make([]float32, 17)
		x[16] = float32(math.NaN()) // past the last whole vector
		if !math.IsNaN(LogSumExpF32(x)) {
			t.Error("a NaN in the tail was missed")
		}
	})
}

// BenchmarkVocab is each call over one row of Qwen's vocabulary.
func BenchmarkVocab(b *testing.B) {
	const v = 151936
	x32 := make([]float32, v)
	for i := range x32 {
		x32[i] = float32(math.Sin(float64(i)*0.37)*4 + math.Cos(float64(i)*0.011)*3)
	}
	x := make([]float64, v)
	idx := make([]int32, v)
	b.Run("exp-weights", func(b *testing.B) {
		for b.Loop() {
			for i, f := range x32 {
				x[i] = float64(f)
			}
			ExpWeights(x, 7, 0.8, 0, idx)
		}
	})
	b.Run("logsumexp", func(b *testing.B) {
		for b.Loop() {
			LogSumExpF32(x32)
		}
	})
	b.Run("argmax", func(b *testing.B) {
		for b.Loop() {
			ArgmaxF32(x32)
		}
	})
}
