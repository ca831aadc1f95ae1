package main_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
	"github.com/brokerd/brokerd/server/endpoint"
)

// TestKill9AndRestartUnderLoad kills brokerd with SIGKILL while clients keep
// encoding, restarts it on the same socket and state dir, and checks that
// every call got an answer within its deadline (UNAVAILABLE while brokerd
// was down, never a hang or INTERNAL), that the restart serves again, and
// that the device registry kept its IDs.
func TestKill9AndRestartUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	dir := t.TempDir()
	b := startBrokerdIn(t, dir)
	ctx := context.Background()
	conn, err := endpoint.Dial(ctx, b.socket, "")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := brokerv1.NewBrokerServiceClient(conn)
	devicesBefore := deviceIDs(t, cl)

	var (
		okBefore, okAfter atomic.Int64
		restarted         atomic.Bool
		stop              = make(chan struct{})
		mu                sync.Mutex
		codesSeen         = map[codes.Code]int{}
		slowest           time.Duration
	)
	const callTimeout = 3 * time.Second
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				start := time.Now()
				_, err := cl.Encode(cctx, &brokerv1.EncodeRequest{Items: []*brokerv1.EncodeItem{
					{Id: fmt.Sprint(c, "/", k), Content: &brokerv1.EncodeItem_Text{Text: fmt.Sprintf("client %d call %d of the crash test", c, k)}},
				}})
				took := time.Since(start)
				cancel()
				mu.Lock()
				slowest = max(slowest, took)
				codesSeen[status.Code(err)]++
				mu.Unlock()
				switch {
				case err == nil && restarted.Load():
					okAfter.Add(1)
				case err == nil:
					okBefore.Add(1)
				default:
					time.Sleep(5 * time.Millisecond) // as a client backs off
				}
			}
		}()
	}
	waitUntil(t, "load before the kill", func() bool { return okBefore.Load() >= 50 })
	if err := b.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-b.exited
	killedAt := time.Now()
	b2 := startBrokerdIn(t, dir)
	restarted.Store(true)
	readyAfter := time.Since(killedAt)
	waitUntil(t, "load after the restart", func() bool { return okAfter.Load() >= 50 })
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	for code, n := range codesSeen {
		if code != codes.OK && code != codes.Unavailable {
			t.Errorf("%d calls ended %v; want OK, or UNAVAILABLE while brokerd was down", n, code)
		}
	}
	if slowest >= callTimeout {
		t.Errorf("a call took %v: it waited for its deadline instead of failing fast", slowest)
	}
	if got := deviceIDs(t, cl); !slices.Equal(got, devicesBefore) {
		t.Errorf("device IDs after restart %v, before %v", got, devicesBefore)
	}
	if b2.socket != b.socket {
		t.Fatalf("restart on another socket")
	}
	t.Logf("serving again %v after SIGKILL; calls: %v; before %d ok, after %d ok", readyAfter, codesSeen, okBefore.Load(), okAfter.Load())
}

func deviceIDs(t *testing.T, cl brokerv1.BrokerServiceClient) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.ListDevices(ctx, &brokerv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range resp.GetDevices() {
		ids = append(ids, d.GetId()+"="+d.GetUuid())
	}
	slices.Sort(ids)
	return ids
}

// waitUntil polls cond for up to 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(errors.New("timed out waiting for " + what))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
