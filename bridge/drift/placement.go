package drift

import (
	"context"

	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// ServiceAdapter implements Placement over *placement.Service: reads go
// to the Placement API, releases are placement.Service.ReleaseUnits.
type ServiceAdapter struct {
	S *placement.Service
}

var (
	_ Placement     = ServiceAdapter{}
	_ ConsumerTyper = ServiceAdapter{}
	_ NovaVFClasses = ServiceAdapter{}
	_ MixedOwned    = ServiceAdapter{}
)

// MixedPFs implements MixedOwned.
func (a ServiceAdapter) MixedPFs() map[string][]string { return a.S.MixedPFs() }

// IsNovaVF implements NovaVFClasses.
func (a ServiceAdapter) IsNovaVF(class string) bool { return a.S.IsNovaVF(class) }

// ConsumerType implements ConsumerTyper (GET /allocations/{consumer}).
func (a ServiceAdapter) ConsumerType(ctx context.Context, consumer string) (string, error) {
	c, err := a.S.Client().Allocations(ctx, consumer)
	if err != nil {
		return "", err
	}
	return c.Type, nil
}

// ProviderAllocations implements Placement.
func (a ServiceAdapter) ProviderAllocations(ctx context.Context, provider string) (map[string]map[string]int, error) {
	m, _, err := a.S.Client().ProviderAllocations(ctx, provider)
	return m, err
}

// ReleaseUnits implements Placement.
func (a ServiceAdapter) ReleaseUnits(ctx context.Context, consumer, provider, class string, amount, heldAfter int) error {
	return a.S.ReleaseUnits(ctx, consumer, provider, class, amount, heldAfter)
}
