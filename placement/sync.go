package placement

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/index"
	"github.com/vgpu-bridge/vgpu-bridge/placement/mirror"
)

// SyncStats tells what one sync did.
type SyncStats struct {
	Full      bool
	Providers int // listed by Placement
	Fetched   int // whose details were read
	Removed   int
	GPUs      int // in the index afterwards
	Duration  time.Duration
}

// Progress is told how many of total providers are fetched.
type Progress func(done, total int)

// Syncer copies Placement into the mirror and the index.
type Syncer struct {
	Client      *Client
	Store       *mirror.Store
	Index       *index.Index
	Classes     []string
	Concurrency int
	BatchSize   int
	Log         *slog.Logger
	// TraitListingMin: from this many providers to read, traits are listed
	// per trait (GET /resource_providers?required=T) instead of per
	// provider; default 200.
	TraitListingMin int

	byTrait map[string]*listedTraits // set during a large sync
}

// traitListingMin is the number of providers to read from which traits
// are listed per trait rather than per provider.
const traitListingMin = 200

// listedTraits are a provider's traits as the per-trait listings saw them,
// valid only while its generation stays gen.
type listedTraits struct {
	traits []string
	gen    int
	mixed  bool // listings saw different generations
}

// listTraits reads which providers carry each associated trait. Every
// provider of refs gets an entry, so one without traits is known as such.
func (s *Syncer) listTraits(ctx context.Context, refs []ProviderRef) (map[string]*listedTraits, error) {
	out := make(map[string]*listedTraits, len(refs))
	for _, r := range refs {
		out[r.UUID] = &listedTraits{gen: r.Generation}
	}
	ts, err := s.Client.AssociatedTraits(ctx)
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		ps, err := s.Client.Providers(ctx, ListOpts{Required: []string{t}})
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			lt, ok := out[p.UUID]
			if !ok {
				continue // created after the listing: read on its own next time
			}
			lt.traits = append(lt.traits, t)
			if p.Generation != lt.gen {
				lt.mixed = true
			}
		}
	}
	return out, nil
}

func (s *Syncer) isGPU(p *engine.Provider) bool {
	classes := s.Classes
	if len(classes) == 0 {
		classes = []string{"VGPU"}
	}
	for _, c := range classes {
		if _, ok := p.Inventory[c]; ok {
			return true
		}
	}
	return false
}

// Sync lists Placement's providers and fetches those whose generation,
// name or tree differ from the mirror (all of them when full), writes them
// to the mirror, removes vanished ones, and keeps the index current.
func (s *Syncer) Sync(ctx context.Context, full bool, progress Progress) (SyncStats, error) {
	start := time.Now()
	st := SyncStats{Full: full}
	refs, err := s.Client.Providers(ctx, ListOpts{})
	if err != nil {
		return st, fmt.Errorf("sync: %w", err)
	}
	st.Providers = len(refs)
	have, err := s.Store.Refs(ctx)
	if err != nil {
		return st, fmt.Errorf("sync: %w", err)
	}
	var todo []ProviderRef
	seen := make(map[string]bool, len(refs))
	for _, r := range refs {
		seen[r.UUID] = true
		m, ok := have[r.UUID]
		if full || !ok || m.Generation != r.Generation || m.Name != r.Name || m.ParentUUID != r.ParentUUID || m.RootUUID != r.RootUUID {
			todo = append(todo, r)
		}
	}
	var gone []string
	for u := range have {
		if !seen[u] {
			gone = append(gone, u)
		}
	}
	sort.Strings(gone)
	st.Removed = len(gone)
	// Keep trees together and roots first, so the mirror's gpus rows
	// find their node's name.
	sort.Slice(todo, func(i, j int) bool {
		a, b := todo[i], todo[j]
		if a.RootUUID != b.RootUUID {
			return a.RootUUID < b.RootUUID
		}
		ra, rb := a.UUID == a.RootUUID, b.UUID == b.RootUUID
		if ra != rb {
			return ra
		}
		return a.UUID < b.UUID
	})
	listFrom := s.TraitListingMin
	if listFrom <= 0 {
		listFrom = traitListingMin
	}
	if len(todo) >= listFrom {
		// Read traits per trait (a few calls) instead of per provider.
		if s.byTrait, err = s.listTraits(ctx, refs); err != nil {
			return st, fmt.Errorf("sync: %w", err)
		}
		defer func() { s.byTrait = nil }()
	}
	fetched, err := s.fetchAll(ctx, todo, progress)
	if err != nil {
		return st, err
	}
	st.Fetched = len(fetched)
	batch := s.BatchSize
	if batch <= 0 {
		batch = 500
	}
	for i := 0; i < len(fetched) || (i == 0 && len(gone) > 0); i += batch {
		j := min(i+batch, len(fetched))
		var g []string
		if i == 0 {
			g = gone
		}
		if err := s.Store.Put(ctx, fetched[i:j], g); err != nil {
			return st, fmt.Errorf("sync: %w", err)
		}
	}
	if full {
		// Rebuild from Placement's answer rather than patching.
		all, err := s.Store.Records(ctx)
		if err != nil {
			return st, fmt.Errorf("sync: %w", err)
		}
		s.Index.LoadRecords(all)
	} else {
		for _, p := range fetched {
			s.Index.Apply(p)
		}
		for _, u := range gone {
			s.Index.Remove(u)
		}
	}
	st.GPUs = s.Index.Len()
	st.Duration = time.Since(start)
	return st, nil
}

func (s *Syncer) fetchAll(ctx context.Context, todo []ProviderRef, progress Progress) ([]engine.Provider, error) {
	n := s.Concurrency
	if n <= 0 {
		n = 8
	}
	out := make([]engine.Provider, len(todo))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
		done     int
		wg       sync.WaitGroup
	)
	work := make(chan int)
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				p, err := s.fetch(ctx, todo[i])
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
					cancel()
				}
				out[i] = p
				done++
				d := done
				mu.Unlock()
				if progress != nil {
					progress(d, len(todo))
				}
			}
		}()
	}
	for i := range todo {
		select {
		case work <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// fetch reads one provider's details; when its generation moves while
// being read, it reads again so the record is consistent.
func (s *Syncer) fetch(ctx context.Context, r ProviderRef) (engine.Provider, error) {
	for attempt := 0; ; attempt++ {
		p, consistent, err := s.fetchOnce(ctx, r)
		if err != nil {
			if IsNotFound(err) {
				// Deleted meanwhile: the next sync removes it.
				return engine.Provider{UUID: r.UUID, Name: r.Name, Generation: -1, ParentUUID: r.ParentUUID, RootUUID: r.RootUUID}, nil
			}
			return p, fmt.Errorf("sync provider %s: %w", r.UUID, err)
		}
		if consistent || attempt >= 3 {
			return p, nil
		}
	}
}

func (s *Syncer) fetchOnce(ctx context.Context, r ProviderRef) (engine.Provider, bool, error) {
	p := engine.Provider{UUID: r.UUID, Name: r.Name, ParentUUID: r.ParentUUID, RootUUID: r.RootUUID}
	inv, g1, err := s.Client.Inventories(ctx, r.UUID)
	if err != nil {
		return p, false, err
	}
	p.Inventory, p.Generation = inv, g1
	var traits []string
	g2 := g1
	// The listed traits hold if the generation did not move between the
	// provider listing, the trait listings and this read (a trait change
	// bumps the generation).
	if lt, ok := s.byTrait[r.UUID]; ok && !lt.mixed && lt.gen == g1 {
		traits = append([]string(nil), lt.traits...)
	} else {
		traits, g2, err = s.Client.Traits(ctx, r.UUID)
		if err != nil {
			return p, false, err
		}
	}
	sort.Strings(traits)
	p.Traits = traits
	gens := []int{g2}
	if s.isGPU(&p) {
		al, g, err := s.Client.ProviderAllocations(ctx, r.UUID)
		if err != nil {
			return p, false, err
		}
		gens = append(gens, g)
		p.Allocations = al
		p.Usages = map[string]int{}
		for _, res := range al {
			for c, n := range res {
				p.Usages[c] += n
			}
		}
	}
	if p.IsRoot() {
		ag, g, err := s.Client.Aggregates(ctx, r.UUID)
		if err != nil {
			return p, false, err
		}
		sort.Strings(ag)
		p.Aggregates = ag
		gens = append(gens, g)
	}
	for _, g := range gens {
		if g != g1 {
			return p, false, nil
		}
	}
	return p, true, nil
}
