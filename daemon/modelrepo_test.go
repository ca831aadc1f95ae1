package daemon

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

// A model repository made by the tests: random MLPs and tiny random BERTs
// with a WordPiece tokenizer.json, in the layout brokerd reads
// (DIR/NAME/VERSION/).

// mlpRef is an MLP written to the repository, kept for the reference
// forward pass (modelkit.MLP.Forward).
type mlpRef struct {
	out int
	m   modelkit.MLP
	w   map[string]models.Tensor
}

func randTensor(r *rand.Rand, scale float64, shape ...int) models.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return models.Tensor{Shape: shape, Data: v}
}

func writeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func versionDir(t testing.TB, repo, name string, version int64) string {
	t.Helper()
	dir := filepath.Join(repo, name, strconv.FormatInt(version, 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// writeMLP writes a random MLP with the given widths as NAME/VERSION.
func writeMLP(t testing.TB, repo, name string, version int64, seed uint64, in, hidden, out int) *mlpRef {
	t.Helper()
	m := modelkit.MLP{In: in, Hidden: hidden, Out: out, Seed: seed}
	w, err := modelkit.WriteMLP(versionDir(t, repo, name, version), m)
	if err != nil {
		t.Fatal(err)
	}
	return &mlpRef{out: out, m: m, w: w}
}

// forward is the float64 reference of one row.
func (m *mlpRef) forward(x []float32) []float64 { return m.m.Forward(m.w, x) }

// testVocab is a small uncased WordPiece vocabulary; ids are positions.
var testVocab = []string{
	"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
	"the", "quick", "brown", "fox", "jump", "##s", "##ed", "over", "lazy", "dog",
	"memory", "record", "council", "advisor", "vote", "a", "b", "c", "is", "it",
	"what", "good", "bad", "yes", "no", ",", ".", "!", "?", "run", "##ning", "go",
	"tea", "coffee", "cat",
}

// tokenizerDoc is a bert-base-uncased style tokenizer.json over testVocab.
func tokenizerDoc() map[string]any {
	vocab := map[string]int{}
	for i, tok := range testVocab {
		vocab[tok] = i
	}
	var added []any
	for i := range 5 {
		added = append(added, map[string]any{"id": i, "content": testVocab[i], "single_word": false,
			"lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	special := func(id string, typeID int) any {
		return map[string]any{"SpecialToken": map[string]any{"id": id, "type_id": typeID}}
	}
	seq := func(id string, typeID int) any {
		return map[string]any{"Sequence": map[string]any{"id": id, "type_id": typeID}}
	}
	return map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added,
		"normalizer": map[string]any{"type": "BertNormalizer", "clean_text": true,
			"handle_chinese_chars": true, "strip_accents": nil, "lowercase": true},
		"pre_tokenizer": map[string]any{"type": "BertPreTokenizer"},
		"post_processor": map[string]any{
			"type":   "TemplateProcessing",
			"single": []any{special("[CLS]", 0), seq("A", 0), special("[SEP]", 0)},
			"pair":   []any{special("[CLS]", 0), seq("A", 0), special("[SEP]", 0), seq("B", 1), special("[SEP]", 1)},
			"special_tokens": map[string]any{
				"[CLS]": map[string]any{"id": "[CLS]", "ids": []int{2}, "tokens": []string{"[CLS]"}},
				"[SEP]": map[string]any{"id": "[SEP]", "ids": []int{3}, "tokens": []string{"[SEP]"}},
			},
		},
		"decoder": map[string]any{"type": "WordPiece", "prefix": "##", "cleanup": true},
		"model": map[string]any{"type": "WordPiece", "unk_token": "[UNK]",
			"continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": vocab},
	}
}

// Tiny BERT of the tests: 2 layers, hidden 64, 4 heads, intermediate 128.
const (
	tinyHidden = 64
	tinyInter  = 128
	tinyLayers = 2
	tinyMaxPos = 16
)

// writeBERT writes a tiny random BERT (an encoder, or a classifier with
// labels outputs) as NAME/VERSION.
func writeBERT(t testing.TB, repo, name string, version int64, seed uint64, labels int) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 11))
	dir := versionDir(t, repo, name, version)
	h := tinyHidden
	ln := func(prefix string, w map[string]models.Tensor) {
		g := randTensor(r, 0.05, h)
		for i := range g.Data {
			g.Data[i] += 1
		}
		w[prefix+".weight"], w[prefix+".bias"] = g, randTensor(r, 0.05, h)
	}
	w := map[string]models.Tensor{
		"embeddings.word_embeddings.weight":       randTensor(r, 0.5, len(testVocab), h),
		"embeddings.position_embeddings.weight":   randTensor(r, 0.1, tinyMaxPos, h),
		"embeddings.token_type_embeddings.weight": randTensor(r, 0.1, 2, h),
	}
	ln("embeddings.LayerNorm", w)
	for l := range tinyLayers {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		for _, lin := range []struct {
			name    string
			out, in int
		}{
			{"attention.self.query", h, h}, {"attention.self.key", h, h}, {"attention.self.value", h, h},
			{"attention.output.dense", h, h}, {"intermediate.dense", tinyInter, h}, {"output.dense", h, tinyInter},
		} {
			w[p+lin.name+".weight"] = randTensor(r, 1/math.Sqrt(float64(lin.in)), lin.out, lin.in)
			w[p+lin.name+".bias"] = randTensor(r, 0.02, lin.out)
		}
		ln(p+"attention.output.LayerNorm", w)
		ln(p+"output.LayerNorm", w)
	}
	cfg := map[string]any{
		"model_type": "bert", "vocab_size": len(testVocab), "hidden_size": h, "num_hidden_layers": tinyLayers,
		"num_attention_heads": 4, "intermediate_size": tinyInter, "hidden_act": "gelu",
		"max_position_embeddings": tinyMaxPos, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
		"architectures": []string{"BertModel"},
	}
	if labels > 0 {
		w["pooler.dense.weight"] = randTensor(r, 1/math.Sqrt(float64(h)), h, h)
		w["pooler.dense.bias"] = randTensor(r, 0.02, h)
		w["classifier.weight"] = randTensor(r, 1/math.Sqrt(float64(h)), labels, h)
		w["classifier.bias"] = randTensor(r, 0.02, labels)
		cfg["architectures"] = []string{"BertForSequenceClassification"}
		cfg["num_labels"] = labels
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), w, "F32"); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(dir, "config.json"), cfg)
	writeJSON(t, filepath.Join(dir, "tokenizer.json"), tokenizerDoc())
}

// f32le and bytesLE build raw tensor data.
func f32le(v []float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, f := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

func bytesLE(elems ...string) []byte {
	var b []byte
	for _, e := range elems {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	return b
}

// fromBytesLE reads the n elements of a BYTES tensor's data, and fails
// when the data holds other than n.
func fromBytesLE(b []byte, n int) ([][]byte, error) {
	var out [][]byte
	for range n {
		if len(b) < 4 || uint64(binary.LittleEndian.Uint32(b)) > uint64(len(b)-4) {
			return nil, fmt.Errorf("BYTES element %d of %d runs past the end of the data", len(out), n)
		}
		l := binary.LittleEndian.Uint32(b)
		out = append(out, b[4:4+l])
		b = b[4+l:]
	}
	if len(b) > 0 {
		return nil, fmt.Errorf("%d bytes after the %d BYTES elements", len(b), n)
	}
	return out, nil
}

func fromF32le(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}
