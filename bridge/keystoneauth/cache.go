package keystoneauth

import (
	"container/list"
	"sync"
	"time"
)

// cache holds validation outcomes by token hash until their time ends,
// at most max of them, evicting the least recently used.
type cache struct {
	mu  sync.Mutex
	max int
	ll  *list.List // front: most recently used
	m   map[[32]byte]*list.Element
}

type cacheEntry struct {
	key   [32]byte
	until time.Time
	o     *outcome
}

func newCache(max int) *cache {
	return &cache{max: max, ll: list.New(), m: map[[32]byte]*list.Element{}}
}

// get returns the outcome cached for key if it is still valid at now.
func (c *cache) get(key [32]byte, now time.Time) (*outcome, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.m[key]
	if !ok {
		return nil, false
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.until) {
		c.ll.Remove(el)
		delete(c.m, key)
		return nil, false
	}
	c.ll.MoveToFront(el)
	return e.o, true
}

// put caches o for key until until, evicting the least recently used
// entry when the cache is full.
func (c *cache) put(key [32]byte, o *outcome, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[key]; ok {
		e := el.Value.(*cacheEntry)
		e.o, e.until = o, until
		c.ll.MoveToFront(el)
		return
	}
	c.m[key] = c.ll.PushFront(&cacheEntry{key: key, until: until, o: o})
	for c.ll.Len() > c.max {
		el := c.ll.Back()
		c.ll.Remove(el)
		delete(c.m, el.Value.(*cacheEntry).key)
	}
}

func (c *cache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}
