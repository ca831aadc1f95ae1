package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
	"github.com/brokerd/brokerd/scheduler"
)

// mlpRepository is a repository holding the MLPs named, version 1 each.
func mlpRepository(t *testing.T, names ...string) Repository {
	t.Helper()
	dir := t.TempDir()
	for i, n := range names {
		writeMLP(t, dir, n, 1, uint64(i+1), 4, 6, 2)
	}
	repo, err := OpenRepository(dir, false, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

// holdRequest enters name's gate as a request does; release (once) leaves.
func holdRequest(t *testing.T, ms *Set, name string) (release func()) {
	t.Helper()
	sv, err := ms.Acquire(name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return sync.OnceFunc(func() { ms.Release(sv) })
}

// concurrencySet is a Set over one oneDNN CPU device and a repository holding
// the MLPs named (version 1 each), every one loaded.
func concurrencySet(t *testing.T, names ...string) *Set {
	t.Helper()
	return setOver(t, mlpRepository(t, names...), names...)
}

// setOver is a Set over one oneDNN CPU device and repo, with the models
// named loaded.
func setOver(t *testing.T, repo Repository, names ...string) *Set {
	t.Helper()
	sched := scheduler.New(scheduler.Options{})
	t.Cleanup(sched.Close)
	cpu := detect.Entry{Device: detect.Device{ID: "cpu:0", Type: detect.TypeCPU, Runtime: onednn.Name}}
	ms := openDevices(t.Context(), []detect.Entry{cpu}, sched, repo, Options{
		Adapters: map[string]runtime.Adapter{onednn.Name: onednn.New(onednn.Options{})}, Factors: detect.DefaultFactors(),
	}, zap.NewNop())
	t.Cleanup(func() { ms.Close() })
	for _, n := range names {
		if _, _, err := ms.Load(t.Context(), n, 0); err != nil {
			t.Fatalf("Load %s: %v", n, err)
		}
	}
	return ms
}

func pendingOf(ms *Set, name string) string {
	ms.stMu.Lock()
	defer ms.stMu.Unlock()
	return ms.pending[name]
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUnloadWaitsWithoutTheLock: an unload waits for the requests in the
// model's gate (a Generate stream holds it for the whole call, minutes for
// a long generation) without Set.mu, so an unload of another model goes
// through meanwhile, and its caller may leave: the unload goes on.
func TestUnloadWaitsWithoutTheLock(t *testing.T) {
	ms := concurrencySet(t, "a", "b")
	release := holdRequest(t, ms, "a") // a request in flight on a (a streaming Generate holds it so)
	defer release()

	ctx, cancel := context.WithCancel(context.Background())
	unloadA := make(chan error, 1)
	go func() { _, err := ms.Unload(ctx, "a"); unloadA <- err }()
	waitUntil(t, "a unloading", func() bool { return pendingOf(ms, "a") == "unloading" })

	// Another model's admin call does not depend on a's requests.
	unloadB := make(chan error, 1)
	go func() { _, err := ms.Unload(context.Background(), "b"); unloadB <- err }()
	select {
	case err := <-unloadB:
		if err != nil {
			t.Errorf("Unload b: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("Unload of b is blocked behind the unload of a, which waits for a's requests")
	}

	// The caller of a's unload goes: its call should end.
	cancel()
	select {
	case err := <-unloadA:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Unload a after its context ended: %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("Unload of a ignores its context: it still waits for a's requests after its caller went")
	}
	release()
	// Once a's request leaves everything goes through.
	waitUntil(t, "the unloads to end", func() bool { return pendingOf(ms, "a") == "" && pendingOf(ms, "b") == "" })
}

// TestFailedNamesNotKept: a failed load of a name the repository does not
// list (or an invalid one: huge, with separators) is not kept in lastErr,
// which ListModels shows only for the repository's names: a client trying
// fresh names would otherwise grow the daemon's memory without bound.
func TestFailedNamesNotKept(t *testing.T) {
	ms := concurrencySet(t, "a")
	const n = 500
	for i := range n {
		name := fmt.Sprintf("no-such-model-%d/%0200d", i, i)
		if _, _, err := ms.Load(t.Context(), name, 0); err == nil {
			t.Fatalf("Load %q succeeded", name)
		}
	}
	ms.stMu.Lock()
	kept := len(ms.lastErr)
	bytes := 0
	for k, v := range ms.lastErr {
		bytes += len(k) + len(v)
	}
	ms.stMu.Unlock()
	entries, _ := ms.repo.List()
	if kept > len(entries) {
		t.Errorf("%d failed names (%d bytes) kept in lastErr after %d failed loads of names the repository does not hold (it holds %d models)",
			kept, bytes, n, len(entries))
	}
}

// TestListingsDuringLoads: listings (Catalog, a Served's devices and
// memory, the scheduler's Stats) read while models load, switch, reload
// and unload; run with -race.
func TestListingsDuringLoads(t *testing.T) {
	ms := concurrencySet(t, "a", "b")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c, err := ms.Catalog()
			if err != nil {
				t.Error(err)
				return
			}
			for _, sv := range c.Served {
				_ = sv.DeviceIDs()
				_ = sv.MemoryBytes()
				_ = sv.ReplicaInfos()
			}
			if sv, err := ms.Acquire("a", 0); err == nil {
				ms.Release(sv)
			}
			_ = ms.LookupLabel("a@1")
			_ = ms.sched.(*scheduler.Scheduler).Stats("")
		}
	}()
	for range 20 {
		if _, err := ms.Unload(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := ms.Load(t.Context(), "a", 0); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var want int64
	for _, sv := range ms.table.Load().byName {
		want += sv.MemoryBytes()
	}
	if got := ms.reserved["cpu:0"]; got != want {
		t.Errorf("reserved %d bytes, the served models hold %d", got, want)
	}
}

// TestLoadForAGoneCaller: a LoadModel whose caller has already gone
// (its context ended while it queued on Set.mu behind another load or an
// unload) should not load the model.
func TestLoadForAGoneCaller(t *testing.T) {
	ms := concurrencySet(t, "a", "b")
	if _, err := ms.Unload(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sv, act, err := ms.Load(ctx, "b", 0)
	if err == nil {
		t.Errorf("Load with its context ended: %v, %d replicas; the model now serves for a caller that is gone", act, sv.Replicas())
	}
}

// TestReloadFilesVanished: the served version's files are removed,
// then it is loaded again: NOT_FOUND, and the loaded instance keeps
// serving, its memory still accounted; an unload then frees it.
func TestReloadFilesVanished(t *testing.T) {
	ms := concurrencySet(t, "a")
	before := ms.Lookup("a")
	dir := ms.repo.(repository).r.Dir()
	if err := os.RemoveAll(filepath.Join(dir, "a", "1")); err != nil {
		t.Fatal(err)
	}
	for _, v := range []int64{0, 1} {
		_, _, err := ms.Load(t.Context(), "a", v)
		if !errors.Is(err, ErrModelNotFound) {
			t.Errorf("Load a version %d after its files went: %v, want not found", v, err)
		}
		if ms.Lookup("a") != before {
			t.Fatalf("a no longer served by its instance after a failed load")
		}
	}
	if sv, err := ms.Acquire("a", 0); err != nil {
		t.Fatal(err)
	} else {
		ms.Release(sv)
	}
	if _, err := ms.Unload(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if r := ms.reserved["cpu:0"]; r != 0 {
		t.Errorf("%d bytes reserved after the unload", r)
	}
}

// TestReloadWaitsWithoutTheLock: a hot reload (the served version's files
// changed) publishes the new instance, then waits for the old one's
// requests without Set.mu and only while its caller stays: an unload of
// another model goes through meanwhile.
func TestReloadWaitsWithoutTheLock(t *testing.T) {
	ms := concurrencySet(t, "a", "b")
	old := ms.Lookup("a")
	release := holdRequest(t, ms, "a") // a request in flight on a (a streaming Generate holds it so)
	defer release()
	writeMLP(t, ms.repo.(repository).r.Dir(), "a", 1, 99, 4, 6, 2) // new weights: a reload
	ctx, cancel := context.WithCancel(context.Background())
	loaded := make(chan error, 1)
	go func() {
		_, act, err := ms.Load(ctx, "a", 0)
		if err == nil && act != ActionReloaded {
			err = fmt.Errorf("action %v, want reloaded", act)
		}
		loaded <- err
	}()
	waitUntil(t, "the new instance to serve", func() bool { return ms.Lookup("a") != old })
	unloadB := make(chan error, 1)
	go func() { _, err := ms.Unload(context.Background(), "b"); unloadB <- err }()
	select {
	case err := <-unloadB:
		if err != nil {
			t.Errorf("Unload b: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("Unload of b is blocked behind a's reload, which waits for the old instance's requests")
	}
	cancel()
	select {
	case err := <-loaded:
		if err != nil {
			t.Errorf("reload after its caller left: %v, want its success (the new instance serves)", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("the reload's LoadModel ignores its context: the new instance serves, yet the call waits for the old one's requests")
		release()
		if err := <-loaded; err != nil {
			t.Log(err)
		}
	}
}

// TestLoadBuiltinOtherVersion: a load of the built-in encoder at a version
// it does not have is not found, as any other model's missing version.
func TestLoadBuiltinOtherVersion(t *testing.T) {
	dir := t.TempDir()
	repo, err := OpenRepository(dir, false, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	sched := scheduler.New(scheduler.Options{})
	defer sched.Close()
	cpu := detect.Entry{Device: detect.Device{ID: "cpu:0", Type: detect.TypeCPU, Runtime: onednn.Name}}
	ms, err := Open(t.Context(), []detect.Entry{cpu}, []Encoder{NewHashEncoder()}, sched, repo, Options{
		Adapters: map[string]runtime.Adapter{onednn.Name: onednn.New(onednn.Options{})}, Factors: detect.DefaultFactors(),
	}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	name := NewHashEncoder().Name()
	sv, act, err := ms.Load(t.Context(), name, 7)
	if err == nil {
		t.Errorf("Load %s version 7: %v, version %d served; want not found", name, act, sv.Info.Version)
	}
}

// gatedRepository is a Repository whose loads of one name wait, after
// signalling entered, until open is closed (or their context ends).
type gatedRepository struct {
	Repository
	name    string
	entered chan struct{}
	open    chan struct{}
}

func (g gatedRepository) Load(ctx context.Context, name string, version int64) (Loaded, error) {
	if name == g.name {
		g.entered <- struct{}{}
		select {
		case <-g.open:
		case <-ctx.Done():
			return Loaded{}, ctx.Err()
		}
	}
	return g.Repository.Load(ctx, name, version)
}

// TestLoadReadsWithoutTheLock: a load reads its files without Set.mu (a
// model of gigabytes takes minutes to verify and read), so other models'
// unloads and loads go through meanwhile; an unload of the model loading
// waits for its load and then unloads it, and a second load of it waits
// for the first.
func TestLoadReadsWithoutTheLock(t *testing.T) {
	g := gatedRepository{Repository: mlpRepository(t, "a", "b", "slow"), name: "slow", entered: make(chan struct{}, 2), open: make(chan struct{})}
	ms := setOver(t, g, "a", "b")
	loads := make(chan error, 2)
	load := func() {
		_, _, err := ms.Load(context.Background(), "slow", 0)
		loads <- err
	}
	go load()
	<-g.entered
	go load() // waits for the first: it does not enter the repository yet

	// Other models' admin calls go through while slow's files are read.
	done := make(chan error, 1)
	go func() {
		if _, err := ms.Unload(context.Background(), "b"); err != nil {
			done <- fmt.Errorf("Unload b: %w", err)
			return
		}
		if _, _, err := ms.Load(context.Background(), "b", 0); err != nil {
			done <- fmt.Errorf("Load b again: %w", err)
			return
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("an unload and a load of b are blocked behind the load of slow reading its files")
	}
	if pendingOf(ms, "slow") != "loading" {
		t.Errorf("slow is %q while its files are read, want loading", pendingOf(ms, "slow"))
	}
	unloaded := make(chan error, 1)
	go func() { _, err := ms.Unload(context.Background(), "slow"); unloaded <- err }()

	close(g.open)
	for range 2 {
		if err := <-loads; err != nil {
			t.Errorf("Load slow: %v", err)
		}
	}
	// The unload waited for the first load: it found slow served (the
	// second load may come before or after it).
	if err := <-unloaded; err != nil {
		t.Errorf("Unload slow, begun while it loaded: %v", err)
	}
}

// TestLoadWhileUnloadWaits: a load of a model whose unload still waits for
// its requests serves a new instance beside the one going (it queued under
// the same key, which the scheduler refused: "already served").
func TestLoadWhileUnloadWaits(t *testing.T) {
	ms := concurrencySet(t, "a")
	release := holdRequest(t, ms, "a")
	defer release()
	unloaded := make(chan error, 1)
	go func() { _, err := ms.Unload(context.Background(), "a"); unloaded <- err }()
	waitUntil(t, "a unloading", func() bool { return pendingOf(ms, "a") == "unloading" })
	s, act, err := ms.Load(context.Background(), "a", 0)
	if err != nil {
		t.Fatalf("Load a while its unload waits for a request: %v", err)
	}
	if act != ActionLoaded || s.Key == "a@1" {
		t.Errorf("loaded %v under key %q, want loaded under a key of its own", act, s.Key)
	}
	release()
	if err := <-unloaded; err != nil {
		t.Errorf("Unload a: %v", err)
	}
	if ms.Lookup("a") != s {
		t.Error("the new instance does not serve a after the old one went")
	}
}
