package grammar

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
)

var (
	byteVocabOnce sync.Once
	byteVocab     *Vocab
)

// getByteVocab is the 256 single bytes and one EOS (id 256).
func getByteVocab() *Vocab {
	byteVocabOnce.Do(func() {
		toks := make([][]byte, 257)
		for i := range 256 {
			toks[i] = []byte{byte(i)}
		}
		v, err := NewVocab(toks, []int32{256})
		if err != nil {
			panic(err)
		}
		byteVocab = v
	})
	return byteVocab
}

// matches reports whether s is a complete sentence of g (bytes as tokens),
// checking at every step that the mask agrees with Accept.
func matches(t *testing.T, g *Grammar, s string) bool {
	t.Helper()
	m, err := g.NewMatcher()
	if err != nil {
		t.Fatal(err)
	}
	mask := make([]uint64, g.Vocab().MaskWords())
	for i := 0; i < len(s); i++ {
		if _, err := m.Mask(mask); err != nil {
			t.Fatal(err)
		}
		allowed := MaskAllows(mask, int32(s[i]))
		err := m.Accept(int32(s[i]))
		if allowed != (err == nil) {
			t.Fatalf("%q at %d: mask says %v, Accept says %v", s, i, allowed, err)
		}
		if err != nil {
			if !errors.Is(err, ErrTokenRejected) {
				t.Fatal(err)
			}
			return false
		}
	}
	if _, err := m.Mask(mask); err != nil {
		t.Fatal(err)
	}
	if MaskAllows(mask, 256) != m.CanEnd() {
		t.Fatalf("%q: EOS bit %v but CanEnd %v", s, MaskAllows(mask, 256), m.CanEnd())
	}
	return m.CanEnd()
}

func TestGBNFMatch(t *testing.T) {
	cases := []struct {
		name    string
		grammar string
		yes, no []string
	}{
		{"literal", `root ::= "abc"`, []string{"abc"}, []string{"", "ab", "abcd", "abd"}},
		{"alternation", `root ::= "a" | "bc" | ""`, []string{"a", "bc", ""}, []string{"b", "abc"}},
		{"sequence and rules", "root ::= a b\na ::= \"x\"\nb ::= \"y\" | \"z\"", []string{"xy", "xz"}, []string{"x", "yx"}},
		{"star", `root ::= "a"*`, []string{"", "a", "aaaa"}, []string{"b", "aab"}},
		{"plus", `root ::= "ab"+`, []string{"ab", "abab"}, []string{"", "aba"}},
		{"optional", `root ::= "a" "b"? "c"`, []string{"ac", "abc"}, []string{"abbc", "a"}},
		{"braces", `root ::= [0-9]{2,4}`, []string{"12", "123", "1234"}, []string{"1", "12345", "1a"}},
		{"braces exact", `root ::= "x"{3}`, []string{"xxx"}, []string{"xx", "xxxx"}},
		{"braces open", `root ::= "x"{2,}`, []string{"xx", "xxxxxx"}, []string{"x"}},
		{"braces max only", `root ::= "x"{,2}`, []string{"", "x", "xx"}, []string{"xxx"}},
		{"class ranges", `root ::= [a-cx-z]+`, []string{"abcxyz"}, []string{"d", "w"}},
		{"negated class", `root ::= [^a-z]`, []string{"A", "1", "é", "日"}, []string{"a", "z", "AB"}},
		{"escapes", `root ::= "\x41\u00e9\n\t\"\\" [\]\[-]`, []string{"Aé\n\t\"\\]", "Aé\n\t\"\\[", "Aé\n\t\"\\-"}, []string{"Ae\n\t\"\\]"}},
		{"dot is any character", `root ::= . .`, []string{"ab", "日本", "\n\x00", "é!"}, []string{"a", "abc", "\xff\xfe"}},
		{"utf8 class", `root ::= [α-ω日]+`, []string{"αβω", "日日"}, []string{"a", "Α"}},
		{"supplementary", `root ::= [\U0001F600-\U0001F64F]`, []string{"😀", "🙏"}, []string{"😐x", "\xf0\x9f\x98"}},
		{"groups nested", `root ::= ("a" ("b" | "c")*)+ "."`, []string{"a.", "abcab."}, []string{"b.", "a"}},
		{"comments and newlines", "# a comment\nroot ::= ( # open\n  \"a\" |\n  \"b\" ) # close\n\n", []string{"a", "b"}, []string{"ab"}},
		{"right recursion", "root ::= \"(\" root \")\" | \"x\"", []string{"x", "(x)", "(((x)))"}, []string{"(x", "()"}},
		{"nullable inside", "root ::= a \"b\"\na ::= \"a\"?", []string{"b", "ab"}, []string{"aab"}},
		{"empty literal", `root ::= "" "a"`, []string{"a"}, []string{""}},
		{"json grammar", strings.TrimSpace(`
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}`), []string{`{}`, `{"a": [1, 2.5, "x", true, null, {"b": {}}]}`, "{\n  \"k\": \"\\u00e9\"}"}, []string{`{"a"}`, `[]`, `{"a": 01x}`}},
	}
	v := getByteVocab()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := Compile(context.Background(), v, KindGBNF, c.grammar, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range c.yes {
				if !matches(t, g, s) {
					t.Errorf("%q should match", s)
				}
			}
			for _, s := range c.no {
				if matches(t, g, s) {
					t.Errorf("%q should not match", s)
				}
			}
		})
	}
}

func TestGBNFInvalid(t *testing.T) {
	cases := []struct {
		name, grammar string
		want          error
		msg           string
		lim           Limits
	}{
		{"no root", `a ::= "x"`, ErrInvalidGrammar, "no rule named root", Limits{}},
		{"undefined rule", `root ::= a`, ErrInvalidGrammar, `undefined rule "a"`, Limits{}},
		{"missing ::=", `root "x"`, ErrInvalidGrammar, "expecting ::=", Limits{}},
		{"unterminated string", `root ::= "abc`, ErrInvalidGrammar, "unterminated string", Limits{}},
		{"unterminated class", `root ::= [abc`, ErrInvalidGrammar, "unterminated character class", Limits{}},
		{"reversed range", `root ::= [z-a]`, ErrInvalidGrammar, "reversed", Limits{}},
		{"bad escape", `root ::= "\q"`, ErrInvalidGrammar, "unknown escape", Limits{}},
		{"unbalanced paren", `root ::= ("a"`, ErrInvalidGrammar, "expecting )", Limits{}},
		{"stray operator", `root ::= * "a"`, ErrInvalidGrammar, "without a preceding element", Limits{}},
		{"double operator", `root ::= "a"**`, ErrInvalidGrammar, "without a preceding element", Limits{}},
		{"bad braces", `root ::= "a"{x}`, ErrInvalidGrammar, "expecting a number", Limits{}},
		{"braces max below min", `root ::= "a"{3,2}`, ErrInvalidGrammar, "max below min", Limits{}},
		{"defined twice", "root ::= \"a\"\nroot ::= \"b\"", ErrInvalidGrammar, "defined twice", Limits{}},
		{"left recursion", `root ::= root "a" | "b"`, ErrInvalidGrammar, "left-recursive", Limits{}},
		{"indirect left recursion", "root ::= a\na ::= b? root \"x\" | \"y\"\nb ::= \"b\"", ErrInvalidGrammar, "left-recursive", Limits{}},
		{"nullable star", `root ::= ("a"?)*`, ErrInvalidGrammar, "left-recursive", Limits{}},
		{"infinite", "root ::= \"a\" root", ErrInvalidGrammar, "no finite string", Limits{}},
		{"two rules on a line", `root ::= "a" b ::= "c"`, ErrInvalidGrammar, "expecting newline", Limits{}},
		{"token refs", `root ::= <think>`, ErrInvalidGrammar, "token references", Limits{}},
		{"empty class", `root ::= [^\x00-\U0010FFFF]`, ErrInvalidGrammar, "matches nothing", Limits{}},
		{"repeat too large", `root ::= "a"{1,100000}`, ErrGrammarTooLarge, "repetition count", Limits{}},
		{"nesting too deep", "root ::= " + strings.Repeat("(", 100) + `"a"` + strings.Repeat(")", 100), ErrGrammarTooLarge, "nested deeper", Limits{}},
		{"source too large", "root ::= \"" + strings.Repeat("a", 300<<10) + "\"", ErrGrammarTooLarge, "source is", Limits{}},
		{"expansion too large", `root ::= ("a" [b-c] "d"){2000}`, ErrGrammarTooLarge, "elements", Limits{MaxElements: 1000}},
		{"too many rules", `root ::= ("a" [b-c] "d")? ("a"{0,50})`, ErrGrammarTooLarge, "rules", Limits{MaxRules: 20}},
		{"not utf8", "root ::= \"\xff\"", ErrInvalidGrammar, "UTF-8", Limits{}},
	}
	v := getByteVocab()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Compile(context.Background(), v, KindGBNF, c.grammar, c.lim)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q does not say %q", err, c.msg)
			}
		})
	}
}

func TestAmbiguousGrammarStackLimit(t *testing.T) {
	// every split of a run of a's is a parse: the stacks multiply
	g, err := Compile(context.Background(), getByteVocab(), KindGBNF,
		"root ::= x*\nx ::= \"a\" | \"a\" \"a\" | y\ny ::= \"a\" x? \"b\"?", Limits{MaxStacks: 16})
	if err != nil {
		t.Fatal(err)
	}
	m, err := g.NewMatcher()
	if err != nil {
		t.Fatal(err)
	}
	var last error
	for range 64 {
		if last = m.Accept('a'); last != nil {
			break
		}
	}
	if !errors.Is(last, ErrStackLimit) {
		t.Fatalf("got %v, want ErrStackLimit", last)
	}
}

func TestStackDepthLimit(t *testing.T) {
	g, err := Compile(context.Background(), getByteVocab(), KindGBNF, `root ::= "(" root ")" | "x"`, Limits{MaxStackDepth: 10})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := g.NewMatcher()
	var last error
	for range 100 {
		if last = m.Accept('('); last != nil {
			break
		}
	}
	if !errors.Is(last, ErrStackLimit) || m.Accepted() > 10 {
		t.Fatalf("nesting not cut off: %v after %d", last, m.Accepted())
	}
}

func TestDeadEnd(t *testing.T) {
	// the vocabulary cannot spell "b": after "a" nothing is allowed and the
	// grammar cannot end
	toks := [][]byte{[]byte("a"), []byte("c"), nil}
	v, err := NewVocab(toks, []int32{2})
	if err != nil {
		t.Fatal(err)
	}
	g, err := Compile(context.Background(), v, KindGBNF, `root ::= "ab" | "c"`, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := g.NewMatcher()
	mask := make([]uint64, v.MaskWords())
	if n, _ := m.Mask(mask); n != 2 || !MaskAllows(mask, 0) || !MaskAllows(mask, 1) {
		t.Fatalf("start: %d allowed, mask %b", n, mask[0])
	}
	if err := m.Accept(0); err != nil {
		t.Fatal(err)
	}
	n, err := m.Mask(mask)
	if err != nil || n != 0 || m.CanEnd() {
		t.Fatalf("dead end not reported: %d allowed, CanEnd %v, err %v", n, m.CanEnd(), err)
	}
	if err := m.Accept(2); !errors.Is(err, ErrTokenRejected) {
		t.Fatalf("EOS at a dead end: %v", err)
	}
	// rollback and take the other branch
	if err := m.Rollback(1); err != nil {
		t.Fatal(err)
	}
	if err := m.Accept(1); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.Mask(mask); n != 1 || !MaskAllows(mask, 2) || !m.CanEnd() {
		t.Fatalf("after c: %d allowed, CanEnd %v", n, m.CanEnd())
	}
	if err := m.Accept(2); err != nil || !m.IsTerminated() {
		t.Fatalf("EOS: %v terminated %v", err, m.IsTerminated())
	}
	if n, _ := m.Mask(mask); n != 0 {
		t.Fatalf("after EOS: %d allowed", n)
	}
	if err := m.Accept(1); !errors.Is(err, ErrTerminated) {
		t.Fatalf("after EOS: %v", err)
	}
}

// TestCompileCanceled: a cancelled context fails the compile, also when
// the precompute budget runs out before the loop's first check of it (a
// slow host under the race detector did that with the default 40 ms).
func TestCompileCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, lim := range []Limits{{}, {Precompute: 1}} {
		_, err := Compile(ctx, getSmallVocab(t), KindJSON, "", lim)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("precompute %v: got %v", lim.Precompute, err)
		}
	}
}
