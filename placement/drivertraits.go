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
// GPU provider the guest driver traits its host's vGPU manager serves
// (GuestBranches, from the driver compatibility matrix and the version
// the host's agent reports): the missing ones are added and the ones of
// another branch (a vGPU manager upgraded) removed. It touches only traits
// of GuestDriverTraitPrefix, never an inventory; a provider whose host
// reports no version keeps what it has. A provider whose generation moved
// (409) is left for the next round. Each change is audited. It returns
// the providers changed.
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
	wantOf := map[hostDriver][]string{}
	for _, g := range s.index.GPUs() {
		if g.Host == nil {
			continue
		}
		d, ok := drivers[g.Host.Name]
		if !ok || d.version == "" {
			continue
		}
		want, ok := wantOf[d]
		if !ok {
			for _, b := range s.cfg.GuestBranches(d.hypervisor, d.version) {
				want = append(want, GuestDriverTrait(b))
			}
			slices.Sort(want)
			wantOf[d] = want
		}
		if slices.Equal(guestDriverTraits(g.Traits), want) {
			continue
		}
		cur, err := resourceproviders.GetTraits(ctx, sc, g.UUID).Extract()
		if err != nil {
			return changed, fmt.Errorf("traits of %s: %w", g.Name, err)
		}
		have := guestDriverTraits(cur.Traits)
		if slices.Equal(have, want) {
			continue // the mirror is behind: the next sync brings it
		}
		for _, t := range want {
			if !created[t] {
				if err := traits.Create(ctx, sc, t).ExtractErr(); err != nil {
					return changed, fmt.Errorf("create trait %s: %w", t, err)
				}
				created[t] = true
			}
		}
		next := slices.DeleteFunc(slices.Clone(cur.Traits), func(t string) bool { return strings.HasPrefix(t, GuestDriverTraitPrefix) })
		next = append(next, want...)
		_, err = resourceproviders.UpdateTraits(ctx, sc, g.UUID, resourceproviders.UpdateTraitsOpts{
			ResourceProviderGeneration: cur.ResourceProviderGeneration, Traits: next}).Extract()
		switch {
		case gophercloud.ResponseCodeIs(err, 409):
			continue
		case err != nil:
			return changed, fmt.Errorf("set the guest driver traits of %s: %w", g.Name, err)
		}
		changed++
		added, removed := diff(want, have), diff(have, want)
		s.log.Info("placement: guest driver traits set from the host's vGPU manager", "provider", g.Name,
			"driver_version", d.version, "added", added, "removed", removed)
		if s.cfg.Auditor != nil {
			detail := map[string]any{"provider": g.Name, "driver_version": d.version, "added": added, "removed": removed,
				"source": "agent report and driver compatibility matrix"}
			if err := s.cfg.Auditor.Audit(ctx, "placement.driver_traits", "resource_provider", g.UUID, detail); err != nil {
				return changed, fmt.Errorf("audit the traits of %s: %w", g.Name, err)
			}
		}
	}
	return changed, nil
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
