package tokenizer

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testVocab is a tiny BERT uncased vocabulary; ids are positions.
var testVocab = []string{
	"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", // 0-4
	"the", "quick", "brown", "fox", "jump", // 5-9
	"##s", "##ed", "over", "lazy", "dog", // 10-14
	"cafe", "hello", "world", ",", ".", // 15-19
	"!", "?", "un", "##believ", "##able", // 20-24
	"a", "b", "c", "##a", "##b", // 25-29
	"##c", "is", "it", "what", "naive", // 30-34
	"play", "##ing", "run", "##ning", "go", // 35-39
}

// tokenizerJSON writes a tokenizer.json like BERT's (bert-base-uncased
// layout) with the given post_processor and returns its path.
func tokenizerJSON(t *testing.T, postProcessor any, extra map[string]any) string {
	t.Helper()
	vocab := map[string]int{}
	for i, tok := range testVocab {
		vocab[tok] = i
	}
	var added []map[string]any
	for i := 0; i < 5; i++ {
		added = append(added, map[string]any{"id": i, "content": testVocab[i], "single_word": false,
			"lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	doc := map[string]any{
		"version":      "1.0",
		"truncation":   nil,
		"padding":      nil,
		"added_tokens": added,
		"normalizer": map[string]any{"type": "BertNormalizer", "clean_text": true,
			"handle_chinese_chars": true, "strip_accents": nil, "lowercase": true},
		"pre_tokenizer":  map[string]any{"type": "BertPreTokenizer"},
		"post_processor": postProcessor,
		"decoder":        map[string]any{"type": "WordPiece", "prefix": "##", "cleanup": true},
		"model": map[string]any{"type": "WordPiece", "unk_token": "[UNK]",
			"continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": vocab},
	}
	for k, v := range extra {
		doc[k] = v
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// bertTemplate is the TemplateProcessing post-processor of BERT checkpoints.
var bertTemplate = map[string]any{
	"type": "TemplateProcessing",
	"single": []any{
		map[string]any{"SpecialToken": map[string]any{"id": "[CLS]", "type_id": 0}},
		map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
		map[string]any{"SpecialToken": map[string]any{"id": "[SEP]", "type_id": 0}},
	},
	"pair": []any{
		map[string]any{"SpecialToken": map[string]any{"id": "[CLS]", "type_id": 0}},
		map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
		map[string]any{"SpecialToken": map[string]any{"id": "[SEP]", "type_id": 0}},
		map[string]any{"Sequence": map[string]any{"id": "B", "type_id": 1}},
		map[string]any{"SpecialToken": map[string]any{"id": "[SEP]", "type_id": 1}},
	},
	"special_tokens": map[string]any{
		"[CLS]": map[string]any{"id": "[CLS]", "ids": []int{2}, "tokens": []string{"[CLS]"}},
		"[SEP]": map[string]any{"id": "[SEP]", "ids": []int{3}, "tokens": []string{"[SEP]"}},
	},
}

func load(t *testing.T, pp any, extra map[string]any) *Tokenizer {
	t.Helper()
	tok, err := Load(tokenizerJSON(t, pp, extra))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return tok
}

func TestEncode(t *testing.T) {
	tok := load(t, bertTemplate, nil)
	tests := []struct {
		name      string
		text      string
		pair      string
		maxLen    int
		truncate  bool
		wantIDs   []int32
		wantTypes []int32
	}{
		{"punctuation and case", "Hello, World!", "", 0, false,
			[]int32{2, 16, 18, 17, 20, 3}, []int32{0, 0, 0, 0, 0, 0}},
		{"subwords", "The quick brown fox jumped", "", 0, false,
			[]int32{2, 5, 6, 7, 8, 9, 11, 3}, nil},
		{"several pieces", "Unbelievable jumps", "", 0, false,
			[]int32{2, 22, 23, 24, 9, 10, 3}, nil},
		{"accents stripped", "Café NAÏVE", "", 0, false,
			[]int32{2, 15, 34, 3}, nil},
		{"unknown words", "xyz the qwerty", "", 0, false,
			[]int32{2, 1, 5, 1, 3}, nil},
		{"a word with no complete split is unknown", "jumpx", "", 0, false,
			[]int32{2, 1, 3}, nil},
		{"whitespace and control characters", "  the\t\nfox\u0007  ", "", 0, false,
			[]int32{2, 5, 8, 3}, nil},
		{"empty text", "", "", 0, false, []int32{2, 3}, nil},
		{"pair", "What is it?", "A dog", 0, false,
			[]int32{2, 33, 31, 32, 21, 3, 25, 14, 3}, []int32{0, 0, 0, 0, 0, 0, 1, 1, 1}},
		{"fits exactly", "the quick", "", 4, false,
			[]int32{2, 5, 6, 3}, nil},
		{"truncated single", "the quick brown fox", "", 4, true,
			[]int32{2, 5, 6, 3}, nil},
		{"pair: only the longer is cut", "the quick brown fox jumped over the lazy dog", "hello world", 9, true,
			[]int32{2, 5, 6, 7, 8, 3, 16, 17, 3}, []int32{0, 0, 0, 0, 0, 0, 1, 1, 1}},
		{"pair: both cut, the longer keeps the odd token", "the quick brown fox jumped over the lazy dog", "a b c a b c a", 8, true,
			[]int32{2, 5, 6, 7, 3, 25, 26, 3}, []int32{0, 0, 0, 0, 0, 1, 1, 1}},
		{"pair: both cut, second longer", "a b c a b c a", "the quick brown fox jumped over the lazy dog", 8, true,
			[]int32{2, 25, 26, 3, 5, 6, 7, 3}, []int32{0, 0, 0, 0, 1, 1, 1, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ids, types, err := tok.Encode(tc.text, tc.pair, tc.maxLen, tc.truncate)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if !slices.Equal(ids, tc.wantIDs) {
				t.Errorf("ids = %v, want %v", ids, tc.wantIDs)
			}
			wantTypes := tc.wantTypes
			if wantTypes == nil {
				wantTypes = make([]int32, len(tc.wantIDs))
			}
			if !slices.Equal(types, wantTypes) {
				t.Errorf("type ids = %v, want %v", types, wantTypes)
			}
		})
	}
}

func TestEncodeTooLong(t *testing.T) {
	tok := load(t, bertTemplate, nil)
	tests := []struct {
		name, text, pair string
		maxLen           int
		truncate         bool
		want             string
	}{
		{"single", "the quick brown fox", "", 4, false, "6 tokens, the limit is 4"},
		{"pair", "the quick", "brown fox", 6, false, "7 tokens, the limit is 6"},
		{"limit below the special tokens", "the", "fox", 2, true, "cannot hold the 3 special tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tok.Encode(tc.text, tc.pair, tc.maxLen, tc.truncate)
			if !errors.Is(err, ErrTooLong) {
				t.Fatalf("err = %v, want ErrTooLong", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestPostProcessors(t *testing.T) {
	// Every way a BERT tokenizer.json can say [CLS] A [SEP] B [SEP] gives the
	// same ids and type ids.
	tests := []struct {
		name string
		pp   any
	}{
		{"TemplateProcessing", bertTemplate},
		{"BertProcessing", map[string]any{"type": "BertProcessing", "sep": []any{"[SEP]", 3}, "cls": []any{"[CLS]", 2}}},
		{"none: BERT layout from the vocabulary", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := load(t, tc.pp, nil)
			ids, types, err := tok.Encode("the fox", "a dog", 0, false)
			if err != nil {
				t.Fatal(err)
			}
			if want := []int32{2, 5, 8, 3, 25, 14, 3}; !slices.Equal(ids, want) {
				t.Errorf("ids = %v, want %v", ids, want)
			}
			if want := []int32{0, 0, 0, 0, 1, 1, 1}; !slices.Equal(types, want) {
				t.Errorf("types = %v, want %v", types, want)
			}
			if tok.NumSpecialTokens(false) != 2 || tok.NumSpecialTokens(true) != 3 {
				t.Errorf("NumSpecialTokens = %d, %d; want 2, 3", tok.NumSpecialTokens(false), tok.NumSpecialTokens(true))
			}
		})
	}
}

func TestVocabAndPad(t *testing.T) {
	tests := []struct {
		name    string
		extra   map[string]any
		wantPad int32
	}{
		{"[PAD] from the vocabulary", nil, 0},
		{"padding section", map[string]any{"padding": map[string]any{"pad_id": 4, "pad_token": "[MASK]"}}, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := load(t, bertTemplate, tc.extra)
			if tok.PadID() != tc.wantPad {
				t.Errorf("PadID() = %d, want %d", tok.PadID(), tc.wantPad)
			}
			if tok.VocabSize() != len(testVocab) {
				t.Errorf("VocabSize() = %d, want %d", tok.VocabSize(), len(testVocab))
			}
		})
	}
}

func TestLoadRejects(t *testing.T) {
	write := func(t *testing.T, content string) string {
		p := filepath.Join(t.TempDir(), "tokenizer.json")
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badTemplate := map[string]any{
		"type":           "TemplateProcessing",
		"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "[BOS]", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
		"pair":           []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "B", "type_id": 1}}},
		"special_tokens": map[string]any{},
	}
	tests := []struct {
		name string
		path func(t *testing.T) string
		want string
	}{
		{"bad JSON", func(t *testing.T) string { return write(t, `{"model":`) }, "bad JSON"},
		{"unknown model type", func(t *testing.T) string { return write(t, `{"model":{"type":"Magic","vocab":{"a":0}}}`) }, `model type "Magic"`},
		{"empty vocabulary", func(t *testing.T) string { return write(t, `{"model":{"type":"WordPiece","vocab":{}}}`) }, "empty vocabulary"},
		{"undefined special token", func(t *testing.T) string { return tokenizerJSON(t, badTemplate, nil) }, `special token "[BOS]"`},
		{"unknown post-processor", func(t *testing.T) string {
			return tokenizerJSON(t, map[string]any{"type": "ByteLevel"}, nil)
		}, `post_processor type "ByteLevel"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.path(t))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "tokenizer.json") {
				t.Errorf("err = %q, want it to name the file and contain %q", err, tc.want)
			}
		})
	}
}

// TestLongTextChunks checks that tokenising a long text in whitespace-split
// pieces gives exactly the ids of tokenising it whole.
func TestLongTextChunks(t *testing.T) {
	tok := load(t, bertTemplate, nil)
	if !tok.cut.exact {
		t.Fatal("a BERT tokenizer.json should be chunkable")
	}
	words := []string{"the", "Quick", "brówn", "fox,", "jumped!", "unbelievable", "xyz", "naïve", "[SEP]", "a\u0301", "中", "dog."}
	seps := []string{" ", "  ", "\t", "\n", "\u00a0", "\u3000"}
	rng := rand.New(rand.NewPCG(3, 4))
	var sb strings.Builder
	for sb.Len() < 5*2048 {
		sb.WriteString(words[rng.IntN(len(words))])
		sb.WriteString(seps[rng.IntN(len(seps))])
	}
	sb.WriteString(strings.Repeat("b", 2058)) // one word longer than maxShortWordBytes
	sb.WriteString(" fox")
	text := sb.String()
	var want []int32
	for _, id := range tok.hf.Encode(text) {
		want = append(want, int32(id))
	}
	got := tok.encode(text)
	if !slices.Equal(got, want) {
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Fatalf("chunked ids differ at %d of %d/%d: got %d, want %d", i, len(got), len(want), got[i], want[i])
			}
		}
		t.Fatalf("chunked gives %d ids, whole %d", len(got), len(want))
	}
}

func TestConcurrentEncode(t *testing.T) {
	tok := load(t, bertTemplate, nil)
	want, _, err := tok.Encode("Hello, World!", "a dog", 0, false)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 8)
	for range 8 {
		go func() {
			for range 100 {
				got, _, err := tok.Encode("Hello, World!", "a dog", 0, false)
				if err == nil && !slices.Equal(got, want) {
					err = errors.New("ids differ between goroutines")
				}
				if err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range 8 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// TestLongTextStopsAtTheLimit: a single text needs only its first maxLen
// tokens; tokenising stops after the chunk that passes them, and the
// result equals the whole text's tokens truncated (or refused, without
// truncation).
func TestLongTextStopsAtTheLimit(t *testing.T) {
	tok := load(t, bertTemplate, nil)
	words := []string{"the", "quick", "brown", "fox,", "jumped!", "unbelievable", "naïve", "中", "dog."}
	rng := rand.New(rand.NewPCG(5, 6))
	var sb strings.Builder
	for sb.Len() < 200*2048 { // ~400 KiB
		sb.WriteString(words[rng.IntN(len(words))])
		sb.WriteString(" ")
	}
	text := sb.String()
	const maxLen = 32
	ids, _, err := tok.Encode(text, "", maxLen, true)
	if err != nil {
		t.Fatal(err)
	}
	full := tok.encode(text)
	want := append(append([]int32{2}, full[:maxLen-2]...), 3) // [CLS] ... [SEP]
	if !slices.Equal(ids, want) {
		t.Fatalf("truncated ids %v, want %v", ids, want)
	}
	got, partial := tok.encodeUpTo(text, maxLen)
	if !partial || len(got) > maxLen+exactBytes {
		t.Errorf("stopped early %v after %d tokens of %d: the work is not bounded by the limit", partial, len(got), len(full))
	}
	if _, _, err := tok.Encode(text, "", maxLen, false); !errors.Is(err, ErrTooLong) || !strings.Contains(err.Error(), "more than") {
		t.Errorf("without truncation: %v", err)
	}
}
