package hashenc

import "math/bits"

// Sparse projects features to the dense integer vector h = Σ w_f·R[f]
// (exact in int64), where R[f]'s entries are +1 or -1 for the clear and set
// bits of six splitmix64 outputs seeded from seed and the feature index.
func Sparse(f Features) [Dim]int64 {
	// h_k = Σ w_f - 2·Σ_{f: bit k set} w_f. The second sum is counted in
	// bit-sliced (vertical) counters, 64 dimensions per machine word, so a
	// feature costs a few word operations per 64 dimensions instead of
	// arithmetic per dimension: the features of a chunk are grouped by
	// weight (most share a handful of weights), each group's sign words are
	// counted with a carry-save adder tree, and the group's count planes
	// are added to a counter at the levels of the weight's set bits. The
	// counter is expanded into int64 before a count could reach 2^16.
	var (
		c       bitCounter
		set     [Dim]int64
		total   int64
		pending int64 // Σ w in c: a bound on its counts
		states  [chunkSize]uint64
		weights [chunkSize]int32
	)
	for k := 0; k < len(f.Index); {
		m := 0
		full := false
		for ; k < len(f.Index) && m < chunkSize; k++ {
			w := int64(f.Weight[k])
			st := rowState(f.Index[k])
			if w <= 0 || w > 0xffff { // never from Featurize; exact all the same
				total += w
				for i := range Dim / 64 {
					b := splitmix64At(st, uint64(i+1))
					for j := range 64 {
						set[i*64+j] += w * int64(b>>j&1)
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
			states[m], weights[m] = st, int32(w)
			m++
		}
		c.addChunk(states[:m], weights[:m])
		if full {
			c.flush(&set)
			pending = 0
		}
	}
	c.flush(&set)
	var h [Dim]int64
	for k := range h {
		h[k] = total - 2*set[k]
	}
	return h
}

const (
	// chunkSize is the number of features grouped by weight at a time.
	chunkSize = 128
	// maxGroups is the number of distinct weights grouped in a chunk; the
	// features of other weights are added one by one.
	maxGroups = 8
	// gamma is splitmix64's increment.
	gamma = 0x9e3779b97f4a7c15
)

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

// addChunk adds the rows of the features with the given splitmix64 states
// and weights. The caller keeps every count below 2^16.
func (c *bitCounter) addChunk(states []uint64, weights []int32) {
	var (
		gw    [maxGroups]int32 // the groups' weights
		start [maxGroups + 1]int
		group [chunkSize]uint8
		ng    int
	)
	const none = maxGroups
	for j, w := range weights {
		g := 0
		for g < ng && gw[g] != w {
			g++
		}
		if g == ng {
			if ng == maxGroups {
				group[j] = none
				c.addRow(states[j], w)
				continue
			}
			gw[g] = w
			ng++
		}
		group[j] = uint8(g)
		start[g+1]++
	}
	for g := range ng {
		start[g+1] += start[g]
	}
	var sorted [chunkSize]uint64
	pos := start
	for j, g := range group[:len(states)] {
		if g != none {
			sorted[pos[g]] = states[j]
			pos[g]++
		}
	}
	for g := range ng {
		c.addGroup(sorted[start[g]:start[g+1]], gw[g])
	}
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
	// a time into ones, twos and fours, passing a plane of eights up. The
	// last block's missing rows are masked to zero.
	blocks := (len(states) + 7) / 8
	var last [8]uint64
	var padded [8]uint64
	for j := range 8 {
		if r := (blocks-1)*8 + j; r < len(states) {
			last[j] = ^uint64(0)
			padded[j] = states[r]
		}
	}
	var ones, twos, fours plane
	var eights [chunkSize / 8]plane
	for i := range Dim / 64 {
		k := uint64(i+1) * gamma
		var o, t, f uint64
		for b := range blocks {
			var r0, r1, r2, r3, r4, r5, r6, r7 uint64
			if b < blocks-1 {
				s := (*[8]uint64)(states[8*b:])
				r0, r1, r2, r3 = mix64(s[0]+k), mix64(s[1]+k), mix64(s[2]+k), mix64(s[3]+k)
				r4, r5, r6, r7 = mix64(s[4]+k), mix64(s[5]+k), mix64(s[6]+k), mix64(s[7]+k)
			} else {
				s := &padded
				r0, r1, r2, r3 = mix64(s[0]+k)&last[0], mix64(s[1]+k)&last[1], mix64(s[2]+k)&last[2], mix64(s[3]+k)&last[3]
				r4, r5, r6, r7 = mix64(s[4]+k)&last[4], mix64(s[5]+k)&last[5], mix64(s[6]+k)&last[6], mix64(s[7]+k)&last[7]
			}
			t0, o1 := fullAdd(o, r0, r1)
			t1, o2 := fullAdd(o1, r2, r3)
			f0, t2 := fullAdd(t, t0, t1)
			t3, o3 := fullAdd(o2, r4, r5)
			t4, o4 := fullAdd(o3, r6, r7)
			f1, t5 := fullAdd(t2, t3, t4)
			e, f2 := fullAdd(f, f0, f1)
			o, t, f = o4, t5, f2
			eights[b][i] = e
		}
		ones[i], twos[i], fours[i] = o, t, f
	}
	for ww := uint32(w); ww != 0; ww &= ww - 1 {
		m := bits.TrailingZeros32(ww)
		c.addPlane(m, &ones)
		c.addPlane(m+1, &twos)
		c.addPlane(m+2, &fours)
		for b := range blocks {
			c.addPlane(m+3, &eights[b])
		}
	}
}

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

// flush adds the counts to set and clears c.
func (c *bitCounter) flush(set *[Dim]int64) {
	// Reduce to one plane per level, then expand the planes into byte lanes
	// (eight dimensions per uint64, eight apart): levels 0-7 into one lane
	// word, 8-15 into another.
	var (
		lo, hi   [counterLevels]*plane
		loM, hiM [counterLevels]uint
		nlo, nhi int
	)
	for m := range counterLevels {
		switch c.n[m] {
		case 0:
			continue
		case 2:
			a, b := &c.p[m][0], &c.p[m][1]
			var carry plane
			for i := range a {
				a[i], carry[i] = a[i]^b[i], a[i]&b[i]
			}
			c.add(m+1, carry[0], carry[1], carry[2], carry[3], carry[4], carry[5])
		}
		if m < 8 {
			lo[nlo], loM[nlo] = &c.p[m][0], uint(m)
			nlo++
		} else {
			hi[nhi], hiM[nhi] = &c.p[m][0], uint(m-8)
			nhi++
		}
		c.n[m] = 0
	}
	if nlo+nhi == 0 {
		return
	}
	const lanes = 0x0101010101010101
	for i := range Dim / 64 {
		var lw, hw [counterLevels]uint64
		for l, p := range lo[:nlo] {
			lw[l] = p[i]
		}
		for l, p := range hi[:nhi] {
			hw[l] = p[i]
		}
		out := (*[64]int64)(set[i*64:])
		for j := range 8 {
			var vl, vh uint64
			for l, w := range lw[:nlo] {
				vl |= (w >> j & lanes) << loM[l]
			}
			for l, w := range hw[:nhi] {
				vh |= (w >> j & lanes) << hiM[l]
			}
			for q := range 8 {
				out[8*q+j] += int64(vl>>(8*q)&0xff | vh>>(8*q)&0xff<<8)
			}
		}
	}
}
