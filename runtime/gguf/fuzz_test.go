package gguf

import (
	"errors"
	"os"
	"testing"
)

// FuzzParse: no input panics; every refusal is ErrInvalid or
// ErrUnsupportedType; every accepted file's tensors lie inside it, aligned,
// sized by their type and dims, without overlapping.
func FuzzParse(f *testing.F) {
	kvs := everyValue()
	small := []tspec{{"a", Q4_K, []int64{256, 2}}, {"b", F32, []int64{3}}, {"c", Q8_0, []int64{32, 1, 2}}}
	for _, seed := range [][]byte{
		first(validFile(3, 0, kvs, small)),
		first(validFile(2, 0, nil, small)),
		first(validFile(3, 64, kvs[:3], small)),
		first(validFile(3, 0, nil, sizableTypes())),
		first(validFile(3, 0, kvs, nil)),
		header(3, 0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueArray)).u64(1).u32(uint32(ValueUint8)).u64(2).u8(1).u8(2).b,
		header(3, 1, 0).tinfo("w", []uint64{8}, uint32(F32), 0).pad(32).raw(make([]byte, 32)...).b,
	} {
		f.Add(seed)
	}
	if b, err := os.ReadFile("testdata/llamacpp.gguf"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := parseBytes(b, Limits{})
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupportedType) {
				t.Fatalf("error %v is neither ErrInvalid nor ErrUnsupportedType", err)
			}
			return
		}
		if len(file.Keys) != len(file.KV) {
			t.Fatalf("%d keys, %d values", len(file.Keys), len(file.KV))
		}
		if a := file.Alignment; a <= 0 || a&(a-1) != 0 {
			t.Fatalf("alignment %d", a)
		}
		size := int64(len(b))
		seen := map[string]bool{}
		var spans [][2]int64
		for i := range file.Tensors {
			tt := &file.Tensors[i]
			if seen[tt.Name] {
				t.Fatalf("duplicate tensor %q accepted", tt.Name)
			}
			seen[tt.Name] = true
			if tt.Offset < file.DataOffset || tt.Size < 0 || tt.Offset+tt.Size > size {
				t.Fatalf("tensor %q [%d, +%d) outside the %d-byte file (data at %d)", tt.Name, tt.Offset, tt.Size, size, file.DataOffset)
			}
			if (tt.Offset-file.DataOffset)%file.Alignment != 0 || file.DataOffset%file.Alignment != 0 {
				t.Fatalf("tensor %q at %d misaligned", tt.Name, tt.Offset)
			}
			if len(tt.Dims) > MaxDims {
				t.Fatalf("tensor %q has %d dims", tt.Name, len(tt.Dims))
			}
			row := int64(1)
			if len(tt.Dims) > 0 {
				row = tt.Dims[0]
			}
			rb, err := tt.Type.RowBytes(row)
			if err != nil {
				t.Fatalf("tensor %q accepted with rows it cannot size: %v", tt.Name, err)
			}
			if n := tt.Elements(); n != 0 && rb*(n/row) != tt.Size {
				t.Fatalf("tensor %q: size %d, want %d", tt.Name, tt.Size, rb*(n/row))
			}
			data, err := file.TensorData(tt)
			if err != nil || int64(len(data)) != tt.Size {
				t.Fatalf("TensorData(%q): %d bytes, %v", tt.Name, len(data), err)
			}
			if tt.Size > 0 {
				spans = append(spans, [2]int64{tt.Offset, tt.Offset + tt.Size})
			}
		}
		for i := range spans {
			for j := range i {
				if spans[i][0] < spans[j][1] && spans[j][0] < spans[i][1] {
					t.Fatalf("tensors overlap: %v and %v", spans[i], spans[j])
				}
			}
		}
	})
}

func first[A, B any](a A, _ B) A { return a }
