package llm

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// writeCheckpoint writes w in the Hugging Face layout, in shards shards
// (1: model.safetensors) of dtype.
func writeCheckpoint(t *testing.T, dir string, config []byte, w map[string]models.Tensor, shards int, dtype string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, FileConfig), config, 0o600); err != nil {
		t.Fatal(err)
	}
	if shards == 1 {
		if err := safetensors.Write(filepath.Join(dir, FileWeights), w, dtype); err != nil {
			t.Fatal(err)
		}
		return
	}
	parts := make([]map[string]models.Tensor, shards)
	idx := map[string]string{}
	i := 0
	for name, tensor := range w {
		if parts[i%shards] == nil {
			parts[i%shards] = map[string]models.Tensor{}
		}
		parts[i%shards][name] = tensor
		idx[name] = shardName(i%shards, shards)
		i++
	}
	for k, p := range parts {
		if err := safetensors.Write(filepath.Join(dir, shardName(k, shards)), p, dtype); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": idx})
	if err := os.WriteFile(filepath.Join(dir, FileWeightsIndex), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func shardName(k, n int) string {
	return "model-0000" + string(rune('1'+k)) + "-of-0000" + string(rune('0'+n)) + ".safetensors"
}

func TestLoadDir(t *testing.T) {
	ctx := context.Background()
	s := tinyNet("llama")
	w := randomCheckpoint(s, 9)
	ref := refForward(s, w, prompt(7, 2, s.Vocab))
	for _, tc := range []struct {
		name   string
		shards int
		dtype  string
	}{{"single f32", 1, "F32"}, {"three bf16 shards", 3, "BF16"}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeCheckpoint(t, dir, configJSON(t, "llama", nil), w, tc.shards, tc.dtype)
			if err := os.WriteFile(filepath.Join(dir, FileGenerationConfig), []byte(`{"eos_token_id": 7, "max_new_tokens": 9}`), 0o600); err != nil {
				t.Fatal(err)
			}
			m, err := LoadDir(dir, ModelOptions{Name: "l"})
			if err != nil {
				t.Fatal(err)
			}
			if m.DefaultMaxTokens() != 9 || len(m.EOS()) != 3 {
				t.Errorf("generation config: max tokens %d, eos %v", m.DefaultMaxTokens(), m.EOS())
			}
			e, err := m.NewEngine(ctx, &goDevice{}, EngineOptions{CacheBytes: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			e.Reserve(1, 7)
			logits, err := e.stepLogits(ctx, []StepItem{{Seq: 1, Tokens: prompt(7, 2, s.Vocab), Sample: true, State: &Sequence{}}})
			if err != nil {
				t.Fatal(err)
			}
			tol := 1e-4
			if tc.dtype == "BF16" {
				tol = 5e-2 // the checkpoint itself is rounded
			}
			scale := 0.0
			for _, v := range ref[6] {
				scale = max(scale, math.Abs(v))
			}
			for k, v := range ref[6] {
				if d := math.Abs(float64(logits[k])-v) / scale; d > tol {
					t.Fatalf("logit %d: %g, reference %g", k, logits[k], v)
				}
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := LoadDir(dir, ModelOptions{}); err == nil {
			t.Error("empty directory loaded")
		}
		writeCheckpoint(t, dir, configJSON(t, "llama", nil), w, 2, "F32")
		b, _ := json.Marshal(map[string]any{"weight_map": map[string]string{"model.norm.weight": "../outside.safetensors"}})
		os.WriteFile(filepath.Join(dir, FileWeightsIndex), b, 0o600)
		if _, err := LoadDir(dir, ModelOptions{}); !errors.Is(err, models.ErrInvalidInput) || !strings.Contains(err.Error(), "outside") {
			t.Errorf("shard outside the directory: %v", err)
		}
	})
}
