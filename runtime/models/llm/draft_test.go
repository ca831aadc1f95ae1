package llm

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
)

func TestProposeNgram(t *testing.T) {
	for _, tc := range []struct {
		name string
		hist []int32
		k    int
		want []int32
	}{
		{"too short", []int32{1, 2, 3}, 4, nil},
		{"no match", []int32{1, 2, 3, 4, 5, 6, 7}, 4, nil},
		{"two tokens are not enough", []int32{1, 2, 9, 9, 1, 2}, 4, nil},
		{"three tokens", []int32{1, 2, 3, 7, 8, 1, 2, 3}, 4, []int32{7, 8, 1, 2}},
		{"cut at k", []int32{1, 2, 3, 7, 8, 9, 6, 1, 2, 3}, 2, []int32{7, 8}},
		{"cut at the end", []int32{1, 2, 3, 7, 1, 2, 3}, 4, []int32{7, 1, 2, 3}},
		// The longest match wins over an earlier shorter one.
		{"longest", []int32{2, 3, 4, 10, 1, 2, 3, 4, 20, 1, 2, 3, 4}, 1, []int32{20}},
		// Of equally long matches, the earliest (vLLM's choice).
		{"earliest", []int32{1, 2, 3, 10, 1, 2, 3, 20, 1, 2, 3}, 1, []int32{10}},
		// Matches longer than ngramMax count as ngramMax: the earliest.
		{"capped", []int32{5, 1, 2, 3, 4, 6, 30, 9, 1, 2, 3, 4, 6, 40, 1, 2, 3, 4, 6}, 1, []int32{30}},
		// One token repeated (an untrained model's greedy output).
		{"repeat", []int32{7, 5, 5, 5, 5}, 3, []int32{5}},
		{"repeat longer", []int32{7, 5, 5, 5, 5, 5, 5, 5, 5}, 3, []int32{5, 5, 5}},
		{"k 0", []int32{1, 2, 3, 7, 1, 2, 3}, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := proposeNgram(tc.hist, tc.k); !slices.Equal(got, tc.want) {
				t.Errorf("proposeNgram(%v, %d) = %v, want %v", tc.hist, tc.k, got, tc.want)
			}
		})
	}
}

// TestSpeculativeSameOutput: sequences that may guess up to 4 tokens a
// step give the tokens, text and finish they give without guesses, and
// the same logprobs up to rounding, greedy, seeded sampling with
// penalties, under a JSON schema, with stop strings, and up to the
// context's end. (Not the same bits: oneDNN's f32 products are
// row-invariant, but the CPU's attention runs a decode token's heads on
// the group kernel and several tokens of a sequence on the row kernel,
// which sum in another order; for head dims under 16 both are the
// portable kernel.) A model of the usual scale repeats itself (guesses
// taken) and a flat one samples all over (guesses mostly refused).
func TestSpeculativeSameOutput(t *testing.T) {
	schema := &Constraint{Kind: grammar.KindJSONSchema, Source: testSchema}
	seeded := Sampling{Temperature: 0.9, TopK: 40, TopP: 0.95, MinP: 0.01, Seed: 7, Seeded: true, RepetitionPenalty: 1.1, FrequencyPenalty: 0.2}
	params := []Sampling{
		{},
		{Logprobs: true, TopLogprobs: 3},
		{Stop: []string{"e", "ab"}},
		{IgnoreEOS: true, Seed: 3, Seeded: true, Temperature: 0.3},
		seeded,
		{Temperature: 1, Seed: 11, Seeded: true, Constraint: schema, Logprobs: true},
		// Guesses inside a thinking block are the lookup's, up to its close.
		{Temperature: 1, Seed: 13, Seeded: true, Constraint: schema, ThinkFirst: &ThinkFirst{
			Open: int32(slices.Index(testVocab().toks, "<")), Close: int32(slices.Index(testVocab().toks, ">")), InBlock: true}},
	}
	var total specCount
	for _, tc := range []struct {
		name   string
		scale  float32
		prompt []int32
		maxNew int
		params []Sampling
	}{
		{"peaked", 1, prompt(20, 3, 96), 40, params},
		{"flat", 0.05, prompt(20, 3, 96), 40, params},
		{"peaked to the context's end", 1, prompt(490, 5, 96), 100, params[:4]}, // 4 prompts fill a step
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, e := vocabModel(t, ModelOptions{}, tc.scale, EngineOptions{MaxDrafts: 64})
			params := tc.params
			want, none := generateSpec(t, m, e, params, tc.prompt, tc.maxNew, 0)
			if none != (specCount{}) {
				t.Fatalf("guesses without Draft: %+v", none)
			}
			got, count := generateSpec(t, m, e, params, tc.prompt, tc.maxNew, 4)
			total.drafted += count.drafted
			total.accepted += count.accepted
			t.Logf("%d guessed, %d taken", count.drafted, count.accepted)
			for i := range params {
				w, g := want[i], got[i]
				if !slices.Equal(g.tokens, w.tokens) || g.text != w.text || g.finish != w.finish {
					t.Fatalf("params %d: with guesses %v %q (%s), without %v %q (%s)", i, g.tokens, g.text, g.finish, w.tokens, w.text, w.finish)
				}
				if len(g.logprobs) != len(w.logprobs) {
					t.Fatalf("params %d: %d logprobs with guesses, %d without", i, len(g.logprobs), len(w.logprobs))
				}
				for k := range w.logprobs {
					if !nearLogprob(g.logprobs[k], w.logprobs[k]) {
						t.Fatalf("params %d token %d: logprob %+v with guesses, %+v without", i, k, g.logprobs[k], w.logprobs[k])
					}
				}
			}
			if used, _ := e.CacheBlocks(); used != 0 {
				t.Errorf("%d cache blocks held after every sequence ended", used)
			}
		})
	}
	// Refusals are TestSpeculativeCacheRows's (there by construction; here
	// they depend on the CPU's rounding of near ties).
	if total.accepted == 0 {
		t.Fatalf("guesses %+v: the test needs some taken", total)
	}
}

// nearLogprob says whether a and b are the same tokens with logprobs
// within 1e-5: the rounding of attention's summation order (measured:
// 1e-9 to 1e-6), far below what a cache row of another token changes.
func nearLogprob(a, b Logprob) bool {
	near := func(x, y TokenLogprob) bool {
		return x.Token == y.Token && math.Abs(float64(x.Logprob-y.Logprob)) <= 1e-5
	}
	return near(a.TokenLogprob, b.TokenLogprob) && slices.EqualFunc(a.Top, b.Top, near)
}

// TestSpeculativeCacheRows: the cache blocks a guessing sequence filled
// hold its tokens, not guesses it refused: a later prompt that repeats
// its output maps those blocks (prefix caching) and continues as it does
// on an engine that computes every row.
func TestSpeculativeCacheRows(t *testing.T) {
	m, e := vocabModel(t, ModelOptions{}, 1, EngineOptions{MaxDrafts: 8})
	// This model repeats the prompt's last token; a prompt that has it
	// three times before other tokens makes the lookup guess those
	// (refused) until the output's own repeats are the longer match (taken).
	const q = 80
	p := append(prompt(20, 9, 96), q, q, q, 77, 78, 79, q)
	for _, temp := range []float32{0, 0.5} {
		params := []Sampling{{IgnoreEOS: true, Temperature: temp, Seed: 5, Seeded: true}}
		first, count := generateSpec(t, m, e, params, p, 60, 6)
		t.Logf("temperature %g: %d guessed, %d taken", temp, count.drafted, count.accepted)
		if count.accepted == 0 || count.accepted == count.drafted {
			t.Fatalf("temperature %g: %d guessed, %d taken: the test needs both", temp, count.drafted, count.accepted)
		}
		again := append(slices.Clone(p), first[0].tokens[:38]...) // 4 blocks of 16 and a token
		before := e.Stats().CachedTokens
		greedy := []Sampling{{IgnoreEOS: true, Logprobs: true, TopLogprobs: 5}}
		got := generate(t, m, e, greedy, again, 8)
		if shared := e.Stats().CachedTokens - before; shared < 64 {
			t.Fatalf("temperature %g: %d prompt tokens shared, want the 4 blocks the first sequence filled", temp, shared)
		}
		_, fresh := vocabModel(t, ModelOptions{}, 1, EngineOptions{DisablePrefixCache: true})
		want := generate(t, m, fresh, greedy, again, 8)
		if !slices.Equal(got[0].tokens, want[0].tokens) || !slices.EqualFunc(got[0].logprobs, want[0].logprobs, nearLogprob) {
			t.Fatalf("temperature %g: after shared blocks %v %v, computed %v %v", temp, got[0].tokens, got[0].logprobs, want[0].tokens, want[0].logprobs)
		}
	}
}

// TestSpeculativeBounds: an engine guesses no more than SeqStep.Draft,
// EngineOptions.MaxDrafts over the step, the context or the sequence's
// reserved cache leave; none without MaxDrafts. A Draft without room is
// the caller's slip, and a guess is never worth failing a step for.
func TestSpeculativeBounds(t *testing.T) {
	ctx := context.Background()
	repeat := func(n int) []int32 { // a prompt whose lookup always guesses
		p := make([]int32, n)
		for i := range p {
			p[i] = 40
		}
		return p
	}
	for _, tc := range []struct {
		name      string
		maxDrafts int
		draft     []int
		promptLen int
		want      []int // guesses run per item
	}{
		{"off", 0, []int{4, 4}, 20, []int{0, 0}},
		{"per item", 64, []int{3, 5}, 20, []int{3, 5}},
		{"per step", 6, []int{4, 4}, 20, []int{4, 2}},
		{"context", 64, []int{8}, 508, []int{3}}, // positions 508..510 guessed; 511 is the last
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, e := vocabModel(t, ModelOptions{}, 1, EngineOptions{MaxDrafts: tc.maxDrafts})
			var items []SeqStep
			for i, d := range tc.draft {
				p := repeat(tc.promptLen)
				s, err := m.NewSequence(Sampling{IgnoreEOS: true}, p)
				if err != nil {
					t.Fatal(err)
				}
				seq := uint64(i + 1)
				if !e.Reserve(seq, min(len(p)+d, 512)) {
					t.Fatal("no room")
				}
				// The prompt but its last token is in the cache.
				if _, err := e.Step(ctx, []SeqStep{{Seq: seq, State: s, Tokens: p[:len(p)-1]}}); err != nil {
					t.Fatal(err)
				}
				items = append(items, SeqStep{Seq: seq, State: s, Tokens: p[len(p)-1:], Pos: len(p) - 1, Sample: true, Draft: d, History: p})
			}
			res, err := e.Step(ctx, items)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r.Drafted != tc.want[i] {
					t.Errorf("item %d: %d guessed, want %d", i, r.Drafted, tc.want[i])
				}
			}
		})
	}
	t.Run("unreserved", func(t *testing.T) {
		m, e := vocabModel(t, ModelOptions{}, 1, EngineOptions{MaxDrafts: 64})
		p := repeat(14)
		s, err := m.NewSequence(Sampling{IgnoreEOS: true}, p)
		if err != nil {
			t.Fatal(err)
		}
		if !e.Reserve(1, 14) { // one block of 16: room for 2 guesses
			t.Fatal("no room")
		}
		res, err := e.Step(ctx, []SeqStep{{Seq: 1, State: s, Tokens: p, Sample: true, Draft: 4, History: p}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Drafted != 2 {
			t.Fatalf("%d guessed in a block with room for 2", res[0].Drafted)
		}
	})
}

// TestGuessesAdapt: a sequence guesses as many as allowed at first, twice
// as many after all were taken, as many as were taken (at least one)
// after a refusal.
func TestGuessesAdapt(t *testing.T) {
	s := &Sequence{}
	hist := make([]int32, 64) // one token repeated: the lookup always guesses
	for i, tc := range []struct{ allowed, want, taken int }{
		{6, 6, 6}, {16, 12, 2}, {16, 2, 0}, {16, 1, 1}, {16, 2, 2}, {3, 3, 1}, {16, 1, 0}, {16, 1, 1},
	} {
		d := s.draft(tc.allowed, hist)
		if len(d) != tc.want {
			t.Fatalf("step %d: %d guessed, want %d", i, len(d), tc.want)
		}
		s.guessed(len(d), tc.taken)
	}
}

// TestSpeculativeGrammarGuesses: a constrained sequence guesses the
// tokens its grammar allows alone (all taken, whatever the logits) and a
// lookup's guesses only while the grammar allows them; its matcher is
// left as it was.
func TestSpeculativeGrammarGuesses(t *testing.T) {
	m, e := vocabModel(t, ModelOptions{}, 0.05, EngineOptions{MaxDrafts: 16})
	id := func(s string) int32 {
		ids, err := m.Encode(s, false)
		if err != nil || len(ids) != 1 {
			t.Fatalf("%q: ids %v, %v", s, ids, err)
		}
		return ids[0]
	}
	t.Run("forced", func(t *testing.T) {
		fixed := &Constraint{Kind: grammar.KindRegex, Source: "xyzwvxyzwvxyzwv"}
		params := []Sampling{{Temperature: 1, Seed: 3, Seeded: true, Constraint: fixed}}
		want, _ := generateSpec(t, m, e, params, prompt(12, 4, 96), 40, 0)
		got, count := generateSpec(t, m, e, params, prompt(12, 4, 96), 40, 4)
		if got[0].text != "xyzwvxyzwvxyzwv" || got[0].text != want[0].text || got[0].finish != "stop" || want[0].finish != "stop" {
			t.Fatalf("with guesses %q (%s), without %q (%s)", got[0].text, got[0].finish, want[0].text, want[0].finish)
		}
		// 14 letters after the first and the EOS, all forced.
		if count.accepted != count.drafted || count.accepted < 12 {
			t.Fatalf("%d guessed, %d taken: want the forced tokens guessed and taken", count.drafted, count.accepted)
		}
	})
	t.Run("forced past a refusal", func(t *testing.T) {
		// After a refusal the lookup guesses one token; tokens the grammar
		// allows alone are always taken, so they are guessed as before.
		s, err := m.NewSequenceContext(context.Background(), Sampling{Constraint: &Constraint{Kind: grammar.KindRegex, Source: "xyzwvxyzwv"}}, prompt(12, 4, 96))
		if err != nil {
			t.Fatal(err)
		}
		s.guessed(4, 0)
		if got := s.draft(6, nil); len(got) != 6 {
			t.Fatalf("%d forced tokens guessed after a refusal, want 6", len(got))
		}
	})
	t.Run("lookup filtered", func(t *testing.T) {
		c, err := m.compileConstraint(context.Background(), &Constraint{Kind: grammar.KindRegex, Source: "[a-c]{6}"})
		if err != nil {
			t.Fatal(err)
		}
		a, b, z := id("a"), id("b"), id("z")
		if got := c.guess(4, []int32{a, b, z, a}); !slices.Equal(got, []int32{a, b}) {
			t.Fatalf("guess = %v, want %v", got, []int32{a, b})
		}
		if got := c.guess(8, []int32{b, b, b, b, b, b, b, b}); !slices.Equal(got, []int32{b, b, b, b, b, b, 2}) {
			t.Fatalf("guess = %v, want six b and the EOS the grammar then allows alone", got)
		}
		if c.m.Accepted() != 0 || !c.allows(a) || c.allows(z) {
			t.Fatalf("the matcher moved: %d accepted", c.m.Accepted())
		}
	})
}
