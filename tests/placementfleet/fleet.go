// Package placementfleet loads a fleet of compute nodes with GPU child
// providers (VGPU inventory, type traits, used units) into the real
// Placement service, for the placement integration tests (tests/placement),
// the CLI tests and the bench harness (tests/bench/placement).
package placementfleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"
)

// GPU describes one physical GPU to create.
type GPU struct {
	Trait    string // its vGPU type trait
	Total    int
	Reserved int
	MaxUnit  int // default Total
	StepSize int // default 1
	Ratio    float32
	Used     int // held by an existing consumer (which also holds VCPU on the root)
	Extra    []string
}

// Node is one compute node (a root provider) and its GPUs.
type Node struct {
	Name   string
	Traits []string
	GPUs   []GPU
}

// Fleet is what Load created; Cleanup deletes it.
type Fleet struct {
	sc        *gophercloud.ServiceClient
	Roots     []string   // root provider uuids, by node
	GPUs      [][]string // GPU provider uuids, by node
	Consumers []string   // consumers created for Used
	Project   string
	User      string
	traits    []string
}

// Load creates nodes in Placement with concurrency workers.
func Load(ctx context.Context, sc *gophercloud.ServiceClient, nodes []Node, workers int) (*Fleet, error) {
	f := &Fleet{sc: sc, Roots: make([]string, len(nodes)), GPUs: make([][]string, len(nodes)),
		Project: uuid.NewString(), User: uuid.NewString()}
	seen := map[string]bool{}
	for _, n := range nodes {
		for _, t := range n.Traits {
			seen[t] = true
		}
		for _, g := range n.GPUs {
			seen[g.Trait] = true
			for _, t := range g.Extra {
				seen[t] = true
			}
		}
	}
	for t := range seen {
		if len(t) > 7 && t[:7] == "CUSTOM_" {
			if err := traits.Create(ctx, sc, t).ExtractErr(); err != nil {
				return f, fmt.Errorf("create trait %s: %w", t, err)
			}
			f.traits = append(f.traits, t)
		}
	}
	if workers <= 0 {
		workers = 8
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	work := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				root, gpus, cons, err := f.loadNode(ctx, nodes[i])
				mu.Lock()
				f.Roots[i], f.GPUs[i] = root, gpus
				f.Consumers = append(f.Consumers, cons...)
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	for i := range nodes {
		work <- i
	}
	close(work)
	wg.Wait()
	return f, firstErr
}

func (f *Fleet) loadNode(ctx context.Context, n Node) (string, []string, []string, error) {
	root := uuid.NewString()
	if _, err := resourceproviders.Create(ctx, f.sc, resourceproviders.CreateOpts{Name: n.Name, UUID: root}).Extract(); err != nil {
		return "", nil, nil, fmt.Errorf("create %s: %w", n.Name, err)
	}
	inv := resourceproviders.UpdateInventoriesOpts{ResourceProviderGeneration: 0, Inventories: map[string]resourceproviders.Inventory{
		"VCPU":      {Total: 64, MinUnit: 1, MaxUnit: 64, StepSize: 1, AllocationRatio: 4},
		"MEMORY_MB": {Total: 262144, MinUnit: 1, MaxUnit: 262144, StepSize: 1, AllocationRatio: 1},
	}}
	r, err := resourceproviders.UpdateInventories(ctx, f.sc, root, inv).Extract()
	if err != nil {
		return root, nil, nil, fmt.Errorf("inventory of %s: %w", n.Name, err)
	}
	if len(n.Traits) > 0 {
		if _, err := resourceproviders.UpdateTraits(ctx, f.sc, root, resourceproviders.UpdateTraitsOpts{ResourceProviderGeneration: r.ResourceProviderGeneration, Traits: n.Traits}).Extract(); err != nil {
			return root, nil, nil, fmt.Errorf("traits of %s: %w", n.Name, err)
		}
	}
	var gpus, cons []string
	for i, g := range n.GPUs {
		id := uuid.NewString()
		name := fmt.Sprintf("%s_pci_0000_%02x_00_0", n.Name, 0x3b+i)
		if _, err := resourceproviders.Create(ctx, f.sc, resourceproviders.CreateOpts{Name: name, UUID: id, ParentProviderUUID: root}).Extract(); err != nil {
			return root, gpus, cons, fmt.Errorf("create %s: %w", name, err)
		}
		gpus = append(gpus, id)
		maxUnit, step, ratio := g.MaxUnit, g.StepSize, g.Ratio
		if maxUnit == 0 {
			maxUnit = g.Total
		}
		if step == 0 {
			step = 1
		}
		if ratio == 0 {
			ratio = 1
		}
		r, err := resourceproviders.UpdateInventories(ctx, f.sc, id, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
			"VGPU": {Total: g.Total, Reserved: g.Reserved, MinUnit: 1, MaxUnit: maxUnit, StepSize: step, AllocationRatio: ratio},
		}}).Extract()
		if err != nil {
			return root, gpus, cons, fmt.Errorf("inventory of %s: %w", name, err)
		}
		tr := append([]string{g.Trait}, g.Extra...)
		if _, err := resourceproviders.UpdateTraits(ctx, f.sc, id, resourceproviders.UpdateTraitsOpts{ResourceProviderGeneration: r.ResourceProviderGeneration, Traits: tr}).Extract(); err != nil {
			return root, gpus, cons, fmt.Errorf("traits of %s: %w", name, err)
		}
		if g.Used > 0 {
			c := uuid.NewString()
			err := allocations.Update(ctx, f.sc, c, allocations.UpdateOpts{
				Allocations: map[string]allocations.ProviderAllocationsOpts{
					root: {Resources: map[string]int{"VCPU": 2, "MEMORY_MB": 2048}},
					id:   {Resources: map[string]int{"VGPU": g.Used}},
				},
				ProjectID: f.Project, UserID: f.User, ConsumerType: "INSTANCE",
			}).ExtractErr()
			if err != nil {
				return root, gpus, cons, fmt.Errorf("allocate on %s: %w", name, err)
			}
			cons = append(cons, c)
		}
	}
	return root, gpus, cons, nil
}

// AllGPUs lists every GPU provider uuid.
func (f *Fleet) AllGPUs() []string {
	var out []string
	for _, g := range f.GPUs {
		out = append(out, g...)
	}
	return out
}

// Cleanup deletes the extra consumers' allocations, then every provider
// (children first), then the traits. Each consumer in extra is deleted too.
func (f *Fleet) Cleanup(ctx context.Context, extra ...string) error {
	var errs []error
	for _, c := range append(append([]string(nil), f.Consumers...), extra...) {
		if err := allocations.Delete(ctx, f.sc, c).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
			errs = append(errs, fmt.Errorf("delete allocations of %s: %w", c, err))
		}
	}
	sem := make(chan struct{}, 8)
	var mu sync.Mutex
	var wg sync.WaitGroup
	del := func(ids []string) {
		for _, id := range ids {
			if id == "" {
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go func(id string) {
				defer wg.Done()
				defer func() { <-sem }()
				var err error
				for try := 0; try < 5; try++ {
					if err = resourceproviders.Delete(ctx, f.sc, id).ExtractErr(); err == nil || gophercloud.ResponseCodeIs(err, 404) {
						err = nil
						break
					}
					time.Sleep(time.Duration(try+1) * 100 * time.Millisecond)
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("delete provider %s: %w", id, err))
					mu.Unlock()
				}
			}(id)
		}
		wg.Wait()
	}
	del(f.AllGPUs())
	del(f.Roots)
	for _, t := range f.traits {
		if err := traits.Delete(ctx, f.sc, t).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) && !gophercloud.ResponseCodeIs(err, 409) {
			errs = append(errs, fmt.Errorf("delete trait %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// UniqueType returns a vGPU type trait no other test uses.
func UniqueType() string {
	return "CUSTOM_NVIDIA_T" + strings.ToUpper(uuid.NewString()[:8])
}
