package daemon

import (
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// TestHostileShapes sends the sizes a client states against the bytes it
// sends: a BYTES tensor claiming 2,000,000,000 elements over 5 bytes
// killed brokerd with a Go out-of-memory error (the shape sized an
// allocation). Each must be INVALID_ARGUMENT, and nothing near the claimed
// size may be allocated.
func TestHostileShapes(t *testing.T) {
	d, c := modelDaemon(t, func(repo string) {
		writeBERT(t, repo, "enc", 1, 4, 0)
		writeMLP(t, repo, "mlp", 1, 1, 6, 8, 3)
	}, func(cfg *config.Config) { cfg.LoadModels = "all"; cfg.MaxItemsPerRequest = 1<<31 - 1 }) // only the data guards
	k := inference.NewGRPCInferenceServiceClient(d.conn)
	ctx := testCtx(t)
	bytesT := brokerv1.DataType_DATA_TYPE_BYTES
	huge := int64(2_000_000_000)
	tests := []struct {
		name   string
		infer  *brokerv1.InferRequest
		kserve *inference.ModelInferRequest
	}{
		{name: "Infer BYTES shape 2e9 over 5 bytes", infer: &brokerv1.InferRequest{Model: "enc", Inputs: []*brokerv1.Tensor{
			{Name: "text", Dtype: bytesT, Shape: []int64{huge}, Data: []byte{1, 0, 0, 0, 'x'}}}}},
		{name: "Infer BYTES length prefix past the data", infer: &brokerv1.InferRequest{Model: "enc", Inputs: []*brokerv1.Tensor{
			{Name: "text", Dtype: bytesT, Shape: []int64{1}, Data: []byte{0xff, 0xff, 0xff, 0x7f, 'x'}}}}},
		{name: "Infer FP32 shape multiplying past int32", infer: &brokerv1.InferRequest{Model: "mlp", Inputs: []*brokerv1.Tensor{
			{Name: "x", Dtype: brokerv1.DataType_DATA_TYPE_FP32, Shape: []int64{1 << 20, 1 << 20}, Data: make([]byte, 24)}}}},
		{name: "KServe raw BYTES shape 2e9 over 5 bytes", kserve: &inference.ModelInferRequest{ModelName: "enc",
			Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "text", Datatype: "BYTES", Shape: []int64{huge}}},
			RawInputContents: [][]byte{{1, 0, 0, 0, 'x'}}}},
		{name: "KServe typed BYTES shape 2e9 with one element", kserve: &inference.ModelInferRequest{ModelName: "enc",
			Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "text", Datatype: "BYTES", Shape: []int64{huge},
				Contents: &inference.InferTensorContents{BytesContents: [][]byte{[]byte("x")}}}}}},
		{name: "KServe typed FP32 shape 2e9 with six values", kserve: &inference.ModelInferRequest{ModelName: "mlp",
			Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{huge, 6},
				Contents: &inference.InferTensorContents{Fp32Contents: []float32{1, 2, 3, 4, 5, 6}}}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			var err error
			if tc.infer != nil {
				_, err = c.Infer(ctx, tc.infer)
			} else {
				_, err = k.ModelInfer(ctx, tc.kserve)
			}
			runtime.ReadMemStats(&after)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("got %v, want INVALID_ARGUMENT", err)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
				t.Errorf("the request allocated %d MiB", grew>>20)
			}
		})
	}
	// Still serving.
	if _, err := c.Infer(ctx, &brokerv1.InferRequest{Model: "enc", Inputs: []*brokerv1.Tensor{
		{Name: "text", Dtype: bytesT, Shape: []int64{1}, Data: bytesLE("still here")}}}); err != nil {
		t.Fatal(err)
	}
}

// TestRequestLargerThanTheQueue: a request that could never fit the queue
// is INVALID_ARGUMENT, not a RESOURCE_EXHAUSTED that tells the client to
// retry for ever.
func TestRequestLargerThanTheQueue(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxQueueItems = 64
	d := startDaemon(t, cfg)
	c := brokerv1.NewBrokerServiceClient(d.conn)
	items := make([]*brokerv1.EncodeItem, 100)
	for i := range items {
		items[i] = &brokerv1.EncodeItem{Content: &brokerv1.EncodeItem_Text{Text: "a record"}}
	}
	_, err := c.Encode(testCtx(t), &brokerv1.EncodeRequest{Items: items})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "split the request") {
		t.Fatalf("100 items against a 64-item queue: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := c.Encode(testCtx(t), &brokerv1.EncodeRequest{Items: items[:64]}); err != nil {
		t.Errorf("64 items: %v", err)
	}
}

// TestEncodeSaysWhatWasTruncated: a text longer than the model takes is
// cut (its vector describes its beginning) and the result says so, and
// how many tokens ran; with truncate=false it is refused.
func TestEncodeSaysWhatWasTruncated(t *testing.T) {
	_, c := modelDaemon(t, func(repo string) { writeBERT(t, repo, "enc", 1, 4, 0) },
		func(cfg *config.Config) { cfg.LoadModels = "enc" })
	long := strings.Repeat("the quick brown fox ", 200)
	resp, err := c.Encode(testCtx(t), &brokerv1.EncodeRequest{Model: "enc", Items: textItems("short text", long)})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.GetResults(); r[0].GetTruncated() || !r[1].GetTruncated() {
		t.Errorf("truncated flags %v %v, want false true", r[0].GetTruncated(), r[1].GetTruncated())
	}
	// Each result counts its tokens, [CLS] and [SEP] included: the cut one
	// as many as the model takes.
	if r := resp.GetResults(); r[0].GetTokens() < 4 || r[1].GetTokens() <= r[0].GetTokens() {
		t.Errorf("tokens %d and %d", r[0].GetTokens(), r[1].GetTokens())
	}
	no := false
	if _, err := c.Encode(testCtx(t), &brokerv1.EncodeRequest{Model: "enc", Truncate: &no, Items: textItems(long)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("truncate=false: %v", err)
	}
}

// TestModelNamesAndMessages: stats answers to the NAME@VERSION its rows
// show, and a missing model's message says "not found" once.
func TestModelNamesAndMessages(t *testing.T) {
	_, c := modelDaemon(t, func(repo string) { writeMLP(t, repo, "mlp", 1, 1, 6, 8, 3) },
		func(cfg *config.Config) { cfg.LoadModels = "mlp" })
	ctx := testCtx(t)
	for _, name := range []string{"mlp", "mlp@1"} {
		resp, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{Model: name})
		if err != nil || len(resp.GetStats()) == 0 || resp.GetStats()[0].GetModel() != "mlp@1" {
			t.Errorf("stats %q: %v %v", name, resp, err)
		}
	}
	if _, err := c.GetStats(ctx, &brokerv1.GetStatsRequest{Model: "mlp@2"}); status.Code(err) != codes.NotFound {
		t.Errorf("stats of a version not served: %v", err)
	}
	_, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: "nope"})
	if status.Code(err) != codes.NotFound || strings.Count(status.Convert(err).Message(), "not found") != 1 {
		t.Errorf("load of a missing model: %v", err)
	}
}
