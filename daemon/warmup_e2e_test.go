package daemon

import (
	"testing"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/config"
)

// TestEncoderWarmUpEndToEnd: a BERT encoder loaded at start has its
// weights packed by then (the relayout counter moved), and Encode requests
// of several sizes relay nothing more.
func TestEncoderWarmUpEndToEnd(t *testing.T) {
	d, c := modelDaemon(t, func(repo string) { writeBERT(t, repo, "enc", 1, 4, 0) },
		func(cfg *config.Config) { cfg.LoadModels = "enc" })
	ctx := testCtx(t)
	relaid := func() (sum float64) {
		text := scrape(t, d.addrs.Metrics)
		for _, l := range []string{"packed", "relaid16", "row-major"} {
			sum += sample(text, `brokerd_onednn_weight_relayout_bytes_total{device="cpu:0",layout="`+l+`"}`)
		}
		return sum
	}
	atLoad := relaid()
	if atLoad <= 0 {
		t.Fatalf("no weight packed at load: %v", atLoad)
	}
	for _, texts := range [][]string{{"a"}, {"the quick brown fox", "a lazy dog is running", "memory"}} {
		if _, err := c.Encode(ctx, &brokerv1.EncodeRequest{Model: "enc", Items: textItems(texts...)}); err != nil {
			t.Fatal(err)
		}
	}
	if got := relaid(); got != atLoad {
		t.Errorf("Encode relaid weights: %v bytes in all, %v after the load", got, atLoad)
	}
}
