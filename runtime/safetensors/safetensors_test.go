package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
)

// rawFile assembles a file from a header string and a data block, so tests can
// write headers that Write never would.
func rawFile(header string, data []byte) []byte {
	var b bytes.Buffer
	_ = binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(data)
	return b.Bytes()
}

func openBytes(t *testing.T, content []byte) (*File, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.safetensors")
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err == nil {
		t.Cleanup(func() { _ = f.Close() })
	}
	return f, err
}

func f32bytes(vals ...float32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func TestOpenValid(t *testing.T) {
	tests := []struct {
		name   string
		header string
		data   []byte
		want   map[string][]int // name → shape
	}{
		{
			name:   "two tensors with metadata and padding",
			header: `{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1,1],"data_offsets":[8,12]}}   `,
			data:   f32bytes(1, 2, 3),
			want:   map[string][]int{"a": {2}, "b": {1, 1}},
		},
		{
			name:   "scalar and empty tensor",
			header: `{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"F16","shape":[0,3],"data_offsets":[4,4]}}`,
			data:   f32bytes(7),
			want:   map[string][]int{"s": {}, "e": {0, 3}},
		},
		{
			name:   "integer tensor alongside floats",
			header: `{"position_ids":{"dtype":"I64","shape":[1,2],"data_offsets":[0,16]},"w":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}}`,
			data:   append(make([]byte, 16), f32bytes(5)...),
			want:   map[string][]int{"position_ids": {1, 2}, "w": {1}},
		},
		{
			name:   "no tensors",
			header: `{}`,
			want:   map[string][]int{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := openBytes(t, rawFile(tc.header, tc.data))
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if got := len(f.Names()); got != len(tc.want) {
				t.Fatalf("Names() = %v, want %d names", f.Names(), len(tc.want))
			}
			for n, shape := range tc.want {
				ti, ok := f.Info(n)
				if !ok {
					t.Fatalf("Info(%q) missing", n)
				}
				if len(ti.Shape) != len(shape) {
					t.Fatalf("Info(%q).Shape = %v, want %v", n, ti.Shape, shape)
				}
				for i := range shape {
					if ti.Shape[i] != shape[i] {
						t.Fatalf("Info(%q).Shape = %v, want %v", n, ti.Shape, shape)
					}
				}
			}
		})
	}
}

func TestOpenRejects(t *testing.T) {
	okData := f32bytes(1, 2, 3, 4)
	hugeLen := make([]byte, 8)
	binary.LittleEndian.PutUint64(hugeLen, MaxHeaderBytes+1)
	pastEnd := make([]byte, 8+10)
	binary.LittleEndian.PutUint64(pastEnd, 11)
	copy(pastEnd[8:], "{}        ")
	tests := []struct {
		name    string
		content []byte
		want    string // a fragment of the message: the tensor or the rule
	}{
		{"short file", []byte{1, 2, 3}, "shorter than"},
		{"header over 100 MB", hugeLen, "exceeds"},
		{"header past the end", pastEnd, "past the end"},
		{"bad JSON", rawFile(`{,}`, nil), "bad JSON"},
		{"truncated JSON", rawFile(`{"a":`, nil), `"a": bad entry`},
		{"not an object", rawFile(`[1,2]`, nil), "not a JSON object"},
		{"trailing garbage in header", rawFile(`{} x`, nil), "after the top-level object"},
		{"invalid UTF-8", rawFile("{\"\xff\":1}", nil), "UTF-8"},
		{"metadata not strings", rawFile(`{"__metadata__":{"a":1}}`, nil), "__metadata__"},
		{"unknown dtype", rawFile(`{"w":{"dtype":"F7","shape":[4],"data_offsets":[0,16]}}`, okData), `"w": unknown dtype "F7"`},
		{"missing dtype", rawFile(`{"w":{"shape":[4],"data_offsets":[0,16]}}`, okData), `"w": missing dtype`},
		{"missing shape", rawFile(`{"w":{"dtype":"F32","data_offsets":[0,16]}}`, okData), `"w": missing shape`},
		{"size mismatch", rawFile(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}`, okData), `"w": shape [3] of F32 needs 12 bytes`},
		{"shape overflow", rawFile(`{"w":{"dtype":"F32","shape":[2147483647,2147483647,2147483647],"data_offsets":[0,16]}}`, okData), `"w": shape`},
		{"negative dim", rawFile(`{"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}`, okData), `"w": negative dimension`},
		{"fractional dim", rawFile(`{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,16]}}`, okData), `"w": bad entry`},
		{"offsets out of range", rawFile(`{"w":{"dtype":"F32","shape":[5],"data_offsets":[0,20]}}`, okData), `"w": data_offsets [0, 20] out of range`},
		{"negative offset", rawFile(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, okData), `"w": negative data_offsets`},
		{"begin after end", rawFile(`{"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}}`, okData), `"w": data_offsets [16, 0] begin after end`},
		{"three offsets", rawFile(`{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,8,16]}}`, okData), `"w": data_offsets has 3 values`},
		{"overlap", rawFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, okData), `"b": data_offsets [8, 16] overlap tensor "a"`},
		{"aliasing", rawFile(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, okData), `overlap tensor`},
		{"hole", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, okData), `"b": data_offsets [8, 16] leave a hole`},
		{"trailing data", rawFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}`, okData), "trailing bytes"},
		{"duplicate name", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, okData), `"a": duplicate name`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := openBytes(t, tc.content)
			if err == nil {
				t.Fatal("Open succeeded, want an error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), "m.safetensors") {
				t.Errorf("error %q does not name the file", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestF16ToFloat32(t *testing.T) {
	tests := []struct {
		name string
		in   uint16
		want float32
	}{
		{"zero", 0x0000, 0},
		{"one", 0x3c00, 1},
		{"minus two", 0xc000, -2},
		{"max", 0x7bff, 65504},
		{"smallest normal", 0x0400, float32(math.Ldexp(1, -14))},
		{"smallest subnormal", 0x0001, float32(math.Ldexp(1, -24))},
		{"largest subnormal", 0x03ff, float32(1023 * math.Ldexp(1, -24))},
		{"negative subnormal", 0x8200, -float32(512 * math.Ldexp(1, -24))},
		{"inf", 0x7c00, float32(math.Inf(1))},
		{"-inf", 0xfc00, float32(math.Inf(-1))},
		{"one third", 0x3555, float32(0x155+0x400) * float32(math.Ldexp(1, -12))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := F16ToFloat32(tc.in); got != tc.want {
				t.Errorf("F16ToFloat32(%#04x) = %g, want %g", tc.in, got, tc.want)
			}
		})
	}
	t.Run("NaN", func(t *testing.T) {
		for _, h := range []uint16{0x7e00, 0x7c01, 0xfe00} {
			if v := F16ToFloat32(h); v == v {
				t.Errorf("F16ToFloat32(%#04x) = %g, want NaN", h, v)
			}
		}
	})
	t.Run("negative zero", func(t *testing.T) {
		if b := math.Float32bits(F16ToFloat32(0x8000)); b != 0x80000000 {
			t.Errorf("bits = %#x, want -0", b)
		}
	})
	// Every finite half round-trips through float32 and back exactly.
	t.Run("round trip all", func(t *testing.T) {
		for h := 0; h < 1<<16; h++ {
			if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
				continue // NaN payloads are canonicalised on the way back
			}
			if got := Float32ToF16(F16ToFloat32(uint16(h))); got != uint16(h) {
				t.Fatalf("round trip %#04x → %g → %#04x", h, F16ToFloat32(uint16(h)), got)
			}
		}
	})
}

func TestFloat32ToNarrow(t *testing.T) {
	tests := []struct {
		name string
		in   float32
		f16  uint16
		bf16 uint16
	}{
		{"one", 1, 0x3c00, 0x3f80},
		{"tie to even down", 1 + 1.0/2048, 0x3c00, 0x3f80},
		{"tie to even up", 1 + 3.0/2048, 0x3c02, 0x3f80},
		{"overflow to inf", 70000, 0x7c00, 0x4789},
		{"half the smallest subnormal rounds to zero", float32(math.Ldexp(1, -25)), 0x0000, 0x3300},
		{"just above half the smallest subnormal", float32(math.Ldexp(1.5, -25)), 0x0001, 0x3340},
		{"negative", -0.5, 0xb800, 0xbf00},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Float32ToF16(tc.in); got != tc.f16 {
				t.Errorf("Float32ToF16(%g) = %#04x, want %#04x", tc.in, got, tc.f16)
			}
			if got := Float32ToBF16(tc.in); got != tc.bf16 {
				t.Errorf("Float32ToBF16(%g) = %#04x, want %#04x", tc.in, got, tc.bf16)
			}
		})
	}
}

func TestWriteRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tensors := map[string]models.Tensor{
		"b.weight": {Shape: []int{3, 5}, Data: make([]float32, 15)},
		"a.bias":   {Shape: []int{5}, Data: make([]float32, 5)},
		"scalar":   {Shape: []int{}, Data: []float32{0.25}},
		"odd":      {Shape: []int{3}, Data: []float32{float32(math.Inf(-1)), 1e-7, -3}},
	}
	for _, n := range []string{"b.weight", "a.bias"} {
		for i := range tensors[n].Data {
			tensors[n].Data[i] = float32(rng.NormFloat64())
		}
	}
	tests := []struct {
		dtype string
		conv  func(float32) float32 // the value expected back
	}{
		{"F32", func(v float32) float32 { return v }},
		{"F16", func(v float32) float32 { return F16ToFloat32(Float32ToF16(v)) }},
		{"BF16", func(v float32) float32 { return math.Float32frombits(uint32(Float32ToBF16(v)) << 16) }},
	}
	for _, tc := range tests {
		t.Run(tc.dtype, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "w.safetensors")
			if err := Write(p, tensors, tc.dtype); err != nil {
				t.Fatal(err)
			}
			f, err := Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			names := f.Names()
			want := []string{"a.bias", "b.weight", "odd", "scalar"}
			if strings.Join(names, ",") != strings.Join(want, ",") {
				t.Fatalf("Names() = %v, want %v (sorted)", names, want)
			}
			raw, _ := os.ReadFile(p)
			dataBase := 8 + binary.LittleEndian.Uint64(raw)
			if dataBase%8 != 0 {
				t.Errorf("data block starts at %d, not 8-aligned", dataBase)
			}
			for n, src := range tensors {
				ti, _ := f.Info(n)
				if ti.DType != tc.dtype {
					t.Errorf("%s dtype %s, want %s", n, ti.DType, tc.dtype)
				}
				got, err := f.Float32(n)
				if err != nil {
					t.Fatal(err)
				}
				if len(got.Shape) != len(src.Shape) || len(got.Data) != len(src.Data) {
					t.Fatalf("%s: shape %v len %d, want %v len %d", n, got.Shape, len(got.Data), src.Shape, len(src.Data))
				}
				for i, v := range src.Data {
					if w := tc.conv(v); got.Data[i] != w {
						t.Fatalf("%s[%d] = %g, want %g", n, i, got.Data[i], w)
					}
				}
			}
		})
	}
	t.Run("shape mismatch", func(t *testing.T) {
		err := Write(filepath.Join(t.TempDir(), "x"), map[string]models.Tensor{"x": {Shape: []int{2}, Data: []float32{1}}}, "F32")
		if err == nil || !strings.Contains(err.Error(), `"x"`) {
			t.Fatalf("err = %v, want a shape error naming x", err)
		}
	})
	t.Run("unsupported dtype", func(t *testing.T) {
		if err := Write(filepath.Join(t.TempDir(), "x"), nil, "I64"); err == nil {
			t.Fatal("Write with I64 succeeded")
		}
	})
}

func TestFloat32Conversions(t *testing.T) {
	f64 := make([]byte, 16)
	binary.LittleEndian.PutUint64(f64, math.Float64bits(0.1))
	binary.LittleEndian.PutUint64(f64[8:], math.Float64bits(-1e300))
	tests := []struct {
		name    string
		header  string
		data    []byte
		tensor  string
		want    []float32
		wantErr string
	}{
		{"F16", `{"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}}`, []byte{0x00, 0x3c, 0x01, 0x00, 0x00, 0xfc}, "h",
			[]float32{1, float32(math.Ldexp(1, -24)), float32(math.Inf(-1))}, ""},
		{"BF16", `{"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}`, []byte{0x80, 0x3f, 0x49, 0xc0}, "b",
			[]float32{1, math.Float32frombits(0xc0490000)}, ""},
		{"F64", `{"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}}`, f64, "d",
			[]float32{float32(0.1), float32(math.Inf(-1))}, ""},
		{"I64 refused", `{"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, make([]byte, 8), "i", nil, `"i" has dtype I64`},
		{"missing", `{}`, nil, "nope", nil, `no tensor "nope"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := openBytes(t, rawFile(tc.header, tc.data))
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.Float32(tc.tensor)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want ErrInvalid containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range tc.want {
				if got.Data[i] != w {
					t.Errorf("[%d] = %g, want %g", i, got.Data[i], w)
				}
			}
		})
	}
}
