package grammar

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Every error this package returns for a client's grammar,
// schema or regular expression wraps exactly one of ErrInvalidGrammar,
// ErrUnsupportedSchema or ErrGrammarTooLarge (test with errors.Is), so an
// API edge can map them all to INVALID_ARGUMENT / HTTP 400.
var (
	// ErrInvalidGrammar: the GBNF, the regular expression or the JSON
	// Schema document is malformed (syntax error, undefined rule, left
	// recursion, a rule that derives no finite string, bad JSON).
	ErrInvalidGrammar = errors.New("invalid grammar")
	// ErrUnsupportedSchema: a well-formed JSON Schema uses a keyword or a
	// combination this package cannot enforce (see doc.go for the list).
	ErrUnsupportedSchema = errors.New("unsupported JSON schema")
	// ErrGrammarTooLarge: a bound of Limits was exceeded while parsing or
	// compiling (source size, rules, nesting, repetition counts, compile
	// states).
	ErrGrammarTooLarge = errors.New("grammar too large")

	// ErrTokenRejected: Matcher.Accept was given a token that the mask did
	// not allow; the matcher is unchanged.
	ErrTokenRejected = errors.New("token rejected by grammar")
	// ErrTerminated: the matcher already accepted an end-of-sequence token.
	ErrTerminated = errors.New("grammar already terminated")
	// ErrStackLimit: at run time the grammar needed more parse stacks (an
	// ambiguous grammar) or more work per step than Limits allow. The
	// sequence should finish with this as its reason.
	ErrStackLimit = errors.New("grammar parse state exceeds limits")
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidGrammar, fmt.Sprintf(format, args...))
}

func unsupportedf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupportedSchema, fmt.Sprintf(format, args...))
}

func tooLargef(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrGrammarTooLarge, fmt.Sprintf(format, args...))
}

// Limits bound what a client's grammar may cost. The zero value of a field
// means its default (DefaultLimits).
type Limits struct {
	MaxSourceBytes int // GBNF / schema / regex source size (default 256 KiB)
	MaxRules       int // rules after expanding repetitions and groups (default 20,000)
	MaxElements    int // grammar elements after lowering to bytes (default 400,000)
	MaxNesting     int // parenthesis / schema nesting depth while parsing (default 64)
	MaxRepeat      int // largest {m,n} bound, minLength, maxItems… (default 10,000)
	MaxStackDepth  int // parse stack depth at run time (default 1,024); deeper paths are cut off
	MaxStacks      int // parse stacks alive after one byte (default 2,048)
	MaxStepWork    int // stack nodes visited for one byte (default 200,000)
	MaxStates      int // compile-time DFA states while precomputing masks (default 200,000)
	MaxCompileWork int // stack nodes visited while precomputing masks (default 50,000,000)
	MaxMaskWork    int // stack nodes visited by one Mask or Accept (default 500,000)

	// Precompute is how long Compile spends precomputing the token sets
	// of grammar positions (default 40ms); the positions left are computed
	// the first time a Mask needs them (under the Grammar's lock), so a
	// rarely used corner of a large grammar costs nothing until used.
	// Negative: precompute everything.
	Precompute time.Duration
}

// DefaultLimits are the bounds used where a Limits field is zero.
var DefaultLimits = Limits{
	MaxSourceBytes: 256 << 10,
	MaxRules:       20000,
	MaxElements:    400000,
	MaxNesting:     64,
	MaxRepeat:      10000,
	MaxStackDepth:  1024,
	MaxStacks:      2048,
	MaxStepWork:    200000,
	MaxStates:      200000,
	MaxCompileWork: 50000000,
	MaxMaskWork:    500000,
	Precompute:     40 * time.Millisecond,
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&l.MaxSourceBytes, d.MaxSourceBytes)
	set(&l.MaxRules, d.MaxRules)
	set(&l.MaxElements, d.MaxElements)
	set(&l.MaxNesting, d.MaxNesting)
	set(&l.MaxRepeat, d.MaxRepeat)
	set(&l.MaxStackDepth, d.MaxStackDepth)
	set(&l.MaxStacks, d.MaxStacks)
	set(&l.MaxStepWork, d.MaxStepWork)
	set(&l.MaxStates, d.MaxStates)
	set(&l.MaxCompileWork, d.MaxCompileWork)
	set(&l.MaxMaskWork, d.MaxMaskWork)
	if l.Precompute == 0 {
		l.Precompute = d.Precompute
	}
	return l
}
