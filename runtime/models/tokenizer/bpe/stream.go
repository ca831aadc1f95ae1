package bpe

import "unicode/utf8"

// StreamDecoder turns ids into text one id at a time for streaming. A token
// may end inside a multi-byte character (byte-level BPE splits CJK and
// emoji across tokens): those bytes are held back until the character is
// complete, so no delta ever holds a broken UTF-8 sequence, and the deltas
// (with Flush's) concatenate to Decode of all the ids. Not safe for
// concurrent use; one per sequence.
type StreamDecoder struct {
	t           *Tokenizer
	skipSpecial bool
	pending     []byte
}

// NewStreamDecoder returns a decoder; skipSpecial drops special tokens as
// Decode does.
func (t *Tokenizer) NewStreamDecoder(skipSpecial bool) *StreamDecoder {
	return &StreamDecoder{t: t, skipSpecial: skipSpecial}
}

// Push adds one id and returns the text it completes ("" when its bytes
// only start a character).
func (d *StreamDecoder) Push(id int32) string {
	d.pending = d.t.appendToken(d.pending, id, d.skipSpecial)
	cut := len(d.pending) - incompleteTail(d.pending)
	if cut == 0 {
		return ""
	}
	out := lossyUTF8(d.pending[:cut])
	d.pending = append(d.pending[:0], d.pending[cut:]...)
	return out
}

// Flush returns what is held back, each invalid part as U+FFFD, as at the
// end of Decode; call it when the sequence ends.
func (d *StreamDecoder) Flush() string {
	out := lossyUTF8(d.pending)
	d.pending = d.pending[:0]
	return out
}

// incompleteTail returns the length of the suffix of b that is a proper
// prefix of a valid UTF-8 sequence, and could still be completed. The bytes
// before it decode the same whatever follows: an invalid subpart or a
// character cannot run into a lead byte.
func incompleteTail(b []byte) int {
	for k := 1; k < utf8.UTFMax && k <= len(b); k++ {
		p := len(b) - k
		if b[p] < 0xC0 { // ASCII or a continuation byte: look further back
			if b[p] < 0x80 {
				return 0
			}
			continue
		}
		if validPrefix(b[p:]) == k {
			return k
		}
		return 0
	}
	return 0
}
