package modelkit

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/brokerd/brokerd/cmd/brokerctl/cli"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// BERT is an encoder's sizes. With Labels it is a BertForSequenceClassification
// (pooler and classifier head, answers a label per text), else a BertModel
// (answers a mean-pooled, normalised vector per text).
type BERT struct {
	Layers, Hidden, Heads, Intermediate int
	MaxPositions                        int // 0: 512
	// Vocab pads the vocabulary with [unusedN] tokens up to this size (a
	// real model's, e.g. 30522), so the embedding table has its real cost.
	Vocab     int
	BaseBatch int // brokerd.json base_batch; 0: 32
	Labels    []string
	Seed      uint64
}

// Encoder shapes of real models, for benchmarks: MiniLM-L6 (6 × 384) and
// BERT-base (12 × 768), with BERT's vocabulary size.
var (
	MiniLM   = BERT{Layers: 6, Hidden: 384, Heads: 12, Intermediate: 1536, Vocab: 30522, Seed: 1}
	BERTBase = BERT{Layers: 12, Hidden: 768, Heads: 12, Intermediate: 3072, Vocab: 30522, Seed: 2}
	// EncoderShapes names them for command-line flags.
	EncoderShapes = map[string]BERT{"minilm": MiniLM, "base": BERTBase}
)

// WriteBERT writes b as a Hugging Face directory dir: config.json,
// model.safetensors, a WordPiece tokenizer.json (lowercase English: the
// bench's words and every letter, so any text tokenises) and brokerd.json.
func WriteBERT(dir string, b BERT) error {
	if b.Layers <= 0 || b.Hidden <= 0 || b.Heads <= 0 || b.Intermediate <= 0 || b.Hidden%b.Heads != 0 {
		return errors.New("layers, hidden, heads and intermediate must be positive, hidden a multiple of heads")
	}
	if b.MaxPositions == 0 {
		b.MaxPositions = 512
	}
	if b.BaseBatch == 0 {
		b.BaseBatch = 32
	}
	return write(dir, b)
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

func write(dir string, b BERT) error {
	layers, h, heads, inter, maxPos, seed := b.Layers, b.Hidden, b.Heads, b.Intermediate, b.MaxPositions, b.Seed
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	vocab := vocabulary()
	for i := 0; len(vocab) < b.Vocab; i++ {
		vocab = append(vocab, fmt.Sprintf("[unused%d]", i))
	}
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
	arch := "BertModel"
	if len(b.Labels) > 0 {
		// The head of BertForSequenceClassification: tanh pooler over [CLS],
		// then a linear layer to the labels.
		w["pooler.dense.weight"], w["pooler.dense.bias"] = randT(h, h), randT(h)
		w["classifier.weight"], w["classifier.bias"] = randT(len(b.Labels), h), randT(len(b.Labels))
		arch = "BertForSequenceClassification"
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), w, "F32"); err != nil {
		return err
	}
	config := map[string]any{
		"architectures": []string{arch}, "model_type": "bert",
		"hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
		"intermediate_size": inter, "max_position_embeddings": maxPos, "type_vocab_size": 2,
		"vocab_size": len(vocab), "layer_norm_eps": 1e-12, "hidden_act": "gelu",
		"pad_token_id": 0, "position_embedding_type": "absolute",
	}
	if len(b.Labels) > 0 {
		id2label := map[string]string{}
		for i, l := range b.Labels {
			id2label[fmt.Sprint(i)] = l
		}
		config["id2label"], config["num_labels"] = id2label, len(b.Labels)
	}
	brokerd := map[string]any{"kind": "bert", "pooling": "mean", "normalize": true, "base_batch": b.BaseBatch}
	if len(b.Labels) > 0 {
		brokerd = map[string]any{"base_batch": b.BaseBatch}
	}
	for file, v := range map[string]any{"config.json": config, "tokenizer.json": tokenizerJSON(vocab), "brokerd.json": brokerd} {
		if err := writeJSON(filepath.Join(dir, file), v); err != nil {
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
