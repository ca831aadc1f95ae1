package server

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// TestByteBudget: calls hold their bytes until they answer; beyond the
// budget they are refused at once with a retry hint, one larger than the
// whole budget is INVALID_ARGUMENT, and every accepted call completes.
// (120 clients of 48 MB requests once pushed brokerd past its memory
// limit and it was killed.)
func TestByteBudget(t *testing.T) {
	b := newByteBudget(10<<20, prometheus.NewRegistry())
	intercept := b.unary()
	gate := make(chan struct{})
	var entered sync.WaitGroup
	handler := func(ctx context.Context, req any) (any, error) {
		entered.Done()
		<-gate
		return "ok", nil
	}
	big := &brokerv1.EncodeRequest{Items: []*brokerv1.EncodeItem{{Content: &brokerv1.EncodeItem_Data{Data: make([]byte, 2<<20)}}}} // ~4 MiB charged
	info := &grpc.UnaryServerInfo{FullMethod: "/broker.v1.BrokerService/Encode"}
	var ok, exhausted atomic.Int32
	var done sync.WaitGroup
	entered.Add(2) // two fit in 10 MiB, the rest are refused
	for range 6 {
		done.Add(1)
		go func() {
			defer done.Done()
			_, err := intercept(context.Background(), big, info, handler)
			switch status.Code(err) {
			case codes.OK:
				ok.Add(1)
			case codes.ResourceExhausted:
				exhausted.Add(1)
				if len(status.Convert(err).Details()) == 0 {
					t.Error("a refusal without RetryInfo")
				}
			default:
				t.Errorf("unexpected %v", err)
			}
		}()
	}
	entered.Wait()
	for exhausted.Load() < 4 {
		runtime.Gosched()
	}
	if got := testutil.ToFloat64(b.inflight); got < 8<<20 {
		t.Errorf("inflight gauge %v with two 4 MiB calls running", got)
	}
	close(gate)
	done.Wait()
	if ok.Load() != 2 || exhausted.Load() != 4 {
		t.Errorf("%d served, %d refused; want 2 and 4", ok.Load(), exhausted.Load())
	}
	if got := testutil.ToFloat64(b.inflight); got != 0 {
		t.Errorf("inflight gauge %v after every call answered", got)
	}
	huge := &brokerv1.EncodeRequest{Items: []*brokerv1.EncodeItem{{Content: &brokerv1.EncodeItem_Data{Data: make([]byte, 6<<20)}}}}
	_, err := intercept(context.Background(), huge, info, func(context.Context, any) (any, error) { return nil, nil })
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "split it") {
		t.Errorf("a call larger than the budget: %v", err)
	}
}
