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
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/brokerd/brokerd/cmd/brokerctl/cli"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/tokenizer"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

func main() {
	repo := flag.String("repo", "", "model repository directory (required)")
	name := flag.String("name", "bert-bench", "model name")
	version := flag.Int("version", 1, "model version")
	layers := flag.Int("layers", 4, "encoder layers")
	hidden := flag.Int("hidden", 256, "hidden size")
	heads := flag.Int("heads", 4, "attention heads")
	inter := flag.Int("intermediate", 1024, "intermediate size")
	maxPos := flag.Int("max-positions", 512, "max_position_embeddings")
	baseBatch := flag.Int("base-batch", 32, "brokerd.json base_batch")
	seed := flag.Uint64("seed", 1, "random seed of the weights")
	sizes := flag.String("sizes", "", "comma-separated bench --text-bytes values to report token counts for")
	flag.Parse()
	if *repo == "" {
		fmt.Fprintln(os.Stderr, "mkbert: -repo is required")
		os.Exit(2)
	}
	dir := filepath.Join(*repo, *name, strconv.Itoa(*version))
	if err := write(dir, *layers, *hidden, *heads, *inter, *maxPos, *baseBatch, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "mkbert:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", dir)
	if *sizes != "" {
		if err := report(dir, *sizes, *maxPos); err != nil {
			fmt.Fprintln(os.Stderr, "mkbert:", err)
			os.Exit(1)
		}
	}
}

func vocabulary() []string {
	v := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "?"}
	for c := 'a'; c <= 'z'; c++ {
		v = append(v, string(c), "##"+string(c))
	}
	seen := map[string]bool{}
	for _, w := range v {
		seen[w] = true
	}
	for _, w := range cli.BenchWords() {
		if !seen[w] {
			seen[w] = true
			v = append(v, w)
		}
	}
	return v
}

func write(dir string, layers, h, heads, inter, maxPos, baseBatch int, seed uint64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	vocab := vocabulary()
	rng := rand.New(rand.NewPCG(seed, 0x6d6b62657274))
	randT := func(shape ...int) models.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		// Scaled like a trained model's weights, so activations stay in range.
		scale := 1 / math.Sqrt(float64(shape[len(shape)-1]))
		t := models.Tensor{Shape: shape, Data: make([]float32, n)}
		for i := range t.Data {
			t.Data[i] = float32(rng.NormFloat64() * scale)
		}
		return t
	}
	ones := func(n int) models.Tensor {
		t := models.Tensor{Shape: []int{n}, Data: make([]float32, n)}
		for i := range t.Data {
			t.Data[i] = 1
		}
		return t
	}
	w := map[string]models.Tensor{
		"embeddings.word_embeddings.weight":       randT(len(vocab), h),
		"embeddings.position_embeddings.weight":   randT(maxPos, h),
		"embeddings.token_type_embeddings.weight": randT(2, h),
		"embeddings.LayerNorm.weight":             ones(h),
		"embeddings.LayerNorm.bias":               randT(h),
	}
	for l := range layers {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		for _, n := range []string{"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"} {
			w[p+n+".weight"], w[p+n+".bias"] = randT(h, h), randT(h)
		}
		w[p+"intermediate.dense.weight"], w[p+"intermediate.dense.bias"] = randT(inter, h), randT(inter)
		w[p+"output.dense.weight"], w[p+"output.dense.bias"] = randT(h, inter), randT(h)
		for _, n := range []string{"attention.output.LayerNorm", "output.LayerNorm"} {
			w[p+n+".weight"], w[p+n+".bias"] = ones(h), randT(h)
		}
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), w, "F32"); err != nil {
		return err
	}
	config := map[string]any{
		"architectures": []string{"BertModel"}, "model_type": "bert",
		"hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
		"intermediate_size": inter, "max_position_embeddings": maxPos, "type_vocab_size": 2,
		"vocab_size": len(vocab), "layer_norm_eps": 1e-12, "hidden_act": "gelu",
		"pad_token_id": 0, "position_embedding_type": "absolute",
	}
	brokerd := map[string]any{"kind": "bert", "pooling": "mean", "normalize": true, "base_batch": baseBatch}
	for file, v := range map[string]any{"config.json": config, "tokenizer.json": tokenizerJSON(vocab), "brokerd.json": brokerd} {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func tokenizerJSON(vocab []string) map[string]any {
	ids := map[string]int{}
	for i, t := range vocab {
		ids[t] = i
	}
	var added []any
	for i := range 5 {
		added = append(added, map[string]any{"id": i, "content": vocab[i], "special": true, "normalized": false})
	}
	st := func(id string, typ int) any {
		return map[string]any{"SpecialToken": map[string]any{"id": id, "type_id": typ}}
	}
	seq := func(id string, typ int) any {
		return map[string]any{"Sequence": map[string]any{"id": id, "type_id": typ}}
	}
	return map[string]any{
		"version": "1.0", "added_tokens": added,
		"normalizer": map[string]any{"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
			"strip_accents": nil, "lowercase": true},
		"pre_tokenizer": map[string]any{"type": "BertPreTokenizer"},
		"post_processor": map[string]any{
			"type":   "TemplateProcessing",
			"single": []any{st("[CLS]", 0), seq("A", 0), st("[SEP]", 0)},
			"pair":   []any{st("[CLS]", 0), seq("A", 0), st("[SEP]", 0), seq("B", 1), st("[SEP]", 1)},
			"special_tokens": map[string]any{
				"[CLS]": map[string]any{"id": "[CLS]", "ids": []int{2}, "tokens": []string{"[CLS]"}},
				"[SEP]": map[string]any{"id": "[SEP]", "ids": []int{3}, "tokens": []string{"[SEP]"}},
			},
		},
		"model": map[string]any{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
			"max_input_chars_per_word": 100, "vocab": ids},
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
