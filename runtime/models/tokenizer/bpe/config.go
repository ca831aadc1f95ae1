package bpe

import (
	"encoding/json"
	"errors"
	"fmt"
)

// configJSON is the part of tokenizer_config.json used here.
type configJSON struct {
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	PAD          json.RawMessage `json:"pad_token"`
	UNK          json.RawMessage `json:"unk_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// configure reads the special tokens and chat template of
// tokenizer_config.json and the EOS ids of generation_config.json.
func (t *Tokenizer) configure(config, generation []byte) error {
	if config != nil {
		var c configJSON
		if err := json.Unmarshal(config, &c); err != nil {
			return fmt.Errorf("tokenizer_config.json: %w", err)
		}
		for _, f := range []struct {
			name string
			raw  json.RawMessage
			id   *int32
			text *string
		}{
			{"bos_token", c.BOS, &t.bos, &t.bosToken},
			{"eos_token", c.EOS, &t.eos, &t.eosToken},
			{"pad_token", c.PAD, &t.pad, nil},
			{"unk_token", c.UNK, &t.unk, nil},
		} {
			tok, err := tokenName(f.raw)
			if err != nil {
				return fmt.Errorf("tokenizer_config.json %s: %w", f.name, err)
			}
			if tok == "" {
				continue
			}
			id, ok := t.vocab[tok]
			if !ok {
				return fmt.Errorf("tokenizer_config.json %s %q is not in the vocabulary", f.name, tok)
			}
			*f.id = id
			if f.text != nil {
				*f.text = tok
			}
		}
		src, err := templateSource(c.ChatTemplate)
		if err != nil {
			return fmt.Errorf("tokenizer_config.json chat_template: %w", err)
		}
		if src != "" {
			if t.chat, err = compileTemplate(src); err != nil {
				return fmt.Errorf("tokenizer_config.json chat_template: %w", err)
			}
		}
	}
	if t.eos >= 0 {
		t.eosIDs = append(t.eosIDs, t.eos)
	}
	if generation != nil {
		var g struct {
			EOS json.RawMessage `json:"eos_token_id"`
		}
		if err := json.Unmarshal(generation, &g); err != nil {
			return fmt.Errorf("generation_config.json: %w", err)
		}
		ids, err := idList(g.EOS)
		if err != nil {
			return fmt.Errorf("generation_config.json eos_token_id: %w", err)
		}
		for _, id := range ids {
			if id < 0 || int(id) >= len(t.tokens) {
				return fmt.Errorf("generation_config.json eos_token_id %d outside the vocabulary", id)
			}
			if !contains(t.eosIDs, id) {
				t.eosIDs = append(t.eosIDs, id)
			}
		}
	}
	return nil
}

func contains(ids []int32, id int32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// tokenName reads a special token written as a string, an AddedToken object
// ({"content": ...}) or null.
func tokenName(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", errors.New("neither a string nor an object with content")
	}
	return o.Content, nil
}

// idList reads a number, a list of numbers or null.
func idList(raw json.RawMessage) ([]int32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one int32
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int32{one}, nil
	}
	var many []int32
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, errors.New("neither a number nor a list of numbers")
	}
	return many, nil
}

// templateSource reads chat_template: a string, or a list of {name,
// template} of which "default" is the chat one.
func templateSource(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", errors.New("neither a string nor a list of named templates")
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", errors.New("no template named \"default\"")
}
