package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// Placement is what the pipeline needs of the placement feature.
type Placement interface {
	// Claim adds count units of the type trait on a GPU of node to the
	// consumer's allocations.
	Claim(ctx context.Context, c ClaimSpec) (Claimed, error)
	// Holdings lists the consumer's vGPU units by GPU provider, and
	// returns the allocations it read, for a Claim that follows
	// (ClaimSpec.Read).
	Holdings(ctx context.Context, consumer string) ([]placement.Holding, *placement.Consumer, error)
	// CachedHoldings is Holdings from what was last read or written of
	// the consumer when that is known (no Placement call), for a claim's
	// base: a stale answer costs the claim a 409 and a read, never a wrong
	// write.
	CachedHoldings(ctx context.Context, consumer string) ([]placement.Holding, *placement.Consumer, error)
	// Forget drops what is known of the consumer (it is gone).
	Forget(consumer string)
	// ReleaseUnits takes amount units of class off the consumer's
	// allocation on provider, keeping its other allocations. heldAfter is
	// what the consumer held there right after the claim: when it now
	// holds less, the release is taken as done already (a retry).
	ReleaseUnits(ctx context.Context, consumer, provider, class string, amount, heldAfter int) error
	// GPUAddress is the PCI address of a GPU provider ("" if unknown).
	GPUAddress(provider string) string
}

// ClaimSpec is one claim to make.
type ClaimSpec struct {
	Consumer  string
	ProjectID string
	UserID    string
	Node      string // root provider name of the instance's host
	Trait     string
	Count     int
	Exclude   []string // GPU providers to skip
	// Provider, when set, is the one GPU provider to claim on (a vGPU
	// held off its host claimed again where its mdev is).
	Provider string
	// Read is the consumer's allocations from Holdings just before: the
	// claim writes on them first, one Placement read fewer (a stale Read
	// is caught by the consumer generation and read again).
	Read *placement.Consumer
}

// Claimed is a claim made.
type Claimed struct {
	Provider string
	Node     string
	Class    string
	Amount   int
	Held     int
}

// ErrNoCapacity says no GPU of the host can take the request.
var ErrNoCapacity = errors.New("no vGPU capacity")

// ErrNoAddress says a claim landed on a GPU provider whose name gives no
// PCI address: like ErrNoCapacity, it fails the act instead of being
// tried again.
var ErrNoAddress = errors.New("the GPU provider's name carries no PCI address (<node>_pci_DDDD_BB_SS_F)")

// Retyper is what a Placement that re-types bridge-owned VF GPUs on
// demand adds ([placement] retype_on_demand): the direct path asks it
// after a claim found no capacity, with no transaction open.
type Retyper interface {
	// RetypeFor re-types an empty bridge-owned GPU of the spec's host to
	// the type of its trait, and returns it offering that type. It fails
	// with ErrNoRetype when no GPU was re-typed (the option is off, or
	// none qualifies: the error says why), with ErrNoCapacity when a
	// claim landed on the GPU meanwhile (the re-type was undone); any
	// other error is a re-type interrupted (the event is tried again).
	RetypeFor(ctx context.Context, r RetypeSpec) (Retyped, error)
}

// MixedClaimer is what a Placement with mixed bridge-owned VF GPUs
// ([placement] bridge_owned_gpus = HOST/PF=mixed) adds: the direct
// path claims a type's framebuffer there when no GPU of the type has room.
type MixedClaimer interface {
	// ClaimMixed claims c.Count vGPUs of c.Trait on a mixed GPU of host:
	// Claimed.Amount is their framebuffer in MiB (of
	// placement.BridgeFBClass), Amount/Count each. ErrNoCapacity when
	// none of the host's holds it (or the host has none).
	ClaimMixed(ctx context.Context, host string, c ClaimSpec) (Claimed, error)
}

// RetypeSpec is the claim that found no capacity.
type RetypeSpec struct {
	Host    string // the instance's compute service host
	Trait   string
	Count   int
	Exclude []string
}

// Retyped is a GPU re-typed for a claim.
type Retyped struct {
	Host, PCI, Provider, From, To string
}

// ErrNoRetype says no GPU was re-typed on demand.
var ErrNoRetype = placement.ErrNoRetype

// ErrNoOwnedGPUs is ErrNoRetype for a host with no bridge-owned GPU.
var ErrNoOwnedGPUs = placement.ErrNoOwnedGPUs

// ServiceAdapter implements Placement over *placement.Service.
type ServiceAdapter struct {
	S *placement.Service
}

var (
	_ Placement    = ServiceAdapter{}
	_ Retyper      = ServiceAdapter{}
	_ MixedClaimer = ServiceAdapter{}
)

// ClaimMixed implements MixedClaimer.
func (a ServiceAdapter) ClaimMixed(ctx context.Context, host string, c ClaimSpec) (Claimed, error) {
	cl, err := a.S.ClaimMixed(ctx, placement.MixedClaim{Consumer: c.Consumer, ProjectID: c.ProjectID, UserID: c.UserID, Host: host,
		Trait: c.Trait, Count: c.Count, Exclude: c.Exclude, Read: c.Read})
	if errors.Is(err, placement.ErrNoCapacity) {
		return Claimed{}, fmt.Errorf("%w: %w", ErrNoCapacity, err)
	}
	if err != nil {
		return Claimed{}, err
	}
	return Claimed{Provider: cl.Provider, Node: c.Node, Class: cl.Class, Amount: cl.Amount, Held: cl.Held}, nil
}

// Claim implements Placement.
func (a ServiceAdapter) Claim(ctx context.Context, c ClaimSpec) (Claimed, error) {
	if c.Provider != "" {
		cl, err := a.S.ClaimOn(ctx, placement.ClaimRequest{Consumer: c.Consumer, ProjectID: c.ProjectID, UserID: c.UserID,
			Request: engine.Request{Required: []string{c.Trait}, Count: c.Count}, Read: c.Read}, c.Provider)
		if errors.Is(err, placement.ErrNoCapacity) {
			return Claimed{}, fmt.Errorf("%w: %v", ErrNoCapacity, err)
		}
		if err != nil {
			return Claimed{}, err
		}
		return Claimed{Provider: cl.Provider, Node: cl.Host, Class: cl.Class, Amount: cl.Amount, Held: cl.Held}, nil
	}
	q, err := a.S.Engine().Normalize(engine.Request{Required: []string{c.Trait}, Count: c.Count, Hosts: []string{c.Node}, ExcludeGPUs: c.Exclude})
	if err != nil {
		return Claimed{}, err
	}
	cl, err := a.S.Claim(ctx, placement.ClaimRequest{Consumer: c.Consumer, ProjectID: c.ProjectID, UserID: c.UserID, Request: q, Read: c.Read})
	if errors.Is(err, placement.ErrNoCapacity) {
		return Claimed{}, fmt.Errorf("%w: %v%s", ErrNoCapacity, err, a.retypeHint(ctx, c))
	}
	if err != nil {
		return Claimed{}, err
	}
	return Claimed{Provider: cl.Provider, Node: cl.Host, Class: cl.Class, Amount: cl.Amount, Held: cl.Held}, nil
}

// retypeHint says, after a claim found no room, which empty GPU of the
// node could serve it once re-typed ("needs_retype"): a GPU holds one
// vGPU type and the bridge does not change a Nova-owned one. For a
// Nova-owned mdev GPU the hint carries its host's exact nova.conf change
// and the vgpuctl command that applies it (placement.ExplainRetypes).
// "" when none could.
func (a ServiceAdapter) retypeHint(ctx context.Context, c ClaimSpec) string {
	var d placement.DryRunRequest
	d.Traits.Required = []string{c.Trait}
	d.Count, d.Host, d.AllowRetype, d.ExcludeGPUs, d.Limit = c.Count, c.Node, true, c.Exclude, 1
	out, err := a.S.DryRun(d)
	if err != nil || len(out.Candidates) == 0 || !out.Candidates[0].NeedsRetype {
		return ""
	}
	a.S.ExplainRetypes(ctx, &out)
	g := out.Candidates[0]
	if g.NovaConf != nil {
		return fmt.Sprintf("; needs_retype: GPU %s (provider %s) is empty but offers %s; the bridge does not re-type Nova-owned GPUs: "+
			"run %q (drains the host, applies the nova.conf change through the agent's gpu_retype_command, waits for the provider's trait %s, "+
			"undrains), or set the host's nova.conf to:\n%s", g.PCIAddress, g.ProviderUUID, orDefault(g.RetypeFrom, "another type"),
			g.RetypeCommand, c.Trait, g.NovaConf.Text)
	}
	return fmt.Sprintf("; needs_retype: GPU %s (provider %s) is empty but offers %s; the bridge does not re-type GPUs: an operator can set it to %s "+
		"(Nova's [devices] enabled_mdev_types and its provider's trait) and retry", orDefault(g.PCIAddress, "?"), g.ProviderUUID, orDefault(g.RetypeFrom, "another type"), c.Trait)
}

// RetypeFor implements Retyper.
func (a ServiceAdapter) RetypeFor(ctx context.Context, r RetypeSpec) (Retyped, error) {
	rt, err := a.S.RetypeOnDemand(ctx, placement.OnDemand{Host: r.Host, Trait: r.Trait, Count: r.Count, Exclude: r.Exclude})
	switch {
	case errors.Is(err, placement.ErrNoRetype):
		return Retyped{}, err
	case errors.Is(err, placement.ErrRetypeInUse), errors.Is(err, placement.ErrRetypeNotCreatable):
		return Retyped{}, fmt.Errorf("%w: %v", ErrNoCapacity, err)
	case err != nil:
		return Retyped{}, err
	}
	return Retyped{Host: rt.Host, PCI: rt.PCI, Provider: rt.Provider, From: rt.From, To: rt.To}, nil
}

// Holdings implements Placement.
// The pipeline reads them when a Nova notification says they changed
// (a creation, a move): the mirror's record of the consumer is made to
// agree (a provider Nova took them off keeps its generation, so the
// incremental sync would not see it).
func (a ServiceAdapter) Holdings(ctx context.Context, consumer string) ([]placement.Holding, *placement.Consumer, error) {
	hl, con, err := a.S.ReadVGPU(ctx, consumer)
	if err == nil {
		a.S.ReconcileConsumer(ctx, con)
	}
	return hl, con, err
}

// CachedHoldings implements Placement.
func (a ServiceAdapter) CachedHoldings(ctx context.Context, consumer string) ([]placement.Holding, *placement.Consumer, error) {
	hl, con, _, err := a.S.CachedVGPU(ctx, consumer)
	return hl, con, err
}

// Forget implements Placement.
func (a ServiceAdapter) Forget(consumer string) { a.S.ForgetConsumer(consumer) }

// GPUAddress implements Placement.
func (a ServiceAdapter) GPUAddress(provider string) string {
	if g, ok := a.S.Index().Lookup(provider); ok {
		return g.PCIAddress()
	}
	return a.S.MixedPCI(provider)
}

// ReleaseUnits implements Placement.
func (a ServiceAdapter) ReleaseUnits(ctx context.Context, consumer, provider, class string, amount, heldAfter int) error {
	return a.S.ReleaseUnits(ctx, consumer, provider, class, amount, heldAfter)
}
