package daemon

import (
	"cmp"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/brokerd/brokerd/bench/modelkit"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// TestClassifierLabels: a classifier's id2label reaches ListModels (and
// LoadModel's answer) as Model.labels, in index order.
func TestClassifierLabels(t *testing.T) {
	labels := []string{"negative", "neutral", "positive"}
	_, c := modelDaemon(t, func(repo string) {
		if err := modelkit.WriteBERT(filepath.Join(repo, "sentiment", "1"), modelkit.BERT{Layers: 1, Hidden: 32, Heads: 2, Intermediate: 64,
			MaxPositions: 32, Labels: labels, Seed: 3}); err != nil {
			t.Fatal(err)
		}
		writeMLP(t, repo, "mlp", 1, 1, 6, 8, 3)
	}, func(cfg *config.Config) { cfg.LoadModels = "sentiment,mlp" })
	if m := findModel(t, c, "sentiment"); !slices.Equal(m.GetLabels(), labels) {
		t.Errorf("sentiment labels %q, want %q", m.GetLabels(), labels)
	}
	if m := findModel(t, c, "mlp"); len(m.GetLabels()) != 0 {
		t.Errorf("an mlp without labels lists %q", m.GetLabels())
	}
	resp, err := c.LoadModel(testCtx(t), &brokerv1.LoadModelRequest{Name: "sentiment"})
	if err != nil || !slices.Equal(resp.GetModel().GetLabels(), labels) {
		t.Errorf("LoadModel: %v, %v", resp, err)
	}
}

// TestTritonClassificationLabels: Triton's classification of a classifier
// that names its labels answers "value:index:label", as Triton does with a
// model's label file; one without labels keeps "value:index"
// (TestKServeOutputsAndParameters).
func TestTritonClassificationLabels(t *testing.T) {
	labels := []string{"negative", "neutral", "positive"}
	d, _ := modelDaemon(t, func(repo string) {
		if err := modelkit.WriteBERT(filepath.Join(repo, "sentiment", "1"), modelkit.BERT{Layers: 1, Hidden: 32, Heads: 2, Intermediate: 64,
			MaxPositions: 32, Labels: labels, Seed: 3}); err != nil {
			t.Fatal(err)
		}
	}, func(cfg *config.Config) { cfg.LoadModels = "sentiment" })
	k := inference.NewGRPCInferenceServiceClient(d.conn)
	ctx := testCtx(t)
	req := func(outputs ...*inference.ModelInferRequest_InferRequestedOutputTensor) *inference.ModelInferRequest {
		return &inference.ModelInferRequest{ModelName: "sentiment", Outputs: outputs,
			Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "text", Datatype: "BYTES", Shape: []int64{2}}},
			RawInputContents: [][]byte{bytesLE("a fine day", "the worst")}}
	}
	plain, err := k.ModelInfer(ctx, req())
	if err != nil {
		t.Fatal(err)
	}
	logits := fromF32le(plain.GetRawOutputContents()[0])
	resp, err := k.ModelInfer(ctx, req(&inference.ModelInferRequest_InferRequestedOutputTensor{Name: "logits",
		Parameters: map[string]*inference.InferParameter{"classification": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: 2}}}}))
	if err != nil {
		t.Fatal(err)
	}
	o := resp.GetOutputs()[0]
	elems, err := fromBytesLE(resp.GetRawOutputContents()[0], 4)
	if err != nil || !slices.Equal(o.GetShape(), []int64{2, 2}) {
		t.Fatalf("classification output %v: %v", o, err)
	}
	for r := range 2 {
		row := logits[3*r : 3*r+3]
		order := []int{0, 1, 2}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(row[b], row[a]) })
		for j := range 2 {
			i := order[j]
			want := strconv.FormatFloat(float64(row[i]), 'f', 6, 32) + ":" + strconv.Itoa(i) + ":" + labels[i]
			if got := string(elems[2*r+j]); got != want {
				t.Errorf("row %d rank %d: %q, want %q", r, j, got, want)
			}
		}
	}
}
