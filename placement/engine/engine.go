package engine

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// State is the fleet as the engine reads it. Implementations answer from
// memory and hold their own lock around a whole Decide call; IDs returned
// are sorted ascending. The key "" stands for every GPU.
type State interface {
	// GPU returns the GPU with that ID, or nil.
	GPU(id int32) *GPU
	// Bucket lists the usable GPUs carrying trait key (their own trait)
	// with exactly free units free.
	Bucket(key string, free int) []int32
	// MaxFree is the highest free value of a non-empty bucket of key, or -1.
	MaxFree(key string) int
	// Size counts the GPUs carrying trait key themselves.
	Size(key string) int
	// OnHosts reports whether some host (root provider) carries trait t.
	OnHosts(t string) bool
	// Empty lists the GPUs carrying trait key whose usage is zero.
	Empty(key string) []int32
	// HostGPUs lists the GPUs of the host named name.
	HostGPUs(name string) []int32
	// Types lists the vGPU type traits present on any GPU, sorted.
	Types() []string
}

// Strategy orders the candidates.
type Strategy string

// Strategies.
const (
	// Pack fills the fullest GPU that still has room (fewest free after).
	Pack Strategy = "pack"
	// Spread picks the emptiest GPU (most free after).
	Spread Strategy = "spread"
)

// Limits of a request.
const (
	DefaultLimit = 5
	MaxLimit     = 1000
)

// Request asks where Count units of a vGPU class fit.
type Request struct {
	Required     []string // traits the GPU (or its host) must carry; usually the type trait
	Forbidden    []string // traits neither the GPU nor its host may carry
	Count        int      // units; 0 means 1
	Hosts        []string // restrict to these hosts (root provider names); empty: all
	Strategy     Strategy // "" means Pack
	ExcludeGPUs  []string // provider UUIDs to skip (stale or unhealthy reports, drained)
	ExcludeHosts []string // host names to skip
	// ExcludeClasses are resource classes whose GPUs the request never
	// takes (the direct path: Nova-owned VF GPUs).
	ExcludeClasses []string
	AllowRetype    bool // also point at empty GPUs of another type that could serve
	Limit          int  // 0 means DefaultLimit
}

// Candidate is one ranked answer.
type Candidate struct {
	GPU         *GPU
	Free        int    // free units now
	FreeAfter   int    // free units after the request (for a retype: of the new type)
	NeedsRetype bool   // the GPU is empty but typed otherwise; an operator must re-type it
	RetypeFrom  string // its current type trait when NeedsRetype
	Reason      string
}

// RetypeFunc reports whether an empty GPU typed from could be re-typed to
// to and then hold count units; it returns the new capacity. Typically
// backed by the profile catalog: same GPU model, enough instances.
type RetypeFunc func(from, to string, count int) (capacity int, ok bool)

// Engine decides. The zero value uses DefaultTypePrefix and never
// proposes re-typing.
type Engine struct {
	TypePrefix string
	Retype     RetypeFunc
}

// ErrInvalidRequest wraps validation failures of a Request.
var ErrInvalidRequest = errors.New("invalid placement request")

// Normalize fills defaults and validates r.
func (e *Engine) Normalize(r Request) (Request, error) {
	if r.Count == 0 {
		r.Count = 1
	}
	if r.Count < 0 {
		return r, fmt.Errorf("%w: count %d is negative", ErrInvalidRequest, r.Count)
	}
	if r.Limit == 0 {
		r.Limit = DefaultLimit
	}
	if r.Limit < 0 || r.Limit > MaxLimit {
		return r, fmt.Errorf("%w: limit %d is outside 1..%d", ErrInvalidRequest, r.Limit, MaxLimit)
	}
	switch r.Strategy {
	case "":
		r.Strategy = Pack
	case Pack, Spread:
	default:
		return r, fmt.Errorf("%w: strategy %q is not pack or spread", ErrInvalidRequest, r.Strategy)
	}
	for _, t := range r.Required {
		for _, f := range r.Forbidden {
			if t == f {
				return r, fmt.Errorf("%w: trait %s is both required and forbidden", ErrInvalidRequest, t)
			}
		}
	}
	if n := len(e.requiredTypes(r)); n > 1 {
		return r, fmt.Errorf("%w: %d vGPU types required; a physical GPU holds one type", ErrInvalidRequest, n)
	}
	return r, nil
}

func (e *Engine) prefix() string {
	if e.TypePrefix == "" {
		return DefaultTypePrefix
	}
	return e.TypePrefix
}

// IsType reports whether t is a vGPU type trait.
func (e *Engine) IsType(t string) bool { return strings.HasPrefix(t, e.prefix()) }

func (e *Engine) requiredTypes(r Request) []string {
	var ts []string
	for _, t := range r.Required {
		if e.IsType(t) {
			ts = append(ts, t)
		}
	}
	return ts
}

// filter is a request compiled for per-GPU checks.
type filter struct {
	req          Request
	excludeGPUs  map[string]struct{}
	excludeHosts map[string]struct{}
	hosts        map[string]struct{}
	wantType     string
}

func (e *Engine) compile(r Request) *filter {
	f := &filter{req: r}
	if len(r.ExcludeGPUs) > 0 {
		f.excludeGPUs = make(map[string]struct{}, len(r.ExcludeGPUs))
		for _, u := range r.ExcludeGPUs {
			f.excludeGPUs[u] = struct{}{}
		}
	}
	if len(r.ExcludeHosts) > 0 {
		f.excludeHosts = make(map[string]struct{}, len(r.ExcludeHosts))
		for _, h := range r.ExcludeHosts {
			f.excludeHosts[h] = struct{}{}
		}
	}
	if len(r.Hosts) > 0 {
		f.hosts = make(map[string]struct{}, len(r.Hosts))
		for _, h := range r.Hosts {
			f.hosts[h] = struct{}{}
		}
	}
	if ts := e.requiredTypes(r); len(ts) == 1 {
		f.wantType = ts[0]
	}
	return f
}

// place reports whether g's location is allowed.
func (f *filter) place(g *GPU) bool {
	if len(f.req.ExcludeClasses) > 0 && slices.Contains(f.req.ExcludeClasses, g.Class) {
		return false
	}
	if f.excludeGPUs != nil {
		if _, ok := f.excludeGPUs[g.UUID]; ok {
			return false
		}
	}
	if f.excludeHosts != nil {
		if _, ok := f.excludeHosts[g.Host.Name]; ok {
			return false
		}
	}
	if f.hosts != nil {
		if _, ok := f.hosts[g.Host.Name]; !ok {
			return false
		}
	}
	return true
}

// direct reports whether g can take the request as it is typed now.
func (f *filter) direct(g *GPU) bool {
	if !g.Usable() || !g.Fits(f.req.Count) || !f.place(g) {
		return false
	}
	for _, t := range f.req.Required {
		if !g.HasTrait(t) && !g.Host.HasTrait(t) {
			return false
		}
	}
	for _, t := range f.req.Forbidden {
		if g.HasTrait(t) || g.Host.HasTrait(t) {
			return false
		}
	}
	return true
}

// retype reports whether empty g could take the request after re-typing,
// with its capacity then, and the type it has now.
func (e *Engine) retype(f *filter, g *GPU) (string, int, bool) {
	if e.Retype == nil || f.wantType == "" || g.Used != 0 || len(g.Types) == 0 || !f.place(g) || f.direct(g) {
		return "", 0, false
	}
	for _, t := range g.Types {
		if t == f.wantType {
			return "", 0, false // served directly, or not at all
		}
	}
	for _, t := range f.req.Required {
		if t == f.wantType {
			continue
		}
		if !g.HasTrait(t) && !g.Host.HasTrait(t) {
			return "", 0, false
		}
	}
	for _, t := range f.req.Forbidden {
		if (g.HasTrait(t) && !e.IsType(t)) || g.Host.HasTrait(t) {
			return "", 0, false
		}
	}
	for _, from := range g.Types {
		if c, ok := e.Retype(from, f.wantType, f.req.Count); ok && c >= f.req.Count {
			return from, c, true
		}
	}
	return "", 0, false
}

// Decide ranks the GPUs able to hold r, best first: GPUs that serve it as
// typed now, ordered by strategy then ID, then (with AllowRetype) empty
// GPUs that could after re-typing, by ID.
func (e *Engine) Decide(s State, r Request) ([]Candidate, error) {
	r, err := e.Normalize(r)
	if err != nil {
		return nil, err
	}
	f := e.compile(r)
	var out []Candidate
	if len(r.Hosts) > 0 {
		out = e.onHosts(s, f)
	} else {
		out = e.scan(s, f)
	}
	if len(out) < r.Limit && r.AllowRetype {
		out = append(out, e.retypes(s, f, r.Limit-len(out))...)
	}
	for i := range out {
		out[i].Reason = reason(r, &out[i])
	}
	return out, nil
}

// key picks the most selective own-trait index usable for f.
func (e *Engine) key(s State, f *filter) string {
	key, best := "", s.Size("")
	for _, t := range f.req.Required {
		if s.OnHosts(t) {
			continue // GPUs may inherit it from their host: not selective
		}
		if n := s.Size(t); n < best {
			key, best = t, n
		}
	}
	return key
}

func (e *Engine) scan(s State, f *filter) []Candidate {
	r := f.req
	key := e.key(s, f)
	max := s.MaxFree(key)
	out := make([]Candidate, 0, r.Limit)
	visit := func(free int) bool {
		for _, id := range s.Bucket(key, free) {
			g := s.GPU(id)
			if g == nil || !f.direct(g) {
				continue
			}
			out = append(out, Candidate{GPU: g, Free: free, FreeAfter: free - r.Count})
			if len(out) == r.Limit {
				return false
			}
		}
		return true
	}
	if r.Strategy == Spread {
		for free := max; free >= r.Count; free-- {
			if !visit(free) {
				break
			}
		}
	} else {
		for free := r.Count; free <= max; free++ {
			if !visit(free) {
				break
			}
		}
	}
	return out
}

func (e *Engine) onHosts(s State, f *filter) []Candidate {
	var out []Candidate
	seen := map[string]bool{}
	for _, h := range f.req.Hosts {
		if seen[h] {
			continue
		}
		seen[h] = true
		for _, id := range s.HostGPUs(h) {
			g := s.GPU(id)
			if g != nil && f.direct(g) {
				fr := g.Free()
				out = append(out, Candidate{GPU: g, Free: fr, FreeAfter: fr - f.req.Count})
			}
		}
	}
	Rank(out, f.req.Strategy)
	if len(out) > f.req.Limit {
		out = out[:f.req.Limit]
	}
	return out
}

func (e *Engine) retypes(s State, f *filter, need int) []Candidate {
	if e.Retype == nil || f.wantType == "" {
		return nil
	}
	var out []Candidate
	seen := map[int32]bool{}
	for _, from := range s.Types() {
		if from == f.wantType {
			continue
		}
		if _, ok := e.Retype(from, f.wantType, f.req.Count); !ok {
			continue
		}
		n := 0
		for _, id := range s.Empty(from) {
			if seen[id] {
				continue
			}
			g := s.GPU(id)
			if g == nil {
				continue
			}
			was, c, ok := e.retype(f, g)
			if !ok {
				continue
			}
			seen[id] = true
			out = append(out, Candidate{GPU: g, Free: 0, FreeAfter: c - f.req.Count, NeedsRetype: true, RetypeFrom: was})
			if n++; n == need {
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GPU.ID < out[j].GPU.ID })
	if len(out) > need {
		out = out[:need]
	}
	return out
}

// Rank sorts direct candidates by strategy, then GPU ID.
func Rank(c []Candidate, st Strategy) {
	sort.Slice(c, func(i, j int) bool {
		a, b := c[i], c[j]
		if a.FreeAfter != b.FreeAfter {
			if st == Spread {
				return a.FreeAfter > b.FreeAfter
			}
			return a.FreeAfter < b.FreeAfter
		}
		return a.GPU.ID < b.GPU.ID
	})
}

func reason(r Request, c *Candidate) string {
	g := c.GPU
	switch {
	case c.NeedsRetype:
		return fmt.Sprintf("empty GPU typed %s; re-typed it could hold %d unit(s), %d left after", c.RetypeFrom, r.Count, c.FreeAfter)
	case r.Strategy == Spread:
		return fmt.Sprintf("spread: %d of %d %s free, %d left after", c.Free, g.Capacity(), g.Class, c.FreeAfter)
	case g.Used > 0:
		return fmt.Sprintf("pack: GPU already in use, %d of %d %s free, %d left after", c.Free, g.Capacity(), g.Class, c.FreeAfter)
	default:
		return fmt.Sprintf("pack: no partly used GPU fits better; %d of %d %s free, %d left after", c.Free, g.Capacity(), g.Class, c.FreeAfter)
	}
}
