package repo

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/onednn"
)

// hfCase is one input of testdata/hf-bert/expected.json and what
// transformers' BertModel made of it.
type hfCase struct {
	Text         string    `json:"text"`
	Pair         string    `json:"pair"`
	InputIDs     []int32   `json:"input_ids"`
	TokenTypeIDs []int32   `json:"token_type_ids"`
	Mean         []float64 `json:"mean"`
	CLS          []float64 `json:"cls"`
}

// TestHuggingFaceFixture loads the tiny BERT that make_fixture.py saved
// with transformers, as a user's download would be loaded, and checks
// brokerd's tokenizer and forward pass against BertModel's: the same token
// ids and type ids, and the mean-pooled and [CLS] vectors within 1e-4 in
// f32 (1e-2 in bf16 where the CPU has it), all cases in one mixed-length
// batch.
func TestHuggingFaceFixture(t *testing.T) {
	dir := filepath.Join("testdata", "hf-bert")
	raw, err := os.ReadFile(filepath.Join(dir, "expected.json"))
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("no Hugging Face fixture yet: run python3 runtime/models/repo/testdata/hf-bert/make_fixture.py " +
			"where torch and transformers are installed (the GPU hosts have both) and commit its output")
	}
	if err != nil {
		t.Fatal(err)
	}
	var want struct {
		Transformers string   `json:"transformers"`
		Cases        []hfCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if len(want.Cases) == 0 {
		t.Fatal("expected.json has no cases")
	}
	t.Logf("fixture from transformers %s", want.Transformers)
	r, err := Open(filepath.Join(dir, "repo"), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	l, err := r.Load(t.Context(), "tiny-hf-bert", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range []runtime.DType{runtime.F32, runtime.BF16} {
		dev, err := onednn.New(onednn.Options{}).Open(t.Context(), runtime.DeviceSpec{DType: dt})
		if dt == runtime.BF16 && errors.Is(err, runtime.ErrUnsupported) {
			t.Logf("bf16 skipped: %v", err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		tol := 1e-4
		if dt == runtime.BF16 {
			tol = 1e-2
		}
		for _, pooling := range []string{models.PoolingMean, models.PoolingCLS} {
			t.Run(dt.String()+"/"+pooling, func(t *testing.T) {
				opts := l.BERTOptions
				opts.Pooling, opts.Normalize = pooling, false
				m, err := models.NewBERT(*l.BERT, l.Weights, l.Tokenizer, opts)
				if err != nil {
					t.Fatal(err)
				}
				tm, ok := m.(interface {
					Tokenize(ctx context.Context, text, pair string, truncate, normalize bool) (models.TextInput, error)
				})
				if !ok {
					t.Fatalf("%T has no Tokenize", m)
				}
				items := make([]any, len(want.Cases))
				for i, c := range want.Cases {
					in, err := tm.Tokenize(context.Background(), c.Text, c.Pair, true, false)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(in.IDs, c.InputIDs) || !slices.Equal(in.TypeIDs, c.TokenTypeIDs) {
						t.Fatalf("case %d %q/%q: ids %v types %v, transformers %v types %v",
							i, c.Text, c.Pair, in.IDs, in.TypeIDs, c.InputIDs, c.TokenTypeIDs)
					}
					items[i] = in
				}
				rep, err := m.NewReplica(t.Context(), dev, len(items))
				if err != nil {
					t.Fatal(err)
				}
				defer rep.Close()
				outs, err := rep.Execute(t.Context(), items)
				if err != nil {
					t.Fatal(err)
				}
				for i, c := range want.Cases {
					ref := c.Mean
					if pooling == models.PoolingCLS {
						ref = c.CLS
					}
					got := outs[i].(models.Output).Values
					if e := relL2(got, ref); !(e < tol) {
						t.Errorf("case %d %q: relative error %.3g against BertModel, want < %g", i, c.Text, e, tol)
					}
				}
			})
		}
		dev.Close()
	}
}

// relL2 is ‖got−want‖/‖want‖ (∞ for a length mismatch).
func relL2(got []float32, want []float64) float64 {
	if len(got) != len(want) || len(want) == 0 {
		return math.Inf(1)
	}
	var d, n float64
	for i := range want {
		d += (float64(got[i]) - want[i]) * (float64(got[i]) - want[i])
		n += want[i] * want[i]
	}
	return math.Sqrt(d / n)
}
