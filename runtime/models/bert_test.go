package models

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
)

// Tolerances on relErr against the float64 reference.
const (
	tolF32  = 1e-4
	tolBF16 = 1e-2
	// A random classifier's few logits are differences of much larger
	// terms, so bf16's rounding shows more in them than in an embedding:
	// over 12 seeds of TestBERTBF16's model their relative error averaged
	// 0.011-0.013 and peaked at 0.034-0.049 (unfused and fused attention),
	// while the embeddings stayed under 0.008. A wrong op is O(1).
	tolBF16Logits = 6e-2
)

// tinyConfig is the test BERT: 2 layers, hidden 64, 4 heads,
// intermediate 128, vocabulary 40, 64 positions.
func tinyConfig() BERTConfig {
	return BERTConfig{
		VocabSize: 40, HiddenSize: 64, NumHiddenLayers: 2, NumAttentionHeads: 4, IntermediateSize: 128,
		HiddenAct: "gelu", MaxPositionEmbeddings: 64, TypeVocabSize: 2, LayerNormEps: 1e-12,
	}
}

func openDevice(t testing.TB, spec runtime.DeviceSpec) runtime.Device {
	t.Helper()
	dev, err := onednn.New(onednn.Options{}).Open(t.Context(), spec)
	if err != nil {
		t.Fatalf("open %+v: %v", spec, err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// fakeTokenizer splits on spaces: "wN" is id 4+N, anything else [UNK];
// [CLS] a [SEP] (b [SEP]) with type ids 0 then 1.
type fakeTokenizer struct{}

const (
	tokUNK = 1
	tokCLS = 2
	tokSEP = 3
)

func (fakeTokenizer) EncodeTruncated(_ context.Context, text, pair string, maxLen int, truncate bool) ([]int32, []int32, bool, error) {
	word := func(w string) int32 {
		var n int32
		if _, err := fmt.Sscanf(w, "w%d", &n); err == nil && n >= 0 && n < 36 {
			return 4 + n
		}
		return tokUNK
	}
	ids, types := []int32{tokCLS}, []int32{0}
	for _, w := range strings.Fields(text) {
		ids, types = append(ids, word(w)), append(types, 0)
	}
	ids, types = append(ids, tokSEP), append(types, 0)
	if pair != "" {
		for _, w := range strings.Fields(pair) {
			ids, types = append(ids, word(w)), append(types, 1)
		}
		ids, types = append(ids, tokSEP), append(types, 1)
	}
	cut := false
	if len(ids) > maxLen {
		if !truncate {
			return nil, nil, false, fmt.Errorf("%d tokens, more than %d", len(ids), maxLen)
		}
		ids, types = ids[:maxLen], types[:maxLen]
		ids[maxLen-1] = tokSEP
		cut = true
	}
	return ids, types, cut, nil
}

// randomItem is [CLS] random ids [SEP] of n tokens in all, the second half
// typed 1 when pair.
func randomItem(r *rand.Rand, vocab, n int, pair, normalize bool) TextInput {
	in := TextInput{IDs: make([]int32, n), TypeIDs: make([]int32, n), Normalize: normalize}
	for i := range in.IDs {
		in.IDs[i] = int32(4 + r.IntN(vocab-4))
		if pair && i >= n/2 {
			in.TypeIDs[i] = 1
		}
	}
	in.IDs[0], in.IDs[n-1] = tokCLS, tokSEP
	return in
}

func newTestBERT(t testing.TB, cfg BERTConfig, w map[string]Tensor, opts BERTOptions) *BERT {
	t.Helper()
	m, err := NewBERT(cfg, w, fakeTokenizer{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m.(*BERT)
}

func execute(t testing.TB, rep Replica, items []TextInput) [][]float32 {
	t.Helper()
	in := make([]any, len(items))
	for i, it := range items {
		in[i] = it
	}
	out, err := rep.Execute(t.Context(), in)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(items) {
		t.Fatalf("%d outputs for %d inputs", len(out), len(items))
	}
	vecs := make([][]float32, len(out))
	for i, o := range out {
		v, ok := o.(Output)
		if !ok {
			t.Fatalf("output %d is %T, want Output", i, o)
		}
		vecs[i] = v.Values
	}
	return vecs
}

// TestBERTMatchesReference runs batches of sequences of mixed lengths (so
// most are padded) and compares every output with the float64 forward pass
// of that sequence alone.
func TestBERTMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	cfg := tinyConfig()
	w := randomBERT(r, cfg, 3)
	dev := openDevice(t, runtime.DeviceSpec{})
	lengths := []int{5, 1, 17, 64, 2, 9, 33, 8}
	tests := []struct {
		name      string
		kind      Kind
		pooling   string
		normalize bool
		act       string
	}{
		{"mean", KindBERT, PoolingMean, false, "gelu"},
		{"mean normalised", KindBERT, PoolingMean, true, "gelu"},
		{"cls", KindBERT, PoolingCLS, false, "gelu"},
		{"cls normalised", KindBERT, PoolingCLS, true, "gelu"},
		{"relu", KindBERT, PoolingMean, false, "relu"},
		{"classifier", KindBERTClassifier, "", false, "gelu"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			c.HiddenAct = tt.act
			m := newTestBERT(t, c, w, BERTOptions{Name: "tiny", Kind: tt.kind, Pooling: tt.pooling})
			rep, err := m.NewReplica(t.Context(), dev, 4) // two batches of four
			if err != nil {
				t.Fatal(err)
			}
			defer rep.Close()
			items := make([]TextInput, len(lengths))
			for i, n := range lengths {
				items[i] = randomItem(r, c.VocabSize, n, i%2 == 1, tt.normalize)
			}
			got := execute(t, rep, items)
			worst := 0.0
			for i, it := range items {
				want := refBERT(c, w, it.IDs, it.TypeIDs, tt.pooling, tt.normalize, tt.kind == KindBERTClassifier)
				e := relErr(got[i], want)
				if !(e < tolF32) {
					t.Errorf("item %d (%d tokens): relative error %.3g ≥ %g; got %v want %v", i, len(it.IDs), e, tolF32, got[i][:3], want[:3])
				}
				worst = max(worst, e)
			}
			t.Logf("largest relative error %.2g over %d items", worst, len(items))
		})
	}
}

// TestBERTPaddingInvariance: an item's vector alone equals its vector in a
// batch padded to longer items.
func TestBERTPaddingInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	cfg := tinyConfig()
	w := randomBERT(r, cfg, 2)
	dev := openDevice(t, runtime.DeviceSpec{})
	for _, kind := range []Kind{KindBERT, KindBERTClassifier} {
		for _, pooling := range []string{PoolingMean, PoolingCLS} {
			t.Run(fmt.Sprintf("%s/%s", kind, pooling), func(t *testing.T) {
				m := newTestBERT(t, cfg, w, BERTOptions{Kind: kind, Pooling: pooling})
				rep, err := m.NewReplica(t.Context(), dev, 8)
				if err != nil {
					t.Fatal(err)
				}
				defer rep.Close()
				item := randomItem(r, cfg.VocabSize, 6, false, true)
				alone := execute(t, rep, []TextInput{item})[0]
				batch := []TextInput{randomItem(r, cfg.VocabSize, 40, true, false), item, randomItem(r, cfg.VocabSize, 64, false, true)}
				inBatch := execute(t, rep, batch)[1]
				want := make([]float64, len(alone))
				for i, v := range alone {
					want[i] = float64(v)
				}
				if e := relErr(inBatch, want); !(e < 1e-5) {
					t.Errorf("alone vs padded batch: relative error %.3g; alone %v, in batch %v", e, alone[:3], inBatch[:3])
				}
			})
		}
	}
}

// TestBERTPoolingDiffers guards the reference comparison: CLS and mean
// pooling of the same sequence must differ, or pooling was not applied.
func TestBERTPoolingDiffers(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	cfg := tinyConfig()
	w := randomBERT(r, cfg, 0)
	dev := openDevice(t, runtime.DeviceSpec{})
	item := randomItem(r, cfg.VocabSize, 12, false, false)
	var vecs [2][]float32
	for i, p := range []string{PoolingMean, PoolingCLS} {
		rep, err := newTestBERT(t, cfg, w, BERTOptions{Pooling: p}).NewReplica(t.Context(), dev, 1)
		if err != nil {
			t.Fatal(err)
		}
		vecs[i] = execute(t, rep, []TextInput{item})[0]
		rep.Close()
	}
	want := make([]float64, len(vecs[0]))
	for i, v := range vecs[0] {
		want[i] = float64(v)
	}
	if e := relErr(vecs[1], want); e < 0.1 {
		t.Fatalf("cls and mean pooling differ by only %.3g", e)
	}
}

func TestBERTBF16(t *testing.T) {
	dev, err := onednn.New(onednn.Options{}).Open(t.Context(), runtime.DeviceSpec{DType: runtime.BF16})
	if err != nil {
		if !errors.Is(err, runtime.ErrUnsupported) {
			t.Fatalf("open bf16: %v, want ErrUnsupported when refused", err)
		}
		t.Skipf("bf16 unsupported on this CPU: %v", err)
	}
	defer dev.Close()
	r := rand.New(rand.NewPCG(4, 4))
	cfg := tinyConfig()
	w := randomBERT(r, cfg, 3)
	for _, kind := range []Kind{KindBERT, KindBERTClassifier} {
		t.Run(string(kind), func(t *testing.T) {
			m := newTestBERT(t, cfg, w, BERTOptions{Kind: kind})
			rep, err := m.NewReplica(t.Context(), dev, 4)
			if err != nil {
				t.Fatal(err)
			}
			defer rep.Close()
			items := []TextInput{randomItem(r, cfg.VocabSize, 7, false, false), randomItem(r, cfg.VocabSize, 30, true, true)}
			got := execute(t, rep, items)
			for i, it := range items {
				want := refBERT(cfg, w, it.IDs, it.TypeIDs, PoolingMean, it.Normalize, kind == KindBERTClassifier)
				tol := tolBF16
				if kind == KindBERTClassifier {
					tol = tolBF16Logits
				}
				if e := relErr(got[i], want); !(e < tol) {
					t.Errorf("item %d: relative error %.3g ≥ %g", i, e, tol)
				}
			}
		})
	}
}

// bf16Device is a device that claims bf16 compute but cannot allocate it,
// as a CPU without bf16 would if it were opened: the replica must refuse.
type bf16Device struct{ runtime.Device }

func (bf16Device) ComputeType() runtime.DType { return runtime.BF16 }

func TestBERTReplicaBF16Refused(t *testing.T) {
	dev := openDevice(t, runtime.DeviceSpec{})
	if reason := dev.(*onednn.Device).BF16(); reason == nil {
		t.Skip("this CPU runs bf16: TestBERTBF16 covers it")
	}
	m := newTestBERT(t, tinyConfig(), randomBERT(rand.New(rand.NewPCG(5, 5)), tinyConfig(), 0), BERTOptions{Name: "tiny"})
	before := dev.MemoryUsed()
	_, err := m.NewReplica(t.Context(), bf16Device{dev}, 4)
	if !errors.Is(err, runtime.ErrUnsupported) || !strings.Contains(err.Error(), "bf16") {
		t.Fatalf("err = %v, want ErrUnsupported naming bf16", err)
	}
	t.Logf("refused as expected: %v", err)
	if live := dev.MemoryUsed() - before; live != 0 {
		// Freed buffers stay pooled; they must be free for reuse, which
		// MemoryUsed cannot tell, so check the pool serves them again.
		b, err := dev.Alloc(runtime.F32, 40, 64)
		if err != nil {
			t.Fatal(err)
		}
		dev.Free(b)
		if dev.MemoryUsed()-before != live {
			t.Errorf("uploaded weights were not returned to the pool")
		}
	}
}

func TestBERTTokenize(t *testing.T) {
	cfg := tinyConfig()
	w := randomBERT(rand.New(rand.NewPCG(6, 6)), cfg, 0)
	long := strings.Repeat("w1 ", 70)
	tests := []struct {
		name            string
		text, pair      string
		truncate, norm  bool
		modelNorm       bool
		wantIDs         []int32
		wantTypes       []int32
		wantNorm        bool
		wantErr, wantIn bool // wantIn: ErrInvalidInput
	}{
		{"single", "w0 w1 zz", "", false, false, false, []int32{2, 4, 5, 1, 3}, []int32{0, 0, 0, 0, 0}, false, false, false},
		{"pair", "w0", "w2 w3", false, true, false, []int32{2, 4, 3, 6, 7, 3}, []int32{0, 0, 0, 1, 1, 1}, true, false, false},
		{"model normalises", "w0", "", false, false, true, []int32{2, 4, 3}, []int32{0, 0, 0}, true, false, false},
		{"too long", long, "", false, false, false, nil, nil, false, true, true},
		{"truncated", long, "", true, false, false, nil, nil, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newTestBERT(t, cfg, w, BERTOptions{Normalize: tt.modelNorm})
			in, err := m.Tokenize(context.Background(), tt.text, tt.pair, tt.truncate, tt.norm)
			if tt.wantErr {
				if err == nil || (tt.wantIn && !errors.Is(err, ErrInvalidInput)) {
					t.Fatalf("err = %v, want ErrInvalidInput", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantIDs != nil && (fmt.Sprint(in.IDs) != fmt.Sprint(tt.wantIDs) || fmt.Sprint(in.TypeIDs) != fmt.Sprint(tt.wantTypes)) {
				t.Errorf("ids %v types %v, want %v %v", in.IDs, in.TypeIDs, tt.wantIDs, tt.wantTypes)
			}
			if tt.truncate && len(in.IDs) != cfg.MaxPositionEmbeddings {
				t.Errorf("truncated to %d tokens, want %d", len(in.IDs), cfg.MaxPositionEmbeddings)
			}
			if in.Normalize != tt.wantNorm {
				t.Errorf("Normalize = %v, want %v", in.Normalize, tt.wantNorm)
			}
			if got := m.Cost(in); got != len(in.IDs) {
				t.Errorf("Cost = %d, want %d tokens", got, len(in.IDs))
			}
		})
	}
}

func TestBERTInfo(t *testing.T) {
	cfg := tinyConfig()
	cfg.ID2Label = map[string]string{"0": "neg", "1": "neu", "2": "pos"}
	w := randomBERT(rand.New(rand.NewPCG(7, 7)), cfg, 3)
	enc := newTestBERT(t, cfg, w, BERTOptions{Name: "e", Version: 2}).Info()
	if enc.Kind != KindBERT || enc.Dim != 64 || enc.MaxSeqLen != 64 || enc.Version != 2 ||
		enc.BaseBatch != DefaultBaseBatch || enc.MaxBatchTokens != DefaultMaxBatchTokens || enc.Outputs[0].Name != "embedding" {
		t.Errorf("encoder info %+v", enc)
	}
	cls := newTestBERT(t, cfg, w, BERTOptions{Kind: KindBERTClassifier, BaseBatch: 4, MaxBatchTokens: 100}).Info()
	if cls.Dim != 3 || fmt.Sprint(cls.Labels) != "[neg neu pos]" || cls.BaseBatch != 4 || cls.MaxBatchTokens != 100 ||
		fmt.Sprint(cls.Outputs[0].Shape) != "[-1 3]" {
		t.Errorf("classifier info %+v", cls)
	}
}

func TestNewBERTErrors(t *testing.T) {
	cfg := tinyConfig()
	w := randomBERT(rand.New(rand.NewPCG(8, 8)), cfg, 0)
	without := func(name string) map[string]Tensor {
		c := map[string]Tensor{}
		for k, v := range w {
			if k != name {
				c[k] = v
			}
		}
		return c
	}
	reshaped := func(name string, shape ...int) map[string]Tensor {
		c := without(name)
		c[name] = Tensor{Shape: shape, Data: w[name].Data}
		return c
	}
	prefixed := map[string]Tensor{}
	for k, v := range w {
		prefixed["bert."+k] = v
	}
	tests := []struct {
		name    string
		cfg     func(*BERTConfig)
		weights map[string]Tensor
		opts    BERTOptions
		want    string // "" means it loads
	}{
		{"bert. prefix accepted", nil, prefixed, BERTOptions{}, ""},
		{"missing weight", nil, without("encoder.layer.1.output.dense.bias"), BERTOptions{}, `"encoder.layer.1.output.dense.bias" is missing`},
		{"wrong shape", nil, reshaped("encoder.layer.0.attention.self.key.weight", 32, 128), BERTOptions{}, "is [32 128], want [64 64]"},
		{"heads", func(c *BERTConfig) { c.NumAttentionHeads = 5 }, w, BERTOptions{}, "not a multiple"},
		{"activation", func(c *BERTConfig) { c.HiddenAct = "gelu_new" }, w, BERTOptions{}, `hidden_act "gelu_new"`},
		{"pooling", nil, w, BERTOptions{Pooling: "max"}, `pooling "max"`},
		{"kind", nil, w, BERTOptions{Kind: KindMLP}, "not a BERT kind"},
		{"no classifier", nil, w, BERTOptions{Kind: KindBERTClassifier}, "classifier"},
		{"zero layers", func(c *BERTConfig) { c.NumHiddenLayers = 0 }, w, BERTOptions{}, "num_hidden_layers is 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			if tt.cfg != nil {
				tt.cfg(&c)
			}
			_, err := NewBERT(c, tt.weights, nil, tt.opts)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidInput containing %q", err, tt.want)
			}
		})
	}
}

func TestBERTExecuteErrors(t *testing.T) {
	cfg := tinyConfig()
	m := newTestBERT(t, cfg, randomBERT(rand.New(rand.NewPCG(9, 9)), cfg, 0), BERTOptions{})
	dev := openDevice(t, runtime.DeviceSpec{})
	rep, err := m.NewReplica(t.Context(), dev, 4)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   any
		want string
	}{
		{"wrong type", RowInput{}, "want models.TextInput"},
		{"empty", TextInput{}, "no tokens"},
		{"id outside vocabulary", TextInput{IDs: []int32{2, 40, 3}}, "id 40, outside the vocabulary of 40"},
		{"negative id", TextInput{IDs: []int32{-1}}, "id -1"},
		{"type id", TextInput{IDs: []int32{2, 3}, TypeIDs: []int32{0, 2}}, "type id 2"},
		{"type ids length", TextInput{IDs: []int32{2, 3}, TypeIDs: []int32{0}}, "1 token type ids for 2 tokens"},
		{"too long", TextInput{IDs: make([]int32, 65)}, "65 tokens, at most 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := rep.Execute(t.Context(), []any{TextInput{IDs: []int32{2, 3}}, tt.in})
			if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalidInput containing %q", err, tt.want)
			}
		})
	}
	t.Run("pointer payload", func(t *testing.T) {
		if _, err := rep.Execute(t.Context(), []any{&TextInput{IDs: []int32{2, 3}}}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		rep.Close()
		rep.Close() // idempotent
		if _, err := rep.Execute(t.Context(), []any{TextInput{IDs: []int32{2, 3}}}); !errors.Is(err, ErrClosed) {
			t.Fatalf("err = %v, want ErrClosed", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		rep, err := m.NewReplica(t.Context(), dev, 4)
		if err != nil {
			t.Fatal(err)
		}
		defer rep.Close()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := rep.Execute(ctx, []any{TextInput{IDs: []int32{2, 3}}}); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	})
}

// TestBERTMemoryBytes: a device whose budget is exactly MemoryBytes runs a
// full batch of the longest sequences, and one with 10% less cannot, so the
// figure is neither short nor padded.
func TestBERTMemoryBytes(t *testing.T) {
	cfg := tinyConfig()
	w := randomBERT(rand.New(rand.NewPCG(10, 10)), cfg, 3)
	const maxBatch = 4
	for _, kind := range []Kind{KindBERT, KindBERTClassifier} {
		m := newTestBERT(t, cfg, w, BERTOptions{Kind: kind, Normalize: true})
		need := m.MemoryBytes(runtime.F32, maxBatch)
		if bf := m.MemoryBytes(runtime.BF16, maxBatch); !(bf < need) {
			t.Errorf("%s: bf16 needs %d bytes, not less than f32's %d", kind, bf, need)
		}
		full := make([]TextInput, maxBatch)
		r := rand.New(rand.NewPCG(11, 11))
		for i := range full {
			full[i] = randomItem(r, cfg.VocabSize, cfg.MaxPositionEmbeddings, false, true)
		}
		for _, tt := range []struct {
			budget uint64
			fits   bool
		}{{uint64(need), true}, {uint64(need) * 9 / 10, false}} {
			t.Run(fmt.Sprintf("%s/budget=%d", kind, tt.budget), func(t *testing.T) {
				dev := openDevice(t, runtime.DeviceSpec{Budget: tt.budget})
				rep, err := m.NewReplica(t.Context(), dev, maxBatch)
				if err == nil {
					defer rep.Close()
					in := make([]any, len(full))
					for i, it := range full {
						in[i] = it
					}
					_, err = rep.Execute(t.Context(), in)
				}
				if tt.fits && err != nil {
					t.Fatalf("MemoryBytes = %d is not enough: %v", need, err)
				}
				if !tt.fits && !errors.Is(err, runtime.ErrOutOfMemory) {
					t.Fatalf("ran in 90%% of MemoryBytes = %d (err %v): the figure is padded", need, err)
				}
			})
		}
	}
}

// TestBERTConcurrentExecute: batches from several goroutines on one replica
// give the same vectors as run one at a time.
func TestBERTConcurrentExecute(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 12))
	cfg := tinyConfig()
	m := newTestBERT(t, cfg, randomBERT(r, cfg, 0), BERTOptions{})
	rep, err := m.NewReplica(t.Context(), openDevice(t, runtime.DeviceSpec{}), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	batches := make([][]TextInput, 4)
	want := make([][][]float32, len(batches))
	for i := range batches {
		for j := 0; j < 3; j++ {
			batches[i] = append(batches[i], randomItem(r, cfg.VocabSize, 3+r.IntN(30), j == 1, j == 2))
		}
		want[i] = execute(t, rep, batches[i])
	}
	errs := make(chan error, len(batches))
	for i := range batches {
		go func() {
			in := make([]any, len(batches[i]))
			for j, it := range batches[i] {
				in[j] = it
			}
			out, err := rep.Execute(t.Context(), in)
			if err == nil {
				for j, o := range out {
					if fmt.Sprint(o.(Output).Values) != fmt.Sprint(want[i][j]) {
						err = fmt.Errorf("batch %d item %d differs from its sequential run", i, j)
					}
				}
			}
			errs <- err
		}()
	}
	for range batches {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
