package llm

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/brokerd/brokerd/runtime/models"
)

// tinyNet is a tiny test model of arch (llama, qwen2, qwen3) with
// grouped-query attention and the architecture's particulars.
func tinyNet(arch string) netSpec {
	s := netSpec{Vocab: 96, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, Inter: 40, Context: 80, Eps: 1e-6}
	switch arch {
	case "llama":
		s.Tied = true
		// Llama 3's scaled frequencies, as Llama 3.2 uses them.
		s.InvFreq = ropeFreqs(s.HeadDim, 500000, &ropeScaling{Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 16})
	case "qwen2":
		s.QKVBias = true
		s.InvFreq = ropeFreqs(s.HeadDim, 10000, nil)
	case "qwen3":
		s.QKNorm = true
		s.HeadDim = 16 // Qwen3's head_dim is not hidden/heads
		s.Tied = true
		s.InvFreq = ropeFreqs(s.HeadDim, 1000000, nil)
	default:
		panic(arch)
	}
	return s
}

// randomCheckpoint returns Hugging Face-named weights for s.
func randomCheckpoint(s netSpec, seed uint64) map[string]models.Tensor {
	r := rand.New(rand.NewPCG(seed, 1))
	w := map[string]models.Tensor{}
	t := func(name string, scale, offset float64, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(offset + scale*r.NormFloat64())
		}
		w[name] = models.Tensor{Shape: shape, Data: data}
	}
	h, d := s.Hidden, s.HeadDim
	t("model.embed_tokens.weight", 1, 0, s.Vocab, h)
	t("model.norm.weight", 0.1, 1, h)
	if !s.Tied {
		t("lm_head.weight", 0.3, 0, s.Vocab, h)
	}
	for l := range s.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		t(p+"input_layernorm.weight", 0.1, 1, h)
		t(p+"post_attention_layernorm.weight", 0.1, 1, h)
		t(p+"self_attn.q_proj.weight", 0.5/math.Sqrt(float64(h)), 0, s.Heads*d, h)
		t(p+"self_attn.k_proj.weight", 0.5/math.Sqrt(float64(h)), 0, s.KVHeads*d, h)
		t(p+"self_attn.v_proj.weight", 1/math.Sqrt(float64(h)), 0, s.KVHeads*d, h)
		t(p+"self_attn.o_proj.weight", 1/math.Sqrt(float64(s.Heads*d)), 0, h, s.Heads*d)
		if s.QKVBias {
			t(p+"self_attn.q_proj.bias", 0.2, 0, s.Heads*d)
			t(p+"self_attn.k_proj.bias", 0.2, 0, s.KVHeads*d)
			t(p+"self_attn.v_proj.bias", 0.2, 0, s.KVHeads*d)
		}
		if s.QKNorm {
			t(p+"self_attn.q_norm.weight", 0.1, 1, d)
			t(p+"self_attn.k_norm.weight", 0.1, 1, d)
		}
		t(p+"mlp.gate_proj.weight", 1/math.Sqrt(float64(h)), 0, s.Inter, h)
		t(p+"mlp.up_proj.weight", 1/math.Sqrt(float64(h)), 0, s.Inter, h)
		t(p+"mlp.down_proj.weight", 1/math.Sqrt(float64(s.Inter)), 0, h, s.Inter)
	}
	return w
}

// refForward is an independent float64 forward pass of the whole token
// sequence (no cache), written from the transformers modelling code: it
// returns the logits of every position.
func refForward(s netSpec, w map[string]models.Tensor, tokens []int32) [][]float64 {
	h, d := s.Hidden, s.HeadDim
	n := len(tokens)
	get := func(name string) []float32 { return w[name].Data }
	// x·Wᵀ (+b) for W [out,in].
	lin := func(x []float64, wt []float32, b []float32, out int) []float64 {
		in := len(x)
		y := make([]float64, out)
		for o := range out {
			var acc float64
			for i := range in {
				acc += x[i] * float64(wt[o*in+i])
			}
			if b != nil {
				acc += float64(b[o])
			}
			y[o] = acc
		}
		return y
	}
	rms := func(x []float64, g []float32) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+float64(s.Eps))
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = v * inv * float64(g[i])
		}
		return y
	}
	rope := func(v []float64, pos int) {
		half := d / 2
		for i := range half {
			a := float64(pos) * float64(s.InvFreq[i])
			c, sn := math.Cos(a), math.Sin(a)
			x1, x2 := v[i], v[i+half]
			v[i] = x1*c - x2*sn
			v[i+half] = x2*c + x1*sn
		}
	}
	x := make([][]float64, n)
	emb := get("model.embed_tokens.weight")
	for t, tok := range tokens {
		x[t] = make([]float64, h)
		for i := range h {
			x[t][i] = float64(emb[int(tok)*h+i])
		}
	}
	bias := func(name string) []float32 {
		if s.QKVBias {
			return get(name)
		}
		return nil
	}
	group := s.Heads / s.KVHeads
	for l := range s.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		q := make([][]float64, n)
		k := make([][]float64, n)
		v := make([][]float64, n)
		for t := range n {
			hn := rms(x[t], get(p+"input_layernorm.weight"))
			q[t] = lin(hn, get(p+"self_attn.q_proj.weight"), bias(p+"self_attn.q_proj.bias"), s.Heads*d)
			k[t] = lin(hn, get(p+"self_attn.k_proj.weight"), bias(p+"self_attn.k_proj.bias"), s.KVHeads*d)
			v[t] = lin(hn, get(p+"self_attn.v_proj.weight"), bias(p+"self_attn.v_proj.bias"), s.KVHeads*d)
			for hd := range s.Heads {
				qh := q[t][hd*d : (hd+1)*d]
				if s.QKNorm {
					copy(qh, rms(qh, get(p+"self_attn.q_norm.weight")))
				}
				rope(qh, t)
			}
			for hd := range s.KVHeads {
				kh := k[t][hd*d : (hd+1)*d]
				if s.QKNorm {
					copy(kh, rms(kh, get(p+"self_attn.k_norm.weight")))
				}
				rope(kh, t)
			}
		}
		for t := range n {
			att := make([]float64, s.Heads*d)
			for hd := range s.Heads {
				kv := hd / group
				sc := make([]float64, t+1)
				m := math.Inf(-1)
				for j := 0; j <= t; j++ {
					var dot float64
					for i := range d {
						dot += q[t][hd*d+i] * k[j][kv*d+i]
					}
					sc[j] = dot / math.Sqrt(float64(d))
					m = math.Max(m, sc[j])
				}
				var sum float64
				for j := range sc {
					sc[j] = math.Exp(sc[j] - m)
					sum += sc[j]
				}
				for j := range sc {
					for i := range d {
						att[hd*d+i] += sc[j] / sum * v[j][kv*d+i]
					}
				}
			}
			o := lin(att, get(p+"self_attn.o_proj.weight"), nil, h)
			for i := range h {
				x[t][i] += o[i]
			}
			hn := rms(x[t], get(p+"post_attention_layernorm.weight"))
			g := lin(hn, get(p+"mlp.gate_proj.weight"), nil, s.Inter)
			u := lin(hn, get(p+"mlp.up_proj.weight"), nil, s.Inter)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			dn := lin(g, get(p+"mlp.down_proj.weight"), nil, h)
			for i := range h {
				x[t][i] += dn[i]
			}
		}
	}
	head := "lm_head.weight"
	if s.Tied {
		head = "model.embed_tokens.weight"
	}
	out := make([][]float64, n)
	for t := range n {
		out[t] = lin(rms(x[t], get("model.norm.weight")), get(head), nil, s.Vocab)
	}
	return out
}
