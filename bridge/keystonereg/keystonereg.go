// Package keystonereg puts the bridge in Keystone's catalog: a service of
// type "vgpu" and its endpoints, as `openstack service create` and
// `openstack endpoint create` would, but idempotently, so that an install
// step can run it on every deploy.
package keystonereg

import (
	"context"
	"fmt"
	"net/url"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"
)

// ServiceType is the bridge's type in the catalog; clients (vgpuctl
// --os-cloud) look it up by it.
const ServiceType = "vgpu"

// Options say what to register.
type Options struct {
	Name        string            // service name; default "vgpu-bridge"
	Description string            // default names the project
	Region      string            // region of the endpoints; "" for none
	URLs        map[string]string // interface (public, internal, admin) → URL; public is required
}

// Change is one thing Register did or found, for the operator.
type Change struct {
	What   string // "service" or "endpoint public", …
	Action string // "created", "updated" or "unchanged"
	ID     string
	URL    string
}

// Register makes sure a service of ServiceType exists and has one
// endpoint per interface in o.URLs in o.Region with that URL, creating or
// updating what differs; it never deletes. identity is an admin's
// identity v3 client.
func Register(ctx context.Context, identity *gophercloud.ServiceClient, o Options) ([]Change, error) {
	if o.URLs["public"] == "" {
		return nil, fmt.Errorf("a public URL is required")
	}
	for iface, u := range o.URLs {
		switch iface {
		case "public", "internal", "admin":
		default:
			return nil, fmt.Errorf("interface %q: allowed: public, internal, admin", iface)
		}
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return nil, fmt.Errorf("%s URL %q: want http(s)://host[:port][/path]", iface, u)
		}
	}
	if o.Name == "" {
		o.Name = "vgpu-bridge"
	}
	if o.Description == "" {
		o.Description = "vgpu-bridge: elastic NVIDIA vGPU for OpenStack"
	}
	var changes []Change

	pages, err := services.List(identity, services.ListOpts{ServiceType: ServiceType}).AllPages(ctx)
	if err != nil {
		return nil, fmt.Errorf("list services of type %s: %w", ServiceType, err)
	}
	svcs, err := services.ExtractServices(pages)
	if err != nil {
		return nil, err
	}
	var svc *services.Service
	for i := range svcs {
		if svcs[i].Name == o.Name || svc == nil {
			svc = &svcs[i]
		}
	}
	if svc == nil {
		enabled := true
		svc, err = services.Create(ctx, identity, services.CreateOpts{Type: ServiceType, Name: o.Name, Description: o.Description,
			Enabled: &enabled}).Extract()
		if err != nil {
			return nil, fmt.Errorf("create service %s: %w", o.Name, err)
		}
		changes = append(changes, Change{What: "service", Action: "created", ID: svc.ID})
	} else {
		changes = append(changes, Change{What: "service", Action: "unchanged", ID: svc.ID})
	}

	pages, err = endpoints.List(identity, endpoints.ListOpts{ServiceID: svc.ID}).AllPages(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the endpoints of %s: %w", svc.ID, err)
	}
	eps, err := endpoints.ExtractEndpoints(pages)
	if err != nil {
		return nil, err
	}
	for _, iface := range []string{"public", "internal", "admin"} {
		want := o.URLs[iface]
		if want == "" {
			continue
		}
		what := "endpoint " + iface
		var have *endpoints.Endpoint
		for i := range eps {
			e := &eps[i]
			if string(e.Availability) == iface && (e.Region == o.Region || e.RegionID == o.Region) {
				have = e
				break
			}
		}
		switch {
		case have == nil:
			e, err := endpoints.Create(ctx, identity, endpoints.CreateOpts{Availability: gophercloud.Availability(iface),
				Region: o.Region, URL: want, ServiceID: svc.ID}).Extract()
			if err != nil {
				return changes, fmt.Errorf("create the %s endpoint: %w", iface, err)
			}
			changes = append(changes, Change{What: what, Action: "created", ID: e.ID, URL: want})
		case have.URL != want:
			e, err := endpoints.Update(ctx, identity, have.ID, endpoints.UpdateOpts{URL: want}).Extract()
			if err != nil {
				return changes, fmt.Errorf("update the %s endpoint %s: %w", iface, have.ID, err)
			}
			changes = append(changes, Change{What: what, Action: "updated", ID: e.ID, URL: want})
		default:
			changes = append(changes, Change{What: what, Action: "unchanged", ID: have.ID, URL: want})
		}
	}
	return changes, nil
}
