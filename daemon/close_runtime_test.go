package daemon

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/lifecycle"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/onednn"
	"github.com/brokerd/brokerd/scheduler"
)

// stuckDevice is a oneDNN device whose Runs, once armed, block until hold
// closes (a device call stuck in C, deaf to its context). It counts the
// Free and Close calls that come while a Run is in flight.
type stuckDevice struct {
	runtime.Device
	inRun    atomic.Int32
	entered  chan struct{}
	hold     chan struct{}
	armed    atomic.Bool
	underRun atomic.Int32
}

func (d *stuckDevice) Run(ctx context.Context, g *runtime.Graph, bind map[string]runtime.Buffer) error {
	d.inRun.Add(1)
	defer d.inRun.Add(-1)
	if d.armed.Load() {
		d.entered <- struct{}{}
		<-d.hold
	}
	return d.Device.Run(ctx, g, bind)
}

func (d *stuckDevice) Free(b runtime.Buffer) {
	if d.inRun.Load() > 0 {
		d.underRun.Add(1)
	}
	d.Device.Free(b)
}

func (d *stuckDevice) Close() error {
	if d.inRun.Load() > 0 {
		d.underRun.Add(1)
	}
	return d.Device.Close()
}

// stuckAdapter opens the one stuckDevice over oneDNN.
type stuckAdapter struct{ dev *stuckDevice }

func (a *stuckAdapter) Name() string { return "stuck" }
func (a *stuckAdapter) Open(ctx context.Context, spec runtime.DeviceSpec) (runtime.Device, error) {
	d, err := onednn.New(onednn.Options{}).Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	a.dev.Device = d
	return a.dev, nil
}

// TestCloseRuntimeWithStuckDeviceCall: when the shutdown grace ends with a
// device call still running, Run's close (closeRuntime, with the real
// scheduler and model set) returns: it closes the scheduler first and
// leaves the models open. Closing them first, as Run once did, blocked
// for as long as the call was stuck (a replica's close takes the lock its
// running Execute holds), so brokerd never exited; unlocked, it would
// have freed the buffers under the call.
func TestCloseRuntimeWithStuckDeviceCall(t *testing.T) {
	dir := t.TempDir()
	writeMLP(t, dir, "mlp", 1, 1, 4, 6, 2)
	repo, err := lifecycle.OpenRepository(dir, false, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	sched := scheduler.New(scheduler.Options{})
	dev := &stuckDevice{entered: make(chan struct{}, 4), hold: make(chan struct{})}
	cpu := detect.Entry{Device: detect.Device{ID: "cpu:0", Type: detect.TypeCPU, Runtime: "stuck"}}
	ms, err := lifecycle.Open(t.Context(), []detect.Entry{cpu}, nil, sched, repo, lifecycle.Options{
		Adapters: map[string]runtime.Adapter{"stuck": &stuckAdapter{dev: dev}}, Factors: detect.DefaultFactors(),
	}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	sv, _, err := ms.Load(t.Context(), "mlp", 0)
	if err != nil {
		t.Fatal(err)
	}
	dev.armed.Store(true)
	go func() {
		_, _ = sched.Submit(context.Background(), scheduler.Request{Model: sv.Key, Inputs: []any{models.RowInput{Values: make([]float32, 4)}}})
	}()
	select {
	case <-dev.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the batch never reached the device")
	}
	// Run's stop: the grace ends with the call running, then its close.
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sched.Drain(expired); err == nil {
		t.Fatal("drain completed with a device call running (the test's premise)")
	}
	closed := make(chan struct{})
	go func() {
		closeRuntime(sched, ms, time.Millisecond, zap.NewNop())
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Error("Run's close blocks while a device call is stuck: brokerd would never exit")
	}
	if n := dev.underRun.Load(); n > 0 {
		t.Errorf("%d buffers/devices freed or closed while a device call was still running on them", n)
	}
	// The stuck call is left stuck: released, it would run on freed
	// memory were the models closed after all.
}

// blockingCloser is a model set whose Close waits for release (a load in
// progress holding the lifecycle lock); it says when Close was called.
type blockingCloser struct {
	called  chan struct{}
	release chan struct{}
}

func (b *blockingCloser) Close() error {
	close(b.called)
	<-b.release
	return nil
}

// doneScheduler is a scheduler whose device calls have all returned; it
// records whether it was closed before the models.
type doneScheduler struct{ closed atomic.Bool }

func (s *doneScheduler) CloseWithin(time.Duration) bool { s.closed.Store(true); return true }

// TestCloseRuntimeBoundsModelsClose: the models close after the scheduler,
// and a Close held up (a load in progress) does not hold up the exit.
func TestCloseRuntimeBoundsModelsClose(t *testing.T) {
	sched := &doneScheduler{}
	mc := &blockingCloser{called: make(chan struct{}), release: make(chan struct{})}
	defer close(mc.release)
	closed := make(chan struct{})
	go func() {
		closeRuntime(sched, mc, 10*time.Millisecond, zap.NewNop())
		close(closed)
	}()
	select {
	case <-mc.called:
		if !sched.closed.Load() {
			t.Error("the models were closed before the scheduler")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the models were never closed")
	}
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Error("closeRuntime waits for a models.Close that is held up")
	}
}
