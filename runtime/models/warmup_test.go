package models

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
)

// TestWarmUp: a BERT or MLP replica's WarmUp packs its weights on oneDNN
// (the relayout counter moves), the batches after it relay nothing, and
// their outputs are those of a replica that never warmed up, bit for bit.
func TestWarmUp(t *testing.T) {
	cfg := benchConfig()
	cfg.NumHiddenLayers = 2
	r := rand.New(rand.NewPCG(31, 31))
	bert, err := NewBERT(cfg, randomBERT(r, cfg, 0), nil, BERTOptions{Name: "warm", Pooling: PoolingMean})
	if err != nil {
		t.Fatal(err)
	}
	mlp, err := NewMLP(MLPSpec{Name: "warm", InputDim: 256, Layers: []MLPLayer{
		{Type: LayerLinear, Weight: "l1.w", Bias: "l1.b"}, {Type: LayerGELU}, {Type: LayerLinear, Weight: "l2.w"}}},
		map[string]Tensor{"l1.w": randTensor(r, 0.1, 512, 256), "l1.b": randTensor(r, 0.1, 512), "l2.w": randTensor(r, 0.1, 64, 512)})
	if err != nil {
		t.Fatal(err)
	}
	batches := map[string][][]any{"bert": nil, "mlp": nil}
	for _, sh := range [][2]int{{16, 1}, {128, 8}, {5, 3}} {
		items := make([]any, sh[1])
		for i := range items {
			items[i] = randomItem(r, cfg.VocabSize, sh[0], false, true)
		}
		batches["bert"] = append(batches["bert"], items)
		rows := make([]any, sh[1])
		for i := range rows {
			rows[i] = RowInput{Values: randTensor(r, 1, 256).Data}
		}
		batches["mlp"] = append(batches["mlp"], rows)
	}
	for name, m := range map[string]Model{"bert": bert, "mlp": mlp} {
		t.Run(name, func(t *testing.T) { warmUpCheck(t, m, batches[name]) })
	}
}

// warmUpCheck warms one replica of m on a oneDNN device and runs batches
// on it and on a replica that did not warm up.
func warmUpCheck(t *testing.T, m Model, batches [][]any) {
	reg := prometheus.NewRegistry()
	open := func(reg prometheus.Registerer) Replica {
		dev, err := onednn.New(onednn.Options{Registerer: reg}).Open(t.Context(), runtime.DeviceSpec{ID: "cpu:0", Threads: 2, DType: runtime.F32})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		rep, err := m.NewReplica(t.Context(), dev, 8)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rep.Close() })
		return rep
	}
	relaid := func() (sum float64) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "brokerd_onednn_weight_relayout_bytes_total" {
				for _, x := range mf.GetMetric() {
					sum += x.GetCounter().GetValue()
				}
			}
		}
		return sum
	}
	warm, cold := open(reg), open(nil)
	if err := warm.(interface{ WarmUp(context.Context) error }).WarmUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	atLoad := relaid()
	if atLoad <= 0 {
		t.Fatal("the warm-up packed no weight")
	}
	for k, items := range batches {
		a, err := warm.Execute(t.Context(), items)
		if err != nil {
			t.Fatal(err)
		}
		b, err := cold.Execute(t.Context(), items)
		if err != nil {
			t.Fatal(err)
		}
		for i := range a {
			if !slices.Equal(a[i].(Output).Values, b[i].(Output).Values) {
				t.Fatalf("batch %d: item %d differs after a warm-up", k, i)
			}
		}
	}
	if got := relaid(); got != atLoad {
		t.Errorf("batches after the warm-up relaid weights: %v bytes in all, %v after it", got, atLoad)
	}
}
