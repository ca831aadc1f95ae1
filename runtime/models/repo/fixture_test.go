package repo

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// Tiny model fixtures, generated into t.TempDir(): random weights, so every
// check compares against what the fixture wrote.

func writeFile(t *testing.T, path string, v any) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	var b []byte
	switch x := v.(type) {
	case string:
		b = []byte(x)
	default:
		var err error
		if b, err = json.MarshalIndent(v, "", " "); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func randTensor(rng *rand.Rand, shape ...int) models.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	t := models.Tensor{Shape: shape, Data: make([]float32, n)}
	for i := range t.Data {
		t.Data[i] = float32(rng.NormFloat64() * 0.1)
	}
	return t
}

// mlpFixture is a random MLP 16 → 32 → 4 using every layer type.
type mlpFixture struct {
	spec    map[string]any
	weights map[string]models.Tensor
}

func newMLPFixture(seed uint64) mlpFixture {
	rng := rand.New(rand.NewPCG(seed, 1))
	return mlpFixture{
		spec: map[string]any{
			"kind":    "mlp",
			"inputs":  []any{map[string]any{"name": "x", "dims": []int{16}}},
			"outputs": []any{map[string]any{"name": "y"}},
			"layers": []any{
				map[string]any{"type": "linear", "weight": "l1.weight", "bias": "l1.bias"},
				map[string]any{"type": "relu"},
				map[string]any{"type": "layernorm", "weight": "ln.weight", "bias": "ln.bias", "eps": 1e-5},
				map[string]any{"type": "gelu"},
				map[string]any{"type": "linear", "weight": "l2.weight", "bias": "l2.bias"},
				map[string]any{"type": "tanh"},
				map[string]any{"type": "softmax"},
			},
			"base_batch": 8,
		},
		weights: map[string]models.Tensor{
			"l1.weight": randTensor(rng, 32, 16), "l1.bias": randTensor(rng, 32),
			"ln.weight": randTensor(rng, 32), "ln.bias": randTensor(rng, 32),
			"l2.weight": randTensor(rng, 4, 32), "l2.bias": randTensor(rng, 4),
		},
	}
}

func (f mlpFixture) write(t *testing.T, dir string) {
	t.Helper()
	writeFile(t, filepath.Join(dir, FileMLPSpec), f.spec)
	if err := safetensors.Write(filepath.Join(dir, FileWeights), f.weights, "F32"); err != nil {
		t.Fatal(err)
	}
}

// Tiny BERT: 2 layers, hidden 64, 4 heads, intermediate 128.
const (
	bertHidden = 64
	bertLayers = 2
	bertInter  = 128
	bertVocab  = 40
	bertMaxPos = 32
)

var bertTokens = []string{
	"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "jump",
	"##s", "##ed", "over", "lazy", "dog", "cafe", "hello", "world", ",", ".",
	"!", "?", "un", "##believ", "##able", "a", "b", "c", "is", "it",
}

func tokenizerJSON() map[string]any {
	vocab := map[string]int{}
	for i, tok := range bertTokens {
		vocab[tok] = i
	}
	var added []any
	for i := 0; i < 5; i++ {
		added = append(added, map[string]any{"id": i, "content": bertTokens[i], "special": true, "normalized": false})
	}
	st := func(id string, typ int) any {
		return map[string]any{"SpecialToken": map[string]any{"id": id, "type_id": typ}}
	}
	seq := func(id string, typ int) any {
		return map[string]any{"Sequence": map[string]any{"id": id, "type_id": typ}}
	}
	return map[string]any{
		"version":      "1.0",
		"added_tokens": added,
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
			"max_input_chars_per_word": 100, "vocab": vocab},
	}
}

// bertFixture is a random tiny BERT checkpoint. canonical holds the weights
// under BertModel's names; the file names depend on the options.
type bertFixture struct {
	config    map[string]any
	canonical map[string]models.Tensor
	// prefix stores names as "bert.…" (BertFor* checkpoints); gammaBeta
	// stores LayerNorm parameters as gamma/beta; classifier adds the
	// pooler and a 3-label head.
	prefix, gammaBeta, classifier bool
	dtype                         string
}

func newBERTFixture(seed uint64) *bertFixture {
	rng := rand.New(rand.NewPCG(seed, 2))
	h := bertHidden
	w := map[string]models.Tensor{
		"embeddings.word_embeddings.weight":       randTensor(rng, bertVocab, h),
		"embeddings.position_embeddings.weight":   randTensor(rng, bertMaxPos, h),
		"embeddings.token_type_embeddings.weight": randTensor(rng, 2, h),
		"embeddings.LayerNorm.weight":             randTensor(rng, h),
		"embeddings.LayerNorm.bias":               randTensor(rng, h),
		"pooler.dense.weight":                     randTensor(rng, h, h),
		"pooler.dense.bias":                       randTensor(rng, h),
	}
	for l := range bertLayers {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		for _, n := range []string{"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"} {
			w[p+n+".weight"] = randTensor(rng, h, h)
			w[p+n+".bias"] = randTensor(rng, h)
		}
		w[p+"intermediate.dense.weight"] = randTensor(rng, bertInter, h)
		w[p+"intermediate.dense.bias"] = randTensor(rng, bertInter)
		w[p+"output.dense.weight"] = randTensor(rng, h, bertInter)
		w[p+"output.dense.bias"] = randTensor(rng, h)
		for _, n := range []string{"attention.output.LayerNorm", "output.LayerNorm"} {
			w[p+n+".weight"] = randTensor(rng, h)
			w[p+n+".bias"] = randTensor(rng, h)
		}
	}
	return &bertFixture{
		canonical: w,
		dtype:     "F32",
		config: map[string]any{
			"architectures":                []string{"BertModel"},
			"model_type":                   "bert",
			"hidden_size":                  h,
			"num_hidden_layers":            bertLayers,
			"num_attention_heads":          4,
			"intermediate_size":            bertInter,
			"max_position_embeddings":      bertMaxPos,
			"type_vocab_size":              2,
			"vocab_size":                   bertVocab,
			"layer_norm_eps":               1e-12,
			"hidden_act":                   "gelu",
			"hidden_dropout_prob":          0.1,
			"attention_probs_dropout_prob": 0.1,
			"pad_token_id":                 0,
			"position_embedding_type":      "absolute",
		},
	}
}

func (f *bertFixture) asClassifier(rng *rand.Rand) *bertFixture {
	f.classifier = true
	f.canonical["classifier.weight"] = randTensor(rng, 3, bertHidden)
	f.canonical["classifier.bias"] = randTensor(rng, 3)
	f.config["architectures"] = []string{"BertForSequenceClassification"}
	f.config["id2label"] = map[string]string{"0": "contradiction", "1": "entailment", "2": "neutral"}
	f.config["label2id"] = map[string]int{"contradiction": 0, "entailment": 1, "neutral": 2}
	return f
}

// fileName is the name a canonical tensor has in this fixture's file.
func (f *bertFixture) fileName(canon string) string {
	n := canon
	if f.gammaBeta && strings.Contains(n, "LayerNorm.") {
		if s, ok := strings.CutSuffix(n, ".weight"); ok {
			n = s + ".gamma"
		} else if s, ok := strings.CutSuffix(n, ".bias"); ok {
			n = s + ".beta"
		}
	}
	if f.prefix && !strings.HasPrefix(canon, "classifier.") {
		n = "bert." + n
	}
	return n
}

func (f *bertFixture) write(t *testing.T, dir string) {
	t.Helper()
	writeFile(t, filepath.Join(dir, FileConfig), f.config)
	writeFile(t, filepath.Join(dir, FileTokenizer), tokenizerJSON())
	file := map[string]models.Tensor{}
	for canon, v := range f.canonical {
		file[f.fileName(canon)] = v
	}
	if err := safetensors.Write(filepath.Join(dir, FileWeights), file, f.dtype); err != nil {
		t.Fatal(err)
	}
}
