package gguf

import (
	"math"
	"slices"
	"strconv"
)

// ValueType is the type of a metadata value: gguf.h's enum gguf_type.
type ValueType uint32

// The metadata value types, with the values a file stores.
const (
	ValueUint8   ValueType = 0
	ValueInt8    ValueType = 1
	ValueUint16  ValueType = 2
	ValueInt16   ValueType = 3
	ValueUint32  ValueType = 4
	ValueInt32   ValueType = 5
	ValueFloat32 ValueType = 6
	ValueBool    ValueType = 7
	ValueString  ValueType = 8
	ValueArray   ValueType = 9
	ValueUint64  ValueType = 10
	ValueInt64   ValueType = 11
	ValueFloat64 ValueType = 12
)

var valueTypeNames = [...]string{
	ValueUint8: "uint8", ValueInt8: "int8", ValueUint16: "uint16", ValueInt16: "int16",
	ValueUint32: "uint32", ValueInt32: "int32", ValueFloat32: "float32", ValueBool: "bool",
	ValueString: "string", ValueArray: "array", ValueUint64: "uint64", ValueInt64: "int64",
	ValueFloat64: "float64",
}

// String names the type ("uint32", "string", "array"); an unknown one is
// "value_type(NN)".
func (t ValueType) String() string {
	if int64(t) < int64(len(valueTypeNames)) {
		return valueTypeNames[t]
	}
	return "value_type(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// minBytes is the fewest bytes one value of the type takes in a file (its
// size, for the fixed-size types; 0 for an unknown type).
func (t ValueType) minBytes() int64 {
	switch t {
	case ValueUint8, ValueInt8, ValueBool:
		return 1
	case ValueUint16, ValueInt16:
		return 2
	case ValueUint32, ValueInt32, ValueFloat32:
		return 4
	case ValueUint64, ValueInt64, ValueFloat64, ValueString:
		return 8 // a string: its length
	case ValueArray:
		return 4 + 8 // element type, count
	}
	return 0
}

// goBytes is what one element of an array of t takes decoded: the Go
// value, or a string's header (its bytes are charged as read) or a Value
// of an array of arrays.
func (t ValueType) goBytes() int64 {
	switch t {
	case ValueString:
		return stringHeadBytes
	case ValueArray:
		return valueBytes
	}
	return t.minBytes()
}

// Value is one metadata value. Data holds, by Type: uint8, int8, uint16,
// int16, uint32, int32, uint64, int64, float32, float64, bool or string; for
// an array (Type ValueArray) a slice of those by Elem ([]uint8 … []string),
// or []Value for an array of arrays.
type Value struct {
	Type ValueType
	Elem ValueType // an array's element type; zero otherwise
	Data any
}

// Len is the number of elements of an array, 0 for other values.
func (v Value) Len() int {
	switch a := v.Data.(type) {
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float32:
		return len(a)
	case []float64:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []Value:
		return len(a)
	}
	return 0
}

func (v Value) typeName() string {
	if v.Type == ValueArray {
		return "array of " + v.Elem.String()
	}
	return v.Type.String()
}

// asInt64 is an integer value as int64; ok is false for other types and
// for a uint64 above MaxInt64.
func asInt64(x any) (int64, bool) {
	switch x := x.(type) {
	case uint8:
		return int64(x), true
	case int8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case int16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	}
	return 0, false
}

// Value returns the metadata value of key.
func (f *File) Value(key string) (Value, bool) {
	v, ok := f.KV[key]
	return v, ok
}

// String returns a string value.
func (f *File) String(key string) (string, bool) {
	s, ok := f.KV[key].Data.(string)
	return s, ok
}

// Uint returns an integer value of any unsigned type, or of a signed type
// when it is not negative.
func (f *File) Uint(key string) (uint64, bool) {
	x := f.KV[key].Data
	if u, ok := x.(uint64); ok {
		return u, true
	}
	n, ok := asInt64(x)
	if !ok || n < 0 {
		return 0, false
	}
	return uint64(n), true
}

// Int returns an integer value of any signed type, or of an unsigned type
// when it fits an int64.
func (f *File) Int(key string) (int64, bool) {
	return asInt64(f.KV[key].Data)
}

// Float returns a float32 or float64 value.
func (f *File) Float(key string) (float64, bool) {
	switch x := f.KV[key].Data.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, bool) {
	b, ok := f.KV[key].Data.(bool)
	return b, ok
}

// Strings returns an array of strings (a copy of the slice).
func (f *File) Strings(key string) ([]string, bool) {
	a, ok := f.KV[key].Data.([]string)
	if !ok {
		return nil, false
	}
	return slices.Clone(a), true
}

// Ints returns an array of any integer type as int64s; false when an
// element is a uint64 above MaxInt64.
func (f *File) Ints(key string) ([]int64, bool) {
	switch a := f.KV[key].Data.(type) {
	case []uint8:
		return widen(a), true
	case []int8:
		return widen(a), true
	case []uint16:
		return widen(a), true
	case []int16:
		return widen(a), true
	case []uint32:
		return widen(a), true
	case []int32:
		return widen(a), true
	case []int64:
		return slices.Clone(a), true
	case []uint64:
		out := make([]int64, len(a))
		for i, x := range a {
			if x > math.MaxInt64 {
				return nil, false
			}
			out[i] = int64(x)
		}
		return out, true
	}
	return nil, false
}

func widen[T uint8 | int8 | uint16 | int16 | uint32 | int32](a []T) []int64 {
	out := make([]int64, len(a))
	for i, x := range a {
		out[i] = int64(x)
	}
	return out
}

// Floats returns an array of float32 (a copy), or of float64 rounded to
// float32.
func (f *File) Floats(key string) ([]float32, bool) {
	switch a := f.KV[key].Data.(type) {
	case []float32:
		return slices.Clone(a), true
	case []float64:
		out := make([]float32, len(a))
		for i, x := range a {
			out[i] = float32(x)
		}
		return out, true
	}
	return nil, false
}
