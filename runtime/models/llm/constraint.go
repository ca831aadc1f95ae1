package llm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"sync"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm/grammar"
)

// FinishConstraint is the finish reason (SeqResult.End) of a sequence
// whose constraint cannot continue: nothing the vocabulary has continues
// its output and the output is not complete (a dead end), or the parse
// went past the grammar's run-time bounds (grammar.ErrStackLimit). The
// sequence ends without a token instead of sampling outside its grammar.
const FinishConstraint = "constraint"

// Constraint keeps a sequence's output inside a grammar (structured
// output): a kind and its source, compiled once per model and source.
type Constraint struct {
	Kind   grammar.Kind // KindJSON (Source unused), KindJSONSchema, KindRegex, KindGBNF
	Source string
}

// DefaultGrammarCacheBytes bounds a model's compiled grammars when
// ModelOptions.GrammarCacheBytes is 0.
const DefaultGrammarCacheBytes = 128 << 20

// SpecialTokenizer is what a Tokenizer may also say: which ids are special
// (control) tokens, left out of the detokenised text. A constraint never
// allows them (their text would not be in the output).
type SpecialTokenizer interface {
	IsSpecial(id int32) bool
}

// grammarState is a model's grammar vocabulary and cache, built on the
// first constrained sequence (151,936 tokens' trie: tens of milliseconds,
// a few MB), never for a model that is not asked for one.
type grammarState struct {
	once  sync.Once
	vocab *grammar.Vocab
	cache *grammar.Cache
	err   error
	// space is the mask of tokens that are whitespace only: what a
	// thinking model writes after its block ("</think>\n\n"), let
	// through before its grammar starts.
	space []uint64
}

func (m *Model) grammar() (*grammar.Vocab, *grammar.Cache, error) {
	g := &m.gram
	g.once.Do(func() {
		tok := m.opts.Tokenizer
		if tok == nil {
			g.err = fmt.Errorf("%w: llm %q has no tokenizer: a constraint needs its tokens' text", models.ErrInvalidInput, m.opts.Name)
			return
		}
		special, _ := tok.(SpecialTokenizer)
		tokens := make([][]byte, m.spec.Vocab)
		for id := range tokens {
			if special != nil && special.IsSpecial(int32(id)) {
				continue
			}
			tokens[id] = tok.TokenBytes(int32(id))
		}
		v, err := grammar.NewVocab(tokens, m.eos)
		if err != nil {
			g.err = fmt.Errorf("llm %q: grammar vocabulary: %w", m.opts.Name, err)
			return
		}
		size := m.opts.GrammarCacheBytes
		if size <= 0 {
			size = DefaultGrammarCacheBytes
		}
		g.vocab, g.cache = v, grammar.NewCache(size, m.opts.GrammarLimits)
		g.space = make([]uint64, v.MaskWords())
		for id := range int32(v.Size()) {
			if b := v.Token(id); len(b) > 0 && strings.Trim(string(b), " \t\r\n") == "" {
				g.space[id>>6] |= 1 << (id & 63)
			}
		}
	})
	return g.vocab, g.cache, g.err
}

// GrammarVocab is the model's vocabulary as the grammar engine sees it
// (built on first use): what a caller compiles against to check a
// constraint ahead of time.
func (m *Model) GrammarVocab() (*grammar.Vocab, error) {
	v, _, err := m.grammar()
	return v, err
}

// compileConstraint returns a matcher of c's grammar, compiled under ctx
// or taken from the model's cache. Errors wrap grammar.ErrInvalidGrammar,
// ErrUnsupportedSchema or ErrGrammarTooLarge (the client's constraint),
// ctx's error, or models.ErrInvalidInput.
func (m *Model) compileConstraint(ctx context.Context, c *Constraint) (*constraintState, error) {
	switch c.Kind {
	case grammar.KindJSON, grammar.KindJSONSchema, grammar.KindRegex, grammar.KindGBNF:
	default:
		return nil, fmt.Errorf("%w: constraint kind %d", ErrInvalidSampling, c.Kind)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	v, cache, err := m.grammar()
	if err != nil {
		return nil, err
	}
	g, err := cache.Get(ctx, v, c.Kind, c.Source)
	if err != nil {
		return nil, fmt.Errorf("llm %q: %s constraint: %w", m.opts.Name, c.Kind, err)
	}
	mt, err := g.NewMatcher()
	if err != nil {
		// Its start already passes the run-time bounds (ErrStackLimit: too
		// ambiguous): the client's grammar, not a fault of brokerd's.
		return nil, fmt.Errorf("%w: llm %q: %s constraint: %w", ErrInvalidSampling, m.opts.Name, c.Kind, err)
	}
	return &constraintState{m: mt, mask: make([]uint64, v.MaskWords()), space: m.gram.space}, nil
}

// constraintState is the grammar link of a sequence's sampler chain: its
// matcher and the mask of the tokens allowed next. The mask depends on the
// tokens accepted so far only, not on the logits, so the engine computes
// it (prepare) while the step's forward runs; apply then sets the logits
// of the tokens it rejects to -Inf before penalties, temperature and the
// pick, so probabilities and logprobs are over the allowed tokens (as
// vLLM applies its grammar bitmask before its sampler).
type constraintState struct {
	m     *grammar.Matcher
	mask  []uint64
	spare []uint64 // guess's masks of the states after the current one
	n     int      // tokens mask allows
	err   error    // the mask's error (grammar.ErrStackLimit...)
	ready bool     // mask, n and err are for the matcher's current state
	// pending, while a mask is computed in the background (maskRunner),
	// is closed when it is done; nil otherwise. Meanwhile nothing else
	// touches the matcher or the mask: every method settles first.
	pending chan struct{}
	// A thinking block before the grammar (Sampling.ThinkFirst).
	think  ThinkFirst
	phase  thinkPhase
	space  []uint64 // whitespace-only tokens (grammarState.space)
	spaces int      // whitespace tokens let through after the block
}

// thinkPhase is where a constrained sequence is with its thinking block.
type thinkPhase uint8

const (
	grammarPhase thinkPhase = iota // the grammar applies
	mayThink                       // the first token: the grammar's, or think.Open
	inThink                        // free tokens until think.Close
	afterThink                     // the grammar's tokens, or whitespace (at most maxSpaces tokens)
)

// maxSpaces bounds the whitespace tokens after a thinking block (Qwen3
// writes one, "\n\n") before the grammar alone applies.
const maxSpaces = 2

// prepare computes the mask of the current state unless it is computed.
func (c *constraintState) prepare() {
	c.settle()
	if !c.ready && c.phase != inThink {
		c.compute()
	}
}

// needsMask says whether prepare has a mask to compute (settled only:
// with a mask pending it is being computed).
func (c *constraintState) needsMask() bool { return !c.ready && c.phase != inThink }

// settle waits for a mask computed in the background.
func (c *constraintState) settle() {
	if c.pending != nil {
		<-c.pending
		c.pending = nil
	}
}

// compute computes the mask of the current state (prepare's work; a
// maskRunner's in the background).
func (c *constraintState) compute() {
	c.n, c.err = c.m.Mask(c.mask)
	c.ready = true
	if c.err != nil {
		return
	}
	switch c.phase {
	case mayThink:
		if !grammar.MaskAllows(c.mask, c.think.Open) && int(c.think.Open>>6) < len(c.mask) {
			c.mask[c.think.Open>>6] |= 1 << (c.think.Open & 63)
			c.n++
		}
	case afterThink:
		for w, b := range c.space {
			c.n += bits.OnesCount64(b &^ c.mask[w])
			c.mask[w] |= b
		}
	}
}

// terminated says whether the grammar is complete (the sequence stops).
func (c *constraintState) terminated() bool {
	c.settle()
	return c.phase == grammarPhase && c.m.IsTerminated()
}

// errDeadEnd: the mask allows nothing (finish with FinishConstraint).
var errDeadEnd = errors.New("no token continues the constraint")

// apply masks x (the step's logits, float64) in place; an error ends the
// sequence with FinishConstraint.
func (c *constraintState) apply(x []float64) error {
	if c.phase == inThink {
		return nil
	}
	c.prepare()
	switch {
	case c.err != nil:
		return c.err
	case c.n == 0:
		return errDeadEnd
	}
	inf := math.Inf(-1)
	for w, bits := range c.mask {
		if bits == math.MaxUint64 {
			continue
		}
		lo := w * 64
		hi := min(lo+64, len(x))
		for i := lo; i < hi; i++ {
			if bits&(1<<(i-lo)) == 0 {
				x[i] = inf
			}
		}
	}
	for i := len(c.mask) * 64; i < len(x); i++ {
		x[i] = inf // logits past the grammar's vocabulary (none when sizes agree)
	}
	return nil
}

// guess returns up to k tokens the grammar lets follow the output so far,
// for speculative decoding: at each position the one token it allows, if
// it allows one only (a JSON schema's keys and punctuation: jump-forward
// decoding's tokens, taken whatever the logits), else lookup's next token
// if the grammar allows it; it stops at the first position with neither.
// The matcher is left as it was, its current mask computed; its memo of
// steps keeps what the guesses computed, and since a grammar's work limit
// counts only steps not memoised, a grammar near its limit may end
// (FinishConstraint) a token earlier or later with guesses than without.
func (c *constraintState) guess(k int, lookup []int32) []int32 {
	switch c.phase {
	case inThink:
		// Free tokens: the lookup's, up to the block's end.
		if i := slices.Index(lookup, c.think.Close); i >= 0 {
			return lookup[:i+1]
		}
		return lookup
	case mayThink, afterThink:
		return nil
	}
	c.prepare()
	if c.err != nil || c.n == 0 || k <= 0 {
		return nil
	}
	if c.spare == nil {
		c.spare = make([]uint64, len(c.mask))
	}
	var out []int32
	mask, n := c.mask, c.n
	for len(out) < k {
		var tok int32
		switch {
		case n == 1:
			tok = grammar.MaskFirst(mask)
			if len(lookup) > len(out) && lookup[len(out)] != tok {
				lookup = nil // the lookup's guess went another way
			}
		case len(lookup) > len(out) && grammar.MaskAllows(mask, lookup[len(out)]):
			tok = lookup[len(out)]
		default:
			return c.rollback(out)
		}
		if c.m.Accept(tok) != nil {
			return c.rollback(out)
		}
		out = append(out, tok)
		if len(out) == k || c.m.IsTerminated() {
			break
		}
		var err error
		if n, err = c.m.Mask(c.spare); err != nil || n == 0 {
			break
		}
		mask = c.spare
	}
	return c.rollback(out)
}

// rollback undoes guess's tokens out and returns them.
func (c *constraintState) rollback(out []int32) []int32 {
	if err := c.m.Rollback(len(out)); err != nil {
		return nil // not reached: it accepted them
	}
	return out
}

// allows reports whether the current mask allows tok.
func (c *constraintState) allows(tok int32) bool {
	c.settle()
	return c.phase == inThink || grammar.MaskAllows(c.mask, tok)
}

// accept advances the matcher over the picked token; the next step needs
// a new mask. The thinking block's tokens pass the grammar by.
func (c *constraintState) accept(tok int32) error {
	c.settle()
	switch {
	case c.phase == inThink:
		if tok == c.think.Close {
			c.phase, c.ready = afterThink, false
		}
		return nil
	case c.phase == mayThink && tok == c.think.Open:
		c.phase, c.ready = inThink, false
		return nil
	case c.phase == afterThink:
		// The grammar's token starts it; else whitespace passes it by
		// (a failed Accept leaves the matcher as it was).
		c.ready = false
		err := c.m.Accept(tok)
		if err == nil || !errors.Is(err, grammar.ErrTokenRejected) || !grammar.MaskAllows(c.space, tok) {
			c.phase = grammarPhase
			return err // a bound's error ends the sequence as anywhere
		}
		if c.spaces++; c.spaces >= maxSpaces {
			c.phase = grammarPhase
		}
		return nil
	}
	c.phase, c.ready = grammarPhase, false
	return c.m.Accept(tok)
}
