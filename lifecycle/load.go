package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/scheduler"
)

// Action says what a Load did.
type Action int

const (
	// ActionLoaded: the model was not served and now is.
	ActionLoaded Action = iota + 1
	// ActionSwitched: another version replaced the one served.
	ActionSwitched
	// ActionReloaded: the served version's files changed on disk, and an
	// instance read from them replaced the one serving.
	ActionReloaded
	// ActionUnchanged: the version asked for is served from the files on disk
	// as they are: nothing was done.
	ActionUnchanged
)

func (a Action) String() string {
	switch a {
	case ActionLoaded:
		return "loaded"
	case ActionSwitched:
		return "switched"
	case ActionReloaded:
		return "reloaded"
	case ActionUnchanged:
		return "unchanged"
	}
	return "unknown"
}

// Load loads a version of a repository model (0: the highest loadable),
// places it and makes it serve name (in any of the forms Canonical takes). Asked for the version already
// serving, it compares the files' fingerprint: unchanged files are a
// no-op, changed ones are read again. A switch or reload never drops a
// request: the new instance's replicas join the scheduler first (admitted
// against what the devices have free while the old instance still holds
// its memory), the name switches to them, and the old instance's replicas
// go once the requests that entered its gate are done.
func (ms *Set) Load(ctx context.Context, name string, version int64) (*Served, Action, error) {
	name = ms.Canonical(name)
	if s := ms.Lookup(name); s != nil && s.Builtin() != nil {
		if version != 0 && version != s.Info.Version {
			return nil, 0, notFound("model %s version %d not found: it is built in, at version %d", name, version, s.Info.Version)
		}
		return s, ActionUnchanged, nil
	}
	if ms.repo == nil {
		return nil, 0, notFound("model %q not found: brokerd has no model repository (--model-repo)", name)
	}
	s, act, retired, err := ms.loadUnderLock(ctx, name, version)
	if retired != nil && awaitRetired(ctx, retired) != nil {
		ms.log.Info("the caller left before the instance replaced finished its requests: its replicas go when they are done",
			zap.String("model", name))
	}
	return s, act, err
}

// loadUnderLock is Load after any other load of name: it reads the files
// without mu and places the model under it; name's "loading" is cleared,
// and the loads waiting for this one go on, however it ends, a panic
// included.
func (ms *Set) loadUnderLock(ctx context.Context, name string, version int64) (*Served, Action, <-chan struct{}, error) {
	ms.mu.Lock()
	if err := ms.awaitLoadLocked(ctx, name); err != nil {
		ms.mu.Unlock()
		return nil, 0, nil, err
	}
	if ms.closed || ms.draining() {
		ms.mu.Unlock()
		return nil, 0, nil, fmt.Errorf("model %s: brokerd is stopping: %w", name, scheduler.ErrDraining)
	}
	done := make(chan struct{})
	ms.loads[name] = done
	ms.setPending(name, "loading")
	ms.mu.Unlock()
	defer func() {
		ms.mu.Lock()
		ms.setPending(name, "") // before the next load of name can set it
		delete(ms.loads, name)
		ms.mu.Unlock()
		close(done)
	}()
	s, act, retired, err := ms.load(ctx, name, version)
	ms.setLastErr(name, err)
	return s, act, retired, err
}

// awaitLoadLocked waits, without mu, until no load of name is under way
// (a load or an unload of a name comes after the load before it), or until
// ctx ends (its error). mu is held again when it returns.
func (ms *Set) awaitLoadLocked(ctx context.Context, name string) error {
	for {
		done, busy := ms.loads[name]
		if !busy {
			return nil
		}
		ms.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			ms.mu.Lock()
			return fmt.Errorf("model %s: waiting for its load under way: %w", name, ctx.Err())
		}
		ms.mu.Lock()
	}
}

// draining reports whether the scheduler stopped taking work (a Drain): a
// load would read a model's files and take memory on a daemon going away.
func (ms *Set) draining() bool {
	d, ok := ms.sched.(interface{ Draining() bool })
	return ok && d.Draining()
}

// unchangedLocked reports whether cur serves version of name (0: the
// highest loadable) from the files on disk as they are now.
func (ms *Set) unchangedLocked(cur *Served, name string, version int64) bool {
	if version == 0 {
		entries, err := ms.repo.List()
		if err != nil {
			return false
		}
		for _, e := range entries {
			if e.Name == name && len(e.Versions) > 0 {
				version = e.Versions[len(e.Versions)-1]
			}
		}
	}
	if version != cur.Info.Version || cur.fingerprint == "" {
		return false
	}
	fp, err := ms.repo.Fingerprint(name, version)
	return err == nil && fp == cur.fingerprint
}

// load is Load while it is name's load under way (ms.loads): the files are
// read without mu, the model placed under it. retired, when not nil,
// closes once the instance the new one replaced is gone (its requests
// done, its memory back): the caller waits for it without mu.
func (ms *Set) load(ctx context.Context, name string, version int64) (_ *Served, _ Action, retired <-chan struct{}, _ error) {
	ms.mu.Lock()
	cur := ms.Lookup(name)
	unchanged := cur != nil && ms.unchangedLocked(cur, name, version)
	ms.mu.Unlock()
	if unchanged {
		ms.log.Info("model unchanged: this version is served from these files already", zap.String("model", name), zap.Int64("version", cur.Info.Version))
		return cur, ActionUnchanged, nil, nil
	}
	l, err := ms.repo.Load(ctx, name, version)
	if errors.Is(err, ErrModelNotFound) {
		return nil, 0, nil, err // the repository's message names the model and says "not found"
	}
	if err != nil {
		return nil, 0, nil, fmt.Errorf("model %s: %w", name, err)
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.closed || ms.draining() {
		return nil, 0, nil, fmt.Errorf("model %s: brokerd is stopping: %w", name, scheduler.ErrDraining)
	}
	// What serves name now: an unload of it waits for this load, so it is
	// what served when the load began.
	cur = ms.Lookup(name)
	kind := ms.servableOf(name, l)
	info := kind.info()
	// The repository's name and version directory are the model's identity.
	info.Name, info.Version = name, l.Version
	act := ActionLoaded
	label := fmt.Sprintf("%s@%d", name, info.Version)
	key := label
	if cur != nil {
		act = ActionSwitched
		if cur.Info.Version == info.Version {
			if cur.fingerprint != "" && cur.fingerprint == l.Fingerprint {
				return cur, ActionUnchanged, nil, nil
			}
			// Both instances are in the scheduler while requests move
			// over: the new one queues under a key of its own.
			act = ActionReloaded
			ms.reloads++
			key = fmt.Sprintf("%s@%d.r%d", name, info.Version, ms.reloads)
		}
	}
	if ms.retiringKeyLocked(key) {
		// An unload of this version has not finished (its requests are
		// still running): the new instance queues beside it, as a reload.
		ms.reloads++
		key = fmt.Sprintf("%s@%d.r%d", name, info.Version, ms.reloads)
	}
	s := &Served{Info: info, Key: key, Label: label, kind: kind, fingerprint: l.Fingerprint, gate: newGate()}
	p, err := ms.placeLocked(ctx, s, ms.tiersLocked())
	if err == nil && len(s.replicas) == 0 {
		err = p.err(s)
	}
	if err == nil && ctx.Err() != nil {
		// The caller left during the placement: the devices whose start
		// it cancelled would be missing from what serves, for good (a
		// later load of the same files is unchanged).
		err = fmt.Errorf("model %s: the load was cancelled during its placement: %w", name, ctx.Err())
	}
	if err != nil {
		ms.removeReplicasLocked(context.WithoutCancel(ctx), s)
		return nil, 0, nil, err
	}
	ms.publishLocked(name, s)
	if cur != nil {
		ms.log.Info("model "+act.String(), zap.String("model", name), zap.Int64("from", cur.Info.Version), zap.Int64("to", info.Version),
			zap.String("queue", key))
		retired = ms.retireLocked(cur, "")
	}
	return s, act, retired, nil
}

// retiringKeyLocked says whether an instance out of service, still in the
// scheduler until its requests are done, queues under key.
func (ms *Set) retiringKeyLocked(key string) bool {
	for r := range ms.retiring {
		if r.Key == key {
			return true
		}
	}
	return false
}

// servableOf is the kind of model a repository load is.
func (ms *Set) servableOf(name string, l Loaded) servable {
	if l.LLM != nil {
		return llmServable{m: l.LLM, kv: ms.opts.KVCacheDType, spec: ms.opts.SpecTokens, specMaxRunning: ms.opts.SpecMaxRunning,
			log: ms.log.With(zap.String("model", name))}
	}
	return batchServable{m: l.Model, maxTokens: ms.maxTokens(l.Model.Info())}
}

// retireLocked takes s, out of service now, out of the scheduler once the
// requests that entered its gate are done, and returns its memory. It
// waits in a goroutine of its own, without mu, which every load and
// unload takes: a generation may stream for minutes. The channel closes
// when s is gone. pending, when set, is the state of s's name ("unloading")
// that lasts until then.
func (ms *Set) retireLocked(s *Served, pending string) <-chan struct{} {
	done := make(chan struct{})
	ms.retiring[s] = done
	go func() {
		<-s.gate.retire()
		ms.mu.Lock()
		defer ms.mu.Unlock()
		defer close(done)
		delete(ms.retiring, s)
		if pending != "" {
			ms.clearPending(s.Info.Name, pending)
		}
		if ms.closed {
			return // Close closed its replicas
		}
		ms.removeReplicasLocked(context.Background(), s)
	}()
	return done
}

// awaitRetired waits for a retirement, or for the caller to go (ctx's
// error): the retirement goes on without it.
func awaitRetired(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// removeReplicasLocked takes s's replicas out of the scheduler (whose
// RemoveReplica removes either kind), closes them and returns their memory
// to the devices' budgets.
func (ms *Set) removeReplicasLocked(ctx context.Context, s *Served) {
	for _, p := range s.replicas {
		if err := ms.sched.RemoveReplica(ctx, s.Key, p.deviceID); err != nil {
			ms.log.Warn("removing a Replica", zap.String("model", s.Key), zap.String("device", p.deviceID), zap.Error(err))
		}
		if err := p.r.Close(); err != nil {
			ms.log.Warn("closing a Replica", zap.String("model", s.Key), zap.String("device", p.deviceID), zap.Error(err))
		}
		ms.reserved[p.deviceID] -= p.bytes
	}
}

// Unload stops serving name at once (after a load of name under way), and
// frees its replicas once the work it accepted is done. It returns then,
// or when ctx ends first (its error): the unload goes on without its
// caller.
func (ms *Set) Unload(ctx context.Context, name string) (*Served, error) {
	name = ms.Canonical(name)
	ms.mu.Lock()
	if err := ms.awaitLoadLocked(ctx, name); err != nil {
		ms.mu.Unlock()
		return nil, err
	}
	s := ms.Lookup(name)
	if s == nil {
		ms.mu.Unlock()
		return nil, ms.Missing(name)
	}
	if s.Builtin() != nil {
		ms.mu.Unlock()
		return nil, fmt.Errorf("model %s is built in and always Served: %w", name, ErrBuiltinModel)
	}
	ms.setPending(name, "unloading")
	ms.publishLocked(name, nil)
	done := ms.retireLocked(s, "unloading")
	ms.mu.Unlock()
	if err := awaitRetired(ctx, done); err != nil {
		return s, fmt.Errorf("model %s no longer serves; its replicas go once its requests are done: %w", name, err)
	}
	ms.log.Info("model unloaded", zap.String("model", name), zap.Int64("version", s.Info.Version))
	return s, nil
}

// LoadAtStart loads the models of --load-models: names, or "all" of the
// repository. Named models must load; with "all" a model that cannot load
// is logged and skipped.
func (ms *Set) LoadAtStart(ctx context.Context, spec string) error {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil
	}
	if spec == "all" {
		if ms.repo == nil {
			return nil
		}
		entries, err := ms.repo.List()
		if err != nil {
			return fmt.Errorf("load-models: listing the repository: %w", err)
		}
		for _, e := range entries {
			if _, _, err := ms.Load(ctx, e.Name, 0); err != nil {
				ms.log.Warn("model not loaded at start", zap.String("model", e.Name), zap.Error(err))
			}
		}
		return nil
	}
	for _, name := range strings.Split(spec, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		if _, _, err := ms.Load(ctx, name, 0); err != nil {
			return fmt.Errorf("load-models: %w", err)
		}
	}
	return nil
}
