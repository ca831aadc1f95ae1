package client_test

import (
	"iter"
	"testing"

	"github.com/brokerd/brokerd/client"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// Answers gathers a chat's calls of tools apart from the text, per
// conversation and in order, as brokerd streams them (each whole, in the
// delta where its text ended).
func TestAnswersToolCalls(t *testing.T) {
	call := func(i int32, name string) *brokerv1.ToolCall {
		return &brokerv1.ToolCall{Id: "call_" + name, Name: name, Arguments: `{"a":1}`, Index: i}
	}
	msgs := []*brokerv1.ChatResponse{
		{Deltas: []*brokerv1.GenerationDelta{{Index: 0, Text: "Let me"}, {Index: 1, Text: "Hi"}}},
		{Deltas: []*brokerv1.GenerationDelta{{Index: 0, Text: " check.", ToolCalls: []*brokerv1.ToolCall{call(0, "f")}}}},
		{Deltas: []*brokerv1.GenerationDelta{{Index: 0, ToolCalls: []*brokerv1.ToolCall{call(1, "g")}}},
			Results: []*brokerv1.GenerationResult{{Index: 0, FinishReason: brokerv1.FinishReason_FINISH_REASON_TOOL_CALLS},
				{Index: 1, FinishReason: brokerv1.FinishReason_FINISH_REASON_STOP}}},
	}
	var seq iter.Seq2[*brokerv1.ChatResponse, error] = func(yield func(*brokerv1.ChatResponse, error) bool) {
		for _, m := range msgs {
			if !yield(m, nil) {
				return
			}
		}
	}
	ans, err := client.Answers(seq)
	if err != nil || len(ans) != 2 {
		t.Fatalf("Answers: %v, %v", ans, err)
	}
	a := ans[0]
	if a.Text != "Let me check." || len(a.ToolCalls) != 2 || a.ToolCalls[0].GetName() != "f" || a.ToolCalls[1].GetName() != "g" ||
		a.Result.GetFinishReason() != brokerv1.FinishReason_FINISH_REASON_TOOL_CALLS {
		t.Errorf("answer 0: %+v", a)
	}
	if ans[1].Text != "Hi" || ans[1].ToolCalls != nil {
		t.Errorf("answer 1: %+v", ans[1])
	}
}
