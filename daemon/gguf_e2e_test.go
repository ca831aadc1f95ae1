package daemon

import (
	"errors"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/brokerd/brokerd/bench/modelkit"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestGGUFEqualsSafetensors: a version directory holding one .gguf file is
// a generator model (issue 21). The same random checkpoint written as
// safetensors and as GGUF (f32, f16 and bf16; Llama, whose q and k rows
// llama.cpp's converter reorders, and Qwen3) generates the same greedy
// tokens with logprobs within 1e-5, and the GGUF one chats through its
// own chat template over HTTP.
func TestGGUFEqualsSafetensors(t *testing.T) {
	cfg := httpTestConfig(t)
	tokDir := t.TempDir()
	writeByteTokenizer(t, tokDir, chatMLTemplate)
	type pair struct{ st, gg string }
	var pairs []pair
	for _, c := range []struct{ arch, dtype string }{{"llama", "f32"}, {"qwen3", "bf16"}, {"llama", "f16"}} {
		st, gg := c.arch+"-"+c.dtype+"-st", c.arch+"-"+c.dtype+"-gguf"
		stDir := versionDir(t, cfg.ModelRepo, st, 1)
		// Heads of 16 dimensions: the llama q/k reordering moves rows.
		if _, err := modelkit.WriteLLM(stDir, modelkit.LLM{Arch: c.arch, Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, Intermediate: 96,
			MaxPositions: 256, DType: c.dtype, Seed: 7, TokenizerDir: tokDir}); err != nil {
			t.Fatal(err)
		}
		if _, err := modelkit.WriteGGUF(stDir, filepath.Join(versionDir(t, cfg.ModelRepo, gg, 1), gg+".gguf"), c.dtype); err != nil {
			t.Fatal(err)
		}
		pairs = append(pairs, pair{st, gg})
		cfg.LoadModels += st + "," + gg + ","
	}
	cfg.LoadModels = strings.TrimSuffix(cfg.LoadModels, ",")
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	ctx := testCtx(t)

	// ListModels describes the files: format, family, type, size,
	// parameters, context.
	ms, err := c.ListModels(ctx, &brokerv1.ListModelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms.GetModels() {
		switch m.GetName() {
		case "llama-f16-gguf":
			if m.GetFormat() != "gguf" || m.GetFamily() != "llama" || m.GetQuantization() != "F16" || m.GetFileBytes() == 0 ||
				m.GetParameterCount() == 0 || m.GetParameterSize() == "" || m.GetContextLength() != 256 {
				t.Errorf("details of the f16 GGUF: %v", m)
			}
		case "qwen3-bf16-st":
			if m.GetFormat() != "safetensors" || m.GetFamily() != "qwen3" || m.GetFileBytes() == 0 || m.GetContextLength() != 256 {
				t.Errorf("details of the bf16 safetensors: %v", m)
			}
		}
	}

	generate := func(model string) ([]int32, []float32) {
		t.Helper()
		st, err := c.Generate(ctx, &brokerv1.GenerateRequest{Model: model, Prompts: []string{"The quick brown fox"},
			Sampling: &brokerv1.SamplingParams{MaxTokens: 16, IgnoreEos: true, Logprobs: true, Temperature: proto.Float32(0)}})
		if err != nil {
			t.Fatal(err)
		}
		var ids []int32
		var lps []float32
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return ids, lps
			}
			if err != nil {
				t.Fatalf("%s: %v", model, err)
			}
			for _, dl := range m.GetDeltas() {
				ids = append(ids, dl.GetTokenIds()...)
				for _, lp := range dl.GetLogprobs() {
					lps = append(lps, lp.GetChosen().GetLogprob())
				}
			}
		}
	}
	for _, p := range pairs {
		wantIDs, wantLPs := generate(p.st)
		gotIDs, gotLPs := generate(p.gg)
		if len(wantIDs) != 16 || !slices.Equal(gotIDs, wantIDs) {
			t.Errorf("%s greedy tokens %v, %s gives %v", p.gg, gotIDs, p.st, wantIDs)
			continue
		}
		for i := range wantLPs {
			if d := math.Abs(float64(gotLPs[i] - wantLPs[i])); d > 1e-5*max(1, math.Abs(float64(wantLPs[i]))) {
				t.Errorf("%s token %d logprob %g, %s gives %g", p.gg, i, gotLPs[i], p.st, wantLPs[i])
			}
		}
	}

	// The chat template comes from the file's tokenizer.chat_template.
	resp, err := http.Post("http://"+d.addrs.HTTP+"/api/chat", "application/json", strings.NewReader(
		`{"model": "`+pairs[0].gg+`", "stream": false, "options": {"num_predict": 4}, "messages": [{"role": "user", "content": "hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"done":true`) {
		t.Errorf("/api/chat on a GGUF model: %d %s", resp.StatusCode, b)
	}
}
