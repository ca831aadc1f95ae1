package llm

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// byteDetok decodes token id i as the text of table[i], holding back
// incomplete UTF-8 the way a byte-level detokeniser must.
type byteDetok struct {
	table []string
	held  []byte
}

func (d *byteDetok) Next(id int32) string {
	d.held = append(d.held, d.table[id]...)
	n := len(d.held)
	// Keep back a trailing incomplete rune.
	for i := max(0, n-3); i < n; i++ {
		if b := d.held[i]; b >= 0xC0 {
			need := 2
			if b >= 0xE0 {
				need = 3
			}
			if b >= 0xF0 {
				need = 4
			}
			if n-i < need {
				out := string(d.held[:i])
				d.held = append([]byte(nil), d.held[i:]...)
				return out
			}
		}
	}
	out := string(d.held)
	d.held = d.held[:0]
	return out
}

func (d *byteDetok) Flush() string {
	out := string(d.held)
	d.held = nil
	return out
}

// oneHot is logits whose argmax is tok.
func oneHot(v int, tok int32) []float32 {
	x := make([]float32, v)
	x[tok] = 5
	return x
}

func TestSequenceStops(t *testing.T) {
	table := []string{"<eos>", "Hel", "lo", " wor", "ld", "!", "\xe2\x82", "\xac", "EN", "D"}
	run := func(t *testing.T, p Sampling, toks []int32) (text string, stopAt int, s *Sequence) {
		t.Helper()
		s, err := newSequence(p, nil, len(table), []int32{0}, &byteDetok{table: table})
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for i, tok := range toks {
			res, err := s.next(oneHot(len(table), tok))
			if err != nil {
				t.Fatal(err)
			}
			if res.Token != tok {
				t.Fatalf("token %d: got %d", i, res.Token)
			}
			d := res.Out.(Delta)
			b.WriteString(d.Text)
			if len(d.TokenIDs) != 1 || d.TokenIDs[0] != tok {
				t.Fatalf("token %d: delta ids %v", i, d.TokenIDs)
			}
			if res.Stop {
				return b.String(), i, s
			}
		}
		b.WriteString(s.Flush().Text)
		return b.String(), -1, s
	}
	for _, tc := range []struct {
		name   string
		p      Sampling
		toks   []int32
		text   string
		stopAt int
	}{
		{"eos", Sampling{}, []int32{1, 2, 0, 3}, "Hello", 2},
		{"ignore eos", Sampling{IgnoreEOS: true}, []int32{1, 2, 0, 3}, "Hello<eos> wor", -1},
		{"stop id", Sampling{StopTokenIDs: []int32{5}}, []int32{1, 2, 5, 3}, "Hello", 2},
		{"stop string across tokens", Sampling{Stop: []string{"lo wo"}}, []int32{1, 2, 3, 4}, "Hel", 2},
		{"stop string held then released", Sampling{Stop: []string{"lo!"}}, []int32{1, 2, 3, 4}, "Hello world", -1},
		{"earliest stop wins", Sampling{Stop: []string{"world", "o w"}}, []int32{1, 2, 3, 4}, "Hell", 2},
		{"utf-8 split across tokens", Sampling{}, []int32{6, 7, 5}, "€!", -1},
		{"stop after a split rune", Sampling{Stop: []string{"€"}}, []int32{1, 6, 7, 5}, "Hel", 2},
		{"held prefix flushed at the end", Sampling{Stop: []string{"ENDX"}}, []int32{1, 8, 9}, "HelEND", -1},
		{"stop string included", Sampling{Stop: []string{"lo wo"}, IncludeStop: true}, []int32{1, 2, 3, 4}, "Hello wo", 2},
		{"stop string before min_tokens", Sampling{Stop: []string{"lo"}, MinTokens: 3}, []int32{1, 2, 3, 4}, "Hello world", -1},
		{"stop string at min_tokens", Sampling{Stop: []string{"wor"}, MinTokens: 3}, []int32{1, 2, 3, 4}, "Hello ", 2},
		{"stop string completed at min_tokens", Sampling{Stop: []string{"lo wo"}, MinTokens: 3}, []int32{1, 2, 3, 4}, "Hel", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text, stopAt, s := run(t, tc.p, tc.toks)
			if text != tc.text || stopAt != tc.stopAt {
				t.Fatalf("text %q stop at %d, want %q at %d", text, stopAt, tc.text, tc.stopAt)
			}
			if d := s.Flush(); d.Text != "" {
				t.Fatalf("second flush gave %q", d.Text)
			}
		})
	}
}

// TestSequenceMinTokens: before min_tokens neither EOS nor a stop id is
// picked, however likely; at min_tokens they end the sequence.
func TestSequenceMinTokens(t *testing.T) {
	table := []string{"<eos>", "a", "b", "c"}
	for _, p := range []Sampling{{MinTokens: 3}, {MinTokens: 3, StopTokenIDs: []int32{2}}, {MinTokens: 3, Temperature: 1, Seed: 1, Seeded: true}} {
		s, err := newSequence(p, nil, len(table), []int32{0}, &byteDetok{table: table})
		if err != nil {
			t.Fatal(err)
		}
		end := int32(0)
		if len(p.StopTokenIDs) > 0 {
			end = p.StopTokenIDs[0]
		}
		for i := range 4 {
			logits := make([]float32, len(table))
			logits[end] = 30 // all but certain
			res, err := s.next(logits)
			if err != nil {
				t.Fatal(err)
			}
			if stop := i == 3; res.Stop != stop || stop != (res.Token == end) {
				t.Fatalf("%+v: token %d is %d (stop %v)", p, i, res.Token, res.Stop)
			}
		}
	}
	if err := (Sampling{MinTokens: -1}).Validate(); err == nil {
		t.Error("min_tokens -1 passed")
	}
}

func TestSequenceSampling(t *testing.T) {
	v := 50
	logits := make([]float32, v)
	for i := range logits {
		logits[i] = float32(math.Sin(float64(i)) * 3)
	}
	draw := func(p Sampling, n int) []int32 {
		s, err := newSequence(p, []int32{1, 2}, v, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]int32, n)
		for i := range out {
			res, err := s.next(logits)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = res.Token
		}
		return out
	}
	seeded := Sampling{Temperature: 1, Seed: 7, Seeded: true}
	a, b := draw(seeded, 64), draw(seeded, 64)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different tokens: %v vs %v", a, b)
	}
	distinct := map[int32]bool{}
	for _, tok := range a {
		distinct[tok] = true
	}
	if len(distinct) < 3 {
		t.Fatalf("temperature 1 drew only %v", distinct)
	}
	best := refArgmax(logits)
	for _, tok := range draw(Sampling{Temperature: 1, TopK: 1, Seed: 1, Seeded: true}, 20) {
		if tok != best {
			t.Fatalf("top_k 1 drew %d, want %d", tok, best)
		}
	}
	for _, tok := range draw(Sampling{Temperature: 2, MinP: 0.9999, Seed: 1, Seeded: true}, 20) {
		if tok != best {
			t.Fatalf("min_p 0.9999 drew %d, want %d", tok, best)
		}
	}
	for _, tok := range draw(Sampling{Temperature: 1, TopP: 1e-6, Seed: 1, Seeded: true}, 20) {
		if tok != best {
			t.Fatalf("top_p 1e-6 drew %d, want %d", tok, best)
		}
	}
	// A frequency penalty large enough moves greedy off a repeated token.
	g := draw(Sampling{FrequencyPenalty: 2}, 6)
	if g[0] != best || g[1] == best && g[2] == best && g[3] == best {
		t.Fatalf("frequency penalty: %v", g)
	}
	// logit_bias: +100 all but forces a token, -100 bans the best, greedy
	// or drawn; logprobs stay the model's.
	other := int32((best + 7) % int32(v))
	for _, p := range []Sampling{{LogitBias: map[int32]float32{other: 100}}, {Temperature: 1, LogitBias: map[int32]float32{other: 100}}} {
		if g := draw(p, 5); !slices.Equal(g, []int32{other, other, other, other, other}) {
			t.Fatalf("%+v drew %v, want %d", p, g, other)
		}
	}
	for _, tok := range draw(Sampling{Temperature: 1, Seed: 3, Seeded: true, LogitBias: map[int32]float32{best: -100}}, 50) {
		if tok == best {
			t.Fatalf("logit_bias -100 on %d drew it", best)
		}
	}
	s, _ := newSequence(Sampling{Logprobs: true, LogitBias: map[int32]float32{other: 100}}, nil, v, nil, nil)
	res, _ := s.next(logits)
	if lp := res.Out.(Delta).Logprobs; res.Token != other || lp[0].Logprob > -1 {
		t.Fatalf("biased pick %d, logprob %v: want %d at the model's logprob", res.Token, lp[0].Logprob, other)
	}
	// Logprobs: the chosen token's and the top alternatives, descending.
	s, _ = newSequence(Sampling{Logprobs: true, TopLogprobs: 3}, nil, v, nil, nil)
	res, _ = s.next(logits)
	lp := res.Out.(Delta).Logprobs
	if len(lp) != 1 || len(lp[0].Top) != 3 || lp[0].Top[0].Token != best || lp[0].Token != best ||
		lp[0].Top[0].Logprob < lp[0].Top[1].Logprob || lp[0].Top[1].Logprob < lp[0].Top[2].Logprob || lp[0].Logprob >= 0 {
		t.Fatalf("logprobs %+v", lp)
	}
}

func TestSamplingValidate(t *testing.T) {
	for _, p := range []Sampling{
		{Temperature: -1}, {Temperature: float32(math.NaN())}, {TopP: 1.5}, {TopK: -1}, {MinP: 2},
		{RepetitionPenalty: -1}, {PresencePenalty: 3}, {FrequencyPenalty: -3}, {TopLogprobs: 21}, {Stop: []string{""}},
		{LogitBias: map[int32]float32{1: 101}}, {LogitBias: map[int32]float32{1: float32(math.NaN())}}, {LogitBias: map[int32]float32{10: 1}},
		{LogitBias: map[int32]float32{-1: 1}}, {LogitBias: manyBiases(MaxLogitBias + 1)},
	} {
		if _, err := newSequence(p, nil, 10, nil, &byteDetok{}); !errors.Is(err, ErrInvalidSampling) {
			t.Errorf("%+v: %v, want ErrInvalidSampling", p, err)
		}
	}
	if _, err := newSequence(Sampling{Stop: []string{"x"}}, nil, 10, nil, nil); !errors.Is(err, ErrInvalidSampling) {
		t.Errorf("stop strings without a tokenizer: %v", err)
	}
}

func manyBiases(n int) map[int32]float32 {
	m := make(map[int32]float32, n)
	for i := range n {
		m[int32(-i)] = 1 // the count is checked before the ids
	}
	return m
}

// TestStepResults checks Step's flags and its refusals of steps that do
// not continue the caches.
func TestStepResults(t *testing.T) {
	ctx := context.Background()
	s := tinyNet("llama")
	e := newTestEngine(t, &goDevice{}, s, 3, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4})
	seq, err := newSequence(Sampling{IgnoreEOS: true}, nil, s.Vocab, []int32{0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := prompt(s.Context-1, 9, s.Vocab)
	if !e.Reserve(1, len(p)) {
		t.Fatal("reserve")
	}
	// A cancelled step fails and leaves the cache where it was.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.Step(cancelled, []SeqStep{{Seq: 1, State: seq, Tokens: p, Pos: 0, Sample: true}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled step: %v", err)
	}
	res, err := e.Step(ctx, []SeqStep{{Seq: 1, State: seq, Tokens: p, Pos: 0, Sample: true}})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Full || res[0].Stop {
		t.Fatalf("a token at the context's last position: %+v, want Full", res[0])
	}
	bad := []struct {
		name  string
		items []SeqStep
	}{
		{"not reserved", []SeqStep{{Seq: 2, State: seq, Tokens: []int32{1}, Sample: true}}},
		{"position gap", []SeqStep{{Seq: 1, State: seq, Tokens: []int32{1}, Pos: len(p) + 1, Sample: true}}},
		{"past the reservation", []SeqStep{{Seq: 1, State: seq, Tokens: []int32{1, 2}, Pos: len(p), Sample: true}}},
		{"twice", []SeqStep{{Seq: 1, Tokens: []int32{1}, Pos: len(p)}, {Seq: 1, Tokens: []int32{1}, Pos: len(p)}}},
		{"outside the vocabulary", []SeqStep{{Seq: 1, Tokens: []int32{int32(s.Vocab)}, Pos: len(p)}}},
		{"no tokens", []SeqStep{{Seq: 1, Pos: len(p)}}},
		{"no state", []SeqStep{{Seq: 1, Tokens: []int32{1}, Pos: len(p), Sample: true}}},
		{"empty", nil},
	}
	for _, b := range bad {
		if _, err := e.Step(ctx, b.items); !errors.Is(err, ErrInvalidStep) {
			t.Errorf("%s: %v, want ErrInvalidStep", b.name, err)
		}
	}
	e.Close()
	if _, err := e.Step(ctx, []SeqStep{{Seq: 1, Tokens: []int32{1}, Pos: len(p)}}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

func refArgmax(x []float32) int32 {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return int32(b)
}

func TestTopN(t *testing.T) {
	x := make([]float64, 500)
	for i := range x {
		x[i] = math.Round(math.Sin(float64(i)*1.7)*20) / 4 // many ties
	}
	cmp := func(a, b int32) int {
		if x[a] != x[b] {
			if x[a] > x[b] {
				return -1
			}
			return 1
		}
		return int(a - b)
	}
	x[3], x[499] = math.NaN(), math.NaN() // left out
	for _, n := range []int{1, 2, 7, 64} {
		var want []int32
		for i := range x {
			if !math.IsNaN(x[i]) {
				want = append(want, int32(i))
			}
		}
		slices.SortFunc(want, cmp)
		if got := topN(x, n, cmp, make([]int32, len(x))); !slices.Equal(got, want[:n]) {
			t.Fatalf("n=%d: %v, want %v", n, got, want[:n])
		}
	}
}

// TestNonFiniteLogits: a broken model's logits (NaN, infinite: a file's
// weights can make them so) give every sampler a token, never a panic:
// +Inf tokens are drawn uniformly (the softmax's limit), NaN ones never,
// and with every logit NaN or -Inf the greedy rule's token stands.
func TestNonFiniteLogits(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	samplers := []Sampling{{}, {Temperature: 0.8}, {Temperature: 0.8, TopK: 2}, {Temperature: 0.8, TopK: 100},
		{Temperature: 0.8, TopP: 0.5}, {Temperature: 0.8, MinP: 0.5}, {Temperature: 0.8, Logprobs: true, TopLogprobs: 2}}
	for _, c := range []struct {
		logits []float32
		want   []int32 // the tokens a draw may give
	}{
		{[]float32{nan, nan, nan}, []int32{0}},
		{[]float32{float32(math.Inf(-1)), float32(math.Inf(-1))}, []int32{0}},
		{[]float32{inf, 1, 2}, []int32{0}},
		{[]float32{1, inf, nan, inf}, []int32{1, 3}},
		{[]float32{nan, 1, 30, nan}, []int32{2}},
		{[]float32{2, nan, 30, nan, 1}, []int32{2}},
	} {
		for _, p := range samplers {
			p.Seeded = true
			s, err := newSequence(p, nil, len(c.logits), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			for range 8 {
				res, err := s.next(c.logits)
				if err != nil {
					t.Fatalf("%v %+v: %v", c.logits, p, err)
				}
				if !slices.Contains(c.want, res.Token) && !(p.Temperature == 0 && res.Token == int32(refArgmax(c.logits))) {
					t.Fatalf("%v %+v: token %d, want one of %v", c.logits, p, res.Token, c.want)
				}
				s.counts = map[int32]int{}
			}
		}
	}
}

// TestTopPMatchesFullSort checks the nucleus found through headHolding
// against the nucleus of the fully sorted vocabulary, by drawing with the
// same seed both ways.
func TestTopPMatchesFullSort(t *testing.T) {
	v := 5000
	logits := make([]float32, v)
	for i := range logits {
		logits[i] = float32(math.Sin(float64(i)*0.37)*4 + math.Cos(float64(i)*0.011)*3)
	}
	for _, tp := range []float32{0.01, 0.5, 0.9, 0.999} {
		p := Sampling{Temperature: 0.9, TopP: tp, Seed: 5, Seeded: true}
		s, _ := newSequence(p, nil, v, nil, nil)
		// The reference: every token sorted, the prefix reaching top_p.
		x := make([]float64, v)
		m := float64(slices.Max(logits))
		var sum float64
		for i, l := range logits {
			x[i] = math.Exp((float64(l) - m) / 0.9)
			sum += x[i]
		}
		order := make([]int32, v)
		for i := range order {
			order[i] = int32(i)
		}
		slices.SortFunc(order, func(a, b int32) int {
			if x[a] != x[b] {
				if x[a] > x[b] {
					return -1
				}
				return 1
			}
			return int(a - b)
		})
		var acc float64
		n := 0
		for n < v {
			acc += x[order[n]]
			n++
			if acc >= float64(tp)*sum {
				break
			}
		}
		nucleus := map[int32]bool{}
		for _, i := range order[:n] {
			nucleus[i] = true
		}
		for range 200 {
			res, err := s.next(logits)
			if err != nil {
				t.Fatal(err)
			}
			if !nucleus[res.Token] {
				t.Fatalf("top_p %g drew %d, outside the nucleus of %d tokens", tp, res.Token, n)
			}
			s.counts = map[int32]int{}
		}
	}
}

// TestSequencesHoldNoSamplerBuffers: a sequence borrows its [V] sampling
// buffers for one step only (Hardening II, finding 3): a call of 4,096
// prompts over Qwen's 151,936-token vocabulary held 1.8 MB per prompt
// (7 GB) until its last sequence ended. Here 256 sequences that each
// sampled once (every eighth at a temperature, with top-k and top-p) must
// hold well under what one buffer each would (0.3 GB).
func TestSequencesHoldNoSamplerBuffers(t *testing.T) {
	const v, n = 151936, 256
	pool := NewScratchPool(v)
	logits := make([]float32, v)
	for i := range logits {
		logits[i] = float32(i%97) / 10
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	seqs := make([]*Sequence, n)
	for i := range seqs {
		p := Sampling{Seed: uint64(i), Seeded: true}
		if i%8 == 0 {
			p.Temperature, p.TopP, p.TopK = 0.8, 0.9, 100
		}
		s, err := newSequence(p, []int32{1, 2, 3}, v, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		s.scratch = pool
		if _, err := s.next(logits); err != nil {
			t.Fatal(err)
		}
		seqs[i] = s
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if perSeq := held / n; perSeq > 64<<10 {
		t.Errorf("%d sequences hold %d MB after one step each: %d KB per sequence, want well under one [V] buffer (%d KB)",
			n, held>>20, perSeq>>10, (v*12)>>10)
	}
	runtime.KeepAlive(seqs)
}

// TestPlainGreedyMatchesPick: the greedy path without a float64 copy picks
// what pick picks from the converted logits, ties (the lowest id) and NaNs
// included; a penalty or a temperature leaves the plain path.
func TestPlainGreedyMatchesPick(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	nan := float32(math.NaN())
	cases := [][]float32{{1, 3, 3, 2}, {nan, 1, 2}, {1, nan, 5, 5}, {-1, -1, -1}, {float32(math.Inf(1)), 2, float32(math.Inf(1))}}
	for i := range 20 {
		x := make([]float32, 1000+i%9) // argmax32 runs 8 lanes, then the rest
		for i := range x {
			x[i] = float32(math.Round(rng.NormFloat64()*8) / 4) // ties
		}
		cases = append(cases, x)
	}
	tail := make([]float32, 13) // the largest past the last whole 8, after a NaN
	tail[3], tail[12] = nan, 1
	cases = append(cases, tail, []float32{2, nan, 2, 9, 9, 1, 1, 1, 1, 9})
	for lane := range 8 { // the largest in one lane only
		x := make([]float32, 16)
		x[8+lane] = 5
		cases = append(cases, x)
	}
	for _, x := range cases {
		s, err := newSequence(Sampling{}, nil, len(x), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !s.plainGreedy() {
			t.Fatal("greedy sampling is not plain")
		}
		xf := make([]float64, len(x))
		for i, v := range x {
			xf[i] = float64(v)
		}
		if got, want := argmax32(x), s.pick(xf, make([]int32, len(x))); got != want {
			t.Errorf("%v: argmax32 %d, pick %d", x[:min(len(x), 5)], got, want)
		}
	}
	for _, p := range []Sampling{{Temperature: 0.7}, {RepetitionPenalty: 1.1}, {PresencePenalty: 0.5}, {FrequencyPenalty: 0.5}} {
		s, err := newSequence(p, nil, 10, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if s.plainGreedy() {
			t.Errorf("%+v: taken as plain greedy", p)
		}
	}
}
