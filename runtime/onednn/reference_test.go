package onednn

import (
	"math"

	"github.com/brokerd/brokerd/runtime"
)

// A float64 reference of every op, used only by the tests. Shapes are
// row-major, as on the device.

func refAct(x float64, a runtime.Activation) float64 {
	switch a {
	case runtime.ActReLU:
		return math.Max(x, 0)
	case runtime.ActGELU:
		return 0.5 * x * (1 + math.Erf(x/math.Sqrt2))
	case runtime.ActTanh:
		return math.Tanh(x)
	}
	return x
}

// refMatMul: a [m,k] × w ([k,n], or [n,k] with transB) + bias [n], act.
func refMatMul(a []float64, m, k int, w []float64, n int, transB bool, bias []float64, act runtime.Activation) []float64 {
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				wv := w[p*n+j]
				if transB {
					wv = w[j*k+p]
				}
				s += a[i*k+p] * wv
			}
			if bias != nil {
				s += bias[j]
			}
			out[i*n+j] = refAct(s, act)
		}
	}
	return out
}

// refBatchMatMul: batch independent matmuls, each scaled.
func refBatchMatMul(a []float64, batch, m, k int, w []float64, n int, transB bool, scale float64) []float64 {
	out := make([]float64, 0, batch*m*n)
	for b := 0; b < batch; b++ {
		r := refMatMul(a[b*m*k:(b+1)*m*k], m, k, w[b*k*n:(b+1)*k*n], n, transB, nil, runtime.ActNone)
		for i := range r {
			r[i] *= scale
		}
		out = append(out, r...)
	}
	return out
}

// refAdd: a [rows,n] + b, where b is [rows,n] or [n].
func refAdd(a, b []float64, n int) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		if len(b) == len(a) {
			out[i] = a[i] + b[i]
		} else {
			out[i] = a[i] + b[i%n]
		}
	}
	return out
}

func refLayerNorm(x []float64, n int, gamma, beta []float64, eps float64) []float64 {
	out := make([]float64, len(x))
	for r := 0; r < len(x)/n; r++ {
		row := x[r*n : (r+1)*n]
		var mean, v float64
		for _, e := range row {
			mean += e
		}
		mean /= float64(n)
		for _, e := range row {
			v += (e - mean) * (e - mean)
		}
		v /= float64(n)
		inv := 1 / math.Sqrt(v+eps)
		for j, e := range row {
			out[r*n+j] = (e-mean)*inv*gamma[j] + beta[j]
		}
	}
	return out
}

func refSoftmax(x []float64, n int) []float64 {
	out := make([]float64, len(x))
	for r := 0; r < len(x)/n; r++ {
		row := x[r*n : (r+1)*n]
		mx := math.Inf(-1)
		for _, e := range row {
			mx = math.Max(mx, e)
		}
		var s float64
		for j, e := range row {
			out[r*n+j] = math.Exp(e - mx)
			s += out[r*n+j]
		}
		for j := range row {
			out[r*n+j] /= s
		}
	}
	return out
}

func refPointwise(x []float64, a runtime.Activation) []float64 {
	out := make([]float64, len(x))
	for i, e := range x {
		out[i] = refAct(e, a)
	}
	return out
}

// refGather: rows idx[i] of table [v,d].
func refGather(table []float64, d int, idx []int32) []float64 {
	out := make([]float64, 0, len(idx)*d)
	for _, i := range idx {
		out = append(out, table[int(i)*d:(int(i)+1)*d]...)
	}
	return out
}

// refMeanPool: x [b,s,d] averaged over positions with a non-zero mask.
func refMeanPool(x []float64, b, s, d int, mask []float64) []float64 {
	out := make([]float64, b*d)
	for bi := 0; bi < b; bi++ {
		cnt := 0
		for si := 0; si < s; si++ {
			if mask[bi*s+si] == 0 {
				continue
			}
			cnt++
			for j := 0; j < d; j++ {
				out[bi*d+j] += x[(bi*s+si)*d+j]
			}
		}
		for j := 0; cnt > 0 && j < d; j++ {
			out[bi*d+j] /= float64(cnt)
		}
	}
	return out
}

func refL2Normalize(x []float64, d int) []float64 {
	out := make([]float64, len(x))
	for r := 0; r < len(x)/d; r++ {
		var ss float64
		for _, e := range x[r*d : (r+1)*d] {
			ss += e * e
		}
		if ss == 0 {
			continue
		}
		norm := math.Sqrt(ss)
		for j := 0; j < d; j++ {
			out[r*d+j] = x[r*d+j] / norm
		}
	}
	return out
}

// relErr is the norm-wise relative error ‖got−want‖₂ / ‖want‖₂ (the absolute
// ‖got−want‖₂ when want is all zeros). Element-wise relative error is not
// used because a matmul output near zero by cancellation has a large
// relative error however accurate the kernel is.
func relErr(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range got {
		diff := float64(got[i]) - want[i]
		if math.IsNaN(diff) {
			return math.Inf(1)
		}
		num += diff * diff
		den += want[i] * want[i]
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// refPermute: x read as view (row-major), output dimension i is view
// dimension perm[i].
func refPermute(x []float64, view, perm []int) []float64 {
	r := len(view)
	inStride := make([]int, r)
	s := 1
	for i := r - 1; i >= 0; i-- {
		inStride[i] = s
		s *= view[i]
	}
	outDims := make([]int, r)
	for i, p := range perm {
		outDims[i] = view[p]
	}
	out := make([]float64, len(x))
	idx := make([]int, r) // output multi-index
	for o := range out {
		src := 0
		for i, p := range perm {
			src += idx[i] * inStride[p]
		}
		out[o] = x[src]
		for i := r - 1; i >= 0; i-- {
			idx[i]++
			if idx[i] < outDims[i] {
				break
			}
			idx[i] = 0
		}
	}
	return out
}

// refMaskedSoftmax: softmax of each row of x [b, rows/b, n] over the
// positions whose mask [b,n] is non-zero (masked ones are 0); a row with no
// kept position is uniform.
func refMaskedSoftmax(x []float64, b, n int, mask []float64) []float64 {
	rows := len(x) / n
	per := rows / b
	out := make([]float64, len(x))
	for r := 0; r < rows; r++ {
		m := mask[(r/per)*n : (r/per+1)*n]
		kept := 0
		mx := math.Inf(-1)
		for j := 0; j < n; j++ {
			if m[j] != 0 {
				kept++
				mx = math.Max(mx, x[r*n+j])
			}
		}
		if kept == 0 {
			for j := 0; j < n; j++ {
				out[r*n+j] = 1 / float64(n)
			}
			continue
		}
		var sum float64
		for j := 0; j < n; j++ {
			if m[j] != 0 {
				out[r*n+j] = math.Exp(x[r*n+j] - mx)
				sum += out[r*n+j]
			}
		}
		for j := 0; j < n; j++ {
			out[r*n+j] /= sum
		}
	}
	return out
}
