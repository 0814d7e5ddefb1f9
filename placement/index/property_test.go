package index_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/index"
)

var (
	types      = []string{"CUSTOM_NVIDIA_222", "CUSTOM_NVIDIA_223", "CUSTOM_NVIDIA_232", "CUSTOM_NVIDIA_700"}
	gpuTraits  = []string{"CUSTOM_FAST", "CUSTOM_NVLINK"}
	hostTraits = []string{"COMPUTE_STATUS_DISABLED", "CUSTOM_ZONE_A", "CUSTOM_FAST"}
)

// retypeAll lets the first three types (one GPU model) re-type into each
// other with capacity 8.
func retypeAll(from, to string, count int) (int, bool) {
	same := func(t string) bool { return t != "CUSTOM_NVIDIA_700" }
	if same(from) && same(to) && count <= 8 {
		return 8, true
	}
	return 0, false
}

func pick[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

func subset(r *rand.Rand, s []string, p float64) []string {
	var out []string
	for _, t := range s {
		if r.Float64() < p {
			out = append(out, t)
		}
	}
	return out
}

// randomFleet builds hosts × up to 4 GPUs with random inventories.
func randomFleet(r *rand.Rand, hosts int) []engine.Provider {
	var ps []engine.Provider
	for h := 0; h < hosts; h++ {
		root := fmt.Sprintf("00000000-0000-0000-0000-%012d", h)
		ps = append(ps, engine.Provider{
			UUID: root, Name: fmt.Sprintf("node-%03d", r.IntN(hosts*2)), RootUUID: root,
			Traits:    subset(r, hostTraits, 0.2),
			Inventory: map[string]engine.Inventory{"VCPU": {Total: 32, AllocationRatio: 16, MaxUnit: 32, StepSize: 1, MinUnit: 1}},
		})
		for g := 0; g < 1+r.IntN(4); g++ {
			total := pick(r, []int{1, 2, 4, 8, 16})
			inv := engine.Inventory{
				Total: total, Reserved: r.IntN(2), MinUnit: 1, MaxUnit: total, StepSize: 1,
				AllocationRatio: pick(r, []float64{1, 1, 1, 1.5}),
			}
			if r.IntN(5) == 0 {
				inv.MaxUnit = 1 + r.IntN(total)
			}
			if r.IntN(8) == 0 {
				inv.StepSize = 2
			}
			tr := subset(r, gpuTraits, 0.3)
			switch r.IntN(10) {
			case 0: // untyped
			case 1: // two types: usable only while empty
				tr = append(tr, types[0], types[1])
			default:
				tr = append(tr, pick(r, types))
			}
			used := 0
			if c := inv.Capacity(); c > 0 && r.IntN(3) > 0 {
				used = r.IntN(c + 1)
			}
			ps = append(ps, engine.Provider{
				UUID: fmt.Sprintf("%08d-0000-0000-0000-%012d", g+1, h), Name: fmt.Sprintf("gpu_pci_0000_%02x_00_0", g),
				ParentUUID: root, RootUUID: root, Traits: tr,
				Inventory: map[string]engine.Inventory{"VGPU": inv},
				Usages:    map[string]int{"VGPU": used},
			})
		}
	}
	return ps
}

func randomRequest(r *rand.Rand, gpus []engine.GPU) engine.Request {
	q := engine.Request{
		Count:       1 + r.IntN(3),
		Strategy:    pick(r, []engine.Strategy{engine.Pack, engine.Spread, ""}),
		Limit:       1 + r.IntN(6),
		AllowRetype: r.IntN(2) == 0,
	}
	if r.IntN(6) > 0 {
		q.Required = append(q.Required, pick(r, types))
	}
	if r.IntN(4) == 0 {
		q.Required = append(q.Required, pick(r, append(slices.Clone(gpuTraits), hostTraits...)))
	}
	if r.IntN(3) == 0 {
		f := pick(r, append(slices.Clone(gpuTraits), hostTraits...))
		if !slices.Contains(q.Required, f) {
			q.Forbidden = append(q.Forbidden, f)
		}
	}
	if len(gpus) > 0 {
		if r.IntN(4) == 0 {
			q.Hosts = []string{pick(r, gpus).Host.Name, pick(r, gpus).Host.Name}
		}
		for i := r.IntN(4); i > 0; i-- {
			q.ExcludeGPUs = append(q.ExcludeGPUs, pick(r, gpus).UUID)
		}
		if r.IntN(4) == 0 {
			q.ExcludeHosts = []string{pick(r, gpus).Host.Name}
		}
	}
	return q
}

// reference answers a request by looking at every GPU.
func reference(gpus []engine.GPU, q engine.Request) []engine.Candidate {
	if q.Count == 0 {
		q.Count = 1
	}
	if q.Limit == 0 {
		q.Limit = engine.DefaultLimit
	}
	has := func(g *engine.GPU, t string) bool {
		return slices.Contains(g.Traits, t) || slices.Contains(g.Host.Traits, t)
	}
	place := func(g *engine.GPU) bool {
		if slices.Contains(q.ExcludeGPUs, g.UUID) || slices.Contains(q.ExcludeHosts, g.Host.Name) {
			return false
		}
		return len(q.Hosts) == 0 || slices.Contains(q.Hosts, g.Host.Name)
	}
	direct := func(g *engine.GPU) bool {
		inv := g.Inventory
		if len(g.Types) > 1 && g.Used > 0 {
			return false
		}
		if q.Count < inv.MinUnit || (inv.MaxUnit > 0 && q.Count > inv.MaxUnit) || (inv.StepSize > 1 && q.Count%inv.StepSize != 0) {
			return false
		}
		if q.Count > g.Free() || !place(g) {
			return false
		}
		for _, t := range q.Required {
			if !has(g, t) {
				return false
			}
		}
		for _, t := range q.Forbidden {
			if has(g, t) {
				return false
			}
		}
		return true
	}
	var out []engine.Candidate
	for i := range gpus {
		g := &gpus[i]
		if direct(g) {
			out = append(out, engine.Candidate{GPU: g, Free: g.Free(), FreeAfter: g.Free() - q.Count})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.FreeAfter != b.FreeAfter {
			if q.Strategy == engine.Spread {
				return a.FreeAfter > b.FreeAfter
			}
			return a.FreeAfter < b.FreeAfter
		}
		return a.GPU.ID < b.GPU.ID
	})
	if len(out) > q.Limit {
		out = out[:q.Limit]
	}
	want := ""
	for _, t := range q.Required {
		if strings.HasPrefix(t, engine.DefaultTypePrefix) {
			want = t
		}
	}
	if !q.AllowRetype || want == "" {
		return out
	}
	for i := range gpus {
		if len(out) >= q.Limit {
			break
		}
		g := &gpus[i]
		if g.Used != 0 || len(g.Types) == 0 || slices.Contains(g.Types, want) || !place(g) || direct(g) {
			continue
		}
		ok := true
		for _, t := range q.Required {
			if t != want && !has(g, t) {
				ok = false
			}
		}
		for _, t := range q.Forbidden {
			if slices.Contains(g.Host.Traits, t) || (slices.Contains(g.Traits, t) && !slices.Contains(g.Types, t)) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		for _, from := range g.Types {
			if c, ok := retypeAll(from, want, q.Count); ok {
				out = append(out, engine.Candidate{GPU: g, FreeAfter: c - q.Count, NeedsRetype: true, RetypeFrom: from})
				break
			}
		}
	}
	return out
}

type brief struct {
	UUID      string
	FreeAfter int
	Retype    bool
	From      string
}

func briefs(cs []engine.Candidate) []brief {
	out := make([]brief, len(cs))
	for i, c := range cs {
		out[i] = brief{c.GPU.UUID, c.FreeAfter, c.NeedsRetype, c.RetypeFrom}
	}
	return out
}

func check(t *testing.T, x *index.Index, e *engine.Engine, r *rand.Rand, round int) {
	t.Helper()
	gpus := x.GPUs()
	for i := 0; i < 50; i++ {
		q := randomRequest(r, gpus)
		got, err := x.Decide(e, q)
		if err != nil {
			t.Fatalf("round %d: Decide(%+v): %v", round, q, err)
		}
		want := reference(gpus, q)
		if g, w := briefs(got), briefs(want); !slices.Equal(g, w) {
			t.Fatalf("round %d: request %+v\n got %+v\nwant %+v", round, q, g, w)
		}
		for _, c := range got {
			if c.Reason == "" {
				t.Fatalf("candidate %s has no reason", c.GPU.UUID)
			}
		}
	}
}

// TestEngineMatchesReference compares the indexed engine with a brute-force
// scan on random fleets, then again after random incremental updates.
func TestEngineMatchesReference(t *testing.T) {
	e := &engine.Engine{Retype: retypeAll}
	for seed := uint64(1); seed <= 60; seed++ {
		r := rand.New(rand.NewPCG(seed, 42))
		fleet := randomFleet(r, 1+r.IntN(25))
		x := index.New(index.Config{})
		x.Load(fleet)
		check(t, x, e, r, 0)
		// Incremental updates: usage changes, re-applied providers, removals.
		for round := 1; round <= 5; round++ {
			for k := 0; k < 10; k++ {
				p := fleet[r.IntN(len(fleet))]
				switch r.IntN(4) {
				case 0:
					if inv, ok := p.Inventory["VGPU"]; ok {
						x.SetUsage(p.UUID, r.IntN(inv.Capacity()+2), p.Generation+1)
					}
				case 1:
					if _, ok := p.Inventory["VGPU"]; ok {
						p.Traits = append(subset(r, gpuTraits, 0.5), pick(r, types))
					} else {
						p.Traits = subset(r, hostTraits, 0.5)
						p.Name = fmt.Sprintf("renamed-%d", r.IntN(5))
					}
					x.Apply(p)
				case 2:
					if !p.IsRoot() {
						x.Remove(p.UUID)
					}
				case 3:
					x.Apply(p)
				}
			}
			check(t, x, e, r, round)
		}
	}
}
