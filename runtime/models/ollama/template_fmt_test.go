package ollama

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"text/template"
	"time"
)

// TestTemplateFmtBoundedBeforeBuilt: printf's widths and precisions, and
// an argument printed by many directives, make megabytes out of a few
// bytes of format. The render refuses such a call before fmt builds its
// result: it returns the allocation limit's error having allocated a
// small multiple of the limit, not the tens of megabytes the call would
// have made (a 1 MiB template of them made ~80 GB at its trial render).
func TestTemplateFmtBoundedBeforeBuilt(t *testing.T) {
	big := ChatMessage{Role: "user", Content: strings.Repeat("x", 64<<10)}
	for _, tc := range []struct {
		name string
		tmpl string
		msgs []ChatMessage
	}{
		{"width 1e6 x 64", `{{ printf "` + strings.Repeat("%01000000[1]d", 64) + `" 0 }}`, nil},
		{"width 1e7 x 8", `{{ printf "` + strings.Repeat("%09999999[1]d", 8) + `" 0 }}`, nil},
		{"star width x 64", `{{ printf "` + strings.Repeat("%[1]*[2]d", 64) + `" 1000000 0 }}`, nil},
		{"float precision x 64", `{{ printf "` + strings.Repeat("%.1000000[1]f", 64) + `" 1.5 }}`, nil},
		{"width on each element", `{{ printf "` + strings.Repeat("%1000000[1]v", 32) + `" .Messages }}`, sysChat},
		{"one string many times", `{{ range .Messages }}{{ printf "` + strings.Repeat("%[1]s", 1024) + `" .Content }}{{ end }}`, []ChatMessage{big}},
		{"one string hex-escaped", `{{ range .Messages }}{{ printf "` + strings.Repeat("% #[1]x", 256) + `" .Content }}{{ end }}`, []ChatMessage{big}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm, err := ParseTemplate(tc.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			msgs := tc.msgs
			if msgs == nil {
				msgs = []ChatMessage{{Role: "user", Content: "hi"}}
			}
			lim := TemplateLimits{MaxSteps: 1000, MaxAllocBytes: 1 << 20, MaxOutputBytes: 1 << 20, MaxTime: time.Hour}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = tm.Render(context.Background(), msgs, RenderOptions{Limits: lim})
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrTemplateLimit) || !strings.Contains(err.Error(), "made more than") {
				t.Errorf("want the allocation limit's error, got %v", err)
			}
			// Generous: the render's own allocations are well under a
			// MiB; the call refused would have made 64 MiB or more.
			if grew := int64(after.TotalAlloc - before.TotalAlloc); grew > 8*lim.MaxAllocBytes {
				t.Errorf("the render allocated %d MiB under a %d MiB bound: the call ran before it was counted", grew>>20, lim.MaxAllocBytes>>20)
			}
		})
	}
}

// TestTemplateFmtBoundKeepsRealCalls: the bound refuses nothing a real
// template's printf, print or escaper makes from a conversation.
func TestTemplateFmtBoundKeepsRealCalls(t *testing.T) {
	src := `{{ range .Messages }}{{ printf "%s: %q %d %v\n" .Role .Content 7 .ToolCalls }}{{ print .Role .Content }}` +
		`{{ html .Content }}{{ js .Content }}{{ urlquery .Content }}{{ println .ToolCalls }}{{ end }}{{ printf "%v" .Tools }}`
	tm, err := ParseTemplate(src)
	if err != nil {
		t.Fatal(err)
	}
	long := append([]ChatMessage{{Role: "user", Content: strings.Repeat("long prompt ", 10_000)}}, toolChat...)
	for _, lim := range []TemplateLimits{{}, {MaxAllocBytes: 2 << 20}} {
		if _, err := tm.Render(context.Background(), long, RenderOptions{Tools: weatherTool, Limits: lim}); err != nil {
			t.Errorf("%+v: %v", lim, err)
		}
	}
}

// FuzzFmtBound: the bounds hold, whatever the format and whatever the
// arguments (scalars, and the values templates see: messages with tool
// calls, tools, their Stringers): fmt never makes more than printfBound
// or printBound says, nor an escaper more than six times printBound.
func FuzzFmtBound(f *testing.F) {
	for _, format := range []string{
		"%v", "%s%s%s", "% #x", "% #X", "%+q", "%#q", "%#v", "%+v", "%.300f", "%x %X", "%U %#U", "%c", "%q",
		"%*d", "%-*.*f", "%[2]*[1]d", "%[1][%d]x", "%5.5.%5d", "%[99999999999][%d]x", "%[1]5.[%d]d",
		"%10000000d", "%.[%d]d", "%!", "%", "%%%5%", "%d %d %d %d %d %d", "%T %p", "%[3]v %[1]v", "%é%☃",
		"%[0]d", "%[x]d%d", "%.*[1]d", "%-+# 0123.456e", "%b %o %O", "%t", "%8.3g", "%[2]d",
	} {
		f.Add(format, "é<\"\x01\xff☃", int64(-255), 1e308)
	}
	msgs, err := templateMessages(toolChat)
	if err != nil {
		f.Fatal(err)
	}
	tools, err := templateTools(weatherTool)
	if err != nil {
		f.Fatal(err)
	}
	const limit = 1 << 20
	f.Fuzz(func(t *testing.T, format, s string, n int64, x float64) {
		for _, args := range [][]any{
			{s, n, x}, {n, s}, {x, complex(x, -x), true, nil}, {}, {[]byte(s), []any{s, n}, map[string]any{s: x}},
			{msgs, tools}, {msgs[1].ToolCalls[0].Function.Arguments, tools[0].Function, &tools[0]}, {int(n), int(n), s},
		} {
			if b := printfBound(format, args, limit); b <= limit {
				if out := fmt.Sprintf(format, args...); int64(len(out)) > b {
					t.Fatalf("Sprintf(%q, %#v): %d bytes, over the bound of %d", format, args, len(out), b)
				}
			}
			all := append([]any{format}, args...)
			b := printBound(all, limit)
			if b > limit {
				continue
			}
			for name, f := range map[string]func(...any) string{"print": fmt.Sprint, "println": fmt.Sprintln} {
				if out := f(all...); int64(len(out)) > b {
					t.Fatalf("%s(%#v): %d bytes, over the bound of %d", name, all, len(out), b)
				}
			}
			for name, f := range map[string]func(...any) string{"html": template.HTMLEscaper, "js": template.JSEscaper, "urlquery": template.URLQueryEscaper} {
				for _, a := range [][]any{all, {format}, {s}} {
					if out := f(a...); int64(len(out)) > fmtEscape*printBound(a, limit) {
						t.Fatalf("%s(%#v): %d bytes, over the bound", name, a, len(out))
					}
				}
			}
		}
	})
}
