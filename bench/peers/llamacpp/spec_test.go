package main

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/brokerd/brokerd/bench/benchkit"
	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/repo"
	"github.com/brokerd/brokerd/runtime/onednn"
)

// TestSpecSameTokens: -spec's plumbing on both sides. A random tied model
// (which repeats its input, so guesses by prompt lookup are often right)
// in an F32 GGUF file: brokerd's rounds with guesses (genRound, whose
// steps that take guesses send several tokens in one event) give every
// token, the same as without (guesses change only the rounding of
// attention, far below this model's gaps between its best tokens),
// and its counters show guesses taken; llama.cpp's sequences with
// node-llama-cpp's InputLookupTokenPredictor give its tokens without,
// but at a near tie (its batched rows may round differently), and its
// tokenPredictions show predictions made.
func TestSpecSameTokens(t *testing.T) {
	lib, here, tok := peerSetup(t)
	ctx := context.Background()
	src, root := t.TempDir(), t.TempDir()
	s := modelkit.LLM{Arch: "llama", Layers: 4, Hidden: 256, Heads: 4, KVHeads: 2, Intermediate: 512, Tied: true,
		Vocab: 320, MaxPositions: 512, DType: "f32", Seed: 77, TokenizerDir: tok}
	if _, err := modelkit.WriteLLM(src, s); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "tied", "1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tied.gguf")
	if _, err := modelkit.WriteGGUFQuantized(src, path, "f32", lib.Quantize); err != nil {
		t.Fatal(err)
	}
	r, err := repo.Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := r.Load(ctx, "tied", 1)
	if err != nil {
		t.Fatal(err)
	}
	m := l.LLM
	dev, err := onednn.New(onednn.Options{}).Open(ctx, runtime.DeviceSpec{ID: "cpu:0", DType: runtime.F32})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	const spec, ctxLen = 3, 96
	rng := rand.New(rand.NewPCG(9, 10))
	var jobs []benchkit.Job
	// Random bytes, then a run of one byte, more random bytes and that byte
	// again: the model answers with it, again and again, which both
	// engines' lookups find in the prompt (and brokerd's in the answer).
	for _, n := range []int{6, 17, 30} {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(rng.IntN(256)) // byte tokens
		}
		x := p[n-1]
		for range 8 {
			p = append(p, x)
		}
		p = append(p, int32(rng.IntN(256)), int32(rng.IntN(256)), x)
		jobs = append(jobs, benchkit.Job{Prompt: p, Out: 40})
	}
	eng, err := m.NewEngine(ctx, dev, llm.EngineOptions{CacheBytes: int64(len(jobs)*(ctxLen/llm.DefaultBlockSize+2)) * m.CacheBlockBytes(dev, 0, 0),
		MaxSeqs: len(jobs), MaxStepTokens: 256, DisablePrefixCache: true, MaxDrafts: maxDrafts(spec, len(jobs))})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	off, g0, err := genRound(ctx, m, eng, jobs, len(jobs), 512, 0)
	if err != nil {
		t.Fatal(err)
	}
	on, g, err := genRound(ctx, m, eng, jobs, len(jobs), 512, spec)
	if err != nil {
		t.Fatal(err)
	}
	if g0 != (guesses{}) {
		t.Errorf("brokerd guessed without -spec: %s", g0)
	}
	for i, j := range jobs {
		if len(on.Tokens[i]) != j.Out || !slices.Equal(on.Tokens[i], off.Tokens[i]) {
			t.Errorf("prompt %d: brokerd with guesses %v, without %v", i, on.Tokens[i], off.Tokens[i])
		}
	}
	t.Logf("brokerd: %s", g)
	if g.accepted == 0 {
		t.Errorf("brokerd took no guesses (%s): the tied model no longer repeats, or nothing was counted", g)
	}

	peer, err := startWorker(here)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.close()
	if err := peer.load(path, 2, ctxLen, 1, "F32"); err != nil {
		t.Fatal(err)
	}
	var pg guesses
	for i, j := range jobs {
		p0, err := peer.runMeta([]benchkit.Job{j}, true, 0)
		if err != nil {
			t.Fatal(err)
		}
		p, err := peer.runMeta([]benchkit.Job{j}, true, spec)
		if err != nil {
			t.Fatal(err)
		}
		if len(p0.Predictions) != 0 || len(p.Predictions) != 1 || p.PredictionMax != spec {
			t.Fatalf("prompt %d: predictions %+v without -spec, %+v (up to %d) with", i, p0.Predictions, p.Predictions, p.PredictionMax)
		}
		pg = pg.add(peerGuesses(p))
		want, got := p0.Tokens[0], p.Tokens[0]
		if k := prefix(got, want); k < len(want) {
			if g, ok := nearGap(p0.Near[0][k], got[k]); !ok || g >= tieGap {
				t.Errorf("prompt %d: llama.cpp with predictions %v, without %v", i, got, want)
			} else {
				t.Logf("prompt %d: llama.cpp's tokens with predictions follow those without for %d, then a near tie (%.2g)", i, k, g)
			}
		}
		if held := append(slices.Clone(j.Prompt), got[:len(got)-1]...); !slices.Equal(p.Context[0], held) {
			t.Errorf("prompt %d: llama.cpp's sequence with predictions holds %v, want the prompt and its tokens %v", i, p.Context[0], held)
		}
	}
	t.Logf("llama.cpp: %s", pg)
	if pg.drafted == 0 {
		t.Errorf("llama.cpp made no predictions")
	}
}
