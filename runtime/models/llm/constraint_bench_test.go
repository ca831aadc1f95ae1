package llm

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
)

// benchToolSchema is a tool's parameters of 20 properties, as agents write
// them (the grammar package's benchmark schema).
const benchToolSchema = `{"type":"object","properties":{
 "query":{"type":"string","description":"search terms"},"limit":{"type":"integer","minimum":1,"maximum":100},
 "offset":{"type":"integer","minimum":0},"sort":{"type":"string","enum":["relevance","date","popularity"]},
 "ascending":{"type":"boolean"},"language":{"type":"string"},"region":{"type":"string"},
 "from_date":{"type":"string","format":"date"},"to_date":{"type":"string","format":"date"},
 "include_domains":{"type":"array","items":{"type":"string"}},"exclude_domains":{"type":"array","items":{"type":"string"}},
 "safe_search":{"type":"string","enum":["off","moderate","strict"]},"min_score":{"type":"number"},
 "user":{"type":"object","properties":{"id":{"type":"string"},"role":{"type":"string","enum":["admin","user"]}},"required":["id"]},
 "fields":{"type":"array","items":{"type":"string","enum":["title","url","snippet","date"]},"maxItems":4},
 "timeout_ms":{"type":"integer"},"retry":{"type":"boolean"},"format":{"type":"string","enum":["json","text"]},
 "note":{"type":["string","null"]},"page_token":{"type":"string"}
},"required":["query","limit","sort"],"additionalProperties":false}`

// qwenGrammarVocab is the grammar vocabulary of Qwen's 151,936 logits
// with Qwen3's real tokenizer (Qwen2.5's BPE vocabulary and its special
// tokens; ids past the tokenizer's are nil, as the model pads them).
func qwenGrammarVocab(tb testing.TB, size int) *grammar.Vocab {
	tb.Helper()
	dir := filepath.Join("..", "tokenizer", "bpe", "testdata", "qwen3")
	f, err := os.Open(filepath.Join(dir, "tokenizer.json.zst"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	d, err := zstd.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	defer d.Close()
	tj, err := io.ReadAll(d)
	if err != nil {
		tb.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		tb.Fatal(err)
	}
	tok, err := bpe.Parse(tj, cfg, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tokens := make([][]byte, size)
	for id := range min(size, tok.VocabSize()) {
		if !tok.IsSpecial(int32(id)) {
			tokens[id] = tok.TokenBytes(int32(id))
		}
	}
	v, err := grammar.NewVocab(tokens, tok.EOSIDs())
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// BenchmarkConstrainedDecode: 16 sequences decode together on
// Qwen2.5-0.5B's shape (LLM_BENCH_SMALL: 6 of its 24 layers) in f32 at
// temperature 1, over its 151,936-token vocabulary with Qwen3's real
// tokenizer: free, and each under a 20-property tool schema (masks
// computed while the forward runs, as Engine.Step does). Each benchmark
// iteration is one round of both, interleaved, so a loaded machine slows
// both alike; it reports decode tokens/s of each, their ratio, and the
// wall time per step of the 16 masks (computed in parallel, before a step
// in a third run). A constrained sequence that completes its JSON starts
// it again. Also: the cold compile of the schema, and a cached Get.
// Run with -benchtime=4x or so (each round is 3×32 steps; the context
// of 1024 holds 10 rounds).
func BenchmarkConstrainedDecode(b *testing.B) {
	s := qwen05()
	if os.Getenv("LLM_BENCH_SMALL") != "" {
		s.Layers = 6
	}
	ctx := context.Background()
	v := qwenGrammarVocab(b, s.Vocab)
	cache := grammar.NewCache(256<<20, grammar.Limits{})
	t0 := time.Now()
	g, err := cache.Get(ctx, v, grammar.KindJSONSchema, benchToolSchema)
	if err != nil {
		b.Fatal(err)
	}
	compile := time.Since(t0)
	t0 = time.Now()
	if _, err := cache.Get(ctx, v, grammar.KindJSONSchema, benchToolSchema); err != nil {
		b.Fatal(err)
	}
	cached := time.Since(t0)

	dev := openBenchDevice(b, runtime.F32)
	e, err := newEngine(ctx, dev, s, fastWeights(s), EngineOptions{CacheBytes: 1 << 30, MaxStepTokens: 1024})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	const n, steps = 16, 32
	eos := v.EOS()
	free := make([]*Sequence, n)
	constrained := make([]*Sequence, n)
	items := make([]SeqStep, n)
	for i := range n {
		p := Sampling{Temperature: 1, Seed: uint64(i), Seeded: true, IgnoreEOS: true}
		free[i], _ = newSequence(p, nil, s.Vocab, eos, nil)
		p.IgnoreEOS = false
		constrained[i], _ = newSequence(p, nil, s.Vocab, eos, nil)
		m, err := g.NewMatcher()
		if err != nil {
			b.Fatal(err)
		}
		constrained[i].con = &constraintState{m: m, mask: make([]uint64, v.MaskWords())}
		items[i] = SeqStep{Seq: uint64(i + 1), Tokens: prompt(16, int32(i), s.Vocab), Sample: true, State: free[i]}
		if !e.Reserve(items[i].Seq, s.Context) {
			b.Fatal("reserve")
		}
	}
	defer func() {
		for _, it := range items {
			e.Release(it.Seq)
		}
	}()
	// run decodes steps with states; premask computes the masks before
	// each step (timed) instead of during it.
	run := func(states []*Sequence, premask bool) (perStep, maskPerStep time.Duration) {
		for i := range items {
			items[i].State = states[i]
		}
		var masks time.Duration
		start := time.Now()
		for range steps {
			if items[0].Pos+1 >= s.Context {
				b.Skip("context full: fewer rounds")
			}
			if premask {
				t := time.Now()
				e.waitMasks(e.startMasks(items), 0)
				masks += time.Since(t)
			}
			res, err := e.Step(ctx, items)
			if err != nil {
				b.Fatal(err)
			}
			for i, r := range res {
				st := states[i]
				if r.End != "" || r.Stop {
					// A complete (or dead-ended) answer: start another.
					st.stopped = false
					if st.con != nil {
						st.con.m.Reset()
						st.con.ready = false
					}
				}
				tok := r.Token
				if r.End != "" {
					tok = items[i].Tokens[len(items[i].Tokens)-1]
				}
				items[i].Pos += len(items[i].Tokens)
				items[i].Tokens = []int32{tok}
			}
		}
		return time.Since(start) / steps, masks / steps
	}
	run(free, false) // the prompts' prefill, the primitives' creation
	var freeT, conT, maskT []time.Duration
	b.ResetTimer()
	for r := range b.N {
		// Which runs first alternates, so a load that comes and goes
		// does not favour one.
		var f, c, m time.Duration
		if r%2 == 0 {
			f, _ = run(free, false)
			c, _ = run(constrained, false)
			_, m = run(constrained, true)
		} else {
			_, m = run(constrained, true)
			c, _ = run(constrained, false)
			f, _ = run(free, false)
		}
		freeT, conT, maskT = append(freeT, f), append(conT, c), append(maskT, m)
		b.Logf("round %d: free %.1f tok/s, schema %.1f tok/s (%.3f), 16 masks %.2f ms/step", r,
			n/f.Seconds(), n/c.Seconds(), f.Seconds()/c.Seconds(), float64(m.Microseconds())/1000)
	}
	b.StopTimer()
	med := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	var ratios []float64
	for i := range freeT {
		ratios = append(ratios, freeT[i].Seconds()/conT[i].Seconds())
	}
	slices.Sort(ratios)
	b.ReportMetric(n/med(freeT).Seconds(), "free-tok/s")
	b.ReportMetric(n/med(conT).Seconds(), "schema-tok/s")
	b.ReportMetric(ratios[len(ratios)/2], "ratio")
	b.ReportMetric(float64(med(maskT).Microseconds())/1000, "mask-ms/step")
	b.ReportMetric(float64(compile.Microseconds())/1000, "compile-ms")
	b.ReportMetric(float64(cached.Microseconds())/1000, "cached-ms")
}

// BenchmarkGrammarVocab is what a model's first constrained request pays
// once: the grammar vocabulary (the trie of 151,936 token byte strings)
// from Qwen3's real tokenizer, special tokens left out.
func BenchmarkGrammarVocab(b *testing.B) {
	v := qwenGrammarVocab(b, 151936)
	tokens := make([][]byte, v.Size())
	for id := range tokens {
		tokens[id] = v.Token(int32(id))
	}
	eos := v.EOS()
	b.ResetTimer()
	for range b.N {
		if _, err := grammar.NewVocab(tokens, eos); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(v.SizeBytes())/(1<<20), "MiB")
}

// benchVerdictSchema is a council advisor's verdict: keys in order, an
// enum, a number and a short reason.
const benchVerdictSchema = `{"type":"object","properties":{
 "verdict":{"type":"string","enum":["approve","reject","abstain"]},
 "confidence":{"type":"number","minimum":0,"maximum":1},
 "reason":{"type":"string","maxLength":48}
},"required":["verdict","confidence","reason"],"additionalProperties":false}`

// BenchmarkConstrainedSpec is one stream writing JSON verdicts under
// benchVerdictSchema (Qwen's real vocabulary, Qwen2.5-0.5B's shape with
// Q8_0 weights, temperature 1) without and with speculative decoding (up
// to 4 guesses a step: the tokens the grammar allows alone, and the
// lookup's where the grammar allows them), alternated: tokens/s of each
// and the share of guesses taken.
func BenchmarkConstrainedSpec(b *testing.B) {
	s := benchContext(qwen05())
	if os.Getenv("LLM_BENCH_SMALL") != "" {
		s.Layers = 6
	}
	ctx := context.Background()
	v := qwenGrammarVocab(b, s.Vocab)
	g, err := grammar.NewCache(64<<20, grammar.Limits{}).Get(ctx, v, grammar.KindJSONSchema, benchVerdictSchema)
	if err != nil {
		b.Fatal(err)
	}
	dev := openBenchDevice(b, runtime.F32)
	e, err := newEngine(ctx, dev, s, quantizeFast(fastWeights(s), runtime.Q8_0), EngineOptions{CacheBytes: 1 << 30, MaxStepTokens: 1024, MaxDrafts: 8, KVDType: benchKVDType()})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	const answers = 4
	// run writes answers verdicts from seeds first, first+1, ... (the same
	// answers with and without guesses) and returns the tokens written,
	// the seconds, and the guesses made and taken.
	steps := [2]int{}
	run := func(first uint64, draft int) (tokens int, secs float64, drafted, taken int) {
		start := time.Now()
		for a := range uint64(answers) {
			seed := first + a
			p := prompt(24, int32(seed%7), s.Vocab)
			seq, _ := newSequence(Sampling{Temperature: 1, Seed: seed, Seeded: true}, p, s.Vocab, v.EOS(), nil)
			m, err := g.NewMatcher()
			if err != nil {
				b.Fatal(err)
			}
			seq.con = &constraintState{m: m, mask: make([]uint64, v.MaskWords())}
			it := SeqStep{Seq: 1, State: seq, Tokens: p, Sample: true, History: slices.Clone(p)}
			for n := 0; n < 200; {
				// A step gives back its refused guesses' room.
				if !e.Reserve(1, min(it.Pos+len(it.Tokens)+it.Draft, s.Context)) {
					b.Fatal("reserve")
				}
				res, err := e.Step(ctx, []SeqStep{it})
				if err != nil {
					b.Fatal(err)
				}
				r := res[0]
				steps[min(draft, 1)]++
				drafted, taken = drafted+r.Drafted, taken+len(r.Accepted)
				n += len(r.Accepted) + 1
				tokens += len(r.Accepted) + 1
				if r.Stop || r.End != "" {
					break
				}
				it.Pos += len(it.Tokens) + len(r.Accepted)
				it.Tokens, it.Draft = []int32{r.Token}, draft
				it.History = append(append(it.History, r.Accepted...), r.Token)
			}
			e.Release(1)
		}
		return tokens, time.Since(start).Seconds(), drafted, taken
	}
	run(1000, 0) // the primitives
	var rates [2][]float64
	var drafted, taken int
	b.ResetTimer()
	for r := range b.N {
		for k := range 2 {
			d := []int{0, 4}[(r+k)%2]
			n, secs, dr, tk := run(uint64(r*answers), d)
			rates[min(d, 1)] = append(rates[min(d, 1)], float64(n)/secs)
			drafted, taken = drafted+dr, taken+tk
		}
	}
	b.StopTimer()
	med := func(x []float64) float64 {
		x = slices.Clone(x)
		slices.Sort(x)
		return x[len(x)/2]
	}
	b.ReportMetric(med(rates[0]), "plain-tok/s")
	b.ReportMetric(med(rates[1]), "spec-tok/s")
	b.ReportMetric(med(rates[1])/med(rates[0]), "ratio")
	b.ReportMetric(float64(taken)/float64(max(drafted, 1)), "taken")
	b.ReportMetric(float64(steps[0])/float64(max(steps[1], 1)), "steps-saved")
}
