// Command mkmodels writes the first models to try into a brokerd model
// repository: a small BERT encoder (bert-mini), a BERT classifier
// (sentiment), an MLP (mlp) and a small chat model with Qwen3's real
// tokenizer and chat template (qwen-tiny). Their weights are random: they
// show what brokerd does with each kind of model (batching, devices,
// streaming, the APIs), not useful answers; put real Hugging Face
// downloads beside them for that (layout in runtime/models/repo/README.md).
//
//	go run ./bench/mkmodels -repo .cache/state/models     # what make models runs
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/brokerd/brokerd/bench/modelkit"
)

func main() {
	repo := flag.String("repo", "", "model repository directory (required; make run's is .cache/state/models)")
	tokDir := flag.String("tokenizer-dir", "runtime/models/tokenizer/bpe/testdata/qwen3", "directory with the chat model's tokenizer.json and tokenizer_config.json (.zst accepted)")
	flag.Parse()
	if *repo == "" {
		fmt.Fprintln(os.Stderr, "mkmodels: -repo is required")
		os.Exit(2)
	}
	if err := write(*repo, *tokDir); err != nil {
		fmt.Fprintln(os.Stderr, "mkmodels:", err)
		os.Exit(1)
	}
	fmt.Printf(`
Next, with brokerd running (make run):
  bin/brokerctl models
  bin/brokerctl load bert-mini && bin/brokerctl encode --model bert-mini --fidelity both < examples/records.txt
  bin/brokerctl load sentiment && bin/brokerctl infer sentiment --input text=@examples/sentences.json
  bin/brokerctl load mlp && bin/brokerctl infer mlp --input input=@examples/rows.json
  bin/brokerctl load qwen-tiny && bin/brokerctl chat --model qwen-tiny --max-tokens 24 --message user="Hello"
`)
}

// write puts the four models in repo as version 1 each.
func write(repo, tokDir string) error {
	dir := func(name string) string { return filepath.Join(repo, name, "1") }
	if err := modelkit.WriteBERT(dir("bert-mini"), modelkit.BERT{Layers: 2, Hidden: 128, Heads: 2, Intermediate: 512, Seed: 1}); err != nil {
		return fmt.Errorf("bert-mini: %w", err)
	}
	fmt.Println("wrote", dir("bert-mini"), "(BERT encoder: 2 layers, hidden 128, 128-dimensional vectors)")
	if err := modelkit.WriteBERT(dir("sentiment"), modelkit.BERT{Layers: 2, Hidden: 128, Heads: 2, Intermediate: 512, Seed: 2,
		Labels: []string{"negative", "positive"}}); err != nil {
		return fmt.Errorf("sentiment: %w", err)
	}
	fmt.Println("wrote", dir("sentiment"), "(BERT classifier: labels negative, positive)")
	if _, err := modelkit.WriteMLP(dir("mlp"), modelkit.MLP{In: 4, Hidden: 16, Out: 3, Seed: 3}); err != nil {
		return fmt.Errorf("mlp: %w", err)
	}
	fmt.Println("wrote", dir("mlp"), "(MLP: 4 inputs, 16 hidden, 3 outputs)")
	params, err := modelkit.WriteLLM(dir("qwen-tiny"), modelkit.LLM{Arch: "qwen3", Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, HeadDim: 16,
		Intermediate: 128, MaxPositions: 4096, DType: "bf16", Seed: 4, TokenizerDir: tokDir})
	if err != nil {
		return fmt.Errorf("qwen-tiny: %w", err)
	}
	fmt.Printf("wrote %s (Qwen3 architecture, 2 layers, %d parameters, Qwen3's tokenizer and chat template)\n", dir("qwen-tiny"), params)
	return nil
}
