package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"

	"github.com/brokerd/brokerd/runtime/models"
)

// Write stores tensors in a safetensors file as dtype ("F32", "F16" or
// "BF16"; narrowing rounds to nearest even). Tensors are laid out in name
// order and the header is padded with spaces to a multiple of 8 bytes, so every
// tensor starts 8-byte aligned in the file while the data block has no holes.
func Write(path string, tensors map[string]models.Tensor, dtype string) error {
	esize, ok := dtypeSizes[dtype]
	if !ok || (dtype != "F32" && dtype != "F16" && dtype != "BF16") {
		return fmt.Errorf("safetensors: write %s: unsupported dtype %q (want F32, F16 or BF16)", path, dtype)
	}
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		if n == "__metadata__" {
			return fmt.Errorf("safetensors: write %s: %q is reserved", path, n)
		}
		names = append(names, n)
	}
	slices.Sort(names)

	header := make(map[string]any, len(names))
	var off int64
	for _, n := range names {
		t := tensors[n]
		count := 1
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("safetensors: write %s: tensor %q: negative dimension in %v", path, n, t.Shape)
			}
			count *= d
		}
		if count != len(t.Data) {
			return fmt.Errorf("safetensors: write %s: tensor %q: shape %v holds %d values, data has %d", path, n, t.Shape, count, len(t.Data))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{} // a scalar: JSON [] rather than null
		}
		end := off + int64(count)*esize
		header[n] = map[string]any{"dtype": dtype, "shape": shape, "data_offsets": [2]int64{off, end}}
		off = end
	}
	hj, err := json.Marshal(header) // map keys come out sorted
	if err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	for len(hj)%8 != 0 {
		hj = append(hj, ' ')
	}

	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(fh, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hj)))
	_, _ = w.Write(lenBuf[:])
	_, _ = w.Write(hj)
	var buf [4]byte
	for _, n := range names {
		for _, v := range tensors[n].Data {
			switch dtype {
			case "F32":
				binary.LittleEndian.PutUint32(buf[:], math.Float32bits(v))
			case "F16":
				binary.LittleEndian.PutUint16(buf[:], Float32ToF16(v))
			case "BF16":
				binary.LittleEndian.PutUint16(buf[:], Float32ToBF16(v))
			}
			_, _ = w.Write(buf[:esize])
		}
	}
	// bufio keeps the first write error; Flush reports it.
	if err := w.Flush(); err != nil {
		_ = fh.Close()
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	return fh.Close()
}

// Float32ToBF16 rounds to the nearest bfloat16, ties to even; NaN stays NaN.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40 // quiet NaN, sign kept
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// Float32ToF16 rounds to the nearest IEEE half, ties to even: overflow gives
// infinity, tiny values become subnormals or zero, NaN stays NaN.
func Float32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 // quiet NaN
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal half (or zero): shift the mantissa with its implicit 1 so
		// that the result counts units of 2^-24, rounding to nearest even.
		if e < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint32(14 - e)
		half := m >> shift
		rem := m & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || (rem == mid && half&1 == 1) {
			half++
		}
		return sign | uint16(half)
	}
	half := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && half&1 == 1) {
		half++ // may carry into the exponent, up to infinity: correct
	}
	return sign | uint16(half)
}
