package bpe

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// referenceAdded is how added tokens were found before the automaton, kept
// as the oracle: at the leftmost position where one starts, the longest
// one there (the first added of equal ones), then again after it.
func referenceAdded(tokens []addedToken, s string) []addedHit {
	order := make([]int32, len(tokens))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return len(tokens[b].content) - len(tokens[a].content) })
	var hits []addedHit
	for at := 0; at < len(s); at++ {
		for _, k := range order {
			if strings.HasPrefix(s[at:], tokens[k].content) {
				hits = append(hits, addedHit{at, k})
				at += len(tokens[k].content) - 1
				break
			}
		}
	}
	return hits
}

// scanAdded finds the added tokens as EncodeLimit does, reading at least
// chunk bytes at a time (0: the default); it returns them and the scan's
// work.
func scanAdded(m *addedMatcher, s string, chunk int) ([]addedHit, int) {
	sc := m.scan(s)
	if chunk > 0 {
		sc.chunk = chunk
	}
	var hits []addedHit
	for at := 0; at < len(s); {
		i, tok := sc.next(at)
		if tok == nil {
			break
		}
		k := 0
		for k < len(m.tokens) && &m.tokens[k] != tok {
			k++
		}
		hits = append(hits, addedHit{i, int32(k)})
		at = i + len(tok.content)
	}
	return hits, sc.steps
}

func addedTokens(contents ...string) []addedToken {
	var tokens []addedToken
	for i, c := range contents {
		tokens = append(tokens, addedToken{c, int32(i)})
	}
	return tokens
}

// checkAdded compares the matcher with the oracle on s at several chunk
// sizes, so that tokens straddle the reads' boundaries.
func checkAdded(t *testing.T, tokens []addedToken, s string) {
	t.Helper()
	m := newAddedMatcher(tokens)
	want := referenceAdded(tokens, s)
	for _, chunk := range []int{0, 1, 2, 3, 7} {
		got, _ := scanAdded(m, s, chunk)
		if !slices.Equal(got, want) {
			t.Fatalf("tokens %q, text %q, chunk %d:\n got %v\nwant %v", contents(tokens), s, chunk, got, want)
		}
	}
}

func contents(tokens []addedToken) []string {
	var c []string
	for _, a := range tokens {
		c = append(c, a.content)
	}
	return c
}

// TestAddedTokensFoundAsBefore: the automaton finds the tokens the scan it
// replaced found: leftmost first, then the longest there, the first added
// of equal contents (equal tokens keep their distinct ids).
func TestAddedTokensFoundAsBefore(t *testing.T) {
	for _, tc := range []struct {
		tokens []string
		text   string
	}{
		{nil, "abc"},
		{[]string{"<|im_start|>", "<|im_end|>", "<think>"}, "<|im_start|>user\nhi<|im_end|><think><|im_start"},
		{[]string{"ab", "abc", "bc", "c"}, "abcabcbcab"},
		{[]string{"bcd", "abc"}, "abcd"},
		{[]string{"a", "aa", "aaa"}, strings.Repeat("a", 10)},
		{[]string{"x", "x", "xy", "xy"}, "xxyxyx"},
		{[]string{"ba", "a", "cba"}, "cbacbaba"},
		{[]string{strings.Repeat("a", 40) + "b", "ab", "b"}, strings.Repeat("a", 100) + "b" + strings.Repeat("a", 30) + "b"},
		{[]string{"é", "\xff", "\x00"}, "café\xff\x00é"},
	} {
		checkAdded(t, addedTokens(tc.tokens...), tc.text)
	}
	// Random tokens over a small alphabet, so that they overlap, nest and
	// repeat, in random texts.
	r := rand.New(rand.NewPCG(1, 2))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "abc"[r.IntN(3)]
		}
		return string(b)
	}
	for range 300 {
		var tokens []string
		for range 1 + r.IntN(12) {
			tokens = append(tokens, word(1+r.IntN(6)))
		}
		checkAdded(t, addedTokens(tokens...), word(r.IntN(200)))
	}
}

// TestAddedTokenScanIsLinear: a file's added tokens cannot make finding
// them in a prompt cost more than a few steps a byte. 1,000 control
// tokens of 1,000 'a's and a number (or a number and 1,000 'a's: the
// automaton reads backwards) in a prompt of 'a's cost the scan it
// replaced 1,000 × 1,000 byte compares a byte: seconds for 64 KB, minutes
// for 1 MB.
func TestAddedTokenScanIsLinear(t *testing.T) {
	long := strings.Repeat("a", 1000)
	for _, tc := range []struct {
		name  string
		token func(i int) string
		text  string
	}{
		{"shared prefix", func(i int) string { return long + strconv.Itoa(i) }, strings.Repeat("a", 64<<10)},
		{"shared suffix", func(i int) string { return strconv.Itoa(i) + long }, strings.Repeat("a", 64<<10)},
		{"shared suffix, matches", func(i int) string { return strconv.Itoa(i) + long }, strings.Repeat("7"+long+"a", 64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Vocab{Model: "gpt2", Pre: "qwen2", BOS: -1, EOS: -1, PAD: -1, UNK: -1}
			for b := range 256 {
				v.Tokens = append(v.Tokens, string(byteLevelEncode(nil, string([]byte{byte(b)}))))
				v.Types = append(v.Types, TokenNormal)
			}
			for i := range 1000 {
				v.Tokens = append(v.Tokens, tc.token(i))
				v.Types = append(v.Types, TokenControl)
			}
			tok, err := NewFromVocab(v)
			if err != nil {
				t.Fatal(err)
			}
			_, steps := scanAdded(tok.added, tc.text, 0)
			// Each read looks a node up at most twice a byte, and reads
			// maxLen bytes past its chunk.
			m := tok.added
			chunks := len(tc.text)/max(addedChunk, 4*m.maxLen) + 1
			if limit := 2 * (len(tc.text) + chunks*m.maxLen); steps > limit {
				t.Errorf("finding the added tokens in %d bytes took %d steps, over %d", len(tc.text), steps, limit)
			}
			if ids := tok.Encode(tc.text, false); len(ids) == 0 {
				t.Error("no ids")
			}
		})
	}
}

// TestAddedTokensBounded: added tokens of more than maxAddedBytes in all
// are refused, which bounds the automaton's memory.
func TestAddedTokensBounded(t *testing.T) {
	v := Vocab{Model: "gpt2", Pre: "qwen2", BOS: -1, EOS: -1, PAD: -1, UNK: -1}
	for i := range maxAddedBytes/maxTokenBytes + 1 {
		v.Tokens = append(v.Tokens, strings.Repeat("x", maxTokenBytes-8)+strconv.Itoa(10_000_000+i))
		v.Types = append(v.Types, TokenUserDefined)
	}
	if _, err := NewFromVocab(v); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "added tokens") {
		t.Errorf("%d bytes of added tokens: %v", len(v.Tokens)*maxTokenBytes, err)
	}
}

// FuzzAddedMatcher: the automaton finds what the oracle finds, whatever
// the tokens ('|' separates them) and the text.
func FuzzAddedMatcher(f *testing.F) {
	for _, s := range [][2]string{
		{"ab|abc|bc|c", "abcabcbcab"}, {"<|im_start|>|<|im_end|>", "<|im_start|>hi<|im_end|>"},
		{"a|aa|a", "aaaaaaa"}, {"ba|a|cba", "cbacbaba"}, {"|x||", "xx"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, tokens, text string) {
		var list []string
		for _, c := range strings.Split(tokens, "|") {
			if c != "" && len(c) <= maxTokenBytes {
				list = append(list, c)
			}
		}
		checkAdded(t, addedTokens(list...), text)
	})
}
