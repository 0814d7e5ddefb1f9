package placement

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

// MixedGPU is a mixed bridge-owned GPU (HOST/PF=mixed) as operators see it
// in GET /v1/gpus. The index never holds such a GPU (its class is not a
// vGPU class: the engine never ranks it), so MixedGPUs reads its provider
// from Placement and its vGPUs from its agent's last report.
type MixedGPU struct {
	Host string // Nova's compute service host (the declaration's)
	Node string // the compute node's provider name (the report's node)
	PCI  string // the PF
	// Provider, Name, RootUUID and Generation are its provider's;
	// Provider is "" when Placement has none (not published yet) or could
	// not be read (Problem says why).
	Provider   string
	Name       string
	RootUUID   string
	Generation int
	// TotalMiB is its framebuffer in MiB of BridgeFBClass (the
	// provider's inventory: the GPU's less what Nova's VFs hold), of which
	// ReservedMiB are reserved and UsedMiB allocated. Without a provider,
	// TotalMiB and UsedMiB are what the report is worth (mixedFromReport)
	// and what the bridge's typed VFs hold.
	TotalMiB    int
	ReservedMiB int
	UsedMiB     int
	// Traits are its provider's (every type's trait, and the fault trait
	// when the bridge marked it); without a provider, its types' traits.
	Traits []string
	// InUse are the bridge's vGPUs on it by type (its VFs the agent
	// typed, as its last report lists them), by type id.
	InUse []TypeInUse
	// TypeMiB is the framebuffer in MiB of one vGPU of each type the GPU
	// offers, by type trait (its agent's last report; nil without one).
	TypeMiB map[string]int
	// Health is the agent's (protocol.GPU.Health): "" when the last
	// report does not list the GPU.
	Health  string
	Problem string
}

// TypeInUse is how many vGPUs of one type a mixed GPU holds.
type TypeInUse struct {
	TypeID         string
	Trait          string
	FramebufferMiB int // of one vGPU of the type
	Count          int
}

// MixedGPUs lists the mixed bridge-owned GPUs declared in [placement]
// bridge_owned_gpus, by host then PCI address: each one's provider,
// inventory, usage and traits as Placement has them now (four calls a
// GPU), and its vGPUs by type and health as its agent last reported. A
// GPU whose provider cannot be read is listed with what its report says
// and Problem set; only ctx ending is an error.
func (s *Service) MixedGPUs(ctx context.Context) ([]MixedGPU, error) {
	var decls []OwnedDecl
	for _, d := range s.cfg.OwnedGPUs {
		if d.Mixed() {
			decls = append(decls, d)
		}
	}
	if len(decls) == 0 {
		return nil, nil
	}
	slices.SortFunc(decls, func(a, b OwnedDecl) int {
		return cmp.Or(strings.Compare(a.Host, b.Host), strings.Compare(a.PCI, b.PCI))
	})
	reports, err := s.mixedReports(ctx, decls)
	if err != nil {
		return nil, err
	}
	out := make([]MixedGPU, 0, len(decls))
	for _, d := range decls {
		m, err := s.mixedGPU(ctx, d, reports)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// mixedReports reads the last reports of the declarations' hosts (none
// without a database; an unreadable one is left out, logged).
func (s *Service) mixedReports(ctx context.Context, decls []OwnedDecl) (map[string]protocol.Report, error) {
	out := map[string]protocol.Report{}
	if s.store == nil {
		return out, nil
	}
	var hosts []string
	for _, d := range decls {
		if !slices.Contains(hosts, d.Host) {
			hosts = append(hosts, d.Host)
		}
	}
	rows, err := s.store.Pool().Query(ctx, `SELECT name, report FROM hosts WHERE name = ANY($1) AND report IS NOT NULL`, hosts)
	if err != nil {
		return nil, fmt.Errorf("mixed GPUs: hosts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var host string
		var raw []byte
		if err := rows.Scan(&host, &raw); err != nil {
			return nil, fmt.Errorf("mixed GPUs: hosts: %w", err)
		}
		var r protocol.Report
		if err := json.Unmarshal(raw, &r); err != nil {
			s.log.Warn("placement: mixed GPUs: unreadable report", logkey.Host, host, logkey.Err, err)
			continue
		}
		out[host] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mixed GPUs: hosts: %w", err)
	}
	return out, nil
}

func (s *Service) mixedGPU(ctx context.Context, d OwnedDecl, reports map[string]protocol.Report) (MixedGPU, error) {
	m := MixedGPU{Host: d.Host, Node: d.Host, PCI: d.PCI}
	r, reported := reports[d.Host]
	if reported && r.Node != "" {
		m.Node = r.Node
	}
	m.Name = GPUProviderName(m.Node, d.PCI)
	var why []string
	g, ok := ownedReportGPU(r, d.PCI, d.TypeID)
	if ok {
		m.Health = g.Health
		fb := map[string]int{}
		for _, t := range g.Types {
			fb[t.ID] = t.FramebufferMiB
			if t.FramebufferMiB > 0 {
				if m.TypeMiB == nil {
					m.TypeMiB = map[string]int{}
				}
				m.TypeMiB[catalog.TraitFor(t.ID)] = t.FramebufferMiB
			}
		}
		for _, a := range g.Active {
			if a.Owner != protocol.OwnerAgent {
				continue
			}
			i := slices.IndexFunc(m.InUse, func(u TypeInUse) bool { return u.TypeID == a.TypeID })
			if i < 0 {
				m.InUse = append(m.InUse, TypeInUse{TypeID: a.TypeID, Trait: catalog.TraitFor(a.TypeID), FramebufferMiB: fb[a.TypeID]})
				i = len(m.InUse) - 1
			}
			m.InUse[i].Count++
		}
		slices.SortFunc(m.InUse, func(a, b TypeInUse) int { return strings.Compare(a.TypeID, b.TypeID) })
	} else if reported {
		why = append(why, "its agent's last report does not list it as a vendor-VFIO GPU")
	} else {
		why = append(why, "its host has not reported")
	}
	// What the report is worth, for a GPU Placement cannot tell of.
	fromReport := func() {
		if pub, ok := mixedFromReport(m.Node, d.PCI, g); ok {
			m.TotalMiB, m.Traits = pub.Total, pub.Traits
		}
		m.UsedMiB = 0
		for _, u := range m.InUse {
			m.UsedMiB += u.Count * u.FramebufferMiB
		}
	}
	ps, err := s.client.Providers(ctx, ListOpts{Name: m.Name})
	switch {
	case ctx.Err() != nil:
		return m, ctx.Err()
	case err != nil:
		why = append(why, "Placement: "+err.Error())
		fromReport()
	case len(ps) == 0:
		why = append(why, "no provider "+m.Name+" in Placement (not published yet)")
		fromReport()
	default:
		if err := s.mixedProvider(ctx, &m, ps[0]); err != nil {
			if ctx.Err() != nil {
				return m, ctx.Err()
			}
			why = append(why, "Placement: "+err.Error())
			fromReport()
			m.Provider = ps[0].UUID // known, though not all read
		}
	}
	if m.Traits == nil {
		m.Traits = []string{}
	}
	m.Problem = strings.Join(why, "; ")
	return m, nil
}

// mixedProvider fills m from its provider p: inventory, usage, traits.
func (s *Service) mixedProvider(ctx context.Context, m *MixedGPU, p ProviderRef) error {
	inv, gen, err := s.client.Inventories(ctx, p.UUID)
	if err != nil {
		return err
	}
	u, _, err := s.client.Usages(ctx, p.UUID)
	if err != nil {
		return err
	}
	trs, _, err := s.client.Traits(ctx, p.UUID)
	if err != nil {
		return err
	}
	i, ok := inv[BridgeFBClass]
	if !ok {
		return fmt.Errorf("provider %s has no %s inventory", p.Name, BridgeFBClass)
	}
	m.Provider, m.RootUUID, m.Generation = p.UUID, p.RootUUID, gen
	m.TotalMiB, m.ReservedMiB, m.UsedMiB = i.Total, i.Reserved, u[BridgeFBClass]
	m.Traits = slices.Sorted(slices.Values(trs))
	s.mixedRPs.Store(p.UUID, m.PCI)
	return nil
}

// MixedGPUByProvider finds the mixed bridge-owned GPU whose provider is
// id (MixedGPUs: Placement read now); ok is false when none is.
func (s *Service) MixedGPUByProvider(ctx context.Context, id string) (MixedGPU, bool, error) {
	ms, err := s.MixedGPUs(ctx)
	if err != nil {
		return MixedGPU{}, false, err
	}
	for _, m := range ms {
		if m.Provider != "" && strings.EqualFold(m.Provider, id) {
			return m, true, nil
		}
	}
	return MixedGPU{}, false, nil
}

// gpuDrained reports whether an operator drained the GPU provider rp (the
// gpus table as readHosts last read it).
func (s *Service) gpuDrained(rp string) bool {
	s.exMu.RLock()
	defer s.exMu.RUnlock()
	return slices.Contains(s.excludeGPUs, rp)
}

// hostExcluded reports whether the node or compute host is drained,
// disabled or silent (readHosts).
func (s *Service) hostExcluded(host, node string) bool {
	s.exMu.RLock()
	defer s.exMu.RUnlock()
	return slices.Contains(s.excludeHosts, node) || (s.nodeOf[host] != "" && slices.Contains(s.excludeHosts, s.nodeOf[host]))
}

// MixedDryRun adds to out what the mixed bridge-owned GPUs answer a dry
// run d for one vGPU type (its profile, or the type trait among
// traits.required): a GPU that offers the type, has every other required
// trait and none forbidden, is a candidate when count vGPUs of the type
// fit its framebuffer left (Mode "mixed", FramebufferMiB the MiB they
// take, FreeAfter the MiB left after), and is listed in out.Rejected
// with why otherwise (too little framebuffer, drained, its host drained
// or silent, excluded by the request, not published or not reported).
// A request for no type, or for a type no mixed GPU offers, adds
// nothing. Candidates come after the engine's, by host then PCI address;
// only ctx ending is an error.
func (s *Service) MixedDryRun(ctx context.Context, d DryRunRequest, out *DryRunResponse) error {
	has := false
	for _, o := range s.cfg.OwnedGPUs {
		has = has || o.Mixed()
	}
	if !has {
		return nil
	}
	q, err := s.Request(d)
	if err != nil {
		return err
	}
	ms, err := s.MixedGPUs(ctx)
	if err != nil {
		return err
	}
	isType := func(t string) bool {
		return s.engine.IsType(t) || s.profileName(t) != "" ||
			slices.ContainsFunc(ms, func(m MixedGPU) bool { return m.TypeMiB[t] > 0 })
	}
	trait := ""
	var others []string
	for _, t := range q.Required {
		if trait == "" && isType(t) {
			trait = t
			continue
		}
		others = append(others, t)
	}
	if trait == "" {
		return nil
	}
	n := max(q.Count, 1)
	for _, m := range ms {
		if !slices.Contains(m.Traits, trait) {
			continue
		}
		if len(q.Hosts) > 0 && !slices.Contains(q.Hosts, m.Host) && !slices.Contains(q.Hosts, m.Node) {
			continue
		}
		if slices.ContainsFunc(others, func(t string) bool { return !slices.Contains(m.Traits, t) }) ||
			slices.ContainsFunc(q.Forbidden, func(t string) bool { return slices.Contains(m.Traits, t) }) {
			continue
		}
		per := m.TypeMiB[trait]
		mib := n * per
		free := max(m.TotalMiB-m.ReservedMiB-m.UsedMiB, 0)
		c := DryRunCandidate{Host: m.Host, Node: m.Node, ProviderUUID: m.Provider, PCIAddress: m.PCI, Trait: trait,
			Profile: s.profileName(trait), Amount: n, Mode: ModeMixed, FramebufferMiB: mib, FreeAfter: free - mib}
		var why string
		switch {
		case m.Provider == "":
			why = "not published in Placement: " + m.Problem
		case per <= 0:
			why = "its agent's last report gives no framebuffer for " + trait
		case slices.Contains(q.ExcludeGPUs, m.Provider):
			why = "excluded by the request"
		case s.gpuDrained(m.Provider):
			why = "GPU drained"
		case s.hostExcluded(m.Host, m.Node):
			why = "host drained, disabled or its agent silent"
		case mib > free:
			why = fmt.Sprintf("%d × %d MiB = %d MiB do not fit the %d MiB of framebuffer left", n, per, mib, free)
		}
		if why != "" {
			c.FreeAfter = 0
			c.Reason = why
			out.Rejected = append(out.Rejected, c)
			continue
		}
		c.Reason = fmt.Sprintf("mixed GPU: %d × %d MiB fit, %d MiB of framebuffer left after", n, per, free-mib)
		out.Candidates = append(out.Candidates, c)
	}
	return nil
}

// MixedPFs are the PFs of the mixed bridge-owned GPUs declared in
// [placement] bridge_owned_gpus, by compute host (lower-case PCI
// addresses).
func (s *Service) MixedPFs() map[string][]string {
	out := map[string][]string{}
	for _, d := range s.cfg.OwnedGPUs {
		if d.Mixed() {
			out[d.Host] = append(out[d.Host], d.PCI)
		}
	}
	return out
}
