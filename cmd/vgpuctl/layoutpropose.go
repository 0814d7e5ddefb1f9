// SPDX-License-Identifier: Apache-2.0

package main

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
)

// layoutAsk is what the operator asks `vgpuctl host layout HOST` for.
type layoutAsk struct {
	PF    string // "" lets the proposal choose the GPU
	Type  string // numeric vendor-VFIO type id
	Count int    // 0: as many VFs as the GPU holds
}

// layoutProposal is the VFs of one GPU to type, chosen from a report.
type layoutProposal struct {
	PF             string   `json:"pf"`
	TypeName       string   `json:"type_name,omitempty"`
	FramebufferMiB int      `json:"framebuffer_mib,omitempty"`
	MaxInstances   int      `json:"max_instances,omitempty"`
	Holds          int      `json:"holds"`      // VFs of the type the GPU can hold now
	Count          int      `json:"count"`      // VFs proposed
	Typed          []string `json:"typed_vfs"`  // VFs of the type already (counted, left alone)
	VFs            []string `json:"vfs"`        // all VFs proposed: Typed first, then free ones
	ProductID      string   `json:"product_id"` // the VFs' PCI device id, "" when not reported
	Others         []string `json:"other_pfs"`  // other GPUs that could hold the type
	Health         string   `json:"gpu_health"` // the chosen GPU's
	VFLayout       string   `json:"vf_layout"`  // PF=TYPE:COUNT, agent.conf [devices] vf_layout
	Reason         string   `json:"reason"`     // why this GPU, for people
}

// gpuFit is how many VFs of a type one vendor-VFIO GPU can hold, or why none.
type gpuFit struct {
	gpu    protocol.GPU
	typ    protocol.VGPUType
	typed  []string
	holds  int
	refuse string
}

// fitType works out how many VFs of typeID g can hold: VFs already of the
// type plus free VFs, at most the type's max instances; none when g is not
// a vendor-VFIO GPU, lacks the type or has VFs of another type (a GPU
// holds one type, and the layout never clears a type).
func fitType(g protocol.GPU, typeID string) gpuFit {
	f := gpuFit{gpu: g}
	if !g.VendorVFIO {
		f.refuse = g.PCI + " is not a vendor-VFIO (SR-IOV) GPU: its vGPUs are mdevs, which Nova owns by [devices] enabled_mdev_types"
		return f
	}
	i := slices.IndexFunc(g.Types, func(t protocol.VGPUType) bool { return t.ID == typeID })
	if i < 0 {
		ids := make([]string, 0, len(g.Types))
		for _, t := range g.Types {
			ids = append(ids, t.ID+" ("+t.Name+")")
		}
		f.refuse = fmt.Sprintf("%s does not offer type %s; it offers %s", g.PCI, typeID, strings.Join(ids, ", "))
		return f
	}
	f.typ = g.Types[i]
	var other []string
	for _, a := range g.Active {
		switch {
		case a.PCI == "":
		case a.TypeID == typeID:
			f.typed = append(f.typed, a.PCI)
		default:
			other = append(other, a.PCI+"="+a.TypeID)
		}
	}
	slices.Sort(f.typed)
	if len(other) > 0 {
		slices.Sort(other)
		f.refuse = fmt.Sprintf("%s has VFs of another type (%s): a GPU holds one type, and the layout never clears one", g.PCI, strings.Join(other, ", "))
		return f
	}
	if g.Health == protocol.HealthFailed {
		f.refuse = g.PCI + " is failed"
		if g.Fault != nil {
			f.refuse += " (" + g.Fault.Reason + ")"
		}
		return f
	}
	vfs := len(f.typed) + len(g.FreeVFs)
	f.holds = vfs
	if f.typ.MaxInstances > 0 {
		f.holds = min(vfs, f.typ.MaxInstances)
	}
	if f.holds == 0 {
		f.refuse = g.PCI + " has no VFs enabled (sriov_numvfs is 0): enable them, or give the VFs with --vf"
	}
	return f
}

// proposeLayout chooses, from a host's report, the GPU and the VFs to type
// for ask: ask.PF, else the GPU that holds the most VFs of the type (the
// lowest address among equals). A count the GPU cannot hold is refused with
// the reason.
func proposeLayout(rep protocol.Report, ask layoutAsk) (layoutProposal, error) {
	var fits []gpuFit
	var refusals []string
	for _, g := range rep.GPUs {
		if ask.PF != "" && !strings.EqualFold(g.PCI, ask.PF) {
			continue
		}
		f := fitType(g, ask.Type)
		if f.refuse != "" {
			refusals = append(refusals, f.refuse)
			continue
		}
		fits = append(fits, f)
	}
	switch {
	case ask.PF != "" && len(fits) == 0 && len(refusals) == 0:
		return layoutProposal{}, fmt.Errorf("host %s reports no GPU %s", rep.Host, ask.PF)
	case len(fits) == 0 && len(refusals) == 0:
		return layoutProposal{}, fmt.Errorf("host %s reports no GPU", rep.Host)
	case len(fits) == 0:
		return layoutProposal{}, fmt.Errorf("no GPU of host %s can hold type %s: %s", rep.Host, ask.Type, strings.Join(refusals, "; "))
	}
	slices.SortStableFunc(fits, func(a, b gpuFit) int {
		return cmp.Or(cmp.Compare(b.holds, a.holds), cmp.Compare(a.gpu.PCI, b.gpu.PCI))
	})
	best := fits[0]
	if ask.Count > 0 {
		// The largest GPU that holds the count is the first; a smaller
		// one that also does is not preferred.
		if ask.Count > best.holds {
			return layoutProposal{}, fmt.Errorf("%s cannot hold %d VFs of type %s: %s", best.gpu.PCI, ask.Count, ask.Type, holdsWhy(best))
		}
		if ask.Count < len(best.typed) {
			return layoutProposal{}, fmt.Errorf("%s has %d VFs of type %s already (%s), more than the %d asked: the layout never clears a type",
				best.gpu.PCI, len(best.typed), ask.Type, strings.Join(best.typed, ", "), ask.Count)
		}
	}
	count := cmp.Or(ask.Count, best.holds)
	free := slices.Clone(best.gpu.FreeVFs)
	slices.Sort(free)
	p := layoutProposal{PF: strings.ToLower(best.gpu.PCI), TypeName: best.typ.Name, FramebufferMiB: best.typ.FramebufferMiB,
		MaxInstances: best.typ.MaxInstances, Holds: best.holds, Count: count, Typed: append([]string{}, best.typed...),
		ProductID: best.gpu.VFDeviceID, Others: []string{}, Health: best.gpu.Health}
	// The agent's layout keeps the VFs of the type and types the first
	// free ones in address order: the same VFs.
	p.VFs = append(slices.Clone(p.Typed), free[:count-len(p.Typed)]...)
	p.VFLayout = p.PF + "=" + ask.Type + ":" + strconv.Itoa(count)
	for _, f := range fits[1:] {
		p.Others = append(p.Others, fmt.Sprintf("%s (holds %d)", f.gpu.PCI, f.holds))
	}
	switch {
	case ask.PF != "":
		p.Reason = "--pf; " + holdsWhy(best)
	case len(fits) > 1:
		p.Reason = "holds the most VFs of the type of " + strconv.Itoa(len(fits)) + " GPUs; " + holdsWhy(best)
	default:
		p.Reason = "the only GPU that holds the type; " + holdsWhy(best)
	}
	return p, nil
}

// holdsWhy says what bounds the VFs of the type f's GPU holds.
func holdsWhy(f gpuFit) string {
	maxS := "max instances not reported"
	if f.typ.MaxInstances > 0 {
		maxS = fmt.Sprintf("max instances %d", f.typ.MaxInstances)
	}
	fb := ""
	if f.typ.FramebufferMiB > 0 {
		fb = fmt.Sprintf(", %d MiB each", f.typ.FramebufferMiB)
	}
	return fmt.Sprintf("type %s (%s%s): %s, %d VFs free and %d of the type, so at most %d", f.typ.ID, f.typ.Name, fb, maxS,
		len(f.gpu.FreeVFs), len(f.typed), f.holds)
}

// aliasName proposes a [pci] alias name from a type name:
// "NVIDIA H200X-35C" → "h200x-35c".
func aliasName(typeName, typeID string) string {
	n := strings.TrimSpace(typeName)
	for _, p := range []string{"NVIDIA ", "GRID "} {
		n = strings.TrimPrefix(n, p)
	}
	n = strings.ToLower(strings.Join(strings.Fields(n), "-"))
	if n == "" || strings.Trim(n, "abcdefghijklmnopqrstuvwxyz0123456789-_.") != "" {
		return "vgpu-vf-" + typeID
	}
	return n
}
