package grammar

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

func TestSchemaMatch(t *testing.T) {
	cases := []struct {
		name, schema string
		yes, no      []string
	}{
		{"required and closed", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a"]}`,
			[]string{`{"a":1}`, `{ "a" : -5 , "b":"x"}`, "{\n  \"a\": 0\n}"}, []string{`{}`, `{"a":"x"}`, `{"a":1,"c":2}`, `{"b":"x","a":1}`, `{"a":01}`}},
		{"no required", `{"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"}},"additionalProperties":false}`,
			[]string{`{}`, `{"a":true}`, `{"b":null}`, `{"a":false,"b":null}`}, []string{`{,"b":null}`, `{"a":true,}`, `{"c":1}`}},
		{"additional properties", `{"type":"object","properties":{"ab":{"type":"integer"}},"additionalProperties":{"type":"string"}}`,
			[]string{`{}`, `{"ab":1,"x":"y"}`, `{"a":"y","abc":"z","":"e"}`}, []string{`{"ab":"x"}`, `{"x":1}`, `{"ab":1,"ab":2}`}},
		{"any object", `{"type":"object"}`, []string{`{}`, `{"a":[1,{"b":null}],"c":"d"}`}, []string{`[]`, `{"a"}`}},
		{"enum and const", `{"type":"object","properties":{"e":{"enum":["x",2,null,[1,"a"]]},"c":{"const":{"k":true}}},"required":["e","c"]}`,
			[]string{`{"e":"x","c":{"k":true}}`, `{"e":[1,"a"],"c":{"k":true}}`, `{"e":null,"c":{"k":true}}`}, []string{`{"e":"y","c":{"k":true}}`, `{"e":2,"c":{"k":false}}`}},
		{"array bounds", `{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3}`,
			[]string{`[1,2]`, `[ 1 , 2 , 3 ]`}, []string{`[]`, `[1]`, `[1,2,3,4]`, `[1,"a"]`}},
		{"array empty allowed", `{"type":"array","maxItems":1}`, []string{`[]`, `[{"a":1}]`}, []string{`[1,2]`}},
		{"tuple", `{"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false}`,
			[]string{`["a",1]`}, []string{`["a"]`, `["a",1,2]`, `[1,"a"]`}},
		{"string lengths", `{"type":"string","minLength":2,"maxLength":3}`,
			[]string{`"ab"`, `"abc"`, `"日本"`, `"\n\u00e9"`}, []string{`"a"`, `"abcd"`, `"\ud800"`}},
		{"string escapes", `{"type":"string"}`, []string{`"a\"b\\c\/\n\u1234"`, `""`}, []string{"\"a\nb\"", `"\x"`, `"a`}},
		{"date", `{"type":"string","format":"date"}`, []string{`"2024-02-28"`, `"1999-12-31"`, `"2000-04-30"`}, []string{`"2024-02-30"`, `"2024-04-31"`, `"2024-13-01"`, `"2024-1-01"`}},
		{"date-time", `{"type":"string","format":"date-time"}`, []string{`"2024-02-28T23:59:59Z"`, `"2024-02-28T00:00:00.123+05:30"`}, []string{`"2024-02-28T24:00:00Z"`, `"2024-02-28 10:00:00Z"`}},
		{"uuid", `{"type":"string","format":"uuid"}`, []string{`"123e4567-e89b-12d3-a456-426614174000"`}, []string{`"123e4567e89b12d3a456426614174000"`}},
		{"pattern anchored", `{"type":"string","pattern":"^a[0-9]+$"}`, []string{`"a1"`, `"a123"`}, []string{`"a"`, `"xa1"`, `"a1x"`}},
		{"pattern unanchored", `{"type":"string","pattern":"b\"c"}`, []string{`"b\"c"`, `"xxb\"cyy"`}, []string{`"bc"`}},
		{"anyOf and type list", `{"anyOf":[{"type":"integer"},{"type":["string","null"]}]}`, []string{`1`, `"x"`, `null`}, []string{`true`, `1.5`}},
		{"number", `{"type":"number"}`, []string{`0`, `-1.5`, `2e10`, `3.25E-2`}, []string{`01`, `1.`, `.5`, `+1`, `1e`}},
		{"recursive ref", `{"$defs":{"t":{"type":"object","properties":{"c":{"type":"array","items":{"$ref":"#/$defs/t"}}}}},"$ref":"#/$defs/t"}`,
			[]string{`{}`, `{"c":[]}`, `{"c":[{"c":[{}]},{}]}`}, []string{`{"c":[1]}`}},
		{"definitions", `{"definitions":{"n":{"type":"integer"}},"type":"array","items":{"$ref":"#/definitions/n"}}`, []string{`[1,2]`}, []string{`["a"]`}},
		{"allOf objects", `{"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"properties":{"b":{"type":"integer"}},"required":["b"]}]}`,
			[]string{`{"a":1,"b":2}`}, []string{`{"a":1}`, `{"b":2}`}},
		{"true schema", `true`, []string{`1`, `"x"`, `[null]`}, []string{`nul`}},
	}
	v := getByteVocab()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := Compile(context.Background(), v, KindJSONSchema, c.schema, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range c.yes {
				if !matches(t, g, s) {
					gb, _ := SchemaToGBNF(context.Background(), []byte(c.schema), Limits{})
					t.Errorf("%s should match\n%s", s, gb)
				}
			}
			for _, s := range c.no {
				if matches(t, g, s) {
					t.Errorf("%s should not match", s)
				}
			}
		})
	}
}

// TestSchemaIntegerRanges checks every integer near the bounds.
func TestSchemaIntegerRanges(t *testing.T) {
	v := getByteVocab()
	cases := []struct {
		kw     string
		lo, hi int
	}{
		{`"minimum":-20,"maximum":1234`, -20, 1234},
		{`"minimum":7,"maximum":7`, 7, 7},
		{`"exclusiveMinimum":-1,"exclusiveMaximum":100`, 0, 99},
		{`"minimum":95,"maximum":1005`, 95, 1005},
		{`"maximum":-3`, -1 << 40, -3},
		{`"minimum":2.5`, 3, 1 << 40},
		{`"minimum":-105,"maximum":-99`, -105, -99},
	}
	for _, c := range cases {
		g, err := Compile(context.Background(), v, KindJSONSchema, `{"type":"integer",`+c.kw+`}`, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		for n := -1200; n <= 1300; n++ {
			want := n >= c.lo && n <= c.hi
			if got := matches(t, g, fmt.Sprint(n)); got != want {
				t.Fatalf("%s: %d matches %v, want %v", c.kw, n, got, want)
			}
		}
		if matches(t, g, "-0") || matches(t, g, "007") {
			t.Fatalf("%s: leading zeros or -0 allowed", c.kw)
		}
	}
	// a number's fraction stays inside the bounds
	g, err := Compile(context.Background(), v, KindJSONSchema, `{"type":"number","minimum":0,"maximum":2}`, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]bool{"0": true, "0.5": true, "1.99": true, "2": true, "2.5": false, "-0.5": false, "3": false} {
		if matches(t, g, s) != want {
			t.Errorf("number in [0,2]: %s should match: %v", s, want)
		}
	}
}

func TestSchemaRefused(t *testing.T) {
	cases := []struct {
		schema string
		want   error
		msg    string
	}{
		{`{"type":"string","not":{"const":"x"}}`, ErrUnsupportedSchema, `"not"`},
		{`{"type":"object","patternProperties":{"^a":{}}}`, ErrUnsupportedSchema, "patternProperties"},
		{`{"type":"array","uniqueItems":true}`, ErrUnsupportedSchema, "uniqueItems"},
		{`{"type":"integer","multipleOf":3}`, ErrUnsupportedSchema, "multipleOf"},
		{`{"if":{"type":"string"},"then":{}}`, ErrUnsupportedSchema, `"if"`},
		{`{"$ref":"http://example.com/s.json"}`, ErrUnsupportedSchema, "only references inside"},
		{`{"type":"number","minimum":0.1,"maximum":0.9}`, ErrUnsupportedSchema, "no integer"},
		{`{"type":"string","pattern":"\\bx"}`, ErrUnsupportedSchema, `\b`},
		{`{"type":"object","properties":{},"required":["a"],"additionalProperties":false}`, ErrUnsupportedSchema, "required property"},
		{`false`, ErrUnsupportedSchema, "matches nothing"},
		{`{"type":"strin"}`, ErrInvalidGrammar, "unknown type"},
		{`{"type":"object"`, ErrInvalidGrammar, "JSON"},
		{`{"$ref":"#/$defs/missing"}`, ErrInvalidGrammar, "points to nothing"},
		{`{"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`, ErrInvalidGrammar, "no finite string"},
		{`{"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"}`, ErrInvalidGrammar, "left-recursive"},
		{`{"enum":[]}`, ErrInvalidGrammar, "enum"},
		{`{"type":"string","maxLength":1000000}`, ErrGrammarTooLarge, "maxLength"},
		{strings.Repeat(`{"type":"array","items":`, 100) + `{}` + strings.Repeat(`}`, 100), ErrGrammarTooLarge, "nested deeper"},
	}
	for _, c := range cases {
		_, err := Compile(context.Background(), getByteVocab(), KindJSONSchema, c.schema, Limits{})
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: got %v, want %v saying %s", c.schema, err, c.want, c.msg)
		}
	}
}

func TestSchemaIgnoredKeywords(t *testing.T) {
	// annotations and unknown formats do not change the grammar
	a, err := SchemaToGBNF(context.Background(), []byte(`{"type":"string","title":"T","description":"D","default":"x","examples":["y"],"format":"email","$comment":"c","x-extension":1}`), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := SchemaToGBNF(context.Background(), []byte(`{"type":"string"}`), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("annotations changed the grammar:\n%s\n%s", a, b)
	}
}

func TestRegexMatch(t *testing.T) {
	cases := []struct {
		re      string
		yes, no []string
	}{
		{`^ab+c$`, []string{"abc", "abbbc"}, []string{"ac", "abcx", "xabc"}},
		{`(?i)yes|no`, []string{"YES", "yEs", "no", "NO"}, []string{"y", "yesno"}},
		{`\d{2,3}-[^\d]`, []string{"12-a", "123-é"}, []string{"1-a", "12-3"}},
		{`a.c`, []string{"abc", "a日c"}, []string{"a\nc", "ac"}},
		{`(?s)a.c`, []string{"a\nc"}, nil},
		{`\w+\s\W`, []string{"ab_1 !", "x\t-"}, []string{"a b", "é !"}},
		{`\p{Greek}+`, []string{"αβγ"}, []string{"abc"}},
		{``, []string{""}, []string{"a"}},
	}
	v := getByteVocab()
	for _, c := range cases {
		g, err := Compile(context.Background(), v, KindRegex, c.re, Limits{})
		if err != nil {
			t.Fatalf("%s: %v", c.re, err)
		}
		for _, s := range c.yes {
			if !matches(t, g, s) {
				t.Errorf("%s should match %q", c.re, s)
			}
		}
		for _, s := range c.no {
			if matches(t, g, s) {
				t.Errorf("%s should not match %q", c.re, s)
			}
		}
	}
	for _, bad := range []string{`a(b`, `a^b`, `\bword`, `x{2,1}`, `a{1,20000}`} {
		if _, err := Compile(context.Background(), v, KindRegex, bad, Limits{}); !errors.Is(err, ErrInvalidGrammar) && !errors.Is(err, ErrGrammarTooLarge) {
			t.Errorf("%s: got %v", bad, err)
		}
	}
}

// allocated is how many bytes f allocates on the heap: a measure of its
// work that, unlike time, does not depend on the machine's load.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// boundsSchema is an object of props numbers, each bounded by ±bound in
// all four ways.
func boundsSchema(props int, bound string) string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range props {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{"type":"number","minimum":-%[2]s,"maximum":%[2]s,"exclusiveMinimum":-%[2]s,"exclusiveMaximum":%[2]s}`, i, bound)
	}
	b.WriteString(`}}`)
	return b.String()
}

// TestSchemaHugeBounds: a numeric bound costs the work of its bytes, not
// of its value. big.Rat.SetString expands 1e999999 to a million digits
// (tens of milliseconds and megabytes, from 9 bytes) and a long fraction
// to a huge denominator; bounds beyond 16 digits mean the same as any
// other beyond them, so a schema of huge bounds must compile with about
// the allocations of the same schema with ordinary ones.
func TestSchemaHugeBounds(t *testing.T) {
	digits := strings.Repeat("1234567890", 6000)
	lim := Limits{Precompute: -1} // every position: the same work each run
	for _, tc := range []struct {
		name        string
		props       int
		huge, plain string // bounds with the same meaning
	}{
		{"exponent", 10, "1e999999", "1e20"},
		{"negative exponent", 10, "1.5e-999999", "0.5"},
		{"float64's largest", 10, "1.7976931348623157e308", "1e20"},
		{"long integer", 1, digits, "1e20"},
		{"long fraction", 1, "0." + digits, "0.5"},
		{"long exponent", 1, "1e" + strings.Repeat("0", len(digits)) + "999999", "1e20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			compile := func(bound string) (uint64, string) {
				var gbnf string
				n := allocated(func() {
					src := boundsSchema(tc.props, bound)
					if _, err := Compile(context.Background(), getByteVocab(), KindJSONSchema, src, lim); err != nil {
						t.Fatalf("bound %.20s: %v", bound, err)
					}
					gbnf, _ = SchemaToGBNF(context.Background(), []byte(src), lim)
				})
				return n, gbnf
			}
			plain, want := compile(tc.plain)
			huge, got := compile(tc.huge)
			if got != want {
				t.Errorf("bound %.20s…: grammar differs from bound %s's:\n%s\nwant\n%s", tc.huge, tc.plain, got, want)
			}
			// the huge literals' own bytes, copied a few times by the JSON decoder
			slack := uint64(16 * tc.props * 4 * len(tc.huge))
			t.Logf("allocated %d bytes with bound %s, %d with %.20s… (slack %d)", plain, tc.plain, huge, tc.huge, slack)
			if huge > 2*plain+slack {
				t.Errorf("bound %.20s… (%d bytes) allocated %d bytes; bound %s %d: a bound's cost is its value's, not its literal's",
					tc.huge, len(tc.huge), huge, tc.plain, plain)
			}
		})
	}
}

// TestBoundLiteral: a bound cut down to a short literal keeps its floor and
// ceiling (all numberRule uses), and beyond the 16 digits that numberRule
// clamps to it saturates.
func TestBoundLiteral(t *testing.T) {
	for _, tc := range []struct{ lit, want string }{
		{"0", "0"},
		{"-0.000", "0"},
		{"7", "7"},
		{"-20", "-20"},
		{"2.5", "2.5"},
		{"12.3400", "12.5"},
		{"12.000", "12"},
		{"1234.5e-2", "12.5"},
		{"100e-2", "1"},
		{"1E+2", "100"},
		{"0.00123e3", "1.5"},
		{"9007199254740991", "9007199254740991"},
		{"1e18", "1000000000000000000"},
		{"1e308", "1000000000000000000"},
		{"-1.7976931348623157e308", "-1000000000000000000"},
		{"1e999999", "1000000000000000000"},
		{"1e00000000000000000000000000005", "100000"},
		{"1e99999999999999999999999999999", "1000000000000000000"},
		{"1.5e-999999", "0.5"},
		{"-1.5e-999999", "-0.5"},
		{"5e-324", "0.5"},
		{"1e-99999999999999999999999999999", "0.5"},
		{"", ""},
		{"-", ""},
		{"1e", ""},
		{"1e+", ""},
		{"x", ""},
		{"1.2.3", ""},
		{"1e5x", ""},
	} {
		got, ok := boundLiteral(tc.lit)
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("boundLiteral(%q) = %q, %v; want %q", tc.lit, got, ok, tc.want)
		}
	}
	// Against the exact value, for literals small enough to expand.
	rng := rand.New(rand.NewPCG(9, 10))
	limit := new(big.Int).Exp(big.NewInt(10), big.NewInt(maxIntDigits), nil)
	clamp := func(x *big.Int) *big.Int {
		if x.CmpAbs(limit) > 0 {
			return big.NewInt(int64(x.Sign()))
		}
		return x
	}
	for range 20000 {
		digits := func(n int) string {
			b := make([]byte, n)
			for i := range b {
				b[i] = "0000123456789"[rng.IntN(13)]
			}
			return string(b)
		}
		lit := digits(1 + rng.IntN(20))
		if rng.IntN(2) == 0 {
			lit = "-" + lit
		}
		if rng.IntN(2) == 0 {
			lit += "." + digits(1+rng.IntN(20))
		}
		if rng.IntN(2) == 0 {
			lit += fmt.Sprintf("e%d", rng.IntN(60)-30)
		}
		cut, ok := boundLiteral(lit)
		exact, _ := new(big.Rat).SetString(lit)
		short, _ := new(big.Rat).SetString(cut)
		if !ok || short == nil {
			t.Fatalf("boundLiteral(%q) = %q, %v", lit, cut, ok)
		}
		for _, f := range []func(*big.Rat) *big.Int{ratFloor, ratCeil} {
			if a, b := clamp(f(exact)), clamp(f(short)); a.Cmp(b) != 0 {
				t.Fatalf("boundLiteral(%q) = %q: rounds to %v, not %v", lit, cut, b, a)
			}
		}
	}
}

// cancelAfter is a context whose caller goes away while the work runs:
// Err reports it cancelled from its n+1th call on.
type cancelAfter struct {
	context.Context
	n int
}

func (c *cancelAfter) Err() error {
	if c.n > 0 {
		c.n--
		return nil
	}
	return context.Canceled
}

// TestSchemaConversionStopsWhenCallerGoes: a schema's conversion checks
// its context as it goes (every ctxCheckVisits schemas), so the work for a
// caller that has gone stops, with the context's error, long before the
// conversion would end; Compile, which precomputes after it, stops too.
func TestSchemaConversionStopsWhenCallerGoes(t *testing.T) {
	schema := func(props int) string {
		var b strings.Builder
		b.WriteString(`{"type":"object","properties":{`)
		for i := range props {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"p%d":{"type":"integer","minimum":%d,"maximum":%d}`, i, -i, i*1000)
		}
		b.WriteString(`}}`)
		return b.String()
	}
	lim := Limits{Precompute: -1} // every position: the same work each run
	convert := func(ctx context.Context, src string) error {
		_, err := SchemaToGBNF(ctx, []byte(src), lim)
		return err
	}
	compile := func(ctx context.Context, src string) error {
		_, err := Compile(ctx, getByteVocab(), KindJSONSchema, src, lim)
		return err
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name  string
		run   func(context.Context, string) error
		props int
		ctx   func() context.Context
	}{
		{"conversion, caller gone before", convert, 2000, func() context.Context { return gone }},
		// the check on entry and the first visit's pass, then the next
		// visit checked (ctxCheckVisits on) finds the caller gone
		{"conversion, caller gone during", convert, 2000, func() context.Context { return &cancelAfter{context.Background(), 2} }},
		{"compile, caller gone before", compile, 300, func() context.Context { return gone }},
		{"compile, caller gone during", compile, 300, func() context.Context { return &cancelAfter{context.Background(), 3} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := schema(tc.props)
			var err error
			full := allocated(func() { err = convert(context.Background(), src) })
			if err != nil {
				t.Fatal(err)
			}
			ctx := tc.ctx()
			cut := allocated(func() { err = tc.run(ctx, src) })
			t.Logf("allocated %d bytes for a caller gone; the whole conversion %d", cut, full)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
			if cut > full/3 {
				t.Errorf("allocated %d bytes for a caller gone, the whole conversion %d: the work went on", cut, full)
			}
		})
	}
}
