package cli

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

func f32data(v ...float32) []byte {
	var b []byte
	for _, f := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

func TestParseTensorJSON(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		dtype   brokerv1.DataType
		shape   []int64
		data    []byte
		wantErr string
	}{
		{name: "plain nested array", in: `[[1, 2, 3], [4, 5, 6.5]]`, dtype: brokerv1.DataType_DATA_TYPE_FP32,
			shape: []int64{2, 3}, data: f32data(1, 2, 3, 4, 5, 6.5)},
		{name: "document with flat data", in: `{"shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}`,
			dtype: brokerv1.DataType_DATA_TYPE_FP32, shape: []int64{2, 2}, data: f32data(1, 2, 3, 4)},
		{name: "bytes", in: `{"shape": [2], "datatype": "BYTES", "data": ["ab", ""]}`, dtype: brokerv1.DataType_DATA_TYPE_BYTES,
			shape: []int64{2}, data: []byte{2, 0, 0, 0, 'a', 'b', 0, 0, 0, 0}},
		{name: "int64", in: `{"datatype": "int64", "data": [[-1], [2]]}`, dtype: brokerv1.DataType_DATA_TYPE_INT64,
			shape: []int64{2, 1}, data: []byte{255, 255, 255, 255, 255, 255, 255, 255, 2, 0, 0, 0, 0, 0, 0, 0}},
		{name: "bool", in: `{"datatype": "BOOL", "data": [true, false]}`, dtype: brokerv1.DataType_DATA_TYPE_BOOL,
			shape: []int64{2}, data: []byte{1, 0}},
		{name: "ragged", in: `[[1, 2], [3]]`, wantErr: "ragged array at depth 0: element 1 has shape [1], element 0 [2]"},
		{name: "count against shape", in: `{"shape": [2, 2], "data": [1, 2, 3]}`, wantErr: "3 values for shape [2 2] (4 elements)"},
		{name: "unknown datatype", in: `{"datatype": "FLOAT", "data": [1]}`, wantErr: `datatype "FLOAT"`},
		{name: "fp16 refused", in: `{"datatype": "FP16", "data": [1]}`, wantErr: `datatype "FP16"`},
		{name: "int8 overflow", in: `{"datatype": "INT8", "data": [300]}`, wantErr: "value 0: 300 does not fit INT8"},
		{name: "string in numbers", in: `{"data": [1, "x"]}`, wantErr: "value 1: x is not a number"},
		{name: "number in bytes", in: `{"datatype": "BYTES", "data": [1]}`, wantErr: "value 0: 1 is not a string"},
		{name: "unknown key", in: `{"dims": [1], "data": [1]}`, wantErr: `unknown key "dims"`},
		{name: "no data", in: `{"shape": [1]}`, wantErr: `no "data"`},
		{name: "not json", in: `[1, 2`, wantErr: "not JSON"},
		{name: "scalar document", in: `3`, wantErr: "nested array of numbers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTensorJSON("x", []byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.GetName() != "x" || got.GetDtype() != tt.dtype || !slices.Equal(got.GetShape(), tt.shape) || !bytes.Equal(got.GetData(), tt.data) {
				t.Errorf("tensor = %v, want %v %v %v", got, tt.dtype, tt.shape, tt.data)
			}
		})
	}
}

func TestWriteInferResult(t *testing.T) {
	resp := &brokerv1.InferResponse{Model: "m", ModelVersion: 2, Outputs: []*brokerv1.Tensor{
		{Name: "logits", Dtype: brokerv1.DataType_DATA_TYPE_FP32, Shape: []int64{2, 2}, Data: f32data(0.5, -1, 2, 3.25)},
	}, Execution: &brokerv1.ExecutionInfo{DeviceId: "cpu:0", DeviceType: brokerv1.DeviceType_DEVICE_TYPE_CPU, BatchSize: 2}}
	var b bytes.Buffer
	if err := writeInferResult(&b, resp); err != nil {
		t.Fatal(err)
	}
	want := "logits FP32 [2 2]\n  0.5 -1\n  2 3.25\nexecution: model m v2, device cpu:0 (cpu), batch 2"
	if !strings.HasPrefix(b.String(), want) {
		t.Errorf("output:\n%s\nwant prefix:\n%s", b.String(), want)
	}
	b.Reset()
	if err := writeInferJSON(&b, resp); err != nil {
		t.Fatal(err)
	}
	// Each output of the JSON document reads back as an input file.
	doc := b.String()
	var parsed struct {
		Outputs []json.RawMessage `json:"outputs"`
	}
	if err := json.Unmarshal(b.Bytes(), &parsed); err != nil || len(parsed.Outputs) != 1 {
		t.Fatalf("infer --json: %v\n%s", err, doc)
	}
	back, err := parseTensorJSON("logits", parsed.Outputs[0])
	if err != nil || !bytes.Equal(back.GetData(), resp.GetOutputs()[0].GetData()) || !slices.Equal(back.GetShape(), []int64{2, 2}) {
		t.Errorf("round trip: %v %v", back, err)
	}
	if !strings.Contains(doc, `"data": [`) || !strings.Contains(doc, `"datatype": "FP32"`) || !strings.Contains(doc, `"device_id": "cpu:0"`) {
		t.Errorf("infer --json:\n%s", doc)
	}
}
