package server

// Regression tests of the non-generation data plane (Infer, ModelInfer,
// Encode) against the daemon's rules: nothing a client sends may cost
// unbounded memory or CPU, sizes are checked before anything is built from
// them, and work for a caller that has gone is dropped. The fixtures
// (dataService, rowsMLP, ...) are dataplane_limits_test.go's.

import (
	"context"
	"fmt"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/lifecycle"
	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/scheduler"
)

// TestInferRefusesRepeatedOutputName: each output name of an Infer request
// is a full copy of the output in the answer. A name given twice (once
// 10,000 times: 122 MB of answer for a 96 KB request), an empty name, or
// more names than the model has outputs is INVALID_ARGUMENT, as ModelInfer
// answers.
func TestInferRefusesRepeatedOutputName(t *testing.T) {
	svc, _ := dataService(t)
	repeat := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = "output"
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		rows    int
		outputs []string
	}{
		{"twice", 1, repeat(2)},
		{"10000 times over 1024 rows", 1024, repeat(10000)},
		{"empty", 1, []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &brokerv1.InferRequest{Model: "mlp", Inputs: []*brokerv1.Tensor{rowsTensor(tc.rows)}, Outputs: tc.outputs}
			resp, err := svc.Infer(context.Background(), req)
			if status.Code(err) == codes.InvalidArgument {
				return
			}
			got := 0
			for _, o := range resp.GetOutputs() {
				got += len(o.GetData())
			}
			t.Errorf("got %v with %d output tensors, %d bytes of output data for a %d-byte request; want INVALID_ARGUMENT",
				err, len(resp.GetOutputs()), got, proto.Size(req))
		})
	}
	// The one output, named once, is answered.
	resp, err := svc.Infer(context.Background(), &brokerv1.InferRequest{Model: "mlp", Inputs: []*brokerv1.Tensor{rowsTensor(2)}, Outputs: []string{"output"}})
	if err != nil || len(resp.GetOutputs()) != 1 || len(resp.GetOutputs()[0].GetData()) != 2*3*4 {
		t.Errorf("the model's output named once: %v, %v", resp.GetOutputs(), err)
	}
}

// TestKServeRequestedOutputsBoundedByTheModel: ModelInfer's outputs are
// the client's list (millions of names fit in a message); a search of the
// names before each for repeats was quadratic, 300,000 distinct names
// minutes of a core. No more names are read than the model has outputs
// and one: the rest are refused unread.
func TestKServeRequestedOutputsBoundedByTheModel(t *testing.T) {
	_, k := dataService(t)
	infer := func(names ...string) error {
		outs := make([]*inference.ModelInferRequest_InferRequestedOutputTensor, len(names))
		for i, n := range names {
			outs[i] = &inference.ModelInferRequest_InferRequestedOutputTensor{Name: n}
		}
		_, err := k.ModelInfer(context.Background(), &inference.ModelInferRequest{ModelName: "mlp",
			Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{1, 4}}},
			RawInputContents: [][]byte{make([]byte, 16)}, Outputs: outs})
		return err
	}
	for _, n := range []int{1000, 300_000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("o%07d", i)
			}
			names[0] = "output"
			if err := infer(names...); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "more outputs than the model's 1") {
				t.Errorf("%d distinct output names for a model of one output: %v, want INVALID_ARGUMENT for more outputs than the model's", n, err)
			}
		})
	}
	// Within the bound, a repeat is refused and a name answers.
	if err := infer("output", "output"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `output "output" is requested twice`) {
		t.Errorf("an output requested twice: %v, want INVALID_ARGUMENT", err)
	}
	if err := infer("output"); err != nil {
		t.Errorf("the model's output requested once: %v", err)
	}
}

// TestKServeTimeoutDoesNotWrap: the timeout parameter (microseconds) is
// capped for an int64_param as for a uint64_param; uncapped,
// time.Duration(us)*time.Microsecond wrapped, and a client asking for a
// very long timeout got a few hundred nanoseconds (DEADLINE_EXCEEDED), or
// a negative one, taken as none.
func TestKServeTimeoutDoesNotWrap(t *testing.T) {
	const capped = (1 << 40) * time.Microsecond // about 12.7 days
	for _, us := range []int64{18446744073709552, 9223372036854776, 1 << 62, 1<<63 - 1} {
		for _, p := range []*inference.InferParameter{
			{ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: us}},
			{ParameterChoice: &inference.InferParameter_Uint64Param{Uint64Param: uint64(us)}},
		} {
			if d, err := requestTimeout(p); err != nil || d != capped {
				t.Errorf("timeout %v: %v, %v; want %v", p, d, err, capped)
			}
		}
	}
	if d, err := requestTimeout(&inference.InferParameter{ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: 1500}}); err != nil || d != 1500*time.Microsecond {
		t.Errorf("timeout 1500 µs: %v, %v", d, err)
	}
	if _, err := requestTimeout(&inference.InferParameter{ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: -1}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("timeout -1 µs: %v, want INVALID_ARGUMENT", err)
	}
	// End to end: a valid request with a 584,000-year timeout is answered.
	_, k := dataService(t)
	_, err := k.ModelInfer(context.Background(), &inference.ModelInferRequest{ModelName: "mlp",
		Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{1, 4}}},
		RawInputContents: [][]byte{make([]byte, 16)},
		Parameters:       map[string]*inference.InferParameter{"timeout": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: 18446744073709552}}}})
	if err != nil {
		t.Errorf("ModelInfer with a 584,000-year timeout: %v", err)
	}
}

// allocated is what f allocates (TotalAlloc: bytes, cumulative).
func allocated(f func()) uint64 {
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	f()
	goruntime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestKServeTypedContentsCheckedBeforeConversion: typed contents are
// converted to raw bytes only once their count matches the shape, into one
// buffer of exactly the right size, and ModelInfer checks an input's
// datatype against the model before converting: one-byte varints grow
// eightfold into INT64. Before, 8 million int64_contents against a shape
// of one element built 375 MiB, growing append by append, before the
// count was refused.
func TestKServeTypedContentsCheckedBeforeConversion(t *testing.T) {
	in := &inference.ModelInferRequest_InferInputTensor{Name: "input", Datatype: "INT64", Shape: []int64{1},
		Contents: &inference.InferTensorContents{Int64Contents: make([]int64, 8<<20)}}
	wire := proto.Size(in)
	var err error
	if grew := allocated(func() { _, err = fromKServe(in, nil, false) }); grew > uint64(wire) {
		t.Errorf("refusing a %d-byte tensor whose count does not match its shape allocated %d MiB", wire, grew>>20)
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("count mismatch: %v, want INVALID_ARGUMENT", err)
	}

	// A matching count is converted into one allocation, whatever the type.
	for _, c := range []*inference.ModelInferRequest_InferInputTensor{
		{Name: "x", Datatype: "INT64", Shape: []int64{1 << 16}, Contents: &inference.InferTensorContents{Int64Contents: make([]int64, 1<<16)}},
		{Name: "x", Datatype: "INT16", Shape: []int64{1 << 16}, Contents: &inference.InferTensorContents{IntContents: make([]int32, 1<<16)}},
		{Name: "x", Datatype: "BOOL", Shape: []int64{1 << 16}, Contents: &inference.InferTensorContents{BoolContents: make([]bool, 1<<16)}},
		{Name: "x", Datatype: "FP64", Shape: []int64{1 << 16}, Contents: &inference.InferTensorContents{Fp64Contents: make([]float64, 1<<16)}},
	} {
		var tn tensor
		if allocs := testing.AllocsPerRun(3, func() { tn, err = fromKServe(c, nil, false) }); err != nil || allocs != 1 {
			t.Errorf("%s contents: %v allocations (%v), want 1", c.Datatype, allocs, err)
		}
		if want := (1 << 16) * dtypeSizes[c.Datatype]; len(tn.data) != want || cap(tn.data) != want {
			t.Errorf("%s contents: %d bytes (capacity %d), want %d", c.Datatype, len(tn.data), cap(tn.data), want)
		}
	}

	// ModelInfer: an INT64 input with a count matching its shape, for a
	// model that takes FP32, is refused without being converted.
	_, k := dataService(t)
	const rows = 1 << 20
	req := &inference.ModelInferRequest{ModelName: "mlp", Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "INT64", Shape: []int64{rows, 4},
		Contents: &inference.InferTensorContents{Int64Contents: make([]int64, rows*4)}}}}
	wire = proto.Size(req)
	if grew := allocated(func() { _, err = k.ModelInfer(context.Background(), req) }); grew > uint64(wire) {
		t.Errorf("refusing a %d-byte INT64 input for an FP32 model allocated %d MiB", wire, grew>>20)
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("INT64 input for an FP32 model: %v, want INVALID_ARGUMENT", err)
	}
}

// stubEncoder is a repository text encoder (kind bert) whose tokenizer
// answers one token: Encode's LOSSLESS codes in encode_text.go need no
// more.
type stubEncoder struct{ rowsMLP }

func (stubEncoder) Info() models.Info {
	return models.Info{Name: "enc", Version: 1, Kind: models.KindBERT, MaxSeqLen: 8,
		Inputs:  []models.TensorSpec{{Name: "text", DType: "BYTES", Shape: []int64{-1}}},
		Outputs: []models.TensorSpec{{Name: "embedding", DType: "FP32", Shape: []int64{-1, 3}}}}
}
func (stubEncoder) Tokenize(context.Context, string, string, bool, bool) (models.TextInput, error) {
	return models.TextInput{IDs: []int32{1}}, nil
}

// noInventory has no devices.
type noInventory struct{ Inventory }

func (noInventory) Device(id string) (detect.Entry, error) {
	return detect.Entry{}, fmt.Errorf("device %s: no inventory in this test", id)
}

// TestEncodeStopsCompressingForACallerThatLeft: Encode's LOSSLESS codes
// (zstd, host CPU) stop between items when the caller has gone, for the
// built-in encoder (compressed on a goroutine every way out waits for)
// and a repository encoder; before, every item of up to a 64 MiB message
// was compressed first. Here the caller has left before the call starts.
func TestEncodeStopsCompressingForACallerThatLeft(t *testing.T) {
	items := make([]*brokerv1.EncodeItem, 16)
	for i := range items {
		data := make([]byte, 1<<20)
		for j := range data {
			data[j] = byte(j*7919 + i*31 + j>>8) // little to compress
		}
		items[i] = &brokerv1.EncodeItem{Content: &brokerv1.EncodeItem_Data{Data: data}}
	}
	builtin, _ := dataService(t)
	builtin.inv = noInventory{} // a LOSSLESS answer looks up the host's cost
	sched := scheduler.New(scheduler.Options{})
	t.Cleanup(sched.Close)
	sv := lifecycle.ServedModel(stubEncoder{}.Info(), stubEncoder{})
	sv.Key = "enc@1"
	repo := NewBrokerService(nil, Policy{}, DataPlane{sched: sched, models: dataModels{fixedModels: fixedModels{"enc": sv}},
		limits: Limits{MaxItemsPerRequest: 4096, MaxItemBytes: 1 << 20}}, zap.NewNop())
	for _, tc := range []struct {
		name string
		svc  *BrokerService
		req  *brokerv1.EncodeRequest
	}{
		{"built-in, both", builtin, &brokerv1.EncodeRequest{Items: items, Fidelity: brokerv1.Fidelity_FIDELITY_BOTH}},
		{"built-in, lossless", builtin, &brokerv1.EncodeRequest{Items: items, Fidelity: brokerv1.Fidelity_FIDELITY_LOSSLESS}},
		{"repository, lossless", repo, &brokerv1.EncodeRequest{Model: "enc", Items: items, Fidelity: brokerv1.Fidelity_FIDELITY_LOSSLESS}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			var err error
			grew := allocated(func() { _, err = tc.svc.Encode(ctx, tc.req) })
			if status.Code(err) != codes.Canceled {
				t.Errorf("got %v, want CANCELLED", err)
			}
			if grew > 4<<20 {
				t.Errorf("a call whose caller had left allocated %d MiB (its items compressed)", grew>>20)
			}
		})
	}
	// A caller that stays gets its codes.
	for _, svc := range []*BrokerService{builtin, repo} {
		req := &brokerv1.EncodeRequest{Items: items[:2], Fidelity: brokerv1.Fidelity_FIDELITY_LOSSLESS}
		if svc == repo {
			req.Model = "enc"
		}
		resp, err := svc.Encode(context.Background(), req)
		if err != nil || len(resp.GetResults()) != 2 || len(resp.GetResults()[1].GetCode()) == 0 {
			t.Errorf("LOSSLESS of %q for a caller that stays: %v", req.Model, err)
		}
	}
}
