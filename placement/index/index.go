// Package index keeps the fleet's physical GPUs in memory, bucketed by
// trait and free units, so the placement engine answers in microseconds.
// It is rebuilt from the mirror (Load) and kept current provider by
// provider (Apply, Remove, SetUsage). It implements engine.State.
package index

import (
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// Config says which providers are GPUs.
type Config struct {
	// Classes are the resource classes treated as vGPU inventory; the
	// first one a provider has wins. Default: VGPU.
	Classes []string
	// TypePrefix marks vGPU type traits. Default: engine.DefaultTypePrefix.
	TypePrefix string
}

type bucketSet struct {
	byFree [][]int32 // usable GPUs by free units, IDs ascending
	empty  []int32   // GPUs with zero usage, IDs ascending
	size   int       // GPUs carrying the trait
}

// Index is safe for concurrent use.
type Index struct {
	cfg Config

	mu        sync.RWMutex
	gpus      []*engine.GPU
	freeIDs   []int32
	byUUID    map[string]int32
	hosts     map[string]*engine.Host // by root uuid
	hostGPUs  map[string][]int32      // by host name
	keys      map[string]*bucketSet   // by own trait; "" = all
	hostTrait map[string]int          // trait → hosts carrying it
	types     map[string]int          // type trait → GPUs carrying it
	providers int                     // providers seen in the last Load plus applied
	reported  map[string]string       // GPU provider name → type trait its agent reports
}

var _ engine.State = (*Index)(nil)

// New returns an empty index.
func New(cfg Config) *Index {
	if len(cfg.Classes) == 0 {
		cfg.Classes = []string{"VGPU"}
	}
	if cfg.TypePrefix == "" {
		cfg.TypePrefix = engine.DefaultTypePrefix
	}
	x := &Index{cfg: cfg}
	x.reset()
	return x
}

func (x *Index) reset() {
	x.gpus = nil
	x.freeIDs = nil
	x.byUUID = map[string]int32{}
	x.hosts = map[string]*engine.Host{}
	x.hostGPUs = map[string][]int32{}
	x.keys = map[string]*bucketSet{"": {}}
	x.hostTrait = map[string]int{}
	x.types = map[string]int{}
}

// class returns the vGPU class of p, if it has one.
func (x *Index) class(p *engine.Provider) (string, engine.Inventory, bool) {
	for _, c := range x.cfg.Classes {
		if inv, ok := p.Inventory[c]; ok {
			return c, inv, true
		}
	}
	return "", engine.Inventory{}, false
}

// Load replaces the whole index with providers. GPU IDs follow the order
// (host name, provider name, uuid).
func (x *Index) Load(providers []engine.Provider) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.reset()
	x.providers = len(providers)
	byUUID := make(map[string]*engine.Provider, len(providers))
	for i := range providers {
		byUUID[providers[i].UUID] = &providers[i]
	}
	for i := range providers {
		p := &providers[i]
		if p.IsRoot() {
			x.setHostLocked(p)
		}
	}
	var gp []*engine.Provider
	for i := range providers {
		if _, _, ok := x.class(&providers[i]); ok {
			gp = append(gp, &providers[i])
		}
	}
	name := func(p *engine.Provider) string {
		if h, ok := x.hosts[root(p)]; ok {
			return h.Name
		}
		return ""
	}
	sort.Slice(gp, func(i, j int) bool {
		a, b := gp[i], gp[j]
		if ha, hb := name(a), name(b); ha != hb {
			return ha < hb
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.UUID < b.UUID
	})
	x.gpus = make([]*engine.GPU, 0, len(gp))
	for _, p := range gp {
		x.upsertGPULocked(p)
	}
}

func root(p *engine.Provider) string {
	if p.RootUUID == "" {
		return p.UUID
	}
	return p.RootUUID
}

// Apply inserts or updates one provider (a root, a GPU, or anything else).
func (x *Index) Apply(p engine.Provider) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if p.IsRoot() {
		x.setHostLocked(&p)
	}
	if _, _, ok := x.class(&p); ok {
		x.upsertGPULocked(&p)
	} else if id, ok := x.byUUID[p.UUID]; ok {
		x.removeGPULocked(id)
	}
}

// Remove forgets a provider.
func (x *Index) Remove(uuid string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if id, ok := x.byUUID[uuid]; ok {
		x.removeGPULocked(id)
	}
	if h, ok := x.hosts[uuid]; ok {
		x.setHostTraitsLocked(h, nil)
		if len(x.hostGPUs[h.Name]) == 0 {
			delete(x.hostGPUs, h.Name)
		}
		delete(x.hosts, uuid)
	}
}

// SetUsage records a GPU's new usage of its vGPU class and generation, as
// learnt from a claim; it reports whether the GPU is known.
func (x *Index) SetUsage(uuid string, used, generation int) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.byUUID[uuid]
	if !ok {
		return false
	}
	g := x.gpus[id]
	x.unbucketLocked(g)
	n := *g
	n.Used, n.Generation = used, generation
	x.gpus[id] = &n
	x.bucketLocked(&n)
	return true
}

// AddUsage adds delta to a GPU's usage of its vGPU class (a claim the
// bridge made, or a release, negative), keeping its generation; it
// returns the new usage and the generation, and whether the GPU is known.
func (x *Index) AddUsage(uuid string, delta int) (used, generation int, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.byUUID[uuid]
	if !ok {
		return 0, 0, false
	}
	g := x.gpus[id]
	x.unbucketLocked(g)
	n := *g
	n.Used = max(n.Used+delta, 0)
	x.gpus[id] = &n
	x.bucketLocked(&n)
	return n.Used, n.Generation, true
}

func (x *Index) setHostLocked(p *engine.Provider) {
	h, ok := x.hosts[p.UUID]
	if !ok {
		h = &engine.Host{RootUUID: p.UUID}
		x.hosts[p.UUID] = h
	}
	if h.Name != p.Name {
		// Move this host's GPUs (placeholder hosts share the name "").
		var mine, rest []int32
		for _, id := range x.hostGPUs[h.Name] {
			if x.gpus[id].Host == h {
				mine = append(mine, id)
			} else {
				rest = append(rest, id)
			}
		}
		if len(rest) == 0 {
			delete(x.hostGPUs, h.Name)
		} else {
			x.hostGPUs[h.Name] = rest
		}
		if len(mine) > 0 {
			x.hostGPUs[p.Name] = mergeSorted(x.hostGPUs[p.Name], mine)
		}
		h.Name = p.Name
	}
	traits := slices.Clone(p.Traits)
	sort.Strings(traits)
	x.setHostTraitsLocked(h, traits)
}

func mergeSorted(a, b []int32) []int32 {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return out
}

func (x *Index) setHostTraitsLocked(h *engine.Host, traits []string) {
	for _, t := range h.Traits {
		if x.hostTrait[t]--; x.hostTrait[t] <= 0 {
			delete(x.hostTrait, t)
		}
	}
	h.Traits = traits
	for _, t := range traits {
		x.hostTrait[t]++
	}
}

func (x *Index) hostLocked(rootUUID string) *engine.Host {
	h, ok := x.hosts[rootUUID]
	if !ok {
		h = &engine.Host{RootUUID: rootUUID}
		x.hosts[rootUUID] = h
	}
	return h
}

// typedLocked returns a GPU provider's traits and type traits: its own,
// or, when it has no type trait, its own and the type its agent reports.
func (x *Index) typedLocked(name string, own []string) (traits, types []string, fromReport bool) {
	traits = slices.Clone(own)
	sort.Strings(traits)
	for _, t := range traits {
		if strings.HasPrefix(t, x.cfg.TypePrefix) {
			types = append(types, t)
		}
	}
	if t := x.reported[name]; len(types) == 0 && t != "" {
		traits = insertString(traits, t)
		types, fromReport = []string{t}, true
	}
	return traits, types, fromReport
}

func insertString(s []string, v string) []string {
	i, found := slices.BinarySearch(s, v)
	if found {
		return s
	}
	return slices.Insert(s, i, v)
}

// SetReportedTypes gives each GPU without a type trait in Placement the
// type its host's agent reports (GPU provider name, as Nova names it →
// type trait), and takes it back from GPUs no longer in m.
func (x *Index) SetReportedTypes(m map[string]string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if maps.Equal(m, x.reported) {
		return
	}
	x.reported = maps.Clone(m)
	for _, g := range x.gpus {
		if g == nil {
			continue
		}
		own := g.Traits
		if g.TypeFromReport {
			own = slices.DeleteFunc(slices.Clone(g.Traits), func(t string) bool { return t == g.Types[0] })
		}
		traits, types, fromReport := x.typedLocked(g.Name, own)
		if slices.Equal(types, g.Types) && fromReport == g.TypeFromReport {
			continue
		}
		x.unbucketLocked(g)
		x.untraitLocked(g)
		n := *g
		n.Traits, n.Types, n.TypeFromReport = traits, types, fromReport
		x.gpus[g.ID] = &n
		x.traitLocked(&n)
		x.bucketLocked(&n)
	}
}

func (x *Index) upsertGPULocked(p *engine.Provider) {
	class, inv, _ := x.class(p)
	traits, types, fromReport := x.typedLocked(p.Name, p.Traits)
	g := &engine.GPU{
		UUID:       p.UUID,
		Name:       p.Name,
		Host:       x.hostLocked(root(p)),
		Class:      class,
		Inventory:  inv,
		Used:       p.Usages[class],
		Generation: p.Generation,
		Traits:     traits,
		Types:      types,

		TypeFromReport: fromReport,
	}
	if id, ok := x.byUUID[p.UUID]; ok {
		old := x.gpus[id]
		g.ID = id
		x.unbucketLocked(old)
		x.untraitLocked(old)
		if old.Host != g.Host {
			x.hostGPUs[old.Host.Name] = remove(x.hostGPUs[old.Host.Name], id)
			x.hostGPUs[g.Host.Name] = insert(x.hostGPUs[g.Host.Name], id)
		}
		x.gpus[id] = g
	} else {
		if n := len(x.freeIDs); n > 0 {
			g.ID = x.freeIDs[n-1]
			x.freeIDs = x.freeIDs[:n-1]
			x.gpus[g.ID] = g
		} else {
			g.ID = int32(len(x.gpus))
			x.gpus = append(x.gpus, g)
		}
		x.byUUID[p.UUID] = g.ID
		x.hostGPUs[g.Host.Name] = insert(x.hostGPUs[g.Host.Name], g.ID)
	}
	x.traitLocked(g)
	x.bucketLocked(g)
}

func (x *Index) removeGPULocked(id int32) {
	g := x.gpus[id]
	x.unbucketLocked(g)
	x.untraitLocked(g)
	x.hostGPUs[g.Host.Name] = remove(x.hostGPUs[g.Host.Name], id)
	delete(x.byUUID, g.UUID)
	x.gpus[id] = nil
	x.freeIDs = append(x.freeIDs, id)
}

func (x *Index) keySet(k string) *bucketSet {
	b, ok := x.keys[k]
	if !ok {
		b = &bucketSet{}
		x.keys[k] = b
	}
	return b
}

func (x *Index) traitLocked(g *engine.GPU) {
	x.keys[""].size++
	for _, t := range g.Traits {
		x.keySet(t).size++
	}
	for _, t := range g.Types {
		x.types[t]++
	}
}

func (x *Index) untraitLocked(g *engine.GPU) {
	x.keys[""].size--
	for _, t := range g.Traits {
		b := x.keys[t]
		if b.size--; b.size == 0 {
			delete(x.keys, t)
		}
	}
	for _, t := range g.Types {
		if x.types[t]--; x.types[t] <= 0 {
			delete(x.types, t)
		}
	}
}

func (x *Index) bucketLocked(g *engine.GPU) {
	each := func(k string) {
		b := x.keySet(k)
		if g.Usable() {
			f := g.Free()
			for len(b.byFree) <= f {
				b.byFree = append(b.byFree, nil)
			}
			b.byFree[f] = insert(b.byFree[f], g.ID)
		}
		if g.Used == 0 {
			b.empty = insert(b.empty, g.ID)
		}
	}
	each("")
	for _, t := range g.Traits {
		each(t)
	}
}

func (x *Index) unbucketLocked(g *engine.GPU) {
	each := func(k string) {
		b, ok := x.keys[k]
		if !ok {
			return
		}
		if g.Usable() {
			f := g.Free()
			if f < len(b.byFree) {
				b.byFree[f] = remove(b.byFree[f], g.ID)
				for n := len(b.byFree); n > 0 && len(b.byFree[n-1]) == 0; n-- {
					b.byFree = b.byFree[:n-1]
				}
			}
		}
		if g.Used == 0 {
			b.empty = remove(b.empty, g.ID)
		}
	}
	each("")
	for _, t := range g.Traits {
		each(t)
	}
}

func insert(s []int32, id int32) []int32 {
	i, found := slices.BinarySearch(s, id)
	if found {
		return s
	}
	return slices.Insert(s, i, id)
}

func remove(s []int32, id int32) []int32 {
	i, found := slices.BinarySearch(s, id)
	if !found {
		return s
	}
	return slices.Delete(s, i, i+1)
}

// The engine.State methods below are called with the read lock held (see
// Decide); they must not lock.

// GPU implements engine.State.
func (x *Index) GPU(id int32) *engine.GPU {
	if id < 0 || int(id) >= len(x.gpus) {
		return nil
	}
	return x.gpus[id]
}

// Bucket implements engine.State.
func (x *Index) Bucket(key string, free int) []int32 {
	b, ok := x.keys[key]
	if !ok || free < 0 || free >= len(b.byFree) {
		return nil
	}
	return b.byFree[free]
}

// MaxFree implements engine.State.
func (x *Index) MaxFree(key string) int {
	b, ok := x.keys[key]
	if !ok {
		return -1
	}
	return len(b.byFree) - 1
}

// Size implements engine.State.
func (x *Index) Size(key string) int {
	if b, ok := x.keys[key]; ok {
		return b.size
	}
	return 0
}

// OnHosts implements engine.State.
func (x *Index) OnHosts(t string) bool { return x.hostTrait[t] > 0 }

// Empty implements engine.State.
func (x *Index) Empty(key string) []int32 {
	if b, ok := x.keys[key]; ok {
		return b.empty
	}
	return nil
}

// HostGPUs implements engine.State.
func (x *Index) HostGPUs(name string) []int32 { return x.hostGPUs[name] }

// Types implements engine.State.
func (x *Index) Types() []string {
	ts := make([]string, 0, len(x.types))
	for t := range x.types {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	return ts
}

// Decide runs the engine on a consistent view of the index.
func (x *Index) Decide(e *engine.Engine, r engine.Request) ([]engine.Candidate, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	c, err := e.Decide(x, r)
	for i := range c { // detach from later index updates
		g := *c[i].GPU
		h := *g.Host
		g.Host = &h
		c[i].GPU = &g
	}
	return c, err
}

// View calls fn with the read lock held; fn must not keep the State.
func (x *Index) View(fn func(engine.State)) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	fn(x)
}

// GPUs returns copies of every GPU, in ID order.
func (x *Index) GPUs() []engine.GPU {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]engine.GPU, 0, len(x.byUUID))
	for _, g := range x.gpus {
		if g != nil {
			c := *g
			h := *g.Host
			c.Host = &h
			out = append(out, c)
		}
	}
	return out
}

// Lookup returns a copy of the GPU with provider uuid u.
func (x *Index) Lookup(u string) (engine.GPU, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	id, ok := x.byUUID[u]
	if !ok {
		return engine.GPU{}, false
	}
	c := *x.gpus[id]
	h := *c.Host
	c.Host = &h
	return c, true
}

// Len counts the GPUs.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byUUID)
}
