// Package bpe is the byte-level BPE tokenizer of decoder LLMs (Llama 3,
// Qwen2/Qwen2.5, Qwen3): encoding and decoding token ids, special tokens,
// chat templates and streaming detokenisation, from a Hugging Face model
// directory.
//
//	tok, err := bpe.Load(dir) // tokenizer.json, tokenizer_config.json, generation_config.json
//	prompt, err := tok.ApplyChatTemplate(msgs, bpe.ChatOptions{AddGenerationPrompt: true})
//	ids := tok.Encode(prompt, false) // the template already wrote the specials
//	stop := tok.EOSIDs()
//	sd := tok.NewStreamDecoder(true)
//	// per generated id: send sd.Push(id); at the end: send sd.Flush()
//
// The file is parsed with go-huggingface's hftokenizer types (the library the
// BERT tokenizer uses), but encoding is done here: hftokenizer compiles the
// Split pre-tokenizer's pattern with Go's regexp, which refuses the negative
// lookahead (\s+(?!\S)) of these models. The two patterns in use are matched
// exactly by a hand-written matcher (pretok.go); anything else in a
// tokenizer.json that this package does not implement is refused at load
// with an error naming it, never approximated.
//
// A Tokenizer is immutable after Load and safe for concurrent use.
package bpe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gomlx/go-huggingface/tokenizers/hftokenizer"
	"golang.org/x/text/unicode/norm"
)

// ErrInvalid means a tokenizer file cannot be used.
var ErrInvalid = errors.New("invalid tokenizer")

// Bounds on hostile files: model files are trusted only as data.
const (
	maxTokenizerBytes = 64 << 20
	maxConfigBytes    = 8 << 20
	maxVocab          = 1 << 21
	maxTokenBytes     = 1024
)

// Tokenizer is a byte-level BPE tokenizer.
type Tokenizer struct {
	vocab       map[string]int32
	tokens      [][]byte // id -> decoded bytes (nil for unused ids)
	special     []bool   // id -> special added token
	merges      map[[2]int32]mergeRule
	ignoreMerge bool
	nfc         bool
	split       *splitter
	addedTokens []addedToken  // while the tokenizer is built
	added       *addedMatcher // then: the added tokens, found in the text
	prefix      []int32       // post-processor specials before the text
	suffix      []int32       // and after

	bos, eos, pad, unk int32 // -1 when absent
	eosIDs             []int32
	chat               *chatTemplate
	bosToken, eosToken string
}

type mergeRule struct {
	rank int32
	id   int32
}

type addedToken struct {
	content string
	id      int32
}

// fileJSON is tokenizer.json. The model (vocab and merges in either of their
// layouts) and the added tokens use hftokenizer's types; the pipeline steps
// are read here because hftokenizer's types drop fields they need
// (use_regex, ignore_merges).
type fileJSON struct {
	AddedTokens   []hftokenizer.AddedToken `json:"added_tokens"`
	Normalizer    *step                    `json:"normalizer"`
	PreTokenizer  *step                    `json:"pre_tokenizer"`
	PostProcessor *step                    `json:"post_processor"`
	Decoder       *step                    `json:"decoder"`
	Model         json.RawMessage          `json:"model"`
}

// step is one normalizer, pre-tokenizer, post-processor or decoder.
type step struct {
	Type           string                                      `json:"type"`
	Steps          []*step                                     `json:"pretokenizers"`
	Processors     []*step                                     `json:"processors"`
	Decoders       []*step                                     `json:"decoders"`
	Normalizers    []*step                                     `json:"normalizers"`
	Pattern        *hftokenizer.Pattern                        `json:"pattern"`
	Behavior       string                                      `json:"behavior"`
	Invert         bool                                        `json:"invert"`
	AddPrefixSpace bool                                        `json:"add_prefix_space"`
	UseRegex       *bool                                       `json:"use_regex"`
	Single         []hftokenizer.PostProcItem                  `json:"single"`
	SpecialTokens  map[string]hftokenizer.PostProcSpecialToken `json:"special_tokens"`
}

// Load reads a Hugging Face model directory: tokenizer.json (required),
// tokenizer_config.json (special tokens and chat template; optional) and
// generation_config.json (more EOS ids; optional).
func Load(dir string) (*Tokenizer, error) {
	tj, err := readBounded(filepath.Join(dir, "tokenizer.json"), maxTokenizerBytes)
	if err != nil {
		return nil, err
	}
	cfg, err := readOptional(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	gen, err := readOptional(filepath.Join(dir, "generation_config.json"))
	if err != nil {
		return nil, err
	}
	t, err := Parse(tj, cfg, gen)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return t, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalid, path, limit)
	}
	return b, nil
}

func readOptional(path string) ([]byte, error) {
	b, err := readBounded(path, maxConfigBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// Parse builds a Tokenizer from the contents of tokenizer.json and, when not
// nil, tokenizer_config.json and generation_config.json.
func Parse(tokenizerJSON, configJSON, generationJSON []byte) (*Tokenizer, error) {
	t, err := parse(tokenizerJSON)
	if err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: %w", ErrInvalid, err)
	}
	if err := t.configure(configJSON, generationJSON); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return t, nil
}

func parse(content []byte) (*Tokenizer, error) {
	if len(content) > maxTokenizerBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxTokenizerBytes)
	}
	var f fileJSON
	if err := json.Unmarshal(content, &f); err != nil {
		return nil, fmt.Errorf("bad JSON: %w", err)
	}
	var m hftokenizer.Model
	if err := json.Unmarshal(f.Model, &m); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	var extra struct {
		IgnoreMerges bool `json:"ignore_merges"`
	}
	if err := json.Unmarshal(f.Model, &extra); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	switch {
	case m.Type != "BPE":
		return nil, fmt.Errorf("model.type %q is not supported (BPE)", m.Type)
	case m.ContinuingSubwordPrefix != "" || m.EndOfWordSuffix != "":
		return nil, errors.New("model.continuing_subword_prefix and end_of_word_suffix are not supported")
	case m.ByteFallback:
		return nil, errors.New("model.byte_fallback is not supported (byte-level BPE has no need of it)")
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, errors.New("model.dropout is not supported")
	case len(m.Vocab) == 0:
		return nil, errors.New("empty vocabulary")
	case len(m.Vocab)+len(f.AddedTokens) > maxVocab:
		return nil, fmt.Errorf("more than %d tokens", maxVocab)
	}
	t := &Tokenizer{
		vocab:       make(map[string]int32, len(m.Vocab)+len(f.AddedTokens)),
		ignoreMerge: extra.IgnoreMerges,
		bos:         -1, eos: -1, pad: -1, unk: -1,
	}
	maxID := -1
	for tok, id := range m.Vocab {
		if id < 0 || id >= maxVocab {
			return nil, fmt.Errorf("token %q: id %d outside [0, %d)", tok, id, maxVocab)
		}
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID >= maxVocab {
			return nil, fmt.Errorf("added token %q: id %d outside [0, %d)", a.Content, a.ID, maxVocab)
		}
		maxID = max(maxID, a.ID)
	}
	t.tokens = make([][]byte, maxID+1)
	t.special = make([]bool, maxID+1)
	for tok, id := range m.Vocab {
		if len(tok) > maxTokenBytes {
			return nil, fmt.Errorf("token of %d bytes (limit %d)", len(tok), maxTokenBytes)
		}
		t.vocab[tok] = int32(id)
		t.tokens[id] = byteLevelDecode(tok)
	}
	if m.UnkToken != "" {
		id, ok := t.vocab[m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in the vocabulary", m.UnkToken)
		}
		t.unk = id
	}

	if err := t.setMerges(m.Merges); err != nil {
		return nil, err
	}

	for _, a := range f.AddedTokens {
		if a.Lstrip || a.Rstrip || a.SingleWord {
			return nil, fmt.Errorf("added token %q: lstrip, rstrip and single_word are not supported", a.Content)
		}
		if err := t.addToken(a.Content, int32(a.ID), a.Special); err != nil {
			return nil, err
		}
	}
	if err := t.buildAdded(); err != nil {
		return nil, err
	}

	if err := t.normalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.preTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err := t.postProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if d := f.Decoder; d == nil || d.Type != "ByteLevel" {
		return nil, errors.New("decoder must be ByteLevel")
	}
	return t, nil
}

// setMerges reads the merge rules, "a b" each, best first.
func (t *Tokenizer) setMerges(merges []string) error {
	t.merges = make(map[[2]int32]mergeRule, len(merges))
	for rank, mg := range merges {
		a, b, ok := strings.Cut(mg, " ")
		if !ok {
			return fmt.Errorf("merge %d %q is not two tokens", rank, mg)
		}
		ia, okA := t.vocab[a]
		ib, okB := t.vocab[b]
		ic, okC := t.vocab[a+b]
		if !okA || !okB || !okC {
			return fmt.Errorf("merge %d %q: a token is not in the vocabulary", rank, mg)
		}
		key := [2]int32{ia, ib}
		if _, dup := t.merges[key]; !dup { // the first (best) rank wins, as in tokenizers
			t.merges[key] = mergeRule{rank: int32(rank), id: ic}
		}
	}
	return nil
}

// addToken adds a token matched in the text before BPE (an added token:
// the chat markers); id must be inside t.tokens.
func (t *Tokenizer) addToken(content string, id int32, special bool) error {
	switch {
	case content == "":
		return fmt.Errorf("added token %d is empty", id)
	case len(content) > maxTokenBytes:
		return fmt.Errorf("added token %d: %d bytes (limit %d)", id, len(content), maxTokenBytes)
	}
	t.vocab[content] = id
	t.tokens[id] = byteLevelDecode(content)
	t.special[id] = special
	t.addedTokens = append(t.addedTokens, addedToken{content, id})
	return nil
}

// buildAdded builds the matcher of the added tokens, once all are added.
func (t *Tokenizer) buildAdded() error {
	n := 0
	for _, a := range t.addedTokens {
		n += len(a.content)
	}
	if n > maxAddedBytes {
		return fmt.Errorf("added tokens of %d bytes in all (limit %d)", n, maxAddedBytes)
	}
	t.added, t.addedTokens = newAddedMatcher(t.addedTokens), nil
	return nil
}

func (t *Tokenizer) normalizer(n *step) error {
	switch {
	case n == nil:
	case n.Type == "NFC":
		t.nfc = true
	case n.Type == "Sequence" && len(n.Normalizers) == 0:
	default:
		return fmt.Errorf("normalizer %q is not supported (none, NFC)", n.Type)
	}
	return nil
}

// preTokenizer accepts [Split(known pattern, Isolated)] then ByteLevel
// without its own regex or prefix space, as Llama 3 and Qwen ship.
func (t *Tokenizer) preTokenizer(p *step) error {
	if p == nil {
		return errors.New("pre_tokenizer is missing (ByteLevel expected)")
	}
	steps := []*step{p}
	if p.Type == "Sequence" {
		steps = p.Steps
	}
	byteLevel := false
	for i, s := range steps {
		if s == nil {
			return fmt.Errorf("pre_tokenizer %d is null", i)
		}
		switch s.Type {
		case "Split":
			if byteLevel || t.split != nil {
				return errors.New("pre_tokenizer: Split must come once, before ByteLevel")
			}
			if s.Pattern == nil || s.Pattern.Regex == "" {
				return errors.New("pre_tokenizer Split: only Regex patterns are supported")
			}
			sp, ok := newSplitter(s.Pattern.Regex)
			if !ok {
				return fmt.Errorf("pre_tokenizer Split: pattern %q is not one this package matches (Llama 3, Qwen2)", s.Pattern.Regex)
			}
			if s.Behavior != "Isolated" || s.Invert {
				return fmt.Errorf("pre_tokenizer Split: behavior %q invert %v is not supported (Isolated, false)", s.Behavior, s.Invert)
			}
			t.split = &sp
		case "ByteLevel":
			if s.AddPrefixSpace {
				return errors.New("pre_tokenizer ByteLevel: add_prefix_space is not supported")
			}
			if s.UseRegex == nil || *s.UseRegex {
				return errors.New("pre_tokenizer ByteLevel: use_regex (the GPT-2 pattern) is not supported")
			}
			byteLevel = true
		default:
			return fmt.Errorf("pre_tokenizer %q is not supported (Split, ByteLevel)", s.Type)
		}
	}
	if !byteLevel {
		return errors.New("pre_tokenizer has no ByteLevel step")
	}
	return nil
}

// postProcessor reads the specials Encode adds: ByteLevel changes offsets
// only; TemplateProcessing's single template adds ids around $A.
func (t *Tokenizer) postProcessor(p *step) error {
	if p == nil {
		return nil
	}
	switch p.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		for _, s := range p.Processors {
			if s == nil {
				return errors.New("post_processor: null step")
			}
			if err := t.postProcessor(s); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		if t.prefix != nil || t.suffix != nil {
			return errors.New("post_processor: two TemplateProcessing steps")
		}
		seen := false
		for _, it := range p.Single {
			switch {
			case it.Sequence != nil:
				if seen || it.Sequence.ID != "A" {
					return fmt.Errorf("post_processor single template: sequence %q is not supported ($A once)", it.Sequence.ID)
				}
				seen = true
			case it.SpecialToken != nil:
				st, ok := p.SpecialTokens[it.SpecialToken.ID]
				if !ok || len(st.IDs) == 0 {
					return fmt.Errorf("post_processor single template: special token %q has no ids", it.SpecialToken.ID)
				}
				for _, id := range st.IDs {
					if id < 0 || id >= len(t.tokens) || t.tokens[id] == nil {
						return fmt.Errorf("post_processor special token %q: id %d is not in the vocabulary", it.SpecialToken.ID, id)
					}
					if seen {
						t.suffix = append(t.suffix, int32(id))
					} else {
						t.prefix = append(t.prefix, int32(id))
					}
				}
			}
		}
		if !seen {
			return errors.New("post_processor single template has no $A")
		}
		if t.prefix == nil {
			t.prefix = []int32{}
		}
		return nil
	}
	return fmt.Errorf("post_processor %q is not supported (ByteLevel, TemplateProcessing, Sequence)", p.Type)
}

// VocabSize is one more than the largest id.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenID returns the id of a token as written in the vocabulary (byte-level
// form, e.g. "Ġthe") or an added token's content.
func (t *Tokenizer) TokenID(token string) (int32, bool) {
	id, ok := t.vocab[token]
	return id, ok
}

// IsSpecial reports whether id is a special added token.
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// SpecialIDs lists the special added tokens' ids in increasing order.
func (t *Tokenizer) SpecialIDs() []int32 {
	var ids []int32
	for id, sp := range t.special {
		if sp {
			ids = append(ids, int32(id))
		}
	}
	return ids
}

// BOS, EOS, PAD and UNK return the ids named by tokenizer_config.json (and
// the model's unk_token); ok is false when there is none.
func (t *Tokenizer) BOS() (int32, bool) { return t.bos, t.bos >= 0 }
func (t *Tokenizer) EOS() (int32, bool) { return t.eos, t.eos >= 0 }
func (t *Tokenizer) PAD() (int32, bool) { return t.pad, t.pad >= 0 }
func (t *Tokenizer) UNK() (int32, bool) { return t.unk, t.unk >= 0 }

// EOSIDs are the ids that end generation: tokenizer_config's eos_token and
// generation_config's eos_token_id (a number or a list), without repeats.
func (t *Tokenizer) EOSIDs() []int32 { return append([]int32(nil), t.eosIDs...) }

// Encode turns text into ids. Added tokens written in the text (e.g.
// "<|im_start|>") become their ids; addSpecial adds what the post-processor
// adds around a single sequence (Llama 3.2: <|begin_of_text|>; Qwen: nothing).
func (t *Tokenizer) Encode(text string, addSpecial bool) []int32 {
	ids, _ := t.EncodeLimit(text, addSpecial, 0)
	return ids
}

// EncodeLimit is Encode that stops once it has more than maxTokens ids
// (0: no bound), so that a text far longer than a model's context costs
// what the context does; truncated says it stopped. The ids it returns
// then are a prefix of Encode's, more than maxTokens of them.
func (t *Tokenizer) EncodeLimit(text string, addSpecial bool, maxTokens int) (ids []int32, truncated bool) {
	over := func() bool { return maxTokens > 0 && len(ids) > maxTokens }
	if addSpecial {
		ids = append(ids, t.prefix...)
	}
	sc := t.added.scan(text)
	for at := 0; at < len(text) && !over(); {
		i, tok := sc.next(at)
		if i > at {
			ids = t.encodeSegment(ids, text[at:i], maxTokens)
		}
		if tok == nil || over() {
			break
		}
		ids = append(ids, tok.id)
		at = i + len(tok.content)
	}
	if over() {
		return ids, true
	}
	if addSpecial {
		ids = append(ids, t.suffix...)
	}
	return ids, over()
}

// encodeSegment encodes text that holds no added token, skipping the
// words after ids holds more than maxTokens (0: no bound).
func (t *Tokenizer) encodeSegment(ids []int32, s string, maxTokens int) []int32 {
	if t.nfc {
		s = norm.NFC.String(s)
	}
	var buf []byte
	word := func(piece string) {
		if maxTokens > 0 && len(ids) > maxTokens {
			return
		}
		buf = byteLevelEncode(buf[:0], piece)
		if t.ignoreMerge {
			if id, ok := t.vocab[string(buf)]; ok {
				ids = append(ids, id)
				return
			}
		}
		ids = t.bpe(ids, buf)
	}
	if t.split == nil {
		word(s)
	} else {
		t.split.split(s, word)
	}
	return ids
}

// Decode turns ids into text, skipping special tokens when skipSpecial.
// Byte sequences that are not UTF-8 become U+FFFD, one per maximal invalid
// subpart, as Hugging Face's decoder (String::from_utf8_lossy) does. Ids
// outside the vocabulary are skipped.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string {
	var b []byte
	for _, id := range ids {
		b = t.appendToken(b, id, skipSpecial)
	}
	return lossyUTF8(b)
}

func (t *Tokenizer) appendToken(b []byte, id int32, skipSpecial bool) []byte {
	if id < 0 || int(id) >= len(t.tokens) || (skipSpecial && t.special[id]) {
		return b
	}
	return append(b, t.tokens[id]...)
}

// TokenBytes returns the bytes a token decodes to (nil for an unknown id).
func (t *Tokenizer) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.tokens) {
		return nil
	}
	return bytes.Clone(t.tokens[id])
}
