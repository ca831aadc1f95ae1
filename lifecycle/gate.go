package lifecycle

import (
	"sync"
	"sync/atomic"
)

// gate counts a Served version's requests in flight, so that a reload or an
// unload can wait for them; once retired it lets no new request in. It is
// lock-free because every Infer and Encode passes through it.
type gate struct {
	state atomic.Int64 // requests in flight, plus retiredBit once retired
	once  sync.Once
	idle  chan struct{} // closed once retired with nothing in flight
}

const retiredBit = int64(1) << 62

func newGate() *gate { return &gate{idle: make(chan struct{})} }

func (g *gate) enter() bool {
	if g.state.Add(1)&retiredBit != 0 {
		g.leave()
		return false
	}
	return true
}

func (g *gate) leave() {
	if g.state.Add(-1) == retiredBit {
		g.once.Do(func() { close(g.idle) })
	}
}

// retire refuses new requests; the channel closes when the last one left.
func (g *gate) retire() <-chan struct{} {
	if g.state.Or(retiredBit) == 0 {
		g.once.Do(func() { close(g.idle) })
	}
	return g.idle
}
