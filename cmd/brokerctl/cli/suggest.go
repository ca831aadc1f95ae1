package cli

import (
	"flag"
	"fmt"
	"sort"
	"strings"
)

// suggest returns the candidates nearest to what the user typed, for a "did
// you mean" hint: those at the smallest edit distance (optimal string
// alignment: insertions, deletions, substitutions and swaps of neighbours)
// when it is small for the word's length, else the candidates the word is a
// prefix of when there are at most three. Nil when nothing is near.
func suggest(typed string, candidates []string) []string {
	t := strings.ToLower(typed)
	if t == "" {
		return nil
	}
	limit := 1
	if len(t) > 4 {
		limit = 2
	}
	best, out := limit+1, []string(nil)
	for _, c := range candidates {
		d := editDistance(t, strings.ToLower(c))
		switch {
		case d > limit:
		case d < best:
			best, out = d, []string{c}
		case d == best:
			out = append(out, c)
		}
	}
	if out == nil && len(t) >= 2 {
		for _, c := range candidates {
			if strings.HasPrefix(strings.ToLower(c), t) {
				out = append(out, c)
			}
		}
		if len(out) > 3 {
			out = nil
		}
	}
	sort.Strings(out)
	return dedupe(out)
}

func dedupe(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// editDistance is the optimal string alignment distance between a and b
// (bytes: command and flag names are ASCII).
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// didYouMean renders suggestions as "; did you mean X?" (or "X or Y"), each
// quoted by quote; "" when there are none.
func didYouMean(s []string, quote func(string) string) string {
	if len(s) == 0 {
		return ""
	}
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = quote(v)
	}
	var list string
	switch len(q) {
	case 1:
		list = q[0]
	default:
		list = strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
	}
	return "; did you mean " + list + "?"
}

func commandNames() []string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return names
}

// unknownCommand is the one line for a command name brokerctl does not know.
func unknownCommand(name string) string {
	return fmt.Sprintf("unknown command %q%s (\"brokerctl help\" lists the commands)",
		name, didYouMean(suggest(name, commandNames()), func(s string) string { return fmt.Sprintf("%q", s) }))
}

// flagNames lists fs's flags.
func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// undefinedFlag returns the name in the flag package's "flag provided but
// not defined: -NAME" error, and whether err is that error.
func undefinedFlag(err error) (string, bool) {
	return strings.CutPrefix(err.Error(), "flag provided but not defined: -")
}

// unknownFlag is the one line for a flag fs does not define; help is the
// command that lists the flags ("brokerctl help" or "brokerctl help CMD").
func unknownFlag(name string, fs *flag.FlagSet, help string) string {
	name = strings.TrimLeft(name, "-")
	if i := strings.IndexByte(name, '='); i >= 0 {
		name = name[:i]
	}
	return fmt.Sprintf("unknown flag --%s%s (%q lists the flags)", name,
		didYouMean(suggest(name, flagNames(fs)), func(s string) string { return "--" + s }), help)
}

// commandFlagHint is the line for a command's flag given before the
// command ("brokerctl --json devices"); rest is what follows the flag. ""
// when name is no command's flag.
func commandFlagHint(name string, rest []string) string {
	name = strings.TrimLeft(name, "-")
	if i := strings.IndexByte(name, '='); i >= 0 {
		name = name[:i]
	}
	var cmd string
	for _, arg := range rest {
		if c, ok := lookup(arg); ok {
			cmd = c.name
			break
		}
	}
	if cmd != "" {
		c, _ := lookup(cmd)
		fs := newFlagSet("brokerctl " + cmd)
		c.setup(fs)
		if fs.Lookup(name) != nil {
			return fmt.Sprintf("--%s is a flag of %s: put it after the command (brokerctl %s --%s ...)", name, cmd, cmd, name)
		}
		return ""
	}
	for _, c := range commands() {
		fs := newFlagSet("brokerctl " + c.name)
		c.setup(fs)
		if fs.Lookup(name) != nil {
			return fmt.Sprintf("--%s is a flag of commands, not of brokerctl: put it after the command (\"brokerctl help COMMAND\" lists a command's flags)", name)
		}
	}
	return ""
}
