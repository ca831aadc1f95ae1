package ollama

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
)

// blobKey is a verified blob: its real path, size and modification time.
type blobKey struct {
	path  string
	size  int64
	mtime int64 // UnixNano
}

// verifyChunk is Verify's read size; it checks its context after each.
const verifyChunk = 1 << 20

// progressEvery is how many bytes Verify reads between progress reports
// (a variable for the tests).
var progressEvery int64 = 64 << 20

// Verify checks that m's GGUF blob is what its digest says: its sha256,
// streamed (files are gigabytes), reported to progress (if not nil) as
// bytes done of total at the start, every 64 MiB and at the end. A blob
// verified once is not read again while its path, size and modification
// time stay the same (a blob changed under the same name is read again);
// concurrent calls for one blob read it once. The error is m.Err, ctx's
// error when it ends first, ErrInvalid when the blob is missing, not a
// regular file in the store, or not of m.Size bytes (truncated), and
// ErrCorrupt when its sha256 differs.
func (s *Store) Verify(ctx context.Context, m Model, progress func(done, total int64)) error {
	if m.Err != nil {
		return m.Err
	}
	if m.Path == "" || !digestRE.MatchString(m.Digest) {
		return fmt.Errorf("%w: %s: no GGUF blob to verify", ErrInvalid, m.Name)
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		f, key, err := s.openBlob(m)
		if err != nil {
			return &modelError{name: m.Name, err: err}
		}
		s.mu.Lock()
		if _, ok := s.verified[key]; ok {
			s.mu.Unlock()
			f.Close()
			return nil
		}
		if v, ok := s.inflight[key.path]; ok {
			s.mu.Unlock()
			f.Close()
			select {
			case <-v.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			// The other call's failure is this one's when it read the same
			// file for the same digest; else (it succeeded, was cancelled,
			// or read another file) look again.
			if v.err != nil && !v.cancelled && v.key == key && v.digest == m.Digest {
				return &modelError{name: m.Name, err: v.err}
			}
			continue
		}
		v := &verification{done: make(chan struct{}), key: key, digest: m.Digest}
		s.inflight[key.path] = v
		s.mu.Unlock()

		err = s.hash(ctx, f, key, m, progress)
		f.Close()
		v.err = err
		v.cancelled = err != nil && errors.Is(err, ctx.Err())
		s.mu.Lock()
		if err == nil {
			s.verified[key] = struct{}{}
		}
		delete(s.inflight, key.path)
		s.mu.Unlock()
		close(v.done)
		if err != nil && !v.cancelled {
			return &modelError{name: m.Name, err: err}
		}
		return err
	}
}

// verification is one under way: its result is set before done closes.
type verification struct {
	done      chan struct{}
	key       blobKey
	digest    string
	err       error
	cancelled bool
}

// openBlob opens m's blob and checks its size.
func (s *Store) openBlob(m Model) (*os.File, blobKey, error) {
	real, err := s.inside(m.Path)
	if err != nil {
		return nil, blobKey{}, err
	}
	f, st, err := s.open(real, -1)
	if err != nil {
		return nil, blobKey{}, err
	}
	if st.Size() != m.Size {
		f.Close()
		return nil, blobKey{}, fmt.Errorf("%w: %s is %d bytes, the manifest says %d (truncated?)", ErrInvalid, blobName(m.Digest), st.Size(), m.Size)
	}
	return f, blobKey{path: real, size: st.Size(), mtime: st.ModTime().UnixNano()}, nil
}

// hash reads f to its end and compares its sha256 with m's digest.
func (s *Store) hash(ctx context.Context, f *os.File, key blobKey, m Model, progress func(done, total int64)) error {
	h := sha256.New()
	buf := make([]byte, verifyChunk)
	var done, reported int64
	if progress != nil {
		progress(0, key.size)
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := f.Read(buf)
		h.Write(buf[:n])
		done += int64(n)
		if done > key.size {
			return fmt.Errorf("%w: %s grew while verified", ErrInvalid, blobName(m.Digest))
		}
		if progress != nil && done-reported >= progressEvery && done < key.size {
			progress(done, key.size)
			reported = done
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %s cannot be read: %s", ErrInvalid, blobName(m.Digest), errText(err))
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if done != key.size {
		return fmt.Errorf("%w: %s shrank to %d bytes while verified (%d before)", ErrInvalid, blobName(m.Digest), done, key.size)
	}
	if st, err := f.Stat(); err != nil || st.Size() != key.size || st.ModTime().UnixNano() != key.mtime {
		return fmt.Errorf("%w: %s changed while verified", ErrInvalid, blobName(m.Digest))
	}
	if progress != nil {
		progress(done, key.size)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != m.Digest {
		return fmt.Errorf("%w: %s has %s, not the manifest's digest (a damaged download: pull the model again)", ErrCorrupt, blobName(m.Digest), got)
	}
	return nil
}

// Verified reports whether m's blob is verified and unchanged since.
func (s *Store) Verified(m Model) bool {
	if m.Err != nil || m.Path == "" {
		return false
	}
	f, key, err := s.openBlob(m)
	if err != nil {
		return false
	}
	f.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.verified[key]
	return ok
}
