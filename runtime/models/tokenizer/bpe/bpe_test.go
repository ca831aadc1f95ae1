package bpe

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// TestMatchesJavaScript compares Encode with the ids of the independent
// JavaScript implementation (@lenml/tokenizers) on the strings of
// gen_expected.mjs, and checks Decode(Encode(s)) == s.
func TestMatchesJavaScript(t *testing.T) {
	e := loadExpected(t)
	for _, tc := range []struct {
		name string
		f    *fixture
		nfc  bool
	}{
		{"llama3", llama3, false},
		{"qwen3", qwen3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := tc.f.get(t)
			want := e.Tokenizers[tc.name]
			if len(want) != len(e.Strings) || len(want) < 1000 {
				t.Fatalf("%d expected id lists for %d strings", len(want), len(e.Strings))
			}
			bad := 0
			for i, s := range e.Strings {
				got := tok.Encode(s, false)
				if !slices.Equal(got, want[i]) {
					if bad++; bad <= 5 {
						t.Errorf("string %d %q:\n got %v\nwant %v", i, s, got, want[i])
					}
				}
				wantText := s
				if tc.nfc {
					wantText = norm.NFC.String(s)
				}
				if d := tok.Decode(got, false); d != wantText {
					t.Errorf("string %d: Decode(Encode(%q)) = %q", i, s, d)
				}
				if d := tok.Decode(want[i], true); d != e.Decoded[tc.name][i] {
					t.Errorf("string %d: Decode(ids, skip specials) = %q, JavaScript %q", i, d, e.Decoded[tc.name][i])
				}
			}
			if bad > 0 {
				t.Fatalf("%d of %d strings differ", bad, len(e.Strings))
			}
			t.Logf("%d strings, all ids identical", len(e.Strings))
		})
	}
}

// TestSplitMatchesJavaScriptRegexp checks the hand-written matcher against
// JavaScript's regexp engine running the real patterns (lookahead included).
func TestSplitMatchesJavaScriptRegexp(t *testing.T) {
	e := loadExpected(t)
	for name, sp := range map[string]splitter{"llama3": {maxDigits: 3}, "qwen3": {maxDigits: 1}} {
		pieces := e.Pieces[name]
		if len(pieces) != len(e.Strings) {
			t.Fatalf("%s: %d piece lists for %d strings", name, len(pieces), len(e.Strings))
		}
		for i, s := range e.Strings {
			var got []string
			sp.split(s, func(p string) { got = append(got, p) })
			if !slices.Equal(got, pieces[i]) && !(len(got) == 0 && len(pieces[i]) == 0) {
				t.Errorf("%s %q:\n got %q\nwant %q", name, s, got, pieces[i])
			}
		}
	}
}

// TestSplit pins the matcher on the cases where the alternatives' order and
// backtracking decide, including where Oniguruma (the Rust library's engine,
// followed here) and JavaScript disagree.
func TestSplit(t *testing.T) {
	tests := []struct {
		in        string
		maxDigits int
		want      []string
	}{
		{"Hello world", 3, []string{"Hello", " world"}},
		{"a  b", 3, []string{"a", " ", " b"}},                   // \s+(?!\S) leaves the last space to " b"
		{"a   \n\n  b", 3, []string{"a", "   \n\n", " ", " b"}}, // \s*[\r\n]+ ends at the last newline
		{"end   ", 3, []string{"end", "   "}},                   // whole run at the end of text
		{"x\t\ty", 3, []string{"x", "\t", "\ty"}},
		{"12345", 3, []string{"123", "45"}},
		{"12345", 1, []string{"1", "2", "3", "4", "5"}},
		{"I'm", 3, []string{"I", "'m"}},
		{"I'LL", 3, []string{"I", "'LL"}},
		{"x'ſ", 3, []string{"x", "'ſ"}}, // (?i) folds ſ to s in Oniguruma
		{"'x", 3, []string{"'x"}},
		{" ...\n\nx", 3, []string{" ...\n\n", "x"}},
		{"a\u0085b", 3, []string{"a", "\u0085b"}}, // NEL is \s in Oniguruma
		{"a\ufeffb", 3, []string{"a", "\ufeffb"}},
		{"\xff\xfeab", 3, []string{"\xff\xfe", "ab"}}, // invalid bytes are symbols, kept
		{"", 3, nil},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			var got []string
			splitter{maxDigits: tc.maxDigits}.split(tc.in, func(p string) { got = append(got, p) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestEncodeWithSpecial checks the TemplateProcessing post-processor (Llama
// 3.2 adds <|begin_of_text|>) against the JavaScript ids.
func TestEncodeWithSpecial(t *testing.T) {
	e := loadExpected(t)
	var pp step
	if err := json.Unmarshal(e.Llama32PostProcessor, &pp); err != nil {
		t.Fatal(err)
	}
	tok := new(Tokenizer)
	*tok = *llama3.get(t)
	if err := tok.postProcessor(&pp); err != nil {
		t.Fatal(err)
	}
	want := e.Tokenizers["llama3_bos"]
	if len(want) == 0 {
		t.Fatal("no expected ids")
	}
	for i, w := range want {
		s := e.Strings[i]
		if got := tok.Encode(s, true); !slices.Equal(got, w) {
			t.Errorf("%q: got %v, want %v", s, got, w)
		}
		if got, plain := tok.Encode(s, false), llama3.get(t).Encode(s, false); !slices.Equal(got, plain) {
			t.Errorf("%q without specials: got %v, want %v", s, got, plain)
		}
	}
}

func TestSpecialTokens(t *testing.T) {
	type ids struct{ bos, eos, pad int32 }
	tests := []struct {
		f    *fixture
		want ids
		eos  []int32
	}{
		{llama3, ids{128000, 128001, -1}, []int32{128001}},
		{qwen3, ids{-1, 151645, 151643}, []int32{151645}},
	}
	for _, tc := range tests {
		t.Run(tc.f.name, func(t *testing.T) {
			tok := tc.f.get(t)
			bos, _ := tok.BOS()
			eos, _ := tok.EOS()
			pad, _ := tok.PAD()
			if got := (ids{bos, eos, pad}); got != tc.want {
				t.Errorf("bos, eos, pad = %v, want %v", got, tc.want)
			}
			if got := tok.EOSIDs(); !slices.Equal(got, tc.eos) {
				t.Errorf("EOSIDs = %v, want %v", got, tc.eos)
			}
			if !tok.IsSpecial(eos) || tok.IsSpecial(0) {
				t.Error("IsSpecial wrong")
			}
			if sp := tok.SpecialIDs(); !slices.Contains(sp, eos) || slices.Contains(sp, 0) {
				t.Errorf("SpecialIDs %v", sp)
			}
		})
	}
	// generation_config.json adds its eos_token_id (number or list).
	tok := new(Tokenizer)
	*tok = *llama3.get(t)
	tok.eos, tok.eosIDs = -1, nil
	err := tok.configure([]byte(`{"eos_token": "<|end_of_text|>"}`), []byte(`{"eos_token_id": [128001, 128008, 128009]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.EOSIDs(); !slices.Equal(got, []int32{128001, 128008, 128009}) {
		t.Errorf("EOSIDs with generation_config = %v", got)
	}
	if id, ok := tok.TokenID("<|eot_id|>"); !ok || id != 128009 {
		t.Errorf("TokenID(<|eot_id|>) = %d, %v", id, ok)
	}
}

func TestDecodeSkipSpecial(t *testing.T) {
	tok := qwen3.get(t)
	s := "<|im_start|>user\nhi 你好<|im_end|>"
	ids := tok.Encode(s, false)
	if got := tok.Decode(ids, false); got != s {
		t.Errorf("Decode = %q", got)
	}
	if got, want := tok.Decode(ids, true), "user\nhi 你好"; got != want {
		t.Errorf("Decode skipping specials = %q, want %q", got, want)
	}
}

func TestLossyUTF8(t *testing.T) {
	tests := []struct{ in, want string }{
		{"abc", "abc"},
		{"\xe2\x82a", "\ufffda"},               // truncated 3-byte sequence: one U+FFFD
		{"\xff\xff", "\ufffd\ufffd"},           // two bytes that start nothing
		{"\xf0\x90\x80", "\ufffd"},             // truncated 4-byte sequence at the end
		{"\xed\xa0\x80", "\ufffd\ufffd\ufffd"}, // surrogate: ED A0 is no valid prefix
		{"\xe0\x80\x80", "\ufffd\ufffd\ufffd"}, // overlong
		{"a\x80b", "a\ufffdb"},
		{"é\xc3", "é\ufffd"},
	}
	for _, tc := range tests {
		if got := lossyUTF8([]byte(tc.in)); got != tc.want {
			t.Errorf("lossyUTF8(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestStreamDecoder(t *testing.T) {
	for _, f := range []*fixture{llama3, qwen3} {
		tok := f.get(t)
		// the id of the token that is the single byte b
		byteID := func(b byte) int32 {
			id, ok := tok.TokenID(string(byteToRune[b]))
			if !ok {
				t.Fatalf("no token for byte %#x", b)
			}
			return id
		}
		tests := []struct {
			name string
			ids  []int32
		}{
			{"cjk", tok.Encode("汉字测试：龘龍𠀀𪚥 and 日本語のテキスト", false)},
			{"emoji", tok.Encode("family 👨‍👩‍👧‍👦 flag 🏴󠁧󠁢󠁳󠁣󠁴󠁿 skin 👍🏽🫠", false)},
			{"chat", tok.Encode("<|im_start|>assistant\n好的 🙂<|im_end|>", false)},
			// a 4-byte character one byte per token, then a broken one
			{"bytes", []int32{byteID(0xf0), byteID(0x9f), byteID(0x98), byteID(0x80), byteID('a'), byteID(0xe4), byteID(0xbd)}},
			{"invalid", []int32{byteID(0x80), byteID('x'), byteID(0xed), byteID(0xa0), byteID(0x80), byteID(0xc3)}},
		}
		for _, tc := range tests {
			t.Run(f.name+"/"+tc.name, func(t *testing.T) {
				for _, skip := range []bool{false, true} {
					d := tok.NewStreamDecoder(skip)
					var out strings.Builder
					held := 0
					for _, id := range tc.ids {
						delta := d.Push(id)
						if !utf8.ValidString(delta) {
							t.Fatalf("delta %q is not UTF-8", delta)
						}
						if delta == "" {
							held++
						}
						out.WriteString(delta)
					}
					out.WriteString(d.Flush())
					if want := tok.Decode(tc.ids, skip); out.String() != want {
						t.Errorf("skip %v: stream %q, Decode %q", skip, out.String(), want)
					}
					// three incomplete bytes of 😀, then the two of the broken 你
					if tc.name == "bytes" && held != 5 {
						t.Errorf("held back %d times, want 5", held)
					}
				}
			})
		}
	}
}

// TestLongInput keeps a word of 200k letters and a run of 100k spaces fast
// (the merge loop is n log n).
func TestLongInput(t *testing.T) {
	tok := qwen3.get(t)
	for _, s := range []string{strings.Repeat("ab", 100000), strings.Repeat(" ", 100000), strings.Repeat("9", 50000)} {
		ids := tok.Encode(s, false)
		if tok.Decode(ids, false) != s {
			t.Errorf("round trip of %d bytes failed", len(s))
		}
	}
}
