package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestKVCacheDTypeEndToEnd: a Q8_0 GGUF generator on the CPU holds its KV
// cache in bf16 by default (--kv-cache-dtype auto) and in f32 when told,
// as its placement's log line says; the placement counts it, so the
// model's memory differs by half the f32 cache, and both serve.
func TestKVCacheDTypeEndToEnd(t *testing.T) {
	gguf := writeTinyGGUF(t, "q8_0")
	memory := map[string]uint64{}
	for _, kv := range []string{"auto", "f32"} {
		cfg := testConfig(t)
		cfg.ModelRepo = t.TempDir()
		cfg.KVCacheDType = kv
		dst := filepath.Join(cfg.ModelRepo, "tiny", "1", "m.gguf")
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(gguf); err != nil || os.WriteFile(dst, b, 0o644) != nil {
			t.Fatalf("copying the GGUF: %v", err)
		}
		core, logs := observer.New(zap.InfoLevel)
		d := startDaemonLog(t, Options{Config: cfg}, zap.New(core))
		c := brokerv1.NewBrokerServiceClient(d.conn)
		ctx := testCtx(t)
		lr, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "tiny"})
		if err != nil {
			t.Fatalf("%s: %v", kv, err)
		}
		memory[kv] = lr.GetModel().GetMemoryBytes()
		want := map[string]string{"auto": "bf16", "f32": "f32"}[kv]
		if placed := logs.FilterMessage("generator placed").All(); len(placed) != 1 || placed[0].ContextMap()["kv_cache_dtype"] != want {
			t.Errorf("%s: the placement's log lines %v, want one with kv_cache_dtype %s", kv, placed, want)
		}
		texts, _, err := generateTexts(t, c, &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"a", "b"},
			Sampling: &brokerv1.SamplingParams{Temperature: new(float32), MaxTokens: 4, IgnoreEos: true}})
		if err != nil || len(texts) != 2 {
			t.Fatalf("%s: generate: %v %v", kv, texts, err)
		}
	}
	// 2 layers · K and V · 2 heads · 16 dims a position; the f32 cache is
	// twice the bf16 one, so the difference is half of it: a whole number of
	// bf16 positions' bytes.
	const bf16Position = 2 * 2 * 2 * 16 * 2
	diff := int64(memory["f32"]) - int64(memory["auto"])
	if diff <= 0 || diff%bf16Position != 0 {
		t.Errorf("memory with an f32 cache %d, with the default (bf16) %d: want the f32 one larger by bf16 positions", memory["f32"], memory["auto"])
	}
}
