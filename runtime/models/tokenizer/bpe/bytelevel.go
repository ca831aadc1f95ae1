package bpe

import (
	"container/heap"
	"unicode/utf8"
)

// byteToRune is GPT-2's bytes_to_unicode: printable bytes stand for
// themselves, the others for U+0100 onwards, so every byte is a visible rune.
var byteToRune, runeToByte = func() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := make(map[rune]byte, 256)
	n := rune(0)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			b2r[b] = rune(b)
		} else {
			b2r[b] = 256 + n
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}()

// byteLevelEncode appends the byte-level form of s to dst.
func byteLevelEncode(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		dst = utf8.AppendRune(dst, byteToRune[s[i]])
	}
	return dst
}

// byteLevelDecode maps a token back to bytes; runes outside the byte
// alphabet (in added tokens) stand for their own UTF-8, as in tokenizers.
func byteLevelDecode(tok string) []byte {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		if b, ok := runeToByte[r]; ok {
			out = append(out, b)
		} else {
			out = utf8.AppendRune(out, r)
		}
	}
	return out
}

// symbol is one part of a word being merged, in a linked list.
type symbol struct {
	id         int32
	prev, next int
	size       int // bytes of the byte-level word covered; 0 once merged away
}

// pairItem is a candidate merge of the symbol at pos with its next one.
type pairItem struct {
	rank, id int32
	pos      int
}

type pairHeap []pairItem

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h pairHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(pairItem)) }
func (h *pairHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// bpe appends the ids of one byte-level word: starting from its runes, the
// adjacent pair of best (lowest) rank is merged until none is left, ties to
// the leftmost, as tokenizers' Word::merge_all does. A heap keeps long
// words (a run of 100k letters) at n log n.
func (t *Tokenizer) bpe(ids []int32, word []byte) []int32 {
	syms := make([]symbol, 0, len(word))
	for i := 0; i < len(word); {
		_, w := utf8.DecodeRune(word[i:])
		id, ok := t.vocab[string(word[i:i+w])]
		i += w
		if !ok {
			if t.unk < 0 {
				continue // tokenizers drops what it cannot name without unk
			}
			id = t.unk
		}
		syms = append(syms, symbol{id: id, prev: len(syms) - 1, next: len(syms) + 1, size: w})
	}
	if len(syms) == 0 {
		return ids
	}
	syms[len(syms)-1].next = -1
	h := pairHeap{}
	push := func(pos int) {
		next := syms[pos].next
		if next < 0 {
			return
		}
		if m, ok := t.merges[[2]int32{syms[pos].id, syms[next].id}]; ok {
			heap.Push(&h, pairItem{rank: m.rank, id: m.id, pos: pos})
		}
	}
	for i := range syms {
		push(i)
	}
	for h.Len() > 0 {
		top := heap.Pop(&h).(pairItem)
		s := &syms[top.pos]
		if s.size == 0 || s.next < 0 {
			continue
		}
		right := &syms[s.next]
		if m, ok := t.merges[[2]int32{s.id, right.id}]; !ok || m.id != top.id || m.rank != top.rank {
			continue // stale: one side changed since it was queued
		}
		s.id = top.id
		s.size += right.size
		right.size = 0
		s.next = right.next
		if s.next >= 0 {
			syms[s.next].prev = top.pos
		}
		if s.prev >= 0 {
			push(s.prev)
		}
		push(top.pos)
	}
	for i := 0; i >= 0; i = syms[i].next {
		ids = append(ids, syms[i].id)
	}
	return ids
}

// lossyUTF8 converts b to a string, each maximal invalid subpart replaced by
// one U+FFFD (the Unicode "substitution of maximal subparts" practice, which
// Rust's String::from_utf8_lossy follows).
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, w := utf8.DecodeRune(b)
		if r != utf8.RuneError || w > 1 {
			out = append(out, b[:w]...)
			b = b[w:]
			continue
		}
		out = append(out, "\uFFFD"...)
		b = b[max(1, validPrefix(b)):]
	}
	return string(out)
}

// validPrefix returns how many leading bytes of b are a proper prefix of a
// valid UTF-8 sequence (0 when b[0] cannot start one).
func validPrefix(b []byte) int {
	need, lo, hi := seqInfo(b[0])
	if need <= 1 {
		return 0
	}
	n := 1
	for n < need && n < len(b) {
		c := b[n]
		if n == 1 {
			if c < lo || c > hi {
				break
			}
		} else if c < 0x80 || c > 0xBF {
			break
		}
		n++
	}
	if n == need { // complete: not a prefix (cannot happen for invalid input)
		return 0
	}
	return n
}

// seqInfo gives the length of the sequence a lead byte starts and the range
// allowed for its second byte (which excludes overlongs and surrogates).
func seqInfo(c byte) (need int, lo, hi byte) {
	switch {
	case c < 0x80:
		return 1, 0, 0
	case c >= 0xC2 && c <= 0xDF:
		return 2, 0x80, 0xBF
	case c == 0xE0:
		return 3, 0xA0, 0xBF
	case c == 0xED:
		return 3, 0x80, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		return 3, 0x80, 0xBF
	case c == 0xF0:
		return 4, 0x90, 0xBF
	case c >= 0xF1 && c <= 0xF3:
		return 4, 0x80, 0xBF
	case c == 0xF4:
		return 4, 0x80, 0x8F
	}
	return 0, 0, 0
}
