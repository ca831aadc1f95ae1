package models

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// An independent float64 forward pass for the tests: plain loops over one
// sequence at a time, so no padding ever enters it, and no code shared with
// the runtime or the graph builder.

// refLinear: x [rows][in] · wᵀ (w PyTorch [out,in] flat) + bias.
func refLinear(x [][]float64, w []float32, bias []float32, out int) [][]float64 {
	in := len(x[0])
	y := make([][]float64, len(x))
	for r, row := range x {
		y[r] = make([]float64, out)
		for o := 0; o < out; o++ {
			s := 0.0
			for i := 0; i < in; i++ {
				s += row[i] * float64(w[o*in+i])
			}
			if bias != nil {
				s += float64(bias[o])
			}
			y[r][o] = s
		}
	}
	return y
}

func refGELU(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) }

func refApply(x [][]float64, f func(float64) float64) [][]float64 {
	for _, row := range x {
		for i, v := range row {
			row[i] = f(v)
		}
	}
	return x
}

func refLN(x [][]float64, gamma, beta []float32, eps float64) [][]float64 {
	y := make([][]float64, len(x))
	for r, row := range x {
		mean, v := 0.0, 0.0
		for _, e := range row {
			mean += e
		}
		mean /= float64(len(row))
		for _, e := range row {
			v += (e - mean) * (e - mean)
		}
		v /= float64(len(row))
		y[r] = make([]float64, len(row))
		for i, e := range row {
			y[r][i] = (e-mean)/math.Sqrt(v+eps)*float64(gamma[i]) + float64(beta[i])
		}
	}
	return y
}

func refSoftmaxRows(x [][]float64) [][]float64 {
	for _, row := range x {
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, v)
		}
		s := 0.0
		for i, v := range row {
			row[i] = math.Exp(v - mx)
			s += row[i]
		}
		for i := range row {
			row[i] /= s
		}
	}
	return x
}

func refAddRows(a, b [][]float64) [][]float64 {
	y := make([][]float64, len(a))
	for r := range a {
		y[r] = make([]float64, len(a[r]))
		for i := range a[r] {
			y[r][i] = a[r][i] + b[r][i]
		}
	}
	return y
}

func refL2(v []float64) []float64 {
	s := 0.0
	for _, e := range v {
		s += e * e
	}
	out := make([]float64, len(v))
	if s == 0 {
		return out
	}
	for i, e := range v {
		out[i] = e / math.Sqrt(s)
	}
	return out
}

// refBERT runs one sequence through the encoder and returns the pooled
// (optionally normalised) vector, or the logits when classify.
func refBERT(cfg BERTConfig, w map[string]Tensor, ids, types []int32, pooling string, normalize, classify bool) []float64 {
	h, nh := cfg.HiddenSize, cfg.NumAttentionHeads
	hd := h / nh
	s := len(ids)
	get := func(name string) []float32 { return w[name].Data }
	x := make([][]float64, s)
	for t := 0; t < s; t++ {
		x[t] = make([]float64, h)
		tt := int32(0)
		if types != nil {
			tt = types[t]
		}
		for i := 0; i < h; i++ {
			x[t][i] = float64(get("embeddings.word_embeddings.weight")[int(ids[t])*h+i]) +
				float64(get("embeddings.position_embeddings.weight")[t*h+i]) +
				float64(get("embeddings.token_type_embeddings.weight")[int(tt)*h+i])
		}
	}
	eps := cfg.LayerNormEps
	x = refLN(x, get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"), eps)
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		q := refLinear(x, get(p+"attention.self.query.weight"), get(p+"attention.self.query.bias"), h)
		k := refLinear(x, get(p+"attention.self.key.weight"), get(p+"attention.self.key.bias"), h)
		v := refLinear(x, get(p+"attention.self.value.weight"), get(p+"attention.self.value.bias"), h)
		ctx := make([][]float64, s)
		for i := range ctx {
			ctx[i] = make([]float64, h)
		}
		for head := 0; head < nh; head++ {
			off := head * hd
			scores := make([][]float64, s)
			for i := 0; i < s; i++ {
				scores[i] = make([]float64, s)
				for j := 0; j < s; j++ {
					dot := 0.0
					for e := 0; e < hd; e++ {
						dot += q[i][off+e] * k[j][off+e]
					}
					scores[i][j] = dot / math.Sqrt(float64(hd))
				}
			}
			scores = refSoftmaxRows(scores)
			for i := 0; i < s; i++ {
				for e := 0; e < hd; e++ {
					acc := 0.0
					for j := 0; j < s; j++ {
						acc += scores[i][j] * v[j][off+e]
					}
					ctx[i][off+e] = acc
				}
			}
		}
		attn := refLinear(ctx, get(p+"attention.output.dense.weight"), get(p+"attention.output.dense.bias"), h)
		x1 := refLN(refAddRows(attn, x), get(p+"attention.output.LayerNorm.weight"), get(p+"attention.output.LayerNorm.bias"), eps)
		act := refGELU
		if cfg.HiddenAct == "relu" {
			act = func(v float64) float64 { return math.Max(v, 0) }
		}
		inter := refApply(refLinear(x1, get(p+"intermediate.dense.weight"), get(p+"intermediate.dense.bias"), cfg.IntermediateSize), act)
		out := refLinear(inter, get(p+"output.dense.weight"), get(p+"output.dense.bias"), h)
		x = refLN(refAddRows(out, x1), get(p+"output.LayerNorm.weight"), get(p+"output.LayerNorm.bias"), eps)
	}
	if classify {
		pooled := refApply(refLinear(x[:1], get("pooler.dense.weight"), get("pooler.dense.bias"), h), math.Tanh)
		labels := w["classifier.bias"].Shape[0]
		return refLinear(pooled, get("classifier.weight"), get("classifier.bias"), labels)[0]
	}
	vec := make([]float64, h)
	if pooling == PoolingCLS {
		copy(vec, x[0])
	} else {
		for t := 0; t < s; t++ {
			for i := range vec {
				vec[i] += x[t][i] / float64(s)
			}
		}
	}
	if normalize {
		vec = refL2(vec)
	}
	return vec
}

// randomBERT makes random weights for cfg under canonical names, with
// scales that keep every layer's activations of order one (so attention is
// far from uniform and the test sees it), and a classifier head of labels
// outputs when labels > 0.
func randomBERT(r *rand.Rand, cfg BERTConfig, labels int) map[string]Tensor {
	w := map[string]Tensor{}
	h, in := cfg.HiddenSize, cfg.IntermediateSize
	mat := func(name string, scale float64, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(r.NormFloat64() * scale)
		}
		w[name] = Tensor{Shape: shape, Data: data}
	}
	gamma := func(name string, n int) {
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(1 + 0.2*r.NormFloat64())
		}
		w[name] = Tensor{Shape: []int{n}, Data: data}
	}
	lin := func(p string, out, inDim int) {
		mat(p+".weight", 1/math.Sqrt(float64(inDim)), out, inDim)
		mat(p+".bias", 0.1, out)
	}
	mat("embeddings.word_embeddings.weight", 1, cfg.VocabSize, h)
	mat("embeddings.position_embeddings.weight", 0.5, cfg.MaxPositionEmbeddings, h)
	mat("embeddings.token_type_embeddings.weight", 0.5, cfg.TypeVocabSize, h)
	gamma("embeddings.LayerNorm.weight", h)
	mat("embeddings.LayerNorm.bias", 0.1, h)
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		// Larger query/key weights: scores of a few units, a peaked softmax.
		mat(p+"attention.self.query.weight", 2/math.Sqrt(float64(h)), h, h)
		mat(p+"attention.self.query.bias", 0.1, h)
		mat(p+"attention.self.key.weight", 2/math.Sqrt(float64(h)), h, h)
		mat(p+"attention.self.key.bias", 0.1, h)
		lin(p+"attention.self.value", h, h)
		lin(p+"attention.output.dense", h, h)
		gamma(p+"attention.output.LayerNorm.weight", h)
		mat(p+"attention.output.LayerNorm.bias", 0.1, h)
		lin(p+"intermediate.dense", in, h)
		lin(p+"output.dense", h, in)
		gamma(p+"output.LayerNorm.weight", h)
		mat(p+"output.LayerNorm.bias", 0.1, h)
	}
	lin("pooler.dense", h, h)
	if labels > 0 {
		lin("classifier", labels, h)
	}
	return w
}

// relErr is ‖got−want‖₂ / ‖want‖₂ (norm-wise: an element near zero by
// cancellation does not make an accurate result look wrong).
func relErr(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range got {
		d := float64(got[i]) - want[i]
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		num += d * d
		den += want[i] * want[i]
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}
