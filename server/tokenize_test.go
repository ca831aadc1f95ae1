package server

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestTokenizeRPC: prompts are tokenised as Generate tokenises them, a
// chat's conversations as Chat renders them (the same prompt token count
// as a chat's usage), and ids go back to their text.
func TestTokenizeRPC(t *testing.T) {
	m := &letterModel{ctxLen: 64, defMax: 4}
	cl := genServer(t, m, Limits{MaxItemsPerRequest: 4, MaxItemBytes: 1 << 10})
	ctx := t.Context()
	bytesOf := func(s string) []int32 {
		var ids []int32
		for _, c := range []byte(s) {
			ids = append(ids, int32(c)+2)
		}
		return ids
	}

	r, err := cl.Tokenize(ctx, &brokerv1.TokenizeRequest{Model: "tiny", Prompts: []string{"ab", "ü"}, ReturnTokenStrings: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetContextLength() != 64 || len(r.GetResults()) != 2 ||
		!slices.Equal(r.GetResults()[0].GetIds(), append([]int32{letterBOS}, bytesOf("ab")...)) ||
		!slices.Equal(r.GetResults()[0].GetTokens(), []string{"<s>", "a", "b"}) ||
		!slices.Equal(r.GetResults()[1].GetTokens(), []string{"<s>", `bytes:\xc3`, `bytes:\xbc`}) {
		t.Errorf("prompts: %v", r)
	}
	r, err = cl.Tokenize(ctx, &brokerv1.TokenizeRequest{Model: "tiny", Prompts: []string{"ab"}, AddSpecialTokens: new(bool)})
	if err != nil || !slices.Equal(r.GetResults()[0].GetIds(), bytesOf("ab")) || r.GetResults()[0].GetTokens() != nil {
		t.Errorf("without special tokens: %v %v", r, err)
	}

	conv := &brokerv1.Conversation{Messages: []*brokerv1.ChatMessage{{Role: "system", Content: "s"}, {Role: "user", Content: "hi"}}}
	r, err = cl.Tokenize(ctx, &brokerv1.TokenizeRequest{Model: "tiny", Chat: &brokerv1.ChatRequest{Conversations: []*brokerv1.Conversation{conv}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := bytesOf("<system>s\n<user>hi\n<assistant>"); !slices.Equal(r.GetResults()[0].GetIds(), want) {
		t.Errorf("chat: %v, want %v", r.GetResults()[0].GetIds(), want)
	}
	// Chat's usage counts the same prompt.
	st, err := cl.Chat(ctx, &brokerv1.ChatRequest{Model: "tiny", Conversations: []*brokerv1.Conversation{conv}, Sampling: &brokerv1.SamplingParams{MaxTokens: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var prompt int32
	for {
		msg, err := st.Recv()
		if err != nil {
			break
		}
		for _, res := range msg.GetResults() {
			prompt = res.GetUsage().GetPromptTokens()
		}
	}
	if int(prompt) != len(r.GetResults()[0].GetIds()) {
		t.Errorf("Chat ran %d prompt tokens, Tokenize counted %d", prompt, len(r.GetResults()[0].GetIds()))
	}
	r, err = cl.Tokenize(ctx, &brokerv1.TokenizeRequest{Model: "tiny", Chat: &brokerv1.ChatRequest{Conversations: []*brokerv1.Conversation{conv}, AddGenerationPrompt: new(bool)}})
	if want := bytesOf("<system>s\n<user>hi\n"); err != nil || !slices.Equal(r.GetResults()[0].GetIds(), want) {
		t.Errorf("without the generation prompt: %v %v", r, err)
	}

	d, err := cl.Detokenize(ctx, &brokerv1.DetokenizeRequest{Model: "tiny", Ids: append(bytesOf("hé"), 0xc3+2)})
	if err != nil || d.GetText() != "hé\uFFFD" {
		t.Errorf("detokenize: %q %v", d.GetText(), err)
	}

	for _, tc := range []struct {
		name string
		req  *brokerv1.TokenizeRequest
		code codes.Code
	}{
		{"nothing", &brokerv1.TokenizeRequest{Model: "tiny"}, codes.InvalidArgument},
		{"prompts and a chat", &brokerv1.TokenizeRequest{Model: "tiny", Prompts: []string{"a"}, Chat: &brokerv1.ChatRequest{Conversations: []*brokerv1.Conversation{conv}}}, codes.InvalidArgument},
		{"too many", &brokerv1.TokenizeRequest{Model: "tiny", Prompts: []string{"a", "b", "c", "d", "e"}}, codes.InvalidArgument},
		{"too long", &brokerv1.TokenizeRequest{Model: "tiny", Prompts: []string{strings.Repeat("a", 2<<10)}}, codes.InvalidArgument},
		{"a bad role", &brokerv1.TokenizeRequest{Model: "tiny", Chat: &brokerv1.ChatRequest{Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "robot"}}}}}}, codes.InvalidArgument},
		{"thinking", &brokerv1.TokenizeRequest{Model: "tiny", Chat: &brokerv1.ChatRequest{EnableThinking: new(true), Conversations: []*brokerv1.Conversation{conv}}}, codes.InvalidArgument},
		{"no model", &brokerv1.TokenizeRequest{Prompts: []string{"a"}}, codes.InvalidArgument},
		{"an unknown model", &brokerv1.TokenizeRequest{Model: "nope", Prompts: []string{"a"}}, codes.NotFound},
		{"an encoder", &brokerv1.TokenizeRequest{Model: "enc", Prompts: []string{"a"}}, codes.InvalidArgument},
	} {
		if _, err := cl.Tokenize(ctx, tc.req); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}
	for _, ids := range [][]int32{{-1}, {258}} {
		if _, err := cl.Detokenize(ctx, &brokerv1.DetokenizeRequest{Model: "tiny", Ids: ids}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("detokenize %v: %v", ids, err)
		}
	}
	if _, err := cl.Detokenize(ctx, &brokerv1.DetokenizeRequest{Model: "tiny", Ids: make([]int32, 2<<10)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("detokenize past the item bytes: %v", err)
	}
}
