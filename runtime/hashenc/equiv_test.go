package hashenc

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// The optimised Featurize and Sparse must give exactly what the reference
// implementations (reference_test.go) give: these tests compare them on
// random and adversarial inputs.

// pieces are fragments that stress the tokenizer, NFKC, lower-casing and the
// byte handling.
var pieces = []string{
	"the", "The", "THE", "cat", "Cat", "sat", "on", "a", "mat", "yourselves", "YOURSELVES",
	"memory", "brokerd", "x", "ab", "abc", "antidisestablishmentarianism", "42", "3.14", "v1",
	"out-of-memory", "don't", "e-mail", "$100", "a+b=c", "<tag>", "x^2", "`q`", "a|b", "~home",
	"\t", "\n", "\r\n", "\x00", "\x7f", "  ",
	// NFKC and case mapping.
	"café", "cafe\u0301", "Ｃａｆé", "ｃａｔ　ｓａｔ", "ﬁne ﬂower", "ß", "ẞ", "İstanbul", "ΣΊΣΥΦΟΣ",
	"ǅemal", "Ⅻ", "½", "x²", "\ufdfa", "ﷺ", "㍱", "한국어", "\u1100\u1161\u11a8", "a\u0301\u0302",
	"\u0301abc", "نَص", "नमस्ते", "ภาษาไทย", "東京", "Ωmega", "\u00a0", "\u2028", "\ufeff", "\u200d",
	"\ufffd", "🙂", "👍🏽", "€", "∑", "©", "℃", "ﬃ", "Ａ１", "ᏣᎳᎩ", "ꭰ", "Ǳ", "ŉ",
	// Invalid UTF-8: lone bytes, truncated sequences, surrogates, overlong
	// and out-of-range encodings.
	"\xff", "\xfe", "\x80", "\xc3", "\xe6\x9d", "\xf0\x9f\x99", "\xed\xa0\x80", "\xc0\xaf",
	"\xf4\x90\x80\x80", "\xc3(", "caf\xc3", "\xe2\x82",
}

var separators = []string{" ", " ", " ", "", ",", ", ", ". ", "-", "\n", "\xff", "!?", "\u3000"}

// propertyInputs returns n varied inputs: compositions of pieces, random
// ASCII, random valid Unicode, random bytes and high term frequencies.
func propertyInputs(n int, seed uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 17))
	in := [][]byte{nil, {}, []byte(" "), []byte("...!?")}
	for _, p := range pieces {
		in = append(in, []byte(p), []byte(p+" "+p))
	}
	for len(in) < n {
		var sb strings.Builder
		switch rng.IntN(6) {
		case 0, 1: // pieces and separators
			for range 1 + rng.IntN(40) {
				sb.WriteString(pieces[rng.IntN(len(pieces))])
				sb.WriteString(separators[rng.IntN(len(separators))])
			}
		case 2: // random ASCII, any byte below 0x80
			for range rng.IntN(300) {
				if rng.IntN(4) == 0 {
					sb.WriteByte(' ')
				} else {
					sb.WriteByte(byte(rng.IntN(128)))
				}
			}
		case 3: // random valid runes
			for range rng.IntN(100) {
				var r rune
				switch rng.IntN(3) {
				case 0:
					r = rune(rng.IntN(0x300))
				case 1:
					r = rune(rng.IntN(0x10000))
				default:
					r = rune(rng.IntN(utf8.MaxRune + 1))
				}
				if !utf8.ValidRune(r) {
					r = ' '
				}
				sb.WriteRune(r)
			}
		case 4: // random bytes
			for range rng.IntN(300) {
				sb.WriteByte(byte(rng.Uint32()))
			}
		default: // repeated words: high term frequencies
			words := []string{"the", "cat", "Mat", "ab", "东京", "x"}
			reps := 1 + rng.IntN(600)
			for range reps {
				sb.WriteString(words[rng.IntN(1+rng.IntN(len(words)))])
				sb.WriteString(separators[rng.IntN(3)])
			}
		}
		in = append(in, []byte(sb.String()))
	}
	return in
}

func TestFeaturizeMatchesReference(t *testing.T) {
	n := 5000
	if testing.Short() {
		n = 1000
	}
	for i, data := range propertyInputs(n, 1) {
		got, want := Featurize(data), featurizeReference(data)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("input %d %q: Featurize has %d features, the reference %d, or they differ", i, data, got.Len(), want.Len())
		}
	}
}

// TestFeaturizeMatchesReferenceLong covers long items: many occurrences (the
// radix sort's large path, pooled buffers that grow) and term frequencies
// beyond the cached tf weights.
func TestFeaturizeMatchesReferenceLong(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	var words []byte
	for len(words) < 300<<10 {
		for range 1 + rng.IntN(9) {
			words = append(words, byte('a'+rng.IntN(26)))
		}
		words = append(words, " .,\n"[rng.IntN(4)])
	}
	tests := []struct {
		name string
		data []byte
	}{
		{"random words", words},
		{"one word repeated", []byte(strings.Repeat("Cat ", 5000))},
		{"one long word", []byte(strings.Repeat("ab", 3000))},
		{"unicode", []byte(strings.Repeat("Ｃａｆé 東京 🙂 naïve\xff ", 2000))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, want := Featurize(tt.data), featurizeReference(tt.data)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Featurize has %d features, the reference %d, or they differ", got.Len(), want.Len())
			}
			h, hr := Sparse(got), sparseReference(want)
			if h != hr {
				t.Fatal("Sparse differs from the reference")
			}
			q, s := Quantize(&h)
			if pq, ps := project(tt.data); *pq != q || ps != s {
				t.Fatal("project differs from Quantize(Sparse(Featurize))")
			}
			t.Logf("%d bytes, %d features, shift %d", len(tt.data), got.Len(), s)
		})
	}
}

// randomFeatures has n features with weights from weight (indices may
// repeat: Sparse does not need them distinct).
func randomFeatures(rng *rand.Rand, n int, weight func() int32) Features {
	f := Features{Index: make([]uint32, n), Weight: make([]int32, n)}
	for i := range n {
		f.Index[i] = uint32(rng.IntN(1 << FeatureBits))
		f.Weight[i] = weight()
	}
	return f
}

func TestSparseMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	pick := func(ws ...int32) func() int32 { return func() int32 { return ws[rng.IntN(len(ws))] } }
	weights := []struct {
		name string
		w    func() int32
	}{
		{"one", pick(1)},
		{"eight", pick(8)},
		{"text-like", pick(8, 8, 14, 14, 14, 17, 32, 64, 112, 56, 1, 4)},
		{"many distinct", func() int32 { return 1 + rng.Int32N(200) }},
		{"heavy", func() int32 { return 1 + rng.Int32N(0xffff) }},
		{"at the lane limit", pick(0xffff, 0xfffe, 0x8000)},
		{"out of lane range", pick(0, -1, -8, 0x10000, math.MaxInt32, math.MinInt32, 8, 14)},
	}
	sizes := []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 5000}
	for _, wt := range weights {
		for _, n := range sizes {
			t.Run(fmt.Sprint(wt.name, "/", n), func(t *testing.T) {
				for range 3 {
					f := randomFeatures(rng, n, wt.w)
					got, want := Sparse(f), sparseReference(f)
					if got != want {
						t.Fatalf("Sparse differs from the reference")
					}
					if n <= 300 && got != sparseNaive(f) {
						t.Fatalf("Sparse differs from the definition")
					}
				}
			})
		}
	}
}

// TestPipelineMatchesReference compares the host's whole share, through
// both the public functions and project (Prepare's path), with the
// reference on random inputs.
func TestPipelineMatchesReference(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 300
	}
	for i, data := range propertyInputs(n, 2) {
		hr := sparseReference(featurizeReference(data))
		qr, sr := Quantize(&hr)
		h := Sparse(Featurize(data))
		if h != hr {
			t.Fatalf("input %d %q: Sparse(Featurize) differs from the reference", i, data)
		}
		if q, s := project(data); *q != qr || s != sr {
			t.Fatalf("input %d %q: project differs from the reference", i, data)
		}
	}
}

// TestFeaturizeConcurrent runs Featurize on many goroutines, so the race
// detector sees the pooled buffers shared between them.
func TestFeaturizeConcurrent(t *testing.T) {
	inputs := propertyInputs(200, 3)
	want := make([]Features, len(inputs))
	for i, data := range inputs {
		want[i] = featurizeReference(data)
	}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for k := range inputs {
				i := (k + g*25) % len(inputs)
				if got := Featurize(inputs[i]); !reflect.DeepEqual(got, want[i]) {
					errs <- fmt.Errorf("input %d differs", i)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func FuzzFeaturizeMatchesReference(f *testing.F) {
	for _, p := range pieces {
		f.Add([]byte(p + " " + p + "."))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, want := Featurize(data), featurizeReference(data)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Featurize(%q) differs from the reference", data)
		}
		if Sparse(got) != sparseReference(want) {
			t.Fatalf("Sparse differs from the reference for %q", data)
		}
	})
}
