package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/brokerd/brokerd/runtime/models/repo"
)

// TestCheckpointsLoad: each architecture mkllm writes, single-file and
// sharded, is a model the repository loads as a decoder LLM.
func TestCheckpointsLoad(t *testing.T) {
	root := t.TempDir()
	cases := []struct {
		arch   string
		shards int
		dtype  string
	}{{"llama", 1, "bf16"}, {"qwen2", 3, "f16"}, {"qwen3", 1, "f32"}}
	for _, c := range cases {
		s := shape{arch: archs[c.arch], layers: 2, hidden: 64, heads: 4, kvHeads: 2, inter: 96, vocab: 300, positions: 256, ropeTheta: 1e6, eos: []int{2}}
		if c.arch == "qwen3" {
			s.headDim = 32
		}
		if err := run(root, c.arch, 1, s, c.dtype, c.shards, 1, ""); err != nil {
			t.Fatalf("%s: %v", c.arch, err)
		}
	}
	r, err := repo.Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		l, err := r.Load(context.Background(), c.arch, 1)
		if err != nil {
			t.Fatalf("%s: %v", c.arch, err)
		}
		if l.LLM == nil || l.LLM.Arch() != archs[c.arch] || fmt.Sprint(l.LLM.EOS()) != "[2]" {
			t.Errorf("%s: %+v", c.arch, l)
		}
	}
	if err := run(root, "bad", 1, shape{arch: archs["llama"], heads: 3, kvHeads: 2}, "bf16", 1, 1, ""); err == nil {
		t.Error("heads not a multiple of kv heads was accepted")
	}
}
