package grammar

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The primitive rules, as llama.cpp's json-schema-to-grammar writes them,
// with two changes: a \u escape never spells a UTF-16 surrogate (a lone one
// decodes to U+FFFD and a pair counts as one character for minLength), and
// an exponent has at most two digits.
var jsonPrimitives = map[string]string{
	"space":         `| " " | "\n"{1,2} [ \t]{0,20}`,
	"boolean":       `"true" | "false"`,
	"null":          `"null"`,
	"char":          `[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" ([0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))`,
	"string":        `"\"" char* "\""`,
	"integral-part": `[0] | [1-9] [0-9]{0,15}`,
	"decimal-part":  `[0-9]{1,16}`,
	"number":        `("-"? integral-part) ("." decimal-part)? ([eE] [-+]? [0-9]{1,2})?`,
	"integer":       `"-"? integral-part`,
	"value":         `object | array | string | number | boolean | null`,
	// value is written out at each place (not a shared rule) so that a
	// string or number inside knows what follows it (see specialize)
	"object":    `"{" space ( string space ":" space (object | array | string | number | boolean | null) space ("," space string space ":" space (object | array | string | number | boolean | null) space)* )? "}"`,
	"array":     `"[" space ( (object | array | string | number | boolean | null) space ("," space (object | array | string | number | boolean | null) space)* )? "]"`,
	"date":      `[0-9]{4} "-" ( ("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8]) )`,
	"time":      `([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])`,
	"date-time": `date "T" time`,
	"uuid":      `[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}`,
}

var primitiveDeps = map[string][]string{
	"string": {"char"},
	"number": {"integral-part", "decimal-part"}, "integer": {"integral-part"},
	"value":  {"object", "array", "string", "number", "boolean", "null"},
	"object": {"space", "string", "number", "boolean", "null", "array"}, "array": {"space", "string", "number", "boolean", "null", "object"},
	"date-time": {"date", "time"},
}

// AnyJSONObjectGBNF is the grammar of KindJSON: one JSON object with
// bounded whitespace between tokens.
var AnyJSONObjectGBNF = func() string {
	c := &schemaConv{defined: map[string]bool{}}
	c.usePrimitive("object")
	c.usePrimitive("space")
	return "root ::= object space\n" + c.out.String()
}()

// Keywords that constrain values in ways this converter cannot enforce:
// a schema that uses one is refused (ErrUnsupportedSchema).
var refusedKeywords = []string{
	"not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired",
	"dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems", "contains",
	"minContains", "maxContains", "multipleOf", "minProperties", "maxProperties", "$dynamicRef",
	"$recursiveRef",
}

// SchemaToGBNF translates a JSON Schema to GBNF. See doc.go for what is
// supported. It checks ctx as it goes (every ctxCheckVisits schemas
// visited) and stops with ctx's error once the caller has gone.
func SchemaToGBNF(ctx context.Context, schema []byte, lim Limits) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("converting the JSON schema: %w", err)
	}
	lim = lim.withDefaults()
	if len(schema) > lim.MaxSourceBytes {
		return "", tooLargef("schema is %d bytes (limit %d)", len(schema), lim.MaxSourceBytes)
	}
	root, err := parseJSONOrdered(schema, lim.MaxNesting*4)
	if err != nil {
		return "", err
	}
	c := &schemaConv{ctx: ctx, root: root, lim: lim, fold: maxFoldRunes, defined: map[string]bool{}, refs: map[string]string{}}
	body, err := c.visit(root, "root", 0)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	c.usePrimitive("space")
	b.WriteString("root ::= " + body + " space\n")
	b.WriteString(c.out.String())
	if b.Len() > lim.MaxSourceBytes*8 {
		return "", tooLargef("schema expands to a %d-byte grammar", b.Len())
	}
	return b.String(), nil
}

type schemaConv struct {
	ctx     context.Context
	visits  int // schemas visited: ctx is checked every ctxCheckVisits
	fold    int // what is left of maxFoldRunes for the patterns
	root    *jv
	lim     Limits
	out     strings.Builder
	defined map[string]bool
	refs    map[string]string // $ref → rule name
	n       int
}

var nonWord = regexp.MustCompile(`[^a-zA-Z0-9-]+`)

func (c *schemaConv) newName(hint string) string {
	hint = nonWord.ReplaceAllString(hint, "-")
	if len(hint) > 40 {
		hint = hint[:40]
	}
	if hint == "" || c.defined[hint] || jsonPrimitives[hint] != "" || hint == "root" {
		for {
			c.n++
			h := fmt.Sprintf("%s-%d", hint, c.n)
			if !c.defined[h] && jsonPrimitives[h] == "" {
				hint = h
				break
			}
		}
	}
	c.defined[hint] = true
	return hint
}

func (c *schemaConv) addRule(hint, body string) string {
	name := c.newName(hint)
	c.out.WriteString(name + " ::= " + body + "\n")
	return name
}

func (c *schemaConv) usePrimitive(name string) string {
	if c.defined[name] {
		return name
	}
	c.defined[name] = true
	for _, d := range primitiveDeps[name] {
		c.usePrimitive(d)
	}
	c.out.WriteString(name + " ::= " + jsonPrimitives[name] + "\n")
	return name
}

// ctxCheckVisits is how often the conversion checks its context: a visit's
// own work is bounded by Limits (mostly microseconds), so the caller's end
// is noticed soon, and the check costs nothing next to the visits.
const ctxCheckVisits = 64

func (c *schemaConv) check() error {
	if c.out.Len() > c.lim.MaxSourceBytes*8 {
		return tooLargef("schema expands to a grammar over %d bytes", c.lim.MaxSourceBytes*8)
	}
	return nil
}

// visit returns a GBNF expression for the values s accepts. Whitespace is
// written by the enclosing object or array (and after the root value), not
// after each value, so that a value's last byte ends its rule: a token that
// goes on past it is then rarely context-dependent.
func (c *schemaConv) visit(s *jv, name string, depth int) (string, error) {
	if depth > c.lim.MaxNesting {
		return "", tooLargef("schema nested deeper than %d", c.lim.MaxNesting)
	}
	if c.visits++; c.visits%ctxCheckVisits == 1 {
		if err := c.ctx.Err(); err != nil {
			return "", fmt.Errorf("converting the JSON schema: %w", err)
		}
	}
	if err := c.check(); err != nil {
		return "", err
	}
	switch s.kind {
	case 'b':
		if s.b {
			return c.usePrimitive("value"), nil
		}
		return "", unsupportedf("schema false at %s matches nothing", name)
	case 'o':
	default:
		return "", invalidf("schema at %s is not an object or a boolean", name)
	}
	for _, k := range refusedKeywords {
		if s.get(k) != nil {
			return "", unsupportedf("keyword %q (at %s) is not supported", k, name)
		}
	}
	if u := s.get("uniqueItems"); u != nil && u.kind == 'b' && u.b {
		return "", unsupportedf("keyword \"uniqueItems\" (at %s) is not supported", name)
	}
	if r := s.get("$ref"); r != nil {
		if r.kind != 's' {
			return "", invalidf("$ref at %s is not a string", name)
		}
		return c.ref(r.str, depth)
	}
	if x := s.get("const"); x != nil {
		return c.literals([]*jv{x}), nil
	}
	if x := s.get("enum"); x != nil {
		if x.kind != 'a' || len(x.arr) == 0 {
			return "", invalidf("enum at %s is not a non-empty array", name)
		}
		return c.literals(x.arr), nil
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if x := s.get(k); x != nil {
			if x.kind != 'a' || len(x.arr) == 0 {
				return "", invalidf("%s at %s is not a non-empty array", k, name)
			}
			var alts []string
			for i, sub := range x.arr {
				e, err := c.visit(sub, fmt.Sprintf("%s-%d", name, i), depth+1)
				if err != nil {
					return "", err
				}
				alts = append(alts, e)
			}
			return c.addRule(name, strings.Join(alts, " | ")), nil
		}
	}
	if x := s.get("allOf"); x != nil {
		merged, err := c.mergeAllOf(s, x, name)
		if err != nil {
			return "", err
		}
		return c.visit(merged, name, depth+1)
	}
	t := s.get("type")
	var types []string
	switch {
	case t == nil:
		switch {
		case s.get("properties") != nil || s.get("additionalProperties") != nil || s.get("required") != nil:
			types = []string{"object"}
		case s.get("items") != nil || s.get("prefixItems") != nil || s.get("minItems") != nil || s.get("maxItems") != nil:
			types = []string{"array"}
		case s.get("minLength") != nil || s.get("maxLength") != nil || s.get("pattern") != nil || s.get("format") != nil:
			types = []string{"string"}
		case s.get("minimum") != nil || s.get("maximum") != nil || s.get("exclusiveMinimum") != nil || s.get("exclusiveMaximum") != nil:
			types = []string{"number"}
		default:
			return c.usePrimitive("value"), nil
		}
	case t.kind == 's':
		types = []string{t.str}
	case t.kind == 'a' && len(t.arr) > 0:
		for _, x := range t.arr {
			if x.kind != 's' {
				return "", invalidf("type at %s is not a string or an array of strings", name)
			}
			types = append(types, x.str)
		}
	default:
		return "", invalidf("type at %s is not a string or an array of strings", name)
	}
	var alts []string
	for _, ty := range types {
		e, err := c.typed(s, ty, name, depth)
		if err != nil {
			return "", err
		}
		alts = append(alts, e)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return c.addRule(name, strings.Join(alts, " | ")), nil
}

func (c *schemaConv) literals(vals []*jv) string {
	var alts []string
	for _, v := range vals {
		var b strings.Builder
		v.compact(&b)
		alts = append(alts, gbnfLiteral(b.String()))
	}
	return "(" + strings.Join(alts, " | ") + ")"
}

func (c *schemaConv) ref(ref string, depth int) (string, error) {
	if name, ok := c.refs[ref]; ok {
		return name, nil
	}
	if !strings.HasPrefix(ref, "#") {
		return "", unsupportedf("$ref %q: only references inside the schema (#/$defs/…, #/definitions/…) are supported", ref)
	}
	target := c.root
	if p := strings.TrimPrefix(ref, "#"); p != "" {
		if !strings.HasPrefix(p, "/") {
			return "", unsupportedf("$ref %q: anchors are not supported", ref)
		}
		for _, part := range strings.Split(p[1:], "/") {
			part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
			switch {
			case target.kind == 'o':
				target = target.get(part)
			case target.kind == 'a':
				i, err := strconv.Atoi(part)
				if err != nil || i < 0 || i >= len(target.arr) {
					target = nil
				} else {
					target = target.arr[i]
				}
			default:
				target = nil
			}
			if target == nil {
				return "", invalidf("$ref %q points to nothing", ref)
			}
		}
	}
	hint := ref[strings.LastIndexByte(ref, '/')+1:]
	if hint == "" || hint == "#" {
		hint = "root-ref"
	}
	name := c.newName("ref-" + hint)
	c.refs[ref] = name // before visiting: recursive schemas refer to it
	body, err := c.visit(target, name+"-body", depth+1)
	if err != nil {
		return "", err
	}
	c.out.WriteString(name + " ::= " + body + "\n")
	return name, nil
}

func (c *schemaConv) mergeAllOf(s, all *jv, name string) (*jv, error) {
	if all.kind != 'a' || len(all.arr) == 0 {
		return nil, invalidf("allOf at %s is not a non-empty array", name)
	}
	merged := &jv{kind: 'o'}
	for _, kv := range s.obj {
		if kv.k != "allOf" {
			merged.obj = append(merged.obj, kv)
		}
	}
	parts := slices.Clone(all.arr)
	if len(merged.obj) > 0 {
		parts = append(parts, merged)
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	props := &jv{kind: 'o'}
	req := &jv{kind: 'a'}
	out := &jv{kind: 'o', obj: []jkv{{"type", &jv{kind: 's', str: "object"}}, {"properties", props}, {"required", req}}}
	var addl *jv
	for _, p := range parts {
		for p.kind == 'o' && p.get("$ref") != nil && len(p.obj) == 1 {
			r := p.get("$ref")
			t, err := c.resolve(r.str)
			if err != nil {
				return nil, err
			}
			p = t
		}
		if p.kind != 'o' {
			return nil, unsupportedf("allOf at %s: only objects can be combined", name)
		}
		for _, kv := range p.obj {
			switch kv.k {
			case "type":
				if kv.v.kind != 's' || kv.v.str != "object" {
					return nil, unsupportedf("allOf at %s: only object schemas can be combined", name)
				}
			case "properties":
				if kv.v.kind != 'o' {
					return nil, invalidf("properties at %s is not an object", name)
				}
				for _, pk := range kv.v.obj {
					if props.get(pk.k) != nil {
						return nil, unsupportedf("allOf at %s: property %q defined twice", name, pk.k)
					}
					props.obj = append(props.obj, pk)
				}
			case "required":
				if kv.v.kind == 'a' {
					req.arr = append(req.arr, kv.v.arr...)
				}
			case "additionalProperties":
				addl = kv.v
			case "title", "description", "$comment", "default", "examples", "$defs", "definitions", "$schema", "$id":
			default:
				return nil, unsupportedf("allOf at %s: keyword %q cannot be combined", name, kv.k)
			}
		}
	}
	if addl != nil {
		out.obj = append(out.obj, jkv{"additionalProperties", addl})
	}
	return out, nil
}

func (c *schemaConv) resolve(ref string) (*jv, error) {
	if !strings.HasPrefix(ref, "#/") {
		return nil, unsupportedf("$ref %q in allOf is not supported", ref)
	}
	t := c.root
	for _, part := range strings.Split(ref[2:], "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		if t = t.get(part); t == nil {
			return nil, invalidf("$ref %q points to nothing", ref)
		}
	}
	return t, nil
}

func (c *schemaConv) typed(s *jv, ty, name string, depth int) (string, error) {
	switch ty {
	case "null", "boolean":
		return c.usePrimitive(ty), nil
	case "string":
		return c.stringRule(s, name)
	case "integer", "number":
		return c.numberRule(s, ty, name)
	case "array":
		return c.arrayRule(s, name, depth)
	case "object":
		return c.objectRule(s, name, depth)
	}
	return "", invalidf("unknown type %q at %s", ty, name)
}

func intKeyword(s *jv, k string, def int, lim Limits) (int, error) {
	x := s.get(k)
	if x == nil {
		return def, nil
	}
	if x.kind != 'n' {
		return 0, invalidf("%s is not a number", k)
	}
	f, err := x.num.Float64()
	if err != nil || f < 0 || f != math.Trunc(f) {
		return 0, invalidf("%s is not a non-negative integer", k)
	}
	if f > float64(lim.MaxRepeat) {
		return 0, tooLargef("%s %v over %d", k, f, lim.MaxRepeat)
	}
	return int(f), nil
}

func (c *schemaConv) stringRule(s *jv, name string) (string, error) {
	minL, err := intKeyword(s, "minLength", 0, c.lim)
	if err != nil {
		return "", err
	}
	maxL, err := intKeyword(s, "maxLength", -1, c.lim)
	if err != nil {
		return "", err
	}
	if maxL >= 0 && maxL < minL {
		return "", unsupportedf("maxLength below minLength at %s", name)
	}
	c.usePrimitive("space")
	if f := s.get("format"); f != nil && f.kind == 's' {
		switch f.str {
		case "date", "time", "date-time", "uuid":
			if s.get("pattern") != nil || s.get("minLength") != nil || s.get("maxLength") != nil {
				return "", unsupportedf("format %q with pattern or lengths at %s", f.str, name)
			}
			return `"\"" ` + c.usePrimitive(f.str) + ` "\""`, nil
		}
		// other formats are annotations here, as in llama.cpp
	}
	if p := s.get("pattern"); p != nil {
		if p.kind != 's' {
			return "", invalidf("pattern at %s is not a string", name)
		}
		if s.get("minLength") != nil || s.get("maxLength") != nil {
			return "", unsupportedf("pattern with minLength/maxLength at %s", name)
		}
		body, err := regexBody(c.ctx, p.str, true, c.lim, &c.fold)
		if err != nil {
			return "", err
		}
		return c.addRule(name, `"\"" `+body+` "\""`), nil
	}
	if minL == 0 && maxL < 0 {
		return c.usePrimitive("string"), nil
	}
	c.usePrimitive("char")
	rep := fmt.Sprintf("{%d,}", minL)
	if maxL >= 0 {
		rep = fmt.Sprintf("{%d,%d}", minL, maxL)
	}
	return c.addRule(name, `"\"" char`+rep+` "\""`), nil
}

// numBound reads a numeric keyword as a rational with the same floor and
// ceiling as the keyword's value (see boundLiteral): all numberRule uses.
func numBound(s *jv, k string) (*big.Rat, error) {
	x := s.get(k)
	if x == nil {
		return nil, nil
	}
	if x.kind != 'n' {
		return nil, invalidf("%s is not a number", k)
	}
	lit, ok := boundLiteral(x.num.String())
	if !ok {
		return nil, invalidf("%s %.40s is not a number", k, x.num)
	}
	r, ok := new(big.Rat).SetString(lit)
	if !ok {
		return nil, invalidf("%s %.40s is not a number", k, x.num)
	}
	return r, nil
}

// boundDigits is the most integer digits boundLiteral keeps: a bound of
// more is beyond the ±(10^maxIntDigits - 1) that numberRule clamps to,
// whatever its ceiling or floor ±1.
const boundDigits = maxIntDigits + 2

// boundLiteral cuts a JSON number literal down to a short decimal with the
// same floor and ceiling, in work linear in the literal, before any
// big-number arithmetic: big.Rat.SetString expands an exponent into its
// digits (tens of milliseconds for 1e999999, from a 9-byte literal) and a
// long fraction into a huge denominator. A bound matters to numberRule
// only through the integers it admits, clamped to maxIntDigits digits, so
//   - a value of more than boundDigits integer digits saturates to
//     ±10^boundDigits: beyond the clamp either way, as 1e308 or
//     -1.7976931348623157e308 (the float64 extremes that real schemas
//     write) or 1e999999 are;
//   - a fraction counts only by being zero or not: a non-zero one is .5
//     (1.5e-999999 is 0.5: its floor is 0 and its ceiling 1).
//
// So every valid bound keeps its meaning, and none costs more than its
// bytes. ok is false when lit is not a JSON number.
func boundLiteral(lit string) (_ string, ok bool) {
	sign := ""
	if strings.HasPrefix(lit, "-") {
		sign, lit = "-", lit[1:]
	}
	mant, exp := lit, ""
	if i := strings.IndexAny(lit, "eE"); i >= 0 {
		mant, exp = lit[:i], lit[i+1:]
		if exp == "" {
			return "", false
		}
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	if intPart == "" || !allDecimal(intPart) || !allDecimal(frac) {
		return "", false
	}
	e, ok := saturatedExponent(exp)
	if !ok {
		return "", false
	}
	// The value is 0.d × 10^point, d the digits from the first non-zero one.
	digits := intPart + frac
	first := strings.IndexFunc(digits, func(r rune) bool { return r != '0' })
	if first < 0 {
		return "0", true
	}
	digits = digits[first:]
	point := len(intPart) - first + e
	switch {
	case point > boundDigits:
		return sign + "1" + strings.Repeat("0", boundDigits), true
	case point <= 0:
		return sign + "0.5", true
	}
	whole := digits[:min(point, len(digits))] + strings.Repeat("0", max(point-len(digits), 0))
	if strings.Trim(digits[min(point, len(digits)):], "0") != "" {
		whole += ".5"
	}
	return sign + whole, true
}

// saturatedExponent reads a literal's exponent (digits after an optional
// sign; "" is 0), saturating far beyond any that boundLiteral tells apart
// (it adds at most the literal's length to it).
func saturatedExponent(exp string) (int, bool) {
	neg := false
	switch {
	case strings.HasPrefix(exp, "-"):
		neg, exp = true, exp[1:]
	case strings.HasPrefix(exp, "+"):
		exp = exp[1:]
	case exp == "":
		return 0, true
	}
	if exp == "" || !allDecimal(exp) {
		return 0, false
	}
	exp = strings.TrimLeft(exp, "0")
	e := 1 << 30 // beyond: a source is far shorter than this
	if len(exp) <= 9 {
		e, _ = strconv.Atoi(exp)
	}
	if neg {
		e = -e
	}
	return e, true
}

func allDecimal(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

const maxIntDigits = 16

func (c *schemaConv) numberRule(s *jv, ty, name string) (string, error) {
	var bounds [4]*big.Rat
	for i, k := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		r, err := numBound(s, k)
		if err != nil {
			return "", err
		}
		bounds[i] = r
	}
	if bounds[0] == nil && bounds[1] == nil && bounds[2] == nil && bounds[3] == nil {
		return c.usePrimitive(ty), nil
	}
	// the integers that satisfy every bound
	lo, hi := (*big.Int)(nil), (*big.Int)(nil)
	raise := func(x *big.Int) {
		if lo == nil || x.Cmp(lo) > 0 {
			lo = x
		}
	}
	lower := func(x *big.Int) {
		if hi == nil || x.Cmp(hi) < 0 {
			hi = x
		}
	}
	if r := bounds[0]; r != nil {
		raise(ratCeil(r))
	}
	if r := bounds[1]; r != nil {
		raise(new(big.Int).Add(ratFloor(r), big.NewInt(1)))
	}
	if r := bounds[2]; r != nil {
		lower(ratFloor(r))
	}
	if r := bounds[3]; r != nil {
		lower(new(big.Int).Sub(ratCeil(r), big.NewInt(1)))
	}
	limit := new(big.Int).Exp(big.NewInt(10), big.NewInt(maxIntDigits), nil)
	limit.Sub(limit, big.NewInt(1))
	negLimit := new(big.Int).Neg(limit)
	if lo != nil && lo.Cmp(limit) > 0 || hi != nil && hi.Cmp(negLimit) < 0 {
		return "", unsupportedf("bounds at %s beyond %d digits", name, maxIntDigits)
	}
	if lo == nil || lo.Cmp(negLimit) < 0 {
		lo = negLimit
	}
	if hi == nil || hi.Cmp(limit) > 0 {
		hi = limit
	}
	if lo.Cmp(hi) > 0 {
		return "", unsupportedf("no integer satisfies the bounds at %s (non-integer ranges are not supported)", name)
	}
	c.usePrimitive("space")
	intPart := intRangeGBNF(lo, hi)
	if ty == "integer" {
		return c.addRule(name, intPart), nil
	}
	// a fraction after n keeps n.f inside the bounds when n >= 0 and n+1
	// is still allowed
	fLo := new(big.Int).Set(lo)
	if fLo.Sign() < 0 {
		fLo.SetInt64(0)
	}
	fHi := new(big.Int).Sub(hi, big.NewInt(1))
	if fLo.Cmp(fHi) > 0 {
		return c.addRule(name, intPart), nil
	}
	c.usePrimitive("decimal-part")
	return c.addRule(name, intPart+" | ("+intRangeGBNF(fLo, fHi)+") \".\" decimal-part"), nil
}

func ratFloor(r *big.Rat) *big.Int {
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	_ = m
	return q // DivMod rounds towards -inf for positive denominators
}

func ratCeil(r *big.Rat) *big.Int {
	q := ratFloor(r)
	if !r.IsInt() {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// intRangeGBNF is an expression matching the decimal integers in [lo, hi]
// without leading zeros (and without "-0").
func intRangeGBNF(lo, hi *big.Int) string {
	var alts []string
	if lo.Sign() < 0 {
		nhi := new(big.Int).Neg(lo)
		nlo := big.NewInt(1)
		if hi.Sign() < 0 {
			nlo.Neg(hi)
		}
		alts = append(alts, `"-" (`+natRange(nlo.String(), nhi.String())+`)`)
	}
	if hi.Sign() >= 0 {
		plo := "0"
		if lo.Sign() > 0 {
			plo = lo.String()
		}
		alts = append(alts, natRange(plo, hi.String()))
	}
	return strings.Join(alts, " | ")
}

// natRange matches the naturals in [lo, hi] (decimal strings, lo <= hi).
func natRange(lo, hi string) string {
	var alts []string
	for l := len(lo); l <= len(hi); l++ {
		a, b := lo, hi
		if l > len(lo) {
			a = "1" + strings.Repeat("0", l-1)
		}
		if l < len(hi) {
			b = strings.Repeat("9", l)
		}
		if a > b {
			continue
		}
		alts = append(alts, sameLenRange(a, b))
	}
	if len(alts) == 1 {
		return alts[0]
	}
	return "(" + strings.Join(alts, " | ") + ")"
}

// sameLenRange matches the digit strings of one length in [a, b].
func sameLenRange(a, b string) string {
	if a == "" {
		return `""`
	}
	if a == b {
		return gbnfLiteral(a)
	}
	n := len(a)
	allDigits := func(s string, d byte) bool {
		for i := 0; i < len(s); i++ {
			if s[i] != d {
				return false
			}
		}
		return true
	}
	digits := func(k int) string {
		switch k {
		case 0:
			return ""
		case 1:
			return " [0-9]"
		}
		return fmt.Sprintf(" [0-9]{%d}", k)
	}
	cls := func(x, y byte) string {
		if x == y {
			return gbnfLiteral(string(x))
		}
		return fmt.Sprintf("[%c-%c]", x, y)
	}
	if a[0] == b[0] {
		return gbnfLiteral(a[:1]) + " (" + sameLenRange(a[1:], b[1:]) + ")"
	}
	var alts []string
	x, y := a[0], b[0]
	if !allDigits(a[1:], '0') {
		alts = append(alts, gbnfLiteral(a[:1])+" ("+sameLenRange(a[1:], strings.Repeat("9", n-1))+")")
		x++
	}
	if !allDigits(b[1:], '9') {
		alts = append(alts, gbnfLiteral(b[:1])+" ("+sameLenRange(strings.Repeat("0", n-1), b[1:])+")")
		y--
	}
	if x <= y {
		alts = append(alts, cls(x, y)+digits(n-1))
	}
	return "(" + strings.Join(alts, " | ") + ")"
}

func (c *schemaConv) arrayRule(s *jv, name string, depth int) (string, error) {
	minI, err := intKeyword(s, "minItems", 0, c.lim)
	if err != nil {
		return "", err
	}
	maxI, err := intKeyword(s, "maxItems", -1, c.lim)
	if err != nil {
		return "", err
	}
	if maxI >= 0 && maxI < minI {
		return "", unsupportedf("maxItems below minItems at %s", name)
	}
	c.usePrimitive("space")
	var elems []string // the prefix items, in order
	if p := s.get("prefixItems"); p != nil {
		if p.kind != 'a' {
			return "", invalidf("prefixItems at %s is not an array", name)
		}
		for i, sub := range p.arr {
			e, err := c.visit(sub, fmt.Sprintf("%s-%d", name, i), depth+1)
			if err != nil {
				return "", err
			}
			elems = append(elems, e)
		}
	}
	item := ""
	if it := s.get("items"); it == nil || it.kind == 'b' && it.b {
		item = c.usePrimitive("value")
	} else if !(it.kind == 'b' && !it.b) {
		if item, err = c.visit(it, name+"-item", depth+1); err != nil {
			return "", err
		}
	}
	if maxI >= 0 && len(elems) > maxI {
		elems = elems[:maxI]
	}
	if len(elems) < minI && item == "" {
		return "", unsupportedf("minItems %d at %s exceeds the prefix items with items false", minI, name)
	}
	// the prefix items all present, then more items within the bounds
	k := len(elems)
	restMin := max(0, minI-k)
	restMax := -1
	if maxI >= 0 {
		restMax = maxI - k
	}
	if item == "" {
		restMax = 0
	}
	var parts []string
	for i, e := range elems {
		if i > 0 {
			parts = append(parts, `"," space`)
		}
		parts = append(parts, e+" space")
	}
	if restMax != 0 {
		rep := func(lo, hi int) string {
			if hi < 0 {
				return fmt.Sprintf("{%d,}", lo)
			}
			return fmt.Sprintf("{%d,%d}", lo, hi)
		}
		if k > 0 {
			parts = append(parts, `("," space `+item+` space)`+rep(restMin, restMax))
		} else {
			sub := ""
			if restMax < 0 {
				sub = item + ` space ("," space ` + item + ` space)` + rep(max(0, restMin-1), -1)
			} else {
				sub = item + ` space ("," space ` + item + ` space)` + rep(max(0, restMin-1), restMax-1)
			}
			if restMin == 0 {
				sub = "(" + sub + ")?"
			}
			parts = append(parts, sub)
		}
	}
	body := `"[" space ` + strings.Join(parts, " ") + ` "]"`
	return c.addRule(name, body), nil
}

func (c *schemaConv) objectRule(s *jv, name string, depth int) (string, error) {
	c.usePrimitive("space")
	props := s.get("properties")
	if props != nil && props.kind != 'o' {
		return "", invalidf("properties at %s is not an object", name)
	}
	addl := s.get("additionalProperties")
	if props == nil && s.get("required") == nil && (addl == nil || addl.kind == 'b' && addl.b) {
		return c.usePrimitive("object"), nil
	}
	required := map[string]bool{}
	if r := s.get("required"); r != nil {
		if r.kind != 'a' {
			return "", invalidf("required at %s is not an array", name)
		}
		for _, x := range r.arr {
			if x.kind != 's' {
				return "", invalidf("required at %s holds a non-string", name)
			}
			required[x.str] = true
		}
	}
	type prop struct {
		key string
		kv  string
	}
	var req, opt []prop
	known := map[string]bool{}
	if props != nil {
		for _, kv := range props.obj {
			known[kv.k] = true
			val, err := c.visit(kv.v, name+"-"+kv.k, depth+1)
			if err != nil {
				return "", err
			}
			p := prop{kv.k, gbnfLiteral(jsonQuote(kv.k)) + ` space ":" space ` + val + " space"}
			if required[kv.k] {
				req = append(req, p)
			} else {
				opt = append(opt, p)
			}
		}
	}
	// additional properties: absent means none, as in llama.cpp (generation
	// is a subset of what validates)
	extra := ""
	if addl != nil && !(addl.kind == 'b' && !addl.b) {
		val, err := c.visit(addl, name+"-additional", depth+1)
		if err != nil {
			return "", err
		}
		extra = c.keyNotIn(name, known) + ` space ":" space ` + val + " space"
	}
	for k := range required {
		if !known[k] {
			if extra == "" {
				return "", unsupportedf("required property %q at %s is not in properties and additionalProperties is false", k, name)
			}
			req = append(req, prop{k, gbnfLiteral(jsonQuote(k)) + ` space ":" space ` + c.usePrimitive("value") + " space"})
		}
	}
	var parts []string
	for i, p := range req {
		if i > 0 {
			parts = append(parts, `"," space`)
		}
		parts = append(parts, p.kv)
	}
	var body string
	if len(req) > 0 {
		for _, p := range opt {
			parts = append(parts, `("," space `+p.kv+`)?`)
		}
		if extra != "" {
			parts = append(parts, `("," space `+extra+`)*`)
		}
		body = strings.Join(parts, " ")
	} else if len(opt) > 0 || extra != "" {
		// no required property: the first one present has no comma
		rest := ""
		if extra != "" {
			rest = c.addRule(name+"-rest", `("," space `+extra+`)*`)
		}
		var alts []string
		if extra != "" {
			alts = append(alts, extra+" "+rest)
		}
		for i := len(opt) - 1; i >= 0; i-- {
			alt := opt[i].kv
			if rest != "" {
				alt += " " + rest
			}
			alts = append(alts, alt)
			r := `("," space ` + opt[i].kv + `)?`
			if rest != "" {
				r += " " + rest
			}
			rest = c.addRule(name+"-rest", r)
		}
		slices.Reverse(alts)
		body = "(" + strings.Join(alts, " | ") + ")?"
	}
	return c.addRule(name, `"{" space `+body+` "}"`), nil
}

// keyNotIn is a JSON string key (plain characters, no escapes) that is not
// one of the known property names, so an additional property never repeats
// a declared one.
func (c *schemaConv) keyNotIn(name string, known map[string]bool) string {
	const safe = `[^"\\\x7F\x00-\x1F]`
	type trie struct {
		kids map[rune]*trie
		end  bool
	}
	root := &trie{kids: map[rune]*trie{}}
	for k := range known {
		if strings.ContainsAny(k, "\"\\\x7f") || strings.IndexFunc(k, func(r rune) bool { return r < 0x20 }) >= 0 {
			continue // a key the safe characters cannot spell
		}
		t := root
		for _, r := range k {
			n := t.kids[r]
			if n == nil {
				n = &trie{kids: map[rune]*trie{}}
				t.kids[r] = n
			}
			t = n
		}
		t.end = true
	}
	tail := c.addRule(name+"-key-tail", safe+`* "\""`)
	var build func(t *trie) string
	build = func(t *trie) string {
		var alts []string
		var kids []rune
		for r := range t.kids {
			kids = append(kids, r)
		}
		slices.Sort(kids)
		if len(kids) == 0 {
			if t.end {
				return c.addRule(name+"-key", safe+" "+tail)
			}
			return tail
		}
		var excl []cpRange
		for _, r := range kids {
			excl = append(excl, cpRange{r, r})
			alts = append(alts, gbnfLiteral(string(r))+" "+build(t.kids[r]))
		}
		other := intersectRanges(negRanges(normRanges(excl)), negRanges([]cpRange{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}}))
		alts = append(alts, gbnfClass(other)+" "+tail)
		if !t.end {
			alts = append(alts, `"\""`)
		}
		return c.addRule(name+"-key", strings.Join(alts, " | "))
	}
	return `"\"" ` + build(root)
}
