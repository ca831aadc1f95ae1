package grammar

import (
	"context"
	"errors"
	"fmt"
	"regexp/syntax"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// RegexToGBNF translates a regular expression (Go's RE2 syntax with Perl
// flags, as regexp.Compile reads it: literals, classes including \d \w \s
// and Unicode classes, `.` (not newline), groups, alternation, * + ? {m,n},
// (?i)) into GBNF. The whole output must match: leading ^/\A and trailing
// $/\z are allowed and change nothing; anchors elsewhere and \b \B are
// refused. It stops with ctx's error once the caller has gone.
func RegexToGBNF(ctx context.Context, re string, lim Limits) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("converting the regular expression: %w", err)
	}
	lim = lim.withDefaults()
	if len(re) > lim.MaxSourceBytes {
		return "", tooLargef("regular expression is %d bytes (limit %d)", len(re), lim.MaxSourceBytes)
	}
	fold := maxFoldRunes
	body, err := regexBody(ctx, re, false, lim, &fold)
	if err != nil {
		return "", err
	}
	return "root ::= " + body + "\n", nil
}

// regexBody converts re to one GBNF expression. In json mode it matches
// the content of a JSON string whose decoded value matches re somewhere
// (JSON Schema's "pattern" is unanchored unless it says ^ or $). fold is
// what is left of maxFoldRunes for the constraint's regular expressions.
func regexBody(ctx context.Context, re string, json bool, lim Limits, fold *int) (string, error) {
	// Refused before the parse, which cannot be interrupted.
	if *fold -= foldCost(re); *fold < 0 {
		return "", tooLargef("regular expression case-folds character classes of more than %d characters in all", maxFoldRunes)
	}
	r, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return "", invalidf("regular expression: %v", shortSyntaxError(err))
	}
	if nestDepth(r) > lim.MaxNesting {
		return "", tooLargef("regular expression nested deeper than %d", lim.MaxNesting)
	}
	c := &regexConv{ctx: ctx, json: json, lim: lim}
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
	ctx   context.Context
	json  bool
	lim   Limits
	size  int
	nodes int // expressions converted: ctx is checked every ctxCheckNodes
}

// ctxCheckNodes is how often a regular expression's conversion checks its
// context.
const ctxCheckNodes = 256

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
	if c.nodes++; c.nodes%ctxCheckNodes == 0 {
		if err := c.ctx.Err(); err != nil {
			return "", fmt.Errorf("converting the regular expression: %w", err)
		}
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

// maxFoldRunes bounds the characters that Go's regexp/syntax parser
// case-folds one at a time for one constraint's regular expressions: under
// (?i) it folds each character of a class range in turn (tens of
// nanoseconds each), and its parse cannot be interrupted, so 256 KiB of
// (?i)[\x{42}-\x{1E942}] kept a core busy for over 30 seconds, whether or
// not the caller was still there. 2M characters are a few dozen
// milliseconds; (?i) classes of real patterns fold hundreds.
const maxFoldRunes = 1 << 21

// The runes the parser folds one at a time (its minFold and maxFold).
const (
	foldLo = 0x41
	foldHi = 0x1E943
)

// foldCost is how many characters the parser would fold one at a time for
// re's character classes: the part of each range within [foldLo, foldHi],
// unless the range covers all of it (the parser takes that whole). 0 when
// re sets no i flag. It reads re only as far as it must to find class
// ranges; where it is unsure it counts more, never less.
func foldCost(re string) int {
	if !setsFold(re) {
		return 0
	}
	cost := 0
	for i := 0; i < len(re); {
		switch {
		case strings.HasPrefix(re[i:], `\Q`): // literal text to \E
			end := strings.Index(re[i+2:], `\E`)
			if end < 0 {
				return cost
			}
			i += 2 + end + 2
		case re[i] == '\\':
			i += 2 // an escaped byte (a rune's other bytes are never [ or \)
		case re[i] == '[':
			n, c := classFoldCost(re[i:])
			i, cost = i+n, cost+c
		default:
			i++
		}
	}
	return cost
}

// setsFold reports whether re has a flag group that names i ((?i),
// (?i:...), (?-i) too: counting more is safe).
func setsFold(re string) bool {
	for i := 0; ; {
		j := strings.Index(re[i:], "(?")
		if j < 0 {
			return false
		}
		i += j + 2
		for ; i < len(re) && strings.IndexByte("imsU-", re[i]) >= 0; i++ {
			if re[i] == 'i' {
				return true
			}
		}
	}
}

// classFoldCost reads the class that s starts with ([) as the parser does:
// its length in bytes, and the characters its ranges fold one at a time.
func classFoldCost(s string) (n, cost int) {
	t := strings.TrimPrefix(s[1:], "^")
	for first := true; t != "" && (t[0] != ']' || first); first = false {
		if strings.HasPrefix(t, "[:") { // [:alpha:]
			if end := strings.Index(t[2:], ":]"); end >= 0 {
				t = t[2+end+2:]
				continue
			}
		}
		if len(t) >= 2 && t[0] == '\\' && strings.IndexByte("pPdDsSwW", t[1]) >= 0 {
			// \pL, \p{Greek}, \d...: tables, which the parser folds whole
			named := t[1] == 'p' || t[1] == 'P'
			t = t[2:]
			switch {
			case named && strings.HasPrefix(t, "{"):
				if end := strings.IndexByte(t, '}'); end >= 0 {
					t = t[end+1:]
				}
			case named && t != "":
				_, size := utf8.DecodeRuneInString(t)
				t = t[size:]
			}
			continue
		}
		lo, rest, ok := classChar(t)
		if !ok {
			t = t[1:] // the parser refuses it; go on counting
			continue
		}
		t = rest
		hi := lo
		if len(t) >= 2 && t[0] == '-' && t[1] != ']' {
			if hi, rest, ok = classChar(t[1:]); !ok {
				t = t[1:]
				continue
			}
			t = rest
		}
		if lo <= foldLo && hi >= foldHi {
			continue
		}
		if w := min(hi, foldHi) - max(lo, foldLo) + 1; w > 0 {
			cost += int(w)
		}
	}
	if t != "" {
		t = t[1:] // ]
	}
	return len(s) - len(t), cost
}

// classChar reads one character of a class, a rune or an escape (ok false
// where the parser would refuse it).
func classChar(t string) (r rune, rest string, ok bool) {
	if t[0] != '\\' {
		r, size := utf8.DecodeRuneInString(t)
		return r, t[size:], true
	}
	if len(t) < 2 {
		return 0, "", false
	}
	c, t := t[1], t[2:]
	switch {
	case c == 'x' && strings.HasPrefix(t, "{"):
		end := strings.IndexByte(t, '}')
		if end < 0 {
			return 0, "", false
		}
		v, err := strconv.ParseUint(t[1:end], 16, 32)
		return rune(v), t[end+1:], err == nil
	case c == 'x':
		if len(t) < 2 {
			return 0, "", false
		}
		v, err := strconv.ParseUint(t[:2], 16, 8)
		return rune(v), t[2:], err == nil
	case '0' <= c && c <= '7': // octal, up to three digits
		v := rune(c - '0')
		for k := 0; k < 2 && t != "" && '0' <= t[0] && t[0] <= '7'; k++ {
			v, t = v*8+rune(t[0]-'0'), t[1:]
		}
		return v, t, true
	case c >= utf8.RuneSelf:
		return 0, "", false
	}
	if i := strings.IndexByte("afnrtv", c); i >= 0 {
		return rune("\a\f\n\r\t\v"[i]), t, true
	}
	return rune(c), t, true
}

// maxErrExpr bounds the part of a pattern a syntax error quotes: Go's
// quotes everything from the fault on (an unclosed "(" the whole
// pattern, up to 256 KiB), and the error goes back in a 400's body.
const maxErrExpr = 64

func shortSyntaxError(err error) error {
	var se *syntax.Error
	if !errors.As(err, &se) || len(se.Expr) <= maxErrExpr {
		return err
	}
	cut := maxErrExpr
	for cut > 0 && !utf8.RuneStart(se.Expr[cut]) {
		cut--
	}
	return &syntax.Error{Code: se.Code, Expr: se.Expr[:cut] + "…"}
}
