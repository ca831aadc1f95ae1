// Command mkllm writes a random decoder LLM checkpoint (Llama, Qwen2 or
// Qwen3) into a brokerd model repository, in the Hugging Face layout:
// config.json, model.safetensors (or shards with
// model.safetensors.index.json) and generation_config.json, with the
// tokenizer.json and tokenizer_config.json of -tokenizer-dir copied beside
// them. The weights are random (scaled so activations stay finite), for
// benchmarks and tests: the shapes, not the text, are what matter.
//
//	go run ./bench/mkllm -repo /tmp/repo -name qwen-0.5b-shape -arch qwen2 -layers 24 -hidden 896 \
//	    -heads 14 -kv-heads 2 -intermediate 4864 -vocab 151936 -dtype bf16 -tokenizer-dir DIR
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/brokerd/brokerd/bench/modelkit"
)

func main() {
	repo := flag.String("repo", "", "model repository directory (required)")
	name := flag.String("name", "llm-bench", "model name")
	version := flag.Int("version", 1, "model version")
	var s modelkit.LLM
	flag.StringVar(&s.Arch, "arch", "qwen2", "architecture: llama, qwen2 or qwen3")
	flag.IntVar(&s.Layers, "layers", 4, "decoder layers")
	flag.IntVar(&s.Hidden, "hidden", 256, "hidden size")
	flag.IntVar(&s.Heads, "heads", 4, "attention heads")
	flag.IntVar(&s.KVHeads, "kv-heads", 2, "key/value heads (grouped-query attention)")
	flag.IntVar(&s.HeadDim, "head-dim", 0, "head dimension (0: hidden/heads; Qwen3 sets it)")
	flag.IntVar(&s.Intermediate, "intermediate", 1024, "intermediate size of the MLP")
	flag.IntVar(&s.Vocab, "vocab", 0, "vocabulary size (0: the tokenizer's, else 32000)")
	flag.IntVar(&s.MaxPositions, "max-positions", 4096, "max_position_embeddings")
	flag.StringVar(&s.DType, "dtype", "bf16", "stored dtype: f32, f16 or bf16")
	flag.IntVar(&s.Shards, "shards", 1, "safetensors files (more than 1: sharded with the index)")
	flag.BoolVar(&s.Tied, "tied", false, "tie the embeddings and lm_head")
	flag.Uint64Var(&s.Seed, "seed", 1, "random seed of the weights")
	flag.StringVar(&s.TokenizerDir, "tokenizer-dir", "", "directory with tokenizer.json and tokenizer_config.json to copy (the checkpoint takes its vocabulary size and EOS ids)")
	flag.Parse()
	if *repo == "" {
		fmt.Fprintln(os.Stderr, "mkllm:", errors.New("-repo is required"))
		os.Exit(2)
	}
	dir := filepath.Join(*repo, *name, strconv.Itoa(*version))
	params, err := modelkit.WriteLLM(dir, s)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkllm:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s: %s, %d layers, hidden %d, %d parameters (%s)\n", dir, s.Arch, s.Layers, s.Hidden, params, s.DType)
}
