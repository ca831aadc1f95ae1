package grammar

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestRegexFoldBound: regular expressions whose (?i) character classes
// would have Go's parser fold more than maxFoldRunes characters one at a
// time are refused before the parse (which cannot be interrupted: 256 KiB
// of them kept a core for over 30 s), for guided_regex and for a schema's
// patterns together; classes the parser folds cheaply, or not at all,
// are not counted.
func TestRegexFoldBound(t *testing.T) {
	wide := `[\x{42}-\x{1E942}]` // 125,185 characters folded one by one
	n := maxFoldRunes/125185 + 1
	schema := func(pattern string, props int) string {
		var b strings.Builder
		b.WriteString(`{"type": "object", "properties": {`)
		for i := range props {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(`"p` + strings.Repeat("x", i) + `": {"type": "string", "pattern": ` + jsonQuote(pattern) + `}`)
		}
		b.WriteString("}}")
		return b.String()
	}
	for _, tc := range []struct {
		name    string
		kind    Kind
		src     string
		refused bool
	}{
		{"hex ranges", KindRegex, "(?i)" + strings.Repeat(wide, n), true},
		{"negated", KindRegex, "(?i)" + strings.Repeat(`[^\x{42}-\x{1E942}]`, n), true},
		{"a group's flag", KindRegex, strings.Repeat(`(?i:[B-`+"\U0001E942"+`])`, n), true},
		{"among other class items", KindRegex, "(?i)" + strings.Repeat(`[[:alpha:]\pL\p{Greek}\d\102-\x{1E942}]`, n), true},
		{"a schema's patterns together", KindJSONSchema, schema("(?i)"+wide, n), true},
		{"one such class", KindRegex, "(?i)" + wide, false},
		{"no fold", KindRegex, strings.Repeat(wide, 2*n), false},
		{"ranges the parser takes whole", KindRegex, "(?i)" + strings.Repeat(`[\x{0}-\x{10FFFF}]`, 2*n), false},
		{"quoted", KindRegex, `(?i)\Q` + strings.Repeat(wide, 2*n) + `\E`, false},
		{"an address", KindRegex, `(?i)^[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}$`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ToGBNF(context.Background(), tc.kind, tc.src, Limits{})
			if tc.refused != errors.Is(err, ErrGrammarTooLarge) || !tc.refused && err != nil {
				t.Fatalf("error %v, want refused %v", err, tc.refused)
			}
		})
	}
}

// TestRegexToGBNFStops: the conversion of a regular expression checks its
// context, at the start and as it goes.
func TestRegexToGBNFStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := RegexToGBNF(ctx, "a", Limits{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	re := strings.Repeat("(a|b)", 4*ctxCheckNodes)
	if _, err := RegexToGBNF(&cancelAfter{Context: context.Background(), n: 1}, re, Limits{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled during the conversion: %v", err)
	}
	if _, err := RegexToGBNF(context.Background(), re, Limits{}); err != nil {
		t.Errorf("not cancelled: %v", err)
	}
}

// TestFoldCost: the characters counted for a class's ranges, whatever
// the syntax of their ends.
func TestFoldCost(t *testing.T) {
	for _, tc := range []struct {
		re   string
		want int
	}{
		{`[a-z]`, 0}, // no i flag: the parser folds nothing
		{`(?i)[a-z]`, 26},
		{`(?-i:[a-z])`, 26}, // counted: more is safe
		{`(?i)[\x41-\x5A]`, 26},
		{`(?i)[\101-\132]`, 26},
		{`(?i)[\x{41}-Z]`, 26},
		{`(?i)[]-a]`, 'a' - ']' + 1}, // ] first is a character
		{`(?i)[^]-a]`, 'a' - ']' + 1},
		{`(?i)[\]-a]`, 'a' - ']' + 1},
		{`(?i)[a-]`, 1},                  // a and -
		{`(?i)[\--a]`, 'a' - foldLo + 1}, // from - (below foldLo) to a
		{`(?i)[[:alpha:]\pL\p{Greek}\d\w\sa-c]`, 3},
		{`(?i)[\t-\x{10FFFF}]`, 0}, // all of the folded runes: taken whole
		{`(?i)[\x{1E944}-\x{10FFFF}]`, 0},
		{`(?i)[\x{1E900}-\x{10FFFF}]`, foldHi - 0x1E900 + 1},
		{`(?i)\[a-z]`, 0},         // not a class
		{`(?i)\Q[a-z]\E[a-c]`, 3}, // quoted
		{`(?i)[a-c][d-f]`, 6},
		{`(?i)[a-c` + "\U0001E942" + `-` + "\U0001E943" + `]`, 5},
	} {
		if got := foldCost(tc.re); got != tc.want {
			t.Errorf("foldCost(%q) = %d, want %d", tc.re, got, tc.want)
		}
	}
}

// A syntax error quotes a short part of the pattern: Go's quotes all of it
// from the fault on, and the error goes back to the caller in a 400.
func TestRegexErrorIsShort(t *testing.T) {
	for _, re := range []string{"(" + strings.Repeat("a", 200000), "[" + strings.Repeat("é", 100000), "a**"} {
		_, err := RegexToGBNF(context.Background(), re, DefaultLimits)
		if err == nil {
			t.Fatalf("%.10q: no error", re)
		}
		if msg := err.Error(); len(msg) > 200 || !utf8.ValidString(msg) {
			t.Errorf("%.10q: a %d-byte error (valid UTF-8: %v): %.120s", re, len(msg), utf8.ValidString(msg), msg)
		}
	}
}
