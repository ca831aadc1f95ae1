package lifecycle

import (
	"sync"
	"testing"
	"time"
)

func TestGate(t *testing.T) {
	t.Run("retire with nothing in flight", func(t *testing.T) {
		g := newGate()
		select {
		case <-g.retire():
		default:
			t.Fatal("an idle gate did not close at once")
		}
		if g.enter() {
			t.Error("a retired gate let a request in")
		}
	})
	t.Run("retire waits for the requests inside", func(t *testing.T) {
		g := newGate()
		if !g.enter() || !g.enter() {
			t.Fatal("an open gate refused a request")
		}
		idle := g.retire()
		if g.enter() {
			t.Error("a retired gate let a request in")
		}
		g.leave()
		// leave closes the channel before it returns: no waiting either way.
		select {
		case <-idle:
			t.Fatal("closed with a request still inside")
		default:
		}
		g.leave()
		select {
		case <-idle:
		default:
			t.Fatal("not closed after the last request left")
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		// Every request admitted before the gate closed has left when it
		// closes; none is admitted after.
		g := newGate()
		var (
			mu     sync.Mutex
			inside int
			closed bool
			wg     sync.WaitGroup
		)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 2000 {
					if !g.enter() {
						return
					}
					mu.Lock()
					if closed {
						t.Error("a request entered after the gate closed")
					}
					inside++
					mu.Unlock()
					mu.Lock()
					inside--
					mu.Unlock()
					g.leave()
				}
			}()
		}
		time.Sleep(time.Millisecond)
		<-g.retire()
		mu.Lock()
		closed = true
		if inside != 0 {
			t.Errorf("%d requests inside when the gate closed", inside)
		}
		mu.Unlock()
		wg.Wait()
	})
}
