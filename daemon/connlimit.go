package daemon

import (
	"container/list"
	"net"
	"strconv"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Connections are bounded per listener, in all and per client (the peer's
// uid on the Unix socket, its IP on TCP), so idle connections cannot take
// every descriptor and one client cannot starve the others. The socket,
// TCP and HTTP listeners also share one pool, the descriptor limit less a
// reserve: each alone could otherwise take it all. The metrics and health
// listeners have small limits of their own, within the reserve, so a
// flood there (the health port is plaintext, on the pod network) starves
// neither them nor the rest. A connection over a limit is closed at once,
// before any TLS or HTTP/2 work; except that those two, once full, close
// their oldest connection to take a new one: their clients (kubelet's
// probes, scrapers) open a connection per check and keep it briefly, so a
// few addresses holding connections open (4 of 4 each filled 16 slots,
// and kubelet's probes failed) lose them to the next probe instead, and
// starving probes takes opening connections faster than a probe's life.

// connMetrics count open and refused connections per listener.
type connMetrics struct {
	open    *prometheus.GaugeVec
	refused *prometheus.CounterVec
}

func newConnMetrics(reg prometheus.Registerer) *connMetrics {
	m := &connMetrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "brokerd", Name: "connections_open", Help: "Open client connections per listener.",
		}, []string{"listener"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "brokerd", Name: "connections_refused_total", Help: "Connections closed at accept (over the total, per-client or descriptor limit), or evicted: the oldest closed for a new one on a full metrics or health listener.",
		}, []string{"listener", "limit"}),
	}
	reg.MustRegister(m.open, m.refused)
	return m
}

// connPool bounds the connections of the listeners that share it.
type connPool struct {
	mu        sync.Mutex
	open, max int
}

func newConnPool(max int) *connPool { return &connPool{max: max} }

// take reserves a slot; false: the pool is full.
func (p *connPool) take() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open >= p.max {
		return false
	}
	p.open++
	return true
}

func (p *connPool) give() {
	p.mu.Lock()
	p.open--
	p.mu.Unlock()
}

// limitListener enforces the limits on accepted connections.
type limitListener struct {
	net.Listener
	name             string
	total, perClient int
	pool             *connPool // shared with other listeners; nil: none
	evict            bool      // full: close the oldest connection for a new one (no pool)
	m                *connMetrics
	log              *zap.Logger

	mu     sync.Mutex
	open   int
	byPeer map[string]int
	conns  *list.List // of *countedConn, oldest first (evict)
}

// newLimitListener bounds l; one with no shared pool (metrics, health)
// evicts its oldest connection when full.
func newLimitListener(l net.Listener, name string, total, perClient int, pool *connPool, m *connMetrics, log *zap.Logger) *limitListener {
	return &limitListener{Listener: l, name: name, total: total, perClient: perClient, pool: pool, evict: pool == nil,
		m: m, log: log, byPeer: map[string]int{}, conns: list.New()}
}

// peerKey identifies a connection's client for the per-client limit.
func peerKey(c net.Conn) string {
	if uc, ok := c.(*net.UnixConn); ok { // as accepted: no wrapper yet
		if raw, err := uc.SyscallConn(); err == nil {
			var cred *syscall.Ucred
			_ = raw.Control(func(fd uintptr) {
				cred, _ = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
			})
			if cred != nil {
				return "uid:" + strconv.Itoa(int(cred.Uid))
			}
		}
		return "unix"
	}
	if host, _, err := net.SplitHostPort(c.RemoteAddr().String()); err == nil {
		return "ip:" + host
	}
	return c.RemoteAddr().String()
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := peerKey(c)
		l.mu.Lock()
		limit := ""
		var evicted *countedConn
		full := l.total > 0 && l.open >= l.total
		switch {
		case full && !l.evict:
			limit = "total"
		case l.perClient > 0 && l.byPeer[key] >= l.perClient:
			limit = "per_client" // a client's own connections make no room
		case full && l.conns.Len() > 0:
			// The oldest gives its slot to this one now, not when its
			// close is noticed: Accept is called from one goroutine.
			evicted = l.conns.Front().Value.(*countedConn)
			l.forget(evicted)
		case full:
			limit = "total"
		case l.pool != nil && !l.pool.take():
			limit = "descriptors"
		}
		var cc *countedConn
		if limit == "" {
			l.open++
			l.byPeer[key]++
			cc = &countedConn{Conn: c, l: l, key: key}
			cc.elem = l.conns.PushBack(cc)
		}
		l.mu.Unlock()
		if evicted != nil {
			l.m.refused.WithLabelValues(l.name, "evicted").Inc()
			l.log.Debug("oldest connection closed for a new one", zap.String("listener", l.name), zap.String("client", evicted.key))
			evicted.Close()
		}
		if limit != "" {
			l.m.refused.WithLabelValues(l.name, limit).Inc()
			l.log.Debug("connection refused", zap.String("listener", l.name), zap.String("client", key), zap.String("limit", limit))
			c.Close()
			continue
		}
		l.m.open.WithLabelValues(l.name).Inc()
		return cc, nil
	}
}

// forget gives back c's slot, once (l.mu held).
func (l *limitListener) forget(c *countedConn) {
	if c.elem == nil {
		return
	}
	l.conns.Remove(c.elem)
	c.elem = nil
	l.open--
	if l.byPeer[c.key]--; l.byPeer[c.key] <= 0 {
		delete(l.byPeer, c.key)
	}
	if l.pool != nil {
		l.pool.give()
	}
	l.m.open.WithLabelValues(l.name).Dec()
}

func (l *limitListener) release(c *countedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forget(c)
}

// countedConn gives its slot back once, when closed (or evicted).
type countedConn struct {
	net.Conn
	l    *limitListener
	key  string
	elem *list.Element // in l.conns while it holds a slot (l.mu)
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.l.release(c)
	return err
}

// Unwrap lets the peer-credential handshake reach the Unix connection.
func (c *countedConn) Unwrap() net.Conn { return c.Conn }

// raiseFileLimit lifts the soft descriptor limit to the hard one and
// returns the result: the room connections get.
func raiseFileLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 1024
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r)
	}
	return r.Cur
}

// Descriptors kept out of the connection limits: model files, devices,
// the metrics and health listeners' connections, logs.
const fdReserve = 256

// The metrics and health listeners' own limits, within fdReserve: enough
// for scrapers and probes (a kubelet opens one connection per probe), few
// enough that a flood of them leaves the reserve its use.
const (
	sideConns          = 16 // per listener
	sideConnsPerClient = 4
)

// descriptorBudget is what the descriptor limit leaves connections once
// the reserve is kept: the pool the socket, TCP and HTTP listeners share.
func descriptorBudget(nofile uint64) int {
	return max(int(min(nofile, 1<<20))-fdReserve, 16)
}

// connectionLimits are the effective limits per listener: the settings,
// or derived from the descriptor limit (total: the descriptor budget;
// per client: a quarter of it, so four clients are needed to fill it).
func connectionLimits(maxConns, perClient int, nofile uint64) (int, int) {
	if maxConns <= 0 {
		maxConns = descriptorBudget(nofile)
	}
	if perClient <= 0 {
		perClient = max(maxConns/4, 1)
	}
	return maxConns, perClient
}
