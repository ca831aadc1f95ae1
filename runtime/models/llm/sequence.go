package llm

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/vecmath"
)

// ErrInvalidSampling means sampling parameters out of range; it wraps
// models.ErrInvalidInput (INVALID_ARGUMENT at the edge).
var ErrInvalidSampling = fmt.Errorf("%w: sampling parameters", models.ErrInvalidInput)

// Bounds of a sequence's sampling, the API's as well: the edge validates a
// request's sampling with Validate.
const (
	// MaxTopLogprobs is the most alternatives a token's logprob entry carries.
	MaxTopLogprobs = 20
	// MaxStopStrings bounds Stop, and MaxStopBytes each stop string.
	MaxStopStrings = 16
	MaxStopBytes   = 256
	// MaxStopTokenIDs bounds StopTokenIDs.
	MaxStopTokenIDs = 64
	// MaxMinTokens bounds MinTokens (a context's length; the caller
	// checks it against max_tokens).
	MaxMinTokens = 1 << 20
	// MaxLogitBias bounds LogitBias's ids; MaxBias its values' size
	// (OpenAI's range).
	MaxLogitBias = 1024
	MaxBias      = 100
)

// Sampling is how a sequence picks its tokens (the API's SamplingParams).
type Sampling struct {
	Temperature float32 // 0: greedy
	TopP        float32 // nucleus; 0 or 1: off
	TopK        int     // 0: off
	MinP        float32 // 0: off
	// RepetitionPenalty divides positive logits (multiplies negative ones)
	// of tokens in the prompt or output; 0 or 1: off.
	RepetitionPenalty float32
	// PresencePenalty and FrequencyPenalty subtract, from the logits of
	// tokens in the output, once and once per occurrence.
	PresencePenalty, FrequencyPenalty float32
	Seed                              uint64
	Seeded                            bool // Seed is set: same tokens whatever shares the steps
	Stop                              []string
	StopTokenIDs                      []int32
	Logprobs                          bool
	TopLogprobs                       int
	IgnoreEOS                         bool
	// MinTokens: no EOS, stop token id or stop string ends the sequence
	// before it has this many tokens (vLLM's min_tokens): EOS's and the
	// stop ids' logits are -Inf until then (a grammar that allows only
	// EOS still ends it).
	MinTokens int
	// IncludeStop: the stop string that ends the sequence is in its text
	// (vLLM's include_stop_str_in_output).
	IncludeStop bool
	// Constraint keeps the output inside a grammar (nil: free). EOS is
	// allowed only where the output is complete, and a sequence whose
	// grammar accepted EOS stops even with IgnoreEOS.
	Constraint *Constraint
	// ThinkFirst, with Constraint, lets the sequence think before its
	// grammar applies, as vLLM's structured output waits for a reasoning
	// parser's end and Ollama's format for the thinking: nil, the grammar
	// applies from the first token.
	ThinkFirst *ThinkFirst
	// LogitBias is added to the logits of its token ids before the
	// penalties (OpenAI's logit_bias); logprobs stay the model's.
	LogitBias map[int32]float32
}

// Validate checks the values' ranges.
func (s Sampling) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: %s", ErrInvalidSampling, fmt.Sprintf(f, a...)) }
	finite := func(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }
	switch {
	case !finite(s.Temperature) || s.Temperature < 0 || s.Temperature > 100:
		return bad("temperature %g: want 0 to 100", s.Temperature)
	case !finite(s.TopP) || s.TopP < 0 || s.TopP > 1:
		return bad("top_p %g: want 0 to 1", s.TopP)
	case s.TopK < 0:
		return bad("top_k %d: want 0 or more", s.TopK)
	case !finite(s.MinP) || s.MinP < 0 || s.MinP > 1:
		return bad("min_p %g: want 0 to 1", s.MinP)
	case !finite(s.RepetitionPenalty) || s.RepetitionPenalty < 0 || s.RepetitionPenalty > 10:
		return bad("repetition_penalty %g: want 0 to 10", s.RepetitionPenalty)
	case !finite(s.PresencePenalty) || s.PresencePenalty < -2 || s.PresencePenalty > 2:
		return bad("presence_penalty %g: want -2 to 2", s.PresencePenalty)
	case !finite(s.FrequencyPenalty) || s.FrequencyPenalty < -2 || s.FrequencyPenalty > 2:
		return bad("frequency_penalty %g: want -2 to 2", s.FrequencyPenalty)
	case s.TopLogprobs < 0 || s.TopLogprobs > MaxTopLogprobs:
		return bad("top_logprobs %d: want 0 to %d", s.TopLogprobs, MaxTopLogprobs)
	case s.TopLogprobs > 0 && !s.Logprobs:
		return bad("top_logprobs needs logprobs")
	case len(s.Stop) > MaxStopStrings:
		return bad("%d stop strings, at most %d", len(s.Stop), MaxStopStrings)
	case s.MinTokens < 0 || s.MinTokens > MaxMinTokens:
		return bad("min_tokens %d: want 0 to %d", s.MinTokens, MaxMinTokens)
	case len(s.StopTokenIDs) > MaxStopTokenIDs:
		return bad("%d stop token ids, at most %d", len(s.StopTokenIDs), MaxStopTokenIDs)
	case len(s.LogitBias) > MaxLogitBias:
		return bad("logit_bias has %d tokens, at most %d", len(s.LogitBias), MaxLogitBias)
	}
	if t := s.ThinkFirst; t != nil && (s.Constraint == nil || t.Open < 0 || t.Close < 0 || t.Open == t.Close) {
		return bad("think_first needs a constraint and two thinking tokens, has %+v", *t)
	}
	for id, b := range s.LogitBias {
		if !finite(b) || b < -MaxBias || b > MaxBias {
			return bad("logit_bias of token %d is %g: want -%d to %d", id, b, MaxBias, MaxBias)
		}
	}
	for i, st := range s.Stop {
		if st == "" || len(st) > MaxStopBytes {
			return bad("stop string %d is %d bytes: want 1 to %d", i, len(st), MaxStopBytes)
		}
	}
	return nil
}

// ThinkFirst is a thinking block's marker tokens (Qwen3's <think> and
// </think>): tokens inside the block are free, and the constraint starts
// after Close. InBlock: the prompt opened the block (a template that
// makes the model think); else the first token may open one, and a
// sequence whose first token does not answers under its grammar at once.
type ThinkFirst struct {
	Open, Close int32
	InBlock     bool
}

// TokenLogprob is a token's log-probability.
type TokenLogprob struct {
	Token   int32
	Logprob float32
}

// Logprob is a chosen token's log-probability and the most likely
// alternatives (the model's distribution, before sampling's filters).
type Logprob struct {
	TokenLogprob
	Top []TokenLogprob
}

// Delta is what a step adds to a sequence's output: whole UTF-8 text that
// is never part of a stop string, the token ids, and their logprobs when
// asked for.
type Delta struct {
	Text     string
	TokenIDs []int32
	Logprobs []Logprob
}

// Detokenizer turns a sequence's tokens into text as they come: Next
// returns the text the token completes (bytes of a character split across
// tokens wait), Flush what is held back at the end.
type Detokenizer interface {
	Next(id int32) string
	Flush() string
}

// Sequence is one generation's host state, the SeqStep.State the engine
// samples with: the sampling parameters, its own seeded RNG, the token
// counts of the penalties, the streaming detokeniser and the stop-string
// matcher. It is used by one step at a time.
type Sequence struct {
	params  Sampling
	vocab   int
	eos     []int32
	rng     *rand.Rand
	prompt  map[int32]bool  // repetition penalty
	counts  map[int32]int   // output tokens: presence, frequency, repetition
	detok   Detokenizer     // nil: no text
	pending strings.Builder // decoded text not yet emitted: a stop string's possible start
	stopped bool
	con     *constraintState // nil: unconstrained
	guesses int              // how many to guess next (0: as many as allowed); see guessed
	n       int              // tokens sampled

	// scratch lends the buffers of one sampling step ([V] float64 and
	// int32: 1.8 MB for Qwen's vocabulary). A sequence borrows them per
	// step instead of holding them for its life: a call of thousands of
	// prompts held thousands of copies until its last sequence ended.
	scratch *ScratchPool
}

// ScratchPool lends sampling buffers over one vocabulary; a Model owns
// one for its sequences. Buffers in use are at most the rows sampled at
// once, and idle ones go with the garbage collector.
type ScratchPool struct {
	vocab int
	pool  sync.Pool
}

type samplerScratch struct {
	work []float64
	idx  []int32
}

// NewScratchPool returns a pool of buffers for a vocabulary of vocab.
func NewScratchPool(vocab int) *ScratchPool {
	p := &ScratchPool{vocab: vocab}
	p.pool.New = func() any {
		return &samplerScratch{work: make([]float64, vocab), idx: make([]int32, vocab)}
	}
	return p
}

func (p *ScratchPool) get(vocab int) *samplerScratch {
	if p == nil || p.vocab != vocab {
		return &samplerScratch{work: make([]float64, vocab), idx: make([]int32, vocab)}
	}
	return p.pool.Get().(*samplerScratch)
}

func (p *ScratchPool) put(s *samplerScratch) {
	if p != nil && len(s.work) == p.vocab {
		p.pool.Put(s)
	}
}

// newSequence returns a sequence's state; detok may be nil (token ids
// only, no text and no stop strings).
func newSequence(params Sampling, prompt []int32, vocab int, eos []int32, detok Detokenizer) (*Sequence, error) {
	if err := params.Validate(); err != nil {
		return nil, err
	}
	if len(params.Stop) > 0 && detok == nil {
		return nil, fmt.Errorf("%w: stop strings need a tokenizer", ErrInvalidSampling)
	}
	for id := range params.LogitBias {
		if id < 0 || int(id) >= vocab {
			return nil, fmt.Errorf("%w: logit_bias token id %d outside the vocabulary of %d", ErrInvalidSampling, id, vocab)
		}
	}
	seed := params.Seed
	if !params.Seeded {
		seed = rand.Uint64()
	}
	s := &Sequence{
		params: params, vocab: vocab, eos: slices.Clone(eos), detok: detok,
		rng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		prompt: map[int32]bool{}, counts: map[int32]int{},
	}
	if params.RepetitionPenalty != 0 && params.RepetitionPenalty != 1 {
		for _, t := range prompt {
			s.prompt[t] = true
		}
	}
	return s, nil
}

// Flush returns the text held back (a possible stop string's start, bytes
// of an unfinished character) when the sequence ends for another reason
// than a stop (length, deadline).
func (s *Sequence) Flush() Delta {
	if s.stopped {
		return Delta{}
	}
	s.stop()
	text := s.pending.String()
	s.pending.Reset()
	if s.detok != nil {
		text += s.detok.Flush()
	}
	return Delta{Text: text}
}

// next picks the token that follows logits [V] and returns it with its
// delta; Stop when it ends the sequence.
func (s *Sequence) next(logits []float32) (SeqResult, error) {
	if len(logits) != s.vocab {
		return SeqResult{}, fmt.Errorf("%d logits for a vocabulary of %d", len(logits), s.vocab)
	}
	if s.stopped {
		return SeqResult{}, errors.New("sampling after the sequence stopped")
	}
	var d Delta
	if s.params.Logprobs {
		d.Logprobs = []Logprob{{}}
	}
	var tok int32
	if s.plainGreedy() {
		// Nothing to mask, penalise or draw: the pick is the first
		// largest logit, as pick finds it in float64 (the conversion
		// keeps the order), without a copy of the vocabulary.
		tok = argmax32(logits)
	} else {
		sc := s.scratch.get(len(logits))
		defer s.scratch.put(sc)
		// The sampler chain, in llama.cpp's order: the grammar's mask, the
		// bias and penalties, then the pick (temperature, min-p, top-k, top-p, draw).
		x := sc.work[:len(logits)]
		for i, v := range logits {
			x[i] = float64(v)
		}
		if s.con != nil {
			if err := s.con.apply(x); err != nil {
				return s.constraintEnd(err)
			}
		}
		s.penalise(x)
		s.holdEnd(x)
		tok = s.pick(x, sc.idx)
	}
	if s.params.Logprobs {
		d.Logprobs[0] = s.logprob(logits, tok)
	}
	terminated := false
	if s.con != nil {
		if err := s.con.accept(tok); err != nil {
			return s.constraintEnd(err)
		}
		terminated = s.con.terminated()
	}
	s.counts[tok]++
	s.n++
	d.TokenIDs = []int32{tok}
	res := SeqResult{Token: tok}
	if terminated || slices.Contains(s.params.StopTokenIDs, tok) || (!s.params.IgnoreEOS && slices.Contains(s.eos, tok)) {
		// The stop token's own text is not output; what was held back is.
		res.Stop = true
		s.stop()
		d.Text = s.pending.String()
		s.pending.Reset()
		if s.detok != nil {
			d.Text += s.detok.Flush()
		}
		res.Out = d
		return res, nil
	}
	if s.detok != nil {
		s.pending.WriteString(s.detok.Next(tok))
		text, stop := s.release()
		d.Text = text
		if stop {
			res.Stop = true
			s.stop()
		}
	}
	res.Out = d
	return res, nil
}

// constraintEnd ends the sequence without a token: its constraint allows
// nothing (a dead end) or went past its run-time bounds
// (grammar.ErrStackLimit, or a position computed on first use past the
// compile bounds). Whatever the grammar's error, only this sequence ends:
// a step's other sequences never fail for it.
func (s *Sequence) constraintEnd(error) (SeqResult, error) {
	s.con = nil // its parse state may be the largest a grammar allows
	return SeqResult{End: FinishConstraint}, nil
}

// stop ends the sequence; its grammar's parse state goes at once, not when
// the request's last sequence ends.
func (s *Sequence) stop() {
	s.stopped = true
	s.con = nil
}

// release takes from pending the text that cannot be the start of a stop
// string; stop is set (and the text cut before it) when one is complete.
func (s *Sequence) release() (text string, stop bool) {
	p := s.pending.String()
	cut, end := -1, 0
	// Before min_tokens a stop string does not count, as in vLLM; a
	// possible start of one is still held back below, so that one
	// completed at min_tokens counts.
	for _, st := range s.params.Stop {
		if i := strings.Index(p, st); i >= 0 && (cut < 0 || i < cut) && s.n >= s.params.MinTokens {
			cut, end = i, i+len(st)
		}
	}
	if cut >= 0 {
		s.pending.Reset()
		if s.params.IncludeStop {
			return p[:end], true
		}
		return p[:cut], true
	}
	// Hold back the longest suffix that is a proper prefix of a stop string.
	hold := 0
	for _, st := range s.params.Stop {
		for n := min(len(st)-1, len(p)); n > hold; n-- {
			if strings.HasSuffix(p, st[:n]) {
				hold = n
				break
			}
		}
	}
	s.pending.Reset()
	s.pending.WriteString(p[len(p)-hold:])
	return p[:len(p)-hold], false
}

// draft guesses up to k tokens that follow hist, the sequence's tokens so
// far (speculative decoding by prompt lookup, draft.go): the lookup's
// fewer after guesses it refused (guessed).
func (s *Sequence) draft(k int, hist []int32) []int32 {
	lookup := k
	if s.guesses > 0 {
		lookup = min(k, s.guesses)
	}
	if s.con != nil {
		// The grammar's own guesses first (a token it allows alone,
		// which the sequence always takes: up to k), the lookup's where
		// it allows them.
		return s.con.guess(k, proposeNgram(hist, lookup))
	}
	return proposeNgram(hist, lookup)
}

// guessed adapts how many tokens the next lookup guesses to how the last
// n guesses went: twice as many after all were taken (a quote being
// copied), as many as were taken (at least 1) after a refusal. A lookup
// that keeps guessing wrong then costs a step one row, not k: on the CPU
// a step of 2 rows costs about what 1 does, one of 9 rows 1.5-3 times
// (BenchmarkVerifyRows).
func (s *Sequence) guessed(n, taken int) {
	if taken == n {
		s.guesses = 2 * n
	} else {
		s.guesses = max(1, taken)
	}
}

// plainGreedy says whether the next token is the logits' argmax as they
// are: greedy, with no constraint and no penalty.
func (s *Sequence) plainGreedy() bool {
	p := s.params
	return p.Temperature == 0 && s.con == nil && (p.RepetitionPenalty == 0 || p.RepetitionPenalty == 1) &&
		p.PresencePenalty == 0 && p.FrequencyPenalty == 0 && len(p.LogitBias) == 0 && s.n >= p.MinTokens
}

// holdEnd keeps the sequence from ending before MinTokens, or inside the
// thinking block before a constrained answer (which would end it with no
// answer, finish stop): EOS (unless ignored) and the stop ids get -Inf.
// Where nothing else is left (a grammar whose answer is complete) they
// are kept.
func (s *Sequence) holdEnd(x []float64) {
	if s.n >= s.params.MinTokens && (s.con == nil || s.con.phase != inThink) {
		return
	}
	ends := s.params.StopTokenIDs
	if !s.params.IgnoreEOS {
		ends = append(slices.Clip(ends), s.eos...)
	}
	saved := make([]float64, len(ends))
	inf := math.Inf(-1)
	for i, t := range ends {
		if int(t) < len(x) {
			saved[i], x[t] = x[t], inf
		}
	}
	if x[vecmath.ArgmaxF64(x)] == inf { // vector code: this runs every token of a thinking block
		for i, t := range ends {
			if int(t) < len(x) {
				x[t] = saved[i]
			}
		}
	}
}

// argmax32 is pick's greedy choice on float32 logits: the first index of
// the largest value (a NaN never wins; ties go to the lowest id; as in
// pick, nothing compares above a NaN first logit, so that one stays), in
// vector code: a scalar scan took 0.09 ms a token at a 150k vocabulary.
func argmax32(x []float32) int32 { return int32(vecmath.ArgmaxF32(x)) }

// penalise applies the logit bias and the penalties to the logits x in place (plainGreedy
// skips it when none is set: a new penalty belongs in both).
func (s *Sequence) penalise(x []float64) {
	// The bias first, as vLLM's logits processors and llama.cpp's sampler
	// chain apply it (a masked token stays -Inf).
	for t, b := range s.params.LogitBias {
		x[t] += float64(b)
	}
	if rp := float64(s.params.RepetitionPenalty); rp != 0 && rp != 1 {
		pen := func(t int32) {
			if x[t] > 0 {
				x[t] /= rp
			} else {
				x[t] *= rp
			}
		}
		for t := range s.prompt {
			pen(t)
		}
		for t := range s.counts {
			if !s.prompt[t] {
				pen(t)
			}
		}
	}
	pp, fp := float64(s.params.PresencePenalty), float64(s.params.FrequencyPenalty)
	if pp != 0 || fp != 0 {
		for t, n := range s.counts {
			x[t] -= pp + fp*float64(n)
		}
	}
}

// pick chooses a token from penalised logits x (modified in place), with
// idx (as long as x) as scratch.
func (s *Sequence) pick(x []float64, idx []int32) int32 {
	best := vecmath.ArgmaxF64(x)
	if s.params.Temperature == 0 {
		return int32(best) // greedy; ties go to the lowest id
	}
	// Softmax at the temperature (unnormalised: the best token weighs 1).
	// min-p keeps tokens at least min_p times as likely as the best;
	// never one of weight 0 (a grammar's masked token, or an underflow),
	// which the draw's last resort could otherwise return.
	m, t, minP := x[best], float64(s.params.Temperature), float64(s.params.MinP)
	k, tp := s.params.TopK, float64(s.params.TopP)
	if math.IsNaN(m) || math.IsInf(m, 0) {
		// A broken model's logits (a file's weights can make them NaN or
		// infinite) get a token, never a crash.
		return s.pickNonFinite(x, best)
	}
	desc := func(a, b int32) int {
		if x[a] != x[b] {
			if x[a] > x[b] {
				return -1
			}
			return 1
		}
		return int(a - b)
	}
	var sum float64
	if k > 0 && k <= 64 && k < len(x) {
		// exp is monotone, so the k most likely tokens are the k largest
		// logits (ties to the lower id), in order: only their weights are
		// needed (Ollama's default top_k is 40). min-p keeps a prefix of
		// that order too, so it may come after.
		idx = topN(x, k, desc, idx)
		n := 0
		for _, i := range idx {
			p := math.Exp((x[i] - m) / t)
			x[i] = p
			if p >= minP && p > 0 {
				idx[n] = i
				n++
				sum += p
			}
		}
		idx = idx[:n]
	} else {
		// Every token's weight, in vector code: with math.Exp they took
		// 2-3 ms a token at a 150k vocabulary.
		idx, sum = vecmath.ExpWeights(x, m, t, minP, idx)
		// Only top-k and top-p need the candidates in order, and only
		// their head: sorting a 150k vocabulary per token would cost
		// more than a small model's step.
		switch {
		case k > 0 && k < len(idx):
			slices.SortFunc(idx, desc)
			idx = idx[:k]
			sum = 0 // top-p's mass is of the top k
			for _, i := range idx {
				sum += x[i]
			}
		case tp > 0 && tp < 1:
			// The nucleus is a prefix of the descending order, so it lies
			// in any set of the most likely tokens holding top_p of the
			// mass: lower a threshold until one does, then sort that set
			// only.
			idx = headHolding(idx, x, tp*sum)
			slices.SortFunc(idx, desc)
		}
	}
	if tp > 0 && tp < 1 {
		// The smallest prefix whose mass reaches top_p.
		var acc float64
		for n, i := range idx {
			acc += x[i]
			if acc >= tp*sum {
				idx = idx[:n+1]
				break
			}
		}
		sum = acc
	}
	if len(idx) == 0 { // not reached: the best token weighs 1
		return int32(best)
	}
	u := s.rng.Float64() * sum
	var acc float64
	for _, i := range idx {
		acc += x[i]
		if u < acc {
			return i
		}
	}
	return idx[len(idx)-1]
}

// pickNonFinite is pick's draw when the largest logit x[best] is not
// finite. The softmax's limit at +Inf is a uniform choice among the +Inf
// tokens (the first top_k of them by id, as ties go); NaN logits weigh
// nothing, so a NaN first logit gives way to the largest of the others
// (then drawn as usual); with nothing else (every logit NaN or -Inf) the
// greedy rule's token stands.
func (s *Sequence) pickNonFinite(x []float64, best int) int32 {
	if math.IsInf(x[best], 1) {
		var top []int32
		for i, v := range x {
			if math.IsInf(v, 1) {
				top = append(top, int32(i))
				if len(top) == s.params.TopK {
					break
				}
			}
		}
		return top[s.rng.IntN(len(top))]
	}
	if math.IsNaN(x[best]) {
		other := -1
		for i, v := range x {
			if !math.IsNaN(v) && (other < 0 || v > x[other]) {
				other = i
			}
		}
		if other >= 0 && !math.IsInf(x[other], -1) {
			x[best] = math.Inf(-1)
			return s.pick(x, make([]int32, len(x)))
		}
	}
	return int32(best)
}

// headHolding returns the tokens of idx whose weight in x is at least a
// threshold, the highest threshold (1, 1/16, 1/256, ...) at which their
// weights sum to mass or more; idx's storage is reused.
func headHolding(idx []int32, x []float64, mass float64) []int32 {
	all := idx
	for tau := 1.0 / 16; ; tau /= 16 {
		var got float64
		n := 0
		for _, i := range all {
			if x[i] >= tau {
				got += x[i]
				n++
			}
		}
		if got >= mass || tau < 1e-300 || n == len(all) {
			out := all[:0]
			for _, i := range all {
				if x[i] >= tau {
					out = append(out, i)
				}
			}
			return out
		}
	}
}

// topN returns the n (at most 64) first of x's indices under cmp (values
// descending, ties by index), NaN values left out, with one pass and an
// insertion into a list of at most n, in out's storage.
func topN(x []float64, n int, cmp func(a, b int32) int, out []int32) []int32 {
	var buf [64]int32
	top := buf[:0]
	low := math.Inf(-1) // the n-th value so far, once there are n
	for i, v := range x {
		// A NaN weighs nothing; the common case is a value not among the
		// n so far, which needs no call of cmp (i comes after every
		// index in top, so a tie goes after too).
		if v != v || len(top) == n && v <= low {
			continue
		}
		i := int32(i)
		j := len(top)
		for j > 0 && cmp(i, top[j-1]) < 0 {
			j--
		}
		if j < n {
			if len(top) < n {
				top = append(top, 0)
			}
			copy(top[j+1:], top[j:len(top)-1])
			top[j] = i
			low = x[top[len(top)-1]]
		}
	}
	return append(out[:0], top...)
}

// logprob is tok's log-softmax under the raw logits, with the top
// alternatives when asked for. Under a constraint the logits are masked
// first (vLLM computes logprobs after its grammar bitmask): probabilities
// are over the allowed tokens, and the alternatives are allowed tokens
// only (fewer than asked when fewer are allowed).
func (s *Sequence) logprob(logits []float32, tok int32) Logprob {
	if s.con != nil {
		masked := make([]float32, len(logits))
		inf := float32(math.Inf(-1))
		for i, v := range logits {
			if s.con.allows(int32(i)) {
				masked[i] = v
			} else {
				masked[i] = inf
			}
		}
		lp := rawLogprob(masked, tok, s.params.TopLogprobs)
		for n, a := range lp.Top {
			if math.IsInf(float64(a.Logprob), -1) {
				lp.Top = lp.Top[:n]
				break
			}
		}
		return lp
	}
	return rawLogprob(logits, tok, s.params.TopLogprobs)
}

// rawLogprob is tok's log-softmax under logits and the n most likely
// alternatives.
func rawLogprob(logits []float32, tok int32, n int) Logprob {
	lse := vecmath.LogSumExpF32(logits) // with math.Exp, 1 ms a token at a 150k vocabulary
	lp := Logprob{TokenLogprob: TokenLogprob{Token: tok, Logprob: float32(float64(logits[tok]) - lse)}}
	if n > 0 {
		top := make([]int32, 0, n+1)
		for i := range logits {
			// Keep the n best so far, sorted descending (n ≤ 20).
			j := len(top)
			for j > 0 && logits[top[j-1]] < logits[i] {
				j--
			}
			if j < n {
				top = slices.Insert(top, j, int32(i))
				if len(top) > n {
					top = top[:n]
				}
			}
		}
		for _, i := range top {
			lp.Top = append(lp.Top, TokenLogprob{Token: i, Logprob: float32(float64(logits[i]) - lse)})
		}
	}
	return lp
}
