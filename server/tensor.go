package server

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/proto/inference"
	"github.com/brokerd/brokerd/runtime/models"
)

// tensor is an Infer or ModelInfer tensor in one form for both APIs: a
// KServe datatype name, a shape, and raw little-endian row-major data, BYTES
// elements each as a 4-byte little-endian length and the bytes.
type tensor struct {
	name  string
	dtype string
	shape []int64
	data  []byte
}

// dtypeSizes are the element sizes of the KServe datatypes (BYTES: 0, variable).
var dtypeSizes = map[string]int{
	"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8,
	"INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8,
	"FP16": 2, "BF16": 2, "FP32": 4, "FP64": 8, "BYTES": 0,
}

var dataTypeNames = map[brokerv1.DataType]string{
	brokerv1.DataType_DATA_TYPE_FP32:  "FP32",
	brokerv1.DataType_DATA_TYPE_FP16:  "FP16",
	brokerv1.DataType_DATA_TYPE_BF16:  "BF16",
	brokerv1.DataType_DATA_TYPE_FP64:  "FP64",
	brokerv1.DataType_DATA_TYPE_INT8:  "INT8",
	brokerv1.DataType_DATA_TYPE_INT16: "INT16",
	brokerv1.DataType_DATA_TYPE_INT32: "INT32",
	brokerv1.DataType_DATA_TYPE_INT64: "INT64",
	brokerv1.DataType_DATA_TYPE_UINT8: "UINT8",
	brokerv1.DataType_DATA_TYPE_BOOL:  "BOOL",
	brokerv1.DataType_DATA_TYPE_BYTES: "BYTES",
}

func dataTypeToProto(name string) brokerv1.DataType {
	for k, v := range dataTypeNames {
		if v == name {
			return k
		}
	}
	return brokerv1.DataType_DATA_TYPE_UNSPECIFIED
}

func invalid(format string, a ...any) error {
	return status.Errorf(codes.InvalidArgument, format, a...)
}

func shapeString(s []int64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func specString(sp models.TensorSpec) string {
	return fmt.Sprintf("%s %s %s", sp.Name, sp.DType, shapeString(sp.Shape))
}

// elements is the product of a request shape, refused when a dimension is
// negative or the product overflows what a message could carry.
func elements(t *tensor) (int, error) {
	n := int64(1)
	for i, d := range t.shape {
		if d < 0 {
			return 0, invalid("input %q: shape %s: dimension %d is %d; a request's dimensions are 0 or more", t.name, shapeString(t.shape), i, d)
		}
		if d > 0 && n > math.MaxInt32/d {
			return 0, invalid("input %q: shape %s has too many elements", t.name, shapeString(t.shape))
		}
		n *= d
	}
	return int(n), nil
}

// check validates t against the model's spec of it: datatype, rank, fixed
// dimensions, and the data's length for the shape (BYTES: that the length
// prefixes cover the data exactly, one element per shape element).
func check(t *tensor, sp models.TensorSpec) error {
	if err := dtypeIs(t.name, t.dtype, sp); err != nil {
		return err
	}
	if len(t.shape) != len(sp.Shape) {
		return invalid("input %q: shape %s has %d dimensions, want %d (%s)", t.name, shapeString(t.shape), len(t.shape), len(sp.Shape), specString(sp))
	}
	n, err := elements(t)
	if err != nil {
		return err
	}
	for i, d := range sp.Shape {
		if d >= 0 && t.shape[i] != d {
			return invalid("input %q: shape %s: dimension %d is %d, want %d (%s)", t.name, shapeString(t.shape), i, t.shape[i], d, specString(sp))
		}
	}
	if t.dtype == "BYTES" {
		_, err := splitBytes(t, n)
		return err
	}
	size, ok := dtypeSizes[t.dtype]
	if !ok {
		return invalid("input %q: unknown datatype %q", t.name, t.dtype)
	}
	if want := n * size; len(t.data) != want {
		return invalid("input %q: %d bytes of data, want %d (shape %s of %s, %d bytes each)", t.name, len(t.data), want, shapeString(t.shape), t.dtype, size)
	}
	return nil
}

// dtypeIs is check's first test, which ModelInfer also makes before it
// converts typed contents (checkDType).
func dtypeIs(name, dtype string, sp models.TensorSpec) error {
	if dtype != sp.DType {
		return invalid("input %q: datatype %s, want %s (%s)", name, dtype, sp.DType, specString(sp))
	}
	return nil
}

// checkDType checks the datatype of the model's input name. A datatype
// that is none of KServe's is left to fromKServe and a name the model does
// not take to checkInputs, which say so.
func checkDType(info models.Info, name, dtype string) error {
	if _, ok := dtypeSizes[dtype]; !ok {
		return nil
	}
	required, optional := inputSpecs(info)
	for _, sp := range slices.Concat(required, optional) {
		if sp.Name == name {
			return dtypeIs(name, dtype, sp)
		}
	}
	return nil
}

// splitBytes reads the n length-prefixed elements of a BYTES tensor. n
// comes from the client's shape: it is checked against the bytes received
// (each element has at least its 4-byte prefix) before anything is sized
// by it.
func splitBytes(t *tensor, n int) ([][]byte, error) {
	if n > len(t.data)/4 {
		return nil, invalid("input %q: shape %s has %d BYTES elements but the data is %d bytes; each element takes at least its 4-byte length prefix",
			t.name, shapeString(t.shape), n, len(t.data))
	}
	out := make([][]byte, 0, n)
	rest := t.data
	for i := range n {
		if len(rest) < 4 {
			return nil, invalid("input %q: BYTES element %d of %d: %d bytes left, want a 4-byte little-endian length prefix", t.name, i, n, len(rest))
		}
		l := binary.LittleEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(l) > uint64(len(rest)) {
			return nil, invalid("input %q: BYTES element %d of %d: length %d runs past the end of the data (%d bytes left)", t.name, i, n, l, len(rest))
		}
		out = append(out, rest[:l:l])
		rest = rest[l:]
	}
	if len(rest) > 0 {
		return nil, invalid("input %q: %d bytes after the %d BYTES elements of shape %s", t.name, len(rest), n, shapeString(t.shape))
	}
	return out, nil
}

// joinBytes encodes elements as BYTES data.
func joinBytes(elems [][]byte) []byte {
	n := 0
	for _, e := range elems {
		n += 4 + len(e)
	}
	out := make([]byte, 0, n)
	for _, e := range elems {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(e)))
		out = append(out, e...)
	}
	return out
}

// float32s reads FP32 data (length already checked).
func float32s(data []byte) []float32 {
	out := make([]float32, len(data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return out
}

func float32Bytes(v []float32) []byte {
	out := make([]byte, 0, 4*len(v))
	for _, f := range v {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(f))
	}
	return out
}

// fromBroker converts a broker.v1 tensor.
func fromBroker(t *brokerv1.Tensor) (tensor, error) {
	name, ok := dataTypeNames[t.GetDtype()]
	if !ok {
		return tensor{}, invalid("input %q: dtype %s is invalid: set one of FP32, FP16, BF16, FP64, INT8, INT16, INT32, INT64, UINT8, BOOL, BYTES", t.GetName(), t.GetDtype())
	}
	return tensor{name: t.GetName(), dtype: name, shape: t.GetShape(), data: t.GetData()}, nil
}

// fromKServe converts a KServe input, from raw (when the request carried
// raw_input_contents) or from its typed contents.
func fromKServe(in *inference.ModelInferRequest_InferInputTensor, raw []byte, hasRaw bool) (tensor, error) {
	t := tensor{name: in.GetName(), dtype: in.GetDatatype(), shape: in.GetShape()}
	if _, ok := dtypeSizes[t.dtype]; !ok {
		return t, invalid("input %q: unknown datatype %q: want one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64, BYTES", t.name, t.dtype)
	}
	if hasRaw {
		if in.GetContents() != nil {
			return t, invalid("input %q: contents set together with raw_input_contents; use one or the other", t.name)
		}
		t.data = raw
		return t, nil
	}
	c := in.GetContents()
	n, err := elements(&t)
	if err != nil {
		return t, err
	}
	// The count before any conversion: the shape is the client's claim
	// and the contents what arrived, and only a match is worth building.
	var got int
	switch t.dtype {
	case "BOOL":
		got = len(c.GetBoolContents())
	case "INT8", "INT16", "INT32":
		got = len(c.GetIntContents())
	case "INT64":
		got = len(c.GetInt64Contents())
	case "UINT8", "UINT16", "UINT32":
		got = len(c.GetUintContents())
	case "UINT64":
		got = len(c.GetUint64Contents())
	case "FP32":
		got = len(c.GetFp32Contents())
	case "FP64":
		got = len(c.GetFp64Contents())
	case "BYTES":
		got = len(c.GetBytesContents())
	default: // FP16, BF16
		return t, invalid("input %q: %s data travels only in raw_input_contents (the protocol has no typed field for it)", t.name, t.dtype)
	}
	if got != n {
		return t, invalid("input %q: %d %s elements in contents, want %d (shape %s)", t.name, got, t.dtype, n, shapeString(t.shape))
	}
	le := binary.LittleEndian
	out := make([]byte, 0, n*dtypeSizes[t.dtype]) // exactly; BYTES (size 0): joinBytes sizes its own
	switch t.dtype {
	case "BOOL":
		for _, v := range c.GetBoolContents() {
			b := byte(0)
			if v {
				b = 1
			}
			out = append(out, b)
		}
	case "INT8", "INT16", "INT32":
		for _, v := range c.GetIntContents() {
			switch t.dtype {
			case "INT8":
				out = append(out, byte(int8(v)))
			case "INT16":
				out = le.AppendUint16(out, uint16(int16(v)))
			default:
				out = le.AppendUint32(out, uint32(v))
			}
		}
	case "INT64":
		for _, v := range c.GetInt64Contents() {
			out = le.AppendUint64(out, uint64(v))
		}
	case "UINT8", "UINT16", "UINT32":
		for _, v := range c.GetUintContents() {
			switch t.dtype {
			case "UINT8":
				out = append(out, byte(v))
			case "UINT16":
				out = le.AppendUint16(out, uint16(v))
			default:
				out = le.AppendUint32(out, v)
			}
		}
	case "UINT64":
		for _, v := range c.GetUint64Contents() {
			out = le.AppendUint64(out, v)
		}
	case "FP32":
		for _, v := range c.GetFp32Contents() {
			out = le.AppendUint32(out, math.Float32bits(v))
		}
	case "FP64":
		for _, v := range c.GetFp64Contents() {
			out = le.AppendUint64(out, math.Float64bits(v))
		}
	case "BYTES":
		out = joinBytes(c.GetBytesContents())
	}
	t.data = out
	return t, nil
}
