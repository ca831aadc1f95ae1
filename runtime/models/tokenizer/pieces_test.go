package tokenizer

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// encode and encodeUpTo are EncodeTruncated's tokenising without the
// special tokens and the truncation.

// encode returns the ids of text without special tokens.
func (t *Tokenizer) encode(text string) []int32 {
	e := t.encoder(text)
	_, _ = e.upTo(context.Background(), -1)
	return e.out
}

// encodeUpTo tokenises text, stopping once more than limit tokens are out
// (limit 0: none) and saying whether it stopped early. Pieces end where the
// whole text's words do, so the tokens it returns are the whole text's
// first ones.
func (t *Tokenizer) encodeUpTo(text string, limit int) ([]int32, bool) {
	if limit == 0 {
		limit = -1
	}
	e := t.encoder(text)
	done, _ := e.upTo(context.Background(), limit)
	return e.out, !done
}

// wholeIDs is the library's answer for the whole text at once.
func wholeIDs(tok *Tokenizer, text string) []int32 {
	return appendIDs(nil, tok.hf.Encode(text))
}

func sameIDs(t *testing.T, what string, got, want []int32) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			t.Fatalf("%s: ids differ at %d of %d/%d: got %v, want %v", what, i, len(got), len(want), got[i:min(i+8, len(got))], want[i:min(i+8, len(want))])
		}
	}
	t.Fatalf("%s: %d ids in pieces, %d whole", what, len(got), len(want))
}

// TestPiecesGiveTheWholeTextsIDs: a text tokenised piece by piece gives the
// library's ids for the whole text, for BERT-like tokenizer.json files and
// texts mixing words, punctuation, CJK, added tokens without spaces around
// them, control runes, marks, and words longer than a piece, than
// max_input_chars_per_word and than maxWordBytes.
func TestPiecesGiveTheWholeTextsIDs(t *testing.T) {
	f := false
	files := []struct {
		name  string
		extra map[string]any
	}{
		{"bert-uncased", nil},
		{"bert-cased", map[string]any{"normalizer": map[string]any{"type": "BertNormalizer", "clean_text": true,
			"handle_chinese_chars": false, "strip_accents": f, "lowercase": false}}},
		{"whitespace-split", map[string]any{"pre_tokenizer": map[string]any{"type": "WhitespaceSplit"}}},
		{"nfd-lowercase", map[string]any{"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "NFD"}, map[string]any{"type": "Lowercase"}, map[string]any{"type": "StripAccents"}}}}},
	}
	frags := []string{
		"the", "Quick", "brówn", "fox", "jumped", "unbelievable", "naïve", "a\u0301", "中", "文字",
		",", ".", "!", "?", "-", "[", "]", "[[", "]]", "[SEP]", "[CLS]", "[SE", "P]", "[MASK]x", "\u1fef",
		"\u0301\u0301", "\x01", "\x7f", "\ufffd", "\xff", "🙂", "ǅ", "\u00ad", "\u200b",
		" ", " ", " ", "  ", "\t", "\n", "\u00a0", "\u3000",
		strings.Repeat("b", 150), strings.Repeat("c", 300), strings.Repeat("é", 200),
		strings.Repeat("x", 5000), strings.Repeat("[", 400), strings.Repeat(".,", 300),
		"a" + strings.Repeat("\u0301", 1500), strings.Repeat("\x01", 600) + "ab",
		strings.Repeat("中", 300), strings.Repeat("y", 120) + "\u1fef" + strings.Repeat("z", 300),
		strings.Repeat("[SEP]", 50), strings.Repeat("q", 300) + "[CLS]" + strings.Repeat("r", 300),
	}
	for _, file := range files {
		t.Run(file.name, func(t *testing.T) {
			tok := load(t, bertTemplate, file.extra)
			if !tok.cut.exact {
				t.Fatal("not chunkable")
			}
			rng := rand.New(rand.NewPCG(7, 8))
			for round := range 12 {
				var sb strings.Builder
				for sb.Len() < 6000 {
					sb.WriteString(frags[rng.IntN(len(frags))])
				}
				text := sb.String()
				sameIDs(t, file.name, tok.encode(text), wholeIDs(tok, text))
				_ = round
			}
			for _, text := range frags {
				sameIDs(t, file.name+" "+text[:min(len(text), 12)], tok.encode(text), wholeIDs(tok, text))
			}
		})
	}
}

// TestPiecesOtherModels: Unigram and BPE files are cut before spaces,
// which gives the whole text's ids with their pre-tokenisers; their long
// words are cut in parts, so only the work is checked there.
func TestPiecesOtherModels(t *testing.T) {
	unigram := map[string]any{
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": "▁", "add_prefix_space": true},
		"model": map[string]any{"type": "Unigram", "unk_id": 0, "vocab": []any{
			[]any{"<unk>", 0.0}, []any{"▁", -1.0}, []any{"▁the", -2.0}, []any{"a", -3.0}, []any{"b", -3.0},
			[]any{"ab", -2.5}, []any{"▁fox", -2.0}, []any{"x", -4.0}, []any{",", -4.0}}},
	}
	bpe := map[string]any{
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false},
		"model": map[string]any{"type": "BPE", "vocab": map[string]int{"Ġ": 0, "t": 1, "h": 2, "e": 3, "th": 4, "the": 5, "Ġthe": 6, "a": 7, "b": 8, "ab": 9, ",": 10},
			"merges": []string{"t h", "th e", "Ġ the", "a b"}},
	}
	for name, extra := range map[string]map[string]any{"unigram": unigram, "bpe": bpe} {
		t.Run(name, func(t *testing.T) {
			tok := load(t, nil, extra)
			if tok.cut.exact {
				t.Fatal("chunkable")
			}
			words := []string{"the", "ab", "fox", "a,b", "x", "abab", "   ", " "}
			rng := rand.New(rand.NewPCG(9, 10))
			var sb strings.Builder
			for sb.Len() < 4000 {
				sb.WriteString(words[rng.IntN(len(words))])
				sb.WriteString(" ")
			}
			text := sb.String()
			sameIDs(t, name, tok.encode(text), wholeIDs(tok, text))
		})
	}
}

// TestHostileTextsBoundedWork: whatever the text, the library is given
// pieces of at most maxShortWordBytes, and the sum of their squared lengths
// (its pre-tokeniser's work) stays within maxShortWordBytes times the
// text's length. A whole 64 KiB word was one quadratic call (10 s).
func TestHostileTextsBoundedWork(t *testing.T) {
	const n = 64 << 10
	texts := map[string]string{
		"one word":        strings.Repeat("a", n),
		"brackets":        strings.Repeat("[", n),
		"added tokens":    strings.Repeat("[SEP]", n/5),
		"half a token":    strings.Repeat("[SE", n/3),
		"cjk":             strings.Repeat("中", n/3),
		"marks":           "a" + strings.Repeat("\u0301", n/2),
		"controls":        strings.Repeat("\x01", n),
		"symbols":         strings.Repeat("\u1fef", n/3),
		"invalid utf-8":   strings.Repeat("\xff", n),
		"long words":      strings.Repeat(strings.Repeat("w", 255)+" ", n/256),
		"words and marks": strings.Repeat("a"+strings.Repeat("\u0301", 60)+"b", n/124),
	}
	unigram := map[string]any{
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": "▁", "add_prefix_space": true},
		"model":         map[string]any{"type": "Unigram", "unk_id": 0, "vocab": []any{[]any{"<unk>", 0.0}, []any{"a", -1.0}}},
	}
	for file, extra := range map[string]map[string]any{"bert": nil, "unigram": unigram} {
		tok := load(t, bertTemplate, extra)
		lib := tok.lib
		for name, text := range texts {
			var sum, largest int
			tok.lib = func(s string) []int {
				sum += len(s) * len(s)
				largest = max(largest, len(s))
				if len(s) > maxShortWordBytes {
					return nil // fails below, without the library's hours
				}
				return lib(s)
			}
			ids, _, err := tok.Encode(text, "", 512, true)
			if err != nil || len(ids) == 0 {
				t.Fatalf("%s %s: %d ids, %v", file, name, len(ids), err)
			}
			sum, largest = 0, 0
			_ = tok.encode(text)
			if largest > maxShortWordBytes || sum > maxShortWordBytes*len(text) {
				t.Errorf("%s %s: the library was given up to %d bytes at once, %d squared bytes in all for %d bytes", file, name, largest, sum, len(text))
			}
		}
	}
}

// TestEncodeStopsForAGoneCaller: tokenising stops with the context's error.
func TestEncodeStopsForAGoneCaller(t *testing.T) {
	tok := load(t, bertTemplate, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	text := strings.Repeat("the fox ", 1000)
	for _, pair := range []string{"", text} {
		if _, _, _, err := tok.EncodeTruncated(ctx, text, pair, 0, false); !errors.Is(err, context.Canceled) {
			t.Errorf("pair %d bytes: %v, want context.Canceled", len(pair), err)
		}
	}
}

// TestPairTruncationUnchanged: pairs tokenised only as far as truncation
// needs are cut exactly as the whole texts are, longest first (the odd
// token to the longer text, or to the second of two as long).
func TestPairTruncationUnchanged(t *testing.T) {
	tok := load(t, bertTemplate, nil)
	rng := rand.New(rand.NewPCG(11, 12))
	words := []string{"the", "fox", "unbelievable", "dog.", "中"}
	text := func(n int) string {
		var sb strings.Builder
		for range n {
			sb.WriteString(words[rng.IntN(len(words))])
			sb.WriteString(" ")
		}
		return sb.String()
	}
	for range 200 {
		a, b := text(rng.IntN(60)+1), text(rng.IntN(60)+1)
		if rng.IntN(4) == 0 {
			b = a // as long
		}
		maxLen := rng.IntN(40) + 3
		fa, fb := tok.encode(a), tok.encode(b)
		na, nb := len(fa), len(fb)
		if na+nb+3 > maxLen {
			na, nb = truncateLongestFirst(na, nb, maxLen-3, true)
		}
		want := slices.Concat([]int32{2}, fa[:na], []int32{3}, fb[:nb], []int32{3})
		got, _, err := tok.Encode(a, b, maxLen, true)
		if err != nil {
			t.Fatal(err)
		}
		sameIDs(t, "pair", got, want)
	}
}

// BenchmarkEncodeProse: 2 KiB of English prose, about BERT's 512 tokens.
func BenchmarkEncodeProse(b *testing.B) {
	tok, err := Load(tokenizerJSON(&testing.T{}, bertTemplate, nil))
	if err != nil {
		b.Fatal(err)
	}
	text := strings.Repeat("The quick brown fox, unbelievable as it is, jumped over a naïve dog. ", 40)[:2048]
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		_, _, _, _ = tok.EncodeTruncated(context.Background(), text, "", 0, false)
	}
}

// FuzzPieces: any text tokenised piece by piece gives the whole text's ids
// (BERT's uncased file; texts up to 2 KiB, so the library's quadratic whole
// call stays quick).
func FuzzPieces(f *testing.F) {
	tok, err := Load(tokenizerJSON(&testing.T{}, bertTemplate, nil))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"the fox[SEP]jumped", "a\u0301,[[CLS]]中文 x", strings.Repeat("ab", 200) + "." + strings.Repeat("\u1fef", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 2<<10 {
			return
		}
		sameIDs(t, "pieces", tok.encode(text), wholeIDs(tok, text))
	})
}
