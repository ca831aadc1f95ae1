// Package safetensors reads and writes Hugging Face safetensors files: an
// 8-byte little-endian header length N, N bytes of JSON header mapping tensor
// names to {dtype, shape, data_offsets}, then the data block.
//
// Files come from users, so the reader treats them as hostile: every number
// in the header is checked before use, and a file that breaks any rule of the
// format is refused with an error wrapping ErrInvalid that names the file and
// the tensor. The rules (from the format's README and its reference reader):
// the header is at most 100 MB of UTF-8 JSON, duplicate names are disallowed,
// `__metadata__` is a string-to-string map, each tensor's byte range matches
// its shape and dtype, and the ranges cover the data block exactly: no
// overlap, no hole, nothing after the last tensor.
//
// Only the header is read by Open; tensor bytes are read on demand with
// ReadAt, so a model of hundreds of MB is never held twice in memory.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/brokerd/brokerd/runtime/models"
)

// ErrInvalid means a file is not a valid safetensors file, or a tensor cannot
// be used as asked (a dtype that is not a float). It is the file author's
// mistake: INVALID_ARGUMENT at the edge. It is a models.InvalidModelKind, so
// it matches models.ErrInvalidModel.
var ErrInvalid error = models.InvalidModelKind("invalid safetensors file")

// MaxHeaderBytes bounds the JSON header, as the reference implementation does,
// so a hostile length cannot make the reader allocate without bound.
const MaxHeaderBytes = 100 << 20

// dtypeSizes are the element sizes of the byte-addressable safetensors dtypes.
// Sub-byte types (F4, F6_*) are refused as unknown: nothing here can use them.
var dtypeSizes = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8, "C64": 8,
}

// DTypeSize returns the element size in bytes of a safetensors dtype name.
func DTypeSize(dtype string) (int64, bool) {
	n, ok := dtypeSizes[dtype]
	return n, ok
}

// TensorInfo is one header entry. Offsets are relative to the start of the
// data block, [begin, end).
type TensorInfo struct {
	DType   string
	Shape   []int
	Offsets [2]int64
}

// NumElements is the product of the shape (1 for a scalar).
func (ti TensorInfo) NumElements() int {
	n := 1
	for _, d := range ti.Shape {
		n *= d
	}
	return n
}

// File is an open safetensors file. Its methods are safe for concurrent use.
type File struct {
	name     string // for messages
	r        io.ReaderAt
	closer   io.Closer
	dataBase int64 // file offset of the data block
	size     int64 // bytes in the file
	names    []string
	tensors  map[string]TensorInfo
	metadata map[string]string
}

// Open reads and validates the header of the safetensors file at path. The
// data is read later, tensor by tensor.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("%w: %s: not a regular file", ErrInvalid, path)
	}
	sf, err := newFile(f, st.Size(), path)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	sf.closer = f
	return sf, nil
}

// Close releases the file.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	return f.closer.Close()
}

// Path is the name the file was opened with.
func (f *File) Path() string { return f.name }

// Size is the file's size in bytes.
func (f *File) Size() int64 { return f.size }

// Names lists the tensors in order of their data offsets (the file's order).
func (f *File) Names() []string { return slices.Clone(f.names) }

// Metadata is the header's `__metadata__` map (nil when absent).
func (f *File) Metadata() map[string]string { return f.metadata }

// Info returns a tensor's header entry.
func (f *File) Info(name string) (TensorInfo, bool) {
	ti, ok := f.tensors[name]
	if !ok {
		return TensorInfo{}, false
	}
	ti.Shape = slices.Clone(ti.Shape)
	return ti, true
}

// Bytes reads a tensor's raw little-endian bytes.
func (f *File) Bytes(name string) ([]byte, error) {
	ti, ok := f.tensors[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s: no tensor %q", ErrInvalid, f.name, name)
	}
	// Validated at open: the range lies inside the file, so this allocation is
	// bounded by the file's size.
	buf := make([]byte, ti.Offsets[1]-ti.Offsets[0])
	if len(buf) == 0 {
		// An empty tensor reads nothing: a ReadAt at the end of the file
		// (where a header-only file's data starts) answers io.EOF even for
		// no bytes.
		return buf, nil
	}
	if _, err := f.r.ReadAt(buf, f.dataBase+ti.Offsets[0]); err != nil {
		return nil, fmt.Errorf("%s: reading tensor %q: %w", f.name, name, err)
	}
	return buf, nil
}

// Float32 reads a tensor and converts it to float32: F32 as is, F16 and BF16
// exactly (subnormals, infinities and NaN included), F64 rounded to nearest.
// Other dtypes are refused with ErrInvalid.
func (f *File) Float32(name string) (models.Tensor, error) {
	ti, ok := f.tensors[name]
	if !ok {
		return models.Tensor{}, fmt.Errorf("%w: %s: no tensor %q", ErrInvalid, f.name, name)
	}
	switch ti.DType {
	case "F32", "F16", "BF16", "F64":
	default:
		return models.Tensor{}, fmt.Errorf("%w: %s: tensor %q has dtype %s, want F32, F16, BF16 or F64", ErrInvalid, f.name, name, ti.DType)
	}
	raw, err := f.Bytes(name)
	if err != nil {
		return models.Tensor{}, err
	}
	out := models.Tensor{Shape: slices.Clone(ti.Shape), Data: make([]float32, ti.NumElements())}
	decode(out.Data, raw, ti.DType)
	return out, nil
}

// decode converts little-endian raw values of dtype into dst; the sizes were
// checked against each other at open.
func decode(dst []float32, raw []byte, dtype string) {
	switch dtype {
	case "F32":
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	case "F16":
		for i := range dst {
			dst[i] = F16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	case "BF16":
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(raw[2*i:])) << 16)
		}
	case "F64":
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
		}
	}
}

// rawEntry is a header entry as JSON has it; int64 so that negative and huge
// values reach the checks instead of failing obscurely.
type rawEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// newFile parses and validates the header of a file of the given size.
func newFile(r io.ReaderAt, size int64, name string) (*File, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalid, name, fmt.Sprintf(format, args...))
	}
	if size < 8 {
		return nil, invalid("%d bytes, shorter than the 8-byte header length", size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("%s: reading header length: %w", name, err)
	}
	hlen := binary.LittleEndian.Uint64(lenBuf[:])
	if hlen > MaxHeaderBytes {
		return nil, invalid("header length %d exceeds the %d-byte limit", hlen, MaxHeaderBytes)
	}
	if hlen > uint64(size-8) {
		return nil, invalid("header length %d runs past the end of the %d-byte file", hlen, size)
	}
	if hlen < 2 {
		return nil, invalid("header length %d is too short for a JSON object", hlen)
	}
	header := make([]byte, hlen)
	if _, err := r.ReadAt(header, 8); err != nil {
		return nil, fmt.Errorf("%s: reading header: %w", name, err)
	}
	// encoding/json would quietly replace invalid UTF-8; the format requires it.
	if !utf8.Valid(header) {
		return nil, invalid("header is not valid UTF-8")
	}
	dataBase := int64(8 + hlen)
	dataLen := size - dataBase

	f := &File{name: name, r: r, dataBase: dataBase, size: size, tensors: map[string]TensorInfo{}}
	if err := f.parseHeader(header, dataLen, invalid); err != nil {
		return nil, err
	}
	return f, nil
}

// parseHeader walks the top-level JSON object token by token, because
// decoding into a map would silently keep the last of duplicate names.
func (f *File) parseHeader(header []byte, dataLen int64, invalid func(string, ...any) error) error {
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return invalid("bad JSON header: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return invalid("header is not a JSON object")
	}
	seenMeta := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return invalid("bad JSON header: %v", err)
		}
		key, ok := tok.(string)
		if !ok {
			return invalid("bad JSON header: key %v is not a string", tok)
		}
		if key == "__metadata__" {
			if seenMeta {
				return invalid("duplicate __metadata__")
			}
			seenMeta = true
			var meta map[string]string
			if err := dec.Decode(&meta); err != nil {
				return invalid("__metadata__ is not a string-to-string map: %v", err)
			}
			f.metadata = meta
			continue
		}
		if _, dup := f.tensors[key]; dup {
			return invalid("tensor %q: duplicate name", key)
		}
		var e rawEntry
		if err := dec.Decode(&e); err != nil {
			return invalid("tensor %q: bad entry: %v", key, err)
		}
		ti, err := checkEntry(e, dataLen)
		if err != nil {
			return invalid("tensor %q: %v", key, err)
		}
		f.tensors[key] = ti
		f.names = append(f.names, key)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return invalid("bad JSON header: %v", err)
	}
	// The reference writer pads the header with spaces; anything else after
	// the object is not JSON.
	if rest := header[dec.InputOffset():]; len(bytes.TrimSpace(rest)) != 0 {
		return invalid("bad JSON header: data after the top-level object")
	}
	return f.checkCoverage(dataLen, invalid)
}

// checkEntry validates one entry on its own: dtype, shape, offsets, size.
func checkEntry(e rawEntry, dataLen int64) (TensorInfo, error) {
	if e.DType == "" {
		return TensorInfo{}, errors.New("missing dtype")
	}
	esize, ok := dtypeSizes[e.DType]
	if !ok {
		return TensorInfo{}, fmt.Errorf("unknown dtype %q", e.DType)
	}
	if e.Shape == nil {
		return TensorInfo{}, errors.New("missing shape")
	}
	if len(e.DataOffsets) != 2 {
		return TensorInfo{}, fmt.Errorf("data_offsets has %d values, want 2", len(e.DataOffsets))
	}
	begin, end := e.DataOffsets[0], e.DataOffsets[1]
	if begin < 0 || end < 0 {
		return TensorInfo{}, fmt.Errorf("negative data_offsets [%d, %d]", begin, end)
	}
	if begin > end {
		return TensorInfo{}, fmt.Errorf("data_offsets [%d, %d] begin after end", begin, end)
	}
	if end > dataLen {
		return TensorInfo{}, fmt.Errorf("data_offsets [%d, %d] out of range of the %d-byte data block", begin, end, dataLen)
	}
	// The element count is bounded by the range, which is bounded by the
	// file: multiply with an overflow check against that bound.
	limit := (end - begin) / esize
	shape := make([]int, len(e.Shape))
	count, zero, over := int64(1), false, false
	for i, d := range e.Shape {
		if d < 0 {
			return TensorInfo{}, fmt.Errorf("negative dimension %d in shape %v", d, e.Shape)
		}
		if d > math.MaxInt32 {
			return TensorInfo{}, fmt.Errorf("dimension %d in shape %v is too large", d, e.Shape)
		}
		shape[i] = int(d)
		switch {
		case d == 0:
			zero = true
		case !over && count > limit/d:
			over = true
		case !over:
			count *= d
		}
	}
	if zero {
		count, over = 0, false
	}
	if over || count*esize != end-begin {
		return TensorInfo{}, fmt.Errorf("shape %v of %s needs %s bytes but data_offsets [%d, %d] hold %d",
			e.Shape, e.DType, needBytes(e.Shape, esize, over, count), begin, end, end-begin)
	}
	return TensorInfo{DType: e.DType, Shape: shape, Offsets: [2]int64{begin, end}}, nil
}

func needBytes(shape []int64, esize int64, over bool, count int64) string {
	if !over {
		return fmt.Sprint(count * esize)
	}
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = fmt.Sprint(d)
	}
	return strings.Join(parts, "×") + fmt.Sprintf("×%d (more than the range)", esize)
}

// checkCoverage enforces that the ranges tile the data block: sorted by
// offset, each starts where the previous ended, and the last ends at the end
// of the file. This rules out overlaps (aliasing) and holes (polyglot files).
func (f *File) checkCoverage(dataLen int64, invalid func(string, ...any) error) error {
	sort.SliceStable(f.names, func(i, j int) bool {
		a, b := f.tensors[f.names[i]].Offsets, f.tensors[f.names[j]].Offsets
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		return a[1] < b[1]
	})
	var pos int64
	prev := ""
	for _, n := range f.names {
		off := f.tensors[n].Offsets
		switch {
		case off[0] < pos:
			return invalid("tensor %q: data_offsets [%d, %d] overlap tensor %q ending at %d", n, off[0], off[1], prev, pos)
		case off[0] > pos:
			return invalid("tensor %q: data_offsets [%d, %d] leave a hole in the data block at [%d, %d]", n, off[0], off[1], pos, off[0])
		}
		pos = off[1]
		prev = n
	}
	if pos != dataLen {
		return invalid("the tensors cover %d bytes of the %d-byte data block (trailing bytes)", pos, dataLen)
	}
	return nil
}

// F16ToFloat32 converts an IEEE 754 half-precision value exactly.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN; keep the payload
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	case exp != 0: // normal: rebias 15 → 127
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	default: // subnormal: mant × 2^-24, exact in float32
		v := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
}
