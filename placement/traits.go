package placement

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"
)

// AddTypeTraits writes to Placement the type the index learned from an
// agent's report (GPU.TypeFromReport) as the GPU provider's trait, so
// that Nova's scheduler sees it too: the trait is created when missing
// and added to the provider's traits under its generation. It never
// removes a trait and never touches an inventory; a provider that gained
// a type trait meanwhile, or whose generation moved (409), is left for
// the next round. Each trait added is audited. It returns how many it
// added.
func (s *Service) AddTypeTraits(ctx context.Context) (int, error) {
	sc := s.client.ServiceClient()
	created := map[string]bool{}
	added := 0
	for _, g := range s.index.GPUs() {
		if !g.TypeFromReport || len(g.Types) != 1 {
			continue
		}
		t := g.Types[0]
		if !created[t] {
			if err := traits.Create(ctx, sc, t).ExtractErr(); err != nil {
				return added, fmt.Errorf("create trait %s: %w", t, err)
			}
			created[t] = true
		}
		cur, err := resourceproviders.GetTraits(ctx, sc, g.UUID).Extract()
		if err != nil {
			return added, fmt.Errorf("traits of %s: %w", g.Name, err)
		}
		if slices.ContainsFunc(cur.Traits, func(x string) bool { return strings.HasPrefix(x, s.cfg.TypePrefix) }) {
			continue // typed meanwhile: the next sync brings it
		}
		_, err = resourceproviders.UpdateTraits(ctx, sc, g.UUID, resourceproviders.UpdateTraitsOpts{
			ResourceProviderGeneration: cur.ResourceProviderGeneration, Traits: append(slices.Clone(cur.Traits), t)}).Extract()
		switch {
		case gophercloud.ResponseCodeIs(err, 409):
			continue // the provider changed under us: next round
		case err != nil:
			return added, fmt.Errorf("add trait %s to %s: %w", t, g.Name, err)
		}
		added++
		s.log.Info("placement: type trait added from the agent's report", "provider", g.Name, "trait", t)
		if s.cfg.Auditor != nil {
			detail := map[string]string{"trait": t, "provider": g.Name, "source": "agent report"}
			if err := s.cfg.Auditor.Audit(ctx, "placement.trait_add", "resource_provider", g.UUID, detail); err != nil {
				return added, fmt.Errorf("audit the trait of %s: %w", g.Name, err)
			}
		}
	}
	return added, nil
}
