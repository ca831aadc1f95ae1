// Command council measures a council round on the CPU: 16 prompts whose
// answers range from 16 to 256 tokens, run through the scheduler's
// continuous batching and brokerd's LLM engine on oneDNN, three ways in
// interleaved rounds on the same random model:
//
//   - continuous: the running set holds every sequence; each leaves at the
//     step it finishes (what brokerd does);
//   - static: the same batch, but every sequence runs until the longest
//     one ends (a batch that waits for its longest member);
//   - one at a time: a running set of one (a server taking one prompt after
//     another).
//
// It prints the aggregate useful output tokens/s of each, their ratios and
// time-to-first-token percentiles, and the single-stream decode speed
// against the memory bandwidth limit (weight bytes per token over the
// measured read bandwidth).
//
//	go run ./bench/council -layers 8 -hidden 512 -heads 8 -kv-heads 2 -intermediate 1536 -vocab 32000 -rounds 2
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/brokerd/brokerd/bench/benchkit"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/onednn"
)

func main() {
	layers := flag.Int("layers", 8, "decoder layers")
	hidden := flag.Int("hidden", 512, "hidden size")
	heads := flag.Int("heads", 8, "attention heads")
	kvHeads := flag.Int("kv-heads", 2, "key/value heads")
	inter := flag.Int("intermediate", 1536, "MLP intermediate size")
	vocab := flag.Int("vocab", 32000, "vocabulary size")
	prompts := flag.Int("prompts", 16, "prompts in a round")
	minOut := flag.Int("min-tokens", 16, "shortest answer")
	maxOut := flag.Int("max-tokens", 256, "longest answer")
	promptLen := flag.Int("prompt-tokens", 48, "tokens per prompt")
	rounds := flag.Int("rounds", 2, "interleaved rounds of the three modes")
	dtype := flag.String("dtype", "f32", "compute type: f32 or bf16")
	skipOne := flag.Bool("skip-one-at-a-time", false, "leave out the one-at-a-time mode (slow on big models)")
	flag.Parse()
	if err := run(*layers, *hidden, *heads, *kvHeads, *inter, *vocab, *prompts, *minOut, *maxOut, *promptLen, *rounds, *dtype, *skipOne, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "council:", err)
		os.Exit(1)
	}
}

func run(layers, hidden, heads, kvHeads, inter, vocab, nPrompts, minOut, maxOut, promptLen, rounds int, dtype string, skipOne bool, w io.Writer) error {
	dt := runtime.F32
	if dtype == "bf16" {
		dt = runtime.BF16
	} else if dtype != "f32" {
		return fmt.Errorf("-dtype %q: want f32 or bf16", dtype)
	}
	m, err := model(layers, hidden, heads, kvHeads, inter, vocab, maxOut+promptLen+16)
	if err != nil {
		return err
	}
	ctx := context.Background()
	dev, err := onednn.New(onednn.Options{}).Open(ctx, runtime.DeviceSpec{ID: "cpu:0", DType: dt})
	if err != nil {
		return err
	}
	defer dev.Close()
	blocks := int64(nPrompts) * int64((maxOut+promptLen+llm.DefaultBlockSize)/llm.DefaultBlockSize+1)
	// No prefix cache: the rounds and modes repeat the same prompts.
	eng, err := m.NewEngine(ctx, dev, llm.EngineOptions{CacheBytes: blocks * m.CacheBlockBytes(dev, 0, 0), MaxSeqs: nPrompts, MaxStepTokens: 2048, DisablePrefixCache: true})
	if err != nil {
		return err
	}
	defer eng.Close()

	rng := rand.New(rand.NewPCG(3, 4))
	round := make([]benchkit.Job, nPrompts)
	for i := range round {
		p := make([]int32, promptLen)
		for j := range p {
			p[j] = int32(rng.IntN(vocab))
		}
		// Answers spread evenly from minOut to maxOut, shuffled.
		n := minOut
		if nPrompts > 1 {
			n = minOut + i*(maxOut-minOut)/(nPrompts-1)
		}
		round[i] = benchkit.Job{Prompt: p, Out: n}
	}
	rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
	useful := 0
	for _, j := range round {
		useful += j.Out
	}

	fmt.Fprintf(w, "model: %d layers, hidden %d, %d/%d heads, intermediate %d, vocab %d, %s; weights %.0f MiB\n",
		layers, hidden, heads, kvHeads, inter, vocab, dt, float64(m.WeightBytes(dt))/(1<<20))
	fmt.Fprintf(w, "round: %d prompts of %d tokens, answers %d to %d tokens (%d useful tokens)\n", nPrompts, promptLen, minOut, maxOut, useful)
	modes := []string{"continuous", "static"}
	if !skipOne {
		modes = append(modes, "one-at-a-time")
	}
	rate := map[string][]float64{}
	var ttfts []time.Duration
	for r := range rounds {
		for _, mode := range modes {
			running, jobs := nPrompts, round
			switch mode {
			case "static":
				jobs = slices.Clone(round)
				for i := range jobs {
					jobs[i].Out = maxOut
				}
			case "one-at-a-time":
				running = 1
			}
			res, err := benchkit.Round(ctx, m, eng, jobs, running, 512)
			if err != nil {
				return fmt.Errorf("%s: %w", mode, err)
			}
			took, ttft := res.Took, res.TTFT
			tps := float64(useful) / took.Seconds()
			rate[mode] = append(rate[mode], tps)
			if mode == "continuous" {
				ttfts = append(ttfts, ttft...)
			}
			fmt.Fprintf(w, "round %d %-14s %7.2f s  %8.1f useful tokens/s\n", r+1, mode, took.Seconds(), tps)
		}
	}
	// Ratios are taken within each round (the modes of a round ran back
	// to back, so they saw the same machine), then the median over rounds.
	med := benchkit.Median
	ratio := func(a, b string) []float64 {
		r := make([]float64, rounds)
		for i := range r {
			r[i] = rate[a][i] / rate[b][i]
		}
		return r
	}
	fmt.Fprintln(w, "\nmedian useful output tokens/s:")
	for _, mode := range modes {
		fmt.Fprintf(w, "  %-14s %8.1f\n", mode, med(rate[mode]))
	}
	others := []string{"static"}
	if !skipOne {
		others = append(others, "one-at-a-time")
	}
	for _, o := range others {
		r := ratio("continuous", o)
		fmt.Fprintf(w, "continuous / %-14s %.2fx median of rounds %.2f\n", o+":", med(r), r)
	}
	slices.Sort(ttfts)
	q := func(p float64) time.Duration {
		return ttfts[min(len(ttfts)-1, int(math.Ceil(p*float64(len(ttfts))))-1)]
	}
	fmt.Fprintf(w, "continuous time to first token: p50 %v, p99 %v\n", q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond))

	// Single stream against the memory bandwidth limit.
	single := []benchkit.Job{{Prompt: round[0].Prompt, Out: 64}}
	res, err := benchkit.Round(ctx, m, eng, single, 1, 512)
	if err != nil {
		return err
	}
	took := res.Took
	bw := benchkit.ReadBandwidth()
	perToken := float64(m.WeightBytes(dt))
	tps := 64 / took.Seconds()
	fmt.Fprintf(w, "single stream: %.1f tokens/s (prefill included); weights %.0f MiB per token; read bandwidth %.1f GB/s; limit %.1f tokens/s; fraction %.2f\n",
		tps, perToken/(1<<20), bw/1e9, bw/perToken, tps/(bw/perToken))
	return nil
}

// model builds a random Qwen2-style model in memory.
func model(layers, hidden, heads, kvHeads, inter, vocab, ctxLen int) (*llm.Model, error) {
	rng := rand.New(rand.NewPCG(1, 2))
	rnd := func(scale float64, shape ...int) models.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(rng.NormFloat64() * scale)
		}
		return models.Tensor{Shape: shape, Data: data}
	}
	ones := func(n int) models.Tensor {
		t := rnd(0.02, n)
		for i := range t.Data {
			t.Data[i]++
		}
		return t
	}
	d := hidden / heads
	h := hidden
	w := map[string]models.Tensor{"model.embed_tokens.weight": rnd(1, vocab, h), "model.norm.weight": ones(h)}
	sc := 1 / math.Sqrt(float64(h))
	for l := range layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		w[p+"self_attn.q_proj.weight"], w[p+"self_attn.q_proj.bias"] = rnd(sc, heads*d, h), rnd(0.02, heads*d)
		w[p+"self_attn.k_proj.weight"], w[p+"self_attn.k_proj.bias"] = rnd(sc, kvHeads*d, h), rnd(0.02, kvHeads*d)
		w[p+"self_attn.v_proj.weight"], w[p+"self_attn.v_proj.bias"] = rnd(sc, kvHeads*d, h), rnd(0.02, kvHeads*d)
		w[p+"self_attn.o_proj.weight"] = rnd(1/math.Sqrt(float64(heads*d)), h, heads*d)
		w[p+"mlp.gate_proj.weight"], w[p+"mlp.up_proj.weight"] = rnd(sc, inter, h), rnd(sc, inter, h)
		w[p+"mlp.down_proj.weight"] = rnd(1/math.Sqrt(float64(inter)), h, inter)
		w[p+"input_layernorm.weight"], w[p+"post_attention_layernorm.weight"] = ones(h), ones(h)
	}
	cfg := fmt.Sprintf(`{"architectures":["Qwen2ForCausalLM"],"vocab_size":%d,"hidden_size":%d,"num_hidden_layers":%d,
		"num_attention_heads":%d,"num_key_value_heads":%d,"intermediate_size":%d,"max_position_embeddings":%d,
		"rms_norm_eps":1e-6,"rope_theta":1000000,"tie_word_embeddings":true,"eos_token_id":2}`,
		vocab, hidden, layers, heads, kvHeads, inter, ctxLen)
	return llm.NewModel([]byte(cfg), w, llm.ModelOptions{Name: "council-bench", Version: 1})
}
