// Package index keeps the fleet's physical GPUs in memory, bucketed by
// trait and free units, so the placement engine answers in microseconds.
// It is rebuilt from the mirror (Load) and kept current provider by
// provider (Apply, Remove, SetUsage). It implements engine.State.
package index

import (
	"cmp"
	"hash/maphash"
	"slices"
	"sort"
	"strings"
	"sync"
	"unique"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// Config says which providers are GPUs.
type Config struct {
	// Classes are the resource classes treated as vGPU inventory; the
	// first one a provider has wins. Default: VGPU.
	Classes []string
	// TypePrefix marks vGPU type traits. Default: engine.DefaultTypePrefix.
	TypePrefix string
	// ClassTypes type the GPUs of a class that carry no type trait
	// under TypePrefix: class → type trait (Nova-owned VF GPUs, whose
	// class [placement] nova_vf_resource_classes maps to a type). Such a
	// type is not TypeFromReport: the bridge never writes it to Nova's
	// provider.
	ClassTypes map[string]string
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
	byUUID    []int32                 // the IDs of the GPUs, by uuid (idOf): a fifth of a map's size
	hosts     map[string]*engine.Host // by root uuid
	hostGPUs  map[string][]int32      // by host name
	keys      map[string]*bucketSet   // by own trait; "" = all
	hostTrait map[string]int          // trait → hosts carrying it
	types     map[string]int          // type trait → GPUs carrying it
	providers int                     // providers seen in the last Load plus applied
	reported  reportedTypes           // GPU provider name → type trait its agent reports
	sets      TraitSets               // one slice per distinct trait set, shared by hosts and GPUs
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
	x.byUUID = nil
	x.hosts = map[string]*engine.Host{}
	x.hostGPUs = map[string][]int32{}
	x.keys = map[string]*bucketSet{"": {}}
	x.hostTrait = map[string]int{}
	x.types = map[string]int{}
	x.sets.Reset()
}

// Record is what the index reads of a provider: an engine.Provider
// without its maps, for loads of a whole fleet (mirror.Store.Records),
// which would otherwise build two maps per GPU, and its allocations, only
// to drop them. Records may share their Traits slices; the index never
// writes into them nor keeps them.
type Record struct {
	UUID       string
	Name       string
	RootUUID   string // "" or UUID for a root provider
	Generation int
	Traits     []string // in any order
	// Class is the provider's vGPU resource class: the first of the
	// index's Classes it has an inventory of; "" for none (not a GPU).
	Class     string
	Inventory engine.Inventory // of Class
	Used      int              // usage of Class
}

// IsRoot reports whether r is the root of its tree.
func (r *Record) IsRoot() bool { return r.RootUUID == "" || r.RootUUID == r.UUID }

func (r *Record) root() string {
	if r.RootUUID == "" {
		return r.UUID
	}
	return r.RootUUID
}

// Record returns what the index reads of p.
func (x *Index) Record(p *engine.Provider) Record {
	r := Record{UUID: p.UUID, Name: p.Name, RootUUID: p.RootUUID, Generation: p.Generation, Traits: p.Traits}
	for _, c := range x.cfg.Classes {
		if inv, ok := p.Inventory[c]; ok {
			r.Class, r.Inventory, r.Used = c, inv, p.Usages[c]
			break
		}
	}
	return r
}

// Load replaces the whole index with providers. GPU IDs follow the order
// (host name, provider name, uuid).
func (x *Index) Load(providers []engine.Provider) {
	rs := make([]Record, len(providers))
	for i := range providers {
		rs[i] = x.Record(&providers[i])
	}
	x.LoadRecords(rs)
}

// LoadRecords is Load from records: it replaces the whole index with
// them.
func (x *Index) LoadRecords(rs []Record) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.reset()
	x.providers = len(rs)
	var gp []*Record
	for i := range rs {
		r := &rs[i]
		if r.IsRoot() {
			x.setHostLocked(r)
		}
		if r.Class != "" {
			gp = append(gp, r)
		}
	}
	name := func(r *Record) string {
		if h, ok := x.hosts[r.root()]; ok {
			return h.Name
		}
		return ""
	}
	slices.SortFunc(gp, func(a, b *Record) int {
		if c := strings.Compare(name(a), name(b)); c != 0 {
			return c
		}
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.UUID, b.UUID)
	})
	gp, byUUID := oneByUUID(gp)
	x.gpus = make([]*engine.GPU, 0, len(gp))
	for _, r := range gp {
		x.insertGPULocked(r) // its ID is its place in gp
	}
	x.byUUID = byUUID
}

// oneByUUID makes the records of one uuid one GPU, as upserts in gp's
// order would: in the place of the first, as the last says. It returns
// the places in the result by uuid.
func oneByUUID(gp []*Record) ([]*Record, []int32) {
	order := func() []int32 {
		byUUID := make([]int32, len(gp))
		for i := range byUUID {
			byUUID[i] = int32(i)
		}
		slices.SortFunc(byUUID, func(a, b int32) int {
			if c := strings.Compare(gp[a].UUID, gp[b].UUID); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		return byUUID
	}
	byUUID := order()
	dup := false
	for i := 0; i < len(byUUID); {
		j := i + 1
		for ; j < len(byUUID) && gp[byUUID[j]].UUID == gp[byUUID[i]].UUID; j++ {
			gp[byUUID[i]], gp[byUUID[j]], dup = gp[byUUID[j]], nil, true
		}
		i = j
	}
	if !dup {
		return gp, byUUID
	}
	gp = slices.DeleteFunc(gp, func(r *Record) bool { return r == nil })
	return gp, order()
}

// idOf finds the GPU with provider uuid u; i is where it is, or would
// be, in byUUID.
func (x *Index) idOf(u string) (id int32, i int, ok bool) {
	i, ok = slices.BinarySearchFunc(x.byUUID, u, func(id int32, u string) int { return strings.Compare(x.gpus[id].UUID, u) })
	if ok {
		id = x.byUUID[i]
	}
	return id, i, ok
}

// Apply inserts or updates one provider (a root, a GPU, or anything else).
func (x *Index) Apply(p engine.Provider) { x.ApplyRecord(x.Record(&p)) }

// ApplyRecord is Apply from a record.
func (x *Index) ApplyRecord(r Record) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if r.IsRoot() {
		x.setHostLocked(&r)
	}
	if r.Class != "" {
		x.upsertGPULocked(&r)
	} else if id, _, ok := x.idOf(r.UUID); ok {
		x.removeGPULocked(id)
	}
}

// Remove forgets a provider.
func (x *Index) Remove(uuid string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if id, _, ok := x.idOf(uuid); ok {
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
	id, _, ok := x.idOf(uuid)
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
	id, _, ok := x.idOf(uuid)
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

func (x *Index) setHostLocked(p *Record) {
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
	x.setHostTraitsLocked(h, x.sets.Intern(p.Traits))
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
// Both are shared (x.sets): Types is the run of Traits with the type
// prefix (sorted, they are contiguous).
func (x *Index) typedLocked(name, class string, own []string) (traits, types []string, fromReport bool) {
	traits = x.sets.Intern(own)
	types = x.typesOf(traits)
	if t := x.cfg.ClassTypes[class]; len(types) == 0 && t != "" {
		k, found := slices.BinarySearch(traits, t)
		if !found {
			with := make([]string, 0, len(traits)+1)
			traits = x.sets.Intern(append(append(append(with, traits[:k]...), t), traits[k:]...))
		}
		return traits, traits[k : k+1 : k+1], false
	}
	if t := x.reported.get(name); len(types) == 0 && t != "" {
		k, found := slices.BinarySearch(traits, t)
		if !found {
			with := make([]string, 0, len(traits)+1)
			traits = x.sets.Intern(append(append(append(with, traits[:k]...), t), traits[k:]...))
		}
		types, fromReport = traits[k:k+1:k+1], true
	}
	return traits, types, fromReport
}

// typesOf returns the type traits among sorted traits: a subslice, which
// cannot be appended to in place.
func (x *Index) typesOf(traits []string) []string {
	i := 0
	for i < len(traits) && !strings.HasPrefix(traits[i], x.cfg.TypePrefix) {
		i++
	}
	j := i
	for j < len(traits) && strings.HasPrefix(traits[j], x.cfg.TypePrefix) {
		j++
	}
	if i == j {
		return nil
	}
	return traits[i:j:j]
}

// SetReportedTypes gives each GPU without a type trait in Placement the
// type its host's agent reports (GPU provider name, as Nova names it →
// type trait), and takes it back from GPUs no longer in m.
func (x *Index) SetReportedTypes(m map[string]string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.reported.equal(m) {
		return
	}
	x.reported = x.keepReported(m)
	for _, g := range x.gpus {
		if g == nil {
			continue
		}
		own := g.Traits
		if g.TypeFromReport {
			own = slices.DeleteFunc(slices.Clone(g.Traits), func(t string) bool { return t == g.Types[0] })
		}
		traits, types, fromReport := x.typedLocked(g.Name, g.Class, own)
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

// reportedTypes maps GPU provider names to the type traits their
// agents report: a slice sorted by name rather than a map, as it holds
// one entry per GPU of the fleet (32 bytes each, where a map takes 40 to
// 80).
type reportedTypes []reportedType

type reportedType struct{ name, trait string }

func (r reportedTypes) find(name string) (int, bool) {
	return slices.BinarySearchFunc(r, name, func(e reportedType, name string) int { return strings.Compare(e.name, name) })
}

// get returns the trait reported for the GPU provider name ("" for none).
func (r reportedTypes) get(name string) string {
	if i, ok := r.find(name); ok {
		return r[i].trait
	}
	return ""
}

// equal reports whether r maps what m does.
func (r reportedTypes) equal(m map[string]string) bool {
	if len(r) != len(m) {
		return false
	}
	for k, v := range m {
		if i, ok := r.find(k); !ok || r[i].trait != v {
			return false
		}
	}
	return true
}

// keepReported copies m for x.reported: for the GPUs in the index, the
// name is their Name (one string for both), and each trait one string.
func (x *Index) keepReported(m map[string]string) reportedTypes {
	out := make(reportedTypes, 0, len(m))
	val := func(v string) string { return unique.Make(v).Value() }
	for _, g := range x.gpus {
		if g == nil {
			continue
		}
		if t, ok := m[g.Name]; ok {
			out = append(out, reportedType{g.Name, val(t)})
		}
	}
	slices.SortFunc(out, func(a, b reportedType) int { return strings.Compare(a.name, b.name) })
	out = slices.CompactFunc(out, func(a, b reportedType) bool { return a.name == b.name }) // (GPUs of one name)
	if len(out) < len(m) {
		n := len(out)
		for k, t := range m {
			if _, ok := out[:n].find(k); !ok {
				out = append(out, reportedType{k, val(t)})
			}
		}
		slices.SortFunc(out, func(a, b reportedType) int { return strings.Compare(a.name, b.name) })
	}
	return out
}

func (x *Index) newGPULocked(p *Record) *engine.GPU {
	traits, types, fromReport := x.typedLocked(p.Name, p.Class, p.Traits)
	return &engine.GPU{
		UUID:       p.UUID,
		Name:       p.Name,
		Host:       x.hostLocked(p.root()),
		Class:      p.Class,
		Inventory:  p.Inventory,
		Used:       p.Used,
		Generation: p.Generation,
		Traits:     traits,
		Types:      types,

		TypeFromReport: fromReport,
	}
}

func (x *Index) upsertGPULocked(p *Record) {
	g := x.newGPULocked(p)
	if id, i, ok := x.idOf(p.UUID); ok {
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
		x.addGPULocked(g)
		x.byUUID = slices.Insert(x.byUUID, i, g.ID)
	}
	x.traitLocked(g)
	x.bucketLocked(g)
}

// insertGPULocked adds a GPU of a Load (which keeps byUUID itself).
func (x *Index) insertGPULocked(p *Record) {
	g := x.newGPULocked(p)
	x.addGPULocked(g)
	x.traitLocked(g)
	x.bucketLocked(g)
}

// addGPULocked gives a new GPU its ID and its place on its host.
func (x *Index) addGPULocked(g *engine.GPU) {
	if n := len(x.freeIDs); n > 0 {
		g.ID = x.freeIDs[n-1]
		x.freeIDs = x.freeIDs[:n-1]
		x.gpus[g.ID] = g
	} else {
		g.ID = int32(len(x.gpus))
		x.gpus = append(x.gpus, g)
	}
	x.hostGPUs[g.Host.Name] = insert(x.hostGPUs[g.Host.Name], g.ID)
}

func (x *Index) removeGPULocked(id int32) {
	g := x.gpus[id]
	x.unbucketLocked(g)
	x.untraitLocked(g)
	x.hostGPUs[g.Host.Name] = remove(x.hostGPUs[g.Host.Name], id)
	if _, i, ok := x.idOf(g.UUID); ok {
		x.byUUID = slices.Delete(x.byUUID, i, i+1)
	}
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
	id, _, ok := x.idOf(u)
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

// TraitSets keeps one slice per distinct set of traits: a fleet's hosts
// carry the same few dozen traits, its GPUs one type trait each, so
// thousands of hosts and GPUs share a handful of slices instead of one
// copy each. The slices are sorted and never written once made; their
// capacity is their length, so that an append copies. The zero value is
// ready; a TraitSets is not safe for concurrent use.
type TraitSets struct {
	seed maphash.Seed
	m    map[uint64][][]string // by hash of the sorted set
	n    int
}

// maxTraitSets bounds a TraitSets: past it, the sets start over (those in
// use stay valid; later ones no longer share with them).
const maxTraitSets = 4096

// Reset forgets the sets.
func (s *TraitSets) Reset() { s.m, s.n = nil, 0 }

// Intern returns the shared sorted slice holding the traits of ts (nil
// for none); ts itself is never kept.
func (s *TraitSets) Intern(ts []string) []string {
	if len(ts) == 0 {
		return nil
	}
	if !slices.IsSorted(ts) {
		ts = slices.Clone(ts)
		slices.Sort(ts)
	}
	if s.m == nil {
		if s.seed == (maphash.Seed{}) {
			s.seed = maphash.MakeSeed()
		}
		s.m = map[uint64][][]string{}
	}
	var h maphash.Hash
	h.SetSeed(s.seed)
	for _, t := range ts {
		h.WriteString(t)
		h.WriteByte(0)
	}
	k := h.Sum64()
	for _, c := range s.m[k] {
		if slices.Equal(c, ts) {
			return c
		}
	}
	if s.n >= maxTraitSets {
		s.m, s.n = map[uint64][][]string{}, 0
	}
	c := make([]string, len(ts))
	copy(c, ts)
	s.m[k] = append(s.m[k], c)
	s.n++
	return c
}
