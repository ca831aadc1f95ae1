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
	if err := writeInferResult(&b, resp, nil); err != nil {
		t.Fatal(err)
	}
	want := "logits FP32 [2 2]\n  0.5 -1\n  2 3.25\nexecution: model m v2, device cpu:0 (cpu), batch 2"
	if !strings.HasPrefix(b.String(), want) {
		t.Errorf("output:\n%s\nwant prefix:\n%s", b.String(), want)
	}
	b.Reset()
	if err := writeInferJSON(&b, resp, nil); err != nil {
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

// TestInferClasses: an output with a column per label prints each row's
// classes, highest first, as probabilities when it is logits; --json
// names the columns; other outputs print as before.
func TestInferClasses(t *testing.T) {
	labels := []string{"negative", "neutral", "positive"}
	resp := &brokerv1.InferResponse{Model: "sentiment", ModelVersion: 1, Outputs: []*brokerv1.Tensor{
		{Name: "logits", Dtype: brokerv1.DataType_DATA_TYPE_FP32, Shape: []int64{2, 3}, Data: f32data(0, 0, float32(math.Log(2)), 3, 1, 1)},
		{Name: "embedding", Dtype: brokerv1.DataType_DATA_TYPE_FP32, Shape: []int64{2, 2}, Data: f32data(1, 2, 3, 4)},
	}, Execution: &brokerv1.ExecutionInfo{DeviceId: "cpu:0"}}
	var b bytes.Buffer
	if err := writeInferResult(&b, resp, labels); err != nil {
		t.Fatal(err)
	}
	want := "logits FP32 [2 3]\n  0 0 0.693147\n  3 1 1\n" +
		"classes of logits (softmax), highest first:\n" +
		"  [0] positive 0.5000  negative 0.2500  neutral 0.2500\n" +
		"  [1] negative 0.7870  neutral 0.1065  positive 0.1065\n" +
		"embedding FP32 [2 2]\n  1 2\n  3 4\nexecution: "
	if !strings.HasPrefix(b.String(), want) {
		t.Errorf("output:\n%s\nwant prefix:\n%s", b.String(), want)
	}

	// Scores that are not logits print as they are; a wide head prints its top.
	many := []string{"a", "b", "c", "d", "e", "f", "g"}
	one := &brokerv1.InferResponse{Outputs: []*brokerv1.Tensor{
		{Name: "output", Dtype: brokerv1.DataType_DATA_TYPE_FP32, Shape: []int64{7}, Data: f32data(0.1, 0.7, 0.2, 0.9, 0.3, 0.4, 0.8)},
	}}
	b.Reset()
	if err := writeInferResult(&b, one, many); err != nil {
		t.Fatal(err)
	}
	if want := "classes of output, highest first (top 5 of 7):\n  d 0.9  g 0.8  b 0.7  f 0.4  e 0.3\n"; !strings.Contains(b.String(), want) {
		t.Errorf("output:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	if err := writeInferJSON(&b, resp, labels); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Outputs []tensorJSON `json:"outputs"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil || len(doc.Outputs) != 2 {
		t.Fatalf("infer --json: %v\n%s", err, b.String())
	}
	if !slices.Equal(doc.Outputs[0].Labels, labels) || doc.Outputs[1].Labels != nil {
		t.Errorf("labels %q and %q, want %q on logits only", doc.Outputs[0].Labels, doc.Outputs[1].Labels, labels)
	}
	var raw struct {
		Outputs []json.RawMessage `json:"outputs"`
	}
	if err := json.Unmarshal(b.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if _, err := parseTensorJSON("logits", raw.Outputs[0]); err != nil {
		t.Errorf("a labelled output does not read back as an input file: %v", err)
	}
}

func TestLabelsCell(t *testing.T) {
	for _, tt := range []struct {
		in   []string
		want string
	}{
		{nil, ""},
		{[]string{"negative", "positive"}, "negative,positive"},
		{[]string{"a", "b", "c", "d", "e", "f", "g"}, "a,b,c,d,e,... (7)"},
	} {
		if got := labelsCell(tt.in); got != tt.want {
			t.Errorf("labelsCell(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
