package repo

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// maxFingerprintFiles bounds the files a fingerprint looks at: a version
// directory holds a handful (config, weights or their shards, tokenizer).
const maxFingerprintFiles = 4096

// Fingerprint identifies the files of a version as they are on disk now:
// every regular file's path, size and modification time, hashed. It reads
// no file's contents, so it is cheap next to a load, and a rewrite of any
// file (new weights, a changed config or tokenizer) changes it. A reload
// compares it with the fingerprint of the version being served.
func (r *Repo) Fingerprint(name string, version int64) (string, error) {
	fp, err := r.fingerprintOf(name, version)
	return fp, r.relative(err)
}

func (r *Repo) fingerprintOf(name string, version int64) (string, error) {
	if m, ok := r.ollamaModel(name); ok {
		return r.ollamaFingerprint(m, version)
	}
	if !validName(name) {
		return "", fmt.Errorf("%w: name %q: want a plain directory name (no separators, not hidden)", ErrInvalid, name)
	}
	if err := r.modelDir(name); err != nil {
		return "", err
	}
	dir := filepath.Join(r.dir, name, strconv.FormatInt(version, 10))
	real, err := r.inside(dir)
	if err != nil {
		return "", fmt.Errorf("%w: model %q has no version %d", ErrNotFound, name, version)
	}
	fp, err := fingerprint(real)
	if err != nil && !errors.Is(err, ErrInvalid) {
		// A directory that cannot be read: the model's layout, not a bug.
		err = fmt.Errorf("%w: model %q version %d: %w", ErrInvalid, name, version, err)
	}
	return fp, err
}

func fingerprint(dir string) (string, error) {
	h := sha256.New()
	n := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n > maxFingerprintFiles {
			return fmt.Errorf("%w: %s holds more than %d files", ErrInvalid, dir, maxFingerprintFiles)
		}
		if d.IsDir() {
			return nil
		}
		// Stat follows a link, as the loader does: what counts is the
		// file the loader would read.
		st, err := os.Stat(path)
		if err != nil || !st.Mode().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		fmt.Fprintf(h, "%q %d %d\n", rel, st.Size(), st.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
