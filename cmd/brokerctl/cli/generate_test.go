package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// genRecorder keeps the last Generate and Chat requests of the fake.
var genRecorder struct {
	sync.Mutex
	generate *brokerv1.GenerateRequest
	chat     *brokerv1.ChatRequest
}

// fakeReply streams reply for each index in 3-character pieces, the prompts'
// pieces interleaved as a batched round would send them, then the results.
func fakeReply(replies []string, send func(deltas []*brokerv1.GenerationDelta, results []*brokerv1.GenerationResult) error) error {
	runes := make([][]rune, len(replies))
	for i, r := range replies {
		runes[i] = []rune(r)
	}
	for off := 0; ; off += 3 {
		var deltas []*brokerv1.GenerationDelta
		for i, r := range runes {
			if off < len(r) {
				piece := string(r[off:min(off+3, len(r))])
				deltas = append(deltas, &brokerv1.GenerationDelta{Index: int32(i), Text: piece, TokenIds: []int32{int32(len(piece))}})
			}
		}
		if len(deltas) == 0 {
			break
		}
		if err := send(deltas, nil); err != nil {
			return err
		}
	}
	var results []*brokerv1.GenerationResult
	for i := range replies {
		results = append(results, &brokerv1.GenerationResult{
			Index: int32(i), FinishReason: brokerv1.FinishReason_FINISH_REASON_LENGTH,
			Usage:            &brokerv1.Usage{PromptTokens: 4, CompletionTokens: int32((len(runes[i]) + 2) / 3)},
			TimeToFirstToken: durationpb.New(12 * time.Millisecond),
			Execution:        &brokerv1.ExecutionInfo{DeviceId: "cpu:0", BatchSize: int32(len(replies)), TotalNs: int64(100 * time.Millisecond)},
		})
	}
	return send(nil, results)
}

func (f *fakeBroker) Generate(req *brokerv1.GenerateRequest, s brokerv1.BrokerService_GenerateServer) error {
	genRecorder.Lock()
	genRecorder.generate = req
	genRecorder.Unlock()
	if req.GetModel() != "tiny-llm" {
		return status.Errorf(codes.NotFound, "model %q not found", req.GetModel())
	}
	replies := make([]string, len(req.GetPrompts()))
	for i, p := range req.GetPrompts() {
		replies[i] = "echo: " + p + " ✓"
	}
	return fakeReply(replies, func(d []*brokerv1.GenerationDelta, r []*brokerv1.GenerationResult) error {
		return s.Send(&brokerv1.GenerateResponse{Deltas: d, Results: r})
	})
}

func (f *fakeBroker) Chat(req *brokerv1.ChatRequest, s brokerv1.BrokerService_ChatServer) error {
	genRecorder.Lock()
	genRecorder.chat = req
	genRecorder.Unlock()
	var replies []string
	for _, c := range req.GetConversations() {
		var turns []string
		for _, m := range c.GetMessages() {
			turns = append(turns, m.GetRole()+":"+m.GetContent())
		}
		replies = append(replies, fmt.Sprintf("%d turns, last %s", len(turns), turns[len(turns)-1]))
	}
	return fakeReply(replies, func(d []*brokerv1.GenerationDelta, r []*brokerv1.GenerationResult) error {
		return s.Send(&brokerv1.ChatResponse{Deltas: d, Results: r})
	})
}

const (
	testSchema  = `{"type": "object", "properties": {"a": {"type": "integer"}}}`
	testGrammar = `root ::= "yes" | "no"`
)

func TestGenerateCommand(t *testing.T) {
	ts := startServer(t)
	dir := t.TempDir()
	schemaFile, grammarFile := filepath.Join(dir, "schema.json"), filepath.Join(dir, "answer.gbnf")
	if err := os.WriteFile(schemaFile, []byte(testSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(grammarFile, []byte(testGrammar), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantOut    []string
		wantErr    string
		checkReq   func(t *testing.T, req *brokerv1.GenerateRequest)
		jsonOutput bool
	}{
		{
			name:    "one prompt streams its text",
			args:    []string{"generate", "--model", "tiny-llm", "--max-tokens", "7", "--temperature", "0.5", "--seed", "3", "--stop", "END", "hello world"},
			wantOut: []string{"echo: hello world ✓\n[length · 4 prompt + 7 tokens · first token 12 ms · 70.0 tokens/s · cpu:0, batch ≤ 1]"},
			checkReq: func(t *testing.T, req *brokerv1.GenerateRequest) {
				sp := req.GetSampling()
				if sp.GetMaxTokens() != 7 || sp.Temperature == nil || sp.GetTemperature() != 0.5 || sp.GetSeed() != 3 || sp.TopP != nil ||
					len(sp.GetStop()) != 1 || sp.GetStop()[0] != "END" {
					t.Errorf("sampling sent: %v", sp)
				}
			},
		},
		{
			name:    "several prompts print in order",
			args:    []string{"generate", "--model", "tiny-llm", "first", "second"},
			wantOut: []string{"── 0 ──\necho: first ✓\n[length", "── 1 ──\necho: second ✓\n[length"},
			checkReq: func(t *testing.T, req *brokerv1.GenerateRequest) {
				if len(req.GetPrompts()) != 2 || req.GetSampling().Temperature != nil || req.AddSpecialTokens != nil {
					t.Errorf("request: %v", req)
				}
			},
		},
		{
			name: "json", args: []string{"generate", "--model", "tiny-llm", "--json", "--no-special-tokens", "--max-time", "2s", "a", "b"},
			jsonOutput: true,
			checkReq: func(t *testing.T, req *brokerv1.GenerateRequest) {
				if req.AddSpecialTokens == nil || req.GetAddSpecialTokens() || req.GetMaxTime().AsDuration() != 2*time.Second {
					t.Errorf("request: %v", req)
				}
			},
		},
		{
			name: "json schema", args: []string{"generate", "--model", "tiny-llm", "--json-schema", schemaFile, "x"},
			checkReq: func(t *testing.T, req *brokerv1.GenerateRequest) {
				if c := req.GetSampling().GetConstraint(); c.GetKind() != brokerv1.Constraint_KIND_JSON_SCHEMA || c.GetSource() != testSchema {
					t.Errorf("constraint: %v", c)
				}
			},
		},
		{
			name: "grammar", args: []string{"generate", "--model", "tiny-llm", "--grammar", grammarFile, "x"},
			checkReq: func(t *testing.T, req *brokerv1.GenerateRequest) {
				if c := req.GetSampling().GetConstraint(); c.GetKind() != brokerv1.Constraint_KIND_GBNF || c.GetSource() != testGrammar {
					t.Errorf("constraint: %v", c)
				}
			},
		},
		{
			name: "regex", args: []string{"generate", "--model", "tiny-llm", "--regex", "[0-9]+", "x"},
			checkReq: func(t *testing.T, req *brokerv1.GenerateRequest) {
				if c := req.GetSampling().GetConstraint(); c.GetKind() != brokerv1.Constraint_KIND_REGEX || c.GetSource() != "[0-9]+" {
					t.Errorf("constraint: %v", c)
				}
			},
		},
		{
			name: "json object", args: []string{"generate", "--model", "tiny-llm", "--json-object", "x"},
			checkReq: func(t *testing.T, req *brokerv1.GenerateRequest) {
				if c := req.GetSampling().GetConstraint(); c.GetKind() != brokerv1.Constraint_KIND_JSON || c.GetSource() != "" {
					t.Errorf("constraint: %v", c)
				}
			},
		},
		{name: "two constraints", args: []string{"generate", "--model", "tiny-llm", "--json-object", "--regex", "a", "x"}, wantCode: ExitUsage, wantErr: "at most one"},
		{name: "missing schema file", args: []string{"generate", "--model", "tiny-llm", "--json-schema", "/nonexistent/schema.json", "x"}, wantCode: ExitUsage, wantErr: "--json-schema"},
		{name: "no model", args: []string{"generate", "x"}, wantCode: ExitUsage, wantErr: "--model NAME is required"},
		{name: "no prompt", args: []string{"generate", "--model", "tiny-llm"}, wantCode: ExitUsage, wantErr: "at least one PROMPT"},
		{name: "unknown model", args: []string{"generate", "--model", "nope", "x"}, wantCode: ExitError, wantErr: "not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ts.run(t, nil, tc.args...)
			if r.code != tc.wantCode {
				t.Fatalf("exit %d, want %d\n%v", r.code, tc.wantCode, r)
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, r.stdout)
				}
			}
			if tc.wantErr != "" && !strings.Contains(r.stderr, tc.wantErr) {
				t.Errorf("stderr lacks %q:\n%s", tc.wantErr, r.stderr)
			}
			if tc.jsonOutput {
				var outs []genOutput
				if err := json.Unmarshal([]byte(r.stdout), &outs); err != nil {
					t.Fatalf("--json output: %v\n%s", err, r.stdout)
				}
				if len(outs) != 2 || outs[1].Text != "echo: b ✓" || outs[1].FinishReason != "length" || outs[0].TimeToFirstMs != 12 {
					t.Errorf("json outputs: %+v", outs)
				}
			}
			if tc.checkReq != nil {
				genRecorder.Lock()
				req := genRecorder.generate
				genRecorder.Unlock()
				tc.checkReq(t, req)
			}
		})
	}
}

func TestChatCommand(t *testing.T) {
	ts := startServer(t)
	r := ts.run(t, nil, "chat", "--model", "tiny-llm", "--message", "system=be brief", "--message", "user=hi there")
	if r.code != 0 || !strings.Contains(r.stdout, "2 turns, last user:hi there") {
		t.Fatalf("one-shot chat:\n%v", r)
	}
	if r := ts.run(t, nil, "chat", "--model", "tiny-llm", "--message", "robot=hi"); r.code != ExitUsage {
		t.Errorf("bad role: %v", r)
	}

	// Interactive: the conversation grows with each answer.
	r = ts.runStdin(t, strings.NewReader("first question\nsecond question\n\n"), "chat", "--model", "tiny-llm", "--system", "sys")
	if r.code != 0 {
		t.Fatalf("interactive chat:\n%v", r)
	}
	if !strings.Contains(r.stdout, "2 turns, last user:first question") || !strings.Contains(r.stdout, "4 turns, last user:second question") {
		t.Errorf("interactive answers:\n%s", r.stdout)
	}
	genRecorder.Lock()
	last := genRecorder.chat.GetConversations()[0].GetMessages()
	genRecorder.Unlock()
	if len(last) != 4 || last[0].GetRole() != "system" || last[2].GetRole() != "assistant" || !strings.HasPrefix(last[2].GetContent(), "2 turns") {
		t.Errorf("last conversation sent: %v", last)
	}
}

func TestBenchGenerate(t *testing.T) {
	ts := startServer(t)
	r := ts.run(t, nil, "bench", "--generate", "--model", "tiny-llm", "--concurrency", "1,3", "--duration", "300ms", "--warmup", "0s", "--max-tokens", "5", "--json")
	if r.code != 0 {
		t.Fatalf("bench --generate:\n%v", r)
	}
	var rep genBenchReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if len(rep.Levels) != 2 || rep.MaxTokens != 5 || !rep.IgnoreEOS {
		t.Fatalf("report: %+v", rep)
	}
	for _, l := range rep.Levels {
		if l.Requests == 0 || l.OutputTokens == 0 || l.FailedRequests != 0 || l.OutputTokensPerSecond <= 0 ||
			l.TimeToFirstTokenMs.P50 <= 0 || l.InterTokenMs.P99 < l.InterTokenMs.P50 || l.MeanBatchSize != 1 {
			t.Errorf("level %d: %+v", l.Concurrency, l)
		}
	}
	genRecorder.Lock()
	sp := genRecorder.generate.GetSampling()
	genRecorder.Unlock()
	if sp.GetMaxTokens() != 5 || !sp.GetIgnoreEos() {
		t.Errorf("sampling sent: %v", sp)
	}
	r = ts.run(t, nil, "bench", "--generate", "--concurrency", "1", "--duration", "100ms", "--warmup", "0s", "--model", "tiny-llm")
	if r.code != 0 || !strings.Contains(r.stdout, "OUT TOK/S") {
		t.Errorf("table:\n%v", r)
	}
	if r := ts.run(t, nil, "bench", "--generate"); r.code != ExitUsage {
		t.Errorf("no model: %v", r)
	}
}
