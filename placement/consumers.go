package placement

import (
	"context"
	"sync"
)

// consumerCache keeps each consumer's allocations and generation as the
// bridge last read or wrote them, so that a claim can write at once (PUT
// with the consumer generation) instead of reading first: one Placement
// call per claim while the view is current. A stale entry costs a 409, on
// which the claim reads again; it never costs a wrong write, because
// Placement checks the generation. Entries are filled when the bridge
// reads a consumer (ReadVGPU: the pipeline does when a Nova notification
// says the instance's allocations changed) and after its own writes.
type consumerCache struct {
	mu  sync.Mutex
	m   map[string]*Consumer
	max int
}

// defaultConsumerCache bounds the cache (about 1 KiB an entry).
const defaultConsumerCache = 100_000

func (c *consumerCache) get(id string) *Consumer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[id].clone()
}

// put keeps con, unless the cache holds a later generation of it; a
// consumer that does not exist (yet, or any more) is forgotten.
func (c *consumerCache) put(con *Consumer) {
	if con == nil || con.UUID == "" {
		return
	}
	if con.Generation == nil {
		c.forget(con.UUID)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[con.UUID]; old != nil && old.Generation != nil && *old.Generation > *con.Generation {
		return
	}
	if c.m == nil || len(c.m) >= c.max {
		c.m = make(map[string]*Consumer) // rare: start over rather than keep an order
	}
	c.m[con.UUID] = con.clone()
}

// wrote records that the bridge wrote con (PUT with con.Generation):
// Placement moved the consumer to the next generation.
func (c *consumerCache) wrote(con *Consumer) {
	if con == nil || con.Generation == nil {
		if con != nil {
			c.forget(con.UUID)
		}
		return
	}
	next := con.clone()
	g := *con.Generation + 1
	next.Generation = &g
	c.put(next)
}

func (c *consumerCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}

// CachedVGPU is ReadVGPU answered from what the bridge last read or wrote
// of the consumer when it knows it, with no Placement call; cached says
// which. For a claim's base only: what it returns may be stale, which the
// claim's consumer generation catches.
func (s *Service) CachedVGPU(ctx context.Context, instance string) (out []Holding, con *Consumer, cached bool, err error) {
	if con := s.consumers.get(instance); con != nil {
		return s.holdingsOf(con), con, true, nil
	}
	out, con, err = s.ReadVGPU(ctx, instance)
	return out, con, false, err
}

// ForgetConsumer drops what the bridge knows of a consumer's allocations
// (it changed them by another way, or Nova did).
func (s *Service) ForgetConsumer(consumer string) { s.consumers.forget(consumer) }
