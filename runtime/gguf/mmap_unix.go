//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package gguf

import (
	"fmt"
	"math"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Open memory-maps the GGUF file at path read-only and parses its header;
// TensorData then returns slices of the mapping. Close unmaps it. The file
// must not be truncated while it is mapped (reading a page past the new end
// faults), which is why Ollama's content-addressed blobs and a repository's
// version directories, written once, are what it is for.
func Open(path string, lim Limits) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close() // the mapping outlives the descriptor
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s: not a regular file", ErrInvalid, path)
	}
	size := st.Size()
	if size == 0 {
		return parse(nil, []byte{}, 0, lim, path)
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("%w: %s: %d bytes is too large to map", ErrInvalid, path, size)
	}
	data, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("gguf: mapping %s: %w", path, err)
	}
	f, err := parse(nil, data, size, lim, path)
	if err != nil {
		_ = syscall.Munmap(data)
		return nil, err
	}
	f.data = data
	f.unmap = syscall.Munmap
	f.advise = func(b []byte) error { return unix.Madvise(b, unix.MADV_DONTNEED) }
	return f, nil
}
