package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gomlx/go-huggingface/tokenizers/api"
	"github.com/gomlx/go-huggingface/tokenizers/hftokenizer"
	"golang.org/x/text/unicode/norm"
)

// hftokenizer's pre-tokenisers are quadratic in the length of the text they
// are given (every rune re-encodes the runes before it: a 2 KiB text takes
// 13 ms, one 64 KiB word 10 s), and its Unigram and BPE models cubic in a
// word's. So a text is given to it a few words at a time, cut where cutting
// changes no id, and a word too long to give it whole is handled here.
const (
	// pieceBytes is the size a piece of whole words grows to. Pieces of a
	// word or two are the fastest: at 16 bytes BERT prose tokenises at
	// about 330 ns a byte, at 2 KiB at 6.6 µs.
	pieceBytes = 16
	// maxWordBytes bounds a word given to the library whole: longer words
	// are WordPiece's [UNK] (computed here), or cut at rune boundaries. It
	// also bounds max_input_chars_per_word.
	maxWordBytes = 256
	// maxPartBytes bounds the parts a long word is cut into for Unigram and
	// BPE, whose searches are cubic in a word's length (a 256-byte word
	// takes 20 ms).
	maxPartBytes = 64
	// maxShortWordBytes bounds a word given whole that normalises to at
	// most max_input_chars_per_word bytes (its other runes control
	// characters and accents).
	maxShortWordBytes = 4096
)

// cutter says where a text may be cut into pieces the library tokenises one
// at a time.
type cutter struct {
	// exact: a cut before whitespace gives the whole text's ids (see
	// chunkable); otherwise texts are cut before spaces anyway, which is
	// exact for the byte-level and metaspace pre-tokenisers with per-rune
	// normalisers and close for the rest.
	exact bool
	// punct: the pre-tokeniser makes each punctuation rune a word of its
	// own (BertPreTokenizer), so a cut on either side of one is exact too.
	punct bool
	// cjk: the normaliser puts spaces around CJK ideographs.
	cjk bool
	// nfd: the normaliser decomposes runes (NFD, stripping accents).
	nfd bool
	// wordPiece: a word of more than maxChars bytes is one [UNK] (unkID; no
	// id when hasUnk is false).
	wordPiece bool
	maxChars  int
	// maxWord: a word longer than this is not given to the library whole.
	maxWord int
	unkID   int32
	hasUnk  bool
	// added are the added tokens' contents, which the library matches in
	// the raw text before anything else, longest first.
	added []string
}

func newCutter(tj *hftokenizer.TokenizerJSON, hf *hftokenizer.Tokenizer, exact bool) cutter {
	c := cutter{exact: exact, wordPiece: tj.Model.Type == "WordPiece", maxChars: tj.Model.MaxInputCharsPerWord}
	if c.maxChars == 0 {
		c.maxChars = 100 // the library's default, as Hugging Face's
	}
	c.maxWord = maxPartBytes
	if c.wordPiece {
		c.maxWord = maxWordBytes
	}
	if tj.PreTokenizer != nil && tj.PreTokenizer.Type == "BertPreTokenizer" {
		c.punct = true
	}
	var walk func(n *hftokenizer.Normalizer)
	walk = func(n *hftokenizer.Normalizer) {
		if n == nil {
			return
		}
		switch n.Type {
		case "BertNormalizer":
			// As the library's Encode reads its flags.
			c.cjk = c.cjk || n.HandleChineseChars
			c.nfd = c.nfd || (n.StripAccents != nil && *n.StripAccents) || (n.StripAccents == nil && n.Lowercase)
		case "NFD", "StripAccents":
			c.nfd = true
		}
		for i := range n.Normalizers {
			walk(&n.Normalizers[i])
		}
	}
	walk(tj.Normalizer)
	if id, err := hf.SpecialTokenID(api.TokUnknown); err == nil {
		c.unkID, c.hasUnk = int32(id), true
	}
	for _, at := range tj.AddedTokens {
		c.added = append(c.added, at.Content)
	}
	return c
}

// space is where a cut before the rune is a word boundary.
func (c *cutter) space(r rune) bool {
	if c.exact {
		return isBertSpace(r)
	}
	return r == ' '
}

// splits says the rune is a word of its own for the pre-tokeniser: also a
// symbol that decomposes into punctuation (U+1FEF into "`") where accents
// are stripped.
func (c *cutter) splits(r rune) bool {
	if c.cjk && isChineseChar(r) {
		return true
	}
	if !c.punct {
		return false
	}
	if isPunctuation(r) {
		return true
	}
	if !c.nfd || r < utf8.RuneSelf || unicode.IsLetter(r) {
		return false
	}
	d := norm.NFD.PropertiesString(string(r)).Decomposition()
	return len(d) > 0 && strings.IndexFunc(string(d), isPunctuation) >= 0
}

// pieces walks a text piece by piece. Every cut it makes is at a position
// the library's own scan of the whole text passes through: no added token's
// occurrence spans it, and (for exact cutters) the pre-tokeniser splits
// words there.
type pieces struct {
	c    *cutter
	text string
	pos  int
	// next[i] is where c.added[i] next occurs at or after pos (len(text)
	// when it does not), so the scan for added tokens stays linear.
	next []int
}

func (c *cutter) pieces(text string) *pieces {
	p := &pieces{c: c, text: text, next: make([]int, len(c.added))}
	for i := range p.next {
		p.next[i] = -1
	}
	return p
}

func (p *pieces) done() bool { return p.pos >= len(p.text) }

// addedAt is where the first added token at or after pos begins, and the
// length of the longest one that begins there (the one the library picks).
func (p *pieces) addedAt() (at, n int) {
	at = len(p.text)
	for i, tok := range p.c.added {
		if p.next[i] < p.pos {
			p.next[i] = len(p.text)
			if j := strings.Index(p.text[p.pos:], tok); j >= 0 {
				p.next[i] = p.pos + j
			}
		}
		switch {
		case p.next[i] < at:
			at, n = p.next[i], len(tok)
		case p.next[i] == at && at < len(p.text):
			n = max(n, len(tok))
		}
	}
	return at, n
}

// piece returns the next piece and advances past it. With word set, the
// piece is a single word longer than maxWordBytes (and whitespace before
// it) that the caller turns into ids itself.
func (p *pieces) piece() (s string, word bool) {
	start := p.pos
	end := p.cut()
	if end < 0 {
		end, word = -end, true
	}
	p.pos = end
	return p.text[start:end], word
}

// cut finds where the piece beginning at pos ends: negated for a long
// word.
func (p *pieces) cut() int {
	pos, text := p.pos, p.text
	at, n := p.addedAt()
	if at == pos {
		return pos + n // the added token alone
	}
	limit := at // the piece must not reach into the token
	if limit-pos <= pieceBytes {
		return limit
	}
	// The last word boundary within pieceBytes (a cut before whitespace, or
	// on either side of a rune that is a word of its own), else the first
	// one after: the end of a word that runs past pieceBytes.
	last, prevSplits := -1, false
	for i, r := range text[pos:limit] {
		q := pos + i
		if last >= 0 && q > pos+pieceBytes {
			break
		}
		splits := p.c.splits(r)
		if q > pos && (p.c.space(r) || splits || prevSplits) {
			if q > pos+pieceBytes {
				return q // the end of a word that runs past pieceBytes
			}
			last = q
		}
		if last < 0 && q-pos > p.c.maxWord {
			// A long word: WordPiece's answer is known without its end
			// being cut; other models get it in parts.
			if p.c.exact && p.c.wordPiece {
				return -p.wordEnd(q, limit)
			}
			cut := pos + p.c.maxWord
			for cut > pos+1 && !utf8.RuneStart(text[cut]) {
				cut--
			}
			return cut
		}
		prevSplits = splits
	}
	if last < 0 {
		return limit
	}
	return last
}

// wordEnd is where the word running through q ends (at most limit).
func (p *pieces) wordEnd(q, limit int) int {
	prevSplits := false
	for i, r := range p.text[q:limit] {
		splits := p.c.splits(r)
		if p.c.space(r) || splits || prevSplits {
			return q + i
		}
		prevSplits = splits
	}
	return limit
}

// longWord gives the ids of a word longer than maxWordBytes (possibly after
// whitespace) for an exact WordPiece cutter, without handing the library
// the whole word: WordPiece makes a word of more than maxChars bytes one
// [UNK]. Normalising removes control runes and (stripping accents) marks
// and keeps at least a byte of every other rune, so their count is a lower
// bound of the normalised length. ok is false where that does not decide
// it: a long word of few such runes.
func (c *cutter) longWord(lib func(string) []int, s string) (ids []int32, ok bool) {
	kept := 0
	for _, r := range strings.TrimLeftFunc(s, isBertSpace) {
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.In(r, unicode.M) {
			continue
		}
		kept++
	}
	switch {
	case kept > c.maxChars && c.hasUnk:
		return []int32{c.unkID}, true
	case kept > c.maxChars:
		return nil, true
	case len(s) <= maxShortWordBytes:
		// Mostly runes normalising removes: short enough for the library.
		return appendIDs(nil, lib(s)), true
	}
	return nil, false
}

// isPunctuation and isChineseChar are hftokenizer's own definitions (its
// pre-tokeniser splits at the first, its BERT normaliser spaces the second).
func isPunctuation(r rune) bool {
	if (r >= 33 && r <= 47) || (r >= 58 && r <= 64) || (r >= 91 && r <= 96) || (r >= 123 && r <= 126) {
		return true
	}
	return unicode.IsPunct(r)
}

func isChineseChar(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) || (r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B820 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}
