package hashenc

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The implementations of Featurize and Sparse before they were optimised,
// unchanged but for their names: the property tests compare the current ones
// with them and the benchmarks report the speed-up.

// refToken is a word of the normalised text, a symbol, or an invalid byte.
type refToken struct {
	text string
	// gram is false for tokens that get no character n-grams: stopwords,
	// symbols and invalid bytes.
	gram bool
	stop bool
}

// featurizeReference is the original Featurize (see Featurize for what it
// computes).
func featurizeReference(data []byte) Features {
	toks := tokenizeReference(data)
	// Occurrences as index<<16 | kind<<8 | kind weight, so that one sort
	// groups the occurrences of each feature (hashing-trick collisions within
	// a kind count as one feature, as usual); kind weights are below 256.
	occ := make([]uint64, 0, 8*len(toks)+2*len(data)+1)
	add := func(kind byte, w int, parts ...string) {
		occ = append(occ, uint64(featureIndex(kind, parts...))<<16|uint64(kind)<<8|uint64(w))
	}
	if len(toks) == 0 {
		// No token: the record's runes (all separators) are its features.
		text := string(data)
		if text == "" {
			add(kindEmpty, weightContentWord)
		}
		prev := ""
		for _, r := range text {
			add(kindSeparator, weightContentWord, string(r))
			if prev != "" {
				add(kindSeparatorBigram, weightBigram, prev, string(r))
			}
			prev = string(r)
		}
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

// tokenizeReference normalises data and splits it into tokens (see Featurize).
func tokenizeReference(data []byte) []refToken {
	var toks []refToken
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
			toks = appendTextTokensReference(toks, strings.ToLower(norm.NFKC.String(string(data[:n]))))
			data = data[n:]
			continue
		}
		toks = append(toks, refToken{text: string(data[:1])})
		data = data[1:]
	}
	return toks
}

func appendTextTokensReference(toks []refToken, s string) []refToken {
	start := -1
	flush := func(end int) {
		if start >= 0 {
			w := s[start:end]
			stop := isStopword(w)
			toks = append(toks, refToken{text: w, gram: !stop, stop: stop})
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
			toks = append(toks, refToken{text: string(r)})
		default:
			flush(i)
		}
	}
	flush(len(s))
	return toks
}

// sparseReference is the original Sparse: 16-bit SWAR lanes per feature.
func sparseReference(f Features) [Dim]int64 {
	// h_k = Σ w_f - 2·Σ_{f: bit k set} w_f. The second sum is counted four
	// positions per uint64 in 16-bit lanes (a SWAR add of w times the
	// spread bits), flushed into int64 before a lane could overflow: about
	// four times faster than a loop over bits, with the same integers.
	const lanes = 0x0001000100010001
	var (
		acc     [Dim / 64][16]uint64
		set     [Dim]int64
		total   int64
		pending int64
	)
	flush := func() {
		for i := range acc {
			for j, v := range acc[i] {
				for l := range 4 {
					set[i*64+16*l+j] += int64(v >> (16 * l) & 0xffff)
				}
				acc[i][j] = 0
			}
		}
		pending = 0
	}
	for n, idx := range f.Index {
		w := int64(f.Weight[n])
		rng := splitmix64{state: seed ^ uint64(idx)*0x9e3779b97f4a7c15}
		total += w
		if w <= 0 || w > 0xffff { // never from Featurize; exact all the same
			for i := range Dim / 64 {
				b := rng.next()
				for j := range 64 {
					set[i*64+j] += w * int64(b>>j&1)
				}
			}
			continue
		}
		if pending+w > 0xffff {
			flush()
		}
		pending += w
		for i := range acc {
			b := rng.next()
			a := &acc[i]
			for j := range a {
				a[j] += (b >> j & lanes) * uint64(w)
			}
		}
	}
	flush()
	var h [Dim]int64
	for k := range h {
		h[k] = total - 2*set[k]
	}
	return h
}
