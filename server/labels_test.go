package server

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/brokerd/brokerd/bench/modelkit"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
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
