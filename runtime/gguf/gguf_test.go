package gguf

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
)

func parseBytes(b []byte, lim Limits) (*File, error) {
	return Parse(bytes.NewReader(b), int64(len(b)), lim)
}

func TestTypeTable(t *testing.T) {
	for _, tc := range []struct {
		typ          Type
		name         string
		block, bytes int
	}{
		{F32, "F32", 1, 4}, {F16, "F16", 1, 2}, {BF16, "BF16", 1, 2}, {F64, "F64", 1, 8},
		{I8, "I8", 1, 1}, {I16, "I16", 1, 2}, {I32, "I32", 1, 4}, {I64, "I64", 1, 8},
		{Q4_0, "Q4_0", 32, 18}, {Q4_1, "Q4_1", 32, 20}, {Q5_0, "Q5_0", 32, 22}, {Q5_1, "Q5_1", 32, 24},
		{Q8_0, "Q8_0", 32, 34}, {Q8_1, "Q8_1", 32, 36},
		{Q2_K, "Q2_K", 256, 84}, {Q3_K, "Q3_K", 256, 110}, {Q4_K, "Q4_K", 256, 144},
		{Q5_K, "Q5_K", 256, 176}, {Q6_K, "Q6_K", 256, 210}, {Q8_K, "Q8_K", 256, 292},
		{IQ2_XXS, "IQ2_XXS", 256, 66}, {IQ2_XS, "IQ2_XS", 256, 74}, {IQ3_XXS, "IQ3_XXS", 256, 98},
		{IQ1_S, "IQ1_S", 256, 50}, {IQ4_NL, "IQ4_NL", 32, 18}, {IQ3_S, "IQ3_S", 256, 110},
		{IQ2_S, "IQ2_S", 256, 82}, {IQ4_XS, "IQ4_XS", 256, 136}, {IQ1_M, "IQ1_M", 256, 56},
		{TQ1_0, "TQ1_0", 256, 54}, {TQ2_0, "TQ2_0", 256, 66}, {MXFP4, "MXFP4", 32, 17},
		{NVFP4, "NVFP4", 64, 36}, {Q1_0, "Q1_0", 128, 18}, {Q2_0, "Q2_0", 64, 18},
		// Removed from ggml: named, not sizable.
		{4, "Q4_2", 0, 0}, {5, "Q4_3", 0, 0}, {31, "Q4_0_4_4", 0, 0}, {32, "Q4_0_4_8", 0, 0},
		{33, "Q4_0_8_8", 0, 0}, {36, "IQ4_NL_4_4", 0, 0}, {37, "IQ4_NL_4_8", 0, 0}, {38, "IQ4_NL_8_8", 0, 0},
		// Unknown.
		{43, "type(43)", 0, 0}, {99, "type(99)", 0, 0}, {math.MaxUint32, "type(4294967295)", 0, 0},
	} {
		if got := tc.typ.String(); got != tc.name {
			t.Errorf("Type(%d).String() = %q, want %q", uint32(tc.typ), got, tc.name)
		}
		if got := tc.typ.BlockSize(); got != tc.block {
			t.Errorf("%s.BlockSize() = %d, want %d", tc.name, got, tc.block)
		}
		if got := tc.typ.BlockBytes(); got != tc.bytes {
			t.Errorf("%s.BlockBytes() = %d, want %d", tc.name, got, tc.bytes)
		}
	}
	for i := range types {
		if types[i].name == "" && i < int(Q2_0) {
			t.Errorf("type %d has no name", i)
		}
	}
}

func TestRowBytes(t *testing.T) {
	for _, tc := range []struct {
		typ     Type
		n       int64
		want    int64
		wantErr error
	}{
		{F32, 0, 0, nil}, {F32, 7, 28, nil}, {BF16, 3, 6, nil},
		{Q8_0, 64, 68, nil}, {Q4_K, 4096, 16 * 144, nil}, {Q6_K, 256, 210, nil},
		{Q4_K, 100, 0, ErrInvalid}, {Q8_0, -32, 0, ErrInvalid},
		{F32, math.MaxInt64/2 + 1, 0, ErrInvalid},
		{31, 32, 0, ErrUnsupportedType}, {99, 32, 0, ErrUnsupportedType},
	} {
		got, err := tc.typ.RowBytes(tc.n)
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
			t.Errorf("%s.RowBytes(%d) error %v, want %v", tc.typ, tc.n, err, tc.wantErr)
			continue
		}
		if got != tc.want {
			t.Errorf("%s.RowBytes(%d) = %d, want %d", tc.typ, tc.n, got, tc.want)
		}
	}
}

// everyValue is one key of each value type, arrays of each element type
// and arrays of arrays.
func everyValue() []kvPair {
	return []kvPair{
		{"general.architecture", Value{Type: ValueString, Data: "qwen3"}},
		{"v.u8", Value{Type: ValueUint8, Data: uint8(250)}},
		{"v.i8", Value{Type: ValueInt8, Data: int8(-5)}},
		{"v.u16", Value{Type: ValueUint16, Data: uint16(65000)}},
		{"v.i16", Value{Type: ValueInt16, Data: int16(-32000)}},
		{"v.u32", Value{Type: ValueUint32, Data: uint32(4e9)}},
		{"v.i32", Value{Type: ValueInt32, Data: int32(-2e9)}},
		{"v.f32", Value{Type: ValueFloat32, Data: float32(1e-6)}},
		{"v.bool", Value{Type: ValueBool, Data: true}},
		{"v.false", Value{Type: ValueBool, Data: false}},
		{"v.str", Value{Type: ValueString, Data: "{% for m in messages %}ü{% endfor %}"}},
		{"v.empty", Value{Type: ValueString, Data: ""}},
		{"v.u64", Value{Type: ValueUint64, Data: uint64(math.MaxUint64)}},
		{"v.i64", Value{Type: ValueInt64, Data: int64(math.MinInt64)}},
		{"v.f64", Value{Type: ValueFloat64, Data: math.Pi}},
		{"a.u8", Value{Type: ValueArray, Elem: ValueUint8, Data: []uint8{0, 1, 255}}},
		{"a.i8", Value{Type: ValueArray, Elem: ValueInt8, Data: []int8{-128, 127}}},
		{"a.u16", Value{Type: ValueArray, Elem: ValueUint16, Data: []uint16{1, 65535}}},
		{"a.i16", Value{Type: ValueArray, Elem: ValueInt16, Data: []int16{-1}}},
		{"a.u32", Value{Type: ValueArray, Elem: ValueUint32, Data: []uint32{7, 4e9}}},
		{"a.i32", Value{Type: ValueArray, Elem: ValueInt32, Data: []int32{1, 3, 3, 4}}},
		{"a.f32", Value{Type: ValueArray, Elem: ValueFloat32, Data: []float32{-1.5, 0, float32(math.Inf(1))}}},
		{"a.bool", Value{Type: ValueArray, Elem: ValueBool, Data: []bool{true, false}}},
		{"a.str", Value{Type: ValueArray, Elem: ValueString, Data: []string{"Ġthe", "", "<|im_end|>"}}},
		{"a.u64", Value{Type: ValueArray, Elem: ValueUint64, Data: []uint64{1, math.MaxUint64}}},
		{"a.u64small", Value{Type: ValueArray, Elem: ValueUint64, Data: []uint64{1, 2}}},
		{"a.i64", Value{Type: ValueArray, Elem: ValueInt64, Data: []int64{math.MinInt64}}},
		{"a.f64", Value{Type: ValueArray, Elem: ValueFloat64, Data: []float64{0.1}}},
		{"a.none", Value{Type: ValueArray, Elem: ValueFloat32, Data: []float32{}}},
		{"a.nested", Value{Type: ValueArray, Elem: ValueArray, Data: []Value{
			{Type: ValueArray, Elem: ValueString, Data: []string{"x", "y"}},
			{Type: ValueArray, Elem: ValueArray, Data: []Value{
				{Type: ValueArray, Elem: ValueInt32, Data: []int32{9}},
			}},
			{Type: ValueArray, Elem: ValueBool, Data: []bool{}},
		}}},
	}
}

func TestValuesRoundTrip(t *testing.T) {
	for _, version := range []uint32{2, 3} {
		kvs := everyValue()
		b, _ := validFile(version, 0, kvs, nil)
		f, err := parseBytes(b, Limits{})
		if err != nil {
			t.Fatalf("v%d: %v", version, err)
		}
		if f.Version != version || f.Alignment != DefaultAlignment || len(f.Tensors) != 0 {
			t.Errorf("v%d: version %d alignment %d tensors %d", version, f.Version, f.Alignment, len(f.Tensors))
		}
		var keys []string
		for _, kv := range kvs {
			keys = append(keys, kv.key)
			got, ok := f.Value(kv.key)
			if !ok || !reflect.DeepEqual(got, kv.v) {
				t.Errorf("v%d: %s = %#v, %v; want %#v", version, kv.key, got, ok, kv.v)
			}
		}
		if !slices.Equal(f.Keys, keys) {
			t.Errorf("v%d: Keys %v, want %v", version, f.Keys, keys)
		}
	}
}

func TestGetters(t *testing.T) {
	b, _ := validFile(3, 0, everyValue(), nil)
	f, err := parseBytes(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		v  any
		ok bool
	}
	r := func(v any, ok bool) res { return res{v, ok} }
	for _, tc := range []struct {
		name      string
		got, want res
	}{
		{"String", r(f.String("general.architecture")), res{"qwen3", true}},
		{"String empty", r(f.String("v.empty")), res{"", true}},
		{"String of u32", r(f.String("v.u32")), res{"", false}},
		{"String missing", r(f.String("nope")), res{"", false}},
		{"Uint u8", r(f.Uint("v.u8")), res{uint64(250), true}},
		{"Uint u32", r(f.Uint("v.u32")), res{uint64(4e9), true}},
		{"Uint u64", r(f.Uint("v.u64")), res{uint64(math.MaxUint64), true}},
		{"Uint negative i8", r(f.Uint("v.i8")), res{uint64(0), false}},
		{"Uint of f32", r(f.Uint("v.f32")), res{uint64(0), false}},
		{"Uint of bool", r(f.Uint("v.bool")), res{uint64(0), false}},
		{"Int i64", r(f.Int("v.i64")), res{int64(math.MinInt64), true}},
		{"Int i16", r(f.Int("v.i16")), res{int64(-32000), true}},
		{"Int u16", r(f.Int("v.u16")), res{int64(65000), true}},
		{"Int u64 too big", r(f.Int("v.u64")), res{int64(0), false}},
		{"Int of string", r(f.Int("v.str")), res{int64(0), false}},
		{"Float f32", r(f.Float("v.f32")), res{float64(float32(1e-6)), true}},
		{"Float f64", r(f.Float("v.f64")), res{math.Pi, true}},
		{"Float of int", r(f.Float("v.i32")), res{float64(0), false}},
		{"Bool", r(f.Bool("v.bool")), res{true, true}},
		{"Bool false", r(f.Bool("v.false")), res{false, true}},
		{"Bool of u8", r(f.Bool("v.u8")), res{false, false}},
		{"Strings", r(f.Strings("a.str")), res{[]string{"Ġthe", "", "<|im_end|>"}, true}},
		{"Strings of scalar", r(f.Strings("v.str")), res{[]string(nil), false}},
		{"Ints i32", r(f.Ints("a.i32")), res{[]int64{1, 3, 3, 4}, true}},
		{"Ints u8", r(f.Ints("a.u8")), res{[]int64{0, 1, 255}, true}},
		{"Ints i8", r(f.Ints("a.i8")), res{[]int64{-128, 127}, true}},
		{"Ints u16", r(f.Ints("a.u16")), res{[]int64{1, 65535}, true}},
		{"Ints i16", r(f.Ints("a.i16")), res{[]int64{-1}, true}},
		{"Ints u32", r(f.Ints("a.u32")), res{[]int64{7, 4e9}, true}},
		{"Ints i64", r(f.Ints("a.i64")), res{[]int64{math.MinInt64}, true}},
		{"Ints u64 small", r(f.Ints("a.u64small")), res{[]int64{1, 2}, true}},
		{"Ints u64 too big", r(f.Ints("a.u64")), res{[]int64(nil), false}},
		{"Ints of floats", r(f.Ints("a.f32")), res{[]int64(nil), false}},
		{"Ints of scalar", r(f.Ints("v.i32")), res{[]int64(nil), false}},
		{"Floats f32", r(f.Floats("a.f32")), res{[]float32{-1.5, 0, float32(math.Inf(1))}, true}},
		{"Floats f64", r(f.Floats("a.f64")), res{[]float32{0.1}, true}},
		{"Floats empty", r(f.Floats("a.none")), res{[]float32{}, true}},
		{"Floats of ints", r(f.Floats("a.i32")), res{[]float32(nil), false}},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s: got %#v, want %#v", tc.name, tc.got, tc.want)
		}
	}
	// The slices handed out are copies.
	s, _ := f.Strings("a.str")
	s[0] = "changed"
	if s2, _ := f.Strings("a.str"); s2[0] != "Ġthe" {
		t.Error("Strings returned the file's own slice")
	}
	if n := f.KV["a.nested"].Len(); n != 3 {
		t.Errorf("a.nested Len %d, want 3", n)
	}
}

// sizableTypes are the types with a block size, one tensor of each.
func sizableTypes() []tspec {
	var ts []tspec
	for i := range types {
		typ := Type(i)
		if typ.BlockSize() == 0 {
			continue
		}
		ts = append(ts, tspec{"t." + typ.String(), typ, []int64{2 * int64(typ.BlockSize()), 3}})
	}
	return append(ts,
		tspec{"scalar", F32, nil},
		tspec{"vec", F32, []int64{5}},
		tspec{"cube", F16, []int64{4, 3, 2}},
		tspec{"hyper", BF16, []int64{2, 1, 3, 2}},
		tspec{"empty", Q4_K, []int64{0, 7}},
		tspec{"emptyrows", F32, []int64{3, 0}},
		tspec{"blk.0.attn_q.weight", Q8_0, []int64{64, 2}},
	)
}

func TestTensorSizing(t *testing.T) {
	dir := t.TempDir()
	for _, align := range []int{0, 1, 8, 64, 4096} {
		b, want := validFile(3, align, []kvPair{{"general.architecture", Value{Type: ValueString, Data: "llama"}}}, sizableTypes())
		path := filepath.Join(dir, "m.gguf")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		parsed, err := parseBytes(b, Limits{})
		if err != nil {
			t.Fatalf("align %d: Parse: %v", align, err)
		}
		opened, err := Open(path, Limits{})
		if err != nil {
			t.Fatalf("align %d: Open: %v", align, err)
		}
		for _, f := range []*File{parsed, opened} {
			wantAlign := int64(align)
			if align == 0 {
				wantAlign = DefaultAlignment
			}
			if f.Alignment != wantAlign || f.DataOffset%wantAlign != 0 || f.Size != int64(len(b)) {
				t.Errorf("align %d: Alignment %d DataOffset %d Size %d", align, f.Alignment, f.DataOffset, f.Size)
			}
			if !reflect.DeepEqual(f.Tensors, want) {
				t.Fatalf("align %d: tensors\n got %+v\nwant %+v", align, f.Tensors, want)
			}
			for i := range want {
				tt, ok := f.Tensor(want[i].Name)
				if !ok || tt != &f.Tensors[i] {
					t.Fatalf("Tensor(%q) = %v, %v", want[i].Name, tt, ok)
				}
				data, err := f.TensorData(tt)
				if err != nil {
					t.Fatalf("TensorData(%q): %v", tt.Name, err)
				}
				if int64(len(data)) != tt.Size {
					t.Fatalf("TensorData(%q): %d bytes, want %d", tt.Name, len(data), tt.Size)
				}
				for j := range data {
					if data[j] != pattern(i, int64(j)) {
						t.Fatalf("TensorData(%q)[%d] = %d, want %d", tt.Name, j, data[j], pattern(i, int64(j)))
					}
				}
			}
			if _, ok := f.Tensor("missing"); ok {
				t.Error("Tensor(missing) found")
			}
		}
		if err := opened.Close(); err != nil {
			t.Fatal(err)
		}
		if err := opened.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if _, err := opened.TensorData(&opened.Tensors[0]); err == nil {
			t.Error("TensorData after Close succeeded")
		}
	}
}

func TestElements(t *testing.T) {
	for _, tc := range []struct {
		dims []int64
		want int64
	}{{nil, 1}, {[]int64{5}, 5}, {[]int64{4, 3, 2}, 24}, {[]int64{0, 1 << 62, 1 << 62}, 0}} {
		tt := Tensor{Dims: tc.dims}
		if got := tt.Elements(); got != tc.want {
			t.Errorf("Elements(%v) = %d, want %d", tc.dims, got, tc.want)
		}
	}
}

func TestOpenMapsTheFile(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("mapping is checked on Linux")
	}
	b, _ := validFile(3, 0, nil, []tspec{{"a", F32, []int64{8}}, {"b", Q8_0, []int64{32}}})
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, _ := f.TensorData(&f.Tensors[0])
	c, _ := f.TensorData(&f.Tensors[1])
	// Both are views of one mapping: their addresses differ by the offsets.
	if f.data == nil || &f.data[f.Tensors[0].Offset] != &a[0] || &f.data[f.Tensors[1].Offset] != &c[0] {
		t.Error("TensorData did not return slices of the mapping")
	}
	if cap(a) != len(a) {
		t.Errorf("TensorData's slice has capacity %d past its %d bytes", cap(a), len(a))
	}
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(dir, Limits{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Open(directory) = %v, want ErrInvalid", err)
	}
	if _, err := Open(filepath.Join(dir, "missing"), Limits{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) = %v, want ErrNotExist", err)
	}
	empty := filepath.Join(dir, "empty.gguf")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Open(empty, Limits{})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), empty) {
		t.Errorf("Open(empty) = %v, want ErrInvalid naming the file", err)
	}
	bad := filepath.Join(dir, "bad.gguf")
	hostile := header(3, 0, 1).str("k").u32(uint32(ValueString)).u64(1 << 60).b
	if err := os.WriteFile(bad, hostile, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Open(bad, Limits{})
	if !errors.Is(err, ErrInvalid) || !errors.Is(err, models.ErrInvalidModel) || !strings.Contains(err.Error(), bad) {
		t.Errorf("Open(hostile) = %v, want ErrInvalid naming the file", err)
	}
}

func TestHostile(t *testing.T) {
	okTensor := func(e *enc) *enc { return e.tinfo("w", []uint64{8}, uint32(F32), 0) }
	// withData pads a header to the default alignment and adds n data bytes.
	withData := func(e *enc, n int) []byte { return append(e.pad(DefaultAlignment).b, make([]byte, n)...) }
	nested := func(depth int) []byte {
		e := header(3, 0, 1).str("deep").u32(uint32(ValueArray))
		for range depth - 1 {
			e.u32(uint32(ValueArray)).u64(1)
		}
		return e.u32(uint32(ValueUint8)).u64(0).b
	}
	for _, tc := range []struct {
		name string
		file []byte
		lim  Limits
		want string // in the message
		kind error  // ErrInvalid unless set
	}{
		{"empty file", nil, Limits{}, "too short", nil},
		{"short magic", []byte("GGU"), Limits{}, "too short", nil},
		{"bad magic", (&enc{}).raw([]byte("GGML")...).u32(3).u64(0).u64(0).b, Limits{}, `magic "GGML"`, nil},
		{"big-endian magic", (&enc{}).raw([]byte("FUGG")...).raw(0, 0, 0, 3).u64(0).u64(0).b, Limits{}, "big-endian", nil},
		{"big-endian version", header(3<<24, 0, 0).b, Limits{}, "big-endian", nil},
		{"version 0", header(0, 0, 0).b, Limits{}, "version 0", nil},
		{"version 1", header(1, 0, 0).b, Limits{}, "version 1 is not supported", nil},
		{"version 4", header(4, 0, 0).b, Limits{}, "version 4 is not supported", nil},
		{"truncated counts", (&enc{}).raw([]byte(Magic)...).u32(3).u64(0).b, Limits{}, "bytes needed at offset 16", nil},

		{"tensor count 2^63", header(3, 1<<63, 0).b, Limits{}, "9223372036854775808 tensors exceed the limit", nil},
		{"tensor count 2^64-1", header(3, math.MaxUint64, 0).b, Limits{}, "tensors exceed the limit", nil},
		{"tensor count over a set limit", header(3, 11, 0).b, Limits{MaxTensors: 10}, "11 tensors exceed the limit of 10", nil},
		{"tensor count past the file", header(3, 1000, 0).b, Limits{}, "1000 tensors need at least", nil},
		{"kv count 2^63", header(3, 0, 1<<63).b, Limits{}, "key/value pairs exceed the limit", nil},
		{"kv count past the file", header(3, 0, 4000).b, Limits{}, "4000 key/value pairs", nil},

		{"key length 2^60", header(3, 0, 1).u64(1 << 60).raw(make([]byte, 20)...).b, Limits{}, "key at offset 24: length 1152921504606846976 exceeds", nil},
		{"key length 2^64-1", header(3, 0, 1).u64(math.MaxUint64).raw(make([]byte, 20)...).b, Limits{}, "exceeds the limit", nil},
		{"key past the end", header(3, 0, 1).u64(100).raw(make([]byte, 20)...).b, Limits{}, "length 100 runs past the end", nil},
		{"key too long", header(3, 0, 1).str(strings.Repeat("k", MaxKeyBytes+1)).u32(uint32(ValueUint8)).u8(0).b, Limits{}, "exceeds the limit of 65535", nil},
		{"empty key", header(3, 0, 1).str("").u32(uint32(ValueUint8)).u8(0).u8(0).b, Limits{}, "empty key", nil},
		{"duplicate key", header(3, 0, 2).kv("a.b", Value{Type: ValueUint8, Data: uint8(1)}).kv("a.b", Value{Type: ValueUint8, Data: uint8(1)}).b, Limits{}, `key "a.b": duplicate key`, nil},
		{"unknown value type", header(3, 0, 1).str("k").u32(13).u64(0).b, Limits{}, `key "k": unknown value type 13`, nil},
		{"unknown value type 2^32-1", header(3, 0, 1).str("k").u32(math.MaxUint32).u64(0).b, Limits{}, "unknown value type 4294967295", nil},
		{"bool 2", header(3, 0, 1).str("k").u32(uint32(ValueBool)).u8(2).b, Limits{}, "bool at offset", nil},
		{"truncated value", header(3, 0, 1).str("k").u32(uint32(ValueUint64)).u32(0).b, Limits{}, "8 bytes needed", nil},

		{"string length 2^60", header(3, 0, 1).str("k").u32(uint32(ValueString)).u64(1 << 60).b, Limits{}, `key "k": string at offset`, nil},
		{"string over a set limit", header(3, 0, 1).kv("k", Value{Type: ValueString, Data: "12345"}).b, Limits{MaxStringBytes: 4}, "length 5 exceeds the limit of 4", nil},
		{"string past the end", header(3, 0, 1).str("k").u32(uint32(ValueString)).u64(10).raw('a').b, Limits{}, "runs past the end", nil},

		{"array of 2^40", header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueUint8)).u64(1 << 40).b, Limits{}, "1099511627776 elements exceed the limit", nil},
		{"array of 2^64-1", header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueUint64)).u64(math.MaxUint64).b, Limits{}, "elements exceed the limit", nil},
		{"array over a set limit", header(3, 0, 1).kv("k", Value{Type: ValueArray, Elem: ValueUint8, Data: []uint8{1, 2, 3}}).b, Limits{MaxArrayLen: 2}, "3 elements exceed the limit of 2", nil},
		{"array past the end", header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueUint64)).u64(1 << 20).u64(0).b, Limits{}, "1048576 uint64 elements need at least 8 bytes each", nil},
		{"string array past the end", header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueString)).u64(1 << 20).u64(0).b, Limits{}, "1048576 string elements", nil},
		// 2^16 strings of one byte: 576 KiB in the file, over 2.5 MiB
		// decoded (headers and allocations), refused before the strings'
		// headers are allocated; so are 2^18 uint64s (2 MiB) and the
		// strings' bytes of one key over the limit.
		{"metadata strings over the decoded limit", func() []byte {
			e := header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueString)).u64(1 << 16)
			for range 1 << 16 {
				e.str("a")
			}
			return e.b
		}(), Limits{MaxMetadataBytes: 1 << 20}, "the metadata takes more than 1048576 bytes decoded", nil},
		{"metadata numbers over the decoded limit", header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueUint64)).u64(1 << 18).raw(make([]byte, 8<<18)...).b,
			Limits{MaxMetadataBytes: 1 << 20}, "the metadata takes more than", nil},
		{"a metadata string over the decoded limit", header(3, 0, 1).str("k").u32(uint32(ValueString)).str(strings.Repeat("x", 2<<20)).b,
			Limits{MaxMetadataBytes: 1 << 20}, "the metadata takes more than", nil},
		{"array string 2^60", header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueString)).u64(2).str("a").u64(1 << 60).b, Limits{}, "string 1 at offset", nil},
		{"array unknown element type", header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(77).u64(0).b, Limits{}, "unknown element type 77", nil},
		{"array bool 3", header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueBool)).u64(2).u8(1).u8(3).b, Limits{}, "bool 1 is 3", nil},
		{"arrays nested 4 deep", nested(4), Limits{}, "nested 4 deep", nil},

		{"alignment uint64", header(3, 0, 1).kv(AlignmentKey, Value{Type: ValueUint64, Data: uint64(32)}).b, Limits{}, "type uint64, want uint32", nil},
		{"alignment string", header(3, 0, 1).kv(AlignmentKey, Value{Type: ValueString, Data: "32"}).b, Limits{}, "type string, want uint32", nil},
		{"alignment 0", header(3, 0, 1).kv(AlignmentKey, Value{Type: ValueUint32, Data: uint32(0)}).b, Limits{}, "alignment 0 is not a power of two", nil},
		{"alignment 48", header(3, 0, 1).kv(AlignmentKey, Value{Type: ValueUint32, Data: uint32(48)}).b, Limits{}, "alignment 48 is not a power of two", nil},

		{"empty tensor name", withData(header(3, 1, 0).tinfo("", []uint64{8}, 0, 0), 32), Limits{}, "tensor 0: empty name", nil},
		{"tensor name 64 bytes", withData(header(3, 1, 0).tinfo(strings.Repeat("n", 64), []uint64{8}, 0, 0), 32), Limits{}, "name at offset 24: length 64 exceeds the limit of 63", nil},
		{"duplicate tensor", withData(okTensor(okTensor(header(3, 2, 0))), 64), Limits{}, `tensor "w": duplicate tensor name`, nil},
		{"5 dims", withData(header(3, 1, 0).tinfo("w", []uint64{1, 1, 1, 1, 1}, 0, 0), 32), Limits{}, "5 dimensions, more than 4", nil},
		{"dims over a set limit", withData(header(3, 1, 0).tinfo("w", []uint64{2, 2}, 0, 0), 32), Limits{MaxDims: 1}, "2 dimensions, more than 1", nil},
		{"n_dims 2^32-1", header(3, 1, 0).str("w").u32(math.MaxUint32).raw(make([]byte, 40)...).b, Limits{}, "4294967295 dimensions", nil},
		{"negative dim", withData(header(3, 1, 0).tinfo("w", []uint64{1 << 63}, 0, 0), 32), Limits{}, "dimension 0 is negative", nil},
		{"dims overflow", withData(header(3, 1, 0).tinfo("w", []uint64{1 << 32, 1 << 32, 1 << 32, 1 << 32}, 0, 0), 32), Limits{}, "need more bytes than the", nil},
		{"dims bigger than the file", withData(header(3, 1, 0).tinfo("w", []uint64{1 << 20, 1 << 20}, 0, 0), 32), Limits{}, "need more bytes than the", nil},
		{"row of 2^62 F32", withData(header(3, 1, 0).tinfo("w", []uint64{1 << 62}, 0, 0), 32), Limits{}, "dims [4611686018427387904] of F32 need more bytes than the", nil},
		{"empty tensor with a row of 2^62 F32", withData(header(3, 1, 0).tinfo("w", []uint64{1 << 62, 0}, 0, 0), 32), Limits{}, "dims [4611686018427387904 0]: rows of 4611686018427387904 F32 elements overflow a byte count", nil},
		{"empty tensor with 2^64 elements besides", withData(header(3, 1, 0).tinfo("w", []uint64{1 << 32, 0, 1 << 32}, 0, 0), 32), Limits{}, "more elements than an int64 counts", nil},
		{"row not whole blocks", withData(header(3, 1, 0).tinfo("w", []uint64{100, 2}, uint32(Q4_K), 0), 1024), Limits{}, "rows of 100 elements are not a whole number of 256-element Q4_K blocks", nil},
		{"scalar of a block type", withData(header(3, 1, 0).tinfo("w", nil, uint32(Q8_0), 0), 64), Limits{}, "rows of 1 elements", nil},
		{"unknown type", withData(header(3, 1, 0).tinfo("w", []uint64{32}, 99, 0), 64), Limits{}, `tensor "w": unknown ggml type 99`, ErrUnsupportedType},
		{"removed type", withData(header(3, 1, 0).tinfo("w", []uint64{32}, 31, 0), 64), Limits{}, `tensor "w": ggml type Q4_0_4_4 (31), which ggml removed`, ErrUnsupportedType},
		{"offset misaligned", withData(header(3, 1, 0).tinfo("w", []uint64{4}, 0, 16), 64), Limits{}, "offset 16 is not a multiple of the alignment 32", nil},
		{"offset past the end", withData(header(3, 1, 0).tinfo("w", []uint64{4}, 0, 64), 32), Limits{}, "runs past the end", nil},
		{"offset 2^64-32", withData(header(3, 1, 0).tinfo("w", []uint64{4}, 0, math.MaxUint64-31), 32), Limits{}, "past the end", nil},
		{"offset 2^63", withData(header(3, 1, 0).tinfo("w", []uint64{4}, 0, 1<<63), 32), Limits{}, "past the end", nil},
		{"data past the end", withData(header(3, 1, 0).tinfo("w", []uint64{8}, 0, 0), 31), Limits{}, "data [0, 32) of the data section", nil},
		{"overlap", withData(header(3, 2, 0).tinfo("a", []uint64{16}, 0, 0).tinfo("b", []uint64{8}, 0, 32), 96), Limits{}, `tensor "b" at`, nil},
		{"same offset", withData(header(3, 2, 0).tinfo("a", []uint64{8}, 0, 0).tinfo("b", []uint64{8}, 0, 0), 64), Limits{}, "overlaps tensor", nil},
		{"data section past the end", header(3, 1, 0).tinfo("w", []uint64{0}, 0, 0).raw(1).b, Limits{}, "the data section would start", nil},
		{"custom alignment misaligned", withData(header(3, 1, 1).kv(AlignmentKey, Value{Type: ValueUint32, Data: uint32(64)}).tinfo("w", []uint64{8}, 0, 32), 128), Limits{}, "not a multiple of the alignment 64", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseBytes(tc.file, tc.lim)
			if err == nil {
				t.Fatalf("accepted: %+v", f)
			}
			kind := tc.kind
			if kind == nil {
				kind = ErrInvalid
			}
			if !errors.Is(err, kind) || !errors.Is(err, models.ErrInvalidModel) {
				t.Errorf("error %v does not wrap %v and models.ErrInvalidModel", err, kind)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// TestZeroSizeTensors: empty tensors may share an offset and sit inside
// another's range, as they hold no bytes.
func TestZeroSizeTensors(t *testing.T) {
	b := header(3, 3, 0).
		tinfo("a", []uint64{8}, 0, 0).
		tinfo("z1", []uint64{0}, 0, 0).
		tinfo("z2", []uint64{4, 0}, uint32(F16), 32).pad(32).b
	b = append(b, make([]byte, 32)...)
	f, err := parseBytes(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"z1", "z2"} {
		tt, _ := f.Tensor(name)
		data, err := f.TensorData(tt)
		if err != nil || len(data) != 0 {
			t.Errorf("%s: %d bytes, %v", name, len(data), err)
		}
	}
}

// TestTruncated: every prefix of a valid file is refused with ErrInvalid.
func TestTruncated(t *testing.T) {
	b, _ := validFile(3, 0, everyValue(), sizableTypes())
	// The last tensors are empty or end the file; the data section ends at
	// the last non-empty tensor's end.
	f, err := parseBytes(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// Every prefix that cuts the header, and each that cuts a tensor's
	// data by one byte.
	cuts := make([]int64, 0, f.DataOffset+int64(len(f.Tensors)))
	for n := range f.DataOffset {
		cuts = append(cuts, n)
	}
	for _, tt := range f.Tensors {
		if tt.Size > 0 {
			cuts = append(cuts, tt.Offset+tt.Size-1)
		}
	}
	for _, n := range cuts {
		_, err := parseBytes(b[:n], Limits{})
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("prefix of %d bytes: %v", n, err)
		}
	}
}

// TestLimitsForRealFiles: the defaults take a Qwen-sized vocabulary.
func TestLimitsForRealFiles(t *testing.T) {
	const vocab, merges = 151936, 151387
	tokens := make([]string, vocab)
	types := make([]int32, vocab)
	for i := range tokens {
		tokens[i] = "tok" + string(rune('a'+i%26)) + strings.Repeat("x", i%7)
		types[i] = 1
	}
	mergeList := make([]string, merges)
	for i := range mergeList {
		mergeList[i] = "Ġ t"
	}
	tmpl := strings.Repeat("{{ message.content }}", 1<<16) // 1.3 MB
	kvs := []kvPair{
		{"tokenizer.ggml.tokens", Value{Type: ValueArray, Elem: ValueString, Data: tokens}},
		{"tokenizer.ggml.token_type", Value{Type: ValueArray, Elem: ValueInt32, Data: types}},
		{"tokenizer.ggml.merges", Value{Type: ValueArray, Elem: ValueString, Data: mergeList}},
		{"tokenizer.chat_template", Value{Type: ValueString, Data: tmpl}},
	}
	ts := make([]tspec, 4096)
	for i := range ts {
		ts[i] = tspec{name: "blk." + strings.Repeat("x", i%40) + string(rune('A'+i%26)) + "." + strconv.Itoa(i), typ: F32, dims: []int64{1}}
	}
	b, _ := validFile(3, 0, kvs, ts)
	f, err := parseBytes(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := f.Strings("tokenizer.ggml.tokens")
	if len(got) != vocab || got[vocab-1] != tokens[vocab-1] {
		t.Errorf("tokens: %d", len(got))
	}
	if ids, ok := f.Ints("tokenizer.ggml.token_type"); !ok || len(ids) != vocab {
		t.Errorf("token types: %d, %v", len(ids), ok)
	}
	if s, _ := f.String("tokenizer.chat_template"); s != tmpl {
		t.Error("chat template differs")
	}
	if len(f.Tensors) != 4096 {
		t.Errorf("%d tensors", len(f.Tensors))
	}
}

// TestAllocationBounded: a header that declares huge counts or lengths
// costs an allocation proportional to the file, not to what it declares.
func TestAllocationBounded(t *testing.T) {
	small := func(b []byte) []byte { return append(b, make([]byte, 200)...) }
	for _, tc := range []struct {
		name string
		file []byte
		lim  Limits
	}{
		{"tensor count at a huge limit", small(header(3, 1<<40, 0).b), Limits{MaxTensors: math.MaxInt}},
		{"kv count at a huge limit", small(header(3, 0, 1<<40).b), Limits{MaxKV: math.MaxInt}},
		{"string at a huge limit", small(header(3, 0, 1).str("k").u32(uint32(ValueString)).u64(1 << 40).b), Limits{MaxStringBytes: math.MaxInt64}},
		{"array at a huge limit", small(header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueString)).u64(1 << 40).b), Limits{MaxArrayLen: math.MaxInt64}},
		{"nested arrays at a huge limit", small(header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueArray)).u64(1 << 40).b), Limits{MaxArrayLen: math.MaxInt64}},
		{"tensor dims", small(header(3, 1, 0).tinfo("w", []uint64{1 << 62, 1 << 62}, 0, 0).b), Limits{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := parseBytes(tc.file, tc.lim)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v, want ErrInvalid", err)
			}
			// The decoder's 64 KiB window, the messages, and slack.
			if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
				t.Errorf("allocated %d bytes for a %d-byte file", got, len(tc.file))
			}
		})
	}
}

// errReader fails every read, as a disk would.
type errReader struct{ err error }

func (r errReader) ReadAt([]byte, int64) (int, error) { return 0, r.err }

func TestReaderErrors(t *testing.T) {
	ioErr := errors.New("disk on fire")
	_, err := Parse(errReader{ioErr}, 100, Limits{})
	if !errors.Is(err, ioErr) || errors.Is(err, ErrInvalid) {
		t.Errorf("I/O error: %v, want the reader's error and not ErrInvalid", err)
	}
	// A size larger than what the reader has: the file is short.
	b, _ := validFile(3, 0, everyValue(), nil)
	_, err = Parse(bytes.NewReader(b[:40]), int64(len(b)), Limits{})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "shorter than its size") {
		t.Errorf("short reader: %v", err)
	}
	if _, err := Parse(nil, 10, Limits{}); err == nil {
		t.Error("Parse(nil reader) succeeded")
	}
	if _, err := Parse(bytes.NewReader(b), -1, Limits{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative size: %v", err)
	}
	// TensorData through a reader that has lost its data since.
	b, _ = validFile(3, 0, nil, []tspec{{"w", F32, []int64{4}}})
	sr := &switchReader{r: bytes.NewReader(b)}
	f, err := Parse(sr, int64(len(b)), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	sr.r = errReader{ioErr}
	if _, err := f.TensorData(&f.Tensors[0]); !errors.Is(err, ioErr) {
		t.Errorf("TensorData I/O error: %v", err)
	}
	// A tensor that is not the file's, out of its range.
	if _, err := f.TensorData(&Tensor{Name: "x", Offset: int64(len(b)) - 2, Size: 4}); !errors.Is(err, ErrInvalid) {
		t.Errorf("TensorData out of range: %v", err)
	}
	if _, err := f.TensorData(nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("TensorData(nil): %v", err)
	}
}

type switchReader struct{ r io.ReaderAt }

func (s *switchReader) ReadAt(p []byte, off int64) (int, error) { return s.r.ReadAt(p, off) }

// TestLlamaCppFile reads a file written by llama.cpp's own GGUF writer
// (testdata/make_llamacpp.py, with libggml-base.so of node-llama-cpp 3.21.1)
// and checks it says what llama.cpp's reader said of it: one tensor of each
// type llama.cpp can size, and a key of each value type.
func TestLlamaCppFile(t *testing.T) {
	var want struct {
		Version    uint32 `json:"version"`
		Alignment  int64  `json:"alignment"`
		DataOffset int64  `json:"data_offset"`
		KV         []struct {
			Key  string `json:"key"`
			Type uint32 `json:"type"`
			Elem uint32 `json:"elem"`
			N    int    `json:"n"`
		} `json:"kv"`
		Tensors []struct {
			Name       string  `json:"name"`
			Type       uint32  `json:"type"`
			Dims       []int64 `json:"dims"`
			Offset     int64   `json:"offset"`
			Size       int64   `json:"size"`
			Block      int     `json:"block"`
			BlockBytes int     `json:"block_bytes"`
			Seed       int     `json:"seed"`
		} `json:"tensors"`
	}
	raw, err := os.ReadFile("testdata/llamacpp.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	f, err := Open("testdata/llamacpp.gguf", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Version != want.Version || f.Alignment != want.Alignment || f.DataOffset != want.DataOffset {
		t.Errorf("version %d alignment %d data offset %d, llama.cpp: %d %d %d",
			f.Version, f.Alignment, f.DataOffset, want.Version, want.Alignment, want.DataOffset)
	}
	if len(f.Keys) != len(want.KV) {
		t.Fatalf("%d keys, llama.cpp %d", len(f.Keys), len(want.KV))
	}
	for i, kv := range want.KV {
		v := f.KV[f.Keys[i]]
		if f.Keys[i] != kv.Key || uint32(v.Type) != kv.Type || (kv.Type == 9 && (uint32(v.Elem) != kv.Elem || v.Len() != kv.N)) {
			t.Errorf("key %d: %q %s/%s len %d, llama.cpp %+v", i, f.Keys[i], v.Type, v.Elem, v.Len(), kv)
		}
	}
	if len(f.Tensors) != len(want.Tensors) {
		t.Fatalf("%d tensors, llama.cpp %d", len(f.Tensors), len(want.Tensors))
	}
	seen := map[Type]bool{}
	for i, w := range want.Tensors {
		g := f.Tensors[i]
		if g.Name != w.Name || uint32(g.Type) != w.Type || !slices.Equal(g.Dims, w.Dims) || g.Offset != w.Offset || g.Size != w.Size {
			t.Errorf("tensor %d: %+v, llama.cpp %+v", i, g, w)
		}
		if g.Type.BlockSize() != w.Block || g.Type.BlockBytes() != w.BlockBytes {
			t.Errorf("%s: block %d×%d bytes, llama.cpp %d×%d", g.Type, g.Type.BlockSize(), g.Type.BlockBytes(), w.Block, w.BlockBytes)
		}
		seen[g.Type] = true
		data, err := f.TensorData(&f.Tensors[i])
		if err != nil {
			t.Fatal(err)
		}
		for j := range data {
			if data[j] != byte(w.Seed*31+j) {
				t.Fatalf("%s: byte %d is %d, want %d", g.Name, j, data[j], byte(w.Seed*31+j))
			}
		}
	}
	// Every type this reader can size is one llama.cpp sized the same.
	for i := range types {
		if typ := Type(i); typ.BlockSize() != 0 && !seen[typ] {
			t.Errorf("%s: not in llama.cpp's file", typ)
		}
	}
	checks := []struct {
		got, want any
	}{
		{must(f.Uint("test.u8")), uint64(200)}, {must(f.Int("test.i8")), int64(-100)},
		{must(f.Uint("test.u16")), uint64(60000)}, {must(f.Int("test.i16")), int64(-30000)},
		{must(f.Uint("test.u32")), uint64(4000000000)}, {must(f.Int("test.i32")), int64(-2000000000)},
		{must(f.Float("test.f32")), 0.5}, {must(f.Uint("test.u64")), uint64(18000000000000000000)},
		{must(f.Int("test.i64")), int64(-9000000000000000000)}, {must(f.Float("test.f64")), -0.25},
		{must(f.Bool("test.bool")), true}, {must(f.String("test.str")), "héllo {{ messages }}"},
		{must(f.Ints("test.arr_5")), []int64{1, -2, 3}}, {must(f.Floats("test.arr_6")), []float32{0.5, -1.5}},
		{must(f.Ints("test.arr_0")), []int64{0, 255}}, {f.KV["test.arr_10"].Data, []uint64{1, 1 << 63}},
		{must(f.Ints("test.arr_11")), []int64{-1}}, {must(f.Floats("test.arr_12")), []float32{2.5}},
		{f.KV["test.arr_7"].Data, []bool{true, false, true}}, {must(f.Ints("test.arr_3")), []int64{-7, 7}},
		{must(f.Strings("test.arr_str")), []string{"a", "", "Ġthe", "<|im_end|>"}},
	}
	for i, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("check %d: %#v, want %#v", i, c.got, c.want)
		}
	}
}

func must[T any](v T, ok bool) any {
	if !ok {
		return "missing"
	}
	return v
}

// TestConcurrentTensorData reads every tensor from many goroutines, through
// the mapping and through a ReaderAt (run with -race).
func TestConcurrentTensorData(t *testing.T) {
	b, want := validFile(3, 0, nil, sizableTypes())
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	opened, err := Open(path, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer opened.Close()
	parsed, err := parseBytes(b, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []*File{opened, parsed} {
		errs := make(chan error, 8)
		for g := range 8 {
			go func() {
				for k := range want {
					i := (k + g) % len(want)
					data, err := f.TensorData(&f.Tensors[i])
					if err == nil && int64(len(data)) != want[i].Size {
						err = errors.New("wrong size")
					}
					if err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}
