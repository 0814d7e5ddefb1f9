package main

// The bridge-owned VF GPU case of the runs: the first host's fake host
// also has the H200-like SR-IOV GPU of fakehost.DefaultSpec (8 VFs, none
// typed), declared bridge-owned for H200X-35C ([placement]
// bridge_owned_gpus, 4 per GPU) in the bench's bridge. After the
// warm-up, its provider is published (PublishOwned, as the syncing
// replica does) and -latency-requests signed GPU_REQUESTs for H200X-35C
// go one at a time to two instances of that host kept for it, each
// released (GPU_RELEASE, not timed) before the next (each body with a
// nonce: a signed body acts once): webhook POST →
// request finished (the CUSTOM_VGPU_BRIDGE claim, the agent typing a
// free VF and hot-plugging it), p50 and p99, printed beside the mdev
// attach p50 of the runs.

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

const (
	vfPF        = "0000:c1:00.0"
	vfTypeID    = "1430" // H200X-35C, 4 per GPU
	vfProfile   = "H200X-35C"
	vfInstances = 2 // on the first host, beside its perHost instances
)

// vfSpec gives a fake host the H200-like VF GPU, no VF typed.
func vfSpec(spec *fakehost.Spec) {
	g := fakehost.DefaultSpec().VFIOGPUs[0]
	g.Current = nil
	spec.VFIOGPUs = []fakehost.VFIOGPU{g}
}

// vfExtra is how many more instances host hi gets for the VF case.
func (h *harness) vfExtra(hi int) int {
	if h.vf && hi == 0 {
		return vfInstances
	}
	return 0
}

// ownedVF is the bench's [placement] bridge_owned_gpus.
func (h *harness) ownedVF() []placement.OwnedDecl {
	if !h.vf || len(h.hosts) == 0 {
		return nil
	}
	return []placement.OwnedDecl{{Host: h.hosts[0].name, PCI: vfPF, TypeID: vfTypeID}}
}

// vfLatency publishes the VF GPU's provider and returns webhook POST →
// finished of n sequential attaches on it, each released before the next.
func (h *harness) vfLatency(ctx context.Context, n int) ([]time.Duration, error) {
	hs := h.hosts[0]
	insts := hs.instances[h.perHost:]
	if _, err := h.svc.PublishOwned(ctx); err != nil {
		return nil, fmt.Errorf("publish the VF GPU: %w", err)
	}
	name := placement.GPUProviderName(hs.node, vfPF)
	ps, err := h.svc.Client().Providers(ctx, placement.ListOpts{Name: name})
	if err != nil {
		return nil, err
	}
	if len(ps) != 1 {
		return nil, fmt.Errorf("provider %s of the VF GPU: %d found", name, len(ps))
	}
	rp := ps[0].UUID
	// Before the hosts' providers go (cleanups run last first): the VF
	// instances' allocations, then the provider, a child of the root.
	h.cleanups = append(h.cleanups, func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, in := range insts {
			allocations.Delete(cctx, h.sc, in).ExtractErr() //nolint:errcheck
		}
		if err := resourceproviders.Delete(cctx, h.sc, rp).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
			fmt.Fprintf(os.Stderr, "bench e2e: the VF GPU's provider %s not deleted: %v\n", rp, err)
		}
	})
	var out []time.Duration
	for i := range n {
		inst := insts[i%len(insts)]
		t0 := time.Now()
		id, err := h.send(ctx, []byte(`{"type":"GPU_REQUEST","vm_id":"`+inst+`","workload":"inference","vgpu_profile":"`+vfProfile+`","count":1,"nonce":"`+uuid.NewString()+`"}`))
		if err != nil {
			return nil, fmt.Errorf("VF attach: %w", err)
		}
		fin, err := h.waitAll(ctx, []uuid.UUID{id}, time.Minute)
		if err != nil {
			return nil, fmt.Errorf("VF attach: %w", err)
		}
		out = append(out, fin[id].Sub(t0))
		rel, err := h.send(ctx, []byte(`{"type":"GPU_RELEASE","vm_id":"`+inst+`","nonce":"`+uuid.NewString()+`"}`))
		if err != nil {
			return nil, fmt.Errorf("VF release: %w", err)
		}
		if _, err := h.waitAll(ctx, []uuid.UUID{rel}, time.Minute); err != nil {
			return nil, fmt.Errorf("VF release: %w", err)
		}
	}
	return out, nil
}

// printVF prints the VF attach figures beside the mdev attach p50.
func printVF(lat []time.Duration, runs int, mdevP50 float64) {
	if len(lat) == 0 {
		return
	}
	p50 := ms(pct(lat, 50))
	fmt.Printf("webhook→attached p50: mdev GPU (%s, median of %d runs) %.1f ms | bridge-owned VF GPU (%s, vendor VFIO, %d sequential, each released before the next) %.1f ms, p99 %.1f ms; ratio VF/mdev %.2f×\n",
		profile, runs, mdevP50, vfProfile, len(lat), p50, ms(pct(lat, 99)), p50/mdevP50)
}
