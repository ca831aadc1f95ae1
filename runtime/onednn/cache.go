package onednn

import (
	"container/list"
	"sync"
)

// lru is a bounded least-recently-used cache. The device keeps its created
// oneDNN primitives in one: creating a primitive costs far more than running
// a small one, and shapes repeat from batch to batch.
type lru[K comparable, V any] struct {
	mu      sync.Mutex
	max     int
	ll      *list.List // front: most recently used
	items   map[K]*list.Element
	destroy func(V) // releases an evicted value
	hits    uint64
	misses  uint64
}

type lruEntry[K comparable, V any] struct {
	key K
	val V
}

func newLRU[K comparable, V any](max int, destroy func(V)) *lru[K, V] {
	if max < 1 {
		max = 1
	}
	return &lru[K, V]{max: max, ll: list.New(), items: map[K]*list.Element{}, destroy: destroy}
}

// get returns the value for key, creating it with create on a miss and
// evicting the least recently used entry when the cache is full. create runs
// under the lock, so one key is never created twice.
func (c *lru[K, V]) get(key K, create func() (V, error)) (V, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.hits++
		c.ll.MoveToFront(el)
		return el.Value.(*lruEntry[K, V]).val, nil
	}
	c.misses++
	v, err := create()
	if err != nil {
		return v, err
	}
	c.items[key] = c.ll.PushFront(&lruEntry[K, V]{key: key, val: v})
	for c.ll.Len() > c.max {
		el := c.ll.Back()
		e := c.ll.Remove(el).(*lruEntry[K, V])
		delete(c.items, e.key)
		c.destroy(e.val)
	}
	return v, nil
}

// clear destroys every entry.
func (c *lru[K, V]) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for el := c.ll.Front(); el != nil; el = el.Next() {
		c.destroy(el.Value.(*lruEntry[K, V]).val)
	}
	c.ll.Init()
	clear(c.items)
}

// stats returns the entry count, hits and misses.
func (c *lru[K, V]) stats() (n int, hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len(), c.hits, c.misses
}
