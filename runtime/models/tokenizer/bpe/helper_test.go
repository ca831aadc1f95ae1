package bpe

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// readZst reads a zstd-compressed test file: the real tokenizer.json files
// (about 10 MB each) are committed compressed.
func readZst(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d, err := zstd.NewReader(f)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return io.ReadAll(d)
}

// fixture is a real tokenizer from testdata, loaded once per test binary.
type fixture struct {
	once    sync.Once
	name    string
	rawJSON []byte
	tok     *Tokenizer
	err     error
}

var (
	llama3 = &fixture{name: "llama3"}
	qwen3  = &fixture{name: "qwen3"}
)

func (f *fixture) get(t testing.TB) *Tokenizer {
	t.Helper()
	f.once.Do(func() {
		dir := filepath.Join("testdata", f.name)
		var cfg []byte
		if f.rawJSON, f.err = readZst(filepath.Join(dir, "tokenizer.json.zst")); f.err != nil {
			return
		}
		if cfg, f.err = os.ReadFile(filepath.Join(dir, "tokenizer_config.json")); f.err != nil {
			return
		}
		f.tok, f.err = Parse(f.rawJSON, cfg, nil)
	})
	if f.err != nil {
		t.Fatalf("%s: %v", f.name, f.err)
	}
	return f.tok
}

// expected is testdata/expected_ids.json.zst, written by gen_expected.mjs.
type expected struct {
	Strings              []string              `json:"strings"`
	Tokenizers           map[string][][]int32  `json:"tokenizers"`
	Pieces               map[string][][]string `json:"pieces"`
	Decoded              map[string][]string   `json:"decoded"`
	Llama32PostProcessor json.RawMessage       `json:"llama32_post_processor"`
}

var (
	expOnce sync.Once
	exp     expected
	expErr  error
)

func loadExpected(t testing.TB) *expected {
	t.Helper()
	expOnce.Do(func() {
		var b []byte
		if b, expErr = readZst(filepath.Join("testdata", "expected_ids.json.zst")); expErr == nil {
			expErr = json.Unmarshal(b, &exp)
		}
	})
	if expErr != nil {
		t.Fatal(expErr)
	}
	if len(exp.Strings) == 0 {
		t.Fatal("no expected strings")
	}
	return &exp
}
