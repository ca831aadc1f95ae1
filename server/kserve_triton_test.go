package server

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/server/config"
)

// Triton semantics of ModelInfer's parameters and requested outputs, with
// a client generated from Triton's own grpc_service.proto.
func TestKServeOutputsAndParameters(t *testing.T) {
	var ref *mlpRef
	d, _ := modelDaemon(t, func(repo string) { ref = writeMLP(t, repo, "mlp", 1, 1, 6, 16, 5) },
		func(cfg *config.Config) { cfg.LoadModels = "mlp" })
	k := inference.NewGRPCInferenceServiceClient(d.conn)
	ctx := testCtx(t)
	rows := randRows(5, 3, 6)
	var flat []float32
	for _, r := range rows {
		flat = append(flat, r...)
	}
	input := []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{3, 6}}}
	raw := [][]byte{f32le(flat)}
	i64 := func(n int64) *inference.InferParameter {
		return &inference.InferParameter{ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: n}}
	}
	u64 := func(n uint64) *inference.InferParameter {
		return &inference.InferParameter{ParameterChoice: &inference.InferParameter_Uint64Param{Uint64Param: n}}
	}
	out := func(name string, params map[string]*inference.InferParameter) *inference.ModelInferRequest_InferRequestedOutputTensor {
		return &inference.ModelInferRequest_InferRequestedOutputTensor{Name: name, Parameters: params}
	}

	t.Run("classification", func(t *testing.T) {
		for _, k2 := range []int{2, 5, 9} {
			resp, err := k.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "mlp", Inputs: input, RawInputContents: raw,
				Outputs: []*inference.ModelInferRequest_InferRequestedOutputTensor{out("output", map[string]*inference.InferParameter{"classification": u64(uint64(k2))})}})
			if err != nil {
				t.Fatal(err)
			}
			want := min(k2, 5) // a count above the classes returns them all
			o := resp.GetOutputs()[0]
			if o.GetDatatype() != "BYTES" || !slices.Equal(o.GetShape(), []int64{3, int64(want)}) {
				t.Fatalf("k=%d: output %v", k2, o)
			}
			elems, err := splitBytes(&tensor{name: "output", dtype: "BYTES", shape: o.GetShape(), data: resp.GetRawOutputContents()[0]}, 3*want)
			if err != nil {
				t.Fatal(err)
			}
			for r, row := range rows {
				y := ref.forward(row)
				order := []int{0, 1, 2, 3, 4}
				slices.SortStableFunc(order, func(a, b int) int {
					switch {
					case y[a] > y[b]:
						return -1
					case y[a] < y[b]:
						return 1
					}
					return 0
				})
				for j := range want {
					valStr, idxStr, ok := strings.Cut(string(elems[r*want+j]), ":")
					v, err1 := strconv.ParseFloat(valStr, 64)
					idx, err2 := strconv.Atoi(idxStr)
					if !ok || err1 != nil || err2 != nil {
						t.Fatalf("row %d: %q is not value:index", r, elems[r*want+j])
					}
					if idx != order[j] || math.Abs(v-y[idx]) > 1e-4*(1+math.Abs(y[idx])) {
						t.Errorf("k=%d row %d rank %d: %q, want index %d value %.6f", k2, r, j, elems[r*want+j], order[j], y[order[j]])
					}
				}
			}
		}
	})

	tests := []struct {
		name    string
		params  map[string]*inference.InferParameter
		outputs []*inference.ModelInferRequest_InferRequestedOutputTensor
		code    codes.Code
		msg     []string
	}{
		{"output twice", nil, []*inference.ModelInferRequest_InferRequestedOutputTensor{out("output", nil), out("output", nil)},
			codes.InvalidArgument, []string{`output "output" is requested twice`}},
		{"unknown output parameter", nil, []*inference.ModelInferRequest_InferRequestedOutputTensor{out("output", map[string]*inference.InferParameter{"binary_data": {ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: true}}})},
			codes.InvalidArgument, []string{`parameter "binary_data" is not supported`}},
		{"classification zero", nil, []*inference.ModelInferRequest_InferRequestedOutputTensor{out("output", map[string]*inference.InferParameter{"classification": i64(0)})},
			codes.InvalidArgument, []string{"classification"}},
		{"unknown output", nil, []*inference.ModelInferRequest_InferRequestedOutputTensor{out("probs", nil)},
			codes.InvalidArgument, []string{`output "probs" is not an output`}},
		{"unknown request parameter", map[string]*inference.InferParameter{"my_backend_knob": i64(3)}, nil,
			codes.InvalidArgument, []string{`parameter "my_backend_knob" is not supported`}},
		{"sequence batching", map[string]*inference.InferParameter{"sequence_id": u64(7)}, nil,
			codes.InvalidArgument, []string{"no sequence batching"}},
		{"negative timeout", map[string]*inference.InferParameter{"timeout": i64(-1)}, nil,
			codes.InvalidArgument, []string{"timeout"}},
		{"timeout expires", map[string]*inference.InferParameter{"timeout": u64(1)}, nil,
			codes.DeadlineExceeded, nil},
		{"timeout long enough", map[string]*inference.InferParameter{"timeout": u64(30_000_000)}, nil, codes.OK, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := k.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "mlp", Inputs: input, RawInputContents: raw,
				Parameters: tt.params, Outputs: tt.outputs})
			if tt.code == codes.OK {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantCode(t, err, tt.code, tt.msg...)
		})
	}
}
