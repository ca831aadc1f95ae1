package server

import (
	"context"
	"fmt"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/brokerd/brokerd/proto/inference"
)

// streamServer serves k's KServe service with the production codec and
// stream interceptors (parse check, budget) over a budget of budgetBytes.
func streamServer(t *testing.T, k *InferenceService, budgetBytes int64) inference.GRPCInferenceServiceClient {
	t.Helper()
	log := zap.NewNop()
	m := newRPCMetrics(prometheus.NewRegistry())
	budget := newByteBudget(budgetBytes, prometheus.NewRegistry())
	codec := newParseCodec(budget)
	srv := grpc.NewServer(grpc.ForceServerCodecV2(codec),
		grpc.ChainUnaryInterceptor(unaryInterceptor(log, m, codec), budget.unary()),
		grpc.ChainStreamInterceptor(streamInterceptor(log, m, codec), budget.stream(), pacedSends(sendTimeout)))
	inference.RegisterGRPCInferenceServiceServer(srv, k)
	return inference.NewGRPCInferenceServiceClient(serveUnix(t, srv))
}

// TestStreamInferRequestErrorsKeepTheStream: a request of a
// ModelStreamInfer stream that decodes but cannot run (unknown model,
// tensor contents that do not match its shape or datatype, a request
// larger than the in-flight budget) is answered in that response's
// error_message, with its id, and the stream goes on, as Triton's stream
// handler answers a request's failure; the next request is answered.
func TestStreamInferRequestErrorsKeepTheStream(t *testing.T) {
	_, k := dataService(t)
	c := streamServer(t, k, 1<<20)
	ok := func() *inference.ModelInferRequest {
		return &inference.ModelInferRequest{ModelName: "mlp",
			Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{2, 4}}},
			RawInputContents: [][]byte{make([]byte, 2*4*4)}}
	}
	for _, tc := range []struct {
		name string
		bad  func(r *inference.ModelInferRequest)
		want string // in error_message
	}{
		{"unknown model", func(r *inference.ModelInferRequest) { r.ModelName = "nope" }, "NotFound"},
		{"contents shorter than the shape", func(r *inference.ModelInferRequest) { r.RawInputContents[0] = r.RawInputContents[0][:5] }, "InvalidArgument"},
		{"wrong datatype", func(r *inference.ModelInferRequest) { r.Inputs[0].Datatype = "INT8" }, "InvalidArgument"},
		{"typed contents that do not match", func(r *inference.ModelInferRequest) {
			r.RawInputContents = nil
			r.Inputs[0].Contents = &inference.InferTensorContents{Fp32Contents: []float32{1}}
		}, "InvalidArgument"},
		{"larger than the in-flight budget", func(r *inference.ModelInferRequest) {
			r.Inputs[0].Shape = []int64{1 << 16, 4}
			r.RawInputContents[0] = make([]byte, 1<<20)
		}, "InvalidArgument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			st, err := c.ModelStreamInfer(ctx)
			if err != nil {
				t.Fatal(err)
			}
			bad := ok()
			bad.Id = "bad"
			tc.bad(bad)
			good := ok()
			good.Id = "good"
			for _, r := range []*inference.ModelInferRequest{bad, good} {
				if err := st.Send(r); err != nil {
					t.Fatal(err)
				}
			}
			got := map[string]*inference.ModelStreamInferResponse{}
			for range 2 {
				resp, err := st.Recv()
				if err != nil {
					t.Fatalf("the stream ended after a request that failed: %v (answered so far: %v)", err, got)
				}
				got[resp.GetInferResponse().GetId()] = resp
			}
			if e := got["bad"].GetErrorMessage(); !strings.Contains(e, tc.want) {
				t.Errorf("the bad request's error_message = %q, want %s", e, tc.want)
			}
			if e := got["good"].GetErrorMessage(); e != "" || got["good"] == nil {
				t.Errorf("the next request: %v", fmt.Sprint(got["good"]))
			}
			_ = st.CloseSend()
		})
	}
}

// TestStreamGenerateChecksDatatypesFirst: a generation request on a
// stream whose input has the wrong datatype, or is no input of a
// generator, is refused INVALID_ARGUMENT naming the input and the type it
// wants, before its typed contents are converted (2M one-byte varints in
// int64_contents make 16 MiB of INT64 from a 2 MiB message), as ModelInfer
// checks an input's datatype before converting; so is an input of more
// than the one element each of a generator's inputs is.
func TestStreamGenerateChecksDatatypesFirst(t *testing.T) {
	_, k := dataService(t)
	const n = 2 << 20
	ints := make([]int64, n)
	empties := make([][]byte, n) // each 4 bytes with its length prefix
	for _, tc := range []struct {
		name, input, dtype, want string
	}{
		{"text_input as INT64", "text_input", "INT64", `input "text_input": want BYTES, got INT64`},
		{"stream as INT64", "stream", "INT64", `input "stream": want BOOL, got INT64`},
		{"an input no generator has", "ids", "INT64", `input "ids" is not an input of a generator`},
		{"text_input of many elements", "text_input", "BYTES", `input "text_input": want one BYTES element`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			contents := &inference.InferTensorContents{Int64Contents: ints}
			if tc.dtype == "BYTES" {
				contents = &inference.InferTensorContents{BytesContents: empties}
			}
			req := &inference.ModelInferRequest{ModelName: "gen", Inputs: []*inference.ModelInferRequest_InferInputTensor{{
				Name: tc.input, Datatype: tc.dtype, Shape: []int64{n}, Contents: contents}}}
			var err error
			allocated := bytesAllocated(func() {
				err = k.streamGenerate(context.Background(), req, func(*inference.ModelStreamInferResponse) {})
			})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Errorf("streamGenerate: %v, want INVALID_ARGUMENT %q", err, tc.want)
			}
			if allocated > 1<<20 {
				t.Errorf("refusing it allocated %d bytes: its contents were converted (%d bytes as INT64)", allocated, 8*n)
			}
		})
	}
}

// bytesAllocated is what f allocates (the whole process's, so other
// goroutines' too: bound it far above what f should take).
func bytesAllocated(f func()) uint64 {
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	f()
	goruntime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
