package cli

import (
	"slices"
	"strings"
	"testing"
)

func TestEditDistance(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"stats", "stats", 0}, {"", "top", 3}, {"statz", "stats", 1},
		{"wdie", "wide", 1}, // a swap of neighbours is one edit
		{"lod", "load", 1}, {"infr", "infer", 1}, {"devicse", "devices", 1}, {"kitten", "sitting", 3},
	} {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := editDistance(tt.b, tt.a); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.b, tt.a, got, tt.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	names := commandNames()
	for _, tt := range []struct {
		typed string
		want  []string
	}{
		{"statz", []string{"stats"}},
		{"STATS", []string{"stats"}},
		{"modles", []string{"models"}},
		{"unlaod", []string{"unload"}},
		{"dev", []string{"device", "devices"}}, // a prefix of both
		{"gen", []string{"generate"}},
		{"frobnicate", nil},
		{"x", nil},
		{"nope", nil}, // two edits from "top": too far for four letters
	} {
		if got := suggest(tt.typed, names); !slices.Equal(got, tt.want) {
			t.Errorf("suggest(%q) = %q, want %q", tt.typed, got, tt.want)
		}
	}
}

// TestTypos: a mistyped command or flag gets one line naming the nearest
// one, not the whole usage.
func TestTypos(t *testing.T) {
	ts := startServer(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"command", []string{"statz"}, `brokerctl: unknown command "statz"; did you mean "stats"? ("brokerctl help" lists the commands)`},
		{"command prefix", []string{"dev"}, `brokerctl: unknown command "dev"; did you mean "device" or "devices"? ("brokerctl help" lists the commands)`},
		{"command after flags", []string{"--timeout", "5s", "devcies"}, `brokerctl: unknown command "devcies"; did you mean "devices"? ("brokerctl help" lists the commands)`},
		{"global flag", []string{"--adr", "127.0.0.1:1", "devices"}, `brokerctl: unknown flag --adr; did you mean --addr? ("brokerctl help" lists the flags)`},
		{"command flag", []string{"devices", "--wdie"}, `brokerctl: devices: unknown flag --wdie; did you mean --wide? ("brokerctl help devices" lists the flags)`},
		{"command flag with value", []string{"infer", "m", "--inptu=a=@x.json"}, `brokerctl: infer: unknown flag --inptu; did you mean --input? ("brokerctl help infer" lists the flags)`},
		{"global flag after command", []string{"devices", "--sockt", "/x"}, `brokerctl: devices: unknown flag --sockt; did you mean --socket? ("brokerctl help devices" lists the flags)`},
		{"help", []string{"help", "modles"}, `brokerctl: help: unknown command "modles"; did you mean "models"? ("brokerctl help" lists the commands)`},
		{"command flag before the command", []string{"--wide", "devices"}, `brokerctl: --wide is a flag of devices: put it after the command (brokerctl devices --wide ...)`},
		{"command flag before no command", []string{"--json"}, `brokerctl: --json is a flag of commands, not of brokerctl: put it after the command ("brokerctl help COMMAND" lists a command's flags)`},
		{"nothing near", []string{"devices", "--frobnicate"}, `brokerctl: devices: unknown flag --frobnicate ("brokerctl help devices" lists the flags)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ts.run(t, nil, tt.args...)
			if r.code != ExitUsage || r.stderr != tt.want+"\n" || r.stdout != "" {
				t.Errorf("got %v\nwant exit %d and the one line %q", r, ExitUsage, tt.want)
			}
		})
	}
	// Other usage errors: the message and the synopsis, not every flag.
	r := ts.run(t, nil, "device")
	if lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n"); r.code != ExitUsage || len(lines) != 2 ||
		lines[1] != `usage: brokerctl device ID [--json] ("brokerctl help device" lists the flags)` {
		t.Errorf("device without ID: got %v, want the error and the synopsis line", r)
	}
}
