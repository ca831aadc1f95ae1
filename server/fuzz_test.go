package server

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/runtime/models"
)

// fuzzSpecs are the input specs of the models brokerd serves: text
// (BYTES) and rows (FP32), with free and fixed dimensions.
var fuzzSpecs = []models.TensorSpec{
	{Name: "text", DType: "BYTES", Shape: []int64{-1}},
	{Name: "input", DType: "FP32", Shape: []int64{-1, 6}},
	{Name: "ids", DType: "INT64", Shape: []int64{-1, -1}},
}

// checkTensor runs the validation a tensor gets before anything is sized
// by it, and what follows on success: every error must be
// INVALID_ARGUMENT, and a tensor that passes must split cleanly.
func checkTensor(t *testing.T, tn tensor, err error) {
	t.Helper()
	if err != nil {
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("conversion error %v is not INVALID_ARGUMENT", err)
		}
		return
	}
	for _, sp := range fuzzSpecs {
		err := check(&tn, sp)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("check error %v is not INVALID_ARGUMENT", err)
			}
			continue
		}
		n, _ := elements(&tn)
		if sp.DType == "BYTES" {
			elems, err := splitBytes(&tn, n)
			if err != nil || len(elems) != n {
				t.Fatalf("a checked BYTES tensor does not split into %d elements: %v", n, err)
			}
		} else if len(tn.data) != n*dtypeSizes[sp.DType] {
			t.Fatalf("a checked tensor has %d bytes for %d elements", len(tn.data), n)
		}
	}
}

// FuzzBrokerTensor feeds arbitrary Infer tensors (as wire bytes) through
// conversion and validation.
func FuzzBrokerTensor(f *testing.F) {
	seeds := []*brokerv1.Tensor{
		{Name: "text", Dtype: brokerv1.DataType_DATA_TYPE_BYTES, Shape: []int64{2}, Data: bytesLE("a", "bc")},
		{Name: "text", Dtype: brokerv1.DataType_DATA_TYPE_BYTES, Shape: []int64{2_000_000_000}, Data: []byte{1, 0, 0, 0, 'x'}},
		{Name: "input", Dtype: brokerv1.DataType_DATA_TYPE_FP32, Shape: []int64{1, 6}, Data: make([]byte, 24)},
		{Name: "input", Dtype: brokerv1.DataType_DATA_TYPE_FP32, Shape: []int64{1 << 40, 1 << 40}, Data: make([]byte, 24)},
		{Name: "ids", Dtype: brokerv1.DataType_DATA_TYPE_INT64, Shape: []int64{-1, 2}},
		{Name: "x", Dtype: 99},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var in brokerv1.Tensor
		if proto.Unmarshal(wire, &in) != nil {
			return
		}
		tn, err := fromBroker(&in)
		checkTensor(t, tn, err)
	})
}

// FuzzKServeTensor feeds arbitrary ModelInfer inputs, raw or typed.
func FuzzKServeTensor(f *testing.F) {
	seeds := []*inference.ModelInferRequest{
		{Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "text", Datatype: "BYTES", Shape: []int64{1},
			Contents: &inference.InferTensorContents{BytesContents: [][]byte{[]byte("hello")}}}}},
		{Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "text", Datatype: "BYTES", Shape: []int64{2_000_000_000}}},
			RawInputContents: [][]byte{{1, 0, 0, 0, 'x'}}},
		{Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{1, 6},
			Contents: &inference.InferTensorContents{Fp32Contents: []float32{1, 2, 3, 4, 5, 6}}}}},
		{Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "ids", Datatype: "INT64", Shape: []int64{1, 2},
			Contents: &inference.InferTensorContents{Int64Contents: []int64{1, 2}}}}},
		{Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "h", Datatype: "FP16", Shape: []int64{2}}}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var req inference.ModelInferRequest
		if proto.Unmarshal(wire, &req) != nil {
			return
		}
		raw := req.GetRawInputContents()
		for i, in := range req.GetInputs() {
			var r []byte
			if i < len(raw) {
				r = raw[i]
			}
			tn, err := fromKServe(in, r, len(raw) > 0)
			checkTensor(t, tn, err)
		}
	})
}
