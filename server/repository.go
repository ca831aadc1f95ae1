package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/runtime/models/repo"
)

// repository adapts the model repository (runtime/models/repo) to what
// model management needs.
type repository struct{ r *repo.Repo }

// openRepository opens the model repository at dir. The default one
// (<state-dir>/models) is created when missing; a directory given with
// --model-repo must exist, so a mistyped path is an error, not an empty
// repository.
func openRepository(dir string, create bool, log *zap.Logger, opts ...repo.Option) (Repository, error) {
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
		re := RepoEntry{Name: e.Name, Kind: string(e.Kind), Versions: e.Loadable()}
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

func (p repository) Load(ctx context.Context, name string, version int64) (loadedModel, error) {
	l, err := p.r.Load(ctx, name, version)
	if err != nil {
		if errors.Is(err, repo.ErrNotFound) {
			return loadedModel{}, notFoundError{err}
		}
		return loadedModel{}, err
	}
	if l.LLM != nil {
		return loadedModel{LLM: l.LLM, Version: l.Version}, nil
	}
	m, err := l.Model()
	if err != nil {
		return loadedModel{}, err
	}
	return loadedModel{Model: m, Version: l.Version}, nil
}

// notFoundError is a repository's not-found error that also matches
// errModelNotFound, without repeating "model not found" in the message.
type notFoundError struct{ error }

func (e notFoundError) Is(target error) bool { return target == errModelNotFound }
func (e notFoundError) Unwrap() error        { return e.error }
