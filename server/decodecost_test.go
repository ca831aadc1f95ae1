package server

import (
	"context"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// sh counts shapes for the tests, as a budget's does.
var sh = &shapes{}

// repeatedEmpty is n empty values of field num (wire type bytes): the
// cheapest way to make a decoder build n structs.
func repeatedEmpty(num protowire.Number, n int) []byte {
	var b []byte
	for range n {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, 0)
	}
	return b
}

// TestShapeCostWireMatchesDecoded: what the codec counts from the wire is
// what the budget charges the decoded request, for messages of every
// kind of field (submessages, oneofs, maps of messages, packed scalars,
// strings).
func TestShapeCostWireMatchesDecoded(t *testing.T) {
	temp := float32(0.5)
	for _, tc := range []struct {
		name string
		msg  proto.Message
	}{
		{"empty", &brokerv1.EncodeRequest{}},
		{"encode items (oneofs)", &brokerv1.EncodeRequest{Model: "m", Items: []*brokerv1.EncodeItem{
			{Content: &brokerv1.EncodeItem_Text{Text: "a"}}, {Content: &brokerv1.EncodeItem_Data{Data: []byte{1}}}, {}}}},
		{"chat", &brokerv1.ChatRequest{Model: "m", Conversations: []*brokerv1.Conversation{
			{Messages: []*brokerv1.ChatMessage{{Role: "user", Content: "hi"}, {}}}, {}},
			Sampling: &brokerv1.SamplingParams{Temperature: &temp, Stop: []string{"a", "b"}}}},
		{"generate", &brokerv1.GenerateRequest{Prompts: []string{"", "x", "yy"}}},
		{"kserve (maps of messages, packed ints)", &inference.ModelInferRequest{
			ModelName:  "m",
			Parameters: map[string]*inference.InferParameter{"a": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: 3}}, "b": {}},
			Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "x", Shape: []int64{1, 300, 70000},
				Contents: &inference.InferTensorContents{Fp32Contents: []float32{1, 2, 3}, Int64Contents: []int64{-1, 1 << 40}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			wire := sh.wire(tc.msg.ProtoReflect().Descriptor(), b)
			if got := sh.decoded(tc.msg.ProtoReflect()); got != wire || (wire == 0) != (len(b) == 0) {
				t.Errorf("decoded %d, counted from the wire %d", got, wire)
			}
		})
	}
}

// TestShapeCostCoversDecoding: a request of many empty elements, for the
// repeated fields a client controls, holds once decoded no more than the
// budget charges it for as long as it is served (twice its size and
// shapeCost), and decoding it allocates at most twice what the codec
// charges while it decodes (slices grown by appends leave garbage behind
// them; the charge is for what is live at once). The figures are
// allocations, not times.
func TestShapeCostCoversDecoding(t *testing.T) {
	const n = 100_000
	for _, tc := range []struct {
		name string
		new  func() proto.Message
		wire []byte
	}{
		{"encode items", func() proto.Message { return &brokerv1.EncodeRequest{} }, repeatedEmpty(2, n)},
		{"conversations", func() proto.Message { return &brokerv1.ChatRequest{} }, repeatedEmpty(2, n)},
		{"chat messages", func() proto.Message { return &brokerv1.ChatRequest{} },
			protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), repeatedEmpty(1, n))},
		{"prompts", func() proto.Message { return &brokerv1.GenerateRequest{} }, repeatedEmpty(2, n)},
		{"kserve inputs", func() proto.Message { return &inference.ModelInferRequest{} }, repeatedEmpty(5, n)},
		{"kserve parameters", func() proto.Message { return &inference.ModelInferRequest{} }, repeatedEmpty(4, n)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.new()
			decoding := int64(len(tc.wire)) + sh.wire(m.ProtoReflect().Descriptor(), tc.wire)
			var before, decoded, kept goruntime.MemStats
			goruntime.GC()
			goruntime.ReadMemStats(&before)
			if err := proto.Unmarshal(tc.wire, m); err != nil {
				t.Fatal(err)
			}
			goruntime.ReadMemStats(&decoded)
			goruntime.GC()
			goruntime.ReadMemStats(&kept)
			served := int64(2*proto.Size(m)) + sh.decoded(m.ProtoReflect())
			if alloc := int64(decoded.TotalAlloc - before.TotalAlloc); alloc > 2*decoding {
				t.Errorf("decoding %d bytes allocated %d bytes, more than twice the %d charged while it decodes", len(tc.wire), alloc, decoding)
			}
			if live := int64(kept.HeapAlloc) - int64(before.HeapAlloc); live > served {
				t.Errorf("the decoded request holds %d bytes, more than the %d it is charged while served", live, served)
			}
			goruntime.KeepAlive(m)
		})
	}
}

// TestDecodingChargedFirst: a small request that would decode into more
// than the in-flight budget is refused before it is decoded, and one that
// fits reaches its handler.
func TestDecodingChargedFirst(t *testing.T) {
	const n = 1 << 20 // 2 MiB on the wire, some 150 MB decoded
	msg := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "no-such-model")
	msg = append(msg, repeatedEmpty(5, n)...) // inputs
	need := sh.wire((&inference.ModelInferRequest{}).ProtoReflect().Descriptor(), msg)
	if need < 50*int64(len(msg)) {
		t.Fatalf("the request would decode into %d bytes: not the amplification this test is about", need)
	}
	for _, tc := range []struct {
		name   string
		budget int64
		want   codes.Code
	}{
		{"over the budget", 64 << 20, codes.InvalidArgument},
		{"within it", 1 << 30, codes.NotFound}, // decoded; no such model
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := limitsServer(t, config.Defaults(0, func(string) string { return "" }), tc.budget)
			conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodecV2(preMarshaled{msg})))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var before, after goruntime.MemStats
			goruntime.GC()
			goruntime.ReadMemStats(&before)
			_, err = inference.NewGRPCInferenceServiceClient(conn).ModelInfer(ctx, &inference.ModelInferRequest{})
			goruntime.ReadMemStats(&after)
			if status.Code(err) != tc.want {
				t.Fatalf("answered %v, want %v", err, tc.want)
			}
			alloc := int64(after.TotalAlloc - before.TotalAlloc)
			if tc.want == codes.InvalidArgument {
				if !strings.Contains(err.Error(), "ModelInfer: ") || !strings.Contains(err.Error(), "--max-inflight-bytes") {
					t.Errorf("the refusal %q names neither the method nor the flag", err)
				}
				// The message's own copies (client, transport, codec),
				// never its structs.
				if alloc > need/4 {
					t.Errorf("refusing it allocated %d bytes; decoding it would have been %d", alloc, need)
				}
			}
		})
	}
}

// FuzzShapeCostWire: for any bytes that decode, the codec's count from the
// wire is at least what the decoded request is charged (the wire may
// repeat a field that decoding merges), so a request is never charged
// less while it decodes than once decoded.
func FuzzShapeCostWire(f *testing.F) {
	for _, m := range []proto.Message{
		&brokerv1.ChatRequest{Model: "m", Conversations: []*brokerv1.Conversation{{Messages: []*brokerv1.ChatMessage{{Role: "user"}}}}},
		&inference.ModelInferRequest{Parameters: map[string]*inference.InferParameter{"a": {}},
			Inputs: []*inference.ModelInferRequest_InferInputTensor{{Shape: []int64{1, 2}}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Add(repeatedEmpty(2, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range []proto.Message{&brokerv1.ChatRequest{}, &brokerv1.EncodeRequest{}, &inference.ModelInferRequest{}} {
			wire := sh.wire(m.ProtoReflect().Descriptor(), b)
			if proto.Unmarshal(b, m) != nil {
				continue
			}
			if got := sh.decoded(m.ProtoReflect()); got > wire {
				t.Errorf("%T: decoded %d, more than the %d counted from the wire", m, got, wire)
			}
		}
	})
}
