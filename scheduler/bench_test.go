package scheduler

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// echoExec returns its inputs: a device that costs nothing, so the
// benchmark measures the scheduler alone.
type echoExec struct{}

func (echoExec) Execute(_ context.Context, in []any) ([]any, error) { return in, nil }

// BenchmarkSubmitOverhead is the scheduler's own cost per request: 64
// goroutines submitting single-item requests through one replica of max
// batch 8 that does no work (wall time per request on this machine; compare
// it with a gRPC round trip, tens of microseconds).
func BenchmarkSubmitOverhead(b *testing.B) {
	const clients = 64
	run := func(b *testing.B, call func(ctx context.Context, i int) error) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(b.N) {
					if err := call(context.Background(), c); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	s := New(Options{})
	defer s.Close()
	if err := s.AddReplica("m", Device{ID: "cpu:0", Type: "cpu"}, 8, echoExec{}); err != nil {
		b.Fatal(err)
	}
	scheduled := func(ctx context.Context, c int) error {
		_, err := s.Submit(ctx, Request{Model: "m", Client: "c", Inputs: []any{c}})
		return err
	}
	b.ResetTimer()
	ts := run(b, scheduled)
	b.ReportMetric(float64(ts)/float64(b.N)/1000, "µs/request")
}
