package lifecycle

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/brokerd/brokerd/detect"
	"github.com/brokerd/brokerd/runtime"
	"github.com/brokerd/brokerd/runtime/models"
	"github.com/brokerd/brokerd/runtime/onednn"
	"github.com/brokerd/brokerd/scheduler"
)

// pipeAdapter opens oneDNN CPU devices wrapped as pipeDevices, standing in
// for a PJRT device (which says MaxInFlight 2) without a plugin.
type pipeAdapter struct {
	inFlight int
	hold     chan struct{}
	entered  chan struct{}
	armed    atomic.Bool // Runs before it (the load's warm-up) pass
}

func (a *pipeAdapter) Name() string { return "pipe" }

func (a *pipeAdapter) Open(ctx context.Context, spec runtime.DeviceSpec) (runtime.Device, error) {
	d, err := onednn.New(onednn.Options{}).Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &pipeDevice{Device: d, a: a}, nil
}

// pipeDevice holds every Run once a.armed until a.hold closes, after
// saying so on a.entered.
type pipeDevice struct {
	runtime.Device
	a *pipeAdapter
}

func (d *pipeDevice) MaxInFlight() int { return d.a.inFlight }

func (d *pipeDevice) Run(ctx context.Context, g *runtime.Graph, bind map[string]runtime.Buffer) error {
	if !d.a.armed.Load() {
		return d.Device.Run(ctx, g, bind)
	}
	d.a.entered <- struct{}{}
	<-d.a.hold
	return d.Device.Run(ctx, g, bind)
}

// TestPipelinedDevice: a repository model on a device that overlaps batches
// gets that many batches running at once; elsewhere one, as before.
func TestPipelinedDevice(t *testing.T) {
	tests := []struct {
		name     string
		inFlight int
		want     int
	}{
		{"pipelined device", 2, 2},
		{"plain device", 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repoDir := t.TempDir()
			ref := writeMLP(t, repoDir, "mlp", 1, 5, 6, 8, 3)
			repo, err := OpenRepository(repoDir, false, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			sched := scheduler.New(scheduler.Options{})
			defer sched.Close()
			ad := &pipeAdapter{inFlight: tt.inFlight, hold: make(chan struct{}), entered: make(chan struct{}, 16)}
			cpu := detect.Entry{Device: detect.Device{ID: "cpu:0", Type: detect.TypeCPU, Runtime: "pipe"}}
			ms := openDevices(t.Context(), []detect.Entry{cpu}, sched, repo, Options{
				Adapters: map[string]runtime.Adapter{"pipe": ad}, Factors: detect.DefaultFactors(),
				MaxBatch: 1, // one item per batch: each request is a batch
			}, zap.NewNop())
			defer ms.Close()
			if len(ms.devices) != 1 || ms.devices[0].inFlight != tt.inFlight {
				t.Fatalf("opened %d devices, in flight %v; want 1 with %d", len(ms.devices), ms.devices, tt.inFlight)
			}
			sv, _, err := ms.Load(t.Context(), "mlp", 0)
			if err != nil {
				t.Fatal(err)
			}
			ad.armed.Store(true)
			type res struct {
				resp scheduler.Response
				err  error
			}
			rows := [][]float32{{1, 2, 3, 4, 5, 6}, {0, 1, 0, 1, 0, 1}, {-1, 0.5, 2, 0, 3, -2}}
			done := make([]chan res, len(rows))
			for i, row := range rows {
				done[i] = make(chan res, 1)
				go func() {
					resp, err := sched.Submit(context.Background(), scheduler.Request{Model: sv.Key, Inputs: []any{models.RowInput{Values: row}}})
					done[i] <- res{resp, err}
				}()
			}
			for range tt.want {
				select {
				case <-ad.entered:
				case <-time.After(5 * time.Second):
					t.Fatal("a batch did not start")
				}
			}
			select {
			case <-ad.entered:
				t.Fatalf("more than %d batches running at once", tt.want)
			case <-time.After(50 * time.Millisecond):
			}
			close(ad.hold)
			for i, row := range rows {
				r := <-done[i]
				if r.err != nil {
					t.Fatal(r.err)
				}
				got, want := r.resp.Outputs[0].(models.Output).Values, ref.forward(row)
				if len(got) != len(want) {
					t.Fatalf("row %d: %d values, want %d", i, len(got), len(want))
				}
				for j := range got {
					if d := math.Abs(float64(got[j]) - want[j]); d > 1e-4*(1+math.Abs(want[j])) {
						t.Errorf("row %d value %d = %g, want %g", i, j, got[j], want[j])
					}
				}
			}
		})
	}
}
