package hashenc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime"
)

func newTestReplica(t testing.TB, m *Model, dev runtime.Device) *Replica {
	t.Helper()
	r, err := m.NewReplica(context.Background(), dev)
	if err != nil {
		t.Fatalf("NewReplica: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func encodeAll(t testing.TB, r *Replica, texts []string, normalize bool) [][]float32 {
	t.Helper()
	in := make([]any, len(texts))
	for i, s := range texts {
		in[i] = Input{Data: []byte(s), Normalize: normalize}
	}
	return execute(t, r, in)
}

func execute(t testing.TB, r *Replica, in []any) [][]float32 {
	t.Helper()
	out, err := r.Execute(context.Background(), in)
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if len(out) != len(in) {
		t.Fatalf("Execute returned %d outputs for %d inputs", len(out), len(in))
	}
	vecs := make([][]float32, len(out))
	for i, o := range out {
		v, ok := o.([]float32)
		if !ok || len(v) != Dim {
			t.Fatalf("output %d is %T of length %d, want []float32 of %d", i, o, len(v), Dim)
		}
		vecs[i] = v
	}
	return vecs
}

// bitsEqual compares two vectors bit for bit, returning the first
// difference.
func bitsEqual(a, b []float32) (int, bool) {
	if len(a) != len(b) {
		return -1, false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i, false
		}
	}
	return 0, true
}

// mixedItems is a batch of varied items: texts of many lengths, unicode,
// binary, empty, and both settings of Normalize.
func mixedItems(n int, seed uint64) []Input {
	rng := rand.New(rand.NewPCG(seed, 1))
	words := strings.Fields("the cat sat on a mat while brokerd batches vectors über naïve café 東京 emoji 🙂 memory record council advisor")
	items := make([]Input, n)
	for i := range items {
		var data []byte
		switch i % 5 {
		case 0: // binary, not valid UTF-8
			data = make([]byte, 1+rng.IntN(200))
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
		case 1:
			data = nil
		default:
			var sb strings.Builder
			for range 1 + rng.IntN(60*(i%5)) {
				sb.WriteString(words[rng.IntN(len(words))])
				sb.WriteByte(" .,!"[rng.IntN(4)])
			}
			data = []byte(sb.String())
		}
		items[i] = Input{Data: data, Normalize: rng.IntN(2) == 0}
	}
	return items
}

func TestDenseWeightsOrthogonal(t *testing.T) {
	m := New()
	for i := range Dim {
		for j := range Dim {
			if v := m.w8[i*Dim+j]; v != 1 && v != -1 {
				t.Fatalf("W[%d][%d] = %d, want ±1", i, j, v)
			}
			if float32(m.w8[i*Dim+j]) != m.w[i*Dim+j] {
				t.Fatalf("float and int8 weights differ at %d,%d", i, j)
			}
		}
	}
	// WᵀW = 384·I: columns orthogonal with squared norm Dim.
	for a := range Dim {
		for b := a; b < Dim; b++ {
			var dot int
			for k := range Dim {
				dot += int(m.w8[k*Dim+a]) * int(m.w8[k*Dim+b])
			}
			want := 0
			if a == b {
				want = Dim
			}
			if dot != want {
				t.Fatalf("column %d · column %d = %d, want %d", a, b, dot, want)
			}
		}
	}
	if n := New(); string(int8Bytes(n.w8)) != string(int8Bytes(m.w8)) {
		t.Fatal("two New() calls built different weights")
	}
}

func int8Bytes(v []int8) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}

func TestTFWeightRounding(t *testing.T) {
	// WeightScale·(1+ln tf) must be far from every rounding boundary (k+½)
	// so that any libm's log rounds to the same integer.
	const margin = 1e-9
	prev := 0
	for tf := 1; tf <= MaxTF; tf++ {
		v := WeightScale * (1 + math.Log(float64(tf)))
		if d := math.Abs(v - math.Floor(v) - 0.5); d < margin {
			t.Fatalf("tf %d: %.17g is within %g of a rounding boundary", tf, v, d)
		}
		w := tfWeight(tf)
		if w < prev {
			t.Fatalf("tfWeight(%d) = %d < tfWeight(%d) = %d", tf, w, tf-1, prev)
		}
		prev = w
	}
	tests := []struct{ tf, want int }{
		{1, 8}, {2, 14}, {3, 17}, {10, 26}, {MaxTF, tfWeight(MaxTF)}, {10 * MaxTF, tfWeight(MaxTF)},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.tf), func(t *testing.T) {
			if got := tfWeight(tt.tf); got != tt.want {
				t.Errorf("tfWeight(%d) = %d, want %d", tt.tf, got, tt.want)
			}
		})
	}
}

func featureMap(f Features) map[uint32]int32 {
	m := make(map[uint32]int32, f.Len())
	for i, idx := range f.Index {
		m[idx] = f.Weight[i]
	}
	return m
}

func TestFeaturizeNormalisesText(t *testing.T) {
	tests := []struct {
		name string
		a, b string
	}{
		{"case", "The Cat SAT", "the cat sat"},
		{"fullwidth (NFKC)", "ｃａｔ　ｓａｔ", "cat sat"},
		{"ligature (NFKC)", "ﬁne ﬂower", "fine flower"},
		{"composed vs decomposed", "cafe\u0301", "café"},
		{"punctuation and spacing", "  cat,   sat!! ", "cat sat"},
		{"hyphen splits words", "out-of-memory", "out of memory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fa, fb := Featurize([]byte(tt.a)), Featurize([]byte(tt.b))
			if fa.Len() == 0 {
				t.Fatalf("no features for %q", tt.a)
			}
			if fmt.Sprint(featureMap(fa)) != fmt.Sprint(featureMap(fb)) {
				t.Errorf("Featurize(%q) != Featurize(%q)", tt.a, tt.b)
			}
		})
	}
}

func TestFeaturizeFeatures(t *testing.T) {
	grams := func(word string) int { // char 3..5-grams of " word "
		n := len([]rune(word)) + 2
		c := 0
		for g := 3; g <= 5; g++ {
			c += max(0, n-g+1)
		}
		return c
	}
	tests := []struct {
		name string
		in   string
		want int // distinct features, assuming no bucket collisions
	}{
		{"empty: one fixed feature", "", 1},
		// Runes ? ! , space . and the pairs ?! !, ", " " ." ..
		{"punctuation only: its runes and pairs", "?!, ...", 5 + 5},
		{"NUL bytes", "\x00\x00", 1 + 1},
		{"content word", "cat", 1 + grams("cat")},
		{"stopword: unigram only", "the", 1},
		{"two words", "the cat", 1 + 1 + grams("cat") + 1},
		{"repeat counts once", "cat cat", 1 + grams("cat") + 1},
		{"symbol is a token", "cat 🙂", 1 + grams("cat") + 1 + 1},
		{"invalid bytes are tokens", "\xff\xfe", 1 + 1 + 1},
		{"cjk run is one word", "東京", 1 + grams("東京")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Featurize([]byte(tt.in))
			if f.Len() != tt.want {
				t.Errorf("Featurize(%q) has %d features, want %d", tt.in, f.Len(), tt.want)
			}
			for i := range f.Index {
				if i > 0 && f.Index[i] <= f.Index[i-1] {
					t.Fatalf("indices not strictly ascending at %d", i)
				}
				if f.Index[i] >= 1<<FeatureBits || f.Weight[i] <= 0 {
					t.Fatalf("feature %d: index %d weight %d", i, f.Index[i], f.Weight[i])
				}
			}
		})
	}
}

func TestFeaturizeWeights(t *testing.T) {
	cat := featureIndex(kindWord, "cat")
	the := featureIndex(kindWord, "the")
	tests := []struct {
		in   string
		idx  uint32
		want int32
	}{
		{"cat", cat, int32(tfWeight(1)) * weightContentWord},
		{"cat cat cat", cat, int32(tfWeight(3)) * weightContentWord},
		{"the", the, int32(tfWeight(1)) * weightStopword},
		{"The the THE the", the, int32(tfWeight(4)) * weightStopword},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := featureMap(Featurize([]byte(tt.in)))[tt.idx]; got != tt.want {
				t.Errorf("weight = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestFeaturizeBytes(t *testing.T) {
	text := Featurize([]byte("memory record"))
	mixed := Featurize([]byte("memory\xffrecord"))
	for idx, w := range featureMap(text) {
		if idx == featureIndex(kindBigram, "memory", " ", "record") {
			continue // the bad byte sits between the words
		}
		if featureMap(mixed)[idx] < w {
			t.Errorf("text feature %d lost when a bad byte is added", idx)
		}
	}
	a, b := Featurize([]byte{0xff, 0x80, 0x81}), Featurize([]byte{0xff, 0x80, 0x82})
	if fmt.Sprint(featureMap(a)) == fmt.Sprint(featureMap(b)) {
		t.Error("binary inputs differing in one invalid byte have the same features")
	}
}

func TestQuantize(t *testing.T) {
	fill := func(f func(k int) int64) *[Dim]int64 {
		var h [Dim]int64
		for k := range h {
			h[k] = f(k)
		}
		return &h
	}
	tests := []struct {
		name      string
		h         *[Dim]int64
		wantShift int
	}{
		{"zero", fill(func(int) int64 { return 0 }), 0},
		{"small stays exact", fill(func(k int) int64 { return int64(k) - 191 }), 0},
		{"at the bound", fill(func(k int) int64 { return MaxL1 / Dim * (1 - 2*int64(k%2)) }), 0},
		{"just over", fill(func(k int) int64 {
			if k == 0 {
				return MaxL1 + 1
			}
			return 0
		}), 1},
		{"huge", fill(func(k int) int64 { return (int64(1) << 50) * (1 - 2*int64(k%3%2)) }), 50 - 22 + 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, shift := Quantize(tt.h)
			if shift != tt.wantShift {
				t.Errorf("shift = %d, want %d", shift, tt.wantShift)
			}
			var l1 int64
			for k, v := range q {
				l1 += abs64(int64(v))
				if want := float64(tt.h[k]) / math.Exp2(float64(shift)); math.Abs(float64(v)-want) > 0.5 {
					t.Fatalf("q[%d] = %d, want %v rounded", k, v, want)
				}
				if float64(float32(v)) != float64(v) {
					t.Fatalf("q[%d] = %d not exact in float32", k, v)
				}
			}
			if l1 > MaxL1 {
				t.Errorf("Σ|q| = %d > %d", l1, MaxL1)
			}
		})
	}
}

// TestExactnessBoundsOnLargeInputs drives the sums past the bound (long
// items, which need a shift) and checks that the device, adding in SIMD-like
// blocks, matches the host's integer result bit for bit.
func TestExactnessBoundsOnLargeInputs(t *testing.T) {
	m := New()
	r := newTestReplica(t, m, newFakeDevice(0, orderBlocked))
	// 256 KiB of distinct random words, and of random bytes.
	const size = 256 << 10
	rng := rand.New(rand.NewPCG(7, 7))
	var words []byte
	for len(words) < size {
		for range 3 + rng.IntN(6) {
			words = append(words, byte('a'+rng.IntN(26)))
		}
		words = append(words, ' ')
	}
	bin := make([]byte, size)
	for i := range bin {
		bin[i] = byte(rng.Uint32())
	}
	tests := []struct {
		name string
		data []byte
	}{{"words", words}, {"bytes", bin}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := Sparse(Featurize(tt.data))
			q, shift := Quantize(&h)
			var l1 int64
			for _, v := range q {
				l1 += abs64(int64(v))
			}
			if shift == 0 || l1 > MaxL1 || l1 < MaxL1/4 {
				t.Errorf("shift %d, Σ|q| %d: want a shift and Σ|q| in (MaxL1/4, MaxL1]", shift, l1)
			}
			y := m.matmulExact(&q)
			want := [][]float32{scaleRow(y[:], shift), l2NormalizeRow(y[:])}
			got := execute(t, r, []any{Input{Data: tt.data}, Input{Data: tt.data, Normalize: true}})
			for i := range got {
				if d, ok := bitsEqual(got[i], want[i]); !ok {
					t.Errorf("normalize %v: dimension %d is %v, host %v", i == 1, d, got[i][d], want[i][d])
				}
			}
		})
	}
}

func TestReplicaMatchesReference(t *testing.T) {
	m := New()
	items := mixedItems(40, 1)
	for _, order := range []sumOrder{orderForward, orderReverse, orderBlocked} {
		t.Run(fmt.Sprint("order", order), func(t *testing.T) {
			r := newTestReplica(t, m, newFakeDevice(0, order))
			in := make([]any, len(items))
			for i, it := range items {
				in[i] = it
			}
			for i, v := range execute(t, r, in) {
				if d, ok := bitsEqual(v, m.Reference(items[i].Data, items[i].Normalize)); !ok {
					t.Errorf("item %d: dimension %d differs from the host reference", i, d)
				}
			}
		})
	}
}

// TestBatchInvariance: every vector of a batch equals that item encoded
// alone, bit for bit, whatever else shares the batch.
func TestBatchInvariance(t *testing.T) {
	m := New()
	r := newTestReplica(t, m, newFakeDevice(0, orderBlocked))
	for _, n := range []int{2, 7, 64} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			items := mixedItems(n, uint64(n))
			in := make([]any, n)
			for i, it := range items {
				in[i] = it
			}
			batch := execute(t, r, in)
			for i, it := range items {
				alone := execute(t, r, []any{it})[0]
				if d, ok := bitsEqual(batch[i], alone); !ok {
					t.Errorf("item %d (normalize %v): dimension %d differs: batch %v, alone %v",
						i, it.Normalize, d, batch[i][d], alone[d])
				}
			}
		})
	}
}

func TestVectors(t *testing.T) {
	m := New()
	r := newTestReplica(t, m, newFakeDevice(0, orderForward))
	tests := []struct {
		name     string
		data     string
		wantZero bool
	}{
		{"empty", "", false},
		{"punctuation", "...!?", false},
		{"whitespace", " \t\n ", false},
		{"NUL bytes", "\x00\x00\x00", false},
		{"word", "memory", false},
		{"sentence", "the cat sat on the mat", false},
		{"binary", "\x00\x01\xff\xfe", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs := execute(t, r, []any{Input{Data: []byte(tt.data), Normalize: true}, Input{Data: []byte(tt.data)}})
			norm, raw := vs[0], vs[1]
			var n2 float64
			for _, v := range norm {
				n2 += float64(v) * float64(v)
			}
			if tt.wantZero {
				for i := range Dim {
					if norm[i] != 0 || raw[i] != 0 {
						t.Fatalf("dimension %d: %v / %v, want zero vectors", i, norm[i], raw[i])
					}
				}
				return
			}
			if math.Abs(n2-1) > 1e-5 {
				t.Errorf("normalised vector has squared norm %v", n2)
			}
			if c := cosine(norm, raw); c < 1-1e-6 {
				t.Errorf("normalised and raw vectors point apart: cosine %v", c)
			}
		})
	}
}

// TestGolden pins the vector format: clients persist vectors, so any change
// to featurisation, hashing, weights or scaling must fail here (and needs a
// new model name, not a new golden value).
func TestGolden(t *testing.T) {
	m := New()
	r := newTestReplica(t, m, newFakeDevice(0, orderForward))
	tests := []struct {
		name string
		in   Input
		want string // sha256 of the little-endian float32 bits, first 16 hex digits
	}{
		{"sentence normalised", Input{Data: []byte("The cat sat on the mat."), Normalize: true}, "4079ef1829a160be"},
		{"sentence raw", Input{Data: []byte("The cat sat on the mat.")}, "0d2bafed5d2629e5"},
		{"unicode", Input{Data: []byte("Ｃａｆé 東京 🙂"), Normalize: true}, "cbc767ffc5d1db89"},
		{"bytes", Input{Data: []byte{0, 1, 2, 0xff, 0xfe, 'a', 'b', 'c'}, Normalize: true}, "ec247941b187029b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := execute(t, r, []any{tt.in})[0]
			if got := vectorHash(v); got != tt.want {
				t.Errorf("vector hash %s, want %s", got, tt.want)
			}
		})
	}
}

func vectorHash(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8])
}

func TestExecuteErrors(t *testing.T) {
	m := New()
	failing := errors.New("device lost")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		in      []any
		runErr  error
		wantErr error
		wantMsg string
	}{
		{"not an Input", context.Background(), []any{Input{}, Input{}, "text"}, nil, ErrBadInput, "input 2 is string"},
		{"pointer", context.Background(), []any{&Input{}}, nil, ErrBadInput, "input 0 is *hashenc.Input"},
		{"nil", context.Background(), []any{Input{}, nil}, nil, ErrBadInput, "input 1 is <nil>"},
		{"cancelled", cancelled, []any{Input{Data: []byte("x")}}, nil, context.Canceled, ""},
		{"device failure", context.Background(), []any{Input{Data: []byte("x")}}, failing, failing, "fake:0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dev := newFakeDevice(0, orderForward)
			r := newTestReplica(t, m, dev)
			dev.runFn = func() error { return tt.runErr }
			_, err := r.Execute(tt.ctx, tt.in)
			if !errors.Is(err, tt.wantErr) || !strings.Contains(fmt.Sprint(err), tt.wantMsg) {
				t.Errorf("Execute error %v, want %v containing %q", err, tt.wantErr, tt.wantMsg)
			}
		})
	}
}

func TestExecuteEmptyBatch(t *testing.T) {
	dev := newFakeDevice(0, orderForward)
	r := newTestReplica(t, New(), dev)
	runs := dev.runs
	out, err := r.Execute(context.Background(), nil)
	if err != nil || len(out) != 0 || dev.runs != runs {
		t.Errorf("Execute(nil) = %v, %v with %d device runs, want nothing run", out, err, dev.runs-runs)
	}
}

func TestNewReplicaBudget(t *testing.T) {
	m := New()
	weights := int64(Dim * Dim * 4)
	tests := []struct {
		name    string
		budget  int64
		wantErr error
	}{
		{"weights do not fit", weights - 1, runtime.ErrOutOfMemory},
		{"workspace does not fit", weights + MaxBatch*Dim*4, runtime.ErrOutOfMemory},
		{"MemoryBytes fits", m.MemoryBytes(), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dev := newFakeDevice(tt.budget, orderForward)
			r, err := m.NewReplica(context.Background(), dev)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("NewReplica error %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				if n := dev.liveBuffers(); n != 0 {
					t.Errorf("%d buffers left allocated after a refused replica", n)
				}
				return
			}
			defer r.Close()
			if got := dev.MemoryUsed(); got != uint64(weights) {
				t.Errorf("resident memory %d, want the weights' %d", got, weights)
			}
		})
	}
}

// TestFullBatchWithinMemoryBytes runs more than MaxBatch items on a device
// whose budget is exactly MemoryBytes: the batch is split, fits, and every
// vector is still the one its item gets alone.
func TestFullBatchWithinMemoryBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("a 1024-row matmul in plain Go")
	}
	m := New()
	dev := newFakeDevice(m.MemoryBytes(), orderForward)
	r := newTestReplica(t, m, dev)
	items := mixedItems(MaxBatch+3, 3)
	in := make([]any, len(items))
	for i, it := range items {
		in[i] = it
	}
	out := execute(t, r, in)
	if dev.maxM > MaxBatch {
		t.Errorf("device ran %d rows at once, want at most %d", dev.maxM, MaxBatch)
	}
	for _, i := range []int{0, 1, MaxBatch - 1, MaxBatch, MaxBatch + 2} {
		if d, ok := bitsEqual(out[i], m.Reference(items[i].Data, items[i].Normalize)); !ok {
			t.Errorf("item %d: dimension %d differs from the reference", i, d)
		}
	}
}

func TestNewReplicaRejectsInexactDevice(t *testing.T) {
	dev := newFakeDevice(0, orderForward)
	dev.bf16 = true
	_, err := New().NewReplica(context.Background(), dev)
	if !errors.Is(err, ErrInexactDevice) {
		t.Fatalf("NewReplica on a bf16 device: %v, want ErrInexactDevice", err)
	}
	if n := dev.liveBuffers(); n != 0 {
		t.Errorf("%d buffers left allocated", n)
	}
}

// TestNormalizationPlacement: a device that follows the recipe normalises on
// the device; one that does not (float32 sums) is detected and the replica
// normalises on the host, so both give the reference vectors.
func TestNormalizationPlacement(t *testing.T) {
	m := New()
	tests := []struct {
		name       string
		fp32Norm   bool
		wantDevice bool
	}{
		{"recipe", false, true},
		{"float32 sums", true, false},
	}
	items := mixedItems(20, 5)
	in := make([]any, len(items))
	for i, it := range items {
		in[i] = it
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dev := newFakeDevice(0, orderBlocked)
			dev.fp32Norm = tt.fp32Norm
			r := newTestReplica(t, m, dev)
			if got := r.NormalizesOnDevice(); got != tt.wantDevice {
				t.Fatalf("NormalizesOnDevice() = %v, want %v", got, tt.wantDevice)
			}
			for i, v := range execute(t, r, in) {
				if d, ok := bitsEqual(v, m.Reference(items[i].Data, items[i].Normalize)); !ok {
					t.Errorf("item %d (normalize %v): dimension %d differs from the reference", i, items[i].Normalize, d)
				}
			}
		})
	}
}

func TestClose(t *testing.T) {
	dev := newFakeDevice(0, orderForward)
	r, err := New().NewReplica(context.Background(), dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Execute(context.Background(), []any{Input{Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if n := dev.liveBuffers(); n != 0 {
		t.Errorf("%d buffers still allocated after Close", n)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := r.Execute(context.Background(), []any{Input{}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Execute after Close: %v, want ErrClosed", err)
	}
}

func TestConcurrentExecute(t *testing.T) {
	m := New()
	r := newTestReplica(t, m, newFakeDevice(0, orderBlocked))
	items := mixedItems(16, 9)
	errs := make(chan error, len(items))
	for i, it := range items {
		go func() {
			out, err := r.Execute(context.Background(), []any{it})
			if err == nil {
				if d, ok := bitsEqual(out[0].([]float32), m.Reference(it.Data, it.Normalize)); !ok {
					err = fmt.Errorf("item %d: dimension %d differs", i, d)
				}
			}
			errs <- err
		}()
	}
	for range items {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// sparseNaive is Sparse written directly from its definition.
func sparseNaive(f Features) [Dim]int64 {
	var h [Dim]int64
	for n, idx := range f.Index {
		rng := splitmix64{state: seed ^ uint64(idx)*0x9e3779b97f4a7c15}
		for i := range Dim / 64 {
			b := rng.next()
			for j := range 64 {
				if b>>j&1 == 1 {
					h[i*64+j] -= int64(f.Weight[n])
				} else {
					h[i*64+j] += int64(f.Weight[n])
				}
			}
		}
	}
	return h
}

func TestSparseMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	random := func(n int, maxW int32) Features {
		var f Features
		for i := range n {
			f.Index = append(f.Index, uint32(i*7919)%(1<<FeatureBits))
			f.Weight = append(f.Weight, 1+rng.Int32N(maxW))
		}
		return f
	}
	tests := []struct {
		name string
		f    Features
	}{
		{"empty", Features{}},
		{"text", Featurize([]byte("the cat sat on the mat, and the dog sat on the log"))},
		{"many light features (lane flushes)", random(5000, 30)},
		{"heavy weights", random(300, 0xffff)},
		{"weights beyond a lane", Features{Index: []uint32{1, 2, 3}, Weight: []int32{0x10000, 1 << 30, -5}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := Sparse(tt.f), sparseNaive(tt.f); got != want {
				t.Errorf("Sparse differs from the definition")
			}
		})
	}
}

// TestPreparedInputsSameVectors: featurising in the caller (Prepare) gives
// the vectors featurising in the batch gives, bit for bit, also mixed.
func TestPreparedInputsSameVectors(t *testing.T) {
	m := New()
	r := newTestReplica(t, m, newFakeDevice(0, orderBlocked))
	items := mixedItems(33, 7)
	plain := make([]any, len(items))
	prepared := make([]any, len(items))
	for i, it := range items {
		plain[i] = it
		if i%3 != 0 {
			prepared[i] = it.Prepare()
		} else {
			prepared[i] = it
		}
	}
	want := execute(t, r, plain)
	got := execute(t, r, prepared)
	for i := range want {
		if d, ok := bitsEqual(want[i], got[i]); !ok {
			t.Fatalf("item %d differs at %d: %v vs %v", i, d, got[i][d], want[i][d])
		}
	}
}
