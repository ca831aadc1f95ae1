package grammar

import (
	"container/list"
	"context"
	"sync"
)

// Cache holds compiled grammars by (vocabulary, kind, source), least
// recently used first out, within a byte bound. Concurrent requests for the
// same key compile once. Safe for concurrent use.
type Cache struct {
	maxBytes int64
	lim      Limits

	mu      sync.Mutex
	bytes   int64
	lru     *list.List // of *cacheEntry, front = most recent
	entries map[cacheKey]*list.Element
	flight  map[cacheKey]*flight
	hits    int64
	misses  int64
}

type cacheKey struct {
	vocab uint64
	kind  Kind
	src   string
}

type cacheEntry struct {
	key cacheKey
	g   *Grammar
}

type flight struct {
	done chan struct{}
	g    *Grammar
	err  error
}

// NewCache makes a cache that keeps at most maxBytes of compiled grammars
// (Grammar.SizeBytes) and compiles with lim.
func NewCache(maxBytes int64, lim Limits) *Cache {
	return &Cache{maxBytes: maxBytes, lim: lim, lru: list.New(),
		entries: map[cacheKey]*list.Element{}, flight: map[cacheKey]*flight{}}
}

// Get returns the compiled grammar for (v, kind, src), compiling it on a
// miss. Errors are not cached. A caller whose ctx ends while another
// caller compiles the same key returns ctx.Err(); the compile goes on for
// the others.
func (c *Cache) Get(ctx context.Context, v *Vocab, kind Kind, src string) (*Grammar, error) {
	if kind == KindJSON {
		src = ""
	}
	k := cacheKey{v.id, kind, src}
	c.mu.Lock()
	if e, ok := c.entries[k]; ok {
		c.lru.MoveToFront(e)
		c.hits++
		c.fit()
		c.mu.Unlock()
		return e.Value.(*cacheEntry).g, nil
	}
	if f, ok := c.flight[k]; ok {
		c.mu.Unlock()
		select {
		case <-f.done:
			return f.g, f.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c.misses++
	f := &flight{done: make(chan struct{})}
	c.flight[k] = f
	c.mu.Unlock()

	f.g, f.err = Compile(ctx, v, kind, src, c.lim)

	c.mu.Lock()
	delete(c.flight, k)
	if f.err == nil {
		if f.g.SizeBytes()+int64(len(src)) <= c.maxBytes {
			c.entries[k] = c.lru.PushFront(&cacheEntry{k, f.g})
			c.fit()
		}
	}
	c.mu.Unlock()
	close(f.done)
	return f.g, f.err
}

// fit recounts the grammars' sizes, which grow as their deferred positions
// are computed, and evicts the least recently used until they fit.
func (c *Cache) fit() {
	c.bytes = 0
	for e := c.lru.Front(); e != nil; e = e.Next() {
		ce := e.Value.(*cacheEntry)
		c.bytes += ce.g.SizeBytes() + int64(len(ce.key.src))
	}
	for c.bytes > c.maxBytes && c.lru.Len() > 0 {
		back := c.lru.Back()
		e := back.Value.(*cacheEntry)
		c.lru.Remove(back)
		delete(c.entries, e.key)
		c.bytes -= e.g.SizeBytes() + int64(len(e.key.src))
	}
}

// CacheStats are a cache's counters.
type CacheStats struct {
	Entries      int
	Bytes        int64
	Hits, Misses int64
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Entries: len(c.entries), Bytes: c.bytes, Hits: c.hits, Misses: c.misses}
}
