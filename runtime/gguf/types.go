package gguf

import (
	"fmt"
	"math"
	"strconv"
)

// Type is a tensor's storage type: ggml's enum ggml_type, with the values
// ggml.h gives them (they are what a GGUF file stores).
type Type uint32

// The ggml tensor types. Values 4, 5, 31–33 and 36–38 were types that ggml
// removed (Q4_2, Q4_3 and the interleaved Q4_0_*/IQ4_NL_* layouts); they have
// names for messages but no sizes, so a tensor of one is refused.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
	NVFP4   Type = 40
	Q1_0    Type = 41
	Q2_0    Type = 42
)

// typeInfo is one row of ggml's type_traits: elements per block and bytes
// per block. A zero block marks a removed type.
type typeInfo struct {
	name         string
	block, bytes int
}

// types is indexed by Type. The sizes are ggml's (ggml.c type_traits, the
// block structs of ggml-common.h), checked in the tests against llama.cpp's
// own ggml_blck_size and ggml_type_size.
var types = [...]typeInfo{
	F32:     {"F32", 1, 4},
	F16:     {"F16", 1, 2},
	Q4_0:    {"Q4_0", 32, 18},
	Q4_1:    {"Q4_1", 32, 20},
	4:       {"Q4_2", 0, 0},
	5:       {"Q4_3", 0, 0},
	Q5_0:    {"Q5_0", 32, 22},
	Q5_1:    {"Q5_1", 32, 24},
	Q8_0:    {"Q8_0", 32, 34},
	Q8_1:    {"Q8_1", 32, 36},
	Q2_K:    {"Q2_K", 256, 84},
	Q3_K:    {"Q3_K", 256, 110},
	Q4_K:    {"Q4_K", 256, 144},
	Q5_K:    {"Q5_K", 256, 176},
	Q6_K:    {"Q6_K", 256, 210},
	Q8_K:    {"Q8_K", 256, 292},
	IQ2_XXS: {"IQ2_XXS", 256, 66},
	IQ2_XS:  {"IQ2_XS", 256, 74},
	IQ3_XXS: {"IQ3_XXS", 256, 98},
	IQ1_S:   {"IQ1_S", 256, 50},
	IQ4_NL:  {"IQ4_NL", 32, 18},
	IQ3_S:   {"IQ3_S", 256, 110},
	IQ2_S:   {"IQ2_S", 256, 82},
	IQ4_XS:  {"IQ4_XS", 256, 136},
	I8:      {"I8", 1, 1},
	I16:     {"I16", 1, 2},
	I32:     {"I32", 1, 4},
	I64:     {"I64", 1, 8},
	F64:     {"F64", 1, 8},
	IQ1_M:   {"IQ1_M", 256, 56},
	BF16:    {"BF16", 1, 2},
	31:      {"Q4_0_4_4", 0, 0},
	32:      {"Q4_0_4_8", 0, 0},
	33:      {"Q4_0_8_8", 0, 0},
	TQ1_0:   {"TQ1_0", 256, 54},
	TQ2_0:   {"TQ2_0", 256, 66},
	36:      {"IQ4_NL_4_4", 0, 0},
	37:      {"IQ4_NL_4_8", 0, 0},
	38:      {"IQ4_NL_8_8", 0, 0},
	MXFP4:   {"MXFP4", 32, 17},
	NVFP4:   {"NVFP4", 64, 36},
	Q1_0:    {"Q1_0", 128, 18},
	Q2_0:    {"Q2_0", 64, 18},
}

func (t Type) info() typeInfo {
	if int64(t) < int64(len(types)) {
		return types[t]
	}
	return typeInfo{}
}

// String is ggml's name of the type in upper case ("Q4_K", "F32", "BF16");
// a value ggml.h does not name is "type(NN)".
func (t Type) String() string {
	if n := t.info().name; n != "" {
		return n
	}
	return "type(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// BlockSize is the number of elements in one block: 1 for the plain types
// (F32, F16, BF16, I8 … F64), 32 for Q4_0 … Q8_1, 256 for the K and most IQ
// types. It is 0 for a type this reader cannot size (removed or unknown).
func (t Type) BlockSize() int { return t.info().block }

// BlockBytes is the number of bytes one block occupies (Q8_0: 34, Q4_K: 144,
// Q6_K: 210); 0 for a type this reader cannot size.
func (t Type) BlockBytes() int { return t.info().bytes }

// RowBytes is the number of bytes of a row of n elements. It fails with
// ErrUnsupportedType for a type it cannot size, and with ErrInvalid when n is
// negative, not a multiple of the block size, or too large to count in bytes.
func (t Type) RowBytes(n int64) (int64, error) {
	ti := t.info()
	if ti.block == 0 {
		return 0, fmt.Errorf("%w: %s", ErrUnsupportedType, t.describe())
	}
	if n < 0 {
		return 0, fmt.Errorf("%w: a row of %d elements of %s", ErrInvalid, n, t)
	}
	if n%int64(ti.block) != 0 {
		return 0, fmt.Errorf("%w: a row of %d elements of %s is not a whole number of %d-element blocks", ErrInvalid, n, t, ti.block)
	}
	blocks := n / int64(ti.block)
	if blocks > math.MaxInt64/int64(ti.bytes) {
		return 0, fmt.Errorf("%w: a row of %d elements of %s overflows a byte count", ErrInvalid, n, t)
	}
	return blocks * int64(ti.bytes), nil
}

// describe names the type and its number, and says when ggml removed it.
func (t Type) describe() string {
	ti := t.info()
	switch {
	case ti.name == "":
		return fmt.Sprintf("unknown ggml type %d", uint32(t))
	case ti.block == 0:
		return fmt.Sprintf("ggml type %s (%d), which ggml removed", ti.name, uint32(t))
	default:
		return fmt.Sprintf("%s (%d)", ti.name, uint32(t))
	}
}
