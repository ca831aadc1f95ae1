package repo

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/safetensors"
)

func openRepo(t *testing.T, dir string) *Repo {
	t.Helper()
	r, err := Open(dir, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// sameTensor compares loaded weights with what a fixture wrote, after the
// rounding of the file's dtype.
func sameTensor(t *testing.T, name string, got, want models.Tensor, dtype string) {
	t.Helper()
	if !slices.Equal(got.Shape, want.Shape) || len(got.Data) != len(want.Data) {
		t.Fatalf("%s: shape %v (%d values), want %v (%d)", name, got.Shape, len(got.Data), want.Shape, len(want.Data))
	}
	for i, v := range want.Data {
		switch dtype {
		case "F16":
			v = safetensors.F16ToFloat32(safetensors.Float32ToF16(v))
		case "BF16":
			v = math.Float32frombits(uint32(safetensors.Float32ToBF16(v)) << 16)
		}
		if got.Data[i] != v {
			t.Fatalf("%s[%d] = %g, want %g", name, i, got.Data[i], v)
		}
	}
}

func TestMLPVersionsAndFallback(t *testing.T) {
	root := t.TempDir()
	good := newMLPFixture(1)
	good.write(t, filepath.Join(root, "scorer", "1"))
	// Version 2 lacks a weight the spec names.
	broken := newMLPFixture(2)
	delete(broken.weights, "l2.bias")
	broken.write(t, filepath.Join(root, "scorer", "2"))
	// Not versions: a name that is not a positive number, a plain file.
	if err := os.MkdirAll(filepath.Join(root, "scorer", "latest"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "scorer", "0"), "x")
	writeFile(t, filepath.Join(root, "README"), "not a model")
	r := openRepo(t, root)
	ctx := context.Background()

	t.Run("List", func(t *testing.T) {
		es := r.List()
		if len(es) != 1 || es[0].Name != "scorer" {
			t.Fatalf("List() = %+v, want one entry scorer", es)
		}
		e := es[0]
		if !slices.Equal(e.Versions, []int64{1, 2}) || e.Kind != models.KindMLP {
			t.Errorf("versions %v kind %q, want [1 2] mlp", e.Versions, e.Kind)
		}
		if e.Errs[1] != nil {
			t.Errorf("version 1 error: %v", e.Errs[1])
		}
		if err := e.Errs[2]; !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"l2.bias"`) {
			t.Errorf("version 2 error = %v, want ErrInvalid naming l2.bias", err)
		}
		if got := e.Loadable(); !slices.Equal(got, []int64{1}) {
			t.Errorf("Loadable() = %v, want [1]", got)
		}
	})
	t.Run("Load(0) falls back to 1", func(t *testing.T) {
		l, err := r.Load(ctx, "scorer", 0)
		if err != nil {
			t.Fatal(err)
		}
		if l.Version != 1 || l.Kind != models.KindMLP {
			t.Fatalf("loaded version %d kind %q, want 1 mlp", l.Version, l.Kind)
		}
		if err := l.Skipped[2]; err == nil || !strings.Contains(err.Error(), `"l2.bias"`) {
			t.Errorf("Skipped[2] = %v, want the reason for version 2", err)
		}
		spec := l.MLP
		if spec.Input != "x" || spec.Output != "y" || spec.InputDim != 16 || spec.BaseBatch != 8 || len(spec.Layers) != 7 || spec.Name != "scorer" || spec.Version != 1 {
			t.Errorf("spec = %+v", spec)
		}
		if spec.Layers[2].Eps != 1e-5 {
			t.Errorf("layernorm eps = %g", spec.Layers[2].Eps)
		}
		if len(l.Weights) != len(good.weights) {
			t.Errorf("%d weights, want %d", len(l.Weights), len(good.weights))
		}
		for n, w := range good.weights {
			sameTensor(t, n, l.Weights[n], w, "F32")
		}
		m, err := l.Model()
		if err != nil {
			t.Fatalf("Model(): %v", err)
		}
		if info := m.Info(); info.Dim != 4 || info.Kind != models.KindMLP {
			t.Errorf("Info() = %+v, want an mlp of width 4", info)
		}
	})
	t.Run("Load(2) reports the reason", func(t *testing.T) {
		_, err := r.Load(ctx, "scorer", 2)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "model.safetensors") || !strings.Contains(err.Error(), `"l2.bias"`) {
			t.Fatalf("err = %v, want ErrInvalid naming the file and tensor", err)
		}
	})
	t.Run("not found", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			version int64
		}{{"nope", 0}, {"scorer", 3}} {
			if _, err := r.Load(ctx, tc.name, tc.version); !errors.Is(err, ErrNotFound) {
				t.Errorf("Load(%q, %d) = %v, want ErrNotFound", tc.name, tc.version, err)
			}
		}
	})
	t.Run("bad names", func(t *testing.T) {
		for _, name := range []string{"", "..", "../scorer", "scorer/1", ".hidden"} {
			if _, err := r.Load(ctx, name, 0); !errors.Is(err, ErrInvalid) {
				t.Errorf("Load(%q) = %v, want ErrInvalid", name, err)
			}
		}
		if _, err := r.Load(ctx, "scorer", -1); !errors.Is(err, ErrInvalid) {
			t.Errorf("Load(version -1) = %v, want ErrInvalid", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := r.Load(cctx, "scorer", 1); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	})
}

func TestNoLoadableVersion(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "m", "1", FileMLPSpec), "{")
	writeFile(t, filepath.Join(root, "m", "3", "notes.txt"), "nothing here")
	if err := os.MkdirAll(filepath.Join(root, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := openRepo(t, root)
	_, err := r.Load(context.Background(), "m", 0)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), filepath.Join("m", "1", FileMLPSpec)) || !strings.Contains(err.Error(), "no model.json") {
		t.Errorf("err = %v, want both versions' reasons", err)
	}
	if _, err := r.Load(context.Background(), "empty", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("empty model: err = %v, want ErrNotFound", err)
	}
	if _, err := Open(filepath.Join(root, "missing"), nil); err == nil {
		t.Error("Open of a missing directory succeeded")
	}
}

func TestBERTVariants(t *testing.T) {
	tests := []struct {
		name          string
		setup         func(t *testing.T, f *bertFixture, dir string)
		wantKind      models.Kind
		wantPooling   string
		wantNormalize bool
		wantLabels    []string
		wantBatch     [2]int // BaseBatch, MaxBatchTokens
	}{
		{
			name:        "BertModel names",
			wantKind:    models.KindBERT,
			wantPooling: models.PoolingMean,
		},
		{
			name: "bert. prefix and gamma/beta, BF16",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				f.prefix, f.gammaBeta, f.dtype = true, true, "BF16"
				f.config["architectures"] = []string{"BertForMaskedLM"}
			},
			wantKind:    models.KindBERT,
			wantPooling: models.PoolingMean,
		},
		{
			name: "sentence-transformers cls pooling and Normalize, F16",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				f.dtype = "F16"
				writeFile(t, filepath.Join(dir, FileSTModules), []any{
					map[string]any{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
					map[string]any{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
					map[string]any{"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
				})
				writeFile(t, filepath.Join(dir, "1_Pooling", "config.json"), map[string]any{
					"word_embedding_dimension": bertHidden, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false,
					"pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false})
			},
			wantKind:      models.KindBERT,
			wantPooling:   models.PoolingCLS,
			wantNormalize: true,
		},
		{
			name: "sentence-transformers mean pooling without modules.json",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				writeFile(t, filepath.Join(dir, "1_Pooling", "config.json"), map[string]any{
					"pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true})
			},
			wantKind:    models.KindBERT,
			wantPooling: models.PoolingMean,
		},
		{
			name: "brokerd.json overrides the sentence-transformers config",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				writeFile(t, filepath.Join(dir, FileSTModules), []any{
					map[string]any{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
					map[string]any{"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
				})
				writeFile(t, filepath.Join(dir, "1_Pooling", "config.json"), map[string]any{"pooling_mode_mean_tokens": true})
				writeFile(t, filepath.Join(dir, FileBrokerd), map[string]any{"kind": "bert", "pooling": "cls", "normalize": false,
					"base_batch": 4, "max_batch_tokens": 2048})
			},
			wantKind:    models.KindBERT,
			wantPooling: models.PoolingCLS,
			wantBatch:   [2]int{4, 2048},
		},
		{
			name: "classifier from architectures",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				f.asClassifier(rand.New(rand.NewPCG(9, 9)))
				f.prefix = true
			},
			wantKind:   models.KindBERTClassifier,
			wantLabels: []string{"contradiction", "entailment", "neutral"},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "enc", "1")
			f := newBERTFixture(uint64(i))
			if tc.setup != nil {
				tc.setup(t, f, dir)
			}
			f.write(t, dir)
			r := openRepo(t, root)
			l, err := r.Load(context.Background(), "enc", 0)
			if err != nil {
				t.Fatal(err)
			}
			if l.Kind != tc.wantKind || l.BERTOptions.Kind != tc.wantKind {
				t.Errorf("kind %q (options %q), want %q", l.Kind, l.BERTOptions.Kind, tc.wantKind)
			}
			if l.BERTOptions.Pooling != tc.wantPooling || l.BERTOptions.Normalize != tc.wantNormalize {
				t.Errorf("pooling %q normalize %v, want %q %v", l.BERTOptions.Pooling, l.BERTOptions.Normalize, tc.wantPooling, tc.wantNormalize)
			}
			if got := [2]int{l.BERTOptions.BaseBatch, l.BERTOptions.MaxBatchTokens}; got != tc.wantBatch {
				t.Errorf("base batch, max batch tokens = %v, want %v", got, tc.wantBatch)
			}
			if l.BERT.HiddenSize != bertHidden || l.BERT.NumHiddenLayers != bertLayers || l.BERT.MaxPositionEmbeddings != bertMaxPos {
				t.Errorf("config = %+v", *l.BERT)
			}
			if l.Tokenizer == nil || l.Tokenizer.VocabSize() != len(bertTokens) {
				t.Fatalf("tokenizer missing or with the wrong vocabulary")
			}
			// Every weight the model needs, under its canonical name, with
			// the values written (an encoder does not load the pooler).
			for canon, w := range f.canonical {
				got, ok := l.Weights[canon]
				if strings.HasPrefix(canon, "pooler.") && tc.wantKind == models.KindBERT {
					if ok {
						t.Errorf("encoder loaded %s", canon)
					}
					continue
				}
				if !ok {
					t.Fatalf("weight %q not loaded (have %d)", canon, len(l.Weights))
				}
				sameTensor(t, canon, got, w, f.dtype)
			}
			m, err := l.Model()
			if err != nil {
				t.Fatalf("Model(): %v", err)
			}
			info := m.Info()
			if info.Kind != tc.wantKind || info.Name != "enc" || info.Version != 1 {
				t.Errorf("Info() = %+v", info)
			}
			if tc.wantLabels != nil && !slices.Equal(info.Labels, tc.wantLabels) {
				t.Errorf("labels %v, want %v", info.Labels, tc.wantLabels)
			}
			ids, types, err := l.Tokenizer.Encode("The quick fox", "a dog", bertMaxPos, true)
			if err != nil || !slices.Equal(ids, []int32{2, 5, 6, 8, 3, 25, 14, 3}) || !slices.Equal(types, []int32{0, 0, 0, 0, 0, 1, 1, 1}) {
				t.Errorf("Encode = %v %v %v", ids, types, err)
			}
		})
	}
}

func TestBERTRejects(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, f *bertFixture, dir string)
		after func(t *testing.T, dir string) // after the fixture is written
		want  []string
	}{
		{
			name: "missing tensor",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				delete(f.canonical, "encoder.layer.1.output.dense.bias")
			},
			want: []string{"model.safetensors", `"encoder.layer.1.output.dense.bias" is missing`},
		},
		{
			name: "wrong shape",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				f.prefix = true
				f.canonical["encoder.layer.0.intermediate.dense.weight"] = randTensor(rand.New(rand.NewPCG(1, 1)), bertHidden, bertInter)
			},
			want: []string{`"bert.encoder.layer.0.intermediate.dense.weight" has shape [64 128], want [128 64]`},
		},
		{
			name: "both prefixed and bare names",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				f.prefix = true
				f.canonical["classifier.x"] = models.Tensor{Shape: []int{1}, Data: []float32{0}}
			},
			after: func(t *testing.T, dir string) {
				st, err := safetensors.Open(filepath.Join(dir, FileWeights))
				if err != nil {
					t.Fatal(err)
				}
				all := map[string]models.Tensor{}
				for _, n := range st.Names() {
					all[n], _ = st.Float32(n)
				}
				st.Close()
				all["embeddings.LayerNorm.gamma"] = all["bert.embeddings.LayerNorm.weight"]
				if err := safetensors.Write(filepath.Join(dir, FileWeights), all, "F32"); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{`are both "embeddings.LayerNorm.weight"`},
		},
		{
			name: "classifier without its head",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				f.config["architectures"] = []string{"BertForSequenceClassification"}
			},
			want: []string{"num_labels or id2label"},
		},
		{
			name: "classifier without pooler",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				f.asClassifier(rand.New(rand.NewPCG(1, 1)))
				delete(f.canonical, "pooler.dense.weight")
			},
			want: []string{`"pooler.dense.weight" is missing`},
		},
		{
			name:  "unsupported model type",
			setup: func(t *testing.T, f *bertFixture, dir string) { f.config["model_type"] = "roberta" },
			want:  []string{"config.json", `model_type "roberta"`},
		},
		{
			name:  "tanh GELU",
			setup: func(t *testing.T, f *bertFixture, dir string) { f.config["hidden_act"] = "gelu_new" },
			want:  []string{`hidden_act "gelu_new"`},
		},
		{
			name:  "heads do not divide hidden",
			setup: func(t *testing.T, f *bertFixture, dir string) { f.config["num_attention_heads"] = 5 },
			want:  []string{"not a multiple of num_attention_heads 5"},
		},
		{
			name:  "vocabulary larger than the embeddings",
			setup: func(t *testing.T, f *bertFixture, dir string) { f.config["vocab_size"] = 20 },
			want:  []string{"tokenizer.json", "vocab_size is 20"},
		},
		{
			name:  "missing tokenizer",
			after: func(t *testing.T, dir string) { _ = os.Remove(filepath.Join(dir, FileTokenizer)) },
			want:  []string{"tokenizer.json is missing"},
		},
		{
			name:  "bad tokenizer",
			after: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, FileTokenizer), "{") },
			want:  []string{"tokenizer.json", "bad JSON"},
		},
		{
			name: "max pooling",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				writeFile(t, filepath.Join(dir, FileSTModules), []any{map[string]any{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}})
				writeFile(t, filepath.Join(dir, "1_Pooling", "config.json"), map[string]any{"pooling_mode_max_tokens": true})
			},
			want: []string{"1_Pooling", "pooling mode not supported"},
		},
		{
			name: "pooling module outside the directory",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				writeFile(t, filepath.Join(dir, FileSTModules), []any{map[string]any{"path": "../../x", "type": "sentence_transformers.models.Pooling"}})
			},
			want: []string{"outside the model directory"},
		},
		{
			name: "brokerd.json typo",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				writeFile(t, filepath.Join(dir, FileBrokerd), map[string]any{"kind": "bert", "poolnig": "cls"})
			},
			want: []string{"brokerd.json", "poolnig"},
		},
		{
			name: "unknown kind",
			setup: func(t *testing.T, f *bertFixture, dir string) {
				writeFile(t, filepath.Join(dir, FileBrokerd), map[string]any{"kind": "gpt"})
			},
			want: []string{`unknown kind "gpt"`},
		},
		{
			name: "pytorch checkpoint only",
			after: func(t *testing.T, dir string) {
				_ = os.Rename(filepath.Join(dir, FileWeights), filepath.Join(dir, fileTorch))
			},
			want: []string{"pytorch_model.bin", "convert"},
		},
		{
			name: "truncated weights",
			after: func(t *testing.T, dir string) {
				p := filepath.Join(dir, FileWeights)
				st, _ := os.Stat(p)
				if err := os.Truncate(p, st.Size()-4); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"model.safetensors", "out of range"},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "enc", "1")
			f := newBERTFixture(uint64(100 + i))
			if tc.setup != nil {
				tc.setup(t, f, dir)
			}
			f.write(t, dir)
			if tc.after != nil {
				tc.after(t, dir)
			}
			r := openRepo(t, root)
			_, err := r.Load(context.Background(), "enc", 1)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %q, want it to contain %q", err, w)
				}
			}
			es := r.List()
			if len(es) != 1 || es[0].Errs[1] == nil {
				t.Errorf("List() does not report version 1's error: %+v", es)
			}
		})
	}
}

func TestMLPRejects(t *testing.T) {
	tests := []struct {
		name   string
		modify func(f *mlpFixture)
		want   string
	}{
		{"unknown layer", func(f *mlpFixture) {
			f.spec["layers"] = []any{map[string]any{"type": "conv"}}
		}, `unknown type "conv"`},
		{"width mismatch", func(f *mlpFixture) {
			f.weights["l2.weight"] = randTensor(rand.New(rand.NewPCG(1, 1)), 4, 31)
		}, `"l2.weight" has shape [4 31], want [4 32]`},
		{"layernorm width", func(f *mlpFixture) {
			f.weights["ln.bias"] = randTensor(rand.New(rand.NewPCG(1, 1)), 16)
		}, `"ln.bias" has shape [16], want [32]`},
		{"two inputs", func(f *mlpFixture) {
			f.spec["inputs"] = []any{map[string]any{"name": "a", "dims": []int{16}}, map[string]any{"name": "b", "dims": []int{16}}}
		}, "2 inputs, want 1"},
		{"batch in dims", func(f *mlpFixture) {
			f.spec["inputs"] = []any{map[string]any{"name": "x", "dims": []int{-1, 16}}}
		}, "dims [-1 16]"},
		{"typo in spec", func(f *mlpFixture) { f.spec["base_bacth"] = 8 }, "base_bacth"},
		{"labels do not fit", func(f *mlpFixture) { f.spec["labels"] = []string{"a", "b"} }, "2 labels for an output of width 4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			f := newMLPFixture(5)
			tc.modify(&f)
			f.write(t, filepath.Join(root, "m", "1"))
			_, err := openRepo(t, root).Load(context.Background(), "m", 0)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}
