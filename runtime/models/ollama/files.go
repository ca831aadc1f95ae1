package ollama

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The store's files are data from whoever can write it, read as
// runtime/models/repo reads its repository: a file is read only if it is a
// regular file inside the store (links are followed only while they stay
// inside), opened non-blocking so a FIFO cannot hang the reader, and read
// whole only up to a size. Messages name files relative to the store
// (manifests/..., blobs/...): they reach clients, which have no business
// knowing where the store lives, and never say where a link leads.

// rel is path relative to the store, for messages.
func (s *Store) rel(path string) string {
	if r, err := filepath.Rel(s.root, path); err == nil && !filepath.IsAbs(r) && r != ".." && !strings.HasPrefix(r, ".."+string(filepath.Separator)) {
		return filepath.ToSlash(r)
	}
	if r, err := filepath.Rel(s.dir, path); err == nil && !filepath.IsAbs(r) && r != ".." && !strings.HasPrefix(r, ".."+string(filepath.Separator)) {
		return filepath.ToSlash(r)
	}
	return filepath.Base(path)
}

// inside resolves path's links and returns the real path when it lies
// inside the store. A missing path matches fs.ErrNotExist.
func (s *Store) inside(path string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("%w: %s is missing: %w", ErrInvalid, s.rel(path), fs.ErrNotExist)
	case err != nil && (errors.Is(err, syscall.ELOOP) || strings.Contains(err.Error(), "too many links")):
		return "", fmt.Errorf("%w: %s: too many links (a link loop?)", ErrInvalid, s.rel(path))
	case err != nil:
		return "", fmt.Errorf("%w: %s: %s", ErrInvalid, s.rel(path), errText(err))
	}
	r, err := filepath.Rel(s.root, real)
	if err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) || filepath.IsAbs(r) {
		return "", fmt.Errorf("%w: %s links outside the store", ErrInvalid, s.rel(path))
	}
	return real, nil
}

// open opens path, a regular file inside the store of at most limit bytes
// (negative: any size), and returns it with its information.
func (s *Store) open(path string, limit int64) (*os.File, os.FileInfo, error) {
	real, err := s.inside(path)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.OpenFile(real, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, fmt.Errorf("%w: %s is missing: %w", ErrInvalid, s.rel(path), fs.ErrNotExist)
		}
		return nil, nil, fmt.Errorf("%w: %s cannot be opened: %s", ErrInvalid, s.rel(path), errText(err))
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%w: %s: %s", ErrInvalid, s.rel(path), errText(err))
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%w: %s is not a regular file (%s)", ErrInvalid, s.rel(path), st.Mode().Type())
	}
	if limit >= 0 && st.Size() > limit {
		f.Close()
		return nil, nil, fmt.Errorf("%w: %s is %d bytes, more than the %d it may be", ErrInvalid, s.rel(path), st.Size(), limit)
	}
	return f, st, nil
}

// stat is open's check without keeping the file open.
func (s *Store) stat(path string, limit int64) (os.FileInfo, error) {
	f, st, err := s.open(path, limit)
	if err != nil {
		return nil, err
	}
	f.Close()
	return st, nil
}

// readFile reads a regular file inside the store of at most limit bytes
// (limit >= 0).
func (s *Store) readFile(path string, limit int64) ([]byte, os.FileInfo, error) {
	f, st, err := s.open(path, limit)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, st.Size()+1))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s cannot be read: %s", ErrInvalid, s.rel(path), errText(err))
	}
	if int64(len(b)) > limit {
		return nil, nil, fmt.Errorf("%w: %s grew past %d bytes while read", ErrInvalid, s.rel(path), limit)
	}
	return b, st, nil
}

// errText is err's message with the paths of a *fs.PathError left out
// (they would name the store's directory).
func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Op + ": " + le.Err.Error()
	}
	return err.Error()
}
