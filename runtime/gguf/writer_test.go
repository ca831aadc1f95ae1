package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
)

// A small GGUF writer for tests. It writes what it is told, field by field,
// without checking anything, so that hostile files are as easy to make as
// valid ones.

// enc appends little-endian fields.
type enc struct{ b []byte }

func (e *enc) raw(p ...byte) *enc { e.b = append(e.b, p...); return e }
func (e *enc) u8(x uint8) *enc    { e.b = append(e.b, x); return e }
func (e *enc) u16(x uint16) *enc  { e.b = binary.LittleEndian.AppendUint16(e.b, x); return e }
func (e *enc) u32(x uint32) *enc  { e.b = binary.LittleEndian.AppendUint32(e.b, x); return e }
func (e *enc) u64(x uint64) *enc  { e.b = binary.LittleEndian.AppendUint64(e.b, x); return e }
func (e *enc) str(s string) *enc  { return e.u64(uint64(len(s))).raw([]byte(s)...) }

// header starts a file: magic, version, counts.
func header(version uint32, nTensors, nKV uint64) *enc {
	return (&enc{}).raw([]byte(Magic)...).u32(version).u64(nTensors).u64(nKV)
}

// value writes v's payload (not its type tag).
func (e *enc) value(v Value) *enc {
	switch x := v.Data.(type) {
	case uint8:
		e.u8(x)
	case int8:
		e.u8(uint8(x))
	case uint16:
		e.u16(x)
	case int16:
		e.u16(uint16(x))
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case float32:
		e.u32(math.Float32bits(x))
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float64:
		e.u64(math.Float64bits(x))
	case bool:
		if x {
			e.u8(1)
		} else {
			e.u8(0)
		}
	case string:
		e.str(x)
	default:
		e.u32(uint32(v.Elem)).u64(uint64(v.Len()))
		switch a := v.Data.(type) {
		case []uint8:
			each(e, a, func(x uint8) Value { return Value{Data: x} })
		case []int8:
			each(e, a, func(x int8) Value { return Value{Data: x} })
		case []uint16:
			each(e, a, func(x uint16) Value { return Value{Data: x} })
		case []int16:
			each(e, a, func(x int16) Value { return Value{Data: x} })
		case []uint32:
			each(e, a, func(x uint32) Value { return Value{Data: x} })
		case []int32:
			each(e, a, func(x int32) Value { return Value{Data: x} })
		case []float32:
			each(e, a, func(x float32) Value { return Value{Data: x} })
		case []uint64:
			each(e, a, func(x uint64) Value { return Value{Data: x} })
		case []int64:
			each(e, a, func(x int64) Value { return Value{Data: x} })
		case []float64:
			each(e, a, func(x float64) Value { return Value{Data: x} })
		case []bool:
			each(e, a, func(x bool) Value { return Value{Data: x} })
		case []string:
			each(e, a, func(x string) Value { return Value{Data: x} })
		case []Value:
			each(e, a, func(x Value) Value { return x })
		default:
			panic(fmt.Sprintf("test writer: value %T", v.Data))
		}
	}
	return e
}

func each[T any](e *enc, a []T, f func(T) Value) {
	for _, x := range a {
		e.value(f(x))
	}
}

// kv writes a key, its type tag and its value.
func (e *enc) kv(key string, v Value) *enc { return e.str(key).u32(uint32(v.Type)).value(v) }

// tinfo writes a tensor description as given.
func (e *enc) tinfo(name string, dims []uint64, typ uint32, off uint64) *enc {
	e.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		e.u64(d)
	}
	return e.u32(typ).u64(off)
}

// pad appends zeros up to a multiple of align.
func (e *enc) pad(align int) *enc {
	for len(e.b)%align != 0 {
		e.b = append(e.b, 0)
	}
	return e
}

type kvPair struct {
	key string
	v   Value
}

type tspec struct {
	name string
	typ  Type
	dims []int64
}

// validFile is a well-formed v3 file of those key/value pairs and tensors,
// laid out as llama.cpp lays them out: in order, each padded to align (0:
// the default and no general.alignment key), tensor i's byte j being
// pattern(i, j). It returns the file and the tensors as the reader should
// report them.
func validFile(version uint32, align int, kvs []kvPair, ts []tspec) ([]byte, []Tensor) {
	a := align
	if a == 0 {
		a = DefaultAlignment
	} else {
		kvs = append([]kvPair{{AlignmentKey, Value{Type: ValueUint32, Data: uint32(align)}}}, kvs...)
	}
	e := header(version, uint64(len(ts)), uint64(len(kvs)))
	for _, kv := range kvs {
		e.kv(kv.key, kv.v)
	}
	var off int64
	want := make([]Tensor, len(ts))
	for i, t := range ts {
		size := int64(1)
		if len(t.dims) > 0 {
			size = t.dims[0]
		}
		size = size / int64(t.typ.BlockSize()) * int64(t.typ.BlockBytes())
		for _, d := range t.dims[min(1, len(t.dims)):] {
			size *= d
		}
		dims := make([]uint64, len(t.dims))
		for j, d := range t.dims {
			dims[j] = uint64(d)
		}
		e.tinfo(t.name, dims, uint32(t.typ), uint64(off))
		want[i] = Tensor{Name: t.name, Dims: append([]int64{}, t.dims...), Type: t.typ, Offset: off, Size: size}
		off += (size + int64(a) - 1) / int64(a) * int64(a)
	}
	e.pad(a)
	base := int64(len(e.b))
	for i := range want {
		want[i].Offset += base
		e.pad(a)
		for j := range want[i].Size {
			e.u8(pattern(i, j))
		}
	}
	return e.b, want
}

func pattern(i int, j int64) byte { return byte(int64(i)*31 + j) }
