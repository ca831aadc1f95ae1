package httpapi

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// fakeBackend is a hand-written Backend: Encode gives 4-dimensional vectors
// from the text, Generate and Chat stream a reply in 4-character pieces,
// models "busy", "draining" and anything unknown fail as brokerd would, and
// so does a model of the wrong kind (tiny-llm generates, nbmf-hash-v1
// encodes, tiny-mlp does neither).
type fakeBackend struct {
	lastGenerate *brokerv1.GenerateRequest
	lastChat     *brokerv1.ChatRequest
	lastEncode   *brokerv1.EncodeRequest
}

func (f *fakeBackend) check(model string) error {
	switch model {
	case "tiny-llm", "nbmf-hash-v1", "tiny-mlp":
		return nil
	case "busy":
		st, _ := status.New(codes.ResourceExhausted, "queue full").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)})
		return st.Err()
	case "draining":
		return status.Error(codes.Unavailable, "brokerd is draining")
	}
	return status.Errorf(codes.NotFound, "model %q not found", model)
}

func (f *fakeBackend) Encode(_ context.Context, req *brokerv1.EncodeRequest) (*brokerv1.EncodeResponse, error) {
	f.lastEncode = req
	if err := f.check(req.GetModel()); err != nil {
		return nil, err
	}
	if req.GetModel() != "nbmf-hash-v1" {
		// The broker's own words, which name its gRPC methods.
		return nil, status.Errorf(codes.InvalidArgument, "model %s is a llm model: Encode serves encoders (bert); use Infer", req.GetModel())
	}
	if len(req.GetItems()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "at least one item")
	}
	resp := &brokerv1.EncodeResponse{Model: req.GetModel()}
	for _, it := range req.GetItems() {
		n := float32(len(it.GetText()))
		resp.Results = append(resp.Results, &brokerv1.EncodeResult{Vector: []float32{n, 1, -1, 0.5}})
	}
	return resp, nil
}

// reply streams replies[i] for index i, pieces interleaved, then results.
func reply(replies []string, prompt []int32, finish brokerv1.FinishReason, send func(*brokerv1.GenerationDelta, *brokerv1.GenerationResult) error) error {
	runes := make([][]rune, len(replies))
	for i, r := range replies {
		runes[i] = []rune(r)
	}
	for off := 0; ; off += 4 {
		any := false
		for i, r := range runes {
			if off < len(r) {
				any = true
				piece := string(r[off:min(off+4, len(r))])
				if err := send(&brokerv1.GenerationDelta{Index: int32(i), Text: piece, TokenIds: []int32{int32(off)}}, nil); err != nil {
					return err
				}
			}
		}
		if !any {
			break
		}
	}
	for i, r := range runes {
		res := &brokerv1.GenerationResult{Index: int32(i), FinishReason: finish,
			Usage:            &brokerv1.Usage{PromptTokens: prompt[i], CompletionTokens: int32((len(r) + 3) / 4)},
			TimeToFirstToken: durationpb.New(3 * time.Millisecond),
			Execution:        &brokerv1.ExecutionInfo{DeviceId: "cpu:0", TotalNs: int64(9 * time.Millisecond)}}
		if err := send(nil, res); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeBackend) Generate(req *brokerv1.GenerateRequest, s brokerv1.BrokerService_GenerateServer) error {
	f.lastGenerate = req
	if err := f.check(req.GetModel()); err != nil {
		return err
	}
	if req.GetModel() != "tiny-llm" {
		return status.Errorf(codes.InvalidArgument, "model %s is a mlp model: Generate serves generator (LLM) models", req.GetModel())
	}
	var replies []string
	var prompt []int32
	for _, p := range req.GetPrompts() {
		replies = append(replies, "gen: "+p)
		prompt = append(prompt, int32(len(p)))
	}
	finish := brokerv1.FinishReason_FINISH_REASON_LENGTH
	if req.GetSampling().GetMaxTokens() == 0 {
		finish = brokerv1.FinishReason_FINISH_REASON_STOP
	}
	return reply(replies, prompt, finish, func(d *brokerv1.GenerationDelta, r *brokerv1.GenerationResult) error {
		m := &brokerv1.GenerateResponse{}
		if d != nil {
			m.Deltas = append(m.Deltas, d)
		}
		if r != nil {
			m.Results = append(m.Results, r)
		}
		return s.Send(m)
	})
}

func (f *fakeBackend) Chat(req *brokerv1.ChatRequest, s brokerv1.BrokerService_ChatServer) error {
	f.lastChat = req
	if err := f.check(req.GetModel()); err != nil {
		return err
	}
	if req.GetModel() != "tiny-llm" {
		return status.Errorf(codes.InvalidArgument, "model %s is a mlp model: Generate serves generator (LLM) models", req.GetModel())
	}
	var replies []string
	var prompt []int32
	for _, c := range req.GetConversations() {
		var turns []string
		for _, m := range c.GetMessages() {
			turns = append(turns, m.GetRole()+"="+m.GetContent())
		}
		replies = append(replies, fmt.Sprintf("chat(%s) ünïcode", strings.Join(turns, "|")))
		prompt = append(prompt, int32(len(turns)))
	}
	return reply(replies, prompt, brokerv1.FinishReason_FINISH_REASON_STOP, func(d *brokerv1.GenerationDelta, r *brokerv1.GenerationResult) error {
		m := &brokerv1.ChatResponse{}
		if d != nil {
			m.Deltas = append(m.Deltas, d)
		}
		if r != nil {
			m.Results = append(m.Results, r)
		}
		return s.Send(m)
	})
}

func (f *fakeBackend) ListModels(context.Context, *brokerv1.ListModelsRequest) (*brokerv1.ListModelsResponse, error) {
	return &brokerv1.ListModelsResponse{Models: []*brokerv1.Model{
		{Name: "nbmf-hash-v1", Kind: "hash-encoder", State: brokerv1.ModelState_MODEL_STATE_READY, DeviceIds: []string{"cpu:0"}, MemoryBytes: 4096},
		{Name: "tiny-llm", Kind: "llm", State: brokerv1.ModelState_MODEL_STATE_READY, DeviceIds: []string{"cpu:0"}, MemoryBytes: 1 << 20},
		{Name: "cold", Kind: "bert", State: brokerv1.ModelState_MODEL_STATE_AVAILABLE},
		{Name: "tiny-mlp", Kind: "mlp", State: brokerv1.ModelState_MODEL_STATE_READY, DeviceIds: []string{"cpu:0"}, MemoryBytes: 1024},
	}}, nil
}
