package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// BridgeClass is the resource class of the GPU providers the bridge owns
// (bridge-owned GPUs: GPUs Nova does not manage). Nova's vGPU flavors ask
// for resources:VGPU=N, which never matches it, so Nova's scheduler never
// places a server on a bridge-owned GPU; only the bridge's direct path
// claims it. A flavor would have to name resources:CUSTOM_VGPU_BRIDGE=1
// to reach it, and `vgpuctl flavor plan` never prints one that does.
const BridgeClass = "CUSTOM_VGPU_BRIDGE"

// BridgeFBClass is the resource class of a mixed bridge-owned GPU
// (declared HOST/PF=mixed: the driver's heterogeneous mode, vGPU types of
// different framebuffer sizes on one GPU): its inventory is the GPU's
// framebuffer in MiB, and a vGPU takes its type's framebuffer of it, so
// Placement refuses what does not fit. Only the bridge's direct path
// claims it (ClaimMixed); the bridge's index never ranks it.
const BridgeFBClass = "CUSTOM_VGPU_BRIDGE_FB_MIB"

// MixedType is the TYPE of a mixed declaration (HOST/PF=mixed).
const MixedType = "mixed"

// OwnedDecl declares one GPU of a compute host bridge-owned ("HOST/PCI=TYPE"
// in [placement] bridge_owned_gpus): a vendor-VFIO GPU (its physical
// function) offering vGPUs of the numeric TypeID on its VFs; or, with
// TypeID MixedType ("HOST/PF=mixed"), vGPUs of every type its agent
// reports, framebuffer being the limit; or an mdev GPU (a GPU its agent
// reports with mdev types and no VFs) offering mdevs of TypeID, an mdev
// type id such as nvidia-231.
type OwnedDecl struct {
	Host   string // Nova's compute service host (the agent's [DEFAULT] host)
	PCI    string // the GPU: the PF of a VF GPU, 0000:c1:00.0
	TypeID string // 1430 (VF GPU); nvidia-231 (mdev GPU); or MixedType
}

// Mixed reports whether d declares a mixed (heterogeneous) GPU.
func (d OwnedDecl) Mixed() bool { return d.TypeID == MixedType }

// Mdev reports whether d declares an mdev GPU (its type is an mdev type,
// not a numeric vendor-VFIO one): its vGPUs are mdevs the agent creates
// on the GPU, not VFs.
func (d OwnedDecl) Mdev() bool { return !d.Mixed() && IsMdevType(d.TypeID) }

func (d OwnedDecl) String() string { return d.Host + "/" + d.PCI + "=" + d.TypeID }

// IsMdevType reports whether typeID names an mdev type (nvidia-231, as
// mdev_supported_types lists them) rather than a numeric vendor-VFIO
// type (1430, as a VF's creatable_vgpu_types lists them); "" is neither.
func IsMdevType(typeID string) bool {
	return typeID != "" && strings.Trim(typeID, "0123456789") != ""
}

// reMdevType is what an mdev type id looks like: a directory name of
// mdev_supported_types, the parent driver's name (lower case, as the
// kernel's drivers are named), a dash and the type's (nvidia-231,
// i915-GVTg_V5_4). A profile name given for a type (T4-2Q, H200X-35C) is
// none.
var reMdevType = regexp.MustCompile(`^[a-z0-9_]+-[A-Za-z0-9_.-]+$`)

// ValidTypeID reports whether id can be a bridge-owned GPU's type: a
// numeric vendor-VFIO type id or an mdev type id.
func ValidTypeID(id string) bool {
	return id != "" && (!IsMdevType(id) || reMdevType.MatchString(id))
}

// ParseOwnedDecl parses "HOST/PCI=TYPE" (fake-compute-0/0000:c1:00.0=1430
// for a VF GPU, fake-compute-0/0000:d8:00.0=nvidia-231 for an mdev GPU)
// or "HOST/PF=mixed".
func ParseOwnedDecl(s string) (OwnedDecl, error) {
	hostPCI, typ, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok {
		return OwnedDecl{}, fmt.Errorf("%q: want HOST/PCI=TYPE", s)
	}
	i := strings.LastIndex(hostPCI, "/")
	if i <= 0 || i == len(hostPCI)-1 {
		return OwnedDecl{}, fmt.Errorf("%q: want HOST/PCI=TYPE", s)
	}
	d := OwnedDecl{Host: hostPCI[:i], PCI: strings.ToLower(hostPCI[i+1:]), TypeID: typ}
	if engine.PCIAddress(GPUProviderName("n", d.PCI)) == "" {
		return OwnedDecl{}, fmt.Errorf("%q: %q is not a PCI address (DDDD:BB:SS.F)", s, d.PCI)
	}
	switch {
	case strings.EqualFold(d.TypeID, MixedType):
		d.TypeID = MixedType
	case !ValidTypeID(d.TypeID):
		return OwnedDecl{}, fmt.Errorf("%q: %q is not a numeric vendor-VFIO type id, an mdev type id (nvidia-231) or %s", s, d.TypeID, MixedType)
	}
	return d, nil
}

// ownedReportGPU is the GPU of the agent's report that the declaration
// of pci names, of the kind its type says (a vendor-VFIO GPU for a
// numeric type or mixed, an mdev GPU for an mdev type): false when the
// report has none.
func ownedReportGPU(r protocol.Report, pci, typeID string) (protocol.GPU, bool) {
	vf := !(OwnedDecl{TypeID: typeID}).Mdev()
	for _, g := range r.GPUs {
		if g.VendorVFIO == vf && g.PhysFn == "" && strings.EqualFold(g.PCI, pci) {
			return g, true
		}
	}
	return protocol.GPU{}, false
}

// OwnedTypeTrait is the type trait of a single-type bridge-owned GPU
// among its provider's traits: the one named as catalog.TraitFor names a
// vendor-VFIO type (CUSTOM_ and the numeric type id, CUSTOM_1430), which
// [placement] type_trait_prefix (CUSTOM_NVIDIA_ by default) does not
// match; "" when there is none (a re-type withdrew it).
func OwnedTypeTrait(traits []string) string {
	for _, t := range traits {
		if id, ok := strings.CutPrefix(t, "CUSTOM_"); ok && id != "" && strings.Trim(id, "0123456789") == "" {
			return t
		}
	}
	return ""
}

// OwnedGPU is what the bridge publishes for one bridge-owned GPU: a child
// provider of the compute node's provider, named as Nova names a GPU's
// (GPUProviderName), with Total units of BridgeClass and the type's trait;
// for a mixed GPU (Mixed), Total MiB of BridgeFBClass and Traits.
type OwnedGPU struct {
	Node  string // the compute node's provider name
	PCI   string // the PF
	Trait string // the type trait, catalog.TraitFor(type id)
	// Mixed: a mixed GPU; Total is MiB of BridgeFBClass: the GPU's
	// framebuffer less what VFs Nova typed hold, and Traits are the
	// traits of every type the agent reports on the GPU.
	Mixed  bool
	Traits []string
	// Total is how many vGPUs of the type the GPU holds or can still
	// hold: its VFs typed with it by the agent (the bridge's vGPUs) and
	// the free VFs that can still take it (creatable_vgpu_types). The
	// VFs Nova typed are not counted.
	Total int
}

// OwnedFromReport is what the declared GPUs of one host's report are
// worth in Placement; a declared GPU the report lacks, or reports of
// another kind (a VF GPU declared with an mdev type, an mdev GPU with a
// numeric one), is left out.
func OwnedFromReport(decls []OwnedDecl, host string, r protocol.Report) []OwnedGPU {
	node := r.Node
	if node == "" {
		node = host
	}
	var out []OwnedGPU
	for _, d := range decls {
		if d.Host != host {
			continue
		}
		if g, ok := ownedReportGPU(r, d.PCI, d.TypeID); ok {
			if d.Mixed() {
				if m, ok := mixedFromReport(node, d.PCI, g); ok {
					out = append(out, m)
				}
				continue
			}
			// The units the type can still take (free VFs, or mdevs the
			// GPU can still create) and the bridge's vGPUs of it.
			total := 0
			for _, t := range g.Types {
				if t.ID == d.TypeID {
					total += t.AvailableInstances
				}
			}
			for _, a := range g.Active {
				if a.TypeID == d.TypeID && a.Owner == protocol.OwnerAgent {
					total++
				}
			}
			out = append(out, OwnedGPU{Node: node, PCI: d.PCI, Trait: catalog.TraitFor(d.TypeID), Total: total})
		}
	}
	return out
}

// mixedFromReport is a mixed GPU's worth: its framebuffer (NVML's total;
// without NVML, the most any of its types fills: framebuffer × max
// instances) less the framebuffer of the VFs another owner (Nova) typed,
// and the traits of its types; false when the report tells no
// framebuffer.
func mixedFromReport(node, pci string, g protocol.GPU) (OwnedGPU, bool) {
	fb := map[string]int{}
	total := 0
	var trs []string
	for _, t := range g.Types {
		if t.FramebufferMiB <= 0 {
			continue
		}
		fb[t.ID] = t.FramebufferMiB
		total = max(total, t.FramebufferMiB*max(t.MaxInstances, 1))
		trs = append(trs, catalog.TraitFor(t.ID))
	}
	if g.MemoryTotalMiB != nil && *g.MemoryTotalMiB > 0 {
		total = int(*g.MemoryTotalMiB)
	}
	for _, a := range g.Active {
		if a.Owner != protocol.OwnerAgent {
			total -= fb[a.TypeID]
		}
	}
	if len(trs) == 0 || total <= 0 {
		return OwnedGPU{}, false
	}
	slices.Sort(trs)
	return OwnedGPU{Node: node, PCI: pci, Mixed: true, Traits: slices.Compact(trs), Total: total}, true
}

// ErrNotOwned says a provider with the name of a bridge-owned GPU exists
// and is not the bridge's (it has inventory of another class, or another
// parent): the bridge leaves it alone.
var ErrNotOwned = errors.New("provider exists and is not the bridge's")

// PublishOwned brings the providers of the bridge-owned GPUs that the
// agents' last reports (the hosts table) show in line with them
// (PublishGPU), then syncs the changed ones into the mirror and the
// index. The reports are read first, Placement is written after: no
// Placement call is made inside a database transaction. It returns how
// many providers it changed.
func (s *Service) PublishOwned(ctx context.Context) (int, error) {
	if len(s.cfg.OwnedGPUs) == 0 || s.store == nil {
		return 0, nil
	}
	// Re-types a stopped bridge left are finished first; a GPU whose
	// re-type cannot finish yet is left as it is (offering nothing).
	stuck, resumeErr := s.resumeRetypes(ctx)
	if stuck == nil {
		return 0, resumeErr
	}
	decls, err := s.ownedDecls(ctx, stuck)
	if err != nil {
		return 0, err
	}
	hosts := make([]string, 0, len(decls))
	for _, d := range decls {
		if !slices.Contains(hosts, d.Host) {
			hosts = append(hosts, d.Host)
		}
	}
	rows, err := s.store.Pool().Query(ctx, `SELECT name, report FROM hosts WHERE name = ANY($1) AND report IS NOT NULL`, hosts)
	if err != nil {
		return 0, fmt.Errorf("bridge-owned GPUs: hosts: %w", err)
	}
	var gpus []OwnedGPU
	for rows.Next() {
		var host string
		var raw []byte
		if err := rows.Scan(&host, &raw); err != nil {
			rows.Close()
			return 0, fmt.Errorf("bridge-owned GPUs: hosts: %w", err)
		}
		var r protocol.Report
		if err := json.Unmarshal(raw, &r); err != nil {
			s.log.Warn("placement: bridge-owned GPUs: unreadable report", logkey.Host, host, logkey.Err, err)
			continue
		}
		gpus = append(gpus, OwnedFromReport(decls, host, r)...)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("bridge-owned GPUs: hosts: %w", err)
	}
	changed := 0
	firstErr := resumeErr
	for _, g := range gpus {
		did, _, err := s.PublishGPU(ctx, g)
		if err != nil {
			s.log.Warn("placement: bridge-owned GPU not published", "node", g.Node, "pci", g.PCI, logkey.Err, err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if did {
			changed++
		}
	}
	if changed > 0 {
		if _, err := s.SyncNow(ctx, false, nil); err != nil && !errors.Is(err, ErrSyncBusy) && firstErr == nil {
			firstErr = err
		}
	}
	return changed, firstErr
}

// PublishGPU makes g's provider as Neutron's agents make theirs: found by
// name under the compute node's provider, or created there (POST
// /resource_providers with parent_provider_uuid); then its inventory of
// BridgeClass and its traits are written when they differ, each under the
// provider's generation (a conflict is read again and retried). Those are
// the only inventories the bridge writes, on providers it created. It
// reports whether it changed anything, and the provider's uuid.
func (s *Service) PublishGPU(ctx context.Context, g OwnedGPU) (bool, string, error) {
	sc := s.client.ServiceClient()
	roots, err := s.client.Providers(ctx, ListOpts{Name: g.Node})
	if err != nil {
		return false, "", err
	}
	if len(roots) != 1 {
		return false, "", fmt.Errorf("compute node provider %q: %d found (Nova registers it)", g.Node, len(roots))
	}
	root := roots[0].UUID
	// Nova reports the VFs of a GPU in its [pci] device_spec (with
	// report_in_placement) under a provider of the PF named
	// <node>_<ADDRESS> (nova.compute.pci_placement_translator.
	// PlacementView._get_rp_name_for_address): such a GPU is Nova's.
	novaName := g.Node + "_" + strings.ToUpper(g.PCI)
	if ps, err := s.client.Providers(ctx, ListOpts{Name: novaName}); err != nil {
		return false, "", err
	} else if len(ps) > 0 {
		return false, "", fmt.Errorf("GPU %s of %s: %w: Nova reports its VFs in Placement (provider %s, [pci] device_spec); "+
			"take it out of [placement] bridge_owned_gpus", g.PCI, g.Node, ErrNotOwned, novaName)
	}
	name := GPUProviderName(g.Node, g.PCI)
	changed := false
	rp, err := s.ownedProvider(ctx, name, root)
	if err != nil {
		return false, "", err
	}
	if rp == "" {
		p, err := resourceproviders.Create(ctx, sc, resourceproviders.CreateOpts{Name: name, ParentProviderUUID: root}).Extract()
		if gophercloud.ResponseCodeIs(err, 409) { // another replica made it meanwhile
			rp, err = s.ownedProvider(ctx, name, root)
			if err == nil && rp == "" {
				err = fmt.Errorf("provider %s: created meanwhile, then gone", name)
			}
			if err != nil {
				return false, "", err
			}
		} else if err != nil {
			return false, "", fmt.Errorf("create provider %s: %w", name, classify("POST /resource_providers", err))
		} else {
			rp, changed = p.UUID, true
			s.log.Info("placement: bridge-owned GPU provider created", "provider", name, logkey.Provider, rp, "parent", root)
		}
	}
	class, wantTraits := BridgeClass, []string{g.Trait}
	if g.Mixed {
		class, wantTraits = BridgeFBClass, g.Traits
		s.mixedRPs.Store(rp, g.PCI)
	}
	if err := ensureClass(ctx, sc, class); err != nil {
		return changed, rp, err
	}
	for _, t := range wantTraits {
		if err := traits.Create(ctx, sc, t).ExtractErr(); err != nil {
			return changed, rp, fmt.Errorf("create trait %s: %w", t, classify("PUT /traits/{name}", err))
		}
	}
	// With no VF left for the type, the inventory stays with its units
	// reserved: deleting it would fail while vGPUs are allocated, and
	// Placement wants a total of at least 1.
	want := engine.Inventory{Total: max(g.Total, 1), Reserved: max(g.Total, 1) - g.Total, MinUnit: 1, MaxUnit: max(g.Total, 1), StepSize: 1, AllocationRatio: 1}
	for attempt := 0; ; attempt++ {
		inv, gen, err := s.client.Inventories(ctx, rp)
		if err != nil {
			return changed, rp, err
		}
		cur, ok := inv[class]
		if ok && len(inv) == 1 && cur == want {
			break
		}
		err = putInventory(ctx, sc, rp, gen, map[string]engine.Inventory{class: want})
		if err == nil {
			changed = true
			s.log.Info("placement: bridge-owned GPU inventory written", "provider", name, "class", class, "total", g.Total)
			break
		}
		if !IsConflict(err) || attempt >= 4 {
			return changed, rp, fmt.Errorf("inventory of %s: %w", name, err)
		}
	}
	for attempt := 0; ; attempt++ {
		cur, gen, err := s.client.Traits(ctx, rp)
		if err != nil {
			return changed, rp, err
		}
		if slices.Equal(slices.Sorted(slices.Values(cur)), slices.Sorted(slices.Values(wantTraits))) {
			break
		}
		_, err = resourceproviders.UpdateTraits(ctx, sc, rp, resourceproviders.UpdateTraitsOpts{ResourceProviderGeneration: gen, Traits: wantTraits}).Extract()
		if err == nil {
			changed = true
			s.log.Info("placement: bridge-owned GPU traits set", "provider", name, "traits", wantTraits)
			break
		}
		if !gophercloud.ResponseCodeIs(err, 409) || attempt >= 4 {
			return changed, rp, fmt.Errorf("traits of %s: %w", name, classify("PUT /resource_providers/{uuid}/traits", err))
		}
	}
	return changed, rp, nil
}

// ownedProvider finds the provider named name: "" when there is none; an
// error wrapping ErrNotOwned when it is not a bridge-owned GPU's (another
// parent, or inventory of another class).
func (s *Service) ownedProvider(ctx context.Context, name, root string) (string, error) {
	ps, err := s.client.Providers(ctx, ListOpts{Name: name})
	if err != nil || len(ps) == 0 {
		return "", err
	}
	p := ps[0]
	if p.ParentUUID != root {
		return "", fmt.Errorf("provider %s: %w: its parent is %s, not the compute node's %s", name, ErrNotOwned, p.ParentUUID, root)
	}
	inv, _, err := s.client.Inventories(ctx, p.UUID)
	if err != nil {
		return "", err
	}
	for c := range maps.Keys(inv) {
		if c != BridgeClass && c != BridgeFBClass {
			return "", fmt.Errorf("provider %s: %w: it has %s inventory (Nova's?)", name, ErrNotOwned, c)
		}
	}
	return p.UUID, nil
}

// putInventory replaces rp's inventories (PUT
// /resource_providers/{uuid}/inventories) under generation gen.
func putInventory(ctx context.Context, sc *gophercloud.ServiceClient, rp string, gen int, inv map[string]engine.Inventory) error {
	body := map[string]any{"resource_provider_generation": gen, "inventories": inv}
	_, err := sc.Put(ctx, sc.ServiceURL("resource_providers", rp, "inventories"), body, nil, &gophercloud.RequestOpts{OkCodes: []int{200}})
	return classify("PUT /resource_providers/{uuid}/inventories", err)
}

// ensureClass creates the custom resource class when missing (PUT
// /resource_classes/{name}, microversion 1.7+: 201 or 204).
func ensureClass(ctx context.Context, sc *gophercloud.ServiceClient, class string) error {
	_, err := sc.Put(ctx, sc.ServiceURL("resource_classes", class), nil, nil, &gophercloud.RequestOpts{OkCodes: []int{201, 204}})
	return classify("PUT /resource_classes/{name}", err)
}
