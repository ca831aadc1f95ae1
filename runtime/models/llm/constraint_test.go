package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
)

// listTokenizer is a test tokenizer over a fixed list of token texts: ids
// 0-2 are the special <s>, <pad> and </s> (EOS 2); the others are text,
// some of several characters and some a part of a UTF-8 character.
type listTokenizer struct{ toks []string }

func (l listTokenizer) Encode(text string, _ bool, _ int) ([]int32, bool, error) {
	var ids []int32
	for text != "" {
		best, n := int32(-1), 0
		for id, t := range l.toks {
			if id > 2 && len(t) > n && strings.HasPrefix(text, t) {
				best, n = int32(id), len(t)
			}
		}
		if best < 0 {
			return nil, false, fmt.Errorf("no token for %q", text)
		}
		ids, text = append(ids, best), text[n:]
	}
	return ids, false, nil
}

func (l listTokenizer) NewDetokenizer() Detokenizer { return &listDetok{l: l} }
func (l listTokenizer) IsSpecial(id int32) bool     { return id >= 0 && id <= 2 }
func (l listTokenizer) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(l.toks) {
		return nil
	}
	return []byte(l.toks[id])
}

type listDetok struct {
	l    listTokenizer
	held []byte
}

func (d *listDetok) Next(id int32) string {
	if d.l.IsSpecial(id) {
		return ""
	}
	d.held = append(d.held, d.l.TokenBytes(id)...)
	if !utf8.Valid(d.held) && len(d.held) < 4 {
		return "" // a character split across tokens
	}
	s := string(d.held)
	d.held = d.held[:0]
	return s
}

func (d *listDetok) Flush() string {
	s := strings.ToValidUTF8(string(d.held), "\uFFFD")
	d.held = d.held[:0]
	return s
}

// testVocab is the 96 tokens of tinyNet's vocabulary: JSON's punctuation
// and common pairs, digits, letters, a few words, é whole and € in two
// pieces.
func testVocab() listTokenizer {
	toks := []string{"<s>", "<pad>", "</s>", " ", "\n", "\t", "{", "}", "[", "]", `"`, ":", ",", ".", "-", "+", "\\", "/", "_"}
	for c := '0'; c <= '9'; c++ {
		toks = append(toks, string(c))
	}
	for c := 'a'; c <= 'z'; c++ {
		toks = append(toks, string(c))
	}
	toks = append(toks, "E", "A", "B", "C", "D", "F", `"}`, `":`, `",`, `"]`, `": `, `, "`, `{"`, "true", "false", "null",
		"ab", "12", "00", "ing", " the", "é", "\xe2\x82", "\xac", "!", "?", "(", ")", "*", "=", "'", "<", ">", "#", "@", "%", "&", ";", "~", "^", "$")
	if len(toks) != 96 {
		panic(fmt.Sprintf("%d test tokens, want 96", len(toks)))
	}
	return listTokenizer{toks}
}

// constrainedModel is tinyNet's Qwen3 with random weights, testVocab's
// tokenizer and a context of 512, on oneDNN's CPU device.
func constrainedModel(t *testing.T, opts ModelOptions) (*Model, *Engine) {
	t.Helper()
	// A final norm of small weights makes the logits small and the
	// distribution nearly flat, as an untrained model's: at temperature 1
	// every allowed token is picked now and then, so strings end (random
	// weights of the usual scale repeat one token for hundreds of steps).
	return vocabModel(t, opts, 0.05, EngineOptions{})
}

// vocabModel is constrainedModel with its final norm's weights scaled by
// normScale and engine options over its defaults (zero fields keep them).
func vocabModel(t *testing.T, opts ModelOptions, normScale float32, eo EngineOptions) (*Model, *Engine) {
	t.Helper()
	opts.Name, opts.Tokenizer = "constrained", testVocab()
	w := randomCheckpoint(tinyNet("qwen3"), 5)
	norm := w["model.norm.weight"]
	for i := range norm.Data {
		norm.Data[i] *= normScale
	}
	m, err := NewModel(configJSON(t, "qwen3", func(c map[string]any) { c["max_position_embeddings"] = 512 }), w, opts)
	if err != nil {
		t.Fatal(err)
	}
	eo.CacheBytes, eo.BlockSize, eo.MaxSeqs, eo.MaxStepTokens = 96<<20, 16, 256, 2048
	e, err := m.NewEngine(context.Background(), openCPU(t, runtime.F32), eo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return m, e
}

// genResult is one sequence's output: its text and why it ended (stop,
// length or End's reason).
type genResult struct {
	text     string
	tokens   []int32
	finish   string
	logprobs []Logprob
}

// generate runs one sequence per Sampling over prompt through e, all in
// the same steps, as the scheduler would: each step prefills the new ones
// and decodes the others, until each stops, ends or has maxNew tokens.
func generate(t *testing.T, m *Model, e *Engine, params []Sampling, prompt []int32, maxNew int) []genResult {
	t.Helper()
	res, _ := generateSpec(t, m, e, params, prompt, maxNew, 0)
	return res
}

// specCount is what a run's guesses did: tokens guessed and taken.
type specCount struct{ drafted, accepted int }

// generateSpec is generate letting each decoding step guess up to draft
// tokens (SeqStep.Draft; never past maxNew), as the scheduler grants them.
func generateSpec(t *testing.T, m *Model, e *Engine, params []Sampling, prompt []int32, maxNew, draft int) ([]genResult, specCount) {
	t.Helper()
	ctx := context.Background()
	type live struct {
		seq  *Sequence
		out  []int32
		text strings.Builder
		lps  []Logprob
		done bool
	}
	seqs := make([]*live, len(params))
	for i, p := range params {
		s, err := m.NewSequenceContext(ctx, p, prompt)
		if err != nil {
			t.Fatal(err)
		}
		seqs[i] = &live{seq: s}
	}
	var count specCount
	res := make([]genResult, len(params))
	for step := 0; ; step++ {
		var items []SeqStep
		var owners []int
		for i, l := range seqs {
			if l.done {
				continue
			}
			it := SeqStep{Seq: uint64(i + 1), State: l.seq, Sample: true}
			if len(l.out) == 0 {
				it.Tokens = prompt
			} else {
				it.Tokens, it.Pos = l.out[len(l.out)-1:], len(prompt)+len(l.out)-1
				it.Draft = min(draft, maxNew-len(l.out)-1)
				it.History = append(slices.Clone(prompt), l.out...)
			}
			if !e.Reserve(it.Seq, min(it.Pos+len(it.Tokens)+it.Draft, m.ContextLength())) {
				t.Fatalf("step %d: no cache for sequence %d", step, i)
			}
			items, owners = append(items, it), append(owners, i)
		}
		if len(items) == 0 {
			return res, count
		}
		out, err := e.Step(ctx, items)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for k, r := range out {
			i := owners[k]
			l := seqs[i]
			count.drafted += r.Drafted
			count.accepted += len(r.Accepted)
			if len(r.Accepted) > r.Drafted || r.Drafted > items[k].Draft {
				t.Fatalf("step %d: sequence %d took %d of %d guesses, %d allowed", step, i, len(r.Accepted), r.Drafted, items[k].Draft)
			}
			// Refused guesses give their room back: the sequence holds
			// its written positions and the next.
			filled := items[k].Pos + len(items[k].Tokens) + len(r.Accepted)
			if room := e.blocks.room(items[k].Seq); r.Drafted > 0 && room > (filled/e.blocks.size+1)*e.blocks.size {
				t.Fatalf("step %d: sequence %d holds %d positions after writing %d", step, i, room, filled)
			}
			l.out = append(l.out, r.Accepted...)
			if r.Out != nil {
				d := r.Out.(Delta)
				l.text.WriteString(d.Text)
				l.lps = append(l.lps, d.Logprobs...)
			}
			finish := ""
			switch {
			case r.End != "":
				finish = r.End
			default:
				l.out = append(l.out, r.Token)
				switch {
				case r.Stop:
					finish = "stop"
				case r.Full:
					finish = "full"
				case len(l.out) >= maxNew:
					finish = "length"
				}
			}
			if finish != "" {
				if finish != "stop" {
					l.text.WriteString(l.seq.Flush().Text)
				}
				l.done = true
				e.Release(items[k].Seq)
				res[i] = genResult{text: l.text.String(), tokens: l.out, finish: finish, logprobs: l.lps}
			}
		}
	}
}

const testSchema = `{
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "score": {"type": "number", "minimum": -1, "maximum": 1},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "é€"]}, "maxItems": 3},
    "ok": {"type": "boolean"},
    "kind": {"anyOf": [{"type": "null"}, {"const": "x"}]},
    "when": {"type": "string", "format": "date"}
  },
  "required": ["name", "age", "ok"],
  "additionalProperties": false
}`

// gbnfList and gbnfListRE are a GBNF grammar and the same language as a
// regular expression, to check its outputs.
const gbnfList = `root ::= "[" item ("," ws item){0,3} "]"
item ::= [0-9]{1,3} | "true" | "null" | "\"" [a-z]{1,5} "\""
ws ::= " "?`

var gbnfListRE = regexp.MustCompile(`^\[(?:[0-9]{1,3}|true|null|"[a-z]{1,5}")(?:, ?(?:[0-9]{1,3}|true|null|"[a-z]{1,5}")){0,3}\]$`)

const testRegex = `[a-f]{2,6}-[0-9]{1,4}(\.[0-9]{1,2})?( é€)?`

// TestConstrainedSeeds: a random-weight model at temperature 1, over 200
// seeds each, writes only outputs its constraint accepts: JSON that
// validates against a schema (santhosh-tekuri/jsonschema), any JSON
// object, a full match of a regular expression, a sentence of a GBNF
// grammar; all end with EOS once complete (the mask allows nothing else
// there but bounded whitespace).
func TestConstrainedSeeds(t *testing.T) {
	m, e := constrainedModel(t, ModelOptions{})
	c := jsonschema.NewCompiler()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(testSchema))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	c.AssertFormat()
	sch, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^(?:` + testRegex + `)$`)
	cases := []struct {
		name  string
		con   Constraint
		check func(string) error
		// penalty is a frequency penalty: any JSON's strings are unbounded,
		// and random weights repeat a token inside one for hundreds of
		// steps without it.
		penalty float32
	}{
		{"json_schema", Constraint{Kind: grammar.KindJSONSchema, Source: testSchema}, func(s string) error {
			v, err := jsonschema.UnmarshalJSON(strings.NewReader(s))
			if err != nil {
				return err
			}
			return sch.Validate(v)
		}, 0},
		{"json", Constraint{Kind: grammar.KindJSON}, func(s string) error {
			var v map[string]any
			d := json.NewDecoder(strings.NewReader(s))
			if err := d.Decode(&v); err != nil {
				return err
			}
			if d.More() {
				return errors.New("more after the object")
			}
			return nil
		}, 0},
		{"regex", Constraint{Kind: grammar.KindRegex, Source: testRegex}, func(s string) error {
			if !re.MatchString(s) {
				return errors.New("no full match")
			}
			return nil
		}, 0},
		{"gbnf", Constraint{Kind: grammar.KindGBNF, Source: gbnfList}, func(s string) error {
			if !gbnfListRE.MatchString(s) {
				return errors.New("not a sentence of the grammar")
			}
			return nil
		}, 0},
	}
	prompt, err := m.Encode("Answer: ", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			params := make([]Sampling, 200)
			for i := range params {
				params[i] = Sampling{Temperature: 1, Seed: uint64(i), Seeded: true, Constraint: &tc.con, FrequencyPenalty: tc.penalty}
			}
			res := generate(t, m, e, params, prompt, 500)
			stopped, long := 0, 0
			for i, r := range res {
				if r.finish == "length" && tc.name == "json" && long < 5 {
					// Any JSON is unbounded: a few seeds may write past
					// max tokens (none does on the machine this was
					// written on; another CPU's kernels round otherwise).
					long++
					continue
				}
				if r.finish != "stop" {
					t.Errorf("seed %d: finished %q after %d tokens: %q", i, r.finish, len(r.tokens), r.text)
					continue
				}
				stopped++
				if err := tc.check(r.text); err != nil {
					t.Errorf("seed %d: %q: %v", i, r.text, err)
				}
			}
			t.Logf("%d of %d complete; seed 0 wrote %q, seed 1 %q", stopped, len(res), res[0].text, res[1].text)
		})
	}
}

// TestConstraintDeadEnd: a constraint whose next character no token of
// the vocabulary spells (testVocab has no 'Z') ends its sequence with
// FinishConstraint and no token, instead of sampling outside the grammar
// or looping; an invalid constraint is refused when the sequence is made.
func TestConstraintDeadEnd(t *testing.T) {
	m, e := constrainedModel(t, ModelOptions{})
	prompt := []int32{3, 4}
	res := generate(t, m, e, []Sampling{
		{Temperature: 1, Seed: 1, Seeded: true, Constraint: &Constraint{Kind: grammar.KindRegex, Source: `[ab]Z`}},
		{Temperature: 1, Seed: 2, Seeded: true, Constraint: &Constraint{Kind: grammar.KindGBNF, Source: `root ::= "ab" "Z"`}},
	}, prompt, 20)
	for i, r := range res {
		if ok := r.text == "a" || r.text == "b" || (i == 1 && r.text == "ab"); r.finish != FinishConstraint || !ok {
			t.Errorf("sequence %d: finished %q with %q (%v)", i, r.finish, r.text, r.tokens)
		}
	}
	for _, c := range []Constraint{
		{Kind: grammar.KindGBNF, Source: `root ::= undefined`},
		{Kind: grammar.KindRegex, Source: `(`},
		{Kind: grammar.KindJSONSchema, Source: `{"type": "object", "not": {}}`},
		{Kind: grammar.KindJSONSchema, Source: `{"type":`},
		{Kind: 99},
	} {
		_, err := m.NewSequenceContext(context.Background(), Sampling{Constraint: &c}, prompt)
		if !errors.Is(err, grammar.ErrInvalidGrammar) && !errors.Is(err, grammar.ErrUnsupportedSchema) && !errors.Is(err, models.ErrInvalidInput) {
			t.Errorf("%s %q: %v", c.Kind, c.Source, err)
		}
	}
	// Past the run-time bounds (parse stacks): at the start, refused as
	// invalid; later, the sequence ends with FinishConstraint.
	tight, te := constrainedModel(t, ModelOptions{GrammarLimits: grammar.Limits{MaxStacks: 2}})
	if _, err := tight.NewSequenceContext(context.Background(), Sampling{Constraint: &Constraint{Kind: grammar.KindGBNF,
		Source: `root ::= "x" "1" | "x" "2" | "x" "3"`}}, prompt); !errors.Is(err, models.ErrInvalidInput) || !errors.Is(err, grammar.ErrStackLimit) {
		t.Errorf("a grammar too ambiguous at its start: %v", err)
	}
	res = generate(t, tight, te, []Sampling{{Temperature: 1, Seed: 1, Seeded: true, Constraint: &Constraint{Kind: grammar.KindGBNF,
		Source: `root ::= "q" ("x" "1" | "x" "2" | "x" "3")`}}}, prompt, 20)
	// (The mask's check of "q" already meets three stacks: it ends before
	// writing it.)
	if r := res[0]; r.finish != FinishConstraint || (r.text != "" && r.text != "q") {
		t.Errorf("past the parse-stack bound: finished %q with %q", r.finish, r.text)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.NewSequenceContext(ctx, Sampling{Constraint: &Constraint{Kind: grammar.KindRegex, Source: `[0-9]{3}x`}}, prompt); !errors.Is(err, context.Canceled) {
		t.Errorf("compile under a cancelled context: %v", err)
	}
}

// TestConstraintLogprobs: a constrained sequence's logprobs are over its
// allowed tokens (they sum to 1 there), alternatives are allowed tokens
// only, and greedy decoding picks the likeliest allowed token.
func TestConstraintLogprobs(t *testing.T) {
	m, e := constrainedModel(t, ModelOptions{})
	res := generateLogprobs(t, m, e, Sampling{Logprobs: true, TopLogprobs: 20, Constraint: &Constraint{Kind: grammar.KindRegex, Source: `[0-9]{4}`}}, []int32{3})
	digits := 0 // written so far
	for i, lp := range res {
		// Allowed: the digit tokens ("0".."9", "12", "00") that fit in
		// four digits; EOS once there are four.
		want := 1
		if digits < 4 {
			want = 10
			if digits <= 2 {
				want = 12
			}
		}
		if len(lp.Top) != want {
			t.Errorf("token %d: %d alternatives, want %d", i, len(lp.Top), want)
		}
		var sum float64
		for _, a := range lp.Top {
			sum += math.Exp(float64(a.Logprob))
			if b := m.TokenBytes(a.Token); digits < 4 && len(bytes.Trim(b, "0123456789")) != 0 {
				t.Errorf("token %d: alternative %d %q is not digits", i, a.Token, b)
			}
		}
		if digits == 4 && lp.Token != 2 {
			t.Errorf("token %d is %d after four digits, want EOS", i, lp.Token)
		}
		digits += len(m.TokenBytes(lp.Token))
		if math.Abs(sum-1) > 1e-4 || lp.Token != lp.Top[0].Token {
			t.Errorf("token %d: probabilities sum to %g; chose %d, the likeliest is %d", i, sum, lp.Token, lp.Top[0].Token)
		}
	}
}

func generateLogprobs(t *testing.T, m *Model, e *Engine, p Sampling, prompt []int32) []Logprob {
	t.Helper()
	s, err := m.NewSequence(p, prompt)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Release(1)
	var out []Logprob
	toks := prompt
	pos := 0
	for range 10 {
		if !e.Reserve(1, pos+len(toks)) {
			t.Fatal("no cache")
		}
		res, err := e.Step(context.Background(), []SeqStep{{Seq: 1, State: s, Tokens: toks, Pos: pos, Sample: true}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].End != "" {
			t.Fatalf("ended: %s", res[0].End)
		}
		out = append(out, res[0].Out.(Delta).Logprobs...)
		if res[0].Stop {
			return out
		}
		pos += len(toks)
		toks = []int32{res[0].Token}
	}
	return out
}

// TestBatchInvarianceConstrainedNeighbours: an unconstrained sequence
// gives the same tokens from bit-identical logits alone and beside
// constrained ones (their masks computed during the forward).
func TestBatchInvarianceConstrainedNeighbours(t *testing.T) {
	tok := testVocab()
	v, err := grammar.NewVocab(func() [][]byte {
		b := make([][]byte, len(tok.toks))
		for i := range b {
			if !tok.IsSpecial(int32(i)) {
				b[i] = tok.TokenBytes(int32(i))
			}
		}
		return b
	}(), []int32{2})
	if err != nil {
		t.Fatal(err)
	}
	cache := grammar.NewCache(16<<20, grammar.Limits{})
	constrained := func(kind grammar.Kind, src string) *constraintState {
		g, err := cache.Get(context.Background(), v, kind, src)
		if err != nil {
			t.Fatal(err)
		}
		mt, err := g.NewMatcher()
		if err != nil {
			t.Fatal(err)
		}
		return &constraintState{m: mt, mask: make([]uint64, v.MaskWords())}
	}
	seeded := Sampling{Temperature: 0.9, TopK: 40, TopP: 0.95, MinP: 0.01, Seed: 42, Seeded: true, RepetitionPenalty: 1.1, FrequencyPenalty: 0.2}
	for _, params := range []Sampling{{}, seeded} {
		s := tinyNet("qwen2")
		e := newTestEngine(t, openDecoderCPU(t, runtime.F32), s, 11, EngineOptions{CacheBytes: 1 << 20, BlockSize: 4})
		alone := &job{seq: 1, prompt: prompt(9, 1, s.Vocab), gen: 12, chunk: 9, params: params}
		simulate(t, e, []*job{alone})
		mix := mixJobs(s.Vocab, Sampling{Temperature: 1, Seed: 7, Seeded: true})
		mix[0].params = params
		kinds := []struct {
			k   grammar.Kind
			src string
		}{{grammar.KindJSON, ""}, {grammar.KindJSONSchema, testSchema}, {grammar.KindRegex, testRegex}, {grammar.KindGBNF, gbnfList}}
		for i, j := range mix[1:] {
			j.state, err = newSequence(j.params, j.prompt, s.Vocab, []int32{2}, nil)
			if err != nil {
				t.Fatal(err)
			}
			j.state.con = constrained(kinds[i].k, kinds[i].src)
		}
		simulate(t, e, mix)
		if !slices.Equal(alone.out, mix[0].out) {
			t.Fatalf("alone %v, beside constrained sequences %v", alone.out, mix[0].out)
		}
		for i := range alone.logits {
			for k, x := range alone.logits[i] {
				if math.Float32bits(x) != math.Float32bits(mix[0].logits[i][k]) {
					t.Fatalf("token %d: logit %d is %g alone, %g beside constrained sequences", i, k, x, mix[0].logits[i][k])
				}
			}
		}
		for i, j := range mix[1:] {
			if len(j.out) == 0 {
				t.Errorf("constrained neighbour %d generated nothing", i)
			}
		}
	}
}

// TestThinkFirst: with Sampling.ThinkFirst a constrained sequence's
// thinking block is free and its grammar starts after the block's close
// and up to two whitespace tokens; the first token may open a block, no
// later one may; without it the grammar applies from the first token.
func TestThinkFirst(t *testing.T) {
	m, _ := vocabModel(t, ModelOptions{}, 1, EngineOptions{})
	id := func(s string) int32 {
		ids, err := m.Encode(s, false)
		if err != nil || len(ids) != 1 {
			t.Fatalf("%q: ids %v, %v", s, ids, err)
		}
		return ids[0]
	}
	open, closing := id("<"), id(">")
	con := &Constraint{Kind: grammar.KindRegex, Source: "ab"}
	for _, tc := range []struct {
		name   string
		think  *ThinkFirst
		logits []string // the token each step's logits favour
		want   string   // the tokens picked
	}{
		{"in block", &ThinkFirst{Open: open, Close: closing, InBlock: true}, []string{"x", "<", "y", ">", "\n", "a", "b"}, "x<y>\nab"},
		{"opened", &ThinkFirst{Open: open, Close: closing}, []string{"<", "z", "z", ">", "a", "b"}, "<zz>ab"},
		// Whitespace after the block: two tokens, then the grammar alone.
		{"spaces", &ThinkFirst{Open: open, Close: closing, InBlock: true}, []string{">", "\n", "\t", "\n", "b"}, ">\n\tab"},
		{"not opened", &ThinkFirst{Open: open, Close: closing}, []string{"z", "<", "b"}, "abE"},
		{"none", nil, []string{"<", "b", "b"}, "abE"},
		// EOS inside the block would end the answer before it began.
		{"no end inside the block", &ThinkFirst{Open: open, Close: closing, InBlock: true}, []string{"x", "EOS", ">", "a", "b", "b"}, "x<s>>abE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := m.NewSequenceContext(context.Background(), Sampling{Constraint: con, ThinkFirst: tc.think, Logprobs: true}, prompt(5, 1, 96))
			if err != nil {
				t.Fatal(err)
			}
			var got strings.Builder
			for i, fav := range tc.logits {
				tok := m.eos[0]
				if fav != "EOS" {
					tok = id(fav)
				}
				res, err := s.next(oneHot(96, tok))
				if err != nil || res.End != "" {
					t.Fatalf("step %d: %+v, %v", i, res, err)
				}
				if slices.Contains(m.eos, res.Token) {
					got.WriteString("E")
				} else {
					got.WriteString(m.opts.Tokenizer.(listTokenizer).toks[res.Token])
				}
				if res.Stop {
					break
				}
			}
			if got.String() != tc.want {
				t.Fatalf("picked %q, want %q", got.String(), tc.want)
			}
		})
	}
	if err := (Sampling{ThinkFirst: &ThinkFirst{Open: open, Close: closing}}).Validate(); err == nil {
		t.Fatal("ThinkFirst without a constraint passed")
	}
}

// TestMinTokensUnderAGrammar: min_tokens does not hold a sequence whose
// grammar allows only EOS (its answer complete): it ends.
func TestMinTokensUnderAGrammar(t *testing.T) {
	m, _ := vocabModel(t, ModelOptions{}, 1, EngineOptions{})
	s, err := m.NewSequenceContext(context.Background(), Sampling{MinTokens: 5, Constraint: &Constraint{Kind: grammar.KindRegex, Source: "a"}}, prompt(5, 1, 96))
	if err != nil {
		t.Fatal(err)
	}
	a := int32(slices.Index(testVocab().toks, "a"))
	for i, want := range []bool{false, true} {
		res, err := s.next(oneHot(96, a))
		if err != nil || res.End != "" || res.Stop != want {
			t.Fatalf("token %d: %+v, %v; want stop %v", i, res, err, want)
		}
	}
}
