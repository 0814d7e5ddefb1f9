package placement

import (
	"context"
	"sync"

	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
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

// ReconcileConsumer brings the mirror's and the index's record of what
// con holds (as just read from Placement) in line with it. Placement bumps
// the generation only of the providers a write allocates on, not of those
// it takes allocations off (objects/allocation.py _set_allocations): after
// Nova moves an instance's allocations back (a revert) or away, the
// provider it left keeps its generation and the incremental sync would
// keep the old allocation until the next full sync. Each provider where
// the mirror differs from con is read back (learn); a failure is logged,
// and the full sync corrects it.
func (s *Service) ReconcileConsumer(ctx context.Context, con *Consumer) {
	if s.store == nil || con == nil {
		return
	}
	mirrored, err := s.store.Allocations(ctx, con.UUID)
	if err != nil {
		s.log.Warn("placement: read the mirror of a consumer", logkey.Consumer, con.UUID, logkey.Err, err)
		return
	}
	type key struct{ rp, class string }
	have := map[key]int{}
	for _, a := range mirrored {
		have[key{a.Provider, a.Class}] = a.Used
	}
	want := map[key]int{}
	for rp, res := range con.Providers {
		for _, c := range s.classes() {
			if n, ok := res[c]; ok && n > 0 {
				if _, gpu := s.index.Lookup(rp); gpu {
					want[key{rp, c}] = n
				}
			}
		}
	}
	for k, n := range have {
		if _, ok := want[k]; !ok {
			s.log.Info("placement: the mirror drops an allocation Placement no longer has", logkey.Consumer, con.UUID,
				logkey.Provider, k.rp, "mirrored", n)
			s.learn(ctx, k.rp, con.UUID, k.class, 0)
		}
	}
	for k, n := range want {
		if have[k] != n {
			s.learn(ctx, k.rp, con.UUID, k.class, n)
		}
	}
}
