package repo

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"

	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/tokenizer/bpe"
)

// BPETokenizers reads a decoder LLM's byte-level BPE tokenizer and chat
// template (runtime/models/tokenizer/bpe) through the repository's
// confined reader: the TokenizerLoader brokerd uses. A chat template is
// code from the model's files: it must pass a trial render under the
// limits requests render it with (bpe.DefaultTemplateLimits).
func BPETokenizers(ctx context.Context, dir string, readFile func(path string, limit int64) ([]byte, error)) (llm.Tokenizer, llm.ChatTemplate, error) {
	const maxTokenizer, maxConfig = 64 << 20, 16 << 20 // bpe refuses a larger tokenizer.json
	tj, err := readFile(filepath.Join(dir, "tokenizer.json"), maxTokenizer)
	if err != nil {
		return nil, nil, err
	}
	optional := func(name string) ([]byte, error) {
		b, err := readFile(filepath.Join(dir, name), maxConfig)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return b, err
	}
	cfg, err := optional("tokenizer_config.json")
	if err != nil {
		return nil, nil, err
	}
	gen, err := optional("generation_config.json")
	if err != nil {
		return nil, nil, err
	}
	t, err := bpe.Parse(tj, cfg, gen)
	if err != nil {
		return nil, nil, err
	}
	return bpeParts(ctx, t)
}

// bpeParts adapts a tokenizer to what llm.Model needs, once its chat
// template (if any) passed the trial render.
func bpeParts(ctx context.Context, t *bpe.Tokenizer) (llm.Tokenizer, llm.ChatTemplate, error) {
	var chat llm.ChatTemplate
	if t.HasChatTemplate() {
		if err := t.CheckChatTemplate(ctx, bpe.DefaultTemplateLimits); err != nil {
			return nil, nil, err
		}
		chat = bpeChat{t}
	}
	return bpeTokenizer{t}, chat, nil
}

type bpeTokenizer struct{ t *bpe.Tokenizer }

func (b bpeTokenizer) Encode(text string, addSpecial bool, maxTokens int) ([]int32, bool, error) {
	ids, truncated := b.t.EncodeLimit(text, addSpecial, maxTokens)
	return ids, truncated, nil
}

// NewDetokenizer streams the text of generated tokens; special tokens (an
// end-of-turn marker) are not part of the text.
func (b bpeTokenizer) NewDetokenizer() llm.Detokenizer {
	return bpeStream{b.t.NewStreamDecoder(true)}
}

func (b bpeTokenizer) TokenBytes(id int32) []byte { return b.t.TokenBytes(id) }

// EOSIDs (llm.EndTokenizer): tokenizer_config.json's eos_token, a GGUF's
// eos and eot ids, and generation_config.json's.
func (b bpeTokenizer) EOSIDs() []int32 { return b.t.EOSIDs() }

// IsSpecial (llm.SpecialTokenizer): special tokens are not text, so a
// structured-output constraint never allows them.
func (b bpeTokenizer) IsSpecial(id int32) bool { return b.t.IsSpecial(id) }

type bpeStream struct{ d *bpe.StreamDecoder }

func (s bpeStream) Next(id int32) string { return s.d.Push(id) }
func (s bpeStream) Flush() string        { return s.d.Flush() }

type bpeChat struct{ t *bpe.Tokenizer }

func (c bpeChat) Render(ctx context.Context, messages []llm.Message, opts llm.ChatOptions) (string, error) {
	return c.t.ApplyChatTemplate(ctx, messages, bpe.ChatOptions{AddGenerationPrompt: opts.AddGenerationPrompt, Vars: opts.Vars, Tools: opts.Tools, Limits: bpe.DefaultTemplateLimits})
}
