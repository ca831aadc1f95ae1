package grammar

import (
	"context"
	"errors"
	"fmt"
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
					gb, _ := SchemaToGBNF([]byte(c.schema), Limits{})
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
	a, err := SchemaToGBNF([]byte(`{"type":"string","title":"T","description":"D","default":"x","examples":["y"],"format":"email","$comment":"c","x-extension":1}`), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := SchemaToGBNF([]byte(`{"type":"string"}`), Limits{})
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
