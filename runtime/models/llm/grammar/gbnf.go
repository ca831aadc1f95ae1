package grammar

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The GBNF parser builds a grammar over Unicode code points (irGrammar);
// lower.go then turns it into a grammar over bytes.

type cpRange struct{ lo, hi rune }

// irSym is a rule reference (ref >= 0) or a character class (ref < 0).
type irSym struct {
	ref int32
	cls []cpRange // sorted, non-overlapping, non-adjacent
}

type irRule struct {
	name    string
	alts    [][]irSym
	defined bool
	offset  int   // where it was first referenced or defined, for errors
	origin  int32 // the rule this one is a copy of (see specialize), or -1
}

type irGrammar struct {
	rules  []irRule
	byName map[string]int32
	root   int32
	nsyms  int
}

const maxRune = 0x10FFFF

type gbnfParser struct {
	src   string
	pos   int
	g     *irGrammar
	lim   Limits
	depth int
	anon  int
}

// parseGBNF parses llama.cpp's GBNF: `name ::= alternatives` rules separated
// by newlines, alternatives with `|`, sequences of "literals", [classes],
// rule names, (groups), `.`, and the postfix operators * + ? {m} {m,} {m,n}
// {,n}; `#` comments. The start rule is `root`.
func parseGBNF(src string, lim Limits) (*irGrammar, error) {
	if len(src) > lim.MaxSourceBytes {
		return nil, tooLargef("grammar source is %d bytes (limit %d)", len(src), lim.MaxSourceBytes)
	}
	if !utf8.ValidString(src) {
		return nil, invalidf("grammar source is not valid UTF-8")
	}
	p := &gbnfParser{src: src, g: &irGrammar{byName: map[string]int32{}}, lim: lim}
	p.space(true)
	for p.pos < len(p.src) {
		if err := p.rule(); err != nil {
			return nil, err
		}
		p.space(true)
	}
	for _, r := range p.g.rules {
		if !r.defined {
			return nil, p.errAt(r.offset, "undefined rule %q", r.name)
		}
	}
	root, ok := p.g.byName["root"]
	if !ok {
		return nil, invalidf("grammar has no rule named root")
	}
	p.g.root = root
	return p.g, nil
}

func (p *gbnfParser) errAt(off int, format string, args ...any) error {
	line := 1 + strings.Count(p.src[:min(off, len(p.src))], "\n")
	col := off - strings.LastIndexByte(p.src[:min(off, len(p.src))], '\n')
	return invalidf("line %d col %d: %s", line, col, fmt.Sprintf(format, args...))
}

func (p *gbnfParser) errf(format string, args ...any) error {
	return p.errAt(p.pos, format, args...)
}

// space skips blanks and comments; newlines too when nl.
func (p *gbnfParser) space(nl bool) {
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		switch {
		case c == ' ' || c == '\t':
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' && p.src[p.pos] != '\r' {
				p.pos++
			}
		case nl && (c == '\n' || c == '\r'):
			p.pos++
		default:
			return
		}
	}
}

func isWordChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func (p *gbnfParser) name() string {
	s := p.pos
	for p.pos < len(p.src) && isWordChar(p.src[p.pos]) {
		p.pos++
	}
	return p.src[s:p.pos]
}

func (p *gbnfParser) ruleID(name string, off int) (int32, error) {
	if id, ok := p.g.byName[name]; ok {
		return id, nil
	}
	if len(p.g.rules) >= p.lim.MaxRules {
		return 0, tooLargef("more than %d rules", p.lim.MaxRules)
	}
	id := int32(len(p.g.rules))
	p.g.rules = append(p.g.rules, irRule{name: name, offset: off, origin: -1})
	p.g.byName[name] = id
	return id, nil
}

func (p *gbnfParser) newRule(alts [][]irSym) (int32, error) {
	p.anon++
	// names with a character GBNF cannot spell never clash with user rules
	id, err := p.ruleID(fmt.Sprintf("anon~%d", p.anon), p.pos)
	if err != nil {
		return 0, err
	}
	p.g.rules[id].alts = alts
	p.g.rules[id].defined = true
	return id, nil
}

func (p *gbnfParser) rule() error {
	start := p.pos
	name := p.name()
	if name == "" {
		return p.errf("expecting a rule name")
	}
	p.space(false)
	if !strings.HasPrefix(p.src[p.pos:], "::=") {
		return p.errf("expecting ::= after rule name %q", name)
	}
	p.pos += 3
	p.space(true)
	id, err := p.ruleID(name, start)
	if err != nil {
		return err
	}
	if p.g.rules[id].defined {
		return p.errAt(start, "rule %q defined twice", name)
	}
	p.g.rules[id].defined = true
	alts, err := p.alternates(false)
	if err != nil {
		return err
	}
	p.g.rules[id].alts = alts
	if p.pos < len(p.src) {
		switch p.src[p.pos] {
		case '\r', '\n':
		default:
			return p.errf("expecting newline or end after rule %q, found %q", name, p.src[p.pos])
		}
	}
	return nil
}

func (p *gbnfParser) alternates(nested bool) ([][]irSym, error) {
	var alts [][]irSym
	for {
		seq, err := p.sequence(nested)
		if err != nil {
			return nil, err
		}
		alts = append(alts, seq)
		if p.pos < len(p.src) && p.src[p.pos] == '|' {
			p.pos++
			p.space(true)
			continue
		}
		return alts, nil
	}
}

func (p *gbnfParser) addSyms(seq []irSym, syms ...irSym) ([]irSym, error) {
	p.g.nsyms += len(syms)
	if p.g.nsyms > p.lim.MaxElements {
		return nil, tooLargef("more than %d grammar elements", p.lim.MaxElements)
	}
	return append(seq, syms...), nil
}

func (p *gbnfParser) sequence(nested bool) ([]irSym, error) {
	seq := []irSym{}
	last := -1 // start in seq of the last symbol (a literal is several)
	var err error
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		switch {
		case c == '"':
			p.pos++
			last = len(seq)
			for {
				if p.pos >= len(p.src) {
					return nil, p.errf("unterminated string literal")
				}
				if p.src[p.pos] == '"' {
					p.pos++
					break
				}
				if p.src[p.pos] == '\n' || p.src[p.pos] == '\r' {
					return nil, p.errf("newline in string literal")
				}
				r, err := p.char()
				if err != nil {
					return nil, err
				}
				if seq, err = p.addSyms(seq, irSym{ref: -1, cls: []cpRange{{r, r}}}); err != nil {
					return nil, err
				}
			}
			if last == len(seq) { // "" matches the empty string: a group of nothing
				id, err := p.newRule([][]irSym{{}})
				if err != nil {
					return nil, err
				}
				if seq, err = p.addSyms(seq, irSym{ref: id}); err != nil {
					return nil, err
				}
			}
		case c == '[':
			p.pos++
			cls, err := p.class()
			if err != nil {
				return nil, err
			}
			last = len(seq)
			if seq, err = p.addSyms(seq, irSym{ref: -1, cls: cls}); err != nil {
				return nil, err
			}
		case c == '.':
			p.pos++
			last = len(seq)
			if seq, err = p.addSyms(seq, irSym{ref: -1, cls: []cpRange{{0, maxRune}}}); err != nil {
				return nil, err
			}
		case isWordChar(c):
			off := p.pos
			name := p.name()
			id, err := p.ruleID(name, off)
			if err != nil {
				return nil, err
			}
			last = len(seq)
			if seq, err = p.addSyms(seq, irSym{ref: id}); err != nil {
				return nil, err
			}
		case c == '(':
			p.pos++
			p.depth++
			if p.depth > p.lim.MaxNesting {
				return nil, tooLargef("parentheses nested deeper than %d", p.lim.MaxNesting)
			}
			p.space(true)
			alts, err := p.alternates(true)
			if err != nil {
				return nil, err
			}
			if p.pos >= len(p.src) || p.src[p.pos] != ')' {
				return nil, p.errf("expecting )")
			}
			p.pos++
			p.depth--
			id, err := p.newRule(alts)
			if err != nil {
				return nil, err
			}
			last = len(seq)
			if seq, err = p.addSyms(seq, irSym{ref: id}); err != nil {
				return nil, err
			}
		case c == '*' || c == '+' || c == '?' || c == '{':
			if last < 0 {
				return nil, p.errf("%q without a preceding element", c)
			}
			lo, hi := 0, -1
			p.pos++
			switch c {
			case '+':
				lo = 1
			case '?':
				hi = 1
			case '{':
				if lo, hi, err = p.braces(); err != nil {
					return nil, err
				}
			}
			if seq, err = p.repeat(seq, last, lo, hi); err != nil {
				return nil, err
			}
			last = -1 // x** is an error, as in llama.cpp
		case c == '<':
			return nil, p.errf("token references (<...>) are not supported")
		default:
			return seq, nil
		}
		p.space(nested)
	}
	return seq, nil
}

func (p *gbnfParser) braces() (int, int, error) {
	p.space(false)
	num := func() (int, bool, error) {
		s := p.pos
		for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
			p.pos++
		}
		if s == p.pos {
			return 0, false, nil
		}
		n, err := strconv.Atoi(p.src[s:p.pos])
		if err != nil || n > p.lim.MaxRepeat {
			return 0, false, tooLargef("repetition count %s over %d", p.src[s:p.pos], p.lim.MaxRepeat)
		}
		return n, true, nil
	}
	lo, okLo, err := num()
	if err != nil {
		return 0, 0, err
	}
	p.space(false)
	hi := lo
	if p.pos < len(p.src) && p.src[p.pos] == ',' {
		p.pos++
		p.space(false)
		var okHi bool
		if hi, okHi, err = num(); err != nil {
			return 0, 0, err
		}
		if !okHi {
			hi = -1
		}
		if !okLo && !okHi {
			return 0, 0, p.errf("expecting a number in {}")
		}
	} else if !okLo {
		return 0, 0, p.errf("expecting a number in {}")
	}
	p.space(false)
	if p.pos >= len(p.src) || p.src[p.pos] != '}' {
		return 0, 0, p.errf("expecting }")
	}
	p.pos++
	if hi >= 0 && hi < lo {
		return 0, 0, p.errf("repetition {%d,%d} has max below min", lo, hi)
	}
	return lo, hi, nil
}

// repeat replaces seq[last:] (one element) by it repeated lo..hi times
// (hi < 0: unbounded), as llama.cpp does: x{2,4} is x x (x (x)?)?, x* is a
// new right-recursive rule r ::= x r | (empty).
func (p *gbnfParser) repeat(seq []irSym, last, lo, hi int) ([]irSym, error) {
	item := slices.Clone(seq[last:])
	seq = seq[:last]
	if len(item) > 1 { // a literal: repeat it as a group
		id, err := p.newRule([][]irSym{item})
		if err != nil {
			return nil, err
		}
		item = []irSym{{ref: id}}
	}
	var err error
	for i := 0; i < lo; i++ {
		if seq, err = p.addSyms(seq, item...); err != nil {
			return nil, err
		}
	}
	if hi < 0 {
		id, err := p.ruleID(fmt.Sprintf("star~%d", p.anon+1), p.pos)
		if err != nil {
			return nil, err
		}
		p.anon++
		p.g.rules[id].defined = true
		p.g.rules[id].alts = [][]irSym{append(slices.Clone(item), irSym{ref: id}), {}}
		p.g.nsyms += len(item) + 1
		return p.addSyms(seq, irSym{ref: id})
	}
	if hi == lo {
		return seq, nil
	}
	// (x (x (x)?)?)? built inside out
	var tail []irSym
	for i := 0; i < hi-lo; i++ {
		alt := append(slices.Clone(item), tail...)
		id, err := p.newRule([][]irSym{alt, {}})
		if err != nil {
			return nil, err
		}
		p.g.nsyms += len(alt)
		if p.g.nsyms > p.lim.MaxElements {
			return nil, tooLargef("more than %d grammar elements", p.lim.MaxElements)
		}
		tail = []irSym{{ref: id}}
	}
	return p.addSyms(seq, tail...)
}

// char reads one possibly escaped character of a literal or class.
func (p *gbnfParser) char() (rune, error) {
	if p.src[p.pos] != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		p.pos += n
		return r, nil
	}
	p.pos++
	if p.pos >= len(p.src) {
		return 0, p.errf("unfinished escape")
	}
	c := p.src[p.pos]
	p.pos++
	hex := 0
	switch c {
	case 'x':
		hex = 2
	case 'u':
		hex = 4
	case 'U':
		hex = 8
	case 't':
		return '\t', nil
	case 'r':
		return '\r', nil
	case 'n':
		return '\n', nil
	case '\\', '"', '[', ']', '-', '^', '/', '\'':
		return rune(c), nil
	default:
		return 0, p.errAt(p.pos-2, "unknown escape \\%c", c)
	}
	if p.pos+hex > len(p.src) {
		return 0, p.errf("short \\%c escape", c)
	}
	v, err := strconv.ParseUint(p.src[p.pos:p.pos+hex], 16, 32)
	if err != nil {
		return 0, p.errf("bad hex in \\%c escape", c)
	}
	p.pos += hex
	if v > maxRune {
		return 0, p.errf("code point %#x beyond Unicode", v)
	}
	return rune(v), nil
}

func (p *gbnfParser) class() ([]cpRange, error) {
	neg := false
	if p.pos < len(p.src) && p.src[p.pos] == '^' {
		neg = true
		p.pos++
	}
	var rs []cpRange
	for {
		if p.pos >= len(p.src) {
			return nil, p.errf("unterminated character class")
		}
		if p.src[p.pos] == ']' {
			p.pos++
			break
		}
		lo, err := p.char()
		if err != nil {
			return nil, err
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			if hi, err = p.char(); err != nil {
				return nil, err
			}
			if hi < lo {
				return nil, p.errf("character range %q-%q is reversed", lo, hi)
			}
		}
		rs = append(rs, cpRange{lo, hi})
	}
	rs = normRanges(rs)
	if neg {
		rs = negRanges(rs)
	}
	if len(rs) == 0 {
		return nil, p.errf("character class matches nothing")
	}
	return rs, nil
}

func normRanges(rs []cpRange) []cpRange {
	slices.SortFunc(rs, func(a, b cpRange) int { return int(a.lo) - int(b.lo) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

func negRanges(rs []cpRange) []cpRange {
	var out []cpRange
	next := rune(0)
	for _, r := range rs {
		if r.lo > next {
			out = append(out, cpRange{next, r.lo - 1})
		}
		next = r.hi + 1
	}
	if next <= maxRune {
		out = append(out, cpRange{next, maxRune})
	}
	return out
}
