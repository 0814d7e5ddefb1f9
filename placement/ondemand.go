package placement

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

// ErrNoRetype says no re-type on demand was made: [placement]
// retype_on_demand is off, or no bridge-owned GPU of the host is empty
// and able to take the type (the error says why for each).
var ErrNoRetype = errors.New("no bridge-owned GPU re-typed")

// ErrNoOwnedGPUs is ErrNoRetype for a host with no GPU in [placement]
// bridge_owned_gpus: nothing there is the bridge's to re-type.
var ErrNoOwnedGPUs = fmt.Errorf("%w: the host has no GPU in [placement] bridge_owned_gpus", ErrNoRetype)

// OnDemand is a claim that found no capacity, for RetypeOnDemand.
type OnDemand struct {
	Host    string   // Nova's compute service host of the instance
	Trait   string   // the type trait the claim requires
	Count   int      // units it needs on one GPU (0: 1)
	Exclude []string // GPU providers the claim must not use
}

// Retyped is a re-type RetypeOnDemand made.
type Retyped struct {
	Host     string
	PCI      string
	Provider string // the GPU's provider uuid
	From     string // the type it offered before
	To       string // the type it offers now
}

// RetypeOnDemand re-types, for a direct-path claim that found no capacity
// (d), an empty bridge-owned GPU (VF or mdev) of d.Host to the type of d.Trait
// through Retype (the same steps and the same checks), and returns it,
// offering that type, for the claim to be made there.
//
// The GPU is chosen deterministically: one whose re-type to that type a
// stopped bridge left unfinished first (it is finished), then the host's
// declared GPUs by PCI address, whatever their order in the option (of
// two empty GPUs the lower address is re-typed, the other keeps its type:
// TestRetypeOnDemandTwoEmptyGPUs). A GPU qualifies when it is not re-typing
// to another type, does not offer the type already, holds no VF typed by
// the bridge (a VF GPU) or mdev of the bridge (an mdev GPU), has no unit
// allocated on its provider, is not excluded, and
// its agent's last report lists the type creatable at least d.Count
// times. None qualifying is ErrNoRetype, naming why for each GPU; with
// [placement] retype_on_demand off, the first GPU that qualifies is named
// in an ErrNoRetype (for an operator to re-type) and nothing changes. A claim that lands on the GPU while it is re-typed undoes
// the re-type (ErrRetypeInUse); a re-type interrupted otherwise returns
// that error and the GPU stays as Retype left it (finished by a retry or
// by PublishOwned).
//
// It calls Placement and writes the bridge's state with no transaction
// open: callers must hold none.
func (s *Service) RetypeOnDemand(ctx context.Context, d OnDemand) (Retyped, error) {
	if s.store == nil {
		return Retyped{}, fmt.Errorf("%w: no database", ErrNoRetype)
	}
	n := max(d.Count, 1)
	var decls []OwnedDecl
	for _, o := range s.cfg.OwnedGPUs {
		if o.Host == d.Host && !o.Mixed() { // a mixed GPU is claimed on as it is (ClaimMixed)
			decls = append(decls, o)
		}
	}
	if len(decls) == 0 {
		return Retyped{}, ErrNoOwnedGPUs
	}
	rows, err := s.retypeRows(ctx)
	if err != nil {
		return Retyped{}, err
	}
	r, err := s.hostReport(ctx, d.Host)
	if err != nil {
		return Retyped{}, fmt.Errorf("%w: %v", ErrNoRetype, err)
	}
	// Unfinished re-types to the type first, then by address.
	resuming := func(o OwnedDecl) bool {
		i := slices.IndexFunc(rows, func(x retypeRow) bool { return x.host == o.Host && x.pci == o.PCI })
		return i >= 0 && rows[i].step != RetypeDone && catalog.TraitFor(rows[i].typeID) == d.Trait
	}
	slices.SortStableFunc(decls, func(a, b OwnedDecl) int {
		ra, rb := resuming(a), resuming(b)
		switch {
		case ra && !rb:
			return -1
		case rb && !ra:
			return 1
		}
		return strings.Compare(a.PCI, b.PCI)
	})
	var why []string
	for _, o := range decls {
		c, reason, err := s.retypeCandidate(ctx, o, rows, r, d, n)
		if err != nil {
			return Retyped{}, err
		}
		if reason != "" {
			why = append(why, o.PCI+": "+reason)
			continue
		}
		if !s.cfg.RetypeOnDemand {
			// Off: the answer names the GPU an operator can re-type.
			return Retyped{}, fmt.Errorf("%w: [placement] retype_on_demand is off; GPU %s of host %s is empty and can take %s: "+
				"vgpuctl gpu retype %s/%s %s", ErrNoRetype, c.PCI, c.Host, d.Trait, c.Host, c.PCI, c.To)
		}
		s.log.Info("placement: re-typing a bridge-owned GPU on demand", logkey.Host, c.Host, "pci", c.PCI, "from", c.From, "to", c.To,
			"trait", d.Trait)
		if err := s.Retype(ctx, c.Host, c.PCI, c.To); err != nil {
			return Retyped{}, err
		}
		node := r.Node
		if node == "" {
			node = c.Host
		}
		s.knowOwned(ctx, c.Provider, GPUProviderName(node, c.PCI), d.Trait, n)
		return c, nil
	}
	return Retyped{}, fmt.Errorf("%w: no bridge-owned GPU of host %s is empty and can take %s (%s)", ErrNoRetype, d.Host, d.Trait, strings.Join(why, "; "))
}

// retypeCandidate says whether the declared GPU o can be re-typed for d:
// the re-type to make, or why not (reason).
func (s *Service) retypeCandidate(ctx context.Context, o OwnedDecl, rows []retypeRow, r protocol.Report, d OnDemand, n int) (Retyped, string, error) {
	c := Retyped{Host: o.Host, PCI: o.PCI, From: o.TypeID}
	if i := slices.IndexFunc(rows, func(x retypeRow) bool { return x.host == o.Host && x.pci == o.PCI }); i >= 0 {
		row := rows[i]
		if row.step != RetypeDone {
			if catalog.TraitFor(row.typeID) != d.Trait {
				return c, fmt.Sprintf("a re-type to %s is in progress (step %s)", row.typeID, row.step), nil
			}
			c.From = row.from // finished below (Retype resumes it)
		} else {
			c.From = row.typeID
		}
	}
	if catalog.TraitFor(c.From) == d.Trait {
		return c, "offers the type already, with no room", nil
	}
	g, ok := ownedReportGPU(r, o.PCI, o.TypeID)
	if !ok {
		return c, "not in its agent's last report as a " + gpuKind(o.TypeID), nil
	}
	if k := bridgeVGPUs(g); k > 0 {
		return c, fmt.Sprintf("in use (%d %s)", k, vgpuNoun(g)), nil
	}
	i := slices.IndexFunc(g.Types, func(t protocol.VGPUType) bool { return catalog.TraitFor(t.ID) == d.Trait })
	if i < 0 || g.Types[i].AvailableInstances < n {
		return c, fmt.Sprintf("the agent does not report %d × %s creatable (creatable: %s)", n, d.Trait, creatable(g)), nil
	}
	c.To = g.Types[i].ID
	rp, err := s.ownedRP(ctx, r, o.Host, o.PCI)
	if err != nil {
		return c, err.Error(), nil
	}
	c.Provider = rp
	if slices.Contains(d.Exclude, rp) {
		return c, "excluded by the request", nil
	}
	used, err := s.ownedUsed(ctx, rp)
	if err != nil {
		return c, "", err
	}
	if used > 0 {
		return c, fmt.Sprintf("in use (%d unit(s) allocated on its provider)", used), nil
	}
	return c, "", nil
}

// knowOwned makes sure the index sees the re-typed GPU's provider offer
// trait (a claim on it checks the index): the sync after the re-type
// does that, unless another replica held the sync lock; then the
// provider is read here.
func (s *Service) knowOwned(ctx context.Context, rp, name, trait string, n int) {
	if g, ok := s.index.Lookup(rp); ok && g.HasTrait(trait) && g.Free() >= n {
		return
	}
	ps, err := s.client.Providers(ctx, ListOpts{Name: name})
	if err != nil || len(ps) != 1 || ps[0].UUID != rp {
		s.log.Warn("placement: re-typed GPU not read back", logkey.Provider, rp, logkey.Err, err)
		return
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	p, err := s.syncer.fetch(ctx, ps[0])
	if err != nil {
		s.log.Warn("placement: re-typed GPU not read back", logkey.Provider, rp, logkey.Err, err)
		return
	}
	s.index.Apply(p)
}
