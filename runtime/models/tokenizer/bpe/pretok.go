package bpe

import (
	"unicode"
	"unicode/utf8"
)

// The Llama 3 and Qwen2/Qwen3 Split pre-tokenizers use these patterns
// (Oniguruma syntax, as the Rust tokenizers library runs them):
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// with \p{N}{1,3} (Llama 3) or \p{N} (Qwen). Go's regexp has no lookahead,
// so splitter matches exactly these patterns by hand: at each position the
// alternatives are tried in order and the first that matches wins, each with
// the result its greedy backtracking would give. Any other pattern is refused
// at load time rather than approximated.
const (
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitter cuts text into the pieces the Split pre-tokenizer isolates.
type splitter struct {
	maxDigits int // 3 for Llama 3, 1 for Qwen
}

// newSplitter returns the splitter for a known pattern, ok false otherwise.
func newSplitter(pattern string) (splitter, bool) {
	switch pattern {
	case patternLlama3:
		return splitter{maxDigits: 3}, true
	case patternQwen2:
		return splitter{maxDigits: 1}, true
	}
	return splitter{}, false
}

// rune classes of the patterns. Invalid UTF-8 bytes decode to RuneError,
// which is a symbol (So): they fall in [^\s\p{L}\p{N}], as they must for
// byte-level BPE to keep every byte.
func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }

// isSpace is Oniguruma's \s with Unicode: the White_Space property.
func isSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200A
}

func isNewline(r rune) bool { return r == '\r' || r == '\n' }

// at decodes the rune at i; width 0 at the end of s.
func at(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	return utf8.DecodeRuneInString(s[i:])
}

// split calls emit with each piece of s in order; the pieces concatenate to s.
func (sp splitter) split(s string, emit func(piece string)) {
	for i := 0; i < len(s); {
		n := sp.match(s, i)
		if n <= 0 { // cannot happen: \s+ or the symbol class covers every rune
			_, n = at(s, i)
		}
		emit(s[i : i+n])
		i += n
	}
}

// match returns the length of the match starting at i (i < len(s)).
func (sp splitter) match(s string, i int) int {
	r, w := at(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' {
		if n := contraction(s[i+w:]); n > 0 {
			return w + n
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(r) {
		return w + letters(s, i+w)
	}
	if !isNewline(r) && !isNumber(r) {
		if r2, w2 := at(s, i+w); w2 > 0 && isLetter(r2) {
			return w + w2 + letters(s, i+w+w2)
		}
	}
	// \p{N}{1,maxDigits}
	if isNumber(r) {
		n := w
		for k := 1; k < sp.maxDigits; k++ {
			r2, w2 := at(s, i+n)
			if w2 == 0 || !isNumber(r2) {
				break
			}
			n += w2
		}
		return n
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	start := i
	if r == ' ' {
		start = i + w
	}
	if n := symbols(s, start); n > 0 {
		end := start + n
		for {
			r2, w2 := at(s, end)
			if w2 == 0 || !isNewline(r2) {
				break
			}
			end += w2
		}
		return end - i
	}
	// What remains starts with whitespace (everything else was matched above).
	// run is the maximal whitespace run; lastNL the end of its last \r or \n.
	end, lastNL := i, -1
	for {
		r2, w2 := at(s, end)
		if w2 == 0 || !isSpace(r2) {
			break
		}
		end += w2
		if isNewline(r2) {
			lastNL = end
		}
	}
	if end == i {
		return 0
	}
	// \s*[\r\n]+: \s* backtracks to just before the run's last newline.
	if lastNL > 0 {
		return lastNL - i
	}
	// \s+(?!\S): the whole run at the end of text, else the run less its
	// last rune (that rune is whitespace, so the lookahead holds).
	if end == len(s) {
		return end - i
	}
	_, lastW := utf8.DecodeLastRuneInString(s[i:end])
	if end-lastW > i {
		return end - lastW - i
	}
	// \s+
	return end - i
}

// contraction matches (?i:s|t|re|ve|m|ll|d) after the apostrophe, in the
// alternatives' order. Case folding includes U+017F (ſ), which folds to s.
func contraction(s string) int {
	r, w := at(s, 0)
	switch r {
	case 's', 'S', 'ſ', 't', 'T', 'm', 'M', 'd', 'D':
		return w
	case 'r', 'R', 'v', 'V':
		if r2, w2 := at(s, w); r2 == 'e' || r2 == 'E' {
			return w + w2
		}
	case 'l', 'L':
		if r2, w2 := at(s, w); r2 == 'l' || r2 == 'L' {
			return w + w2
		}
	}
	return 0
}

// letters returns the length of the run of \p{L} at i.
func letters(s string, i int) int {
	n := 0
	for {
		r, w := at(s, i+n)
		if w == 0 || !isLetter(r) {
			return n
		}
		n += w
	}
}

// symbols returns the length of the run of [^\s\p{L}\p{N}] at i.
func symbols(s string, i int) int {
	n := 0
	for {
		r, w := at(s, i+n)
		if w == 0 || isSpace(r) || isLetter(r) || isNumber(r) {
			return n
		}
		n += w
	}
}
