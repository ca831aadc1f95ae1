package bpe

import (
	"errors"
	"fmt"
)

// Vocab is a byte-level BPE tokenizer given as arrays, the way a GGUF file
// keeps it (its tokenizer.ggml.* keys) instead of as tokenizer.json.
type Vocab struct {
	// Model is tokenizer.ggml.model: "gpt2" is byte-level BPE, the only
	// kind this package runs.
	Model string
	// Pre is tokenizer.ggml.pre, naming the pre-tokenizer: "qwen2"
	// (Qwen2, Qwen2.5, Qwen3) or "llama-bpe" (Llama 3.x).
	Pre string
	// Tokens are the tokens by id, in their byte-level form ("Ġthe");
	// Types their kinds (TokenNormal, …), nil when all are normal.
	Tokens []string
	Types  []int32
	// Merges are the merge rules "a b", best first.
	Merges []string
	// BOS, EOS, PAD and UNK are ids, -1 when absent; EOT are further ids
	// that end generation (end of turn, end of message).
	BOS, EOS, PAD, UNK int32
	EOT                []int32
	// AddBOS and AddEOS: Encode with addSpecial puts BOS before the text
	// and EOS after it.
	AddBOS, AddEOS bool
	// ChatTemplate is tokenizer.chat_template ("": none).
	ChatTemplate string
}

// Token kinds of GGUF's tokenizer.ggml.token_type (llama.cpp's
// llama_token_type). Control and user-defined tokens are matched in the
// text before BPE, as tokenizer.json's added tokens are.
const (
	TokenNormal      = 1
	TokenUnknown     = 2
	TokenControl     = 3
	TokenUserDefined = 4
	TokenUnused      = 5
	TokenByte        = 6
)

// preTokenizers maps tokenizer.ggml.pre to the split pattern (and the
// normalizer) of the tokenizer.json it was converted from. llama.cpp names
// Llama 3's "llama-bpe" (older files: "llama3", "llama-v3").
var preTokenizers = map[string]struct {
	pattern string
	nfc     bool
}{
	"qwen2":     {patternQwen2, true}, // Qwen2's tokenizer.json normalises to NFC
	"llama-bpe": {patternLlama3, false},
	"llama3":    {patternLlama3, false},
	"llama-v3":  {patternLlama3, false},
}

// NewFromVocab builds a Tokenizer from arrays (a GGUF file's tokenizer),
// with the same checks as Parse: every id in range, every merge over known
// tokens, the sizes bounded. Errors wrap ErrInvalid.
func NewFromVocab(v Vocab) (*Tokenizer, error) {
	t, err := newFromVocab(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return t, nil
}

func newFromVocab(v Vocab) (*Tokenizer, error) {
	if v.Model != "gpt2" {
		return nil, fmt.Errorf("tokenizer model %q is not supported (gpt2: byte-level BPE)", v.Model)
	}
	pre, ok := preTokenizers[v.Pre]
	if !ok {
		return nil, fmt.Errorf("pre-tokenizer %q is not supported (qwen2, llama-bpe)", v.Pre)
	}
	switch n := len(v.Tokens); {
	case n == 0:
		return nil, errors.New("empty vocabulary")
	case n > maxVocab:
		return nil, fmt.Errorf("%d tokens, more than %d", n, maxVocab)
	case v.Types != nil && len(v.Types) != n:
		return nil, fmt.Errorf("%d token types for %d tokens", len(v.Types), n)
	}
	sp, _ := newSplitter(pre.pattern)
	t := &Tokenizer{
		vocab:   make(map[string]int32, len(v.Tokens)),
		tokens:  make([][]byte, len(v.Tokens)),
		special: make([]bool, len(v.Tokens)),
		nfc:     pre.nfc,
		split:   &sp,
		bos:     -1, eos: -1, pad: -1, unk: -1,
	}
	for id, tok := range v.Tokens {
		if len(tok) > maxTokenBytes {
			return nil, fmt.Errorf("token %d: %d bytes (limit %d)", id, len(tok), maxTokenBytes)
		}
		typ := int32(TokenNormal)
		if v.Types != nil {
			typ = v.Types[id]
		}
		switch typ {
		case TokenControl, TokenUserDefined:
			if err := t.addToken(tok, int32(id), typ == TokenControl); err != nil {
				return nil, err
			}
		case TokenNormal, TokenUnknown, TokenUnused:
			if _, dup := t.vocab[tok]; !dup { // the first id wins
				t.vocab[tok] = int32(id)
			}
			t.tokens[id] = byteLevelDecode(tok)
		case TokenByte:
			return nil, fmt.Errorf("token %d %q is a byte token (SentencePiece), not byte-level BPE", id, tok)
		default:
			return nil, fmt.Errorf("token %d %q has unknown type %d", id, tok, typ)
		}
	}
	if err := t.buildAdded(); err != nil {
		return nil, err
	}
	if err := t.setMerges(v.Merges); err != nil {
		return nil, err
	}
	inRange := func(name string, id int32) error {
		if id < -1 || int(id) >= len(t.tokens) {
			return fmt.Errorf("%s id %d outside the vocabulary of %d", name, id, len(t.tokens))
		}
		return nil
	}
	for _, f := range []struct {
		name string
		id   int32
		dst  *int32
	}{{"bos", v.BOS, &t.bos}, {"eos", v.EOS, &t.eos}, {"padding", v.PAD, &t.pad}, {"unknown", v.UNK, &t.unk}} {
		if err := inRange(f.name, f.id); err != nil {
			return nil, err
		}
		*f.dst = f.id
	}
	if t.bos >= 0 {
		t.bosToken = v.Tokens[t.bos]
	}
	if t.eos >= 0 {
		t.eosToken = v.Tokens[t.eos]
		t.eosIDs = append(t.eosIDs, t.eos)
	}
	for _, id := range v.EOT {
		if err := inRange("end-of-turn", id); err != nil {
			return nil, err
		}
		if id >= 0 && !contains(t.eosIDs, id) {
			t.eosIDs = append(t.eosIDs, id)
		}
	}
	t.prefix = []int32{}
	if v.AddBOS {
		if t.bos < 0 {
			return nil, errors.New("add_bos_token without a bos token")
		}
		t.prefix = append(t.prefix, t.bos)
	}
	if v.AddEOS {
		if t.eos < 0 {
			return nil, errors.New("add_eos_token without an eos token")
		}
		t.suffix = append(t.suffix, t.eos)
	}
	if v.ChatTemplate != "" {
		ct, err := compileTemplate(v.ChatTemplate)
		if err != nil {
			return nil, fmt.Errorf("chat template: %w", err)
		}
		t.chat = ct
	}
	return t, nil
}
