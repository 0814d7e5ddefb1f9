package placement

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// GuestDriverTraitPrefix starts the traits that say which guest driver
// release branches a GPU's host serves (nova.GuestDriverTraitPrefix, where
// vgpuctl flavor plan finds it too).
const GuestDriverTraitPrefix = nova.GuestDriverTraitPrefix

// GuestDriverTrait is the trait of guest driver branch b.
func GuestDriverTrait(branch int) string { return nova.GuestDriverTrait(branch) }

// hostDriver is what a host's agent last reported of its vGPU manager.
type hostDriver struct{ hypervisor, version string }

// readHostDrivers maps each host's node (its Placement root provider
// name) to its agent's last reported hypervisor and vGPU manager version.
func readHostDrivers(ctx context.Context, pool *pgxpool.Pool) (map[string]hostDriver, error) {
	rows, err := pool.Query(ctx, `SELECT coalesce(node, name), coalesce(report->>'hypervisor', ''), coalesce(report->>'driver_version', '')
		FROM hosts WHERE report IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]hostDriver{}
	for rows.Next() {
		var node string
		var d hostDriver
		if err := rows.Scan(&node, &d.hypervisor, &d.version); err != nil {
			return nil, err
		}
		out[node] = d
	}
	return out, rows.Err()
}

// SyncDriverTraits (opt-in, [placement] add_driver_traits) keeps on each
// GPU provider, and on the compute node (root) provider of its host, the
// guest driver traits the host's vGPU manager serves (GuestBranches, from
// the driver compatibility matrix and the version the host's agent
// reports): the missing ones are added and the ones of another branch (a
// vGPU manager upgraded) removed. The vGPU manager is one per host, so the
// branches are the host's as much as its GPUs': on the root they meet an
// image's trait:...=required, which Nova puts in the unnumbered request
// group, while a flavor asks for the vGPU in a numbered one. It touches
// only traits of GuestDriverTraitPrefix, never an inventory; a provider
// whose host reports no version keeps what it has. A provider whose
// generation moved (409) is left for the next round. Each change is
// audited. It returns the providers changed.
func (s *Service) SyncDriverTraits(ctx context.Context) (int, error) {
	if s.store == nil || s.cfg.GuestBranches == nil {
		return 0, nil
	}
	drivers, err := readHostDrivers(ctx, s.store.Pool())
	if err != nil {
		return 0, fmt.Errorf("hosts' driver versions: %w", err)
	}
	sc := s.client.ServiceClient()
	created := map[string]bool{}
	changed := 0
	for _, p := range driverTraitTargets(s.index.GPUs(), drivers, s.cfg.GuestBranches) {
		added, removed, ok, err := setGuestDriverTraits(ctx, sc, p.uuid, p.want, created)
		if err != nil {
			return changed, fmt.Errorf("the guest driver traits of %s: %w", p.name, err)
		}
		if !ok {
			continue
		}
		changed++
		s.log.Info("placement: guest driver traits set from the host's vGPU manager", "provider", p.name,
			"compute_node", p.root, "driver_version", p.version, "added", added, "removed", removed)
		if s.cfg.Auditor != nil {
			detail := map[string]any{"provider": p.name, "driver_version": p.version, "added": added, "removed": removed,
				"source": "agent report and driver compatibility matrix"}
			if p.root {
				detail["compute_node"] = true
			}
			if err := s.cfg.Auditor.Audit(ctx, "placement.driver_traits", "resource_provider", p.uuid, detail); err != nil {
				return changed, fmt.Errorf("audit the traits of %s: %w", p.name, err)
			}
		}
	}
	return changed, nil
}

// driverTraitTarget is a provider whose guest driver traits are to be
// want (sorted): a GPU's, or its host's compute node (root).
type driverTraitTarget struct {
	uuid, name, version string
	root                bool
	want                []string
}

// driverTraitTargets are the providers, among gpus and their hosts' roots
// (each root once), whose guest driver traits (as the index has them)
// differ from those their host's vGPU manager serves. A GPU of a host
// that reports no driver version is left out, and so is its root.
func driverTraitTargets(gpus []engine.GPU, drivers map[string]hostDriver, branches func(hypervisor, version string) []int) []driverTraitTarget {
	wantOf := map[hostDriver][]string{}
	roots := map[string]bool{}
	var out []driverTraitTarget
	for i := range gpus {
		g := &gpus[i]
		if g.Host == nil {
			continue
		}
		d, ok := drivers[g.Host.Name]
		if !ok || d.version == "" {
			continue
		}
		want, ok := wantOf[d]
		if !ok {
			for _, b := range branches(d.hypervisor, d.version) {
				want = append(want, GuestDriverTrait(b))
			}
			slices.Sort(want)
			wantOf[d] = want
		}
		if !slices.Equal(guestDriverTraits(g.Traits), want) {
			out = append(out, driverTraitTarget{uuid: g.UUID, name: g.Name, version: d.version, want: want})
		}
		// The compute node: Nova's resource tracker keeps the traits it
		// does not own (see setGuestDriverTraits).
		if h := g.Host; h.RootUUID != "" && !roots[h.RootUUID] {
			roots[h.RootUUID] = true
			if !slices.Equal(guestDriverTraits(h.Traits), want) {
				out = append(out, driverTraitTarget{uuid: h.RootUUID, name: h.Name, version: d.version, root: true, want: want})
			}
		}
	}
	return out
}

// setGuestDriverTraits makes the guest driver traits of provider uuid
// want (sorted), read afresh from Placement: it creates the traits of
// want not yet in created, keeps every trait of another prefix, and
// writes with the provider's generation. ok is false when nothing was
// written: the provider had them already (the index is behind), or its
// generation moved (409: the next round retries).
//
// On a compute node (root) provider the traits stay: Nova 26's
// ResourceTracker._update_to_placement rebuilds the root's traits with
// _get_traits from the ProviderTree, which holds the traits read back
// from Placement (SchedulerReportClient._refresh_associations) plus the
// driver's own, and it adds or removes only the driver's capability
// traits, COMPUTE_NODE and COMPUTE_STATUS_DISABLED ("a
// CUSTOM_VENDOR_TRAIT_X which we can't touch because it was set
// externally"); SchedulerReportClient.update_from_provider_tree then
// writes the traits only when they differ from its cache, and on a 409
// (its cache older than our write) clears the tree's cache (catch_all)
// and _update_to_placement redrives from the traits read afresh.
func setGuestDriverTraits(ctx context.Context, sc *gophercloud.ServiceClient, uuid string, want []string, created map[string]bool) (added, removed []string, ok bool, err error) {
	cur, err := resourceproviders.GetTraits(ctx, sc, uuid).Extract()
	if err != nil {
		return nil, nil, false, fmt.Errorf("read the traits: %w", err)
	}
	have := guestDriverTraits(cur.Traits)
	if slices.Equal(have, want) {
		return nil, nil, false, nil
	}
	for _, t := range want {
		if !created[t] {
			if err := traits.Create(ctx, sc, t).ExtractErr(); err != nil {
				return nil, nil, false, fmt.Errorf("create trait %s: %w", t, err)
			}
			created[t] = true
		}
	}
	next := slices.DeleteFunc(slices.Clone(cur.Traits), func(t string) bool { return strings.HasPrefix(t, GuestDriverTraitPrefix) })
	next = append(next, want...)
	_, err = resourceproviders.UpdateTraits(ctx, sc, uuid, resourceproviders.UpdateTraitsOpts{
		ResourceProviderGeneration: cur.ResourceProviderGeneration, Traits: next}).Extract()
	switch {
	case gophercloud.ResponseCodeIs(err, 409):
		return nil, nil, false, nil
	case err != nil:
		return nil, nil, false, fmt.Errorf("write the traits: %w", err)
	}
	return diff(want, have), diff(have, want), true, nil
}

// guestDriverTraits are the sorted guest driver traits among ts.
func guestDriverTraits(ts []string) []string {
	var out []string
	for _, t := range ts {
		if strings.HasPrefix(t, GuestDriverTraitPrefix) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// diff is what a holds and b does not.
func diff(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
