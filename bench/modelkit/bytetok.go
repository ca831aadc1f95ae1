package modelkit

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// Ids of WriteByteTokenizer's two special tokens; its vocabulary is 258.
const (
	ByteTokenizerStart = 256 // <|im_start|>
	ByteTokenizerEnd   = 257 // <|im_end|>, the EOS
	ByteTokenizerVocab = 258
)

// WriteByteTokenizer writes a small byte-level BPE tokenizer.json (every
// byte a token, no merges, <|im_start|> and <|im_end|> as special tokens)
// and a tokenizer_config.json with chat template tmpl into dir: a real
// tokenizer brokerd's loaders read in milliseconds, where Qwen's 151k
// tokens take seconds (under the race detector, many). With no merges, any
// pre-tokenizer gives the same ids, so its GGUF form (pre qwen2) encodes as
// its tokenizer.json does.
func WriteByteTokenizer(dir, tmpl string) error {
	// GPT-2's byte-to-unicode map: printable bytes stand for themselves,
	// the others for code points from U+0100 on.
	vocab := map[string]int{}
	next := 0
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE) {
			r = rune(256 + next)
			next++
		}
		vocab[string(r)] = b
	}
	tj, err := json.Marshal(map[string]any{
		"added_tokens": []any{
			map[string]any{"id": ByteTokenizerStart, "content": "<|im_start|>", "special": true},
			map[string]any{"id": ByteTokenizerEnd, "content": "<|im_end|>", "special": true},
		},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
	})
	if err != nil {
		return err
	}
	cfg, err := json.Marshal(map[string]any{"eos_token": "<|im_end|>", "chat_template": tmpl})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644)
}
