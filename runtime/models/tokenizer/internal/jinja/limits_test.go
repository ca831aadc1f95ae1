package jinja_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime/models/tokenizer/internal/jinja"
)

// small limits keep the hostile renders below cheap; the defaults are
// exercised by the real templates in jinja_test.go.
var small = jinja.Limits{MaxSteps: 200_000, MaxCallDepth: 32, MaxOutputBytes: 1 << 20, MaxAllocBytes: 16 << 20}

// sharedTrees sets ns.a and ns.b to two trees of depth 18 that share their
// children and differ in one leaf, and ns.L to 64 copies of ns.a.
const sharedTrees = `{%- set ns = namespace(a=[0], b=[1], L=[]) -%}
{%- for i in range(18) %}{% set ns.b = [ns.a, ns.b] %}{% set ns.a = [ns.a, ns.a] %}{% endfor -%}
{%- set ns.L = [ns.a] -%}{%- for i in range(6) %}{% set ns.L = ns.L + ns.L %}{% endfor -%}`

// TestHostileTemplatesHitLimits: each template here crashed, exhausted
// memory or spun forever before the fork's limits; now each is an
// ErrLimit error from Render.
func TestHostileTemplatesHitLimits(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	for _, tc := range []struct{ name, src string }{
		{"recursive macro", `{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}`},
		{"mutual recursion through caller", `{% macro f() %}{% call f() %}x{% endcall %}{% endmacro %}{{ f() }}`},
		{"string repeat", `{{ 'x' * 2000000000 }}`},
		{"repeat overflow", `{{ 'xy' * 9223372036854775807 }}`},
		{"int times string", `{{ 2000000000 * 'x' }}`},
		{"range", `{% for i in range(10000000000) %}{% endfor %}`},
		{"range extreme bounds", `{{ range(-9223372036854775807, 9223372036854775807)|length }}`},
		{"nested loops", `{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}`},
		{"doubling string", `{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}`},
		{"doubling list", `{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}`},
		{"shared children printed", `{% set ns = namespace(a=[1]) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}`},
		{"shared children to json", `{% set ns = namespace(a=[1]) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a|tojson }}`},
		{"self-containing list printed", `{% set x = [] %}{% set _ = x.append(x) %}{{ x }}`},
		{"self-containing list to json", `{% set x = [] %}{% set _ = x.append(x) %}{{ x|tojson }}`},
		{"self-containing list to json indented", `{% set x = [] %}{% set _ = x.append(x) %}{{ x|tojson(indent=2) }}`},
		{"join of one string many times", `{% set s = 'x' * 1000000 %}{% set l = [] %}{% for i in range(100) %}{% set _ = l.append(s) %}{% endfor %}{{ l|join }}`},
		{"replace empty", `{% set s = 'x' * 100000 %}{{ s.replace('', s) }}`},
		{"replace filter empty", `{% set s = 'x' * 100000 %}{{ s|replace('', s) }}`},
		{"format", `{% set s = '{0}' * 100000 %}{{ s.format(s) }}`},
		{"indent", `{{ ('a\n' * 1000)|indent(1000000) }}`},
		{"indent lines times width wraps to 0", `{{ ('\n' * 131071)|indent(140737488355328) }}`},
		{"indent width past int64", `{{ 'a\nb'|indent(9223372036854775807) }}`},
		{"output", `{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}`},
		{"set block", `{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set b %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = b %}{% endfor %}`},
		{"long concatenation chain", "{{ 'a'" + strings.Repeat(" ~ 'a'", 10000) + " }}"},
		{"long filter chain", "{{ 'a'" + strings.Repeat("|string", 10000) + " }}"},
		{"big data string list", `{{ big|list|length }}`},
		// batch, items and dictsort make lists inside their result, which
		// count too: 70 batches of 10,000 one-item lists pass 16 MiB only so.
		{"batch's inner lists", `{% set x = range(10000)|list %}{% for i in range(70) %}{% set y = x|batch(1) %}{% endfor %}`},
		// Comparisons make nothing to charge: two trees of shared
		// children, and a list of one of them, cost a few KiB, and each
		// comparison walks up to a million nodes (a step each).
		{"in over shared children", sharedTrees + `{% if ns.b in ns.L %}{% endif %}`},
		{"not in over shared children", sharedTrees + `{% if ns.b not in ns.L %}{% endif %}`},
		{"== over shared children", sharedTrees + `{% for x in ns.L %}{% if x == ns.b %}{% endif %}{% endfor %}`},
		{"equalto test over shared children", sharedTrees + `{{ ns.L|select('equalto', ns.b)|list|length }}`},
		{"in test over shared children", sharedTrees + `{{ [ns.b]|select('in', ns.L)|list|length }}`},
		{"sort", `{% set ns = namespace(l=[1]) %}{% for i in range(17) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|sort|length }}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm, err := jinja.Compile(tc.src)
			if err != nil {
				t.Fatalf("compile: %v", err)
			}
			out, err := tm.RenderContext(context.Background(), map[string]any{"big": big + big + big + big}, small)
			if !errors.Is(err, jinja.ErrLimit) {
				t.Fatalf("render = %d bytes, %v; want an ErrLimit error", len(out), err)
			}
			if testing.Verbose() {
				t.Log(err)
			}
		})
	}
}

// TestHostileSourcesRefusedAtCompile: sources whose parse recursed or
// ran in quadratic time are refused, or compile in linear time.
func TestHostileSourcesRefusedAtCompile(t *testing.T) {
	for _, tc := range []struct{ name, src string }{
		{"10 MB of parentheses", "{{ " + strings.Repeat("(", 10<<20) + " }}"},
		{"deep parentheses under the size cap", "{{ " + strings.Repeat("(", 100_000) + "1" + strings.Repeat(")", 100_000) + " }}"},
		{"deep brackets", "{{ " + strings.Repeat("[", 100_000) + " }}"},
		{"deep not", "{{ " + strings.Repeat("not ", 100_000) + "x }}"},
		{"deep minus", "{{ " + strings.Repeat("- ", 100_000) + "1 }}"},
		{"14 MB of nested ifs", strings.Repeat("{% if x %}", 14<<20/10)},
		{"nested ifs under the size cap", strings.Repeat("{% if x %}", 50_000) + strings.Repeat("{% endif %}", 50_000)},
		{"nested macros", strings.Repeat("{% macro m() %}", 10_000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := jinja.Compile(tc.src)
			if !errors.Is(err, jinja.ErrLimit) {
				t.Fatalf("compile: %v; want an ErrLimit error", err)
			}
		})
	}
	// Many tags and no text between them: the whitespace pass searched
	// back for text per tag (quadratic: minutes at this size).
	src := strings.Repeat("{% if x %}{% endif %}", 45_000)
	if _, err := jinja.Compile(src); err != nil {
		t.Fatalf("compile %d bytes of flat ifs: %v", len(src), err)
	}
}

// TestRenderStopsWithItsContext: a render that would run for long stops
// with the context's error, not the limit's, once the context ends.
func TestRenderStopsWithItsContext(t *testing.T) {
	tm, err := jinja.Compile(`{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	unbounded := jinja.Limits{MaxSteps: 1 << 62}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tm.RenderContext(ctx, nil, unbounded); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled render: %v, want context.Canceled", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), -1)
	defer cancel()
	if _, err := tm.RenderContext(ctx, nil, unbounded); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expired render: %v, want context.DeadlineExceeded", err)
	}
	// A cancellation arriving mid-render stops it too.
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := tm.RenderContext(ctx, nil, unbounded)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("render cancelled while running: %v, want context.Canceled", err)
	}
}

// TestBoundedOperationsKeepTheirMeaning: the checks added to slicing,
// repetition and friends do not change what well-formed templates get.
func TestBoundedOperationsKeepTheirMeaning(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{`{{ [1,2,3][0:10000000000000] }}`, "[1, 2, 3]"},
		{`{{ [1,2,3][-10000000000000:2] }}`, "[1, 2]"},
		{`{{ [1,2,3][::9223372036854775807] }}`, "[1]"},
		{`{{ [1,2,3][::-9223372036854775807] }}`, "[3]"},
		{`{{ 'abc'[::-99999999999999] }}`, "c"},
		{`{{ 'abcdef'[4:1:-1] }}`, "edc"},
		{`{{ 'héllo'[1:3] }}`, "él"},
		{`{{ 'héllo'[1] }}{{ 'abc'[-1] }}`, "éc"},
		{`{{ [1,2,3,4][::-2] }}`, "[4, 2]"},
		{`{{ 'x' * -1 }}|{{ 'ab' * 3 }}|{{ 2 * 'c' }}`, "|ababab|cc"},
		{`{{ ('a\nb')|indent(-5) }}`, "a\nb"},
		{`{{ 'a-b'.replace('-', '+') }}{{ 'aaa'|replace('a', 'b', 2) }}`, "a+bbba"},
		{`{{ '{0}{}'.format('x') }}`, "xx"},
		{`{{ range(5)|list }}{{ range(5, 0, -2)|list }}{{ range(0)|list }}`, "[0, 1, 2, 3, 4][5, 3, 1][]"},
		{`{{ {'b': 1, 'a': [1, {'c': None}]}|tojson(indent=2) }}`, "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    {\n      \"c\": null\n    }\n  ]\n}"},
		{`{{ []|tojson(indent=2) }}{{ {}|tojson(indent=2) }}`, "[]{}"},
		{`{{ {'a': [1, 'x']}|tojson }}`, `{"a": [1, "x"]}`},
		{`{% set x = [1, [2]] %}{{ x == [1, [2]] }}{{ [2] in x }}`, "TrueTrue"},
		{`{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}`, "54321"},
	} {
		tm, err := jinja.Compile(tc.src)
		if err != nil {
			t.Fatalf("compile %q: %v", tc.src, err)
		}
		got, err := tm.Render(nil)
		if err != nil {
			t.Fatalf("render %q: %v", tc.src, err)
		}
		if got != tc.want {
			t.Errorf("%s = %q, want %q", tc.src, got, tc.want)
		}
	}
}

// TestRangeIsExact: range() has Python's items at any bounds. Near
// MaxInt64 or MinInt64 the count used to be figured in float64 (0 when
// the bounds round together) and the list built on i += step, which
// wrapped: with a step s whose inverse mod 2**64 is k the wrapped i lands
// past stop only after k items (k unbounded, uncharged), with an even
// step never. The cases here are ones the wrapped loop ends on.
func TestRangeIsExact(t *testing.T) {
	// step is the odd s < 2**63 with s*k == 1 (mod 2**64) for the least
	// odd k >= 1001 that has one.
	var k, step uint64
	for k = 1001; ; k += 2 {
		if step = inverse(k); step < 1<<63 {
			break
		}
	}
	for _, tc := range []struct{ src, want string }{
		{`{{ range(5)|join(',') }}`, "0,1,2,3,4"},
		{`{{ range(0, 10, 3)|join(',') }}`, "0,3,6,9"},
		{`{{ range(10, 0, -3)|join(',') }}`, "10,7,4,1"},
		{`{{ range(3, 3)|length }}{{ range(3, 0)|length }}{{ range(0, 3, -1)|length }}`, "000"},
		{`{{ range(-3, 3, 2)|join(',') }}`, "-3,-1,1"},
		{fmt.Sprintf(`{%% set r = range(9223372036854775806, 9223372036854775807, %d) %%}{{ r|length }} {{ r[0] }}`, step), "1 9223372036854775806"},
		{fmt.Sprintf(`{%% set r = range(-9223372036854775807, -9223372036854775807 - 1, -%d) %%}{{ r|length }} {{ r[0] }}`, step), "1 -9223372036854775807"},
		{fmt.Sprintf(`{%% set r = range(9223372036854775806 - %d, 9223372036854775807, %d) %%}{{ r|length }} {{ r[-1] }}`, step, step), "2 9223372036854775806"},
	} {
		t.Run(tc.src, func(t *testing.T) {
			tm, err := jinja.Compile(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tm.RenderContext(context.Background(), nil, small)
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// inverse is k's inverse modulo 2**64 (k odd): k*inverse(k) == 1 (mod 2**64).
func inverse(k uint64) uint64 {
	x := k // Newton: each step doubles the correct low bits
	for range 6 {
		x *= 2 - k*x
	}
	return x
}

// FuzzCompileRender: no source crashes the engine or escapes its limits.
func FuzzCompileRender(f *testing.F) {
	for _, s := range []string{
		`{{ x }}`, `{% for m in messages %}{{ m.role }}{% endfor %}`,
		`{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}`, `{{ 'x' * 99 }}`,
		`{{ range(3)|join(',') }}`, `{{ x[1:2:3] }}`, `{% set ns = namespace(a=1) %}{{ ns.a }}`,
		`{{ (((1))) }}`, `{% if a %}{% elif b %}{% else %}{% endif %}`, `{{ {'a': [1]}|tojson(indent=1) }}`,
	} {
		f.Add(s)
	}
	lim := jinja.Limits{MaxSteps: 20_000, MaxCallDepth: 16, MaxOutputBytes: 1 << 16, MaxAllocBytes: 1 << 20}
	data := map[string]any{"x": "abc", "messages": []any{map[string]any{"role": "user", "content": "hi"}}, "a": true}
	f.Fuzz(func(t *testing.T, src string) {
		tm, err := jinja.Compile(src)
		if err != nil {
			return
		}
		out, err := tm.RenderContext(context.Background(), data, lim)
		if err == nil && int64(len(out)) > lim.MaxOutputBytes {
			t.Fatalf("rendered %d bytes over the %d limit", len(out), lim.MaxOutputBytes)
		}
	})
}
