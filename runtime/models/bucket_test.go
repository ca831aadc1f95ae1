package models

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/brokerd/brokerd/runtime"
)

// PJRT's buckets (runtime/pjrt SeqBuckets and BatchBuckets, up to 128),
// written out: models must not import an adapter.
var (
	testBatchBuckets = []int{1, 2, 4, 8, 16, 32, 64, 128}
	testSeqBuckets   = []int{32, 64, 128, 256, 512}
)

func TestPadPlanRows(t *testing.T) {
	tests := []struct {
		name     string
		batch    []int
		maxBatch int
		n        int
		want     int
	}{
		{"no buckets: as is", nil, 8, 3, 3},
		{"next bucket", testBatchBuckets, 8, 3, 4},
		{"exact bucket", testBatchBuckets, 8, 4, 4},
		{"one item", testBatchBuckets, 8, 1, 1},
		{"capped at max batch", testBatchBuckets, 6, 5, 6},
		{"full batch not past the plan", testBatchBuckets, 6, 6, 6},
		{"max batch not a power of two", testBatchBuckets, 48, 33, 48},
		{"beyond the last bucket: as is", []int{1, 2, 4}, 16, 7, 7},
		{"never below n", testBatchBuckets, 2, 3, 3},
		{"empty batch", testBatchBuckets, 8, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := padPlan{batch: tt.batch, maxBatch: tt.maxBatch}
			if got := p.rows(tt.n); got != tt.want {
				t.Errorf("rows(%d) = %d, want %d", tt.n, got, tt.want)
			}
		})
	}
}

func TestPadPlanSeqLen(t *testing.T) {
	tests := []struct {
		name   string
		seq    []int
		maxSeq int
		n      int
		want   int
	}{
		{"no buckets: short sequences unpadded", nil, 512, 13, 13},
		{"no buckets: 18 tokens stay 18", nil, 512, 18, 18},
		{"no buckets: step 2 from 16", nil, 512, 17, 18},
		{"no buckets: step 16 from 128", nil, 512, 129, 144},
		{"no buckets: exact multiple", nil, 512, 128, 128},
		{"no buckets: capped", nil, 140, 135, 140},
		{"first bucket", testSeqBuckets, 512, 5, 32},
		{"exact bucket", testSeqBuckets, 512, 32, 32},
		{"next bucket", testSeqBuckets, 512, 33, 64},
		{"capped at max positions", testSeqBuckets, 48, 40, 48},
		{"beyond the last bucket: step 64", testSeqBuckets, 1024, 513, 576},
		{"no cap for models without positions", testSeqBuckets, 0, 100, 128},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := padPlan{seq: tt.seq, maxSeq: tt.maxSeq}
			if got := p.seqLen(tt.n); got != tt.want {
				t.Errorf("seqLen(%d) = %d, want %d", tt.n, got, tt.want)
			}
		})
	}
}

func TestPadPlanTokenRows(t *testing.T) {
	tests := []struct{ n, want int }{
		{1, 1}, {18, 18}, {31, 31}, {33, 34}, {63, 64}, {90, 92}, {512, 512}, {513, 544}, {1000, 1024},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.n), func(t *testing.T) {
			if got := (padPlan{}).tokenRows(tt.n); got != tt.want {
				t.Errorf("tokenRows(%d) = %d, want %d", tt.n, got, tt.want)
			}
			if got := (padPlan{}).tokenRows(tt.n); got < tt.n || (got-tt.n)*16 > tt.n {
				t.Errorf("tokenRows(%d) = %d: more than a sixteenth of padding", tt.n, got)
			}
		})
	}
}

func TestNewPadPlan(t *testing.T) {
	dev := openDevice(t, runtime.DeviceSpec{})
	tests := []struct {
		name      string
		dev       runtime.Device
		wantBatch []int
		wantSeq   []int
	}{
		{"oneDNN has no buckets", dev, nil, nil},
		{"buckets sorted and cleaned", &paddingDevice{recordingDevice: &recordingDevice{Device: dev},
			batch: []int{8, 0, 2, 2, 1}, seq: []int{64, 32, -1}}, []int{1, 2, 8}, []int{32, 64}},
		{"no positive bucket", &paddingDevice{recordingDevice: &recordingDevice{Device: dev},
			batch: []int{0}, seq: nil}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPadPlan(tt.dev, 8, 64)
			if !slices.Equal(p.batch, tt.wantBatch) || !slices.Equal(p.seq, tt.wantSeq) || p.maxBatch != 8 || p.maxSeq != 64 {
				t.Errorf("plan = %+v, want batch %v seq %v", p, tt.wantBatch, tt.wantSeq)
			}
		})
	}
}

// recordingDevice records the shape of one bound input of every Run.
type recordingDevice struct {
	runtime.Device
	input string

	mu     sync.Mutex
	shapes [][]int
}

func (d *recordingDevice) Run(ctx context.Context, g *runtime.Graph, bind map[string]runtime.Buffer) error {
	d.mu.Lock()
	if b, ok := bind[d.input]; ok {
		d.shapes = append(d.shapes, slices.Clone(b.Shape()))
	}
	d.mu.Unlock()
	return d.Device.Run(ctx, g, bind)
}

func (d *recordingDevice) runs() [][]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.shapes
	d.shapes = nil
	return out
}

// paddingDevice is a recording oneDNN device that asks for padding to
// buckets, as runtime/pjrt's Device does.
type paddingDevice struct {
	*recordingDevice
	batch, seq []int
}

func (d *paddingDevice) PadBuckets() (batch, seq []int) { return d.batch, d.seq }

func TestBERTBucketing(t *testing.T) {
	dev := openDevice(t, runtime.DeviceSpec{})
	tests := []struct {
		name      string
		kind      Kind
		pooling   string
		maxPos    int
		maxBatch  int
		lens      []int
		normalize []bool  // per item; false when short
		wantPlain [][]int // [b,s] of each run without buckets (packed)
		wantTok   []int   // packed token rows of each run without buckets, 0: not packed
		wantPad   [][]int
	}{
		{name: "rows and sequence to the next bucket", maxBatch: 8, lens: []int{5, 9, 20},
			wantPlain: [][]int{{3, 20}}, wantTok: []int{34}, wantPad: [][]int{{4, 32}}},
		{name: "max batch caps the batch bucket", maxBatch: 3, lens: []int{5, 6, 7},
			wantPlain: [][]int{{3, 7}}, wantTok: []int{18}, wantPad: [][]int{{3, 32}}},
		{name: "two batches, two buckets each", maxBatch: 4, lens: []int{50, 3, 40, 4, 30, 5},
			normalize: []bool{true, false, true, true, false, false},
			wantPlain: [][]int{{4, 30}, {2, 52}}, wantTok: []int{42, 92}, wantPad: [][]int{{4, 32}, {2, 64}}},
		{name: "max_position_embeddings caps the sequence bucket", maxPos: 48, maxBatch: 8, lens: []int{40},
			wantPlain: [][]int{{1, 40}}, wantTok: []int{0}, wantPad: [][]int{{1, 48}}},
		{name: "exact buckets are not padded", maxBatch: 8, lens: []int{32, 32},
			wantPlain: [][]int{{2, 32}}, wantTok: []int{0}, wantPad: [][]int{{2, 32}}},
		{name: "cls pooling", pooling: PoolingCLS, maxBatch: 8, lens: []int{7, 12, 33, 2, 9},
			normalize: []bool{true, false, false, true, true},
			wantPlain: [][]int{{5, 36}}, wantTok: []int{64}, wantPad: [][]int{{8, 64}}},
		{name: "classifier", kind: KindBERTClassifier, maxBatch: 16, lens: []int{10, 11, 12, 13, 14},
			wantPlain: [][]int{{5, 14}}, wantTok: []int{60}, wantPad: [][]int{{8, 32}}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(30, uint64(i)))
			cfg := tinyConfig()
			if tt.maxPos > 0 {
				cfg.MaxPositionEmbeddings = tt.maxPos
			}
			m := newTestBERT(t, cfg, randomBERT(r, cfg, 3), BERTOptions{Kind: tt.kind, Pooling: tt.pooling})
			items := make([]TextInput, len(tt.lens))
			for j, n := range tt.lens {
				items[j] = randomItem(r, cfg.VocabSize, n, j%2 == 1, j < len(tt.normalize) && tt.normalize[j])
			}
			tok := &recordingDevice{Device: dev, input: bIDs}
			plain := &recordingDevice{Device: tok, input: bMask}
			padded := &paddingDevice{recordingDevice: &recordingDevice{Device: dev, input: bMask}, batch: testBatchBuckets, seq: testSeqBuckets}
			want, wantShapes := runBERT(t, m, plain, tt.maxBatch, items)
			got, gotShapes := runBERT(t, m, padded, tt.maxBatch, items)
			if !reflect.DeepEqual(wantShapes, tt.wantPlain) {
				t.Errorf("without buckets Run saw %v, want %v", wantShapes, tt.wantPlain)
			}
			var gotTok []int
			for _, sh := range tok.runs() {
				if len(sh) == 1 { // packed [T]; else padded [b,s]: 0
					gotTok = append(gotTok, sh[0])
				} else {
					gotTok = append(gotTok, 0)
				}
			}
			if !reflect.DeepEqual(gotTok, tt.wantTok) {
				t.Errorf("without buckets Run saw packed token rows %v, want %v", gotTok, tt.wantTok)
			}
			if !reflect.DeepEqual(gotShapes, tt.wantPad) {
				t.Errorf("with buckets Run saw %v, want %v", gotShapes, tt.wantPad)
			}
			for j := range items {
				if e := relErr(got[j], float64s(want[j])); !(e < 1e-5) {
					t.Errorf("item %d (%d tokens): padded vs unpadded relative error %.3g", j, tt.lens[j], e)
				}
			}
		})
	}
}

func runBERT(t *testing.T, m *BERT, dev runtime.Device, maxBatch int, items []TextInput) ([][]float32, [][]int) {
	t.Helper()
	rep, err := m.NewReplica(t.Context(), dev, maxBatch)
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	out := execute(t, rep, items)
	var shapes [][]int
	switch d := dev.(type) {
	case *recordingDevice:
		shapes = d.runs()
	case *paddingDevice:
		shapes = d.runs()
	}
	return out, shapes
}

func float64s(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func TestMLPBucketing(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 31))
	w := map[string]Tensor{
		"l1.w": randTensor(r, 0.3, 16, 6), "l1.b": randTensor(r, 0.1, 16),
		"ln.g": randTensor(r, 1, 16), "ln.b": randTensor(r, 0.1, 16),
		"l2.w": randTensor(r, 0.3, 4, 16), "l2.b": randTensor(r, 0.1, 4),
	}
	spec := MLPSpec{Name: "m", InputDim: 6, Layers: []MLPLayer{
		{Type: LayerLinear, Weight: "l1.w", Bias: "l1.b"}, {Type: LayerGELU},
		{Type: LayerLayerNorm, Weight: "ln.g", Bias: "ln.b"},
		{Type: LayerLinear, Weight: "l2.w", Bias: "l2.b"}, {Type: LayerSoftmax},
	}}
	model, err := NewMLP(spec, w)
	if err != nil {
		t.Fatal(err)
	}
	dev := openDevice(t, runtime.DeviceSpec{})
	tests := []struct {
		name      string
		maxBatch  int
		rows      int
		wantPlain [][]int
		wantPad   [][]int
	}{
		{"next bucket", 16, 5, [][]int{{5, 6}}, [][]int{{8, 6}}},
		{"one row", 16, 1, [][]int{{1, 6}}, [][]int{{1, 6}}},
		{"capped at max batch", 6, 5, [][]int{{5, 6}}, [][]int{{6, 6}}},
		{"split into batches", 4, 7, [][]int{{4, 6}, {3, 6}}, [][]int{{4, 6}, {4, 6}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inputs := make([]any, tt.rows)
			for i := range inputs {
				inputs[i] = RowInput{Values: randTensor(r, 1, 6).Data}
			}
			plain := &recordingDevice{Device: dev, input: mlpIn}
			padded := &paddingDevice{recordingDevice: &recordingDevice{Device: dev, input: mlpIn}, batch: testBatchBuckets, seq: testSeqBuckets}
			want := runMLP(t, model, plain, tt.maxBatch, inputs)
			got := runMLP(t, model, padded, tt.maxBatch, inputs)
			if shapes := plain.runs(); !reflect.DeepEqual(shapes, tt.wantPlain) {
				t.Errorf("without buckets Run saw %v, want %v", shapes, tt.wantPlain)
			}
			if shapes := padded.runs(); !reflect.DeepEqual(shapes, tt.wantPad) {
				t.Errorf("with buckets Run saw %v, want %v", shapes, tt.wantPad)
			}
			for i := range inputs {
				if e := relErr(got[i], float64s(want[i])); !(e < 1e-5) {
					t.Errorf("row %d: padded vs unpadded relative error %.3g", i, e)
				}
			}
		})
	}
}

func runMLP(t *testing.T, m Model, dev runtime.Device, maxBatch int, inputs []any) [][]float32 {
	t.Helper()
	rep, err := m.NewReplica(t.Context(), dev, maxBatch)
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	out, err := rep.Execute(t.Context(), inputs)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(inputs) {
		t.Fatalf("%d outputs for %d rows", len(out), len(inputs))
	}
	vals := make([][]float32, len(out))
	for i, o := range out {
		v, ok := o.(Output)
		if !ok {
			t.Fatalf("output %d is %T, want Output", i, o)
		}
		vals[i] = v.Values
	}
	return vals
}
