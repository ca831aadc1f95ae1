package grammar

import (
	"context"
	"errors"
	"testing"
)

// A grammar or schema from a client either compiles or fails with one of
// the sentinels; it never panics, and a compiled one runs within its
// bounds for a few bytes.
func checkCompileOutcome(t *testing.T, kind Kind, src string) {
	lim := Limits{MaxSourceBytes: 4096, MaxRules: 2000, MaxElements: 20000, MaxRepeat: 200, MaxStates: 20000,
		MaxCompileWork: 2000000, MaxMaskWork: 200000, MaxStepWork: 20000}
	g, err := Compile(context.Background(), getByteVocab(), kind, src, lim)
	if err != nil {
		if !errors.Is(err, ErrInvalidGrammar) && !errors.Is(err, ErrUnsupportedSchema) && !errors.Is(err, ErrGrammarTooLarge) {
			t.Fatalf("%q: error without a sentinel: %v", src, err)
		}
		return
	}
	m, err := g.NewMatcher()
	if err != nil {
		if !errors.Is(err, ErrStackLimit) && !errors.Is(err, ErrInvalidGrammar) {
			t.Fatalf("%q: %v", src, err)
		}
		return
	}
	mask := make([]uint64, g.Vocab().MaskWords())
	for range 8 {
		n, err := m.Mask(mask)
		if err != nil || n == 0 {
			return
		}
		if err := m.Accept(nthSet(mask, 0)); err != nil && !errors.Is(err, ErrStackLimit) && !errors.Is(err, ErrTerminated) {
			t.Fatalf("%q: an allowed token was refused: %v", src, err)
		}
	}
}

func FuzzGBNF(f *testing.F) {
	for _, s := range []string{
		`root ::= "a" | [b-d]+ x?` + "\nx ::= (\"y\" | .){1,3}",
		"root ::= \"(\" root \")\" | [^()]*",
		`root ::= [\x00-\U0010FFFF]{2} "\u00e9\t"`,
		"# c\nroot ::= a\na ::= \"\" | \"a\" a",
		`root ::= root "x"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) { checkCompileOutcome(t, KindGBNF, src) })
}

func FuzzSchema(f *testing.F) {
	for _, s := range []string{
		`{"type":"object","properties":{"a":{"type":"integer","minimum":-3,"maximum":40},"b":{"type":"array","items":{"enum":["x",1]},"maxItems":2}},"required":["a"]}`,
		`{"$defs":{"n":{"anyOf":[{"type":"null"},{"type":"array","items":{"$ref":"#/$defs/n"}}]}},"$ref":"#/$defs/n"}`,
		`{"type":"string","pattern":"^[a-c]{2}$"}`,
		`{"type":["string","number"],"minLength":1,"maxLength":4}`,
		`{"type":"object","additionalProperties":{"type":"boolean"},"properties":{"k":{"const":null}}}`,
		`{"type":"number","minimum":-1.5e-999999,"exclusiveMaximum":1.7976931348623157e308}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) { checkCompileOutcome(t, KindJSONSchema, src) })
}

func FuzzRegex(f *testing.F) {
	for _, s := range []string{`^a+(b|c)?\d{1,3}$`, `(?i)[^x-z]*`, `.\w\s\p{Han}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) { checkCompileOutcome(t, KindRegex, src) })
}
