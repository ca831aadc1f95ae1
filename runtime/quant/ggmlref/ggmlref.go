// Package ggmlref is ggml itself, for tests: llama.cpp's libggml-base.so as
// npm's @node-llama-cpp/linux-x64 3.21.1 ships it, opened with dlopen at run
// time (nothing links it at build time). runtime/quant's tests quantize
// with ggml_quantize_chunk and compare quant.Dequantize with the to_float of
// ggml's type traits bit for bit; runtime/onednn's test the quantized
// matrix products on weights ggml quantized. Tests only: no package of
// brokerd itself imports it.
//
// Find locates the library for a test: BROKERD_GGML_LIB names one, else the
// package installs the locked npm package into testdata/npm/node_modules
// (npm ci under a file lock, as server/httpapi/nodeclients does) on first
// use. Without it the test fails saying how to get it, unless
// BROKERD_SKIP_GGML=1 says to skip.
package ggmlref

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "ggmlref.h"
*/
import "C"

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// Lib is an opened libggml-base.so.
type Lib struct {
	c *C.ggmlref_lib
	// Path is the file opened; Commit and Version are what ggml_commit and
	// ggml_version report ("" where the build has neither).
	Path, Commit, Version string
}

// Traits is what ggml's type traits say of a type.
type Traits struct {
	Name       string
	BlockElems int64
	BlockBytes int64
	Quantized  bool
	ToFloat    bool // whether the type has a to_float
}

// maxType bounds the type numbers passed to the library: ggml aborts the
// process on a number past GGML_TYPE_COUNT, which is at least 40 in every
// build with MXFP4 (39).
const maxType = 39

var (
	openMu sync.Mutex
	opened = map[string]*Lib{}
)

// Open loads the library at path (once per process) and checks that the
// traits layout this package assumes is the library's: type names, block
// sizes and to_float results on known F16 and Q8_0 inputs.
func Open(path string) (*Lib, error) {
	openMu.Lock()
	defer openMu.Unlock()
	if l, ok := opened[path]; ok {
		return l, nil
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [512]C.char
	c := C.ggmlref_open(cpath, &errbuf[0], C.size_t(len(errbuf)))
	if c == nil {
		return nil, fmt.Errorf("ggmlref: open %s: %s", path, C.GoString(&errbuf[0]))
	}
	l := &Lib{c: c, Path: path, Commit: C.GoString(C.ggmlref_commit(c)), Version: C.GoString(C.ggmlref_version(c))}
	if err := l.check(); err != nil {
		return nil, fmt.Errorf("ggmlref: %s does not have the ggml_type_traits layout this package assumes: %w", path, err)
	}
	opened[path] = l
	return l, nil
}

// check verifies the struct layout against the library's own accessors and
// known values.
func (l *Lib) check() error {
	want := map[uint32]Traits{
		0:  {"f32", 1, 4, false, false},
		1:  {"f16", 1, 2, false, true},
		2:  {"q4_0", 32, 18, true, true},
		8:  {"q8_0", 32, 34, true, true},
		12: {"q4_K", 256, 144, true, true},
		14: {"q6_K", 256, 210, true, true},
		30: {"bf16", 1, 2, false, true},
	}
	for typ, w := range want {
		got, err := l.Traits(typ)
		if err != nil {
			return err
		}
		if got != w {
			return fmt.Errorf("type %d: traits %+v, want %+v", typ, got, w)
		}
	}
	// F16: 1, -2, the largest half, the smallest subnormal.
	f16 := []byte{0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b, 0x01, 0x00}
	got, err := l.ToFloat(1, f16, 4)
	if err != nil {
		return err
	}
	for i, w := range []float32{1, -2, 65504, 1.0 / (1 << 24)} {
		if got[i] != w {
			return fmt.Errorf("f16 to_float: element %d is %g, want %g", i, got[i], w)
		}
	}
	// Q8_0: d = 0.5 (0x3800), q = j-16.
	q8 := []byte{0x00, 0x38}
	for j := 0; j < 32; j++ {
		q8 = append(q8, byte(int8(j-16)))
	}
	if got, err = l.ToFloat(8, q8, 32); err != nil {
		return err
	}
	for j := range 32 {
		if w := float32(j-16) * 0.5; got[j] != w {
			return fmt.Errorf("q8_0 to_float: element %d is %g, want %g", j, got[j], w)
		}
	}
	return nil
}

// Traits returns ggml's traits of type t. The names and sizes in the struct
// must agree with ggml_type_name, ggml_blck_size and ggml_type_size.
func (l *Lib) Traits(t uint32) (Traits, error) {
	if t > maxType {
		return Traits{}, fmt.Errorf("ggmlref: type %d out of range", t)
	}
	var tr C.ggmlref_traits
	C.ggmlref_traits_of(l.c, C.int(t), &tr)
	out := Traits{
		Name:       C.GoString(tr.name),
		BlockElems: int64(tr.blck_size),
		BlockBytes: int64(tr.type_size),
		Quantized:  tr.is_quantized != 0,
		ToFloat:    tr.has_to_float != 0,
	}
	if fn := C.GoString(tr.fn_type_name); fn != out.Name ||
		int64(tr.fn_blck_size) != out.BlockElems || int64(tr.fn_type_size) != out.BlockBytes {
		return Traits{}, fmt.Errorf("type %d: traits say %s/%d/%d, ggml_type_name/ggml_blck_size/ggml_type_size say %s/%d/%d",
			t, out.Name, out.BlockElems, out.BlockBytes, fn, int64(tr.fn_blck_size), int64(tr.fn_type_size))
	}
	return out, nil
}

// RequiresImatrix reports whether ggml refuses to quantize type t without an
// importance matrix.
func (l *Lib) RequiresImatrix(t uint32) bool {
	if t > maxType {
		return false
	}
	return C.ggmlref_requires_imatrix(l.c, C.int(t)) != 0
}

// blocks checks that n elements of t are whole blocks and returns the
// traits and the byte size.
func (l *Lib) blocks(t uint32, n int64) (Traits, int64, error) {
	tr, err := l.Traits(t)
	if err != nil {
		return tr, 0, err
	}
	if tr.BlockElems <= 0 || tr.BlockBytes <= 0 {
		return tr, 0, fmt.Errorf("ggmlref: type %d (%s) has no blocks", t, tr.Name)
	}
	if n < 0 || n%tr.BlockElems != 0 {
		return tr, 0, fmt.Errorf("ggmlref: %d elements of %s are not whole blocks of %d", n, tr.Name, tr.BlockElems)
	}
	return tr, n / tr.BlockElems * tr.BlockBytes, nil
}

// Quantize quantizes nrows rows of nPerRow elements with
// ggml_quantize_chunk (no importance matrix) and returns ggml's bytes.
func (l *Lib) Quantize(t uint32, src []float32, nrows, nPerRow int) ([]byte, error) {
	if nrows < 0 || nPerRow < 0 || int64(nrows)*int64(nPerRow) != int64(len(src)) {
		return nil, fmt.Errorf("ggmlref: %d values for %d rows of %d", len(src), nrows, nPerRow)
	}
	tr, rowBytes, err := l.blocks(t, int64(nPerRow))
	if err != nil {
		return nil, err
	}
	if l.RequiresImatrix(t) {
		return nil, fmt.Errorf("ggmlref: %s needs an importance matrix", tr.Name)
	}
	dst := make([]byte, rowBytes*int64(nrows))
	if len(src) == 0 {
		return dst, nil
	}
	n := C.ggmlref_quantize(l.c, C.int(t), (*C.float)(unsafe.Pointer(&src[0])), unsafe.Pointer(&dst[0]),
		C.int64_t(nrows), C.int64_t(nPerRow))
	if int64(n) != int64(len(dst)) {
		return nil, fmt.Errorf("ggmlref: ggml_quantize_chunk wrote %d bytes, want %d", int64(n), len(dst))
	}
	return dst, nil
}

// ToFloat decodes n elements of type t with ggml's to_float. ggml has no
// to_float for f32 (its rows are the floats): ToFloat copies them.
func (l *Lib) ToFloat(t uint32, src []byte, n int) ([]float32, error) {
	_, size, err := l.blocks(t, int64(n))
	if err != nil {
		return nil, err
	}
	if size != int64(len(src)) {
		return nil, fmt.Errorf("ggmlref: %d bytes for %d elements of type %d, want %d", len(src), n, t, size)
	}
	dst := make([]float32, n)
	if n == 0 {
		return dst, nil
	}
	if t == 0 {
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(src[4*i]) | uint32(src[4*i+1])<<8 | uint32(src[4*i+2])<<16 | uint32(src[4*i+3])<<24)
		}
		return dst, nil
	}
	if C.ggmlref_to_float(l.c, C.int(t), unsafe.Pointer(&src[0]), (*C.float)(unsafe.Pointer(&dst[0])), C.int64_t(n)) == 0 {
		return nil, fmt.Errorf("ggmlref: type %d has no to_float", t)
	}
	return dst, nil
}

// NPMDir is the folder of the package.json and package-lock.json that pin
// @node-llama-cpp/linux-x64.
func NPMDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata", "npm")
}

// DefaultPath is where npm ci in NPMDir puts libggml-base.so.
func DefaultPath() string {
	return filepath.Join(NPMDir(), "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64", "libggml-base.so")
}

const help = `runtime/quant's tests compare every GGUF block type with llama.cpp's own
libggml-base.so, from npm's @node-llama-cpp/linux-x64 3.21.1 (linux/amd64).
The tests install it themselves with "npm ci" in
  %s
(make deps installs Node.js and npm). Or point BROKERD_GGML_LIB at a
libggml-base.so of a llama.cpp build, or set BROKERD_SKIP_GGML=1 to skip
these tests.`

// Find returns the library for a test. It skips the test when
// BROKERD_SKIP_GGML=1, opens BROKERD_GGML_LIB when set, and otherwise
// installs the npm package when missing; anything else fails the test with
// instructions.
func Find(tb testing.TB) *Lib {
	tb.Helper()
	if os.Getenv("BROKERD_SKIP_GGML") == "1" {
		tb.Skip("BROKERD_SKIP_GGML=1: not comparing with ggml")
	}
	path := os.Getenv("BROKERD_GGML_LIB")
	if path == "" {
		if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
			tb.Fatalf("npm's @node-llama-cpp/linux-x64 runs on linux/amd64 only, this is %s/%s.\n"+help,
				runtime.GOOS, runtime.GOARCH, NPMDir())
		}
		path = DefaultPath()
		if err := install(path); err != nil {
			tb.Fatalf("the ggml reference library is missing: %v\n"+help, err, NPMDir())
		}
	}
	l, err := Open(path)
	if err != nil {
		tb.Fatalf("%v\n"+help, err, NPMDir())
	}
	return l
}

// install runs npm ci in NPMDir under an exclusive lock when path is
// missing: test binaries of several packages may run it at once.
func install(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	dir := NPMDir()
	lock, err := os.OpenFile(filepath.Join(dir, ".npm-ci.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it too
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("%s is missing and npm is not installed", path)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// --ignore-scripts: the package has no install script; nothing else may
	// download or build anything.
	cmd := exec.CommandContext(ctx, npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund")
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("npm ci in %s: %v\n%s", dir, err, out.String())
	}
	if _, err := os.Stat(path); err != nil {
		return errors.New("npm ci did not install " + path)
	}
	return nil
}
