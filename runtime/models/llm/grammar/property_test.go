package grammar

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

const propertySeeds = 200

// propertySchemas exercise every supported keyword.
var propertySchemas = []string{
	toolSchema,
	`{"type":"object","properties":{"n":{"type":"integer","minimum":-20,"maximum":1234},"x":{"type":"number","minimum":0.5,"exclusiveMaximum":10},
	  "neg":{"type":"integer","maximum":-7},"big":{"type":"integer","exclusiveMinimum":999}},"required":["n","x","neg","big"],"additionalProperties":false}`,
	`{"type":"array","items":{"type":"object","properties":{"k":{"const":"v"},"e":{"enum":[1,"two",null,true,{"a":[1]}]}},"required":["k"]},"minItems":1,"maxItems":3}`,
	`{"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["value"]}},"$ref":"#/$defs/node"}`,
	`{"type":"object","properties":{"a":{"type":"string","minLength":2,"maxLength":5},"b":{"type":["string","null"]},"c":{"anyOf":[{"type":"integer"},{"type":"boolean"}]},
	  "d":{"oneOf":[{"type":"string","format":"date"},{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":false}]}},"additionalProperties":{"type":"integer"}}`,
	`{"type":"object","properties":{"t":{"type":"string","format":"time"},"dt":{"type":"string","format":"date-time"},"u":{"type":"string","format":"uuid"},
	  "p":{"type":"string","pattern":"^[A-Z][a-z]+-[0-9]{2,3}$"},"q":{"type":"string","pattern":"ab+c"}},"required":["t","dt","u","p","q"]}`,
	`{"definitions":{"x":{"type":"object","properties":{"y":{"type":"string"}},"required":["y"]}},"type":"object","properties":{"o":{"allOf":[{"$ref":"#/definitions/x"},{"properties":{"z":{"type":"boolean"}},"required":["z"]}]}},"required":["o"],"additionalProperties":true}`,
	`{}`,
}

func compileValidator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPropertySchemaOutputsValidate(t *testing.T) {
	v := getSmallVocab(t)
	type compiled struct {
		g   *Grammar
		val *jsonschema.Schema
	}
	var cs []compiled
	for _, s := range propertySchemas {
		cs = append(cs, compiled{mustCompile(t, v, KindJSONSchema, s), compileValidator(t, s)})
	}
	for seed := range propertySeeds {
		c := cs[seed%len(cs)]
		r := rand.New(rand.NewPCG(uint64(seed), 7))
		out, _ := walk(t, c.g, r, 30+r.IntN(60), 3000)
		if !json.Valid(out) {
			t.Fatalf("seed %d: not JSON: %q", seed, out)
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("seed %d: %v: %q", seed, err, out)
		}
		if err := c.val.Validate(inst); err != nil {
			t.Fatalf("seed %d schema %d: %q does not validate: %v", seed, seed%len(cs), out, err)
		}
	}
}

func TestPropertyAnyJSONObject(t *testing.T) {
	g := mustCompile(t, getSmallVocab(t), KindJSON, "")
	for seed := range propertySeeds {
		r := rand.New(rand.NewPCG(uint64(seed), 8))
		out, _ := walk(t, g, r, 20+r.IntN(60), 3000)
		var obj map[string]any
		if err := json.Unmarshal(out, &obj); err != nil {
			t.Fatalf("seed %d: %q is not a JSON object: %v", seed, out, err)
		}
	}
}

var propertyRegexes = []string{
	`[a-z]+@[a-z]+\.(com|org)`,
	`^\d{3}-\d{4}$`,
	`(?i)yes|no`,
	`(ab|cd)*e?[^a-z\n]{1,3}`,
	`\w+( \w+){0,4}\.`,
	`[α-ω]+[0-9]?`,
	`.{2,5}x`,
}

func TestPropertyRegexOutputsMatch(t *testing.T) {
	v := getSmallVocab(t)
	var gs []*Grammar
	var res []*regexp.Regexp
	for _, re := range propertyRegexes {
		gs = append(gs, mustCompile(t, v, KindRegex, re))
		res = append(res, regexp.MustCompile(`^(?:`+strings.TrimSuffix(strings.TrimPrefix(re, "^"), "$")+`)$`))
	}
	for seed := range propertySeeds {
		i := seed % len(gs)
		r := rand.New(rand.NewPCG(uint64(seed), 9))
		out, _ := walk(t, gs[i], r, 5+r.IntN(20), 2000)
		if !res[i].Match(out) {
			t.Fatalf("seed %d: %q does not match %s", seed, out, propertyRegexes[i])
		}
	}
}

// arith is a GBNF for arithmetic; parseArith checks outputs independently.
const arithGBNF = `
root ::= expr
expr ::= term (ws [-+] ws term)*
term ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
ws ::= [ ]?
`

func parseArith(s string) error {
	p := 0
	var expr, term, factor func() error
	skip := func() {
		if p < len(s) && s[p] == ' ' {
			p++
		}
	}
	expr = func() error {
		if err := term(); err != nil {
			return err
		}
		for {
			save := p
			skip()
			if p < len(s) && (s[p] == '+' || s[p] == '-') {
				p++
				skip()
				if err := term(); err != nil {
					return err
				}
				continue
			}
			p = save
			return nil
		}
	}
	term = func() error {
		if err := factor(); err != nil {
			return err
		}
		for {
			save := p
			skip()
			if p < len(s) && (s[p] == '*' || s[p] == '/') {
				p++
				skip()
				if err := factor(); err != nil {
					return err
				}
				continue
			}
			p = save
			return nil
		}
	}
	factor = func() error {
		switch {
		case p < len(s) && s[p] == '(':
			p++
			skip()
			if err := expr(); err != nil {
				return err
			}
			skip()
			if p >= len(s) || s[p] != ')' {
				return fmt.Errorf("want ) at %d", p)
			}
			p++
			return nil
		case p < len(s) && s[p] == '-':
			p++
			return factor()
		}
		st := p
		for p < len(s) && s[p] >= '0' && s[p] <= '9' {
			p++
		}
		if st == p {
			return fmt.Errorf("want a number at %d", p)
		}
		if p < len(s) && s[p] == '.' {
			p++
			st = p
			for p < len(s) && s[p] >= '0' && s[p] <= '9' {
				p++
			}
			if st == p {
				return fmt.Errorf("want digits at %d", p)
			}
		}
		return nil
	}
	if err := expr(); err != nil {
		return err
	}
	if p != len(s) {
		return fmt.Errorf("trailing %q", s[p:])
	}
	return nil
}

func TestPropertyGBNFOutputsParse(t *testing.T) {
	g := mustCompile(t, getSmallVocab(t), KindGBNF, arithGBNF)
	for seed := range propertySeeds {
		r := rand.New(rand.NewPCG(uint64(seed), 10))
		out, _ := walk(t, g, r, 10+r.IntN(40), 2000)
		if err := parseArith(string(out)); err != nil {
			t.Fatalf("seed %d: %q: %v", seed, out, err)
		}
	}
}

// Positions computed on first use give the same masks as precomputed ones.
func TestLazyEqualsEager(t *testing.T) {
	v := getSmallVocab(t)
	for i, src := range propertySchemas[:4] {
		eager, err := Compile(context.Background(), v, KindJSONSchema, src, Limits{Precompute: -1})
		if err != nil {
			t.Fatal(err)
		}
		lazy, err := Compile(context.Background(), v, KindJSONSchema, src, Limits{Precompute: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		if eager.Stats().Deferred != 0 || lazy.Stats().Deferred == 0 {
			t.Fatalf("deferred: eager %d lazy %d", eager.Stats().Deferred, lazy.Stats().Deferred)
		}
		seeds := 10
		if raceEnabled {
			seeds = 2
		}
		for seed := range seeds {
			r := rand.New(rand.NewPCG(uint64(seed), uint64(i)))
			_, ids := walk(t, eager, r, 40, 3000)
			me, _ := eager.NewMatcher()
			ml, _ := lazy.NewMatcher()
			a := make([]uint64, v.MaskWords())
			b := make([]uint64, v.MaskWords())
			for step, id := range ids {
				if _, err := me.Mask(a); err != nil {
					t.Fatal(err)
				}
				if _, err := ml.Mask(b); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(a, b) {
					t.Fatalf("schema %d seed %d step %d: masks differ", i, seed, step)
				}
				if me.Accept(id) != nil || ml.Accept(id) != nil {
					t.Fatal("accept")
				}
			}
		}
	}
}

// Matchers of one Grammar run concurrently, computing deferred positions.
func TestConcurrentMatchers(t *testing.T) {
	v := getSmallVocab(t)
	g, err := Compile(context.Background(), v, KindJSONSchema, toolSchema, Limits{Precompute: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	val := compileValidator(t, toolSchema)
	errs := make(chan error, 4)
	for w := range 4 {
		go func() {
			for seed := range 5 {
				r := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
				out, _, err := walkE(g, r, 30, 3000)
				if err != nil {
					errs <- err
					return
				}
				inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(out))
				if err == nil {
					err = val.Validate(inst)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// The same property on the full-size vocabulary, for a few seeds.
func TestPropertyBigVocab(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the 151,936-token vocabulary")
	}
	v := getBigVocab(t)
	for i, src := range []string{toolSchema20, toolSchema} {
		g := mustCompile(t, v, KindJSONSchema, src)
		val := compileValidator(t, src)
		seeds := 5
		if raceEnabled {
			seeds = 1
		}
		for seed := range seeds {
			r := rand.New(rand.NewPCG(uint64(seed), 11))
			out, _ := walk(t, g, r, 40, 3000)
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(out))
			if err == nil {
				err = val.Validate(inst)
			}
			if err != nil {
				t.Fatalf("schema %d seed %d: %q: %v", i, seed, out, err)
			}
		}
	}
}

// The mask is exact: along random walks, a token's bit is set if and only
// if Accept takes it (checked for every token of a 3,000-token vocabulary).
func TestMaskExact(t *testing.T) {
	toks, eos := SyntheticVocab(3000, 5)
	v, err := NewVocab(toks, eos)
	if err != nil {
		t.Fatal(err)
	}
	srcs := []struct {
		kind Kind
		src  string
	}{
		{KindJSONSchema, toolSchema}, {KindJSONSchema, propertySchemas[3]}, {KindJSONSchema, propertySchemas[4]},
		{KindJSON, ""}, {KindRegex, propertyRegexes[4]}, {KindGBNF, arithGBNF},
	}
	for i, c := range srcs {
		for _, pre := range []time.Duration{-1, time.Nanosecond} {
			g, err := Compile(context.Background(), v, c.kind, c.src, Limits{Precompute: pre})
			if err != nil {
				t.Fatal(err)
			}
			seeds := 3
			if raceEnabled {
				seeds = 1
			}
			for seed := range seeds {
				r := rand.New(rand.NewPCG(uint64(seed), uint64(i)))
				_, ids := walk(t, g, r, 25, 3000)
				m, _ := g.NewMatcher()
				mask := make([]uint64, v.MaskWords())
				for step := 0; step <= len(ids); step++ {
					if _, err := m.Mask(mask); err != nil {
						t.Fatal(err)
					}
					for id := range int32(v.Size()) {
						if v.isEOSID(id) {
							if MaskAllows(mask, id) != m.CanEnd() {
								t.Fatalf("%s %d: EOS bit disagrees with CanEnd", c.kind, i)
							}
							continue
						}
						err := m.Accept(id)
						if err == nil {
							_ = m.Rollback(1)
						}
						if MaskAllows(mask, id) != (err == nil) {
							t.Fatalf("%s %d seed %d step %d: token %q: mask %v, Accept %v", c.kind, i, seed, step, v.Token(id), MaskAllows(mask, id), err)
						}
					}
					if step < len(ids) {
						if err := m.Accept(ids[step]); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		}
	}
}

// The mask is exact on the full-size vocabulary too, for the first steps
// of a walk under each kind of constraint.
func TestMaskExactBigVocab(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the 151,936-token vocabulary")
	}
	v := getBigVocab(t)
	for i, c := range []struct {
		kind Kind
		src  string
	}{{KindJSONSchema, toolSchema20}, {KindJSON, ""}, {KindRegex, propertyRegexes[0]}} {
		if raceEnabled && i > 0 {
			break
		}
		g := mustCompile(t, v, c.kind, c.src)
		r := rand.New(rand.NewPCG(9, uint64(i)))
		_, ids := walk(t, g, r, 12, 3000)
		m, _ := g.NewMatcher()
		mask := make([]uint64, v.MaskWords())
		steps := 12
		if raceEnabled {
			steps = 2
		}
		for step := 0; step <= min(len(ids), steps); step++ {
			if _, err := m.Mask(mask); err != nil {
				t.Fatal(err)
			}
			for id := range int32(v.Size()) {
				if v.isEOSID(id) {
					continue
				}
				err := m.Accept(id)
				if err == nil {
					_ = m.Rollback(1)
				}
				if MaskAllows(mask, id) != (err == nil) {
					t.Fatalf("%s step %d: token %q: mask %v, Accept %v", c.kind, step, v.Token(id), MaskAllows(mask, id), err)
				}
			}
			if step < len(ids) {
				if err := m.Accept(ids[step]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}
