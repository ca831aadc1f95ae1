// Package hashenc is brokerd's built-in encoder nbmf-hash-v1, the default
// model: text or bytes in, 384 float32 dimensions out, with no weights to
// download.
//
// # Pipeline
//
//  1. Featurize (host): NFKC, lower case, word unigrams and bigrams and
//     character 3- to 5-grams hashed into 2^20 feature indices with integer
//     sublinear weights (see Featurize).
//  2. Sparse projection (host): h = Σ weight_f · R[f], where row R[f] of the
//     2^20×384 projection has entries ±1 generated from the feature index
//     and a fixed seed (splitmix64), so no table is stored: the model's host
//     memory is the 384×384 dense weights only (about 0.6 MiB as float32
//     plus 144 KiB as int8). Sums are exact: bit-sliced counters, 64
//     dimensions per machine word, expanded into int64 (see Sparse).
//     Featurising holds 8 bytes per n-gram occurrence while it runs (about
//     25 bytes per input byte: 25 MiB for a 1 MiB item); featurising and
//     projecting cost about 8 µs for a 100-byte sentence on a 2.4 GHz
//     EPYC core, 0.15 s for 1 MiB of text.
//  3. Quantisation (host, per item): h is divided by the smallest power of
//     two 2^s that brings Σ|h_k| to at most MaxL1 = 2^22 (integer
//     round-half-away-from-zero), giving integer rows h' that float32 holds
//     exactly. This per-item shift is what enforces the bounds below, so no
//     cap on features per item is needed: sentences and paragraphs (up to
//     about 64 KiB of text) keep s = 0 and lose nothing; longer items keep
//     about 13 bits of precision per dimension.
//  4. Dense projection (device): y = h'·W, an OpMatMul on the adapter, where
//     W is a 384×384 seeded randomised Hadamard matrix (entries ±1, WᵀW =
//     384·I, so it rotates without distorting cosines and spreads every
//     feature over all dimensions).
//  5. Output: with normalisation, the adapter's OpL2Normalize of y; without,
//     y·2^(s-8) (on the host: a power of two, so exact).
//
// # Exactness
//
// Every vector is the same bit for bit on every machine, alone or in any
// batch, because every floating-point value before the normalisation is an
// integer that float32 represents exactly: each output of the matmul is
// Σ_k ±h'_k, and every partial sum of it, in whatever order or blocking the
// adapter's SIMD code uses, is bounded by Σ|h'_k| ≤ 2^22 < 2^24. So the
// matmul's result does not depend on the order of its additions.
//
// Each normalised row's sum of squares is Σ y_j² = 384·Σ h'_k² ≤
// 384·2^44 < 2^53: each square and every partial sum is exact in float64.
// The adapter's OpL2Normalize must compute float32(y_j / sqrt(Σ y_j²)) with
// that sum in float64 and correctly rounded IEEE sqrt and division (no
// reciprocal approximation, no fast-math), row by row: then the result is
// the same on every machine and every adapter, whatever its summation order.
// A replica checks this on probe rows when it is created; on a device whose
// normalisation differs it normalises y on the host with the same recipe
// (Replica.NormalizesOnDevice reports which), so a vector never depends on
// the device that encoded it. A device whose matmul is not exact is refused
// (ErrInexactDevice): its vectors could not be made stable.
package hashenc

import (
	"errors"
	"math"
	"math/bits"
)

const (
	// Name is the model's name in the API.
	Name = "nbmf-hash-v1"
	// Dim is the number of dimensions of a vector.
	Dim = 384
	// MaxL1 bounds Σ|h'_k| of the integer rows sent to the device (see the
	// package doc for why 2^22).
	MaxL1 = 1 << 22
	// MaxBatch is the most rows a replica sends to the device in one run;
	// Execute splits larger batches, which does not change any vector.
	MaxBatch = 1024
	// outputShift scales unnormalised outputs by 2^-outputShift: the
	// weights' fixed point (2^3) and roughly W's gain (√384 ≈ 2^4.3).
	outputShift = 8
	// seed is the fixed seed of the projections. Part of the vector format.
	seed = 0x6e626d662d763100 // "nbmf-v1\x00"
)

// ErrBadInput marks an Execute input that is not an Input.
var ErrBadInput = errors.New("hashenc: bad input")

// Input is one item of an Execute batch.
type Input struct {
	Data      []byte // UTF-8 text or arbitrary bytes
	Normalize bool   // L2-normalise the vector

	// Set by Prepare: the quantised projection and its shift.
	row   *[Dim]int32
	shift int
}

// Prepare featurises and projects the item on the calling goroutine. A
// server calls it in its request handlers, which run in parallel, so the
// batch that reaches the device carries only the device's share of the work
// (the dense matmul). The vector is the same, bit for bit, either way.
func (in Input) Prepare() Input {
	in.row, in.shift = project(in.Data)
	return in
}

// project is Quantize(Sparse(Featurize(data))) without Featurize's
// allocations.
func project(data []byte) (q *[Dim]int32, shift int) {
	z := getFeaturizer()
	sparseInto(z.features(data), &z.h)
	q = new([Dim]int32)
	shift = quantizeInto(&z.h, q)
	putFeaturizer(z)
	return q, shift
}

// Model is nbmf-hash-v1's fixed weights, built once and shared read-only by
// every replica.
type Model struct {
	w  []float32 // W, row-major [Dim, Dim], as uploaded to devices
	w8 []int8    // the same, for the host's exact reference
}

// New builds the model's weights. It is deterministic and takes about a
// millisecond.
func New() *Model {
	m := &Model{
		w:  make([]float32, Dim*Dim),
		w8: make([]int8, Dim*Dim),
	}
	h := hadamard384()
	rng := splitmix64{state: seed ^ 0x57} // 'W': the dense projection's stream
	// W = D_r · P · H · D_c: random row signs, row permutation and column
	// signs keep WᵀW = 384·I and every entry ±1.
	perm := make([]int, Dim)
	for i := range perm {
		perm[i] = i
	}
	for i := Dim - 1; i > 0; i-- {
		j := int(rng.below(uint64(i + 1)))
		perm[i], perm[j] = perm[j], perm[i]
	}
	var rowSign, colSign [Dim]int8
	for i := range Dim {
		rowSign[i] = int8(1 - 2*int(rng.next()&1))
		colSign[i] = int8(1 - 2*int(rng.next()&1))
	}
	for i := range Dim {
		for j := range Dim {
			v := rowSign[i] * h[perm[i]*Dim+j] * colSign[j]
			m.w8[i*Dim+j] = v
			m.w[i*Dim+j] = float32(v)
		}
	}
	return m
}

// MemoryBytes is the device memory one replica needs: the resident weights
// and the workspace of a full MaxBatch run (input, matmul output and
// normalised output, float32).
func (m *Model) MemoryBytes() int64 {
	const f32 = 4
	return Dim*Dim*f32 + 3*MaxBatch*Dim*f32
}

// Quantize scales h to integers whose absolute values sum to at most MaxL1:
// q_k = round(h_k / 2^shift), with shift ≥ 0 the smallest that fits,
// rounding halves away from zero. The result fits float32 exactly.
func Quantize(h *[Dim]int64) (q [Dim]int32, shift int) {
	shift = quantizeInto(h, &q)
	return q, shift
}

// quantizeInto is Quantize writing into q.
func quantizeInto(h *[Dim]int64, q *[Dim]int32) (shift int) {
	for shift = 0; ; shift++ {
		var l1 int64
		for _, v := range h {
			l1 += roundShift(abs64(v), shift)
		}
		if l1 <= MaxL1 {
			break
		}
	}
	for k, v := range h {
		r := int32(roundShift(abs64(v), shift))
		if v < 0 {
			r = -r
		}
		q[k] = r
	}
	return shift
}

// roundShift is v / 2^s rounded half up, for v ≥ 0.
func roundShift(v int64, s int) int64 {
	if s == 0 {
		return v
	}
	return (v + 1<<(s-1)) >> s
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// Reference computes an item's vector on the host alone, with exact integer
// arithmetic for the matmul and the normalisation recipe the adapters must
// follow. Tests compare devices with it; it is not a serving path.
func (m *Model) Reference(data []byte, normalize bool) []float32 {
	h := Sparse(Featurize(data))
	q, shift := Quantize(&h)
	y := m.matmulExact(&q)
	if normalize {
		return l2NormalizeRow(y[:])
	}
	return scaleRow(y[:], shift)
}

// matmulExact is q·W in int64.
func (m *Model) matmulExact(q *[Dim]int32) (y [Dim]float32) {
	var acc [Dim]int64
	for k, v := range q {
		if v == 0 {
			continue
		}
		row := m.w8[k*Dim : (k+1)*Dim]
		for j, wv := range row {
			acc[j] += int64(v) * int64(wv)
		}
	}
	for j, v := range acc {
		y[j] = float32(v) // |v| ≤ MaxL1: exact
	}
	return y
}

// scaleRow returns y·2^(shift-outputShift); a power of two, so exact.
func scaleRow(y []float32, shift int) []float32 {
	out := make([]float32, len(y))
	for j, v := range y {
		out[j] = float32(math.Ldexp(float64(v), shift-outputShift))
	}
	return out
}

// l2NormalizeRow is the normalisation recipe of the package doc: the sum of
// squares in float64 (exact for rows within the bounds), a correctly
// rounded sqrt and one division per element. A zero row stays zero.
func l2NormalizeRow(y []float32) []float32 {
	var ss float64
	for _, v := range y {
		ss += float64(v) * float64(v)
	}
	out := make([]float32, len(y))
	if ss == 0 {
		return out
	}
	n := math.Sqrt(ss)
	for j, v := range y {
		out[j] = float32(float64(v) / n)
	}
	return out
}

// hadamard384 is the Hadamard matrix H12 ⊗ H32, row-major: H12 from Paley's
// construction over GF(11), H32 Sylvester's. Its rows are orthogonal and its
// entries ±1.
func hadamard384() []int8 {
	const q = 11
	var residue [q]bool
	for x := 1; x < q; x++ {
		residue[x*x%q] = true
	}
	chi := func(x int) int8 {
		x = ((x % q) + q) % q
		switch {
		case x == 0:
			return 0
		case residue[x]:
			return 1
		}
		return -1
	}
	// Paley I: H12 = I + S, S = [[0, 1ᵀ], [-1, Q]] with Q_ij = χ(j-i).
	var h12 [12][12]int8
	for i := range 12 {
		for j := range 12 {
			var s int8
			switch {
			case i == 0 && j == 0:
				s = 0
			case i == 0:
				s = 1
			case j == 0:
				s = -1
			default:
				s = chi(j - i)
			}
			if i == j {
				s++
			}
			h12[i][j] = s
		}
	}
	h := make([]int8, Dim*Dim)
	for i := range Dim {
		for j := range Dim {
			s32 := int8(1 - 2*(bits.OnesCount(uint(i%32&(j%32)))&1))
			h[i*Dim+j] = h12[i/32][j/32] * s32
		}
	}
	return h
}

// splitmix64 is the generator of the fixed projections (Steele et al.); it
// is written here so its sequence can never change under us.
type splitmix64 struct{ state uint64 }

func (r *splitmix64) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// below returns a uniform value in [0, n), by rejection.
func (r *splitmix64) below(n uint64) uint64 {
	limit := math.MaxUint64 - math.MaxUint64%n
	for {
		if v := r.next(); v < limit {
			return v % n
		}
	}
}
