package repo

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/brokerd/brokerd/runtime/models"
)

// Model files are data from whoever can write the repository, not trusted
// code: every file is read only if it is a regular file inside the
// repository (links are followed only while they stay inside), JSON files
// only up to a size, and every size a configuration states is bounded
// before anything is built from it.

// Size limits of the files read whole.
const (
	maxJSONBytes      = 16 << 20 // config.json, brokerd.json, model.json, ...
	maxTokenizerBytes = 64 << 20 // tokenizer.json (Llama 3's is ~9 MB), as runtime/models/tokenizer/bpe reads it
)

// Bounds of the sizes a config.json or model.json may state: far above
// any model brokerd can serve, far below what would exhaust memory when
// structures are sized by them.
const (
	maxLayers     = 1024
	maxHidden     = 1 << 16
	maxHeads      = 1024
	maxInter      = 1 << 19
	maxVocab      = 1 << 23
	maxPositions  = 1 << 20
	maxTypeVocab  = 1 << 10
	maxLabels     = 1 << 16
	maxMLPWidth   = 1 << 20
	maxMLPLayers  = 1024
	minParamBytes = 2 // F16/BF16: the smallest weights brokerd reads
)

// inside resolves path's links and returns the real path when it lies
// inside the repository. Otherwise the error is ErrInvalid: a link out of
// the repository, a link loop, or a path that does not exist (which also
// matches fs.ErrNotExist), never a bare file-system error that would reach
// a client as INTERNAL.
func (r *Repo) inside(path string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	switch {
	case isNotExist(err):
		return "", fmt.Errorf("%w: %s is missing: %w", ErrInvalid, path, err)
	case err != nil && strings.Contains(err.Error(), "too many links"), errors.Is(err, syscall.ELOOP):
		return "", fmt.Errorf("%w: %s: too many links (a link loop?)", ErrInvalid, path)
	case err != nil:
		return "", fmt.Errorf("%w: %s: %w", ErrInvalid, path, err)
	}
	rel, err := filepath.Rel(r.root, real)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		// Where it leads is not said: the message reaches data-plane
		// clients, and the admin can look.
		return "", fmt.Errorf("%w: %s links outside the repository", ErrInvalid, path)
	}
	return real, nil
}

// regular checks that path is a regular file inside the repository of at
// most limit bytes (0: any size), and returns its size. It opens the file
// non-blocking, so a FIFO cannot hang the caller, and checks the type of
// what it opened.
func (r *Repo) regular(path string, limit int64) (int64, error) {
	f, size, err := r.open(path, limit)
	if err != nil {
		return 0, err
	}
	f.Close()
	return size, nil
}

func (r *Repo) open(path string, limit int64) (*os.File, int64, error) {
	real, err := r.inside(path)
	if err != nil {
		return nil, 0, err
	}
	f, err := os.OpenFile(real, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %s cannot be opened: %w", ErrInvalid, path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("%w: %s: %w", ErrInvalid, path, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%w: %s is not a regular file (%s)", ErrInvalid, path, st.Mode().Type())
	}
	if limit > 0 && st.Size() > limit {
		f.Close()
		return nil, 0, fmt.Errorf("%w: %s is %d bytes, larger than the %d this file may be", ErrInvalid, path, st.Size(), limit)
	}
	return f, st.Size(), nil
}

// readFile reads a regular file inside the repository of at most limit
// bytes.
func (r *Repo) readFile(path string, limit int64) ([]byte, error) {
	f, size, err := r.open(path, limit)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, size+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s cannot be read: %w", ErrInvalid, path, err)
	}
	if int64(len(b)) > limit && limit > 0 {
		return nil, fmt.Errorf("%w: %s grew past %d bytes while read", ErrInvalid, path, limit)
	}
	return b, nil
}

// bounded checks one stated size of a configuration against 1..max.
func bounded(path, key string, v, maxV int) error {
	if v <= 0 || v > maxV {
		return fmt.Errorf("%w: %s: %s is %d: want 1 to %d", models.ErrInvalidConfig, path, key, v, maxV)
	}
	return nil
}
