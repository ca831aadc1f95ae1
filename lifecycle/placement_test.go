package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/onednn"
	"github.com/brokerd/brokerd/scheduler"
)

// TestPanicInStartIsAFailure: a panic starting a device's replica (a bug a
// model file may reach) is that device's failure: the lifecycle's lock is
// released, the name is not left "loading", nothing the load placed stays
// in the scheduler or reserved, and another model loads.
func TestPanicInStartIsAFailure(t *testing.T) {
	ad := &hookAdapter{onRun: map[string]func(context.Context){}}
	ms, sched := twoCPUSet(t, ad, "boom", "other")
	// No ms.Close in Cleanup: with the defect it blocks for ever.
	ad.set("cpu:1", func(context.Context) { panic("bug in a device's warm-up") })

	if _, _, err := ms.Load(t.Context(), "boom", 0); err == nil || !strings.Contains(err.Error(), "panicked") {
		// One device's replica started: cpu:0's; the load may serve on it
		// alone, or fail. Either way nothing below may leak.
		if err != nil {
			t.Errorf("Load: %v, want the panic named", err)
		}
	}
	if s := ms.Lookup("boom"); s != nil {
		if _, err := ms.Unload(t.Context(), "boom"); err != nil {
			t.Fatal(err)
		}
	}

	// 1. What the failed load placed was rolled back.
	if p := pendingOf(ms, "boom"); p != "" {
		t.Errorf("the name stays %q after the load failed", p)
	}
	if rows := sched.Stats("boom@1"); len(rows) > 0 {
		t.Errorf("the unpublished instance's queue stays in the scheduler with %d rows (its replica on cpu:0 runs nothing, for good)", len(rows))
	}
	// 2. The Set's lock is not held by the goroutine that panicked. (Not
	// TryLock: the load's own goroutines may hold it a moment longer.)
	locked := make(chan struct{})
	go func() { ms.mu.Lock(); close(locked) }()
	select {
	case <-locked:
		ms.mu.Unlock()
	case <-time.After(30 * time.Second):
		t.Fatal("Set.mu is still locked after a panic in placement: every later load, unload and Set.Close (daemon shutdown) blocks for ever")
	}
	// 3. Another model's load goes through.
	done := make(chan error, 1)
	go func() { _, _, err := ms.Load(context.Background(), "other", 0); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Load of another model after the panic: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Load of another model hangs after a panic in an earlier load's placement")
	}
	// 4. The memory the panicked load reserved is back.
	reserved := map[string]int64{}
	ms.mu.Lock()
	for k, v := range ms.reserved {
		reserved[k] = v
	}
	ms.mu.Unlock()
	if o := ms.Lookup("other"); o != nil {
		for _, p := range o.replicas {
			reserved[p.deviceID] -= p.bytes
		}
	}
	for id, b := range reserved {
		if b != 0 {
			t.Errorf("%s keeps %d bytes reserved for the replica of the load that panicked", id, b)
		}
	}
}

// TestCancelledLoadNotKeptPartial: a load whose caller leaves while the
// second device's replica starts is rolled back, not published on half its
// devices (a later load of the same version would be unchanged, keeping
// the model there until an unload).
func TestCancelledLoadNotKeptPartial(t *testing.T) {
	ad := &hookAdapter{onRun: map[string]func(context.Context){}}
	ms, _ := twoCPUSet(t, ad, "mlp")
	t.Cleanup(func() { ms.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ad.set("cpu:1", func(context.Context) { cancel() }) // the caller leaves during cpu:1's warm-up

	sv, _, err := ms.Load(ctx, "mlp", 0)
	ad.set("cpu:1", nil)
	if err == nil && sv != nil && sv.Replicas() < 2 {
		t.Errorf("a load whose caller left mid-placement returned success with %d of 2 replicas (devices %v)", sv.Replicas(), sv.DeviceIDs())
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled load: %v, want context.Canceled", err)
	}
	sv2, act, err2 := ms.Load(context.Background(), "mlp", 0)
	if err2 != nil {
		t.Fatal(err2)
	}
	if sv2.Replicas() < 2 {
		t.Errorf("a later load of the same version (action %v) keeps %d of 2 replicas (devices %v): the partial placement stays until an unload",
			act, sv2.Replicas(), sv2.DeviceIDs())
	}
}

// hookAdapter opens oneDNN CPU devices wrapped so that a test can act on a
// given device's Run (the load's warm-up runs there): panic, or call hook.
type hookAdapter struct {
	mu       sync.Mutex
	onRun    map[string]func(ctx context.Context) // device ID → what its Run does first
	closed   atomic.Int32                         // replicas' devices closed (Set.Close)
	runCalls atomic.Int32
}

func (a *hookAdapter) Name() string { return "hook" }

func (a *hookAdapter) Open(ctx context.Context, spec runtime.DeviceSpec) (runtime.Device, error) {
	d, err := onednn.New(onednn.Options{}).Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &hookDevice{Device: d, a: a}, nil
}

func (a *hookAdapter) set(id string, f func(ctx context.Context)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.onRun[id] = f
}

type hookDevice struct {
	runtime.Device
	a *hookAdapter
}

func (d *hookDevice) Run(ctx context.Context, g *runtime.Graph, bind map[string]runtime.Buffer) error {
	d.a.runCalls.Add(1)
	d.a.mu.Lock()
	f := d.a.onRun[d.ID()]
	d.a.mu.Unlock()
	if f != nil {
		f(ctx)
	}
	return d.Device.Run(ctx, g, bind)
}

// twoCPUSet is a Set over two CPU devices (standing in for two GPUs of one
// tier) and a repository holding the MLPs named, none loaded.
func twoCPUSet(t *testing.T, ad *hookAdapter, names ...string) (*Set, *scheduler.Scheduler) {
	t.Helper()
	repo := mlpRepository(t, names...)
	sched := scheduler.New(scheduler.Options{})
	t.Cleanup(sched.Close)
	var entries []detect.Entry
	for i := range 2 {
		entries = append(entries, detect.Entry{Device: detect.Device{ID: fmt.Sprintf("cpu:%d", i), Type: detect.TypeCPU, Runtime: "hook"}})
	}
	ms := openDevices(t.Context(), entries, sched, repo, Options{
		Adapters: map[string]runtime.Adapter{"hook": ad}, Factors: detect.DefaultFactors(),
	}, zap.NewNop())
	if len(ms.devices) != 2 {
		t.Fatalf("opened %d devices, want 2", len(ms.devices))
	}
	return ms, sched
}
