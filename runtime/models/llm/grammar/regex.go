package grammar

import (
	"fmt"
	"regexp/syntax"
	"strings"
	"unicode"
)

// RegexToGBNF translates a regular expression (Go's RE2 syntax with Perl
// flags, as regexp.Compile reads it: literals, classes including \d \w \s
// and Unicode classes, `.` (not newline), groups, alternation, * + ? {m,n},
// (?i)) into GBNF. The whole output must match: leading ^/\A and trailing
// $/\z are allowed and change nothing; anchors elsewhere and \b \B are
// refused.
func RegexToGBNF(re string, lim Limits) (string, error) {
	lim = lim.withDefaults()
	if len(re) > lim.MaxSourceBytes {
		return "", tooLargef("regular expression is %d bytes (limit %d)", len(re), lim.MaxSourceBytes)
	}
	body, err := regexBody(re, false, lim)
	if err != nil {
		return "", err
	}
	return "root ::= " + body + "\n", nil
}

// regexBody converts re to one GBNF expression. In json mode it matches
// the content of a JSON string whose decoded value matches re somewhere
// (JSON Schema's "pattern" is unanchored unless it says ^ or $).
func regexBody(re string, json bool, lim Limits) (string, error) {
	r, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return "", invalidf("regular expression: %v", err)
	}
	if nestDepth(r) > lim.MaxNesting {
		return "", tooLargef("regular expression nested deeper than %d", lim.MaxNesting)
	}
	c := &regexConv{json: json, lim: lim}
	anchoredStart, anchoredEnd := false, false
	subs := []*syntax.Regexp{r}
	if r.Op == syntax.OpConcat {
		subs = r.Sub
	}
	if len(subs) > 0 && (subs[0].Op == syntax.OpBeginText || subs[0].Op == syntax.OpBeginLine) {
		anchoredStart = true
		subs = subs[1:]
	}
	if len(subs) > 0 && (subs[len(subs)-1].Op == syntax.OpEndText || subs[len(subs)-1].Op == syntax.OpEndLine) {
		anchoredEnd = true
		subs = subs[:len(subs)-1]
	}
	var parts []string
	if json && !anchoredStart {
		parts = append(parts, c.anyChars())
	}
	for _, s := range subs {
		e, err := c.expr(s)
		if err != nil {
			return "", err
		}
		parts = append(parts, e)
	}
	if json && !anchoredEnd {
		parts = append(parts, c.anyChars())
	}
	if len(parts) == 0 {
		return `""`, nil
	}
	if c.size > lim.MaxElements {
		return "", tooLargef("regular expression expands to more than %d elements", lim.MaxElements)
	}
	return strings.Join(parts, " "), nil
}

func nestDepth(r *syntax.Regexp) int {
	d := 0
	for _, s := range r.Sub {
		d = max(d, nestDepth(s))
	}
	return d + 1
}

type regexConv struct {
	json bool
	lim  Limits
	size int
}

func (c *regexConv) anyChars() string {
	return `[^"\\\x00-\x1F\x7F]*`
}

// class renders a set of runes; in json mode as JSON string content.
func (c *regexConv) class(rs []cpRange) (string, error) {
	c.size += len(rs)
	if !c.json {
		return gbnfClass(rs), nil
	}
	var alts []string
	var safe []cpRange
	hasQuote, hasBackslash := false, false
	for _, r := range rs {
		for _, x := range []rune{'"', '\\'} {
			if r.lo <= x && x <= r.hi {
				if x == '"' {
					hasQuote = true
				} else {
					hasBackslash = true
				}
			}
		}
	}
	safe = intersectRanges(rs, negRanges([]cpRange{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}}))
	if len(safe) > 0 {
		alts = append(alts, gbnfClass(safe))
	}
	if hasQuote {
		alts = append(alts, `"\\\""`)
	}
	if hasBackslash {
		alts = append(alts, `"\\\\"`)
	}
	switch len(alts) {
	case 0:
		return "", unsupportedf("pattern needs control characters, which this engine does not escape")
	case 1:
		return alts[0], nil
	}
	return "(" + strings.Join(alts, " | ") + ")", nil
}

func intersectRanges(a, b []cpRange) []cpRange {
	var out []cpRange
	for _, x := range a {
		for _, y := range b {
			lo, hi := max(x.lo, y.lo), min(x.hi, y.hi)
			if lo <= hi {
				out = append(out, cpRange{lo, hi})
			}
		}
	}
	return normRanges(out)
}

func (c *regexConv) lit(r rune, fold bool) (string, error) {
	rs := []cpRange{{r, r}}
	if fold {
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			rs = append(rs, cpRange{f, f})
		}
		rs = normRanges(rs)
	}
	if len(rs) == 1 && !c.json {
		c.size++
		return gbnfLiteral(string(r)), nil
	}
	return c.class(rs)
}

func (c *regexConv) expr(r *syntax.Regexp) (string, error) {
	if c.size > c.lim.MaxElements {
		return "", tooLargef("regular expression expands to more than %d elements", c.lim.MaxElements)
	}
	switch r.Op {
	case syntax.OpNoMatch:
		return "", invalidf("regular expression matches nothing")
	case syntax.OpEmptyMatch:
		return `""`, nil
	case syntax.OpLiteral:
		var parts []string
		for _, x := range r.Rune {
			s, err := c.lit(x, r.Flags&syntax.FoldCase != 0)
			if err != nil {
				return "", err
			}
			parts = append(parts, s)
		}
		if len(parts) == 1 {
			return parts[0], nil
		}
		return "(" + strings.Join(parts, " ") + ")", nil
	case syntax.OpCharClass:
		var rs []cpRange
		for i := 0; i+1 < len(r.Rune); i += 2 {
			rs = append(rs, cpRange{r.Rune[i], r.Rune[i+1]})
		}
		if len(rs) == 0 {
			return "", invalidf("regular expression has an empty character class")
		}
		return c.class(normRanges(rs))
	case syntax.OpAnyCharNotNL:
		return c.class([]cpRange{{0, '\n' - 1}, {'\n' + 1, maxRune}})
	case syntax.OpAnyChar:
		return c.class([]cpRange{{0, maxRune}})
	case syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText:
		return "", unsupportedOrInvalid(c.json, "anchors (^ $ \\A \\z) are only allowed at the start and end of the regular expression")
	case syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return "", unsupportedOrInvalid(c.json, "\\b and \\B are not supported")
	case syntax.OpCapture:
		return c.expr(r.Sub[0])
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		s, err := c.expr(r.Sub[0])
		if err != nil {
			return "", err
		}
		op := map[syntax.Op]string{syntax.OpStar: "*", syntax.OpPlus: "+", syntax.OpQuest: "?"}[r.Op]
		return "(" + s + ")" + op, nil
	case syntax.OpRepeat:
		if r.Min > c.lim.MaxRepeat || r.Max > c.lim.MaxRepeat {
			return "", tooLargef("repetition over %d", c.lim.MaxRepeat)
		}
		s, err := c.expr(r.Sub[0])
		if err != nil {
			return "", err
		}
		c.size += len(s) * max(r.Min, r.Max) / 4
		if r.Max < 0 {
			return fmt.Sprintf("(%s){%d,}", s, r.Min), nil
		}
		return fmt.Sprintf("(%s){%d,%d}", s, r.Min, r.Max), nil
	case syntax.OpConcat:
		var parts []string
		for _, s := range r.Sub {
			e, err := c.expr(s)
			if err != nil {
				return "", err
			}
			parts = append(parts, e)
		}
		return "(" + strings.Join(parts, " ") + ")", nil
	case syntax.OpAlternate:
		var parts []string
		for _, s := range r.Sub {
			e, err := c.expr(s)
			if err != nil {
				return "", err
			}
			parts = append(parts, e)
		}
		return "(" + strings.Join(parts, " | ") + ")", nil
	}
	return "", invalidf("regular expression operator %v not supported", r.Op)
}

func unsupportedOrInvalid(json bool, msg string) error {
	if json {
		return unsupportedf("pattern: %s", msg)
	}
	return invalidf("%s", msg)
}

// gbnfLiteral quotes s as a GBNF string literal.
func gbnfLiteral(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		writeGBNFChar(&b, r, false)
	}
	b.WriteByte('"')
	return b.String()
}

// gbnfClass renders ranges as a GBNF character class.
func gbnfClass(rs []cpRange) string {
	if len(rs) == 1 && rs[0].lo == 0 && rs[0].hi == maxRune {
		return "."
	}
	var b strings.Builder
	b.WriteByte('[')
	for _, r := range rs {
		writeGBNFChar(&b, r.lo, true)
		if r.hi != r.lo {
			if r.hi > r.lo+1 {
				b.WriteByte('-')
			}
			writeGBNFChar(&b, r.hi, true)
		}
	}
	b.WriteByte(']')
	return b.String()
}

func writeGBNFChar(b *strings.Builder, r rune, inClass bool) {
	switch {
	case r == '"' || r == '\\' || (inClass && (r == ']' || r == '[' || r == '-' || r == '^')):
		b.WriteByte('\\')
		b.WriteRune(r)
	case r == '\n':
		b.WriteString(`\n`)
	case r == '\t':
		b.WriteString(`\t`)
	case r == '\r':
		b.WriteString(`\r`)
	case r < 0x20 || r == 0x7F:
		fmt.Fprintf(b, `\x%02X`, r)
	case r >= 0xD800 && r <= 0xDFFF || r > 0xFFFF && !unicode.IsPrint(r) || r >= 0x80 && !unicode.IsPrint(r):
		fmt.Fprintf(b, `\U%08X`, r)
	default:
		b.WriteRune(r)
	}
}
