package server

// Tests of the non-generation data plane (Infer, ModelInfer,
// ModelStreamInfer, Encode) against the daemon's rules: nothing a client
// sends may cost unbounded memory or CPU, every RPC answers with the right
// code, and the in-flight byte budget holds what calls really hold.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/brokerd/brokerd/lifecycle"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/scheduler"
)

// rowsMLP is an MLP's metadata: input "input" FP32 [-1, 4], output
// "output" FP32 [-1, 3]. Its replica (rowsExec) answers each row with
// three values.
type rowsMLP struct{}

func (rowsMLP) Info() models.Info {
	return models.Info{Name: "mlp", Version: 1, Kind: models.KindMLP,
		Inputs:  []models.TensorSpec{{Name: "input", DType: "FP32", Shape: []int64{-1, 4}}},
		Outputs: []models.TensorSpec{{Name: "output", DType: "FP32", Shape: []int64{-1, 3}}}}
}
func (rowsMLP) MemoryBytes(runtime.DType, int) int64 { return 0 }
func (rowsMLP) NewReplica(context.Context, runtime.Device, int) (models.Replica, error) {
	return nil, fmt.Errorf("not used")
}
func (rowsMLP) Cost(any) int { return 1 }

type rowsExec struct{}

func (rowsExec) Execute(_ context.Context, in []any) ([]any, error) {
	out := make([]any, len(in))
	for i := range in {
		out[i] = models.Output{Values: []float32{1, 2, 3}}
	}
	return out, nil
}

// vectorsExec answers each item of the built-in encoder with a 384-value
// vector, as nbmf-hash-v1's replicas do.
type vectorsExec struct{}

func (vectorsExec) Execute(_ context.Context, in []any) ([]any, error) {
	out := make([]any, len(in))
	for i := range in {
		out[i] = make([]float32, 384)
	}
	return out, nil
}

// dataModels is fixedModels with the built-in encoder.
type dataModels struct {
	fixedModels
	enc lifecycle.Encoder
}

func (m dataModels) Builtin(name string) (lifecycle.Encoder, bool) {
	if m.enc != nil && name == m.enc.Name() {
		return m.enc, true
	}
	return nil, false
}
func (m dataModels) DefaultModel() string { return "nbmf-hash-v1" }

// dataService is a BrokerService and its KServe service over a real
// scheduler with the MLP "mlp" (replica on cpu:0) and the built-in encoder.
func dataService(t *testing.T) (*BrokerService, *InferenceService) {
	t.Helper()
	sched := scheduler.New(scheduler.Options{})
	t.Cleanup(sched.Close)
	if err := sched.AddReplica("mlp@1", scheduler.Device{ID: "cpu:0", Type: "cpu"}, 64, rowsExec{}); err != nil {
		t.Fatal(err)
	}
	if err := sched.AddReplica("nbmf-hash-v1", scheduler.Device{ID: "cpu:0", Type: "cpu"}, 1024, vectorsExec{}); err != nil {
		t.Fatal(err)
	}
	sv := lifecycle.ServedModel(rowsMLP{}.Info(), rowsMLP{})
	sv.Key = "mlp@1"
	ms := dataModels{fixedModels: fixedModels{"mlp": sv}, enc: lifecycle.NewHashEncoder()}
	svc := NewBrokerService(nil, Policy{}, DataPlane{sched: sched, models: ms,
		limits: Limits{MaxItemsPerRequest: 4096, MaxItemBytes: 1 << 20}}, zap.NewNop())
	return svc, NewInferenceService(svc, func() bool { return true }, KServeOptions{})
}

func rowsTensor(rows int) *brokerv1.Tensor {
	return &brokerv1.Tensor{Name: "input", Dtype: brokerv1.DataType_DATA_TYPE_FP32,
		Shape: []int64{int64(rows), 4}, Data: make([]byte, rows*4*4)}
}

// TestStreamInferReleasesAnsweredCharges: ModelStreamInfer is a long-lived
// stream (Triton clients keep one open for their life) of independent
// requests: each request's in-flight charge goes back when it is answered,
// not when the stream ends. Before, one client sending requests one after
// another filled --max-inflight-bytes: its own stream then failed
// RESOURCE_EXHAUSTED, and every other call of the daemon was refused.
func TestStreamInferReleasesAnsweredCharges(t *testing.T) {
	_, k := dataService(t)
	budget := newByteBudget(1<<20, prometheus.NewRegistry())
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(budget.stream()))
	inference.RegisterGRPCInferenceServiceServer(srv, k)
	c := inference.NewGRPCInferenceServiceClient(serveUnix(t, srv))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := c.ModelStreamInfer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := &inference.ModelInferRequest{ModelName: "mlp",
		Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{64, 4}}},
		RawInputContents: [][]byte{make([]byte, 64*4*4)}}
	const n = 400 // ~2.4 MiB charged in all at ~6 KiB each, one at a time
	for i := range n {
		req.Id = fmt.Sprint(i)
		if err := st.Send(req); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("request %d of one stream, each answered before the next was sent (%d bytes charged each, budget 1 MiB): %v",
				i, budget.cost(req), err)
		}
		if resp.GetErrorMessage() != "" {
			t.Fatalf("request %d: %s", i, resp.GetErrorMessage())
		}
	}
	if held := testutil.ToFloat64(budget.inflight); held > float64(maxStreamInFlight)*float64(budget.cost(req)) {
		t.Errorf("%v bytes still charged with no request in flight", held)
	}
	_ = st.CloseSend()
}

// TestCallsChargeWhatTheyBuild: an Encode or Infer of many small items
// builds far more than twice its request (an Encode item of one byte makes
// a 1.5 KiB projection and vector, built and serialised), and the budget
// holds that too: with a budget the request fits but its outputs do not,
// the call is refused before it runs; a call the budget takes is answered
// and gives its charge back.
func TestCallsChargeWhatTheyBuild(t *testing.T) {
	svc, _ := dataService(t)
	svc.budget = newByteBudget(4<<20, prometheus.NewRegistry())
	encode := func(n int) error {
		items := make([]*brokerv1.EncodeItem, n)
		for i := range items {
			items[i] = &brokerv1.EncodeItem{Content: &brokerv1.EncodeItem_Data{Data: []byte{'a'}}}
		}
		resp, err := svc.Encode(context.Background(), &brokerv1.EncodeRequest{Items: items})
		if err == nil && proto.Size(resp) > 4<<20 {
			t.Errorf("an Encode answered %d bytes under a budget of 4 MiB", proto.Size(resp))
		}
		return err
	}
	infer := func(rows int) error {
		_, err := svc.Infer(context.Background(), &brokerv1.InferRequest{Model: "mlp", Inputs: []*brokerv1.Tensor{rowsTensor(rows)}})
		return err
	}
	for _, tc := range []struct {
		name string
		call func() error
		ok   bool
	}{
		{"Encode of 4096 one-byte items", func() error { return encode(4096) }, false},
		{"Encode of 16 items", func() error { return encode(16) }, true},
		{"Infer of 64 rows", func() error { return infer(64) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if tc.ok != (err == nil) {
				t.Errorf("%v (want success %v)", err, tc.ok)
			}
			if c := status.Code(err); err != nil && c != codes.ResourceExhausted && c != codes.InvalidArgument {
				t.Errorf("refused with %v, want RESOURCE_EXHAUSTED or INVALID_ARGUMENT", c)
			}
			if held := testutil.ToFloat64(svc.budget.inflight); held != 0 {
				t.Errorf("%v bytes still charged after the call", held)
			}
		})
	}
}

// panicText is a text classifier whose tokenizer panics: a stand-in for
// any bug on ModelInfer's path (tokenizers, classification, a model).
type panicText struct{ rowsMLP }

func (panicText) Info() models.Info {
	return models.Info{Name: "cls", Version: 1, Kind: models.KindBERTClassifier, MaxSeqLen: 8,
		Inputs:  []models.TensorSpec{{Name: "text", DType: "BYTES", Shape: []int64{-1}}},
		Outputs: []models.TensorSpec{{Name: "logits", DType: "FP32", Shape: []int64{-1, 2}}}}
}
func (panicText) Tokenize(context.Context, string, string, bool, bool) (models.TextInput, error) {
	panic("tokenizer bug")
}

// TestStreamInferPanicAnswersInternal: a panic on a request's path (a bug)
// answers INTERNAL, in unary ModelInfer (the interceptor's recover) and in
// ModelStreamInfer, which runs each request on a goroutine of its own
// (streamOne's recover). Run in a child process: without the recover, the
// panic ends the process.
func TestStreamInferPanicAnswersInternal(t *testing.T) {
	if os.Getenv("BROKERD_PANIC_CHILD") == "1" {
		panicChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStreamInferPanicAnswersInternal$", "-test.count=1")
	cmd.Env = append(os.Environ(), "BROKERD_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		lines := strings.Split(string(out), "\n")
		t.Errorf("the daemon process died: %v\n%s", err, strings.Join(lines[:min(len(lines), 12)], "\n"))
	}
}

func panicChild(t *testing.T) {
	sched := scheduler.New(scheduler.Options{})
	t.Cleanup(sched.Close)
	sv := lifecycle.ServedModel(panicText{}.Info(), panicText{})
	sv.Key = "cls@1"
	svc := NewBrokerService(nil, Policy{}, DataPlane{sched: sched, models: fixedModels{"cls": sv},
		limits: Limits{MaxItemsPerRequest: 16, MaxItemBytes: 1 << 10}}, zap.NewNop())
	k := NewInferenceService(svc, func() bool { return true }, KServeOptions{})
	log := zap.NewNop()
	m := newRPCMetrics(prometheus.NewRegistry())
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unaryInterceptor(log, m, nil)), grpc.ChainStreamInterceptor(streamInterceptor(log, m, nil)))
	inference.RegisterGRPCInferenceServiceServer(srv, k)
	c := inference.NewGRPCInferenceServiceClient(serveUnix(t, srv))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := &inference.ModelInferRequest{ModelName: "cls",
		Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "text", Datatype: "BYTES", Shape: []int64{1}}},
		RawInputContents: [][]byte{bytesLE("hello")}}
	if _, err := c.ModelInfer(ctx, req); status.Code(err) != codes.Internal {
		t.Fatalf("unary: %v, want INTERNAL", err)
	}
	st, err := c.ModelStreamInfer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(req); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil || !strings.HasPrefix(resp.GetErrorMessage(), "Internal") {
		t.Fatalf("stream: %v %v, want an Internal error_message", resp, err)
	}
}

// TestStreamInferNobodyReads: a client that sends a few requests, then
// neither reads nor sends, while keeping its connection: once pacedSends
// fails a send, ModelStreamInfer's handler returns (it receives on a
// goroutine of its own), which ends the stream and frees what it held.
// Before, it waited in stream.Recv for as long as the connection lived.
func TestStreamInferNobodyReads(t *testing.T) {
	svc, k := dataService(t)
	svc.limits.MaxItemsPerRequest = 4096
	ended := make(chan error, 1)
	record := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		ended <- err
		return err
	}
	stuck := make(chan error, 16)
	watch := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &sendWatch{ServerStream: ss, failed: stuck})
	}
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(record, pacedSends(200*time.Millisecond), watch))
	inference.RegisterGRPCInferenceServiceServer(srv, k)
	// Fixed windows: the flow stops after 64 KiB of responses.
	c := inference.NewGRPCInferenceServiceClient(serveUnix(t, srv, fixedWindows...))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := c.ModelStreamInfer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const rows = 4096 // a 48 KiB response each
	req := &inference.ModelInferRequest{ModelName: "mlp",
		Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{rows, 4}}},
		RawInputContents: [][]byte{make([]byte, rows*4*4)}}
	for i := range 12 {
		req.Id = fmt.Sprint(i)
		if err := st.Send(req); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	// The client now neither reads nor sends; it keeps the stream open.
	select {
	case <-stuck:
	case <-time.After(30 * time.Second):
		t.Fatal("no send timed out")
	}
	select {
	case err := <-ended:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("the handler returned %v, want the send's UNAVAILABLE", err)
		}
	case <-time.After(30 * time.Second): // the sends time out after 0.2 s
		t.Fatal("ModelStreamInfer's handler is still running 30 s after its sends timed out (blocked in Recv)")
	}
}

// sendWatch reports the sends that fail.
type sendWatch struct {
	grpc.ServerStream
	failed chan error
}

func (s *sendWatch) SendMsg(m any) error {
	err := s.ServerStream.SendMsg(m)
	if err != nil {
		select {
		case s.failed <- err:
		default:
		}
	}
	return err
}
