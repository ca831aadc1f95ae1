package safetensors

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/brokerd/brokerd/runtime/models"
)

// FuzzOpen feeds arbitrary bytes to the parser and reads every tensor it
// accepts. It must never panic, and what it allocates for tensors must stay
// bounded by the input's size.
func FuzzOpen(f *testing.F) {
	dir := f.TempDir()
	valid := filepath.Join(dir, "v.safetensors")
	err := Write(valid, map[string]models.Tensor{
		"w": {Shape: []int{2, 3}, Data: []float32{1, -2, 3, 0.5, 1e-5, 7}},
		"b": {Shape: []int{3}, Data: []float32{0, 1, 2}},
	}, "F16")
	if err != nil {
		f.Fatal(err)
	}
	seed, err := os.ReadFile(valid)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(rawFile(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32bytes(1)))
	f.Add(rawFile(`{"a":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]},"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, f32bytes(1, 2, 3, 4)))
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[4000000000],"data_offsets":[0,16]}}`, f32bytes(1, 2, 3, 4)))
	f.Add(rawFile(`{"a":`, nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'})

	f.Fuzz(func(t *testing.T, data []byte) {
		sf, err := newFile(bytes.NewReader(data), int64(len(data)), "fuzz")
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		var total int64
		for _, n := range sf.Names() {
			ti, ok := sf.Info(n)
			if !ok {
				t.Fatalf("Names lists %q but Info does not know it", n)
			}
			if ti.Offsets[0] < 0 || ti.Offsets[1] > int64(len(data)) || ti.Offsets[0] > ti.Offsets[1] {
				t.Fatalf("%q: accepted offsets %v for %d bytes", n, ti.Offsets, len(data))
			}
			total += ti.Offsets[1] - ti.Offsets[0]
			tensor, err := sf.Float32(n)
			if err != nil {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("Float32(%q): %v does not wrap ErrInvalid", n, err)
				}
				continue
			}
			// At most 4 bytes of float32 per input byte (an 8-bit type would
			// give 4; the float types give at most 2).
			if int64(len(tensor.Data))*4 > 4*int64(len(data)) {
				t.Fatalf("%q: %d values from a %d-byte input", n, len(tensor.Data), len(data))
			}
			if len(tensor.Data) != ti.NumElements() {
				t.Fatalf("%q: %d values for shape %v", n, len(tensor.Data), ti.Shape)
			}
		}
		if total > int64(len(data)) {
			t.Fatalf("tensors claim %d bytes of a %d-byte input", total, len(data))
		}
	})
}
