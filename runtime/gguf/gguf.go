// Package gguf reads GGUF files, llama.cpp's model format: a header of
// metadata key/value pairs and tensor descriptions, then the tensor data,
// each tensor at an aligned offset. Versions 2 and 3 are read (they differ
// only in that v3 may be big-endian, which is refused); v1 is refused.
//
// The layout, from llama.cpp's ggml/include/gguf.h and ggml/src/gguf.cpp:
//
//	"GGUF", version u32, tensor count u64, key/value count u64
//	per key/value: key (string), value type u32, value
//	  (an array: element type u32, element count u64, the elements)
//	per tensor: name (string), n_dims u32, n_dims × u64 dims (innermost
//	  first), ggml type u32, offset u64 (from the data section's start)
//	padding to general.alignment (u32, a power of two, default 32)
//	the data section
//
// with strings as a u64 byte length then the bytes, all little-endian.
//
// Files come from users, so the reader treats them as hostile, as
// runtime/safetensors does: every count, length, offset and size is checked
// against Limits and against the bytes the file actually has before anything
// is allocated or read, so what is allocated is proportional to the file's
// size; a file that breaks a rule is refused with an error wrapping
// ErrInvalid (or ErrUnsupportedType, for a tensor type this reader cannot
// size) that names the key or tensor and the offset. Nothing panics on a bad
// file.
package gguf

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"sync"

	"github.com/brokerd/brokerd/runtime/models"
)

// ErrInvalid means a file is not a valid GGUF file (or is one this reader
// refuses: GGUF v1, big-endian). It is the file author's mistake:
// INVALID_ARGUMENT at the edge. It is a models.InvalidModelKind, so it
// matches models.ErrInvalidModel.
var ErrInvalid error = models.InvalidModelKind("invalid gguf file")

// ErrUnsupportedType means a tensor has a ggml type this reader cannot size
// (one ggml removed, or one newer than this reader); the error names the
// tensor and the type. It also matches models.ErrInvalidModel.
var ErrUnsupportedType error = models.InvalidModelKind("unsupported gguf tensor type")

const (
	// Magic is the first four bytes of a GGUF file.
	Magic = "GGUF"
	// DefaultAlignment applies when general.alignment is absent.
	DefaultAlignment = 32
	// AlignmentKey is the metadata key that sets the data alignment.
	AlignmentKey = "general.alignment"
	// MaxDims is ggml's GGML_MAX_DIMS: a tensor has at most 4 dimensions.
	MaxDims = 4
	// MaxNameBytes bounds a tensor name: ggml keeps names in a 64-byte
	// NUL-terminated buffer (GGML_MAX_NAME) and llama.cpp refuses longer.
	MaxNameBytes = 63
	// MaxKeyBytes bounds a metadata key (the GGUF spec's 2^16-1).
	MaxKeyBytes = 1<<16 - 1
	// MaxArrayNesting bounds arrays of arrays: an array may hold arrays
	// that hold arrays, no deeper. (llama.cpp itself reads no nested
	// arrays; the spec allows them.)
	MaxArrayNesting = 3
)

// Defaults for zero Limits fields, sized for real files: Qwen's vocabulary of
// 151,936 tokens and ~151k merges, Gemma's 262,144, chat templates of tens of
// KB, models of a few thousand tensors.
const (
	DefaultMaxTensors     = 1 << 14
	DefaultMaxKV          = 1 << 12
	DefaultMaxStringBytes = 16 << 20
	DefaultMaxArrayLen    = 1 << 24
	// DefaultMaxMetadataBytes bounds the memory the metadata takes decoded:
	// a vocabulary of 262,144 tokens and its merges take some 20 MiB, and
	// a string of one byte in the file (9 bytes with its length) takes 24
	// or more decoded, so arrays of them would make memory of 3-4 times a
	// file of gigabytes.
	DefaultMaxMetadataBytes = 256 << 20
)

// Limits bound what a file may declare. A zero (or negative) field takes its
// default; MaxDims above 4 is 4.
type Limits struct {
	MaxTensors     int   // tensors in the file
	MaxKV          int   // metadata key/value pairs
	MaxStringBytes int64 // one string value (keys and tensor names have their own bounds)
	MaxArrayLen    int64 // elements of one array
	MaxDims        int   // dimensions of one tensor
	// MaxMetadataBytes bounds the memory of the decoded metadata (string
	// bytes, string headers, array elements, values).
	MaxMetadataBytes int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxTensors <= 0 {
		l.MaxTensors = DefaultMaxTensors
	}
	if l.MaxKV <= 0 {
		l.MaxKV = DefaultMaxKV
	}
	if l.MaxStringBytes <= 0 {
		l.MaxStringBytes = DefaultMaxStringBytes
	}
	if l.MaxArrayLen <= 0 {
		l.MaxArrayLen = DefaultMaxArrayLen
	}
	if l.MaxDims <= 0 || l.MaxDims > MaxDims {
		l.MaxDims = MaxDims
	}
	if l.MaxMetadataBytes <= 0 {
		l.MaxMetadataBytes = DefaultMaxMetadataBytes
	}
	return l
}

// Tensor describes one tensor of a file.
type Tensor struct {
	Name string
	// Dims in ggml order: Dims[0] is the contiguous (fastest) dimension,
	// the reverse of a Hugging Face / NumPy shape. A file may give fewer
	// than 4; missing ones are 1.
	Dims   []int64
	Type   Type
	Offset int64 // absolute offset of the data in the file
	Size   int64 // bytes of data
}

// Elements is the number of elements (the product of Dims; 1 for none).
func (t *Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Dims {
		if d == 0 {
			return 0
		}
	}
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// File is a parsed GGUF file. The exported fields are what the header says;
// do not change them. Its methods are safe for concurrent use, except that
// Close must come after every use of the file and of the slices TensorData
// returned.
type File struct {
	Version    uint32
	Alignment  int64 // general.alignment, or DefaultAlignment
	DataOffset int64 // absolute offset of the data section
	Size       int64 // bytes in the file
	Keys       []string
	KV         map[string]Value // by key; Keys has them in file order
	Tensors    []Tensor         // in file order

	index map[string]int // tensor name → index in Tensors

	r      io.ReaderAt // where tensor data is read from, when not mapped
	data   []byte      // the file's mapping, when opened with Open
	unmap  func([]byte) error
	advise func([]byte) error // drops the mapping's resident pages
	closer io.Closer          // the file, when Open reads it without a mapping

	mu     sync.Mutex
	closed bool
}

// Parse reads and checks the header of a GGUF file of size bytes read
// through r; TensorData later reads tensor bytes through r.
func Parse(r io.ReaderAt, size int64, lim Limits) (*File, error) {
	if r == nil {
		return nil, errors.New("gguf: Parse: nil reader")
	}
	return parse(r, nil, size, lim, "")
}

func parse(r io.ReaderAt, mem []byte, size int64, lim Limits, name string) (*File, error) {
	d := &decoder{r: r, mem: mem, size: size, lim: lim.withDefaults()}
	if name != "" {
		d.prefix = name + ": "
	}
	if size < 0 {
		return nil, d.errf("negative size %d", size)
	}
	f, err := d.file()
	if err != nil {
		return nil, err
	}
	f.r = r
	return f, nil
}

// Close releases the file: with Open, it unmaps it, after which the slices
// TensorData returned must not be used. Closing twice is not an error.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	if f.data != nil && f.unmap != nil {
		data := f.data
		f.data = nil
		return f.unmap(data)
	}
	if f.closer != nil {
		return f.closer.Close()
	}
	return nil
}

// DropPages tells the kernel this process no longer needs the mapping's
// pages resident: they leave its resident set (they stay in the page
// cache, and a later read faults them back in). Slices TensorData
// returned stay valid. It does nothing where the file is not mapped.
func (f *File) DropPages() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || f.data == nil || f.advise == nil || len(f.data) == 0 {
		return nil
	}
	return f.advise(f.data)
}

// Tensor returns the tensor of that name.
func (f *File) Tensor(name string) (*Tensor, bool) {
	i, ok := f.index[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorData returns the bytes of t. For a file opened with Open it is a
// slice of the read-only mapping (no copy: never write to it, and do not use
// it after Close); for Parse it is read through the ReaderAt into a new slice.
func (f *File) TensorData(t *Tensor) ([]byte, error) {
	if t == nil {
		return nil, fmt.Errorf("%w: nil tensor", ErrInvalid)
	}
	if t.Offset < 0 || t.Size < 0 || t.Offset > f.Size || t.Size > f.Size-t.Offset {
		return nil, fmt.Errorf("%w: tensor %q: bytes [%d, +%d) lie outside the %d-byte file", ErrInvalid, t.Name, t.Offset, t.Size, f.Size)
	}
	f.mu.Lock()
	closed, data, r := f.closed, f.data, f.r
	f.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("gguf: tensor %q: file is closed", t.Name)
	}
	if data != nil {
		end := t.Offset + t.Size
		return data[t.Offset:end:end], nil
	}
	buf := make([]byte, t.Size) // bounded by the file's size, checked above
	if err := readFull(r, buf, t.Offset); err != nil {
		return nil, fmt.Errorf("gguf: reading tensor %q at offset %d: %w", t.Name, t.Offset, err)
	}
	return buf, nil
}

// readFull reads len(buf) bytes at off; a short read is ErrInvalid (the
// file is shorter than it said), any other failure is returned as it is.
func readFull(r io.ReaderAt, buf []byte, off int64) error {
	n, err := r.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: the file ends at %d, short of %d", ErrInvalid, off+int64(n), off+int64(len(buf)))
	}
	return err
}

// decoder reads the header front to back, checking every read against the
// bytes left in the file.
type decoder struct {
	r      io.ReaderAt
	mem    []byte // the whole file, when it is in memory (mapped): read in place
	size   int64
	pos    int64
	lim    Limits
	prefix string // the file's name and ": ", or nothing
	ctx    string // what is being read, for messages ("key \"x\"")
	held   int64  // bytes the decoded metadata takes so far (hold)

	win    []byte // a window of the file at winOff, when reading through r
	winOff int64
	winBuf []byte
}

const windowBytes = 64 << 10

func (d *decoder) errf(format string, args ...any) error {
	ctx := ""
	if d.ctx != "" {
		ctx = d.ctx + ": "
	}
	return fmt.Errorf("%w: %s%s%s", ErrInvalid, d.prefix, ctx, fmt.Sprintf(format, args...))
}

func (d *decoder) left() int64 { return d.size - d.pos }

// take returns the next n bytes, valid until the next call. n is checked
// against the bytes left first, so nothing is allocated for bytes the file
// does not have.
func (d *decoder) take(n int64) ([]byte, error) {
	if n < 0 || n > d.left() {
		return nil, d.errf("%d bytes needed at offset %d, the file has %d left", n, d.pos, d.left())
	}
	if d.mem != nil {
		b := d.mem[d.pos : d.pos+n]
		d.pos += n
		return b, nil
	}
	if d.pos >= d.winOff && d.pos+n <= d.winOff+int64(len(d.win)) {
		b := d.win[d.pos-d.winOff : d.pos-d.winOff+n]
		d.pos += n
		return b, nil
	}
	if n > windowBytes {
		b := make([]byte, n)
		if err := d.read(b, d.pos); err != nil {
			return nil, err
		}
		d.pos += n
		return b, nil
	}
	if d.winBuf == nil {
		d.winBuf = make([]byte, min(windowBytes, d.left()))
	}
	d.win = d.winBuf[:min(int64(len(d.winBuf)), d.left())]
	d.winOff = d.pos
	if err := d.read(d.win, d.pos); err != nil {
		d.win = nil
		return nil, err
	}
	b := d.win[:n]
	d.pos += n
	return b, nil
}

func (d *decoder) read(b []byte, off int64) error {
	if err := readFull(d.r, b, off); err != nil {
		if errors.Is(err, ErrInvalid) {
			return d.errf("reading %d bytes at offset %d: the file is shorter than its size %d", len(b), off, d.size)
		}
		return fmt.Errorf("gguf: %sreading at offset %d: %w", d.prefix, off, err)
	}
	return nil
}

func (d *decoder) u8() (uint8, error) {
	b, err := d.take(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (d *decoder) u16() (uint16, error) {
	b, err := d.take(2)
	if err != nil {
		return 0, err
	}
	return le16(b), nil
}

func (d *decoder) u32() (uint32, error) {
	b, err := d.take(4)
	if err != nil {
		return 0, err
	}
	return le32(b), nil
}

func (d *decoder) u64() (uint64, error) {
	b, err := d.take(8)
	if err != nil {
		return 0, err
	}
	return le64(b), nil
}

func le16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }
func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
func le64(b []byte) uint64 { return uint64(le32(b)) | uint64(le32(b[4:]))<<32 }

// str reads a string of at most max bytes; what names it in messages.
func (d *decoder) str(max int64, what string) (string, error) { return d.strN(max, what, -1) }

// strN is str of an array's element i (≥ 0: named "what i"; formatted
// only for an error, as arrays hold millions).
func (d *decoder) strN(limit int64, what string, i int) (string, error) {
	name := func() string {
		if i < 0 {
			return what
		}
		return what + " " + strconv.Itoa(i)
	}
	at := d.pos
	n, err := d.u64()
	if err != nil {
		return "", err
	}
	if n > uint64(limit) {
		return "", d.errf("%s at offset %d: length %d exceeds the limit of %d bytes", name(), at, n, limit)
	}
	if int64(n) > d.left() {
		return "", d.errf("%s at offset %d: length %d runs past the end of the file (%d bytes left)", name(), at, n, d.left())
	}
	if err := d.hold(max(int64(n), minStringAlloc)); err != nil {
		return "", err
	}
	b, err := d.take(int64(n))
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// Decoded sizes the metadata is charged (hold): a Value, a string's header
// and the least a string's bytes take (an allocation of 8).
const (
	valueBytes      = 48
	stringHeadBytes = 16
	minStringAlloc  = 8
)

// hold charges n bytes of decoded metadata, before they are allocated.
func (d *decoder) hold(n int64) error {
	if n < 0 || n > d.lim.MaxMetadataBytes-d.held {
		return d.errf("the metadata takes more than %d bytes decoded", d.lim.MaxMetadataBytes)
	}
	d.held += n
	return nil
}

// Header sizes, for checking counts against the bytes left before
// allocating for them.
const (
	minKVBytes     = 8 + 1 + 4 + 1     // key length, a 1-byte key, type, a 1-byte value
	minTensorBytes = 8 + 1 + 4 + 4 + 8 // name length, a 1-byte name, n_dims, type, offset
)

func (d *decoder) file() (*File, error) {
	if d.size < 4 {
		return nil, d.errf("%d bytes: too short for a GGUF header", d.size)
	}
	magic, err := d.take(4)
	if err != nil {
		return nil, err
	}
	switch string(magic) {
	case Magic:
	case "FUGG":
		return nil, d.errf("big-endian GGUF file: only little-endian files are supported")
	default:
		return nil, d.errf("magic %q, want %q", magic, Magic)
	}
	version, err := d.u32()
	if err != nil {
		return nil, err
	}
	switch {
	case version == 0:
		return nil, d.errf("version 0")
	case version&0xffff == 0:
		// A byte-swapped small version: written on a big-endian machine.
		return nil, d.errf("version %#x: a big-endian GGUF file; only little-endian files are supported", version)
	case version == 1:
		return nil, d.errf("GGUF version 1 is not supported (versions 2 and 3 are)")
	case version > 3:
		return nil, d.errf("GGUF version %d is not supported (versions 2 and 3 are)", version)
	}
	nTensors, err := d.u64()
	if err != nil {
		return nil, err
	}
	nKV, err := d.u64()
	if err != nil {
		return nil, err
	}
	if nTensors > uint64(d.lim.MaxTensors) {
		return nil, d.errf("%d tensors exceed the limit of %d", nTensors, d.lim.MaxTensors)
	}
	if nKV > uint64(d.lim.MaxKV) {
		return nil, d.errf("%d key/value pairs exceed the limit of %d", nKV, d.lim.MaxKV)
	}
	// Their minimal encodings must fit in what is left.
	if left := uint64(d.left()); nKV > left/minKVBytes || nTensors > (left-nKV*minKVBytes)/minTensorBytes {
		return nil, d.errf("%d key/value pairs and %d tensors need at least %d and %d bytes each, the file has %d after its header", nKV, nTensors, minKVBytes, minTensorBytes, left)
	}

	f := &File{
		Version:   version,
		Alignment: DefaultAlignment,
		Size:      d.size,
		Keys:      make([]string, 0, nKV),
		KV:        make(map[string]Value, nKV),
		Tensors:   make([]Tensor, 0, nTensors),
		index:     make(map[string]int, nTensors),
	}
	if err := d.kvs(f, int(nKV)); err != nil {
		return nil, err
	}
	if err := d.tensorInfos(f, int(nTensors)); err != nil {
		return nil, err
	}
	if err := d.layout(f); err != nil {
		return nil, err
	}
	return f, nil
}

func (d *decoder) kvs(f *File, n int) error {
	for i := range n {
		d.ctx = fmt.Sprintf("key/value pair %d", i)
		key, err := d.str(min(MaxKeyBytes, d.lim.MaxStringBytes), "key")
		if err != nil {
			return err
		}
		if key == "" {
			return d.errf("empty key")
		}
		d.ctx = fmt.Sprintf("key %q", key)
		if _, dup := f.KV[key]; dup {
			return d.errf("duplicate key")
		}
		at := d.pos
		t, err := d.u32()
		if err != nil {
			return err
		}
		if err := d.hold(valueBytes); err != nil {
			return err
		}
		v, err := d.value(ValueType(t), at, 0)
		if err != nil {
			return err
		}
		f.Keys = append(f.Keys, key)
		f.KV[key] = v
	}
	d.ctx = ""
	if v, ok := f.KV[AlignmentKey]; ok {
		d.ctx = fmt.Sprintf("key %q", AlignmentKey)
		a, isU32 := v.Data.(uint32)
		if v.Type != ValueUint32 || !isU32 {
			return d.errf("type %s, want uint32", v.typeName())
		}
		if a == 0 || a&(a-1) != 0 {
			return d.errf("alignment %d is not a power of two", a)
		}
		f.Alignment = int64(a)
		d.ctx = ""
	}
	return nil
}

// value reads a value of type t (whose type tag was at offset at); depth
// counts the arrays it is inside.
func (d *decoder) value(t ValueType, at int64, depth int) (Value, error) {
	switch t {
	case ValueUint8, ValueInt8, ValueBool:
		b, err := d.u8()
		if err != nil {
			return Value{}, err
		}
		switch t {
		case ValueUint8:
			return Value{Type: t, Data: b}, nil
		case ValueInt8:
			return Value{Type: t, Data: int8(b)}, nil
		}
		if b > 1 {
			return Value{}, d.errf("bool at offset %d is %d, want 0 or 1", d.pos-1, b)
		}
		return Value{Type: t, Data: b == 1}, nil
	case ValueUint16, ValueInt16:
		x, err := d.u16()
		if err != nil {
			return Value{}, err
		}
		if t == ValueInt16 {
			return Value{Type: t, Data: int16(x)}, nil
		}
		return Value{Type: t, Data: x}, nil
	case ValueUint32, ValueInt32, ValueFloat32:
		x, err := d.u32()
		if err != nil {
			return Value{}, err
		}
		switch t {
		case ValueInt32:
			return Value{Type: t, Data: int32(x)}, nil
		case ValueFloat32:
			return Value{Type: t, Data: math.Float32frombits(x)}, nil
		}
		return Value{Type: t, Data: x}, nil
	case ValueUint64, ValueInt64, ValueFloat64:
		x, err := d.u64()
		if err != nil {
			return Value{}, err
		}
		switch t {
		case ValueInt64:
			return Value{Type: t, Data: int64(x)}, nil
		case ValueFloat64:
			return Value{Type: t, Data: math.Float64frombits(x)}, nil
		}
		return Value{Type: t, Data: x}, nil
	case ValueString:
		s, err := d.str(d.lim.MaxStringBytes, "string")
		if err != nil {
			return Value{}, err
		}
		return Value{Type: t, Data: s}, nil
	case ValueArray:
		return d.array(at, depth+1)
	}
	return Value{}, d.errf("unknown value type %d at offset %d", uint32(t), at)
}

// array reads an array's element type, count and elements.
func (d *decoder) array(at int64, depth int) (Value, error) {
	if depth > MaxArrayNesting {
		return Value{}, d.errf("array at offset %d is nested %d deep, more than %d", at, depth, MaxArrayNesting)
	}
	et32, err := d.u32()
	if err != nil {
		return Value{}, err
	}
	et := ValueType(et32)
	n, err := d.u64()
	if err != nil {
		return Value{}, err
	}
	esize := et.minBytes()
	if esize == 0 {
		return Value{}, d.errf("array at offset %d: unknown element type %d", at, et32)
	}
	if n > uint64(d.lim.MaxArrayLen) {
		return Value{}, d.errf("array at offset %d: %d elements exceed the limit of %d", at, n, d.lim.MaxArrayLen)
	}
	if n > uint64(d.left()/esize) || n > math.MaxInt/8 {
		return Value{}, d.errf("array at offset %d: %d %s elements need at least %d bytes each, the file has %d left", at, n, et, esize, d.left())
	}
	if err := d.hold(int64(n) * et.goBytes()); err != nil {
		return Value{}, err
	}
	v := Value{Type: ValueArray, Elem: et}
	switch et {
	case ValueString:
		a := make([]string, n)
		for i := range a {
			if a[i], err = d.strN(d.lim.MaxStringBytes, "string", i); err != nil {
				return Value{}, err
			}
		}
		v.Data = a
	case ValueArray:
		a := make([]Value, n)
		for i := range a {
			if a[i], err = d.array(d.pos, depth+1); err != nil {
				return Value{}, err
			}
		}
		v.Data = a
	case ValueBool:
		a := make([]bool, n)
		err = d.fixed(int(n), 1, func(i int, b []byte) error {
			if b[0] > 1 {
				return d.errf("array at offset %d: bool %d is %d, want 0 or 1", at, i, b[0])
			}
			a[i] = b[0] == 1
			return nil
		})
		v.Data = a
	case ValueUint8:
		a := make([]uint8, n)
		err = d.fixed(int(n), 1, func(i int, b []byte) error { a[i] = b[0]; return nil })
		v.Data = a
	case ValueInt8:
		a := make([]int8, n)
		err = d.fixed(int(n), 1, func(i int, b []byte) error { a[i] = int8(b[0]); return nil })
		v.Data = a
	case ValueUint16:
		a := make([]uint16, n)
		err = d.fixed(int(n), 2, func(i int, b []byte) error { a[i] = le16(b); return nil })
		v.Data = a
	case ValueInt16:
		a := make([]int16, n)
		err = d.fixed(int(n), 2, func(i int, b []byte) error { a[i] = int16(le16(b)); return nil })
		v.Data = a
	case ValueUint32:
		a := make([]uint32, n)
		err = d.fixed(int(n), 4, func(i int, b []byte) error { a[i] = le32(b); return nil })
		v.Data = a
	case ValueInt32:
		a := make([]int32, n)
		err = d.fixed(int(n), 4, func(i int, b []byte) error { a[i] = int32(le32(b)); return nil })
		v.Data = a
	case ValueFloat32:
		a := make([]float32, n)
		err = d.fixed(int(n), 4, func(i int, b []byte) error { a[i] = math.Float32frombits(le32(b)); return nil })
		v.Data = a
	case ValueUint64:
		a := make([]uint64, n)
		err = d.fixed(int(n), 8, func(i int, b []byte) error { a[i] = le64(b); return nil })
		v.Data = a
	case ValueInt64:
		a := make([]int64, n)
		err = d.fixed(int(n), 8, func(i int, b []byte) error { a[i] = int64(le64(b)); return nil })
		v.Data = a
	case ValueFloat64:
		a := make([]float64, n)
		err = d.fixed(int(n), 8, func(i int, b []byte) error { a[i] = math.Float64frombits(le64(b)); return nil })
		v.Data = a
	}
	if err != nil {
		return Value{}, err
	}
	return v, nil
}

// fixed reads n elements of size bytes each, in window-sized chunks, and
// hands each to set.
func (d *decoder) fixed(n, size int, set func(i int, b []byte) error) error {
	per := windowBytes / size
	for i := 0; i < n; i += per {
		m := min(per, n-i)
		b, err := d.take(int64(m * size))
		if err != nil {
			return err
		}
		for j := range m {
			if err := set(i+j, b[j*size:(j+1)*size]); err != nil {
				return err
			}
		}
	}
	return nil
}

func (d *decoder) tensorInfos(f *File, n int) error {
	for i := range n {
		d.ctx = fmt.Sprintf("tensor %d", i)
		name, err := d.str(MaxNameBytes, "name")
		if err != nil {
			return err
		}
		if name == "" {
			return d.errf("empty name")
		}
		d.ctx = fmt.Sprintf("tensor %q", name)
		if _, dup := f.index[name]; dup {
			return d.errf("duplicate tensor name")
		}
		nDims, err := d.u32()
		if err != nil {
			return err
		}
		if nDims > uint32(d.lim.MaxDims) {
			return d.errf("%d dimensions, more than %d", nDims, d.lim.MaxDims)
		}
		dims := make([]int64, nDims)
		for j := range dims {
			x, err := d.u64()
			if err != nil {
				return err
			}
			if x > math.MaxInt64 {
				return d.errf("dimension %d is negative (%d)", j, int64(x))
			}
			dims[j] = int64(x)
		}
		typ, err := d.u32()
		if err != nil {
			return err
		}
		at := d.pos
		off, err := d.u64()
		if err != nil {
			return err
		}
		t := Tensor{Name: name, Dims: dims, Type: Type(typ)}
		if t.Type.BlockSize() == 0 {
			d.ctx = ""
			return fmt.Errorf("%w: %stensor %q: %s", ErrUnsupportedType, d.prefix, name, t.Type.describe())
		}
		if t.Size, err = d.tensorBytes(&t); err != nil {
			return err
		}
		if off > math.MaxInt64 {
			return d.errf("offset %d (at %d) is past the end of the file", off, at)
		}
		t.Offset = int64(off) // relative until layout adds the data section's start
		f.index[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}
	d.ctx = ""
	return nil
}

// tensorBytes is the byte size of t's data, which must be a whole number of
// blocks per row and no larger than the file.
func (d *decoder) tensorBytes(t *Tensor) (int64, error) {
	row := int64(1)
	if len(t.Dims) > 0 {
		row = t.Dims[0]
	}
	block := int64(t.Type.BlockSize())
	if row%block != 0 {
		return 0, d.errf("dims %v: rows of %d elements are not a whole number of %d-element %s blocks", t.Dims, row, block, t.Type)
	}
	// A tensor with no elements still has dims its readers size: its row's
	// bytes and the product of its other dims must count in an int64 (ggml
	// checks the same), or a reader sizing a row of [2^61, 0] overflows.
	if slices.Contains(t.Dims, 0) {
		if _, err := t.Type.RowBytes(row); err != nil {
			return 0, d.errf("dims %v: rows of %d %s elements overflow a byte count", t.Dims, row, t.Type)
		}
		n := uint64(1)
		for _, x := range t.Dims {
			if x == 0 {
				continue
			}
			hi, lo := bits.Mul64(n, uint64(x))
			if hi != 0 || lo > math.MaxInt64 {
				return 0, d.errf("dims %v: more elements than an int64 counts, leaving out the zero", t.Dims)
			}
			n = lo
		}
		return 0, nil
	}
	// blocks per row × bytes per block × the other dims, each product
	// bounded by the file's size.
	size := row / block
	factors := append([]int64{int64(t.Type.BlockBytes())}, t.Dims[min(1, len(t.Dims)):]...)
	for _, n := range factors {
		hi, lo := bits.Mul64(uint64(size), uint64(n))
		if hi != 0 || lo > uint64(d.size) {
			return 0, d.errf("dims %v of %s need more bytes than the %d-byte file holds", t.Dims, t.Type, d.size)
		}
		size = int64(lo)
	}
	return size, nil
}

// layout places the data section after the header, aligned, and checks
// every tensor lies inside it, aligned, overlapping no other.
func (d *decoder) layout(f *File) error {
	end := d.pos
	a := f.Alignment
	if end > math.MaxInt64-a {
		return d.errf("header end %d cannot be aligned", end)
	}
	aligned := (end + a - 1) / a * a
	f.DataOffset = aligned
	if aligned > d.size {
		if len(f.Tensors) > 0 {
			return d.errf("the data section would start at %d (the header's end %d aligned to %d), past the end of the %d-byte file", aligned, end, a, d.size)
		}
		f.DataOffset = end
	}
	dataLen := d.size - f.DataOffset
	for i := range f.Tensors {
		t := &f.Tensors[i]
		d.ctx = fmt.Sprintf("tensor %q", t.Name)
		if t.Offset%a != 0 {
			return d.errf("offset %d is not a multiple of the alignment %d", t.Offset, a)
		}
		if t.Offset > dataLen || t.Size > dataLen-t.Offset {
			return d.errf("data [%d, %d) of the data section at %d runs past the end of the %d-byte file", t.Offset, t.Offset+t.Size, f.DataOffset, d.size)
		}
		t.Offset += f.DataOffset
	}
	d.ctx = ""
	order := make([]int, 0, len(f.Tensors))
	for i, t := range f.Tensors {
		if t.Size > 0 {
			order = append(order, i)
		}
	}
	sort.Slice(order, func(i, j int) bool { return f.Tensors[order[i]].Offset < f.Tensors[order[j]].Offset })
	for k := 1; k < len(order); k++ {
		p, t := &f.Tensors[order[k-1]], &f.Tensors[order[k]]
		if t.Offset < p.Offset+p.Size {
			return d.errf("tensor %q at [%d, %d) overlaps tensor %q at [%d, %d)", t.Name, t.Offset, t.Offset+t.Size, p.Name, p.Offset, p.Offset+p.Size)
		}
	}
	return nil
}
