// Package tokenizer turns text into BERT input ids from a Hugging Face
// tokenizer.json.
//
// Normalisation, pre-tokenisation and the WordPiece model come from
// github.com/gomlx/go-huggingface/tokenizers/hftokenizer. That package adds
// special tokens for single texts only and has no pairs, token type ids or
// pair truncation, so this package does the post-processing itself from the
// file's post_processor (TemplateProcessing, BertProcessing or
// RobertaProcessing), with the Hugging Face "longest first" truncation.
package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gomlx/go-huggingface/tokenizers/api"
	"github.com/gomlx/go-huggingface/tokenizers/hftokenizer"
)

// ErrTooLong means a text needs more tokens than allowed and truncation was
// not requested.
var ErrTooLong = errors.New("text too long")

// ErrInvalid means the tokenizer.json cannot be used.
var ErrInvalid = errors.New("invalid tokenizer")

// maxVocab bounds token ids: far above any vocabulary, far below what a
// table sized by an id could allocate.
const maxVocab = 1 << 23

// item is one element of a post-processing template: a run of special ids,
// or the first (seq 0) or second (seq 1) sequence.
type item struct {
	special []int32
	seq     int
	typeID  int32
}

// Tokenizer encodes text into token ids and token type ids. It is immutable
// after Load and safe for concurrent use.
type Tokenizer struct {
	hf           *hftokenizer.Tokenizer
	single, pair []item
	nSingle      int // special tokens the single template adds
	nPair        int
	padID        int32
	vocabSize    int
	cut          cutter
	// lib is hf.Encode; a test counts what it is given.
	lib func(string) []int
}

// fileJSON is the part of tokenizer.json read here besides what hftokenizer
// reads (the post-processor's special token ids and the padding).
type fileJSON struct {
	Padding *struct {
		PadID int `json:"pad_id"`
	} `json:"padding"`
}

// Load reads a tokenizer.json.
func Load(path string) (*Tokenizer, error) {
	content, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := parse(content)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, path, err)
	}
	return t, nil
}

func parse(content []byte) (*Tokenizer, error) {
	var tj hftokenizer.TokenizerJSON
	if err := json.Unmarshal(content, &tj); err != nil {
		return nil, fmt.Errorf("bad JSON: %w", err)
	}
	var extra fileJSON
	if err := json.Unmarshal(content, &extra); err != nil {
		return nil, fmt.Errorf("bad JSON: %w", err)
	}
	switch tj.Model.Type {
	case "WordPiece", "BPE", "Unigram":
	default:
		return nil, fmt.Errorf("model type %q is not supported (WordPiece, BPE, Unigram)", tj.Model.Type)
	}
	if len(tj.Model.Vocab) == 0 {
		return nil, errors.New("empty vocabulary")
	}
	// Ids index tables and an empty added token would match everywhere
	// (hftokenizer then never advances): refuse both before it sees them.
	for tok, id := range tj.Model.Vocab {
		if id < 0 || id >= maxVocab {
			return nil, fmt.Errorf("vocabulary entry %q has id %d: want 0 to %d", tok, id, maxVocab-1)
		}
	}
	for i, at := range tj.AddedTokens {
		if at.Content == "" || at.ID < 0 || at.ID >= maxVocab {
			return nil, fmt.Errorf("added_tokens[%d]: id %d, content %q: want a non-empty content and an id from 0 to %d", i, at.ID, at.Content, maxVocab-1)
		}
	}
	hf, err := hftokenizer.NewFromContent(nil, content)
	if err != nil {
		return nil, err
	}
	// Special tokens are added here, from the templates, never by hftokenizer.
	if err := hf.With(api.EncodeOptions{}); err != nil {
		return nil, err
	}
	t := &Tokenizer{hf: hf}

	maxID := -1
	for _, id := range tj.Model.Vocab {
		maxID = max(maxID, id)
	}
	for _, at := range tj.AddedTokens {
		maxID = max(maxID, at.ID)
	}
	t.vocabSize = maxID + 1

	switch {
	case extra.Padding != nil:
		t.padID = int32(extra.Padding.PadID)
	default:
		if id, ok := hf.TokenToID("[PAD]"); ok {
			t.padID = int32(id)
		}
	}
	if int(t.padID) >= t.vocabSize || t.padID < 0 {
		return nil, fmt.Errorf("pad id %d outside the vocabulary of %d", t.padID, t.vocabSize)
	}

	if err := t.templates(tj.PostProcessor); err != nil {
		return nil, err
	}
	t.nSingle = countSpecial(t.single)
	t.nPair = countSpecial(t.pair)
	if tj.Model.Type == "WordPiece" && tj.Model.MaxInputCharsPerWord > maxWordBytes {
		// WordPiece's search is cubic in a word's length.
		return nil, fmt.Errorf("model max_input_chars_per_word %d: at most %d", tj.Model.MaxInputCharsPerWord, maxWordBytes)
	}
	t.cut = newCutter(&tj, hf, chunkable(&tj))
	t.lib = hf.Encode
	return t, nil
}

// templates builds the single and pair templates from the post-processor.
func (t *Tokenizer) templates(pp *hftokenizer.PostProcessor) error {
	bertStyle := func(cls, sep int, pairType int32, doubleSep bool) {
		c, s := []int32{int32(cls)}, []int32{int32(sep)}
		t.single = []item{{special: c}, {seq: 0}, {special: s}}
		t.pair = []item{{special: c}, {seq: 0}, {special: s}}
		if doubleSep {
			t.pair = append(t.pair, item{special: s, typeID: pairType})
		}
		t.pair = append(t.pair, item{seq: 1, typeID: pairType}, item{special: s, typeID: pairType})
	}
	if pp == nil {
		// No post-processor: BERT's layout when the vocabulary has its special
		// tokens (a BERT encoder relies on [CLS]), else the bare sequences.
		cls, okC := t.hf.TokenToID("[CLS]")
		sep, okS := t.hf.TokenToID("[SEP]")
		if okC && okS {
			bertStyle(cls, sep, 1, false)
			return nil
		}
		t.single = []item{{seq: 0}}
		t.pair = []item{{seq: 0}, {seq: 1, typeID: 1}}
		return nil
	}
	switch pp.Type {
	case "TemplateProcessing":
		var err error
		if t.single, err = template(pp, pp.Single, "single"); err != nil {
			return err
		}
		if t.pair, err = template(pp, pp.Pair, "pair"); err != nil {
			return err
		}
		return nil
	case "BertProcessing", "RobertaProcessing":
		cls, okC := tupleID(pp.Cls)
		sep, okS := tupleID(pp.Sep)
		if !okC || !okS {
			return fmt.Errorf("post_processor %s: cls and sep must be [token, id]", pp.Type)
		}
		if pp.Type == "BertProcessing" {
			bertStyle(cls, sep, 1, false)
		} else {
			bertStyle(cls, sep, 0, true) // RoBERTa: <s> A </s></s> B </s>, all type 0
		}
		return nil
	}
	return fmt.Errorf("post_processor type %q is not supported (TemplateProcessing, BertProcessing, RobertaProcessing)", pp.Type)
}

func template(pp *hftokenizer.PostProcessor, items []hftokenizer.PostProcItem, which string) ([]item, error) {
	var out []item
	seen := map[int]bool{}
	for _, it := range items {
		switch {
		case it.SpecialToken != nil:
			st, ok := pp.SpecialTokens[it.SpecialToken.ID]
			if !ok || len(st.IDs) == 0 {
				return nil, fmt.Errorf("post_processor %s template: special token %q has no ids", which, it.SpecialToken.ID)
			}
			ids := make([]int32, len(st.IDs))
			for i, id := range st.IDs {
				ids[i] = int32(id)
			}
			out = append(out, item{special: ids, typeID: int32(it.SpecialToken.TypeID)})
		case it.Sequence != nil:
			seq := 0
			switch it.Sequence.ID {
			case "A":
			case "B":
				seq = 1
			default:
				return nil, fmt.Errorf("post_processor %s template: sequence %q (want A or B)", which, it.Sequence.ID)
			}
			seen[seq] = true
			out = append(out, item{seq: seq, typeID: int32(it.Sequence.TypeID)})
		default:
			return nil, fmt.Errorf("post_processor %s template: an item is neither SpecialToken nor Sequence", which)
		}
	}
	want := 1
	if which == "pair" {
		want = 2
	}
	if len(seen) != want || (want == 2 && !seen[1]) || !seen[0] {
		return nil, fmt.Errorf("post_processor %s template must use sequence A%s exactly", which, map[bool]string{true: " and B", false: ""}[want == 2])
	}
	return out, nil
}

func tupleID(raw json.RawMessage) (int, bool) {
	var tuple []json.RawMessage
	if err := json.Unmarshal(raw, &tuple); err != nil || len(tuple) != 2 {
		return 0, false
	}
	var id int
	if err := json.Unmarshal(tuple[1], &id); err != nil {
		return 0, false
	}
	return id, true
}

func countSpecial(items []item) int {
	n := 0
	for _, it := range items {
		n += len(it.special)
	}
	return n
}

// chunkable says whether tokenising whitespace-separated pieces of a text
// gives the same ids as the whole: the normaliser works rune by rune, the
// pre-tokeniser splits at whitespace, and no added token spans whitespace.
func chunkable(tj *hftokenizer.TokenizerJSON) bool {
	if tj.Model.Type != "WordPiece" || tj.PreTokenizer == nil {
		return false
	}
	switch tj.PreTokenizer.Type {
	case "BertPreTokenizer", "Whitespace", "WhitespaceSplit":
	default:
		return false
	}
	var perRune func(n *hftokenizer.Normalizer) bool
	perRune = func(n *hftokenizer.Normalizer) bool {
		if n == nil {
			return true
		}
		switch n.Type {
		case "BertNormalizer", "Lowercase", "StripAccents", "NFD":
			return true
		case "Sequence":
			for i := range n.Normalizers {
				if !perRune(&n.Normalizers[i]) {
					return false
				}
			}
			return true
		}
		return false
	}
	if !perRune(tj.Normalizer) {
		return false
	}
	for _, at := range tj.AddedTokens {
		if strings.IndexFunc(at.Content, isBertSpace) >= 0 {
			return false
		}
	}
	return true
}

// isBertSpace is BERT's whitespace: the pre-tokeniser splits there.
func isBertSpace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || unicode.Is(unicode.Zs, r)
}

// VocabSize is the size of the embedding table the ids index: the largest id
// of the vocabulary and added tokens, plus one.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// PadID is the id to pad batches with.
func (t *Tokenizer) PadID() int32 { return t.padID }

// NumSpecialTokens is how many special tokens Encode adds to a single text
// (pair false) or a pair.
func (t *Tokenizer) NumSpecialTokens(pair bool) int {
	if pair {
		return t.nPair
	}
	return t.nSingle
}

// Encode tokenises text, and pair when it is not empty, and lays them out
// with the special tokens of the post-processor: [CLS] text [SEP] (pair
// [SEP]) for BERT, with token type ids 0 for the first segment and 1 for the
// second. When the result would exceed maxLen tokens (maxLen > 0), it is
// truncated longest-first if truncate is set, and an error wrapping
// ErrTooLong otherwise.
func (t *Tokenizer) Encode(text, pair string, maxLen int, truncate bool) (ids, typeIDs []int32, err error) {
	ids, typeIDs, _, err = t.EncodeTruncated(context.Background(), text, pair, maxLen, truncate)
	return ids, typeIDs, err
}

// EncodeTruncated is Encode that also reports whether tokens were cut, and
// stops with the context's error when the caller has gone.
func (t *Tokenizer) EncodeTruncated(ctx context.Context, text, pair string, maxLen int, truncate bool) (ids, typeIDs []int32, truncated bool, err error) {
	tmpl, nSpecial := t.single, t.nSingle
	a := t.encoder(text)
	var b *encoder
	if pair != "" {
		b = t.encoder(pair)
		tmpl, nSpecial = t.pair, t.nPair
	}
	// Each text needs at most its first maxLen tokens, truncated or refused,
	// so tokenising stops there and a long text costs no more than a short
	// one; except that when longest-first truncation halves an odd budget,
	// the extra token goes to the longer text, which only their lengths
	// tell.
	limit := -1
	if maxLen > 0 {
		limit = maxLen
	}
	doneA, err := a.upTo(ctx, limit)
	if err != nil {
		return nil, nil, false, err
	}
	doneB := true
	if b != nil {
		if doneB, err = b.upTo(ctx, limit); err != nil {
			return nil, nil, false, err
		}
		budget := maxLen - nSpecial
		if (!doneA || !doneB) && truncate && budget%2 == 1 && 2*min(len(a.out), len(b.out)) > budget {
			if doneA, doneB, err = longer(ctx, a, b); err != nil {
				return nil, nil, false, err
			}
		}
	}
	partial := !doneA || !doneB
	na, nb := len(a.out), 0
	if b != nil {
		nb = len(b.out)
	}
	if total := na + nb + nSpecial; maxLen > 0 && total > maxLen {
		if !truncate {
			more := ""
			if partial {
				more = "more than "
			}
			return nil, nil, false, fmt.Errorf("%w: %s%d tokens, the limit is %d", ErrTooLong, more, total, maxLen)
		}
		budget := maxLen - nSpecial
		if budget < 0 {
			return nil, nil, false, fmt.Errorf("%w: the limit of %d tokens cannot hold the %d special tokens", ErrTooLong, maxLen, nSpecial)
		}
		// A text not tokenised to its end has at least the tokens it
		// holds, which is all the split needs, except which text is the
		// longer when it halves an odd budget: longer told that.
		na, nb = truncateLongestFirst(na, nb, budget, b != nil)
		truncated = true
	}
	var segs [2][]int32
	segs[0] = a.out[:na]
	if b != nil {
		segs[1] = b.out[:nb]
	}
	n := na + nb + nSpecial
	ids = make([]int32, 0, n)
	typeIDs = make([]int32, 0, n)
	for _, it := range tmpl {
		seg := it.special
		if seg == nil {
			seg = segs[it.seq]
		}
		ids = append(ids, seg...)
		for range seg {
			typeIDs = append(typeIDs, it.typeID)
		}
	}
	return ids, typeIDs, truncated, nil
}

// longer tokenises two texts, one or both not to their ends, until the
// longer is known: the one with fewer tokens so far goes on, so the work is
// bounded by twice the shorter text. It says which ended; a text that did
// not end has more tokens than the other.
func longer(ctx context.Context, a, b *encoder) (doneA, doneB bool, err error) {
	for {
		e, other := a, b
		if len(b.out) < len(a.out) {
			e, other = b, a
		}
		done, err := e.upTo(ctx, len(other.out))
		if err != nil {
			return false, false, err
		}
		if done {
			// Whether other holds more than e's count decides it.
			if _, err := other.upTo(ctx, len(e.out)); err != nil {
				return false, false, err
			}
			return a.p.done(), b.p.done(), nil
		}
	}
}

// truncateLongestFirst gives the lengths the two sequences keep within
// budget, as Hugging Face tokenizers' LongestFirst strategy does: the longer
// one is cut first; when both must be cut they get half each, the extra
// token (odd budget) going to the one that was longer.
func truncateLongestFirst(na, nb, budget int, isPair bool) (int, int) {
	if !isPair {
		return min(na, budget), 0
	}
	if na+nb <= budget {
		return na, nb
	}
	n1, n2, swap := na, nb, false
	if n1 > n2 {
		n1, n2, swap = n2, n1, true
	}
	if n1 > budget {
		n2 = n1
	} else {
		n2 = max(n1, budget-n1)
	}
	if n1+n2 > budget {
		n1 = budget / 2
		n2 = n1 + budget%2
	}
	if swap {
		n1, n2 = n2, n1
	}
	return min(na, n1), min(nb, n2)
}

// encoder tokenises one text piece by piece, so that it can stop after
// enough tokens and resume.
type encoder struct {
	t   *Tokenizer
	p   *pieces
	out []int32
	n   int // pieces encoded
}

func (t *Tokenizer) encoder(text string) *encoder {
	return &encoder{t: t, p: t.cut.pieces(text)}
}

// exactBytes: a text's first 2 KiB are tokenised whatever the limit (a
// millisecond), so that refusing a short text says its exact length.
const exactBytes = 2048

// upTo encodes until more than limit tokens are out (limit < 0: no limit)
// and exactBytes of the text are read, or the text ends, saying whether it
// ended. It stops with the context's error when the caller has gone.
func (e *encoder) upTo(ctx context.Context, limit int) (done bool, err error) {
	for !e.p.done() {
		if limit >= 0 && len(e.out) > limit && e.p.pos >= exactBytes {
			return false, nil
		}
		if e.n%64 == 0 {
			if err := ctx.Err(); err != nil {
				return false, err
			}
		}
		e.n++
		s, word := e.p.piece()
		if word {
			if ids, ok := e.t.cut.longWord(e.t.lib, s); ok {
				e.out = append(e.out, ids...)
				continue
			}
			// No exact answer: the word in parts the library can take.
			for len(s) > 0 {
				n := min(len(s), e.t.cut.maxWord)
				for n < len(s) && n > 1 && !utf8.RuneStart(s[n]) {
					n--
				}
				e.out = appendIDs(e.out, e.t.lib(s[:n]))
				s = s[n:]
			}
			continue
		}
		e.out = appendIDs(e.out, e.t.lib(s))
	}
	return true, nil
}

func appendIDs(out []int32, ids []int) []int32 {
	for _, id := range ids {
		out = append(out, int32(id))
	}
	return out
}
