package httpapi

import (
	"encoding/json"
	"net/http"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// Counting tokens without running the model: vLLM's /tokenize and
// /detokenize, and the Responses API's input token count. Each is
// Tokenize or Detokenize, so a chat counts exactly what it would run.

// vllmTokenize is POST /tokenize: a prompt, or chat messages rendered as
// /v1/chat/completions renders them.
func (h *Handler) vllmTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string          `json:"model"`
		Prompt   *string         `json:"prompt"`
		Messages []openaiMessage `json:"messages"`
		// Unset: true for a prompt, false for messages (the template
		// writes them), as vLLM's.
		AddSpecialTokens     *bool           `json:"add_special_tokens"`
		AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
		ContinueFinalMessage bool            `json:"continue_final_message"`
		ChatTemplateKwargs   map[string]any  `json:"chat_template_kwargs"`
		Tools                []apiTool       `json:"tools"`
		ToolChoice           json.RawMessage `json:"tool_choice"`
		ReturnTokenStrs      bool            `json:"return_token_strs"`
	}
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	tr := &brokerv1.TokenizeRequest{Model: modelName(req.Model), ReturnTokenStrings: req.ReturnTokenStrs}
	switch {
	case req.Prompt != nil && req.Messages != nil:
		h.fail(w, r, paramError("messages", "invalid_value", "give prompt or messages, not both"))
		return
	case req.Prompt != nil:
		tr.Prompts, tr.AddSpecialTokens = []string{*req.Prompt}, req.AddSpecialTokens
	default:
		if req.AddSpecialTokens != nil && *req.AddSpecialTokens {
			h.fail(w, r, paramError("add_special_tokens", "invalid_value", "add_special_tokens with messages is not supported: the chat template writes the special tokens"))
			return
		}
		chat, err := openaiChatShape(req.Messages, req.Tools, req.ToolChoice, req.ChatTemplateKwargs)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		chat.AddGenerationPrompt, chat.ContinueFinalMessage = req.AddGenerationPrompt, req.ContinueFinalMessage
		tr.Chat = chat
	}
	resp, err := h.b.Tokenize(r.Context(), tr)
	if err != nil {
		h.fail(w, r, h.explainKind(r.Context(), err, tr.GetModel(), wantGenerator, true))
		return
	}
	res := resp.GetResults()[0]
	out := map[string]any{"count": len(res.GetIds()), "max_model_len": resp.GetContextLength(), "tokens": nonNilIDs(res.GetIds()), "token_strs": nil}
	if req.ReturnTokenStrs {
		out["token_strs"] = res.GetTokens()
	}
	writeJSON(w, out)
}

// vllmDetokenize is POST /detokenize.
func (h *Handler) vllmDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string  `json:"model"`
		Tokens []int32 `json:"tokens"`
	}
	if err := decode(r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	resp, err := h.b.Detokenize(r.Context(), &brokerv1.DetokenizeRequest{Model: modelName(req.Model), Ids: req.Tokens})
	if err != nil {
		h.fail(w, r, h.explainKind(r.Context(), err, modelName(req.Model), wantGenerator, true))
		return
	}
	writeJSON(w, map[string]any{"prompt": resp.GetText()})
}

// responseInputTokens is POST /v1/responses/input_tokens: what a
// response of this body would take as input, counted as it would run
// (instructions, tools, a previous response's conversation).
func (h *Handler) responseInputTokens(w http.ResponseWriter, r *http.Request) {
	run, err := h.prepareResponse(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	chat := run.chat
	resp, err := h.b.Tokenize(r.Context(), &brokerv1.TokenizeRequest{Model: chat.GetModel(), Chat: chat})
	if err != nil {
		h.fail(w, r, h.explainKind(r.Context(), err, chat.GetModel(), wantGenerator, true))
		return
	}
	writeJSON(w, map[string]any{"object": "response.input_tokens", "input_tokens": len(resp.GetResults()[0].GetIds())})
}
