package hashenc

import (
	"math/bits"
	"sync"
)

// Sparse projects features to the dense integer vector h = Σ w_f·R[f]
// (exact in int64), where R[f]'s entries are +1 or -1 for the clear and set
// bits of six splitmix64 outputs seeded from seed and the feature index.
func Sparse(f Features) (h [Dim]int64) {
	sparseInto(f, &h)
	return h
}

// sparseInto is Sparse writing into h, so the serving path keeps the 3 KiB
// result off the goroutine stack (stack growth showed up in profiles).
func sparseInto(f Features, h *[Dim]int64) {
	*h = [Dim]int64{}
	// h_k = Σ w_f - 2·Σ_{f: bit k set} w_f. The second sum is counted in
	// bit-sliced (vertical) counters, 64 dimensions per machine word, so a
	// feature costs a few word operations per 64 dimensions instead of
	// arithmetic per dimension: the features of a chunk are grouped by
	// weight (most share a handful of weights), each group's sign words are
	// counted with a carry-save adder tree, and the group's count planes
	// are added to a counter at the levels of the weight's set bits. The
	// counter is expanded into int64 before a count could reach 2^16.
	sc := sparseScratches.Get().(*sparseScratch)
	defer sparseScratches.Put(sc)
	c := &sc.c
	var total, pending int64 // pending: Σ w in c, a bound on its counts
	// h holds Σ_{f: bit k set} w_f until the end.
	for k := 0; k < len(f.Index); {
		// A chunk: up to chunkSize features sorted into groups by weight,
		// the groups' sizes in the bytes of sizes.
		var (
			gw    [maxGroups]int32
			ng    int
			sizes uint64
			full  bool
			seen  [32]uint64 // w<<8 | group
		)
		for m := 0; k < len(f.Index) && m < chunkSize; k++ {
			w := int64(f.Weight[k])
			st := rowState(f.Index[k])
			if w <= 0 || w > 0xffff { // never from Featurize; exact all the same
				total += w
				for i := range Dim / 64 {
					b := splitmix64At(st, uint64(i+1))
					for j := range 64 {
						h[i*64+j] += w * int64(b>>j&1)
					}
				}
				continue
			}
			if pending+w > 0xffff {
				full = true
				break
			}
			total += w
			pending += w
			// The group of w: a direct-mapped cache in front of the
			// search keeps the branches predictable.
			g := 0
			sl := uint32(w) * 0x9e3779b1 >> (32 - 5)
			if e := seen[sl]; e>>8 == uint64(w) {
				g = int(e & 0xff)
			} else {
				for g < ng && gw[g] != int32(w) {
					g++
				}
				if g < maxGroups {
					seen[sl] = uint64(w)<<8 | uint64(g)
				}
			}
			if g == ng {
				if ng == maxGroups { // rare: add it alone
					c.addRow(st, int32(w))
					continue
				}
				gw[g] = int32(w)
				ng++
			}
			sc.group[g][sizes>>(8*g)&0xff] = st
			sizes += 1 << (8 * g)
			m++
		}
		for g := range ng {
			c.addGroup(sc.group[g][:sizes>>(8*g)&0xff], gw[g])
		}
		if full {
			c.flush(h, 0, 1)
			pending = 0
		}
	}
	c.flush(h, total, -2)
}

const (
	// chunkSize is the most features grouped by weight at a time (a
	// group's size is a byte).
	chunkSize = 255
	// maxGroups is the number of distinct weights grouped in a chunk; the
	// features of other weights are added one by one.
	maxGroups = 8
	// gamma is splitmix64's increment.
	gamma = 0x9e3779b97f4a7c15
)

// sparseScratch is Sparse's working memory, pooled so that its buffers are
// not cleared on every call: only bitCounter.n needs to be zero between
// calls, and flush leaves it so.
type sparseScratch struct {
	c     bitCounter
	group [maxGroups][chunkSize]uint64 // splitmix64 states by weight
}

var sparseScratches = sync.Pool{New: func() any { return new(sparseScratch) }}

// rowState is the splitmix64 state whose next six outputs are R[idx].
func rowState(idx uint32) uint64 { return seed ^ uint64(idx)*gamma }

// splitmix64At is the k-th output (k ≥ 1) of a splitmix64 started at state,
// computed directly so that a row's six words are independent.
func splitmix64At(state, k uint64) uint64 {
	return mix64(state + k*gamma)
}

// mix64 is splitmix64's output function.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// plane is one bit of 384 counters: bit j of word i belongs to dimension
// 64·i+j.
type plane [Dim / 64]uint64

// counterLevels bounds the levels of a bitCounter: its counts stay below
// 2^16, so no level from 16 up ever holds a set bit.
const counterLevels = 16

// bitCounter is 384 counters below 2^16 in carry-save bit-sliced form: the
// count of dimension k is Σ_m 2^m·(bits k of the up to two planes at level
// m).
type bitCounter struct {
	p [counterLevels][2]plane
	n [counterLevels]uint8 // planes held at each level
}

// addRow adds one feature's row times w.
func (c *bitCounter) addRow(st uint64, w int32) {
	// The six words as scalars: copying arrays here costs store-forwarding
	// stalls.
	x0, x1, x2 := splitmix64At(st, 1), splitmix64At(st, 2), splitmix64At(st, 3)
	x3, x4, x5 := splitmix64At(st, 4), splitmix64At(st, 5), splitmix64At(st, 6)
	for ww := uint32(w); ww != 0; ww &= ww - 1 {
		c.add(bits.TrailingZeros32(ww), x0, x1, x2, x3, x4, x5)
	}
}

// addGroup adds the rows of features of weight w.
func (c *bitCounter) addGroup(states []uint64, w int32) {
	if len(states) < 4 { // the adder tree's fixed cost is not worth it
		for _, st := range states {
			c.addRow(st, w)
		}
		return
	}
	// A Harley-Seal carry-save adder tree per column counts eight rows at
	// a time into ones, twos and fours, passing a plane of eights up to the
	// counter. The last block's missing rows are masked to zero.
	var ones, twos, fours plane
	for b := 0; b < len(states); b += 8 {
		s, mask := (*[8]uint64)(nil), &allRows
		if b+8 <= len(states) {
			s = (*[8]uint64)(states[b:])
		} else {
			var pad, last [8]uint64
			for j, st := range states[b:] {
				pad[j], last[j] = st, ^uint64(0)
			}
			s, mask = &pad, &last
		}
		var eights plane
		for i := range eights {
			k := uint64(i+1) * gamma
			r0, r1 := mix64(s[0]+k)&mask[0], mix64(s[1]+k)&mask[1]
			r2, r3 := mix64(s[2]+k)&mask[2], mix64(s[3]+k)&mask[3]
			r4, r5 := mix64(s[4]+k)&mask[4], mix64(s[5]+k)&mask[5]
			r6, r7 := mix64(s[6]+k)&mask[6], mix64(s[7]+k)&mask[7]
			t0, o := fullAdd(ones[i], r0, r1)
			t1, o := fullAdd(o, r2, r3)
			f0, t := fullAdd(twos[i], t0, t1)
			t2, o := fullAdd(o, r4, r5)
			t3, o := fullAdd(o, r6, r7)
			f1, t := fullAdd(t, t2, t3)
			e, f := fullAdd(fours[i], f0, f1)
			ones[i], twos[i], fours[i], eights[i] = o, t, f, e
		}
		for ww := uint32(w); ww != 0; ww &= ww - 1 {
			c.addPlane(bits.TrailingZeros32(ww)+3, &eights)
		}
	}
	for ww := uint32(w); ww != 0; ww &= ww - 1 {
		m := bits.TrailingZeros32(ww)
		c.addPlane(m, &ones)
		c.addPlane(m+1, &twos)
		c.addPlane(m+2, &fours)
	}
}

var allRows = [8]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}

func (c *bitCounter) addPlane(m int, x *plane) {
	c.add(m, x[0], x[1], x[2], x[3], x[4], x[5])
}

// add adds x·2^m, x's six words as arguments (in registers).
func (c *bitCounter) add(m int, x0, x1, x2, x3, x4, x5 uint64) {
	for ; m < counterLevels; m++ {
		p := &c.p[m]
		switch c.n[m] {
		case 0, 1:
			q := &p[c.n[m]]
			q[0], q[1], q[2], q[3], q[4], q[5] = x0, x1, x2, x3, x4, x5
			c.n[m]++
			return
		}
		// Three planes at level m: a full adder leaves their sum bit at m
		// and carries to m+1.
		a, b := &p[0], &p[1]
		x0, a[0] = fullAdd(a[0], b[0], x0)
		x1, a[1] = fullAdd(a[1], b[1], x1)
		x2, a[2] = fullAdd(a[2], b[2], x2)
		x3, a[3] = fullAdd(a[3], b[3], x3)
		x4, a[4] = fullAdd(a[4], b[4], x4)
		x5, a[5] = fullAdd(a[5], b[5], x5)
		c.n[m] = 1
	}
	// A carry out of level 15 would be a count of 2^16 or more: it is zero.
}

// fullAdd adds three bits per position: carry and sum.
func fullAdd(a, b, x uint64) (carry, sum uint64) {
	u := a ^ b
	return a&b | u&x, u ^ x
}

// flush clears c, setting each set_k to a + b·(set_k + count_k): b = 1 and
// a = 0 to add the counts, b = -2 and a = Σw for Sparse's final h.
func (c *bitCounter) flush(set *[Dim]int64, a, b int64) {
	// Reduce to at most one plane per level.
	var levels [counterLevels]*plane
	nonzero := false
	for m := range counterLevels {
		switch c.n[m] {
		case 0:
			continue
		case 2:
			p, q := &c.p[m][0], &c.p[m][1]
			var carry plane
			for i := range p {
				p[i], carry[i] = p[i]^q[i], p[i]&q[i]
			}
			c.add(m+1, carry[0], carry[1], carry[2], carry[3], carry[4], carry[5])
		}
		levels[m] = &c.p[m][0]
		nonzero = true
		c.n[m] = 0
	}
	if !nonzero {
		for k := range set {
			set[k] = a + b*set[k]
		}
		return
	}
	for i := range Dim / 64 {
		// Row l of t is level l's word: four 16×16 bit matrices side by
		// side, one per 16-bit lane. Transposing them leaves in lane q of
		// row r the count of dimension 64i + 16q + r.
		var t [16]uint64
		for l, p := range levels {
			if p != nil {
				t[l] = p[i]
			}
		}
		transpose16(&t)
		out := (*[64]int64)(set[i*64:])
		for r := range t {
			v := t[r]
			out[r] = a + b*(out[r]+int64(v&0xffff))
			out[r+16] = a + b*(out[r+16]+int64(v>>16&0xffff))
			out[r+32] = a + b*(out[r+32]+int64(v>>32&0xffff))
			out[r+48] = a + b*(out[r+48]+int64(v>>48))
		}
	}
}

// transpose16 transposes the four 16×16 bit matrices held in the 16-bit
// lanes of t (row r of lane q is lane q of t[r], column c its bit c) by
// swapping off-diagonal blocks of 8, 4, 2 and 1.
func transpose16(t *[16]uint64) {
	transposeStage(t, 8, 0x00ff00ff00ff00ff)
	transposeStage(t, 4, 0x0f0f0f0f0f0f0f0f)
	transposeStage(t, 2, 0x3333333333333333)
	transposeStage(t, 1, 0x5555555555555555)
}

func transposeStage(t *[16]uint64, s uint, mask uint64) {
	for base := uint(0); base < 16; base += 2 * s {
		for r := base; r < base+s; r++ {
			x := (t[r]>>s ^ t[r+s]) & mask
			t[r+s] ^= x
			t[r] ^= x << s
		}
	}
}
