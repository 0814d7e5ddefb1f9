// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/novaconf"
)

// NovaGPUs are host's Nova-owned mdev GPUs as the bridge knows them: each
// mdev GPU of its agent's last report (not a vendor-VFIO GPU, not a
// bridge-owned one) with its current type (the type its agent's
// allow-list, a copy of Nova's [devices] enabled_mdev_types, enables
// there; else the type of its vGPUs; else its provider's type trait), the
// types it can create, its vGPUs, and its provider in the Placement
// mirror (<node>_pci_<address>, as Nova's libvirt driver names it).
func (s *Service) NovaGPUs(ctx context.Context, host string) ([]novaconf.GPU, error) {
	_, gpus, err := s.novaGPUs(ctx, host)
	return gpus, err
}

// novaGPUs is NovaGPUs of a compute host or node (a mirror that has not
// read the host's row yet knows its node only), with the host's name.
func (s *Service) novaGPUs(ctx context.Context, hostOrNode string) (string, []novaconf.GPU, error) {
	host := hostOrNode
	if s.store != nil {
		// The host whose node it is, when it is not a host's name.
		_ = s.store.Pool().QueryRow(ctx, `SELECT name FROM hosts WHERE name = $1 OR node = $1 ORDER BY name = $1 DESC LIMIT 1`,
			hostOrNode).Scan(&host)
	}
	r, err := s.hostReport(ctx, host)
	if err != nil {
		return host, nil, err
	}
	node := r.Node
	if node == "" {
		node = host
	}
	byName := map[string]engine.GPU{}
	s.index.View(func(st engine.State) {
		for _, id := range st.HostGPUs(node) {
			if g := st.GPU(id); g != nil {
				byName[g.Name] = *g
			}
		}
	})
	var out []novaconf.GPU
	for _, g := range r.GPUs {
		if g.VendorVFIO || g.PCI == "" {
			continue
		}
		if _, owned := s.ownedDecl(host, g.PCI); owned {
			continue
		}
		ng := novaconf.GPU{PCI: strings.ToLower(g.PCI), Provider: GPUProviderName(node, strings.ToLower(g.PCI)), InUse: len(g.Active)}
		for _, t := range g.Types {
			ng.Creatable = append(ng.Creatable, t.ID)
		}
		var typed []string // the types its provider's traits name
		if p, ok := byName[ng.Provider]; ok {
			ng.ProviderUUID = p.UUID
			if !p.TypeFromReport {
				typed = p.Types
			}
			if len(typed) == 1 {
				ng.Trait = typed[0]
			}
		}
		switch {
		case g.EnabledType != "":
			ng.Type = g.EnabledType
		case len(g.Active) > 0:
			ng.Type = g.Active[0].TypeID
		case ng.Trait != "":
			for _, id := range ng.Creatable {
				if catalog.TraitFor(id) == ng.Trait {
					ng.Type = id
				}
			}
		}
		if ng.Trait == "" && ng.Type != "" && slices.Contains(typed, catalog.TraitFor(ng.Type)) {
			ng.Trait = catalog.TraitFor(ng.Type)
		}
		out = append(out, ng)
	}
	return host, out, nil
}

// NovaRetype is the nova.conf change that gives host's Nova-owned GPUs
// want (PCI address → mdev type): see package novaconf. allowInUse:
// describe a GPU with vGPUs too (a dry run's answer); a run refuses it.
func (s *Service) NovaRetype(ctx context.Context, host string, want map[string]string, allowInUse bool) (novaconf.Change, error) {
	gpus, err := s.NovaGPUs(ctx, host)
	if err != nil {
		return novaconf.Change{}, err
	}
	norm := make(map[string]string, len(want))
	for p, t := range want {
		norm[strings.ToLower(p)] = t
	}
	c, err := novaconf.Compute(host, gpus, norm, catalog.TraitFor, allowInUse)
	if err != nil {
		return c, fmt.Errorf("nova.conf change of %s: %w", host, err)
	}
	return c, nil
}

// RetypeCommand is the vgpuctl command that re-types GPU pci of host to
// typeID host by host with drain and verify.
func RetypeCommand(host, pci, typeID string) string {
	return fmt.Sprintf("vgpuctl fleet retype --gpu %s/%s=%s", host, strings.ToLower(pci), typeID)
}

// ExplainRetypes adds to each needs_retype candidate of out on a
// Nova-owned mdev GPU the nova.conf change of its host and the vgpuctl
// command that applies it. A candidate the bridge cannot explain (its
// host's report lacks the GPU or the type) is left as it is.
func (s *Service) ExplainRetypes(ctx context.Context, out *DryRunResponse) {
	type known struct {
		host string
		gpus []novaconf.GPU
		err  error
	}
	seen := map[string]known{} // a host's report is read once per answer
	for i := range out.Candidates {
		c := &out.Candidates[i]
		if !c.NeedsRetype || c.PCIAddress == "" || c.Trait == "" || s.store == nil {
			continue
		}
		k, ok := seen[c.Host]
		if !ok {
			k.host, k.gpus, k.err = s.novaGPUs(ctx, c.Host)
			seen[c.Host] = k
		}
		host, gpus := k.host, k.gpus
		if k.err != nil {
			continue
		}
		j := slices.IndexFunc(gpus, func(g novaconf.GPU) bool { return strings.EqualFold(g.PCI, c.PCIAddress) })
		if j < 0 {
			continue
		}
		to := ""
		for _, id := range gpus[j].Creatable {
			if catalog.TraitFor(id) == c.Trait {
				to = id
			}
		}
		if to == "" {
			continue
		}
		ch, err := novaconf.Compute(host, gpus, map[string]string{gpus[j].PCI: to}, catalog.TraitFor, true)
		if err != nil {
			continue
		}
		c.NovaConf, c.RetypeCommand = &ch, RetypeCommand(host, gpus[j].PCI, to)
	}
}
