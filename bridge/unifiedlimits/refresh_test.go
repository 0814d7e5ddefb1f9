package unifiedlimits_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/registeredlimits"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/unifiedlimits"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestRefreshInBackground: with a TTL of an hour, a changed limit in the
// real Keystone is not seen by Limits (the cache answers) until Run,
// every Refresh, reads the project's limits again: a raised project limit
// of class:VGPU, then, with the project limit deleted, the changed
// registered one.
func TestRefreshInBackground(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := testsvc.KeystoneAdmin(ctx, t)
	svc, err := services.Create(ctx, admin, services.CreateOpts{Type: "vgpu-test-compute", Name: testsvc.Name("refresh")}).Extract()
	testsvc.Must(t, err, "create service")
	t.Cleanup(func() { services.Delete(context.Background(), admin, svc.ID) })
	ep, err := endpoints.Create(ctx, admin, endpoints.CreateOpts{Availability: gophercloud.AvailabilityPublic, Region: "RegionOne",
		URL: "http://127.0.0.1:1/compute", ServiceID: svc.ID}).Extract()
	testsvc.Must(t, err, "create endpoint")
	rl, err := registeredlimits.BatchCreate(ctx, admin, registeredlimits.BatchCreateOpts{{ServiceID: svc.ID, RegionID: "RegionOne",
		ResourceName: unifiedlimits.ResourceVGPU, DefaultLimit: 2}}).Extract()
	testsvc.Must(t, err, "register class:VGPU")
	t.Cleanup(func() { registeredlimits.Delete(context.Background(), admin, rl[0].ID) })
	p, err := projects.Create(ctx, admin, projects.CreateOpts{Name: testsvc.Name("refresh"), DomainID: "default"}).Extract()
	testsvc.Must(t, err, "create project")
	t.Cleanup(func() { projects.Delete(context.Background(), admin, p.ID) })
	project := p.ID
	pl, err := limits.BatchCreate(ctx, admin, limits.BatchCreateOpts{{ServiceID: svc.ID, RegionID: "RegionOne", ProjectID: project,
		ResourceName: unifiedlimits.ResourceVGPU, ResourceLimit: 1}}).Extract()
	testsvc.Must(t, err, "project limit")

	yaml := fmt.Sprintf("clouds:\n  limits:\n    auth:\n      auth_url: %s\n      username: admin\n      password: %s\n"+
		"      system_scope: all\n      user_domain_name: Default\n    identity_api_version: 3\n", testsvc.KeystoneURL(), testsvc.KeystoneAdminPassword(t))
	ks, err := keystoneauth.NewKeystone(keystoneauth.KeystoneConfig{Cloud: "limits", Timeout: 30 * time.Second,
		ParseOptions: []clouds.ParseOption{clouds.WithCloudsYAML(strings.NewReader(yaml))}})
	testsvc.Must(t, err, "keystone client")
	src, err := unifiedlimits.New(unifiedlimits.Config{ComputeEndpointID: ep.ID, TTL: time.Hour, Refresh: 100 * time.Millisecond},
		ks, nil)
	testsvc.Must(t, err, "source")

	vgpu := func(project string) unifiedlimits.Limit {
		t.Helper()
		ls, err := src.Limits(ctx, project)
		testsvc.Must(t, err, "limits of "+project)
		return ls[0]
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within a minute", what)
			}
		}
	}
	want := func(l unifiedlimits.Limit, n int, origin string) bool { return l.Limit == n && l.Origin == origin }

	if l := vgpu(project); !want(l, 1, "project") {
		t.Fatalf("class:VGPU of the project: %+v; want 1, project", l)
	}
	three := 3
	_, err = limits.Update(ctx, admin, pl[0].ID, limits.UpdateOpts{ResourceLimit: &three}).Extract()
	testsvc.Must(t, err, "raise the project limit")
	if l := vgpu(project); !want(l, 1, "project") {
		t.Fatalf("class:VGPU of the project before any refresh: %+v; want the cached 1 (TTL 1h)", l)
	}

	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	waitFor("the raised project limit 3 read in the background", func() bool { return want(vgpu(project), 3, "project") })

	// The registered limit, changed with the project limit gone.
	testsvc.Must(t, limits.Delete(ctx, admin, pl[0].ID).ExtractErr(), "delete the project limit")
	five := 5
	_, err = registeredlimits.Update(ctx, admin, rl[0].ID, registeredlimits.UpdateOpts{DefaultLimit: &five}).Extract()
	testsvc.Must(t, err, "change the registered limit")
	waitFor("the registered limit 5 read in the background", func() bool { return want(vgpu(project), 5, "registered") })

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
