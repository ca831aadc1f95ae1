package tokenizer

import (
	"encoding/json"
	"testing"
)

// FuzzParse loads arbitrary tokenizer.json bytes: an error or a tokenizer
// that encodes without panicking, never a crash.
func FuzzParse(f *testing.F) {
	good, err := json.Marshal(map[string]any{
		"model":          map[string]any{"type": "WordPiece", "unk_token": "[UNK]", "vocab": map[string]int{"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3, "##b": 4}},
		"pre_tokenizer":  map[string]any{"type": "BertPreTokenizer"},
		"post_processor": bertTemplate,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`))
	f.Add([]byte(`{"model":{"type":"WordPiece","vocab":{"a":2147483647}}}`))
	f.Add([]byte(`{"model":{"type":"Unigram","vocab":[["a",-1]]},"added_tokens":[{"id":-5,"content":"x"}]}`))
	f.Add([]byte(`{"padding":{"pad_id":99999999}}`))
	f.Fuzz(func(t *testing.T, content []byte) {
		tok, err := parse(content)
		if err != nil {
			return
		}
		for _, s := range []string{"", "a b ab", "[CLS] ünïcode 中文 🙂"} {
			_, _, _ = tok.Encode(s, "", 16, true)
			_, _, _ = tok.Encode(s, "a", 16, true)
		}
	})
}
