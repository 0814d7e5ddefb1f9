package drift

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// Kind names a difference between Placement, the hosts and the bridge.
type Kind string

// Kinds of findings.
const (
	// OrphanMdev: an agent-made mdev on a host that no live direct-path
	// vGPU of the bridge accounts for. Repair: remove_mdev, when it is not
	// attached to a domain. On a bridge-owned VF GPU (a provider of
	// placement.BridgeClass) it is also a VF with a vGPU type set that is
	// in no domain and that no live vGPU of the bridge holds: the finding
	// names the VF (PCI, no mdev). Repair: remove_mdev with vendor_vfio,
	// which clears the VF's type, when the agent's journal holds the VF
	// (a VF typed by anyone else is reported only: the agent never
	// clears it).
	OrphanMdev Kind = "orphan_mdev"
	// MissingDevice: the bridge records a vGPU as attached, but the host's
	// report does not show the mdev, or shows it detached from the
	// instance's domain. Reported only.
	MissingDevice Kind = "missing_device"
	// StaleClaim: Placement holds VGPU units for a consumer that nothing
	// accounts for: its instance is deleted, or it holds more than the
	// bridge's vGPUs and its flavor's. Repair: release the units the
	// bridge claimed (never Nova's).
	StaleClaim Kind = "stale_claim"
	// UnclaimedDevice: the bridge's vGPU has no Placement claim behind it
	// (a Nova move rewrote the consumer's allocations). Reported only.
	UnclaimedDevice Kind = "unclaimed_device"
	// UnknownInstance: a host's domain or a Placement consumer holds a vGPU
	// for an instance the bridge has no record of, or records as deleted.
	// Reported only.
	UnknownInstance Kind = "unknown_instance"
)

// Kinds lists every kind.
var Kinds = []Kind{OrphanMdev, MissingDevice, StaleClaim, UnclaimedDevice, UnknownInstance}

// HostView is one compute host as its agent last reported it.
type HostView struct {
	Name     string
	Node     string
	ReportAt time.Time
	Report   protocol.Report
	// Fresh is false when the report is too old to judge the host by.
	Fresh bool
}

// GPUView is one GPU child provider (the gpus table).
type GPUView struct {
	Provider string
	Host     string
	Node     string
	PCI      string
	Class    string
}

// AttachmentView is one vgpu_attachments row.
type AttachmentView struct {
	ID        string // the mdev uuid
	Instance  string
	Host      string
	Provider  string
	PCI       string
	Class     string
	Profile   string
	Amount    int
	HeldAfter int
	State     string
	UpdatedAt time.Time
}

// InstanceView is what the bridge knows of an instance.
type InstanceView struct {
	Known   bool
	Deleted bool
	Host    string
	VGPUs   int // units of its flavor (Nova's own)
}

// Snapshot is everything one run compares.
type Snapshot struct {
	Now   time.Time
	Hosts map[string]HostView
	GPUs  []GPUView
	// Allocations: GPU provider → consumer → units of the provider's vGPU
	// class, as Placement answers now. Providers that could not be read
	// are absent (and named in Unread).
	Allocations map[string]map[string]int
	Unread      map[string]bool
	// Attachments are the bridge's active direct-path vGPUs (pending,
	// attached, releasing) and those kept on the source of a move that
	// awaits its confirm (kept: their mdevs are accounted for, their
	// claims are in Nova's migration consumer, a transient one).
	Attachments []AttachmentView
	// Made holds "instance|provider" of every attachment the bridge ever
	// made, failed and released ones included: the bridge's claims.
	Made      map[string]bool
	Instances map[string]InstanceView
	// Transient holds the consumers that are no instance but hold vGPU
	// units for one while it moves, by what they are (TransientMigration,
	// TransientReservation): expected, never a finding.
	Transient map[string]string
	// Mixed holds "host|PF" of the mixed bridge-owned GPUs (HOST/PF=mixed,
	// PF lower-case): their typed VFs are judged as a bridge-owned VF
	// GPU's, though their providers are not among GPUs.
	Mixed map[string]bool
}

// What a transient consumer is (Snapshot.Transient).
const (
	// TransientMigration: a Nova migration consumer (Placement consumer
	// type MIGRATION): while a move runs, Nova holds the instance's
	// allocations on its source under the migration's UUID.
	TransientMigration = "nova_migration"
	// TransientReservation: a reservation consumer of the bridge's own
	// (placement.ReservationConsumerType), holding a vGPU on the target
	// host of a move until it goes into the instance's consumer.
	TransientReservation = "reservation"
)

// Finding is one difference.
type Finding struct {
	Kind       Kind
	Host       string
	Provider   string
	PCI        string
	Instance   string
	Mdev       string
	Detail     string
	Repairable bool
	Repair     *Repair
}

// Fingerprint names the difference across runs; an orphan VF, which has
// no mdev, by its address.
func (f Finding) Fingerprint() string {
	m := f.Mdev
	if f.Kind == OrphanMdev && m == "" {
		m = f.PCI
	}
	return strings.Join([]string{string(f.Kind), f.Host, f.Provider, f.Instance, m}, "|")
}

// Repair is what fixing a finding takes.
type Repair struct {
	// RemoveMdev: remove_mdev of Mdev on Host (through the outbox); with
	// VF, of the finding's VF (vendor_vfio: its type cleared).
	RemoveMdev bool
	VF         bool
	// Release: take Amount units of Class off Consumer's allocation on
	// Provider (none when Amount is 0), and mark Attachments released.
	Release     bool
	Consumer    string
	Class       string
	Amount      int
	Attachments []string
}

func (s *Snapshot) instance(id string) InstanceView {
	if s.Instances == nil {
		return InstanceView{}
	}
	return s.Instances[id]
}

// Detect compares the snapshot's three views and returns the findings,
// ordered by kind, host, GPU, instance, mdev. It is pure.
func Detect(s *Snapshot) []Finding {
	var out []Finding
	byNodePCI := map[string]GPUView{}
	byProvider := map[string]GPUView{}
	for _, g := range s.GPUs {
		byNodePCI[g.Node+"|"+g.PCI] = g
		byProvider[g.Provider] = g
	}
	active := map[string]AttachmentView{}
	type cp struct{ c, p string }
	held := map[cp]int{}     // bridge units per consumer and provider, every active state
	attached := map[cp]int{} // of them, attached
	attIDs := map[cp][]string{}
	heldVF := map[string]bool{} // host|VF of the bridge's live VF vGPUs
	for _, a := range s.Attachments {
		if a.State == flow.AttKept {
			// Kept on the source of a move awaiting its confirm: its mdev
			// is accounted for (while its instance lives), its claim is
			// in Nova's migration consumer.
			if !s.instance(a.Instance).Deleted {
				active[a.ID] = a
				if a.Class == placement.BridgeClass && a.PCI != "" {
					heldVF[a.Host+"|"+a.PCI] = true
				}
			}
			continue
		}
		active[a.ID] = a
		if (a.Class == placement.BridgeClass || a.Class == placement.BridgeFBClass) && a.PCI != "" {
			heldVF[a.Host+"|"+a.PCI] = true
		}
		// A mixed GPU's provider is not mirrored (its class is no GPU
		// class of the index): its claims are not compared here.
		if a.Provider == "" || a.Class == placement.BridgeFBClass {
			continue
		}
		k := cp{a.Instance, a.Provider}
		held[k] += max(a.Amount, 1)
		if a.State == flow.AttAttached {
			attached[k] += max(a.Amount, 1)
		}
		attIDs[k] = append(attIDs[k], a.ID)
	}

	// The hosts' reports against the bridge's records.
	hostNames := make([]string, 0, len(s.Hosts))
	for n := range s.Hosts {
		hostNames = append(hostNames, n)
	}
	sort.Strings(hostNames)
	for _, name := range hostNames {
		h := s.Hosts[name]
		if !h.Fresh {
			continue
		}
		node := h.Node
		if node == "" {
			node = h.Report.Node
		}
		for _, g := range h.Report.GPUs {
			gv := byNodePCI[node+"|"+g.PCI]
			if gv.Class == "" && s.Mixed[name+"|"+strings.ToLower(g.PCI)] {
				gv = GPUView{Host: name, Node: node, PCI: g.PCI, Class: placement.BridgeFBClass}
			}
			for _, v := range g.Active {
				if v.InstanceUUID != "" {
					if in := s.instance(v.InstanceUUID); !in.Known || in.Deleted {
						what := "is not known to the bridge (no Nova notification about it)"
						if in.Deleted {
							what = "is deleted in the bridge's records"
						}
						out = append(out, Finding{Kind: UnknownInstance, Host: name, Provider: gv.Provider, PCI: g.PCI, Instance: v.InstanceUUID,
							Mdev: v.MdevUUID, Detail: fmt.Sprintf("host %s reports a vGPU (%s, %s's) on GPU %s attached to instance %s, which %s",
								name, orDash(v.MdevUUID), v.Owner, g.PCI, v.InstanceUUID, what)})
					}
				}
				if v.MdevUUID == "" && v.PCI != "" {
					if f, ok := orphanVF(name, h.Report, g, gv, v, heldVF); ok {
						out = append(out, f)
					}
					continue
				}
				if v.Owner != protocol.OwnerAgent || v.MdevUUID == "" {
					continue // Nova's own mdevs are reported, never touched
				}
				a, ok := active[v.MdevUUID]
				if ok && a.Host == name {
					continue
				}
				f := Finding{Kind: OrphanMdev, Host: name, Provider: gv.Provider, PCI: g.PCI, Instance: v.InstanceUUID, Mdev: v.MdevUUID}
				why := "no live direct-path vGPU of the bridge names it"
				if ok {
					why = fmt.Sprintf("the bridge's vGPU with this mdev is on host %s", a.Host)
				}
				if v.InstanceUUID != "" {
					f.Detail = fmt.Sprintf("agent-made mdev %s (%s) on host %s GPU %s is attached to instance %s, but %s; detach it by hand or release it through the bridge",
						v.MdevUUID, v.TypeID, name, g.PCI, v.InstanceUUID, why)
				} else {
					f.Detail = fmt.Sprintf("agent-made mdev %s (%s) on host %s GPU %s is attached to no domain and %s",
						v.MdevUUID, v.TypeID, name, g.PCI, why)
					f.Repairable = true
					f.Repair = &Repair{RemoveMdev: true}
				}
				out = append(out, f)
			}
		}
	}

	// The bridge's attached vGPUs against the hosts' reports.
	for _, a := range s.Attachments {
		if a.State != flow.AttAttached {
			continue
		}
		h, ok := s.Hosts[a.Host]
		if !ok || !h.Fresh || h.ReportAt.Before(a.UpdatedAt) {
			continue // nothing newer than the attach to judge by
		}
		in := s.instance(a.Instance)
		if in.Deleted {
			continue // a stale claim, below
		}
		var found *protocol.VGPU
		for _, g := range h.Report.GPUs {
			for i := range g.Active {
				// A bridge-owned VF GPU's vGPU is its VF (a.PCI).
				if g.Active[i].MdevUUID == a.ID || ((a.Class == placement.BridgeClass || a.Class == placement.BridgeFBClass) && a.PCI != "" && g.Active[i].PCI == a.PCI) {
					found = &g.Active[i]
				}
			}
		}
		f := Finding{Kind: MissingDevice, Host: a.Host, Provider: a.Provider, PCI: a.PCI, Instance: a.Instance, Mdev: a.ID}
		switch {
		case found == nil:
			f.Detail = fmt.Sprintf("the bridge attached %s (mdev %s) to instance %s on host %s GPU %s, but the host's report of %s does not list the mdev",
				orDash(a.Profile), a.ID, a.Instance, a.Host, orDash(a.PCI), h.ReportAt.UTC().Format(time.RFC3339))
		case found.InstanceUUID != a.Instance:
			f.Detail = fmt.Sprintf("mdev %s of instance %s exists on host %s GPU %s but is attached to %s",
				a.ID, a.Instance, a.Host, orDash(a.PCI), orDefault(found.InstanceUUID, "no domain"))
		default:
			continue
		}
		if in.Host != "" && in.Host != a.Host {
			f.Detail += fmt.Sprintf(" (the instance is now on host %s)", in.Host)
		}
		out = append(out, f)
	}

	// Placement's allocations against the bridge's records.
	keys := map[cp]bool{}
	for p, cons := range s.Allocations {
		for c, n := range cons {
			if n > 0 {
				keys[cp{c, p}] = true
			}
		}
	}
	for k := range held {
		keys[k] = true
	}
	ordered := make([]cp, 0, len(keys))
	for k := range keys {
		ordered = append(ordered, k)
	}
	sort.Slice(ordered, func(i, j int) bool {
		if ordered[i].p != ordered[j].p {
			return ordered[i].p < ordered[j].p
		}
		return ordered[i].c < ordered[j].c
	})
	for _, k := range ordered {
		if s.Unread[k.p] {
			continue
		}
		n := s.Allocations[k.p][k.c]
		b := held[k]
		in := s.instance(k.c)
		g := byProvider[k.p]
		f := Finding{Host: g.Host, Provider: k.p, PCI: g.PCI, Instance: k.c}
		made := s.Made[k.c+"|"+k.p] || b > 0
		ids := slices.Clone(attIDs[k])
		switch {
		case in.Deleted:
			f.Kind = StaleClaim
			if n > 0 {
				f.Detail = fmt.Sprintf("Placement holds %d vGPU unit(s) on GPU provider %s (%s) for instance %s, which is deleted", n, k.p, orDash(g.PCI), k.c)
			} else {
				f.Detail = fmt.Sprintf("the bridge still records %d vGPU(s) on GPU provider %s (%s) for instance %s, which is deleted; Placement holds none", b, k.p, orDash(g.PCI), k.c)
			}
			release := 0
			switch {
			case b > 0:
				release = min(n, b)
			case in.VGPUs == 0:
				release = n
			}
			if made {
				f.Repairable = true
				f.Repair = &Repair{Release: true, Consumer: k.c, Class: g.Class, Amount: release, Attachments: ids}
				f.Detail += "; the claim is the bridge's"
			} else {
				f.Detail += "; the bridge did not make this claim (Nova's): left alone"
			}
		case !in.Known:
			if n == 0 || s.Transient[k.c] != "" {
				continue
			}
			f.Kind = UnknownInstance
			f.Detail = fmt.Sprintf("Placement consumer %s holds %d vGPU unit(s) on GPU provider %s (%s), but the bridge has no record of that instance", k.c, n, k.p, orDash(g.PCI))
		case n < attached[k]:
			f.Kind = UnclaimedDevice
			f.Detail = fmt.Sprintf("the bridge's %d attached vGPU(s) of instance %s on GPU provider %s (%s) have %d unit(s) claimed in Placement; a Nova move may have rewritten the allocations",
				attached[k], k.c, k.p, orDash(g.PCI), n)
		case n > b+in.VGPUs:
			f.Kind = StaleClaim
			f.Detail = fmt.Sprintf("Placement holds %d vGPU unit(s) on GPU provider %s (%s) for instance %s; the bridge's vGPUs account for %d and its flavor for %d",
				n, k.p, orDash(g.PCI), k.c, b, in.VGPUs)
			if made && in.VGPUs == 0 {
				f.Repairable = true
				f.Repair = &Repair{Release: true, Consumer: k.c, Class: g.Class, Amount: n - b}
				f.Detail += "; the excess is a claim the bridge made"
			}
		default:
			continue
		}
		out = append(out, f)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Fingerprint() < out[j].Fingerprint() })
	// One finding per fingerprint (a vGPU both orphaned and of an unknown
	// instance is two kinds, two findings; the same kind twice is one).
	var uniq []Finding
	for _, f := range out {
		if len(uniq) > 0 && f.Fingerprint() == uniq[len(uniq)-1].Fingerprint() {
			continue
		}
		uniq = append(uniq, f)
	}
	return uniq
}

// orphanVF judges one typed VF v of GPU g on host: an orphan when g is
// a bridge-owned VF GPU (its provider is of placement.BridgeClass, or it
// is a mixed one, placement.BridgeFBClass: never a GPU Nova owns), v is
// in no domain and no live vGPU of the bridge holds
// it. Only while libvirt answered the agent: without it every VF looks
// in no domain.
func orphanVF(host string, r protocol.Report, g protocol.GPU, gv GPUView, v protocol.VGPU, held map[string]bool) (Finding, bool) {
	if !g.VendorVFIO || (gv.Class != placement.BridgeClass && gv.Class != placement.BridgeFBClass) || v.InstanceUUID != "" || v.TypeID == "" || v.TypeID == "0" || held[host+"|"+v.PCI] {
		return Finding{}, false
	}
	for _, e := range r.Errors {
		if strings.HasPrefix(e, "libvirt") {
			return Finding{}, false
		}
	}
	f := Finding{Kind: OrphanMdev, Host: host, Provider: gv.Provider, PCI: v.PCI}
	if v.Owner == protocol.OwnerAgent {
		f.Detail = fmt.Sprintf("VF %s of bridge-owned GPU %s on host %s is typed %s, attached to no domain, and no live direct-path vGPU of the bridge holds it: "+
			"capacity lost until its type is cleared", v.PCI, g.PCI, host, v.TypeID)
		f.Repairable = true
		f.Repair = &Repair{RemoveMdev: true, VF: true}
	} else {
		f.Detail = fmt.Sprintf("VF %s of bridge-owned GPU %s on host %s is typed %s, attached to no domain, and no vGPU of the bridge holds it; "+
			"it was typed outside the agent (not in its journal), which never clears it: once sure nothing uses it, clear it by hand "+
			"(echo 0 > /sys/bus/pci/devices/%s/nvidia/current_vgpu_type)", v.PCI, g.PCI, host, v.TypeID, v.PCI)
	}
	return f, true
}

func orDash(s string) string { return orDefault(s, "-") }

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
