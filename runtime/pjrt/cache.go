package pjrt

import (
	"container/list"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brokerd/brokerd/runtime"
)

// DefaultCacheSize is the number of compiled programs a client keeps when
// Options.CacheSize is 0: with batch and sequence buckets a model needs
// about a dozen, so this holds several models.
const DefaultCacheSize = 64

// programKey identifies a compiled program: the graph's structure (every op
// field), the type of every bound name, and the lowering options. Two runs
// with equal keys lower to the same text. Names are quoted, so no choice of
// names can make two different graphs collide.
func programKey(g *runtime.Graph, bound map[string]TensorType, opts LowerOptions) string {
	var b strings.Builder
	for _, op := range g.Ops {
		fmt.Fprintf(&b, "%d%q", op.Kind, op.Out)
		for _, in := range op.In {
			b.WriteString(strconv.Quote(in))
		}
		fmt.Fprintf(&b, "a%dt%te%xs%xp%vv%vd%d;", op.Act, op.TransB, math.Float32bits(op.Eps), math.Float32bits(op.Scale), op.Perm, op.Shape, op.DType)
	}
	names := make([]string, 0, len(bound))
	for n := range bound {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&b, "%q%d%v", n, bound[n].DType, bound[n].Shape)
	}
	fmt.Fprintf(&b, "|tf32=%t", opts.AllowTF32)
	return b.String()
}

// compileMetrics are the compile cache's Prometheus series.
type compileMetrics struct {
	seconds *prometheus.HistogramVec // by platform
	lookups *prometheus.CounterVec   // by platform, result: hit or miss
}

func newCompileMetrics(reg prometheus.Registerer) (*compileMetrics, error) {
	m := &compileMetrics{
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "brokerd_pjrt_compile_seconds",
			Help:    "Time to lower and compile one op graph to a PJRT executable.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12), // 10ms to ~20s
		}, []string{"platform"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brokerd_pjrt_compile_cache_lookups_total",
			Help: "Compile cache lookups by result (hit or miss).",
		}, []string{"platform", "result"}),
	}
	if reg == nil {
		return m, nil
	}
	// A second adapter on the same registry shares the first one's series.
	var err error
	if m.seconds, err = runtime.RegisterCollector(reg, m.seconds); err != nil {
		return nil, fmt.Errorf("pjrt: register metrics: %w", err)
	}
	if m.lookups, err = runtime.RegisterCollector(reg, m.lookups); err != nil {
		return nil, fmt.Errorf("pjrt: register metrics: %w", err)
	}
	return m, nil
}

// compileCache is a bounded least-recently-used cache of compiled programs.
// A miss compiles outside the lock, so a long compile does not hold up hits
// on other keys; callers of the same key wait for the one compile.
// An evicted value is only dropped: a run may still hold it, and go-xla
// frees an executable's device memory once nothing references it.
type compileCache[V any] struct {
	platform string
	metrics  *compileMetrics
	now      func() time.Time

	mu     sync.Mutex
	max    int
	ll     *list.List // of *cacheEntry[V]; front: most recently used
	items  map[string]*list.Element
	hits   uint64
	misses uint64
}

type cacheEntry[V any] struct {
	key  string
	done chan struct{} // closed when val and err are set
	val  V
	err  error
}

func newCompileCache[V any](max int, platform string, m *compileMetrics) *compileCache[V] {
	if max < 1 {
		max = 1
	}
	return &compileCache[V]{platform: platform, metrics: m, now: time.Now, max: max, ll: list.New(), items: map[string]*list.Element{}}
}

// get returns key's value, calling compile on a miss. A failed compile is
// not cached: the next run tries again.
func (c *compileCache[V]) get(ctx context.Context, key string, compile func() (V, error)) (V, error) {
	c.mu.Lock()
	if el, ok := c.items[key]; ok {
		c.hits++
		c.count("hit")
		c.ll.MoveToFront(el)
		e := el.Value.(*cacheEntry[V])
		c.mu.Unlock()
		select {
		case <-e.done:
			return e.val, e.err
		case <-ctx.Done():
			var zero V
			return zero, ctx.Err()
		}
	}
	c.misses++
	c.count("miss")
	e := &cacheEntry[V]{key: key, done: make(chan struct{})}
	c.items[key] = c.ll.PushFront(e)
	c.mu.Unlock()

	start := c.now()
	e.val, e.err = compile()
	if c.metrics != nil && e.err == nil {
		c.metrics.seconds.WithLabelValues(c.platform).Observe(c.now().Sub(start).Seconds())
	}
	close(e.done)
	c.mu.Lock()
	if e.err == nil {
		// Evicting only once the new program exists: a failed compile
		// does not push a good one out.
		c.evictLocked()
	} else if el, ok := c.items[key]; ok && el.Value.(*cacheEntry[V]) == e {
		c.ll.Remove(el)
		delete(c.items, key)
	}
	c.mu.Unlock()
	return e.val, e.err
}

func (c *compileCache[V]) count(result string) {
	if c.metrics != nil {
		c.metrics.lookups.WithLabelValues(c.platform, result).Inc()
	}
}

// evictLocked drops least recently used entries beyond max, skipping ones
// still compiling (their callers are waiting on them).
func (c *compileCache[V]) evictLocked() {
	for el := c.ll.Back(); el != nil && c.ll.Len() > c.max; {
		prev := el.Prev()
		e := el.Value.(*cacheEntry[V])
		select {
		case <-e.done:
			c.ll.Remove(el)
			delete(c.items, e.key)
		default:
		}
		el = prev
	}
}

// stats returns the entry count, hits and misses.
func (c *compileCache[V]) stats() (n int, hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len(), c.hits, c.misses
}
