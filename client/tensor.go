package client

import (
	"encoding/binary"
	"fmt"
	"math"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// FloatTensor is an FP32 input of Infer: data in row-major order, its
// length the product of shape.
func FloatTensor(name string, shape []int64, data []float32) *brokerv1.Tensor {
	b := make([]byte, 0, 4*len(data))
	for _, v := range data {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return &brokerv1.Tensor{Name: name, Dtype: brokerv1.DataType_DATA_TYPE_FP32, Shape: shape, Data: b}
}

// Floats reads an FP32 tensor of Infer's answer.
func Floats(t *brokerv1.Tensor) ([]float32, error) {
	if t.GetDtype() != brokerv1.DataType_DATA_TYPE_FP32 {
		return nil, fmt.Errorf("client: tensor %q is %s, not FP32", t.GetName(), t.GetDtype())
	}
	b := t.GetData()
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("client: tensor %q has %d bytes, not a multiple of 4", t.GetName(), len(b))
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, nil
}
