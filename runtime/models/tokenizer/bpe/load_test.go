package bpe

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"tokenizer.json":         string(tinyTokenizer()),
		"tokenizer_config.json":  `{"bos_token": "<|bos|>", "eos_token": "<|eos|>", "chat_template": "{% for m in messages %}<|bos|>{{ m.role }}: {{ m.content }}<|eos|>{% endfor %}{% if add_generation_prompt %}<|bos|>assistant: {% endif %}"}`,
		"generation_config.json": `{"eos_token_id": [301, 300]}`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.EOSIDs(); !slices.Equal(got, []int32{301, 300}) {
		t.Errorf("EOSIDs = %v", got)
	}
	prompt, err := tok.ApplyChatTemplate(context.Background(), []Message{{Role: "user", Content: "hello"}}, ChatOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|bos|>user: hello<|eos|><|bos|>assistant: "; prompt != want {
		t.Errorf("prompt %q, want %q", prompt, want)
	}

	// tokenizer_config.json and generation_config.json are optional
	for _, name := range []string{"tokenizer_config.json", "generation_config.json"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	tok, err = Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tok.EOS(); ok || tok.HasChatTemplate() || len(tok.EOSIDs()) != 0 {
		t.Error("EOS or template without tokenizer_config.json")
	}
	if _, err := Load(t.TempDir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("empty dir: %v", err)
	}
}

func TestReadBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(path, []byte(strings.Repeat("x", 101)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readBounded(path, 100); !errors.Is(err, ErrInvalid) {
		t.Errorf("101 bytes under a 100-byte limit: %v", err)
	}
	if b, err := readBounded(path, 101); err != nil || len(b) != 101 {
		t.Errorf("at the limit: %d bytes, %v", len(b), err)
	}
}
