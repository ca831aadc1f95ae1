package lifecycle

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"strings"
)

// nameTable maps each served name to what serves it. It is immutable,
// swapped atomically so the request path never takes a lock (Catalog is the
// listings' snapshot, which includes it).
type nameTable struct {
	byName map[string]*Served
}

// Catalog is a snapshot of what is served, what the repository holds and
// the loads in progress, for listings.
type Catalog struct {
	Served  map[string]*Served // by name
	Repo    []RepoEntry        // nil without a repository
	Pending map[string]string  // name → "loading" or "unloading"
	LastErr map[string]string  // name → why its last load failed
}

// Catalog returns the current snapshot.
func (ms *Set) Catalog() (Catalog, error) {
	var c Catalog
	if ms.repo != nil {
		var err error
		if c.Repo, err = ms.repo.List(); err != nil {
			return c, err
		}
	}
	ms.stMu.Lock()
	c.Pending, c.LastErr = maps.Clone(ms.pending), maps.Clone(ms.lastErr)
	ms.stMu.Unlock()
	c.Served = ms.table.Load().byName // immutable once published
	return c, nil
}

// publishLocked makes s serve name (nil: name is Served no more).
func (ms *Set) publishLocked(name string, s *Served) {
	old := ms.table.Load()
	next := &nameTable{byName: make(map[string]*Served, len(old.byName)+1)}
	for k, v := range old.byName {
		next.byName[k] = v
	}
	if s == nil {
		delete(next.byName, name)
	} else {
		next.byName[name] = s
	}
	ms.table.Store(next)
}

// Builtin returns the built-in encoder Encode serves under name.
func (ms *Set) Builtin(name string) (Encoder, bool) {
	s := ms.table.Load().byName[name]
	if s == nil || s.Builtin() == nil {
		return nil, false
	}
	return s.Builtin(), true
}

// Lookup returns what serves name, without entering its gate.
func (ms *Set) Lookup(name string) *Served {
	return ms.table.Load().byName[name]
}

// LookupLabel returns the version whose Label (NAME@VERSION, as Stats rows
// and the metrics name it) is label, while it serves.
func (ms *Set) LookupLabel(label string) *Served {
	for _, s := range ms.table.Load().byName {
		if s.Label == label {
			return s
		}
	}
	return nil
}

// Names lists the Served names for error messages.
func (ms *Set) Names() string {
	var n []string
	for k := range ms.table.Load().byName {
		n = append(n, k)
	}
	sort.Strings(n)
	return strings.Join(n, ", ")
}

// Acquire returns the version serving name (version 0: whichever does) with
// its gate entered; the caller calls release when its work is done.
func (ms *Set) Acquire(name string, version int64) (*Served, error) {
	aliased := false
	for {
		s := ms.table.Load().byName[name]
		if s == nil {
			if c := ms.Canonical(name); c != name && !aliased {
				name, aliased = c, true // an Ollama store model by another of its names
				continue
			}
			if version != 0 {
				return nil, ms.versionMissing(name, version, 0)
			}
			return nil, ms.Missing(name)
		}
		if version != 0 && version != s.Info.Version {
			return nil, ms.versionMissing(name, version, s.Info.Version)
		}
		if s.gate.enter() {
			return s, nil
		}
		// A reload or unload retired s after it was looked up; the table
		// already shows what replaced it.
	}
}

// Release ends a request's hold on s (Acquire's).
func (ms *Set) Release(s *Served) { s.gate.leave() }

func (ms *Set) setPending(name, state string) {
	ms.stMu.Lock()
	defer ms.stMu.Unlock()
	if state == "" {
		delete(ms.pending, name)
	} else {
		ms.pending[name] = state
	}
}

// listed reports whether the repository lists name.
func (ms *Set) listed(name string) bool {
	if ms.repo == nil {
		return false
	}
	entries, err := ms.repo.List()
	return err == nil && slices.ContainsFunc(entries, func(e RepoEntry) bool { return e.Name == name })
}

// clearPending ends name's state if it is still state (a load of the name
// may have begun since).
func (ms *Set) clearPending(name, state string) {
	ms.stMu.Lock()
	defer ms.stMu.Unlock()
	if ms.pending[name] == state {
		delete(ms.pending, name)
	}
}

// setLastErr keeps why name's last load failed, for ListModels (which
// shows it for the repository's names). A name the repository does not
// list, a version it lacks and a caller that left say nothing of a model's
// files and are not kept: otherwise every name a client tries would stay
// for good.
func (ms *Set) setLastErr(name string, err error) {
	if err != nil && !ms.listed(name) {
		err = nil
	}
	ms.stMu.Lock()
	defer ms.stMu.Unlock()
	if err == nil || errors.Is(err, ErrModelNotFound) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		delete(ms.lastErr, name)
	} else {
		ms.lastErr[name] = err.Error()
	}
}
