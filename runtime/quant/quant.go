// Package quant decodes the tensor storage types of GGUF files: the float
// types F32, F16 and BF16 and ggml's block-quantized types Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q4_K, Q5_K and Q6_K, exactly as ggml defines them.
//
// It is the reference of the repository: Dequantize gives the same float32
// bits as ggml's own dequantize_row_* functions (the to_float of ggml's type
// traits), which the tests check bit for bit against llama.cpp's
// libggml-base.so. The CPU kernels and the PJRT path are tested against this
// package, not against their own copies of the layout.
//
// A block type packs BlockElems consecutive elements of a row into BlockBytes
// bytes; a row of n elements takes n/BlockElems blocks, so n must be a
// multiple of BlockElems. The float types are blocks of one element.
package quant

import (
	"errors"
	"fmt"
	"math"
)

// Type is a tensor storage type, numbered as ggml.h's enum ggml_type (the
// number a GGUF file's tensor info stores).
type Type uint32

// The types this package decodes, with ggml's numbers. The numbers between
// them (Q8_1, Q2_K, Q3_K, Q8_K, the IQ and TQ types, MXFP4, …) are ggml types
// this package does not decode yet: Info reports them unknown.
const (
	F32  Type = 0
	F16  Type = 1
	Q4_0 Type = 2
	Q4_1 Type = 3
	Q5_0 Type = 6
	Q5_1 Type = 7
	Q8_0 Type = 8
	Q4_K Type = 12
	Q5_K Type = 13
	Q6_K Type = 14
	BF16 Type = 30
)

// QK_K is the number of elements of a K-quant super-block.
const QK_K = 256

// Info describes a storage type's blocks.
type Info struct {
	// Name is ggml's name of the type (ggml_type_name): "f32", "q4_K", …
	Name string
	// BlockElems is the number of elements a block holds (1 for floats).
	BlockElems int
	// BlockBytes is the size of a block in bytes.
	BlockBytes int
	// Quantized is true for the block-quantized types.
	Quantized bool
}

// The block sizes follow ggml-common.h's block structs (its static_asserts
// give the same numbers).
var infos = map[Type]Info{
	F32:  {"f32", 1, 4, false},
	F16:  {"f16", 1, 2, false},
	BF16: {"bf16", 1, 2, false},
	Q4_0: {"q4_0", 32, 2 + 16, true},                  // d, qs[16]
	Q4_1: {"q4_1", 32, 2 + 2 + 16, true},              // d, m, qs[16]
	Q5_0: {"q5_0", 32, 2 + 4 + 16, true},              // d, qh[4], qs[16]
	Q5_1: {"q5_1", 32, 2 + 2 + 4 + 16, true},          // d, m, qh[4], qs[16]
	Q8_0: {"q8_0", 32, 2 + 32, true},                  // d, qs[32]
	Q4_K: {"q4_K", QK_K, 2 + 2 + 12 + 128, true},      // d, dmin, scales[12], qs[128]
	Q5_K: {"q5_K", QK_K, 2 + 2 + 12 + 32 + 128, true}, // d, dmin, scales[12], qh[32], qs[128]
	Q6_K: {"q6_K", QK_K, 128 + 64 + 16 + 2, true},     // ql[128], qh[64], scales[16], d
}

// Types lists the types this package decodes, in ggml's order.
func Types() []Type {
	return []Type{F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16}
}

// Info returns the type's block layout, and false for a type this package
// does not decode.
func (t Type) Info() (Info, bool) {
	in, ok := infos[t]
	return in, ok
}

// String is ggml's name of the type, or "type(N)" for one this package does
// not know.
func (t Type) String() string {
	if in, ok := infos[t]; ok {
		return in.Name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// ErrUnsupported is returned for a type this package does not decode.
var ErrUnsupported = errors.New("unsupported tensor type")

// ErrLength is returned when an element count is not a whole number of
// blocks, or a buffer's length does not match it.
var ErrLength = errors.New("invalid length for tensor type")

// RowBytes is the size in bytes of n elements of type t: n/BlockElems
// blocks. n must be a non-negative multiple of the type's block size.
func RowBytes(t Type, n int64) (int64, error) {
	in, ok := infos[t]
	if !ok {
		return 0, fmt.Errorf("%w: %v", ErrUnsupported, t)
	}
	if n < 0 || n%int64(in.BlockElems) != 0 {
		return 0, fmt.Errorf("%w: %d elements of %v (blocks of %d)", ErrLength, n, t, in.BlockElems)
	}
	blocks := n / int64(in.BlockElems)
	if blocks > math.MaxInt64/int64(in.BlockBytes) {
		return 0, fmt.Errorf("%w: %d elements of %v overflow", ErrLength, n, t)
	}
	return blocks * int64(in.BlockBytes), nil
}

// Dequantize decodes len(dst) elements of type t from src into dst.
// len(dst) must be a multiple of the type's block size and len(src) exactly
// the bytes of that many blocks (RowBytes), else it returns an error wrapping
// ErrLength (ErrUnsupported for an unknown type) and leaves dst unspecified.
// The values are the bits ggml's dequantize_row_* functions give, NaN and
// infinite scales included.
func Dequantize(t Type, src []byte, dst []float32) error {
	in, ok := infos[t]
	if !ok {
		return fmt.Errorf("%w: %v", ErrUnsupported, t)
	}
	if len(dst)%in.BlockElems != 0 {
		return fmt.Errorf("%w: %d elements of %v (blocks of %d)", ErrLength, len(dst), t, in.BlockElems)
	}
	blocks := len(dst) / in.BlockElems
	if len(src)%in.BlockBytes != 0 || len(src)/in.BlockBytes != blocks {
		return fmt.Errorf("%w: %d bytes for %d elements of %v (want %d)",
			ErrLength, len(src), len(dst), t, blocks*in.BlockBytes)
	}
	switch t {
	case F32:
		f32Row(src, dst)
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(uint16(src[2*i]) | uint16(src[2*i+1])<<8)
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(uint16(src[2*i]) | uint16(src[2*i+1])<<8)
		}
	case Q4_0:
		q4_0Row(src, dst)
	case Q4_1:
		q4_1Row(src, dst)
	case Q5_0:
		q5_0Row(src, dst)
	case Q5_1:
		q5_1Row(src, dst)
	case Q8_0:
		q8_0Row(src, dst)
	case Q4_K:
		q4KRow(src, dst)
	case Q5_K:
		q5KRow(src, dst)
	case Q6_K:
		q6KRow(src, dst)
	}
	return nil
}

// F16ToF32 converts IEEE half-precision bits to float32 exactly as ggml's
// GGML_FP16_TO_FP32 (ggml_compute_fp16_to_fp32): every finite value and the
// infinities exactly; a NaN keeps its sign and payload, shifted into the
// float32 mantissa, with the quiet bit set (what the x86 and Arm conversions
// and ggml's bit-twiddled multiply give).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		bits := sign | 0x7f800000 | mant<<13
		if mant != 0 {
			bits |= 0x00400000
		}
		return math.Float32frombits(bits)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	default:
		// A subnormal half is mant * 2^-24, exact in float32.
		f := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(f))
	}
}

// BF16ToF32 converts bfloat16 bits to float32 (GGML_BF16_TO_FP32: the bits
// shifted up, NaN payloads untouched).
func BF16ToF32(b uint16) float32 {
	return math.Float32frombits(uint32(b) << 16)
}

func f16(b []byte) float32 { return F16ToF32(uint16(b[0]) | uint16(b[1])<<8) }

func f32Row(src []byte, dst []float32) {
	for i := range dst {
		s := src[4*i : 4*i+4]
		dst[i] = math.Float32frombits(uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24)
	}
}
