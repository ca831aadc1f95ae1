package hashenc

import (
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The feature space and weights. Every constant here is part of the vector
// format that clients persist: changing one changes every vector, which needs
// a new model name.
const (
	// FeatureBits is the width of a feature index: n-grams hash into
	// 1<<FeatureBits buckets.
	FeatureBits = 20
	// WeightScale is the fixed-point unit of feature weights: a weight of
	// WeightScale means 1.0. Weights are integers so that the sums built
	// from them are exact (see package doc).
	WeightScale = 8
	// MaxTF caps the term frequency that enters the sublinear weight, so that
	// the weight table is finite and checked (TestTFWeightRounding).
	MaxTF = 1 << 20
)

// Feature kinds, hashed as the first byte so that a word, a bigram and a
// character n-gram with the same spelling are different features.
const (
	kindWord     = 'w' // word unigram
	kindBigram   = 'b' // two consecutive tokens, joined by a space
	kindCharGram = 'c' // 3- to 5-rune n-gram of a space-padded word
)

// Per-kind weights, multiplied with the tf weight. Content words carry most
// of the meaning; function words (stopwords) are kept but weighted low, since
// without corpus statistics (IDF) they would otherwise make any two English
// sentences look alike. Character n-grams match inflections and compounds
// ("sitting"/"sit", "rainforest"/"forest") and are many per word, so each is
// light.
const (
	weightContentWord = 8
	weightStopword    = 1
	weightBigram      = 4
	weightCharGram    = 1
)

// Features is the sparse weighted feature vector of one input: hashed
// feature indices in ascending order and their weights, in units of
// 1/WeightScale.
type Features struct {
	Index  []uint32
	Weight []int32
}

// Len is the number of distinct features.
func (f Features) Len() int { return len(f.Index) }

// token is a word of the normalised text, a symbol, or an invalid byte.
type token struct {
	text string
	// gram is false for tokens that get no character n-grams: stopwords,
	// symbols and invalid bytes.
	gram bool
	stop bool
}

// Featurize turns an item into its sparse features. It never fails: every
// byte sequence has features (possibly none, for empty or punctuation-only
// input, whose vector is all zeros).
//
// Text: each valid UTF-8 run is NFKC-normalised and lower-cased. Tokens are
// maximal runs of letters, digits and combining marks; every other symbol
// (category S: emoji, currency, maths) is a one-rune token; punctuation,
// spaces and control characters only separate tokens.
//
// Bytes: a byte that is not part of valid UTF-8 is a token by itself (so
// binary items keep all their information: their features are byte
// unigrams and bigrams next to the words of any text in them). Such a token
// can never equal a word, which is valid UTF-8.
//
// Features: word unigrams, bigrams of consecutive tokens, and character 3-,
// 4- and 5-grams of each content word padded with a space on both sides
// (" cat " gives " ca", "cat", "at ", " cat", "cat ", " cat "). Each feature
// is hashed with FNV-1a 64 over its kind byte and its UTF-8 bytes, mixed with
// the murmur3 finalizer, and the top FeatureBits bits are its index. Its
// weight is tfWeight(tf) times the kind's weight; features that land in the
// same index add up.
func Featurize(data []byte) Features {
	toks := tokenize(data)
	if len(toks) == 0 {
		return Features{}
	}
	// Occurrences as index<<16 | kind<<8 | kind weight, so that one sort
	// groups the occurrences of each feature (hashing-trick collisions within
	// a kind count as one feature, as usual); kind weights are below 256.
	occ := make([]uint64, 0, 8*len(toks))
	add := func(kind byte, w int, parts ...string) {
		occ = append(occ, uint64(featureIndex(kind, parts...))<<16|uint64(kind)<<8|uint64(w))
	}
	var offs []int
	for i, t := range toks {
		if t.stop {
			add(kindWord, weightStopword, t.text)
		} else {
			add(kindWord, weightContentWord, t.text)
		}
		if i > 0 {
			add(kindBigram, weightBigram, toks[i-1].text, " ", t.text)
		}
		if !t.gram {
			continue
		}
		padded := " " + t.text + " "
		offs = offs[:0]
		for j := range padded {
			offs = append(offs, j)
		}
		offs = append(offs, len(padded))
		runes := len(offs) - 1
		for n := 3; n <= 5; n++ {
			for j := 0; j+n <= runes; j++ {
				add(kindCharGram, weightCharGram, padded[offs[j]:offs[j+n]])
			}
		}
	}
	slices.Sort(occ)

	var f Features
	for i := 0; i < len(occ); {
		j := i
		for j < len(occ) && occ[j] == occ[i] {
			j++
		}
		idx := uint32(occ[i] >> 16)
		w := int32(tfWeight(j-i)) * int32(occ[i]&0xff)
		if n := len(f.Index); n > 0 && f.Index[n-1] == idx {
			f.Weight[n-1] += w // same bucket, another kind
		} else {
			f.Index = append(f.Index, idx)
			f.Weight = append(f.Weight, w)
		}
		i = j
	}
	return f
}

// tfWeight is the sublinear term-frequency weight 1 + ln(tf) in units of
// 1/WeightScale, rounded to the nearest integer, with tf capped at MaxTF.
// Rounding a float is safe across machines here because no tf up to MaxTF
// puts WeightScale·ln(tf) near a rounding boundary (TestTFWeightRounding
// checks a margin far above any libm's error), so every correct log gives
// the same integer.
func tfWeight(tf int) int {
	tf = min(tf, MaxTF)
	return int(math.Round(WeightScale * (1 + math.Log(float64(tf)))))
}

// tokenize normalises data and splits it into tokens (see Featurize).
func tokenize(data []byte) []token {
	var toks []token
	for len(data) > 0 {
		// The longest valid UTF-8 prefix.
		n := 0
		for n < len(data) {
			r, size := utf8.DecodeRune(data[n:])
			if r == utf8.RuneError && size <= 1 {
				break
			}
			n += size
		}
		if n > 0 {
			toks = appendTextTokens(toks, strings.ToLower(norm.NFKC.String(string(data[:n]))))
			data = data[n:]
			continue
		}
		toks = append(toks, token{text: string(data[:1])})
		data = data[1:]
	}
	return toks
}

func appendTextTokens(toks []token, s string) []token {
	start := -1
	flush := func(end int) {
		if start >= 0 {
			w := s[start:end]
			stop := isStopword(w)
			toks = append(toks, token{text: w, gram: !stop, stop: stop})
			start = -1
		}
	}
	for i, r := range s {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			if start < 0 {
				start = i
			}
		case unicode.IsSymbol(r):
			flush(i)
			toks = append(toks, token{text: string(r)})
		default:
			flush(i)
		}
	}
	flush(len(s))
	return toks
}

// featureIndex hashes a feature: FNV-1a 64 over the kind byte and the parts,
// then the murmur3 64-bit finalizer (FNV's low and high bits mix poorly on
// short keys), keeping the top FeatureBits bits.
func featureIndex(kind byte, parts ...string) uint32 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	h ^= uint64(kind)
	h *= prime64
	for _, p := range parts {
		for i := 0; i < len(p); i++ {
			h ^= uint64(p[i])
			h *= prime64
		}
	}
	return uint32(fmix64(h) >> (64 - FeatureBits))
}

// fmix64 is the murmur3 64-bit finalizer.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// isStopword reports whether w is a common English function word. A switch
// rather than a map keeps the list immutable.
func isStopword(w string) bool {
	switch w {
	case "a", "about", "after", "again", "all", "am", "an", "and", "any", "are",
		"as", "at", "be", "been", "before", "being", "both", "but", "by",
		"can", "could", "d", "did", "do", "does", "doing", "down", "during",
		"each", "few", "for", "from", "further", "had", "has", "have", "having",
		"he", "her", "here", "hers", "herself", "him", "himself", "his", "how",
		"i", "if", "in", "into", "is", "it", "its", "itself", "just", "ll",
		"m", "me", "more", "most", "my", "myself", "no", "nor", "not", "now",
		"of", "off", "on", "once", "only", "or", "other", "our", "ours",
		"ourselves", "out", "over", "own", "re", "s", "same", "she", "should",
		"so", "some", "such", "t", "than", "that", "the", "their", "theirs",
		"them", "themselves", "then", "there", "these", "they", "this", "those",
		"through", "to", "too", "under", "until", "up", "ve", "very", "was",
		"we", "were", "what", "when", "where", "which", "while", "who", "whom",
		"why", "will", "with", "would", "you", "your", "yours", "yourself",
		"yourselves":
		return true
	}
	return false
}
