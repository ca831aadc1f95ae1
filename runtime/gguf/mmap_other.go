//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package gguf

import (
	"fmt"
	"os"
)

// Open opens the GGUF file at path and parses its header; where memory
// mapping is not implemented, TensorData reads each tensor into a new slice.
func Open(path string, lim Limits) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := fd.Stat()
	if err != nil {
		_ = fd.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		_ = fd.Close()
		return nil, fmt.Errorf("%w: %s: not a regular file", ErrInvalid, path)
	}
	f, err := parse(fd, nil, st.Size(), lim, path)
	if err != nil {
		_ = fd.Close()
		return nil, err
	}
	f.closer = fd
	return f, nil
}
