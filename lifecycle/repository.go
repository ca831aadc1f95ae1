package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/models/llm"
	"github.com/brokerd/brokerd/runtime/models/repo"
)

// Repository is what model management needs of the model repository
// (runtime/models/repo): what it holds, and a loaded model of it.
type Repository interface {
	// List describes every model directory, loadable or not.
	List() ([]RepoEntry, error)
	// Load reads one version of a model (0: the highest loadable one).
	Load(ctx context.Context, name string, version int64) (Loaded, error)
	// Fingerprint identifies a version's files as they are on disk now,
	// without reading them: a change means a reload must read them again.
	Fingerprint(name string, version int64) (string, error)
	// Canonical is the name a model is served under: an Ollama store's
	// model answers to several (qwen2.5, qwen2.5:latest,
	// library/qwen2.5:latest); other names are their own.
	Canonical(name string) string
}

// Loaded is a model read from the repository and the version it is:
// a batch model, or a decoder LLM.
type Loaded struct {
	Model       models.Model
	LLM         *llm.Model
	Version     int64
	Fingerprint string // of the files it was read from (Repository.Fingerprint)
}

// RepoEntry is one model of the repository.
type RepoEntry struct {
	Name     string
	Kind     string
	Versions []int64 // loadable versions, ascending
	Err      string  // why the model (or its newest version) cannot load
	// Details describe the newest loadable version's files (format, size,
	// parameters, quantization).
	Details repo.Details
}

// repository adapts the model repository (runtime/models/repo) to what
// model management needs.
type repository struct{ r *repo.Repo }

// OpenRepository opens the model repository at dir. The default one
// (<state-dir>/models) is created when missing; a directory given with
// --model-repo must exist, so a mistyped path is an error, not an empty
// repository.
func OpenRepository(dir string, create bool, log *zap.Logger, opts ...repo.Option) (Repository, error) {
	if create {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("model repository: %w", err)
		}
	}
	r, err := repo.Open(dir, log.Named("repo"), opts...)
	if err != nil {
		return nil, fmt.Errorf("model-repo: %w", err)
	}
	log.Info("model repository", zap.String("dir", dir))
	return repository{r}, nil
}

func (p repository) List() ([]RepoEntry, error) {
	var out []RepoEntry
	for _, e := range p.r.List() {
		re := RepoEntry{Name: e.Name, Kind: string(e.Kind), Versions: e.Loadable(), Details: e.Details}
		var why []string
		if e.Err != nil {
			why = append(why, e.Err.Error())
		}
		for _, v := range slices.Sorted(maps.Keys(e.Errs)) {
			why = append(why, fmt.Sprintf("version %d: %v", v, e.Errs[v]))
		}
		re.Err = strings.Join(why, "; ")
		out = append(out, re)
	}
	return out, nil
}

func (p repository) Load(ctx context.Context, name string, version int64) (Loaded, error) {
	l, err := p.r.Load(ctx, name, version)
	if err != nil {
		if errors.Is(err, repo.ErrNotFound) {
			return Loaded{}, notFoundError{err}
		}
		return Loaded{}, err
	}
	if l.LLM != nil {
		return Loaded{LLM: l.LLM, Version: l.Version, Fingerprint: l.Fingerprint}, nil
	}
	m, err := l.Model()
	if err != nil {
		return Loaded{}, err
	}
	return Loaded{Model: m, Version: l.Version, Fingerprint: l.Fingerprint}, nil
}

func (p repository) Fingerprint(name string, version int64) (string, error) {
	fp, err := p.r.Fingerprint(name, version)
	if errors.Is(err, repo.ErrNotFound) {
		return "", notFoundError{err}
	}
	return fp, err
}

// notFoundError is a repository's not-found error that also matches
// ErrModelNotFound, without repeating "model not found" in the message.
type notFoundError struct{ error }

func (e notFoundError) Is(target error) bool { return target == ErrModelNotFound }
func (e notFoundError) Unwrap() error        { return e.error }
