package server

import (
	"context"
	"strings"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// Tokenize gives the ids a generator model runs for prompts, or for a
// chat's conversations as Chat renders them; it runs nothing.
func (s *BrokerService) Tokenize(ctx context.Context, req *brokerv1.TokenizeRequest) (*brokerv1.TokenizeResponse, error) {
	prompts, chat := req.GetPrompts(), req.GetChat()
	if len(prompts) > 0 && chat != nil {
		return nil, invalid("give prompts or a chat, not both")
	}
	n := len(prompts) + len(chat.GetConversations())
	if n == 0 {
		return nil, invalid("nothing to tokenize: give at least one prompt or conversation")
	}
	if n > s.limits.MaxItemsPerRequest {
		return nil, invalid("%d prompts; the limit is %d (--max-items-per-request)", n, s.limits.MaxItemsPerRequest)
	}
	sv, gm, err := s.acquireGenerator("Tokenize", req.GetModel())
	if err != nil {
		return nil, err
	}
	defer s.models.Release(sv)
	var all [][]int32
	if chat == nil {
		addSpecial := req.AddSpecialTokens == nil || req.GetAddSpecialTokens()
		for i, p := range prompts {
			if len(p) > s.limits.MaxItemBytes {
				return nil, invalid("prompts[%d] is %d bytes; the limit is %d (--max-item-bytes)", i, len(p), s.limits.MaxItemBytes)
			}
			ids, err := gm.EncodePrompt(p, addSpecial)
			if err != nil {
				return nil, invalid("prompts[%d]: %v", i, err)
			}
			all = append(all, ids)
		}
	} else {
		vars, err := templateVars(chat)
		if err != nil {
			return nil, err
		}
		if _, thinks := gm.ThinkTags(); chat.GetEnableThinking() && !thinks {
			return nil, invalid("model %s does not think (its vocabulary has no <think> and </think> tokens): leave enable_thinking unset or false", req.GetModel())
		}
		tools, toolsSize, err := chatTools(chat, gm)
		if err != nil {
			return nil, err
		}
		rendered, err := s.renderChats(ctx, chat, gm, vars, tools, toolsSize, false)
		if err != nil {
			return nil, err
		}
		for _, r := range rendered {
			all = append(all, r.ids)
		}
	}
	resp := &brokerv1.TokenizeResponse{ContextLength: int32(gm.ContextLength())}
	for _, ids := range all {
		r := &brokerv1.TokenizedPrompt{Ids: ids}
		if req.GetReturnTokenStrings() {
			r.Tokens = make([]string, len(ids))
			for i, id := range ids {
				r.Tokens[i] = tokenText(gm.TokenBytes(id))
			}
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

// Detokenize gives the text of token ids: their bytes, what is not UTF-8
// replaced.
func (s *BrokerService) Detokenize(_ context.Context, req *brokerv1.DetokenizeRequest) (*brokerv1.DetokenizeResponse, error) {
	sv, gm, err := s.acquireGenerator("Detokenize", req.GetModel())
	if err != nil {
		return nil, err
	}
	defer s.models.Release(sv)
	var b strings.Builder
	for i, id := range req.GetIds() {
		if id < 0 || int(id) >= gm.VocabSize() {
			return nil, invalid("ids[%d] = %d is outside the vocabulary of %d tokens", i, id, gm.VocabSize())
		}
		b.Write(gm.TokenBytes(id))
		if b.Len() > s.limits.MaxItemBytes {
			return nil, invalid("the text of %d ids is more than %d bytes (--max-item-bytes)", len(req.GetIds()), s.limits.MaxItemBytes)
		}
	}
	return &brokerv1.DetokenizeResponse{Text: strings.ToValidUTF8(b.String(), "\uFFFD")}, nil
}
