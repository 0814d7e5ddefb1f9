package placement

import (
	"context"
	"maps"
	"strings"

	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocationcandidates"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/usages"

	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
)

// ProviderRef is a provider as GET /resource_providers lists it.
type ProviderRef struct {
	UUID       string
	Name       string
	Generation int
	ParentUUID string
	RootUUID   string
}

// ListOpts filters Providers.
type ListOpts struct {
	InTree   string // providers in the tree of this provider
	Name     string
	Required []string // traits
}

// Providers lists resource providers (GET /resource_providers).
func (c *Client) Providers(ctx context.Context, o ListOpts) ([]ProviderRef, error) {
	return retry(ctx, func() ([]ProviderRef, error) {
		opts := resourceproviders.ListOpts{InTree: o.InTree, Name: o.Name, Required: strings.Join(o.Required, ",")}
		pages, err := resourceproviders.List(c.sc, opts).AllPages(ctx)
		if err != nil {
			return nil, classify("GET /resource_providers", err)
		}
		rps, err := resourceproviders.ExtractResourceProviders(pages)
		if err != nil {
			return nil, classify("GET /resource_providers", err)
		}
		out := make([]ProviderRef, len(rps))
		for i, p := range rps {
			out[i] = ProviderRef{UUID: p.UUID, Name: p.Name, Generation: p.Generation, ParentUUID: p.ParentProviderUUID, RootUUID: p.RootProviderUUID}
		}
		return out, nil
	})
}

// Inventories returns a provider's inventories and its generation.
func (c *Client) Inventories(ctx context.Context, rp string) (map[string]engine.Inventory, int, error) {
	type out struct {
		Gen int                         `json:"resource_provider_generation"`
		Inv map[string]engine.Inventory `json:"inventories"`
	}
	o, err := retry(ctx, func() (out, error) {
		var o out
		r := resourceproviders.GetInventories(ctx, c.sc, rp)
		if r.Err != nil {
			return o, classify("GET /resource_providers/{uuid}/inventories", r.Err)
		}
		// Decoded here rather than by Extract: allocation_ratio as float64.
		return o, classify("GET /resource_providers/{uuid}/inventories", r.ExtractInto(&o))
	})
	return o.Inv, o.Gen, err
}

// Traits returns a provider's traits and its generation.
func (c *Client) Traits(ctx context.Context, rp string) ([]string, int, error) {
	t, err := retry(ctx, func() (*resourceproviders.ResourceProviderTraits, error) {
		t, err := resourceproviders.GetTraits(ctx, c.sc, rp).Extract()
		return t, classify("GET /resource_providers/{uuid}/traits", err)
	})
	if err != nil {
		return nil, 0, err
	}
	return t.Traits, t.ResourceProviderGeneration, nil
}

// Usages returns a provider's usages by resource class and its generation.
func (c *Client) Usages(ctx context.Context, rp string) (map[string]int, int, error) {
	u, err := retry(ctx, func() (*resourceproviders.ResourceProviderUsage, error) {
		u, err := resourceproviders.GetUsages(ctx, c.sc, rp).Extract()
		return u, classify("GET /resource_providers/{uuid}/usages", err)
	})
	if err != nil {
		return nil, 0, err
	}
	return u.Usages, u.ResourceProviderGeneration, nil
}

// Aggregates returns a provider's aggregate UUIDs and its generation.
func (c *Client) Aggregates(ctx context.Context, rp string) ([]string, int, error) {
	a, err := retry(ctx, func() (*resourceproviders.ResourceProviderAggregates, error) {
		a, err := resourceproviders.GetAggregates(ctx, c.sc, rp).Extract()
		return a, classify("GET /resource_providers/{uuid}/aggregates", err)
	})
	if err != nil {
		return nil, 0, err
	}
	gen := 0
	if a.ResourceProviderGeneration != nil {
		gen = *a.ResourceProviderGeneration
	}
	return a.Aggregates, gen, nil
}

// ProviderAllocations returns, per consumer, what it holds on a provider.
func (c *Client) ProviderAllocations(ctx context.Context, rp string) (map[string]map[string]int, int, error) {
	a, err := retry(ctx, func() (*resourceproviders.ResourceProviderAllocations, error) {
		a, err := resourceproviders.GetAllocations(ctx, c.sc, rp).Extract()
		return a, classify("GET /resource_providers/{uuid}/allocations", err)
	})
	if err != nil {
		return nil, 0, err
	}
	out := make(map[string]map[string]int, len(a.Allocations))
	for consumer, al := range a.Allocations {
		out[consumer] = al.Resources
	}
	return out, a.ResourceProviderGeneration, nil
}

// Consumer is a consumer's allocations (GET /allocations/{consumer}).
type Consumer struct {
	UUID       string
	Generation *int // nil: the consumer does not exist yet
	ProjectID  string
	UserID     string
	Type       string                    // consumer_type (1.38+), e.g. INSTANCE
	Providers  map[string]map[string]int // provider uuid → class → amount
	ProviderGn map[string]int            // provider generations seen
}

// clone is a deep copy of c (nil for nil).
func (c *Consumer) clone() *Consumer {
	if c == nil {
		return nil
	}
	out := *c
	out.Providers = make(map[string]map[string]int, len(c.Providers))
	for rp, res := range c.Providers {
		out.Providers[rp] = maps.Clone(res)
	}
	out.ProviderGn = maps.Clone(c.ProviderGn)
	if c.Generation != nil {
		g := *c.Generation
		out.Generation = &g
	}
	return &out
}

// Allocations reads a consumer's allocations. An unknown consumer comes
// back with no providers and a nil Generation.
func (c *Client) Allocations(ctx context.Context, consumer string) (*Consumer, error) {
	return retry(ctx, func() (*Consumer, error) {
		a, err := allocations.Get(ctx, c.sc, consumer).Extract()
		if err != nil {
			return nil, classify("GET /allocations/{consumer}", err)
		}
		out := &Consumer{UUID: consumer, Generation: a.ConsumerGeneration, Providers: map[string]map[string]int{}, ProviderGn: map[string]int{}}
		if a.ProjectID != nil {
			out.ProjectID = *a.ProjectID
		}
		if a.UserID != nil {
			out.UserID = *a.UserID
		}
		// Placement shows "unknown" for a consumer written without a type
		// (Nova before 2023.1 writes none) and refuses it in a PUT
		// (^[A-Z0-9_]+$): leave it empty so writers set theirs.
		if a.ConsumerType != nil && *a.ConsumerType != "unknown" {
			out.Type = *a.ConsumerType
		}
		for rp, pa := range a.Allocations {
			out.Providers[rp] = pa.Resources
			out.ProviderGn[rp] = pa.Generation
		}
		return out, nil
	})
}

// PutAllocations replaces a consumer's allocations (PUT
// /allocations/{consumer}) guarded by its generation. It is not retried:
// callers handle conflicts, and a retried write might double-apply.
func (c *Client) PutAllocations(ctx context.Context, con *Consumer) error {
	opts := allocations.UpdateOpts{
		Allocations:        make(map[string]allocations.ProviderAllocationsOpts, len(con.Providers)),
		ProjectID:          con.ProjectID,
		UserID:             con.UserID,
		ConsumerGeneration: con.Generation,
		ConsumerType:       con.Type,
	}
	for rp, res := range con.Providers {
		if len(res) > 0 {
			opts.Allocations[rp] = allocations.ProviderAllocationsOpts{Resources: res}
		}
	}
	return classify("PUT /allocations/{consumer}", allocations.Update(ctx, c.sc, con.UUID, opts).ExtractErr())
}

// PostAllocations writes several consumers' allocations atomically
// (POST /allocations).
func (c *Client) PostAllocations(ctx context.Context, cons []*Consumer) error {
	m := allocations.ManageOpts{}
	for _, con := range cons {
		u := allocations.UpdateOpts{
			Allocations:        map[string]allocations.ProviderAllocationsOpts{},
			ProjectID:          con.ProjectID,
			UserID:             con.UserID,
			ConsumerGeneration: con.Generation,
			ConsumerType:       con.Type,
		}
		for rp, res := range con.Providers {
			if len(res) > 0 {
				u.Allocations[rp] = allocations.ProviderAllocationsOpts{Resources: res}
			}
		}
		m[con.UUID] = u
	}
	return classify("POST /allocations", allocations.Manage(ctx, c.sc, m).ExtractErr())
}

// ProjectUsages returns a project's usages by consumer type (GET /usages).
func (c *Client) ProjectUsages(ctx context.Context, project, user string) (map[string]map[string]int, error) {
	return retry(ctx, func() (map[string]map[string]int, error) {
		u, err := usages.Get(ctx, c.sc, usages.GetOpts{ProjectID: project, UserID: user}).Extract()
		if err != nil {
			return nil, classify("GET /usages", err)
		}
		out := map[string]map[string]int{}
		for k, v := range u.Usages {
			out[k] = v
		}
		return out, nil
	})
}

// ProjectClassUsages returns a project's usage by resource class, every
// consumer together, as Nova reads it for its unified limits: GET
// /usages?project_id= at microversion 1.9
// (nova.scheduler.client.report.SchedulerReportClient.get_usages_counts_for_limits,
// GET_USAGES_VERSION). A class the project does not use is absent.
func (c *Client) ProjectClassUsages(ctx context.Context, project string) (map[string]int, error) {
	sc := *c.sc
	sc.Microversion = "1.9"
	return retry(ctx, func() (map[string]int, error) {
		var body struct {
			Usages map[string]int `json:"usages"`
		}
		if err := usages.Get(ctx, &sc, usages.GetOpts{ProjectID: project}).ExtractInto(&body); err != nil {
			return nil, classify("GET /usages", err)
		}
		return body.Usages, nil
	})
}

// CandidatesOpts is the query of GET /allocation_candidates.
type CandidatesOpts struct {
	Resources string   // "VGPU:1"
	Required  []string // each one a required= parameter (1.39: repeatable)
	InTree    string
	Limit     int
}

// CandidatesCount asks Placement for allocation candidates and returns
// how many it answered, with the provider of the first one's VGPU. The
// bench harness compares it with the engine.
func (c *Client) CandidatesCount(ctx context.Context, o CandidatesOpts, class string) (int, string, error) {
	opts := allocationcandidates.ListOpts{Resources: o.Resources, Required: o.Required, InTree: o.InTree, Limit: o.Limit}
	pages, err := allocationcandidates.List(c.sc, opts).AllPages(ctx)
	if err != nil {
		return 0, "", classify("GET /allocation_candidates", err)
	}
	ac, err := allocationcandidates.ExtractAllocationCandidates(pages)
	if err != nil {
		return 0, "", classify("GET /allocation_candidates", err)
	}
	first := ""
	if len(ac.AllocationRequests) > 0 {
		for rp, r := range ac.AllocationRequests[0].Allocations {
			if r.Resources[class] > 0 {
				first = rp
			}
		}
	}
	return len(ac.AllocationRequests), first, nil
}

// AssociatedTraits lists the traits some provider carries
// (GET /traits?associated=true).
func (c *Client) AssociatedTraits(ctx context.Context) ([]string, error) {
	return retry(ctx, func() ([]string, error) {
		yes := true
		pages, err := traits.List(c.sc, traits.ListOpts{Associated: &yes}).AllPages(ctx)
		if err != nil {
			return nil, classify("GET /traits", err)
		}
		ts, err := traits.ExtractTraits(pages)
		return ts, classify("GET /traits", err)
	})
}
