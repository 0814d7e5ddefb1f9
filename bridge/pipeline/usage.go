package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/clock"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// AccountFlavor keeps the usage of the vGPUs an instance's flavor gives
// it (requests.SyncFlavorUsage) as each of Nova's instance notifications
// says the instance stands, at the time Nova gives: a launch, a resize
// to or from a vGPU flavor, a move to another host, a shelve offload and
// a delete each end one interval and begin the next. It never finishes
// the event, and runs in observe-only mode too (accounting acts on
// nothing).
//
// Nova's time is bounded by the bridge's clock (novaTime): an interval
// never ends after the bridge received its end, so a clock running ahead
// adds no seconds. A delete ends the instance's intervals whatever its
// time, never before they began, and after the bridge received a delete
// no later event gives the instance vGPUs again.
type AccountFlavor struct {
	// Catalog names the profiles of flavors' traits (may be nil).
	Catalog Catalog
	// ClockSkew is [pipeline] clock_skew_tolerance (novaTime).
	ClockSkew time.Duration
	// NovaVFAliases are the PCI aliases of Nova-owned VF GPUs
	// (Config.NovaVFAliases): a flavor's pci_passthrough:alias naming one
	// gives vGPUs of its type (novaVFs).
	NovaVFAliases map[string]placement.NovaVFAlias
}

// Exec implements Stage.
func (a AccountFlavor) Exec(ctx context.Context, w *Work) (bool, error) {
	h, ok := flavorHolding(a.Catalog, a.NovaVFAliases, w.Row)
	if !ok {
		return false, nil
	}
	if len(h.VGPUs) > 0 {
		var gone bool
		if err := w.Tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM events WHERE instance_uuid = $1 AND id < $2 AND source = $3
				AND event_type = 'instance.delete.end')`, w.Row.InstanceUUID, w.Row.ID, w.Row.Source).Scan(&gone); err != nil {
			return false, fmt.Errorf("deletes of %s: %w", w.Row.InstanceUUID, err)
		}
		if gone {
			h.VGPUs, h.Deleted = nil, true
		}
	}
	_, err := requests.SyncFlavorUsage(ctx, w.Tx, h, novaTime(w.Row, a.ClockSkew))
	return false, err
}

// eventTime is the time the policy evaluates a row at. A sender's time
// (an alert's startsAt or endsAt) is never later than the bridge's
// receipt, however far ahead its clock; a Nova notification's is novaTime;
// the bridge's own rows keep theirs.
func eventTime(row InboxRow, tol time.Duration) time.Time {
	switch {
	case row.Source == BridgeSource:
		return row.OccurredAt
	case !row.Webhook():
		return novaTime(row, tol)
	case !row.ReceivedAt.IsZero() && row.OccurredAt.After(row.ReceivedAt):
		return row.ReceivedAt
	}
	return row.OccurredAt
}

// novaTime is the time a Nova event is taken to have happened, for its
// usage and as the policy's clock: Nova's timestamp, kept between tol
// before the bridge received the event and its receipt. A notification
// that waited in the broker longer than tol counts from tol before it was
// received; one without a timestamp is taken at its receipt.
func novaTime(row InboxRow, tol time.Duration) time.Time {
	switch {
	case row.ReceivedAt.IsZero():
		return row.OccurredAt
	case row.OccurredAt.IsZero():
		return row.ReceivedAt
	}
	return clock.Clamp(row.OccurredAt, row.ReceivedAt.Add(-tol), row.ReceivedAt)
}

// flavorHolding reads what the instance's flavor gives it from a Nova
// instance notification's payload, the profiles named by cat (may be
// nil): its resources:VGPU (or custom class) request groups, and the VFs
// of Nova-owned VF GPUs its pci_passthrough:alias asks for (aliases,
// novaVFs); ok is false for other events.
func flavorHolding(cat Catalog, aliases map[string]placement.NovaVFAlias, row InboxRow) (requests.FlavorHolding, bool) {
	if row.Webhook() || row.InstanceUUID == "" {
		return requests.FlavorHolding{}, false
	}
	var o nova.Object
	if json.Unmarshal(row.Payload, &o) != nil {
		return requests.FlavorHolding{}, false
	}
	pl, err := nova.DecodeObject(o)
	if err != nil {
		return requests.FlavorHolding{}, false
	}
	var in *nova.Instance
	switch x := pl.(type) {
	case *nova.InstanceAction:
		in = &x.Instance
	case *nova.InstanceUpdate:
		in = &x.Instance
	default:
		return requests.FlavorHolding{}, false
	}
	h := requests.FlavorHolding{Instance: row.InstanceUUID, Project: in.TenantID, User: in.UserID,
		Deleted: row.EventType == "instance.delete.end" || in.State == "deleted"}
	if in.Host != nil {
		h.Host = *in.Host
	}
	if in.Flavor == nil {
		return h, true
	}
	h.Flavor = in.Flavor.Name
	if h.Host == "" || !requests.HoldsVGPU(in.State) || !in.DeletedAt.IsZero() {
		return h, true
	}
	h.VGPUs = novaVFs(cat, aliases, in.Flavor.ExtraSpecs[novaAliasSpec])
	d, err := nova.ParseExtraSpecs(in.Flavor.ExtraSpecs)
	if err != nil {
		return h, true
	}
	for _, g := range d.VGPUGroups() {
		for rc, n := range g.Resources {
			if rc != nova.ResourceVGPU && !isCustom(rc) || n <= 0 {
				continue
			}
			v := requests.FlavorVGPU{ResourceClass: rc, Amount: n}
			if cat != nil {
				for _, tr := range g.Required {
					if cp, ok := cat.ByTrait(tr); ok {
						v.Profile, v.VGPUType = cp.Name, cp.TypeID
						break
					}
				}
			}
			h.VGPUs = append(h.VGPUs, v)
		}
	}
	return h, true
}

// novaAliasSpec is the flavor extra spec of Nova's PCI passthrough
// requests (nova.pci.request.get_pci_requests_from_flavor).
const novaAliasSpec = "pci_passthrough:alias"

// novaVFs are the vGPUs a flavor's pci_passthrough:alias value spec gives
// a server: for each "NAME:COUNT" whose alias is one of Nova-owned VF
// GPUs, COUNT units of its class and type (the profile named by cat, may
// be nil). Nova parses the value the same way
// (nova.pci.request._translate_alias_to_requests: comma-separated
// NAME:COUNT, the name stripped); other aliases (NICs, whole GPUs) and
// what does not parse give nothing.
//
// The flavor is the source of truth, not the allocation Nova heals onto
// the VF's provider: Nova's scheduler does not allocate PCI devices in
// Placement, and its resource tracker writes the allocation only at its
// next update_available_resource (a minute later by default), while the
// server holds its VF from its launch, which the notification dates. So
// the seconds are counted the way flavors' vGPUs are, from Nova's
// notifications, and the quota counts the server before the heal.
func novaVFs(cat Catalog, aliases map[string]placement.NovaVFAlias, spec string) []requests.FlavorVGPU {
	if spec == "" || len(aliases) == 0 {
		return nil
	}
	var out []requests.FlavorVGPU
	for _, part := range strings.Split(spec, ",") {
		name, count, ok := strings.Cut(part, ":")
		a, known := aliases[strings.TrimSpace(name)]
		n, err := strconv.Atoi(strings.TrimSpace(count))
		if !ok || !known || err != nil || n <= 0 {
			continue
		}
		v := requests.FlavorVGPU{ResourceClass: a.Class, VGPUType: a.TypeID, Amount: n}
		if cat != nil {
			if cp, ok := cat.ByTypeID(a.TypeID); ok {
				v.Profile = cp.Name
			}
		}
		out = append(out, v)
	}
	return out
}

func isCustom(rc string) bool { return len(rc) > 7 && rc[:7] == "CUSTOM_" }

// allocationEvent reports whether, after Nova notification kind, an
// instance's allocations in Placement are not what they were: its
// creation, its moves (MoveEvents), a live migration rolled back (the
// destination's claim dropped, the source's allocations moved back from
// the migration consumer) and a failed rebuild (a failed evacuation drops
// the destination's allocations).
func allocationEvent(kind string) bool {
	switch kind {
	case NovaKindPrefix + "instance.create.end", NovaKindPrefix + "instance.live_migration_rollback.end",
		NovaKindPrefix + "instance.rebuild.error":
		return true
	}
	return IsMove(kind)
}

// KnowAllocations keeps the bridge's record of what each instance holds
// in Placement (Placement.CachedHoldings) current, so that later claims
// for the instance are one PUT: when a Nova notification says the
// instance's allocations changed, decideLocked reads them before the
// decision, outside its transaction (that read is the record); a deleted
// instance's record is dropped here without a read. A failed read leaves
// the event to be tried again; nothing else waits on it.
type KnowAllocations struct {
	// Allocations is the record of what instances hold (Placement).
	Allocations interface{ Forget(instance string) }
}

// Exec implements Stage.
func (k KnowAllocations) Exec(ctx context.Context, w *Work) (bool, error) {
	if w.Row.Webhook() || w.Row.InstanceUUID == "" {
		return false, nil
	}
	switch kind := NovaKindPrefix + w.Row.EventType; {
	case kind == NovaKindPrefix+"instance.delete.end":
		k.Allocations.Forget(w.Row.InstanceUUID)
	case allocationEvent(kind):
		_, err := w.HeldBy(w.Row.InstanceUUID)
		return false, err
	}
	return false, nil
}
