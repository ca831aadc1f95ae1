package grammar

import (
	"fmt"
	"math/rand/v2"
	"unicode/utf8"
)

// SyntheticVocab makes a deterministic vocabulary of n tokens shaped like
// Qwen2's byte-level BPE (151,936 ids): the 256 single bytes, runs of
// spaces, newlines and tabs, JSON punctuation combinations, escapes,
// numbers, English-like subwords with and without a leading space or
// capital, code fragments, CJK and other multi-byte UTF-8 characters and
// words, partial UTF-8 sequences, and at the end special tokens given as
// nil of which two are end-of-sequence (like <|endoftext|> and <|im_end|>).
// For tests and benchmarks of the grammar engine with no model at hand.
func SyntheticVocab(n int, seed uint64) (tokens [][]byte, eos []int32) {
	if n < 512 {
		n = 512
	}
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	specials := max(4, n/500) // Qwen2: 151,643 regular + 293 specials and padding
	regular := n - specials
	seen := map[string]bool{}
	add := func(s string) {
		if len(tokens) < regular && s != "" && !seen[s] {
			seen[s] = true
			tokens = append(tokens, []byte(s))
		}
	}
	for b := range 256 {
		add(string([]byte{byte(b)}))
	}
	frac := func(f float64) int { return int(float64(regular) * f) }
	for i := 2; i <= 32; i++ {
		add(spaces(i, ' '))
	}
	for i := 1; i <= 8; i++ {
		add(spaces(i, '\n'))
		add(spaces(i, '\t'))
		for j := 1; j <= 24; j++ {
			add(spaces(i, '\n') + spaces(j, ' '))
		}
	}
	add(" \n")
	add("\r\n")
	punct := []string{"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "0", "1", "-", "."}
	for _, a := range punct {
		for _, b := range punct {
			add(a + b)
			for _, c := range punct {
				add(a + b + c)
			}
		}
	}
	for range frac(0.01) {
		s := ""
		for range 4 + r.IntN(3) {
			s += punct[r.IntN(8)]
		}
		add(s)
	}
	for _, e := range []string{`\n`, `\"`, `\\`, `\t`, `\u`, `\u00`, `\/`, `\r`, `":"`, `","`, `":`, `",`, `{"`, `"}`, `"]`, `["`, `"},`, `"},{"`, `\n\n`, `\\n`} {
		add(e)
		add(" " + e)
	}
	for i := range 1000 {
		add(fmt.Sprint(i))
		add(fmt.Sprintf("%03d", i))
	}
	for _, c := range []string{"()", "();", "=>", "//", "/*", "*/", "    return", "func", "def ", "if (", "else", "null", "true", "false", "None", "nil", "self.", "this.", "==", "!=", "<=", ">=", "&&", "||", "::", "->", "</", "/>", "<div", "http", "://", "www.", ".com"} {
		add(c)
		add(" " + c)
	}
	// multi-byte UTF-8: CJK characters and words, other scripts, emoji,
	// and partial sequences as byte-level BPE has them
	cjk := func() string { return string(rune(0x4E00 + r.IntN(0x9FFF-0x4E00))) }
	for range frac(0.12) {
		add(cjk())
	}
	for range frac(0.08) {
		s := cjk() + cjk()
		if r.IntN(3) == 0 {
			s += cjk()
		}
		add(s)
	}
	for range frac(0.02) {
		var base rune
		switch r.IntN(4) {
		case 0:
			base = 0x0430 // Cyrillic
		case 1:
			base = 0x03B1 // Greek
		case 2:
			base = 0x00E0 // Latin-1 accents
		default:
			base = 0x0627 // Arabic
		}
		s := ""
		if r.IntN(2) == 0 {
			s = " "
		}
		for range 1 + r.IntN(6) {
			s += string(base + rune(r.IntN(26)))
		}
		add(s)
	}
	for range frac(0.003) {
		add(string(rune(0x1F300 + r.IntN(0x2FF))))
	}
	for range frac(0.005) {
		b := []byte(cjk())
		add(string(b[:1+r.IntN(2)]))
		if !utf8.Valid(b[:2]) {
			add(string(b[1:]))
		}
	}
	// English-like subwords fill the rest
	onsets := []string{"", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s", "t", "v", "w", "y", "z", "bl", "br", "ch", "cl", "cr", "dr", "fl", "fr", "gr", "pl", "pr", "sc", "sh", "sl", "sp", "st", "str", "th", "tr", "wh"}
	vowels := []string{"a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oo", "ou", "y"}
	codas := []string{"", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "nt", "rs", "st", "ck", "ll", "ss", "tion", "ing", "ed", "er", "ly"}
	for len(tokens) < regular {
		w := ""
		for range 1 + r.IntN(3) {
			w += onsets[r.IntN(len(onsets))] + vowels[r.IntN(len(vowels))] + codas[r.IntN(len(codas))]
		}
		switch k := r.IntN(10); {
		case k < 5:
			w = " " + w
		case k < 6:
			w = " " + string(w[0]-32) + w[1:]
		case k < 7:
			w = string(w[0]-32) + w[1:]
		case k < 8:
			w += []string{".", ",", "\":", "\",", "s", "()", "_", "\"", ":"}[r.IntN(9)]
		}
		add(w)
	}
	for i := range specials {
		tokens = append(tokens, nil)
		if i == 0 || i == 2 {
			eos = append(eos, int32(len(tokens)-1))
		}
	}
	return tokens, eos
}

func spaces(n int, c byte) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = c
	}
	return string(b)
}
