package placement

import (
	"context"
	"fmt"
	"slices"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

// faultTraitTries bounds the generation conflicts (409) one provider's
// fault trait change retries in a round.
const faultTraitTries = 4

// readFaulted returns the provider UUIDs of the GPUs marked for a fault
// (gpus.fault_reason, bridge/controls Store.GPUFaults), with the reason.
func (s *Service) readFaulted(ctx context.Context) (map[string]string, error) {
	rows, err := s.store.Pool().Query(ctx, `SELECT provider_uuid::text, fault_reason FROM gpus WHERE fault_reason IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, reason string
		if err := rows.Scan(&id, &reason); err != nil {
			return nil, err
		}
		out[id] = reason
	}
	return out, rows.Err()
}

// SyncFaultTraits keeps nova.GPUFaultTrait on exactly the GPU providers
// whose GPU is marked for a fault: added to a marked GPU's provider,
// removed from one an operator undrained. It runs on every GPU provider,
// Nova-owned ones included, with no opt-in (the one exception to the rule
// that the bridge leaves Nova's providers' traits alone), and touches
// only that trait, never an inventory. Each write carries the provider's
// generation; a conflict (409) reads the traits again and retries. Each
// change is audited. It returns the providers changed.
//
// The trait itself is created at the first sync, before any fault:
// Placement answers 400 "No such trait(s)" to an allocation candidates
// query that forbids a trait it does not know, so every flavor that
// forbids it (as `vgpuctl flavor plan` makes them) would end NoValidHost
// until a first fault.
func (s *Service) SyncFaultTraits(ctx context.Context) (int, error) {
	if s.store == nil {
		return 0, nil
	}
	sc := s.client.ServiceClient()
	if !s.faultTrait.Load() {
		if err := traits.Create(ctx, sc, nova.GPUFaultTrait).ExtractErr(); err != nil {
			return 0, fmt.Errorf("create trait %s: %w", nova.GPUFaultTrait, err)
		}
		s.faultTrait.Store(true)
	}
	faulted, err := s.readFaulted(ctx)
	if err != nil {
		return 0, fmt.Errorf("faulted GPUs: %w", err)
	}
	changed := 0
	for _, g := range s.index.GPUs() {
		reason, want := faulted[g.UUID]
		if slices.Contains(g.Traits, nova.GPUFaultTrait) == want {
			continue
		}
		done := false
		for try := 0; try < faultTraitTries && !done; try++ {
			cur, err := resourceproviders.GetTraits(ctx, sc, g.UUID).Extract()
			if err != nil {
				return changed, fmt.Errorf("traits of %s: %w", g.Name, err)
			}
			if slices.Contains(cur.Traits, nova.GPUFaultTrait) == want {
				break // the mirror is behind: the next sync brings it
			}
			next := slices.DeleteFunc(slices.Clone(cur.Traits), func(t string) bool { return t == nova.GPUFaultTrait })
			if want {
				next = append(next, nova.GPUFaultTrait)
			}
			_, err = resourceproviders.UpdateTraits(ctx, sc, g.UUID, resourceproviders.UpdateTraitsOpts{
				ResourceProviderGeneration: cur.ResourceProviderGeneration, Traits: next}).Extract()
			switch {
			case gophercloud.ResponseCodeIs(err, 409):
				continue // the provider changed under us (Nova's resource tracker): read it again
			case err != nil:
				return changed, fmt.Errorf("set the fault trait of %s: %w", g.Name, err)
			}
			done = true
		}
		if !done {
			continue
		}
		changed++
		action := "placement.fault_trait_add"
		if !want {
			action = "placement.fault_trait_remove"
		}
		s.log.Info("placement: GPU fault trait "+map[bool]string{true: "added", false: "removed"}[want], "provider", g.Name,
			"trait", nova.GPUFaultTrait, "fault", reason)
		if s.cfg.Auditor != nil {
			detail := map[string]any{"provider": g.Name, "trait": nova.GPUFaultTrait, "fault": reason,
				"source": "GPU fault mark (agent report; vgpuctl gpu undrain clears it)"}
			if err := s.cfg.Auditor.Audit(ctx, action, "resource_provider", g.UUID, detail); err != nil {
				return changed, fmt.Errorf("audit the fault trait of %s: %w", g.Name, err)
			}
		}
	}
	return changed, nil
}
