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
// cache in bf16 by default (--kv-cache-dtype auto), in f32, f16, q8_0 or q4_0 when
// told, as its placement's log line says; a model whose heads (16 dims)
// cannot be held in q8_0 blocks of 32 keeps the default, with a warning,
// rather than failing to load. The placement counts the cache, so the
// model's memory differs by the caches' difference, every one serves, and
// GetStats shows the type each holds.
func TestKVCacheDTypeEndToEnd(t *testing.T) {
	ggufs := map[int]string{16: writeTinyGGUF(t, "q8_0"), 32: writeTinyGGUFHeads(t, "q8_0", 32)}
	type key struct {
		kv      string
		headDim int
	}
	memory := map[key]int64{}
	for _, c := range []struct {
		key
		want string
		warn bool
	}{
		{key{"auto", 16}, "bf16", false},
		{key{"f32", 16}, "f32", false},
		{key{"f16", 16}, "f16", false},
		{key{"q8_0", 16}, "bf16", true},
		{key{"auto", 32}, "bf16", false},
		{key{"q8_0", 32}, "q8_0", false},
		{key{"q4_0", 32}, "q4_0", false},
	} {
		cfg := testConfig(t)
		cfg.ModelRepo = t.TempDir()
		cfg.KVCacheDType = c.kv
		dst := filepath.Join(cfg.ModelRepo, "tiny", "1", "m.gguf")
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(ggufs[c.headDim]); err != nil || os.WriteFile(dst, b, 0o644) != nil {
			t.Fatalf("copying the GGUF: %v", err)
		}
		core, logs := observer.New(zap.InfoLevel)
		d := startDaemonLog(t, Options{Config: cfg}, zap.New(core))
		cl := brokerv1.NewBrokerServiceClient(d.conn)
		ctx := testCtx(t)
		lr, err := cl.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "tiny"})
		if err != nil {
			t.Fatalf("%+v: %v", c.key, err)
		}
		memory[c.key] = int64(lr.GetModel().GetMemoryBytes())
		if placed := logs.FilterMessage("generator placed").All(); len(placed) != 1 || placed[0].ContextMap()["kv_cache_dtype"] != c.want {
			t.Errorf("%+v: the placement's log lines %v, want one with kv_cache_dtype %s", c.key, placed, c.want)
		}
		if warned := logs.FilterMessageSnippet("KV cache type not available").Len(); (warned > 0) != c.warn {
			t.Errorf("%+v: %d warnings that the KV cache type is not available, want some: %v", c.key, warned, c.warn)
		}
		texts, _, err := generateTexts(t, cl, &brokerv1.GenerateRequest{Model: "tiny", Prompts: []string{"a", "b"},
			Sampling: &brokerv1.SamplingParams{Temperature: new(float32), MaxTokens: 4, IgnoreEos: true}})
		if err != nil || len(texts) != 2 {
			t.Fatalf("%+v: generate: %v %v", c.key, texts, err)
		}
		// GetStats (brokerctl stats) says which type the cache holds.
		st, err := cl.GetStats(ctx, &brokerv1.GetStatsRequest{Model: "tiny"})
		if err != nil || len(st.GetStats()) != 2 {
			t.Fatalf("%+v: GetStats: %v %v", c.key, st, err)
		}
		for _, r := range st.GetStats() {
			if got := r.GetGeneration().GetKvCacheDtype(); got != c.want {
				t.Errorf("%+v: GetStats row %q: KV cache type %q, want %s", c.key, r.GetDeviceId(), got, c.want)
			}
		}
	}
	// 2 layers · K and V · 2 heads a position: the f32 cache is twice the
	// bf16 one, so the difference is half of it, a whole number of bf16
	// positions' bytes; a q8_0 cache is 17/32 of a bf16 one.
	const bf16Position = 2 * 2 * 2 * 16 * 2
	if diff := memory[key{"f32", 16}] - memory[key{"auto", 16}]; diff <= 0 || diff%bf16Position != 0 {
		t.Errorf("memory with an f32 cache %d, with the default (bf16) %d: want the f32 one larger by bf16 positions", memory[key{"f32", 16}], memory[key{"auto", 16}])
	}
	if memory[key{"f16", 16}] != memory[key{"auto", 16}] {
		t.Errorf("memory with an f16 cache %d, with the default (bf16) %d: want the same", memory[key{"f16", 16}], memory[key{"auto", 16}])
	}
	if memory[key{"q8_0", 16}] != memory[key{"auto", 16}] {
		t.Errorf("memory with q8_0 asked of 16-dim heads %d, with the default %d: want the same", memory[key{"q8_0", 16}], memory[key{"auto", 16}])
	}
	const q8Position = 2 * 2 * 2 * 34
	if diff := memory[key{"auto", 32}] - memory[key{"q8_0", 32}]; diff <= 0 || diff%(bf16Position*2-q8Position) != 0 {
		t.Errorf("memory of 32-dim heads with a bf16 cache %d, with q8_0 %d: want the bf16 one larger by whole positions", memory[key{"auto", 32}], memory[key{"q8_0", 32}])
	}
	const q4Position = 2 * 2 * 2 * 18
	if diff := memory[key{"q8_0", 32}] - memory[key{"q4_0", 32}]; diff <= 0 || diff%(q8Position-q4Position) != 0 {
		t.Errorf("memory of 32-dim heads with a q8_0 cache %d, with q4_0 %d: want the q8_0 one larger by whole positions", memory[key{"q8_0", 32}], memory[key{"q4_0", 32}])
	}
}
