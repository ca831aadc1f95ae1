package grammar

import (
	"bytes"
	"fmt"
	"math/bits"
	"slices"
	"sync/atomic"
)

// Vocab is a model's vocabulary as the grammar engine sees it: each token's
// bytes after the tokenizer's byte-level decoding, and the end-of-sequence
// token ids. Build one per model and share it; it is immutable.
type Vocab struct {
	id     uint64
	tokens [][]byte
	eos    []int32
	isEOS  []uint64 // bitset of eos ids
	usable []uint64 // bitset: non-empty, non-EOS tokens (those the grammar may allow)
	words  int      // len of a mask bitset

	// the trie of usable tokens in preorder (sorted byte order)
	nodes []trieNode
	ids   []int32  // token ids in trie (sorted) order; nodes point into it
	sum   []uint64 // per node: the byte classes (byteClass) in its subtree
	bytes int64    // approximate memory held (SizeBytes)
}

type trieNode struct {
	b        byte
	depth    uint16 // 1 for a child of the root
	end      int32  // index one past this node's subtree
	tokStart int32  // tokens before this node in trie order: ids[tokStart:tokStart+tokN] end exactly here
	tokN     int32
}

// byteClass partitions the bytes into 64 classes for the subtree summaries
// that let a mask precomputation skip a whole subtree whose bytes all loop
// back to the same parse state (the inside of a string, say).
var byteClass, classBytes = func() (c [256]uint8, members [64][]byte) {
	next := uint8(0)
	assign := func(bs ...byte) {
		for _, b := range bs {
			c[b] = next
			members[next] = append(members[next], b)
		}
		next++
	}
	rng := func(lo, hi int) []byte {
		var out []byte
		for b := lo; b <= hi; b++ {
			out = append(out, byte(b))
		}
		return out
	}
	assign(append(append(rng(0, 8), 11, 12), append(rng(14, 31), 127)...)...)
	assign('\t')
	assign('\n')
	assign('\r')
	assign(rng('0', '9')...)
	assign(rng('A', 'Z')...)
	assign(rng('a', 'z')...)
	for b := 32; b < 127; b++ {
		if !(b >= '0' && b <= '9' || b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z') {
			assign(byte(b))
		}
	}
	assign(rng(0x80, 0xBF)...)
	assign(rng(0xC0, 0xC1)...)
	assign(rng(0xC2, 0xDF)...)
	assign(rng(0xE0, 0xEF)...)
	assign(rng(0xF0, 0xF4)...)
	assign(rng(0xF5, 0xFF)...)
	return c, members
}()

var vocabSeq atomic.Uint64

// MaxTokenBytes is the longest token NewVocab accepts.
const MaxTokenBytes = 4096

// NewVocab builds a Vocab. tokens[i] is token i's bytes (after byte-level
// decoding, so "Ġthe" is " the"); control and special tokens that must
// never be produced under a grammar should be given as nil or empty. eos
// lists the end-of-sequence ids: they are excluded from grammar matching
// and allowed by Mask exactly when the grammar can end.
func NewVocab(tokens [][]byte, eos []int32) (*Vocab, error) {
	n := len(tokens)
	if n == 0 {
		return nil, fmt.Errorf("grammar: empty vocabulary")
	}
	v := &Vocab{id: vocabSeq.Add(1), tokens: tokens, words: (n + 63) / 64}
	v.isEOS = make([]uint64, v.words)
	v.usable = make([]uint64, v.words)
	for _, e := range eos {
		if e < 0 || int(e) >= n {
			return nil, fmt.Errorf("grammar: eos id %d outside the vocabulary of %d", e, n)
		}
		if v.isEOS[e>>6]&(1<<(e&63)) == 0 {
			v.eos = append(v.eos, e)
		}
		v.isEOS[e>>6] |= 1 << (e & 63)
	}
	order := make([]int32, 0, n)
	for i, t := range tokens {
		if len(t) > MaxTokenBytes {
			return nil, fmt.Errorf("grammar: token %d is %d bytes long (max %d)", i, len(t), MaxTokenBytes)
		}
		if len(t) == 0 || v.isEOS[i>>6]&(1<<(i&63)) != 0 {
			continue
		}
		v.usable[i>>6] |= 1 << (i & 63)
		order = append(order, int32(i))
	}
	slices.SortStableFunc(order, func(a, b int32) int { return bytes.Compare(tokens[a], tokens[b]) })
	v.ids = order

	var path []int32 // node indexes on the current path
	var prev []byte
	for k, id := range order {
		t := tokens[id]
		l := 0
		for l < len(t) && l < len(prev) && t[l] == prev[l] {
			l++
		}
		for len(path) > l {
			v.nodes[path[len(path)-1]].end = int32(len(v.nodes))
			path = path[:len(path)-1]
		}
		for d := l; d < len(t); d++ {
			path = append(path, int32(len(v.nodes)))
			v.nodes = append(v.nodes, trieNode{b: t[d], depth: uint16(d + 1), tokStart: int32(k)})
		}
		v.nodes[path[len(path)-1]].tokN++
		prev = t
	}
	for _, p := range path {
		v.nodes[p].end = int32(len(v.nodes))
	}
	// subtree summaries, children before parents
	v.sum = make([]uint64, len(v.nodes))
	for i := len(v.nodes) - 1; i >= 0; i-- {
		nd := &v.nodes[i]
		s := uint64(1) << byteClass[nd.b]
		for j := int32(i) + 1; j < nd.end; j = v.nodes[j].end {
			s |= v.sum[j]
		}
		v.sum[i] = s
	}
	v.bytes = int64(len(v.nodes))*24 + int64(len(v.ids))*4 + int64(v.words)*16
	return v, nil
}

// SizeBytes approximates the memory the vocabulary's trie holds.
func (v *Vocab) SizeBytes() int64 { return v.bytes }

// Size is the number of tokens (the length of the logits row).
func (v *Vocab) Size() int { return len(v.tokens) }

// MaskWords is the number of uint64 words a mask bitset needs.
func (v *Vocab) MaskWords() int { return v.words }

// EOS returns the end-of-sequence ids.
func (v *Vocab) EOS() []int32 { return slices.Clone(v.eos) }

// Token returns token id's bytes (nil outside the vocabulary).
func (v *Vocab) Token(id int32) []byte {
	if id < 0 || int(id) >= len(v.tokens) {
		return nil
	}
	return v.tokens[id]
}

// subtreeTokens are the tokens ending in node i's subtree.
func (v *Vocab) subtreeTokens(i int) []int32 {
	end := len(v.ids)
	if e := int(v.nodes[i].end); e < len(v.nodes) {
		end = int(v.nodes[e].tokStart)
	}
	return v.ids[v.nodes[i].tokStart:end]
}

func (v *Vocab) isEOSID(id int32) bool {
	return id >= 0 && int(id) < len(v.tokens) && v.isEOS[id>>6]&(1<<(id&63)) != 0
}

// MaskAllows reports whether bit id is set in a mask bitset.
func MaskAllows(mask []uint64, id int32) bool {
	return id >= 0 && int(id>>6) < len(mask) && mask[id>>6]&(1<<(id&63)) != 0
}

// MaskFirst is the lowest id a mask allows, or -1 when it allows none.
func MaskFirst(mask []uint64) int32 {
	for w, x := range mask {
		if x != 0 {
			return int32(w*64 + bits.TrailingZeros64(x))
		}
	}
	return -1
}

// MaskCount is the number of set bits in a mask.
func MaskCount(mask []uint64) int {
	c := 0
	for _, w := range mask {
		c += bits.OnesCount64(w)
	}
	return c
}
