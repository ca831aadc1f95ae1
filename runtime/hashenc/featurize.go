package hashenc

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"sync"
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
	// Records without a single token (only punctuation, spaces or control
	// characters) are featurised by those runes instead: an all-zero
	// vector would make cosine similarity NaN downstream.
	kindSeparator       = 's' // one such rune
	kindSeparatorBigram = 'p' // two consecutive such runes
	kindEmpty           = 'e' // the empty record's only feature
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

// Featurize turns an item into its sparse features. It never fails, and
// every byte sequence has at least one feature, so no vector is all zeros.
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
// Records with no token at all (only punctuation, spaces and control
// characters) get the runes they have as features instead: each rune, and
// each pair of consecutive runes, weighted like content words and bigrams;
// the empty record has one fixed feature. Their vectors are defined and
// non-zero, and equal only for the same multiset of runes and pairs.
//
// Features: word unigrams, bigrams of consecutive tokens, and character 3-,
// 4- and 5-grams of each content word padded with a space on both sides
// (" cat " gives " ca", "cat", "at ", " cat", "cat ", " cat "). Each feature
// is hashed with FNV-1a 64 over its kind byte and its UTF-8 bytes, mixed with
// the murmur3 finalizer, and the top FeatureBits bits are its index. Its
// weight is tfWeight(tf) times the kind's weight; features that land in the
// same index add up.
func Featurize(data []byte) Features {
	z := getFeaturizer()
	defer putFeaturizer(z)
	f := z.features(data)
	if f.Len() == 0 {
		return Features{}
	}
	return Features{Index: slices.Clone(f.Index), Weight: slices.Clone(f.Weight)}
}

// featurizer is the working memory of Featurize, reused through a pool so
// that an item costs no allocations.
type featurizer struct {
	h     [Dim]int64 // the sparse projection, for project
	text  []byte     // normalised, lower-cased text of the runs; invalid bytes
	norm  []byte     // NFKC of one non-ASCII run
	toks  []token    // slices of text
	pad   []byte     // " " + word + " "
	offs  []int      // rune offsets in pad
	occ   []uint32   // feature occurrences (see occurrence)
	tmp   []uint32   // sort buffer
	count []uint32   // sort buckets
	idx   []uint32   // result
	wt    []int32
	// radix is the LSD radix sort's counts, kept here rather than in
	// sort's frame: 3 KiB on every request handler's stack made it grow.
	radix [3][256]uint32
}

// token is a word of the normalised text, a symbol, or an invalid byte:
// text[start:end].
type token struct {
	start, end int
	// gram is false for tokens that get no character n-grams: stopwords,
	// symbols and invalid bytes.
	gram  bool
	stop  bool
	ascii bool
}

var featurizers = sync.Pool{New: func() any { return new(featurizer) }}

func getFeaturizer() *featurizer { return featurizers.Get().(*featurizer) }

// putFeaturizer returns z to the pool unless a large item grew it: the pool
// should not pin tens of MiB.
func putFeaturizer(z *featurizer) {
	if cap(z.occ) > 1<<16 || cap(z.text) > 1<<18 {
		return
	}
	featurizers.Put(z)
}

// Occurrence kinds with their weights, as the two low bits of an occurrence
// (index<<2 | kind), so that one sort groups the occurrences of each
// feature. Their order among themselves does not matter: a feature's weight
// is a sum over them.
const (
	occBigram  = iota // kindBigram, weightBigram
	occGram           // kindCharGram, weightCharGram
	occStop           // kindWord, weightStopword
	occContent        // kindWord, weightContentWord
)

var occWeight = [4]int32{weightBigram, weightCharGram, weightStopword, weightContentWord}

// occBits is the width of an occurrence.
const occBits = FeatureBits + 2

// occurrence is the sort key of one occurrence of the feature hashed to h.
func occurrence(h uint64, kind uint32) uint32 {
	return uint32(fmix64(h)>>(64-FeatureBits))<<2 | kind
}

// features computes data's features into z's buffers (valid until z is
// reused).
func (z *featurizer) features(data []byte) Features {
	z.tokenize(data)
	if len(z.toks) == 0 {
		return z.separatorFeatures(data)
	}
	text, toks := z.text, z.toks
	// The exact number of occurrences, so that a long item's buffer does
	// not grow by copying.
	n := 2*len(toks) - 1
	for _, t := range toks {
		if t.gram {
			runes := t.end - t.start
			if !t.ascii {
				runes = utf8.RuneCount(text[t.start:t.end])
			}
			n += max(3*runes-3, 1) // grams of runes+2 padded runes
		}
	}
	if cap(z.occ) < n {
		z.occ = make([]uint32, 0, n)
	}
	occ := z.occ[:0]
	for i, t := range toks {
		word := text[t.start:t.end]
		kind := uint32(occContent)
		if t.stop {
			kind = occStop
		}
		occ = append(occ, occurrence(fnvAdd(fnvKind(kindWord), word), kind))
		if i > 0 {
			p := toks[i-1]
			h := fnvAdd(fnvKind(kindBigram), text[p.start:p.end])
			h = fnvAdd(fnvByte(h, ' '), word)
			occ = append(occ, occurrence(h, occBigram))
		}
		if t.gram {
			occ = z.charGrams(occ, word, t.ascii)
		}
	}
	z.occ = occ
	return z.collect(occ)
}

// separatorFeatures are the features of a record without tokens: data is
// then valid UTF-8 (an invalid byte would be a token) of separators only.
func (z *featurizer) separatorFeatures(data []byte) Features {
	occ := z.occ[:0]
	if len(data) == 0 {
		occ = append(occ, occurrence(fnvKind(kindEmpty), occContent))
	}
	prev := -1
	for i := 0; i < len(data); {
		_, n := utf8.DecodeRune(data[i:])
		occ = append(occ, occurrence(fnvAdd(fnvKind(kindSeparator), data[i:i+n]), occContent))
		if prev >= 0 {
			occ = append(occ, occurrence(fnvAdd(fnvKind(kindSeparatorBigram), data[prev:i+n]), occBigram))
		}
		prev = i
		i += n
	}
	z.occ = occ
	return z.collect(occ)
}

// collect sorts feature occurrences and sums each index's weights.
func (z *featurizer) collect(occ []uint32) Features {
	occ = z.sort(occ)
	idx, wt := z.idx[:0], z.wt[:0]
	for i := 0; i < len(occ); {
		j := i + 1
		for j < len(occ) && occ[j] == occ[i] {
			j++
		}
		x := occ[i] >> 2
		w := tfWeightOf(j-i) * occWeight[occ[i]&3]
		if n := len(idx); n > 0 && idx[n-1] == x {
			wt[n-1] += w // same bucket, another kind
		} else {
			idx = append(idx, x)
			wt = append(wt, w)
		}
		i = j
	}
	z.idx, z.wt = idx, wt
	return Features{Index: idx, Weight: wt}
}

// charGrams appends the occurrences of the character 3-, 4- and 5-grams of
// " word ". Each start position's hash is extended rune by rune rather than
// rehashing each gram.
func (z *featurizer) charGrams(occ []uint32, word []byte, ascii bool) []uint32 {
	pad := append(append(append(z.pad[:0], ' '), word...), ' ')
	z.pad = pad
	base := fnvKind(kindCharGram)
	if ascii { // one byte per rune
		for j := 0; j+3 <= len(pad); j++ {
			h := fnvByte(fnvByte(fnvByte(base, pad[j]), pad[j+1]), pad[j+2])
			occ = append(occ, occurrence(h, occGram))
			if j+4 <= len(pad) {
				h = fnvByte(h, pad[j+3])
				occ = append(occ, occurrence(h, occGram))
				if j+5 <= len(pad) {
					h = fnvByte(h, pad[j+4])
					occ = append(occ, occurrence(h, occGram))
				}
			}
		}
		return occ
	}
	offs := z.offs[:0]
	for j := 0; j < len(pad); {
		offs = append(offs, j)
		_, size := utf8.DecodeRune(pad[j:])
		j += size
	}
	offs = append(offs, len(pad))
	z.offs = offs
	runes := len(offs) - 1
	for j := 0; j+3 <= runes; j++ {
		h := fnvAdd(base, pad[offs[j]:offs[j+3]])
		occ = append(occ, occurrence(h, occGram))
		for n := 4; n <= 5 && j+n <= runes; n++ {
			h = fnvAdd(h, pad[offs[j+n-1]:offs[j+n]])
			occ = append(occ, occurrence(h, occGram))
		}
	}
	return occ
}

// sort sorts occurrences (keys below 2^occBits). Up to a few thousand, it
// distributes them by their top bits into about as many buckets as keys and
// finishes with an insertion sort, which has little left to move; more take
// an LSD radix sort, 8 bits a pass.
func (z *featurizer) sort(occ []uint32) []uint32 {
	n := len(occ)
	if n <= 16 {
		slices.Sort(occ)
		return occ
	}
	if cap(z.tmp) < n {
		z.tmp = make([]uint32, n)
	}
	tmp := z.tmp[:n]
	if n <= 1<<12 {
		b := bits.Len(uint(n))
		shift := occBits - b
		if cap(z.count) < 1<<b {
			z.count = make([]uint32, 1<<12)
		}
		count := z.count[:1<<b]
		clear(count)
		for _, k := range occ {
			count[k>>shift]++
		}
		var sum uint32
		for i, c := range count {
			count[i] = sum
			sum += c
		}
		for _, k := range occ {
			tmp[count[k>>shift]] = k
			count[k>>shift]++
		}
		for i := 1; i < n; i++ {
			k := tmp[i]
			j := i
			for ; j > 0 && tmp[j-1] > k; j-- {
				tmp[j] = tmp[j-1]
			}
			tmp[j] = k
		}
		return tmp
	}
	count := &z.radix
	*count = [3][256]uint32{}
	for _, k := range occ {
		count[0][k&0xff]++
		count[1][k>>8&0xff]++
		count[2][k>>16&0xff]++
	}
	src, dst := occ, tmp
	for d := range 3 {
		c := &count[d]
		var sum uint32
		for b, n := range c {
			c[b] = sum
			sum += n
		}
		for _, k := range src {
			b := k >> (8 * d) & 0xff
			dst[c[b]] = k
			c[b]++
		}
		src, dst = dst, src
	}
	return src
}

// tfWeights caches tfWeight for small term frequencies.
var tfWeights = func() (t [256]int32) {
	for tf := 1; tf < len(t); tf++ {
		t[tf] = int32(tfWeight(tf))
	}
	return t
}()

func tfWeightOf(tf int) int32 {
	if tf < len(tfWeights) {
		return tfWeights[tf]
	}
	return int32(tfWeight(tf))
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
func (z *featurizer) tokenize(data []byte) {
	z.text, z.toks = z.text[:0], z.toks[:0]
	for len(data) > 0 {
		n, ascii := validPrefix(data)
		if n == 0 { // an invalid byte is a token
			z.text = append(z.text, data[0])
			z.toks = append(z.toks, token{start: len(z.text) - 1, end: len(z.text)})
			data = data[1:]
			continue
		}
		start := len(z.text)
		if ascii { // ASCII is in NFKC already
			z.text = appendLowerASCII(z.text, data[:n])
		} else {
			z.norm = norm.NFKC.Append(z.norm[:0], data[:n]...)
			z.text = appendLower(z.text, z.norm)
		}
		z.textTokens(start)
		data = data[n:]
	}
}

// validPrefix is the length of data's longest valid UTF-8 prefix and
// whether it is ASCII.
func validPrefix(data []byte) (n int, ascii bool) {
	for n+8 <= len(data) && binary.LittleEndian.Uint64(data[n:])&0x8080808080808080 == 0 {
		n += 8
	}
	ascii = true
	for n < len(data) {
		if data[n] < utf8.RuneSelf {
			n++
			continue
		}
		r, size := utf8.DecodeRune(data[n:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		ascii = false
		n += size
	}
	return n, ascii
}

func appendLowerASCII(dst, s []byte) []byte {
	for _, c := range s {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// appendLower appends strings.ToLower(s) for valid UTF-8 s: unicode.ToLower
// of each rune.
func appendLower(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		dst = utf8.AppendRune(dst, unicode.ToLower(r))
		i += size
	}
	return dst
}

// Rune classes of the tokenizer.
const (
	classSpace  = iota // separates tokens
	classWord          // letter, digit or mark: part of a word
	classSymbol        // a token by itself
)

func runeClass(r rune) uint8 {
	switch {
	case unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
		return classWord
	case unicode.IsSymbol(r):
		return classSymbol
	}
	return classSpace
}

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := range t {
		t[c] = runeClass(rune(c))
	}
	return t
}()

// textTokens appends the tokens of the normalised run text[start:].
func (z *featurizer) textTokens(start int) {
	s := z.text
	word, ascii := -1, true
	flush := func(end int) {
		if word >= 0 {
			w := s[word:end]
			stop := len(w) <= maxStopwordLen && isStopword(string(w))
			z.toks = append(z.toks, token{start: word, end: end, gram: !stop, stop: stop, ascii: ascii})
			word = -1
		}
	}
	for i := start; i < len(s); {
		c, size, class := s[i], 1, uint8(0)
		if c < utf8.RuneSelf {
			class = asciiClass[c]
		} else {
			var r rune
			r, size = utf8.DecodeRune(s[i:])
			class = runeClass(r)
		}
		switch class {
		case classWord:
			if word < 0 {
				word, ascii = i, true
			}
			ascii = ascii && size == 1
		case classSymbol:
			flush(i)
			z.toks = append(z.toks, token{start: i, end: i + size})
		default:
			flush(i)
		}
		i += size
	}
	flush(len(s))
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

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// fnvKind is the FNV-1a state after a feature's kind byte.
func fnvKind(kind byte) uint64 { return fnvByte(fnvOffset64, kind) }

func fnvByte(h uint64, b byte) uint64 { return (h ^ uint64(b)) * fnvPrime64 }

func fnvAdd(h uint64, p []byte) uint64 {
	for _, b := range p {
		h = (h ^ uint64(b)) * fnvPrime64
	}
	return h
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

// maxStopwordLen is the length of the longest stopword ("yourselves"):
// longer words skip isStopword.
const maxStopwordLen = 10

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
