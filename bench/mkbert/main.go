// Command mkbert writes a random BERT checkpoint into a brokerd model
// repository, for benchmarks: a Hugging Face directory (config.json,
// model.safetensors, tokenizer.json) plus brokerd.json. Its WordPiece
// vocabulary holds every word brokerctl bench generates, so a bench text of
// N words is about N tokens; it prints the token counts bench texts of the
// sizes given with -sizes get.
//
//	go run ./bench/mkbert -repo /tmp/repo -name bert-4x256 -layers 4 -hidden 256 -heads 4 -intermediate 1024 -sizes 70,600
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/cmd/brokerctl/cli"
	"github.com/brokerd/brokerd/runtime/models/tokenizer"
)

func main() {
	repo := flag.String("repo", "", "model repository directory (required)")
	name := flag.String("name", "bert-bench", "model name")
	version := flag.Int("version", 1, "model version")
	var b modelkit.BERT
	flag.IntVar(&b.Layers, "layers", 4, "encoder layers")
	flag.IntVar(&b.Hidden, "hidden", 256, "hidden size")
	flag.IntVar(&b.Heads, "heads", 4, "attention heads")
	flag.IntVar(&b.Intermediate, "intermediate", 1024, "intermediate size")
	flag.IntVar(&b.MaxPositions, "max-positions", 512, "max_position_embeddings")
	flag.IntVar(&b.BaseBatch, "base-batch", 32, "brokerd.json base_batch")
	flag.IntVar(&b.Vocab, "vocab", 0, "vocabulary size, padded with [unusedN] tokens (0: the bench words and letters only; bert-base has 30522)")
	flag.Uint64Var(&b.Seed, "seed", 1, "random seed of the weights")
	labels := flag.String("labels", "", "comma-separated labels: a classifier (BertForSequenceClassification) instead of an encoder")
	sizes := flag.String("sizes", "", "comma-separated bench --text-bytes values to report token counts for")
	flag.Parse()
	if *repo == "" {
		fmt.Fprintln(os.Stderr, "mkbert: -repo is required")
		os.Exit(2)
	}
	if *labels != "" {
		b.Labels = strings.Split(*labels, ",")
	}
	dir := filepath.Join(*repo, *name, strconv.Itoa(*version))
	if err := modelkit.WriteBERT(dir, b); err != nil {
		fmt.Fprintln(os.Stderr, "mkbert:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", dir)
	if *sizes != "" {
		if err := report(dir, *sizes, b.MaxPositions); err != nil {
			fmt.Fprintln(os.Stderr, "mkbert:", err)
			os.Exit(1)
		}
	}
}

// report prints the token counts of the texts bench sends at each size.
func report(dir, sizes string, maxPos int) error {
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return err
	}
	for _, f := range strings.Split(sizes, ",") {
		size, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("-sizes: %w", err)
		}
		lo, hi, sum, n := math.MaxInt, 0, 0, 0
		for worker := range uint64(64) {
			ids, _, err := tok.Encode(cli.BenchText(1, 64, worker, size), "", maxPos, true)
			if err != nil {
				return err
			}
			lo, hi, sum, n = min(lo, len(ids)), max(hi, len(ids)), sum+len(ids), n+1
		}
		fmt.Printf("--text-bytes %d: %.1f tokens on average (%d to %d) with [CLS] and [SEP]\n", size, float64(sum)/float64(n), lo, hi)
	}
	return nil
}
