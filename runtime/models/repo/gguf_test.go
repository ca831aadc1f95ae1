package repo

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/gguf"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
)

// ggufPair writes one random checkpoint as safetensors (name-st, f32) and
// as a GGUF of dtype (name-gg) and returns their version directories.
func ggufPair(t *testing.T, repoDir, arch, dtype string) (string, string) {
	t.Helper()
	tok := t.TempDir()
	if err := modelkit.WriteByteTokenizer(tok, "{% for m in messages %}{{ m.content }}{% endfor %}"); err != nil {
		t.Fatal(err)
	}
	st := filepath.Join(repoDir, arch+"-st", "1")
	gg := filepath.Join(repoDir, arch+"-gg", "1")
	for _, d := range []string{st, gg} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := modelkit.WriteLLM(st, modelkit.LLM{Arch: arch, Layers: 2, Hidden: 64, Heads: 4, KVHeads: 2, Intermediate: 96,
		MaxPositions: 256, DType: "f32", Seed: 11, TokenizerDir: tok}); err != nil {
		t.Fatal(err)
	}
	if _, err := modelkit.WriteGGUF(st, filepath.Join(gg, "model.gguf"), dtype); err != nil {
		t.Fatal(err)
	}
	return st, gg
}

// TestGGUFQ8_0Weights: a Q8_0 GGUF's tensors load under the Hugging Face
// names with the checkpoint's shapes, each value within Q8_0's rounding of
// the f32 checkpoint (half a step of its block, the step's f16 rounding
// included), Llama's q/k rows back in their order: a row in the wrong
// place is off by the weights' own size, not by a rounding.
func TestGGUFQ8_0Weights(t *testing.T) {
	for _, arch := range []string{"llama", "qwen2", "qwen3"} {
		t.Run(arch, func(t *testing.T) {
			dir := t.TempDir()
			st, _ := ggufPair(t, dir, arch, "q8_0")
			r := openRepo(t, dir)
			p, err := r.inspect(arch+"-gg", 1)
			if err != nil {
				t.Fatal(err)
			}
			defer p.close()
			got, err := r.loadGGUF(context.Background(), p.llm.gguf, arch+"-gg")
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]models.Tensor{}
			if err := readShard(context.Background(), filepath.Join(st, FileWeights), want); err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("%d tensors, the checkpoint has %d", len(got), len(want))
			}
			for name, w := range want {
				g, ok := got[name]
				if !ok || !equalShapes(g.Shape, w.Shape) {
					t.Fatalf("%s: shape %v, want %v", name, g.Shape, w.Shape)
				}
				if q := len(w.Shape) == 2; g.Quantized() != q || (q && g.Stored != runtime.Q8_0) {
					t.Fatalf("%s: stored as %v (quantized %v), want q8_0 for matrices only", name, g.Stored, g.Quantized())
				}
				gd, err := g.Float32()
				if err != nil {
					t.Fatal(err)
				}
				for b := 0; b < len(w.Data); b += 32 {
					blk := w.Data[b:min(b+32, len(w.Data))]
					amax := 0.0
					for _, v := range blk {
						amax = max(amax, math.Abs(float64(v)))
					}
					tol := 0.6 * amax / 127 // 0.5 of a step, plus the f16 step's rounding
					if len(w.Shape) == 1 {
						tol = 0 // norms and biases stay f32
					}
					for i, v := range blk {
						if d := math.Abs(float64(gd[b+i] - v)); d > tol {
							t.Fatalf("%s[%d] = %g, checkpoint %g: off by %g, more than %g", name, b+i, gd[b+i], v, d, tol)
						}
					}
				}
			}
		})
	}
}

func equalShapes(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestGGUFRefusals: GGUF files the engine cannot serve are refused at
// inspection, naming what is wrong, as INVALID_ARGUMENT-kind errors.
func TestGGUFRefusals(t *testing.T) {
	dir := t.TempDir()
	_, gg := ggufPair(t, dir, "qwen3", "f16")
	r := openRepo(t, dir)
	if _, err := r.Load(context.Background(), "qwen3-gg", 1); err != nil {
		t.Fatalf("the valid file: %v", err)
	}
	// Two .gguf files in one version directory.
	b, err := os.ReadFile(filepath.Join(gg, "model.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gg, "other.gguf"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Load(context.Background(), "qwen3-gg", 1); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "2 .gguf files") {
		t.Errorf("two files: %v", err)
	}
	os.Remove(filepath.Join(gg, "other.gguf"))
	// A vocabulary longer than the embedding: its tokenizer would give
	// ids the model has no row for.
	rewriteGGUF(t, filepath.Join(gg, "model.gguf"), func(keys []string, kv map[string]gguf.Value) []string {
		v := kv["tokenizer.ggml.tokens"]
		toks := v.Data.([]string)
		v.Data = append(slices.Clip(toks), "<|extra|>")
		kv["tokenizer.ggml.tokens"] = v
		if tt, ok := kv["tokenizer.ggml.token_type"]; ok {
			types := tt.Data.([]int32)
			tt.Data = append(slices.Clip(types), 3)
			kv["tokenizer.ggml.token_type"] = tt
		}
		return keys
	}, nil)
	if _, err := r.Load(context.Background(), "qwen3-gg", 1); !errors.Is(err, models.ErrInvalidTokenizer) || !strings.Contains(err.Error(), "token_embd.weight") {
		t.Errorf("a vocabulary longer than the embedding: %v", err)
	}
	// A truncated file.
	if err := os.WriteFile(filepath.Join(gg, "model.gguf"), b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Load(context.Background(), "qwen3-gg", 1); !errors.Is(err, gguf.ErrInvalid) {
		t.Errorf("a truncated file: %v", err)
	}
	// Not a GGUF at all.
	if err := os.WriteFile(filepath.Join(gg, "model.gguf"), []byte("not a gguf file at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Load(context.Background(), "qwen3-gg", 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("not a GGUF: %v", err)
	}
}

// TestGGUFTruncatedWhileMapped: a file cut short between its inspection
// and the read of its tensors faults on the mapping; the load fails with
// an error instead of the process dying of SIGBUS.
func TestGGUFTruncatedWhileMapped(t *testing.T) {
	dir := t.TempDir()
	_, gg := ggufPair(t, dir, "qwen2", "q8_0")
	r := openRepo(t, dir)
	p, err := r.inspect("qwen2-gg", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if err := os.Truncate(filepath.Join(gg, "model.gguf"), 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := r.loadGGUF(context.Background(), p.llm.gguf, "qwen2-gg"); !errors.Is(err, gguf.ErrInvalid) || !strings.Contains(err.Error(), "changed while it was read") {
		t.Fatalf("load of a truncated mapping: %v", err)
	}
}

// TestGGUFNonFiniteFloats: NaN or infinite hyper-parameters are a bad
// model file (INVALID_ARGUMENT), refused naming the key, in Load and List.
func TestGGUFNonFiniteFloats(t *testing.T) {
	for _, tc := range []struct {
		name, key string
		v         float32
	}{
		{"eps NaN", "qwen3.attention.layer_norm_rms_epsilon", float32(math.NaN())},
		{"rope base +Inf", "qwen3.rope.freq_base", float32(math.Inf(1))},
		{"rope base -Inf", "qwen3.rope.freq_base", float32(math.Inf(-1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, gg := ggufPair(t, dir, "qwen3", "f16")
			rewriteGGUF(t, filepath.Join(gg, "model.gguf"), setKV(tc.key, gguf.Value{Type: gguf.ValueFloat32, Data: tc.v}), nil)
			r := openRepo(t, dir)
			_, err := r.Load(context.Background(), "qwen3-gg", 1)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.key) {
				t.Errorf("Load: %v, want an ErrInvalid refusal naming %s", err, tc.key)
			}
			for _, e := range r.List() {
				for _, err := range e.Errs {
					if err != nil && !errors.Is(err, ErrInvalid) {
						t.Errorf("List: an error that is not ErrInvalid: %v", err)
					}
				}
			}
		})
	}
}

// TestGGUFEndOfGeneration: a GGUF model ends generation at the ids its
// file names (eos, eot, eom) and at the tokens llama.cpp ends at by their
// text. The fixture's vocabulary has <|im_end|> at modelkit.ByteTokenizerEnd,
// which the file also names as its eos.
func TestGGUFEndOfGeneration(t *testing.T) {
	end := int32(modelkit.ByteTokenizerEnd)
	u32 := func(n uint32) gguf.Value { return gguf.Value{Type: gguf.ValueUint32, Data: n} }
	for _, tc := range []struct {
		name  string
		edits []func([]string, map[string]gguf.Value) []string
		want  []int32
	}{
		{"as written", nil, []int32{end}},
		{"no eos id: the text", []func([]string, map[string]gguf.Value) []string{deleteKV("tokenizer.ggml.eos_token_id")}, []int32{end}},
		{"eos, eot and eom ids", []func([]string, map[string]gguf.Value) []string{
			setKV("tokenizer.ggml.eos_token_id", u32(5)), setKV("tokenizer.ggml.eot_token_id", u32(7)), setKV("tokenizer.ggml.eom_token_id", u32(9)),
		}, []int32{5, 7, 9, end}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := loadEditedQwen2(t, tc.edits...)
			if got := l.LLM.EOS(); !slices.Equal(got, tc.want) {
				t.Errorf("EOS() = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestGGUFSamplingDefaults: a GGUF model samples by default as llama.cpp
// does (llama-server's temperature, top_k, top_p and min_p), under the
// file's general.sampling.* keys where they are in range.
func TestGGUFSamplingDefaults(t *testing.T) {
	f32 := func(v float32) gguf.Value { return gguf.Value{Type: gguf.ValueFloat32, Data: v} }
	llamaCpp := llm.Sampling{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05}
	for _, tc := range []struct {
		name  string
		edits []func([]string, map[string]gguf.Value) []string
		want  llm.Sampling
	}{
		{"none in the file", nil, llamaCpp},
		{"the file's", []func([]string, map[string]gguf.Value) []string{
			setKV("general.sampling.temp", f32(0.6)), setKV("general.sampling.top_k", gguf.Value{Type: gguf.ValueInt32, Data: int32(20)}),
			setKV("general.sampling.top_p", f32(0.8)), setKV("general.sampling.min_p", f32(0)), setKV("general.sampling.penalty_repeat", f32(1.05)),
		}, llm.Sampling{Temperature: 0.6, TopK: 20, TopP: 0.8, RepetitionPenalty: 1.05}},
		{"out of range: left out", []func([]string, map[string]gguf.Value) []string{
			setKV("general.sampling.temp", f32(float32(math.NaN()))), setKV("general.sampling.top_p", f32(3)),
			setKV("general.sampling.top_k", gguf.Value{Type: gguf.ValueInt32, Data: int32(-1)}),
		}, llamaCpp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := loadEditedQwen2(t, tc.edits...)
			if got := l.LLM.DefaultSampling(); got.Temperature != tc.want.Temperature || got.TopK != tc.want.TopK || got.TopP != tc.want.TopP ||
				got.MinP != tc.want.MinP || got.RepetitionPenalty != tc.want.RepetitionPenalty {
				t.Errorf("DefaultSampling() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestEndOfGeneration: the ids named, then the texts llama.cpp ends at,
// and no other special token.
func TestEndOfGeneration(t *testing.T) {
	v := bpe.Vocab{BOS: 0, EOS: 3, EOT: []int32{3, 4}, Tokens: []string{
		"<|begin_of_text|>", "<|im_start|>", "<|endoftext|>", "<|im_end|>", "x", "<|eot_id|>", "<|end_of_text|>",
		"<|eom_id|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|fim_prefix|>", "end", "<|end|>",
	}}
	want := []int32{2, 3, 4, 5, 6, 7, 8, 9, 10, 13}
	if got := endOfGeneration(v); !slices.Equal(got, want) {
		t.Errorf("endOfGeneration = %v, want %v", got, want)
	}
	if got := endOfGeneration(bpe.Vocab{EOS: -1, Tokens: []string{"a", "b"}}); len(got) != 0 {
		t.Errorf("a vocabulary without ends: %v", got)
	}
}

// TestGGUFTruncatedBeforeTheModel: a file cut short after its tensors were
// read, before the model is built from them (which dequantizes gate and up
// rows of two types out of the mapping to fuse them), fails the load with
// an error instead of the process dying of SIGBUS.
func TestGGUFTruncatedBeforeTheModel(t *testing.T) {
	dir := t.TempDir()
	_, gg := ggufPair(t, dir, "qwen2", "q8_0")
	// up read as Q4_0 (the first 18/34 of its Q8_0 bytes), gate Q8_0:
	// fusing them dequantizes both.
	rewriteGGUF(t, filepath.Join(gg, "model.gguf"), nil, func(ts []gguf.Tensor) {
		for i := range ts {
			if strings.HasSuffix(ts[i].Name, "ffn_up.weight") {
				ts[i].Type = gguf.Q4_0
			}
		}
	})
	r := openRepo(t, dir)
	p, err := r.inspect("qwen2-gg", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	weights, err := r.loadGGUF(context.Background(), p.llm.gguf, "qwen2-gg")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(gg, "model.gguf"), 4096); err != nil {
		t.Fatal(err)
	}
	m, err := newMappedLLM(p.llm.gguf.path, p.llm.config, weights, llm.ModelOptions{Name: "qwen2-gg"})
	if !errors.Is(err, gguf.ErrInvalid) || !strings.Contains(err.Error(), "changed while it was read") {
		t.Fatalf("a model over a truncated mapping: built %v, err %v", m != nil, err)
	}
}

// TestTokenizerEndTokens: a checkpoint whose config.json and
// generation_config.json name another end id still ends at its
// tokenizer's eos_token (tokenizer_config.json), as vLLM does.
func TestTokenizerEndTokens(t *testing.T) {
	dir := t.TempDir()
	st, _ := ggufPair(t, dir, "qwen2", "f16")
	for _, f := range []string{"config.json", FileGenerationConfig} {
		path := filepath.Join(st, f)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		m["eos_token_id"] = 2
		writeFile(t, path, m)
	}
	r, err := Open(dir, zaptest.NewLogger(t), WithTokenizerLoader(BPETokenizers))
	if err != nil {
		t.Fatal(err)
	}
	l, err := r.Load(context.Background(), "qwen2-st", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.LLM.EOS(), []int32{2, modelkit.ByteTokenizerEnd}; !slices.Equal(got, want) {
		t.Errorf("EOS() = %v, want %v", got, want)
	}
}

// editGGUF rewrites a GGUF file's metadata with edits (none: unchanged).
func editGGUF(t *testing.T, path string, edits ...func([]string, map[string]gguf.Value) []string) {
	t.Helper()
	if len(edits) == 0 {
		return
	}
	rewriteGGUF(t, path, func(keys []string, kv map[string]gguf.Value) []string {
		for _, e := range edits {
			keys = e(keys, kv)
		}
		return keys
	}, nil)
}

// loadEditedQwen2 loads a qwen2 f16 GGUF of ggufPair's whose metadata
// edits changed.
func loadEditedQwen2(t *testing.T, edits ...func([]string, map[string]gguf.Value) []string) *Loaded {
	t.Helper()
	dir := t.TempDir()
	_, gg := ggufPair(t, dir, "qwen2", "f16")
	editGGUF(t, filepath.Join(gg, "model.gguf"), edits...)
	l, err := openRepo(t, dir).Load(context.Background(), "qwen2-gg", 1)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestGGUFTensorShapesCheckedAtInspection: a tensor of a layer the model
// does not have, or of another shape than the config gives it, is refused
// before any tensor is read (the tensors not kept as stored are
// dequantized to float32 at load: a Q4 vector of 2^28 values in a 144 MiB
// file became 1 GiB, loaded, unused).
func TestGGUFTensorShapesCheckedAtInspection(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(ts []gguf.Tensor)
		want string
	}{
		{"a layer past block_count", func(ts []gguf.Tensor) {
			for i := range ts {
				if ts[i].Name == "blk.1.attn_norm.weight" {
					ts[i].Name = "blk.7.attn_norm.weight"
				}
			}
		}, "blk.7.attn_norm.weight is of no layer of this 2-layer qwen2 model"},
		{"a matrix transposed", func(ts []gguf.Tensor) {
			for i := range ts {
				if ts[i].Name == "blk.0.ffn_up.weight" {
					ts[i].Dims[0], ts[i].Dims[1] = ts[i].Dims[1], ts[i].Dims[0]
				}
			}
		}, "blk.0.ffn_up.weight is"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, gg := ggufPair(t, dir, "qwen2", "q8_0")
			rewriteGGUF(t, filepath.Join(gg, "model.gguf"), nil, tc.edit)
			p, err := openRepo(t, dir).inspect("qwen2-gg", 1)
			if err == nil {
				p.close()
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("inspect: %v, want an invalid-file error naming %q", err, tc.want)
			}
		})
	}
}

// TestListInspectsChangedVersionsOnly: List keeps what it found of a
// version while its files' fingerprint (paths, sizes, times) is the same —
// it runs for every request that names a model not loaded, and inspecting
// a GGUF parses its header — and inspects it again once a file changes.
func TestListInspectsChangedVersionsOnly(t *testing.T) {
	dir := t.TempDir()
	_, gg := ggufPair(t, dir, "qwen2", "q8_0")
	path := filepath.Join(gg, "model.gguf")
	r := openRepo(t, dir)
	entry := func() Entry {
		for _, e := range r.List() {
			if e.Name == "qwen2-gg" {
				return e
			}
		}
		t.Fatal("qwen2-gg is not listed")
		return Entry{}
	}
	if e := entry(); e.Errs[1] != nil || e.Kind == "" {
		t.Fatalf("listed %+v", e)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// The magic overwritten, size and time kept: the fingerprint is the
	// same, so what was found stands (no header was parsed again).
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XXXX"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(path, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if e := entry(); e.Errs[1] != nil {
		t.Fatalf("an unchanged fingerprint was inspected again: %v", e.Errs[1])
	}
	// A new time: inspected again, and the broken magic is found.
	later := st.ModTime().Add(time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if e := entry(); e.Errs[1] == nil || !strings.Contains(e.Errs[1].Error(), "magic") {
		t.Fatalf("a changed file was not inspected again: %+v", e)
	}
}

// TestListDigest: a listed version's digest (Ollama's /api/tags digest)
// is its fingerprint, and changes when one of its files does.
func TestListDigest(t *testing.T) {
	dir := t.TempDir()
	st, _ := ggufPair(t, dir, "qwen3", "q8_0")
	r := openRepo(t, dir)
	digest := func() string {
		for _, e := range r.List() {
			if e.Name == "qwen3-st" {
				return e.Details.Digest
			}
		}
		t.Fatal("qwen3-st is not listed")
		return ""
	}
	before := digest()
	fp, err := r.Fingerprint("qwen3-st", 1)
	if err != nil || before != fp || len(before) != 64 {
		t.Fatalf("digest %q, fingerprint %q (%v)", before, fp, err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(st, "config.json"), later, later); err != nil {
		t.Fatal(err)
	}
	if after := digest(); after == before || len(after) != 64 {
		t.Errorf("digest %q after config.json changed, %q before", after, before)
	}
}
