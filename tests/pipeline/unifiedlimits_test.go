package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/registeredlimits"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/unifiedlimits"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// limitsWorld is what a unified-limits test makes in the real Keystone,
// all deleted when it ends: a compute service of its own with an
// endpoint in RegionOne (the endpoint Nova's [oslo_limit] endpoint_id
// would name), the bridge's own service likewise, their registered
// limits, projects and their limits.
type limitsWorld struct {
	t              *testing.T
	ctx            context.Context
	admin          *gophercloud.ServiceClient
	region         string
	compute        string // service id
	computeEP      string // its endpoint id
	bridge         string // service id
	bridgeEP       string
	registeredVGPU int
}

func newLimitsWorld(t *testing.T, registeredVGPU int) *limitsWorld {
	t.Helper()
	ctx := context.Background()
	admin := testsvc.KeystoneAdmin(ctx, t)
	lw := &limitsWorld{t: t, ctx: ctx, admin: admin, region: "RegionOne"}
	// Service types of their own: the catalog's compute services (Nova's,
	// in tests/e2e) stay the only ones of type compute.
	lw.compute, lw.computeEP = lw.service("vgpu-test-compute")
	lw.bridge, lw.bridgeEP = lw.service("vgpu-test-bridge")
	if registeredVGPU >= 0 {
		lw.register(lw.compute, unifiedlimits.ResourceVGPU, registeredVGPU)
	}
	return lw
}

func (lw *limitsWorld) service(typ string) (string, string) {
	t, ctx, admin := lw.t, lw.ctx, lw.admin
	svc, err := services.Create(ctx, admin, services.CreateOpts{Type: typ, Name: testsvc.Name(typ)}).Extract()
	testsvc.Must(t, err, "create service")
	t.Cleanup(func() { // its endpoint goes with it
		if err := services.Delete(context.Background(), admin, svc.ID).ExtractErr(); err != nil {
			t.Logf("delete service %s: %v", svc.ID, err)
		}
	})
	ep, err := endpoints.Create(ctx, admin, endpoints.CreateOpts{Availability: gophercloud.AvailabilityPublic, Region: lw.region,
		URL: "http://127.0.0.1:1/" + typ, ServiceID: svc.ID}).Extract()
	testsvc.Must(t, err, "create endpoint")
	return svc.ID, ep.ID
}

// register registers resource's default limit n for service.
func (lw *limitsWorld) register(service, resource string, n int) {
	rl, err := registeredlimits.BatchCreate(lw.ctx, lw.admin, registeredlimits.BatchCreateOpts{{ServiceID: service, RegionID: lw.region,
		ResourceName: resource, DefaultLimit: n}}).Extract()
	testsvc.Must(lw.t, err, "register "+resource)
	lw.t.Cleanup(func() {
		for _, r := range rl {
			registeredlimits.Delete(context.Background(), lw.admin, r.ID)
		}
	})
}

// project creates a Keystone project; limit ≥ 0 gives it a project limit
// of class:VGPU.
func (lw *limitsWorld) project(prefix string, limit int) string {
	t := lw.t
	p, err := projects.Create(lw.ctx, lw.admin, projects.CreateOpts{Name: testsvc.Name(prefix), DomainID: "default"}).Extract()
	testsvc.Must(t, err, "create project")
	t.Cleanup(func() { projects.Delete(context.Background(), lw.admin, p.ID) })
	if limit >= 0 {
		lw.limit(p.ID, lw.compute, unifiedlimits.ResourceVGPU, limit)
	}
	return p.ID
}

// limit gives project a limit n of resource of service.
func (lw *limitsWorld) limit(project, service, resource string, n int) {
	ls, err := limits.BatchCreate(lw.ctx, lw.admin, limits.BatchCreateOpts{{ServiceID: service, RegionID: lw.region, ProjectID: project,
		ResourceName: resource, ResourceLimit: n}}).Extract()
	testsvc.Must(lw.t, err, "project limit "+resource)
	lw.t.Cleanup(func() {
		for _, l := range ls {
			limits.Delete(context.Background(), lw.admin, l.ID)
		}
	})
}

// source is the bridge's unified-limits source as [quota] driver =
// unified_limits builds it: the bridge's Keystone client (a clouds.yaml
// entry at authURL, system-scoped as oslo_limit's [oslo_limit]
// system_scope = all: Keystone lists a project-scoped token's own
// project's limits only) and a Placement client.
func (lw *limitsWorld) source(authURL string) *unifiedlimits.Source {
	return lw.sourceScoped(authURL, "system_scope: all")
}

// sourceScoped is source with the credentials' scope (a clouds.yaml auth
// line).
func (lw *limitsWorld) sourceScoped(authURL, scope string) *unifiedlimits.Source {
	t := lw.t
	yaml := fmt.Sprintf("clouds:\n  limits:\n    auth:\n      auth_url: %s\n      username: admin\n      password: %s\n"+
		"      %s\n      user_domain_name: Default\n    identity_api_version: 3\n",
		authURL, testsvc.KeystoneAdminPassword(t), scope)
	ks, err := keystoneauth.NewKeystone(keystoneauth.KeystoneConfig{Cloud: "limits", Timeout: 30 * time.Second,
		ParseOptions: []clouds.ParseOption{clouds.WithCloudsYAML(strings.NewReader(yaml))}})
	testsvc.Must(t, err, "keystone client")
	pc, err := placement.NewClient(lw.ctx, placement.ClientConfig{Endpoint: testsvc.PlacementURL(t), Token: "admin"})
	testsvc.Must(t, err, "placement client")
	src, err := unifiedlimits.New(unifiedlimits.Config{ComputeEndpointID: lw.computeEP, ProfileEndpointID: lw.bridgeEP, TTL: time.Second}, ks, pc)
	testsvc.Must(t, err, "unified limits")
	return src
}

// TestUnifiedLimitsDirectPath: with [quota] driver = unified_limits and,
// in the real Keystone, class:VGPU registered at 2 for the compute service
// and overridden to 1 for project A, the bridge refuses A's second
// direct-path attach with code quota (the reason names the limit, the
// usage and the request), project B gets two, and project C, which holds
// one VGPU through an allocation written straight to Placement (as Nova's
// own resize to a vGPU flavor would), gets one more and no second.
// Project D's limit vgpu:T4-4Q = 1 of the bridge's own service refuses
// its second T4-4Q. The policy file allows 64 per project: without the
// unified limits every request succeeds.
func TestUnifiedLimitsDirectPath(t *testing.T) {
	t.Parallel()
	lw := newLimitsWorld(t, 2)
	a, b, c, d := lw.project("limits-a", 1), lw.project("limits-b", -1), lw.project("limits-c", -1), lw.project("limits-d", -1)
	lw.register(lw.bridge, unifiedlimits.ProfilePrefix+"T4-4Q", 10) // Keystone: a project limit needs a registered one
	lw.limit(d, lw.bridge, unifiedlimits.ProfilePrefix+"T4-4Q", 1)
	w := newWorldWith(t, testsvc.DirectPolicy(), withDomains(5),
		withProjects(map[int]string{4: a, 5: a, 6: b, 7: b, 8: c, 9: c, 10: d, 11: d}))
	// Nova's own vGPU of project C, in Placement only (the bridge has no
	// instance of it).
	novas := uuid.NewString()
	err := allocations.Update(w.ctx, w.sc, novas, allocations.UpdateOpts{ProjectID: c, UserID: w.user, ConsumerType: "INSTANCE",
		Allocations: map[string]allocations.ProviderAllocationsOpts{w.gpus[gpuB]: {Resources: map[string]int{"VGPU": 1}}}}).ExtractErr()
	testsvc.Must(t, err, "Nova's allocation of project C")
	w.created = append(w.created, novas)
	w.startAgent()
	r1 := w.startBridge(replicaOpts{name: "r1", limits: lw.source(testsvc.KeystoneURL())})

	attach := func(i int) requests.Request {
		return w.wait(w.submit("GPU_REQUEST", w.domains[i].UUID, map[string]any{"vgpu_profile": "T4-4Q"}), 90*time.Second)
	}
	for _, tc := range []struct {
		name     string
		first    int
		second   int
		refused  bool   // the second is rejected with code quota
		reasonOf string // what its reason says
	}{
		{"A: project limit 1", 4, 5, true, "class:VGPU: limit 1, usage 1, request 1"},
		{"B: registered limit 2", 6, 7, false, ""},
		{"C: registered limit 2, one VGPU Nova's", 8, 9, true, "class:VGPU: limit 2, usage 2, request 1"},
		{"D: vgpu:T4-4Q limit 1", 10, 11, true, "vgpu:T4-4Q: limit 1, usage 1, request 1"},
	} {
		one, two := attach(tc.first), attach(tc.second)
		if one.State != requests.Succeeded {
			t.Errorf("%s: first attach %s (%s: %s), want succeeded", tc.name, one.State, one.Code, one.Reason)
		}
		switch {
		case !tc.refused && two.State != requests.Succeeded:
			t.Errorf("%s: second attach %s (%s: %s), want succeeded", tc.name, two.State, two.Code, two.Reason)
		case tc.refused && (two.State != requests.Rejected || two.Code != flow.CodeQuota || !strings.Contains(two.Reason, tc.reasonOf)):
			t.Errorf("%s: second attach %s (%s: %s), want rejected with code quota and a reason with %q", tc.name, two.State, two.Code,
				two.Reason, tc.reasonOf)
		}
	}
	// What vgpuctl quota show prints (GET /v1/quota): C's class:VGPU
	// counts Nova's VGPU and the bridge's; D's per-profile limit.
	for _, tc := range []struct {
		project string
		want    pipeline.QuotaLimit
	}{
		{a, pipeline.QuotaLimit{Resource: "class:VGPU", Limit: 1, Usage: 1, Origin: "project"}},
		{c, pipeline.QuotaLimit{Resource: "class:VGPU", Limit: 2, Usage: 2, Origin: "registered"}},
		{d, pipeline.QuotaLimit{Resource: "vgpu:T4-4Q", Profile: "T4-4Q", Limit: 1, Usage: 1, Origin: "project"}},
	} {
		v, err := r1.proc.Quota(w.ctx, tc.project)
		testsvc.Must(t, err, "quota view")
		found := false
		for _, l := range v.Limits {
			found = found || l == tc.want
		}
		if v.Driver != "unified_limits" || !found {
			t.Errorf("quota of %s: %+v; want driver unified_limits and %+v", tc.project, v, tc.want)
		}
	}
}

// TestUnifiedLimitsKeystoneUnreachable: when the limits cannot be read,
// a request that adds a vGPU is never decided as if its project had no
// limit: the event waits and is tried again, and after its last attempt
// the request fails (event_failed) without a vGPU. Without the unified
// limits it succeeds. A decision that adds nothing (a rejection) does not
// wait for Keystone.
func TestUnifiedLimitsKeystoneUnreachable(t *testing.T) {
	t.Parallel()
	lw := newLimitsWorld(t, 2)
	a := lw.project("limits-down", -1)
	w := newWorldWith(t, testsvc.DirectPolicy(), withProjects(map[int]string{4: a, 5: a}))
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1", maxAttempts: 3, limits: lw.source("http://127.0.0.1:1/v3/")})
	r := w.wait(w.submit("GPU_REQUEST", w.domains[4].UUID, map[string]any{"vgpu_profile": "T4-4Q"}), 90*time.Second)
	if r.State != requests.Failed || r.Code != flow.CodeEventFailed || !strings.Contains(r.Reason, "unified limits unavailable") {
		t.Errorf("with Keystone unreachable: %s (%s: %s); want failed with code %s, unified limits unavailable", r.State, r.Code, r.Reason,
			flow.CodeEventFailed)
	}
	if n := vgpuUnits(w.allocations(w.domains[4].UUID)); n != 0 {
		t.Errorf("the instance holds %d VGPU in Placement; want 0", n)
	}
	r = w.wait(w.submit("GPU_REQUEST", w.domains[5].UUID, map[string]any{"vgpu_profile": "NO-SUCH-1Q"}), 90*time.Second)
	if r.State != requests.Rejected {
		t.Errorf("a request the policy rejects, with Keystone unreachable: %s (%s: %s); want rejected at once", r.State, r.Code, r.Reason)
	}
}

// TestUnifiedLimitsSource reads the real Keystone as Nova's oslo_limit
// does: a project limit overrides the registered one, per service and
// region; class:VGPU without either is 0; the bridge's vgpu:<profile>
// limits come from its own service; a project-scoped token, to which
// Keystone shows its own project's limits only, is refused rather than
// read as the registered limits.
func TestUnifiedLimitsSource(t *testing.T) {
	t.Parallel()
	lw := newLimitsWorld(t, 2)
	lw.register(lw.bridge, unifiedlimits.ProfilePrefix+"T4-4Q", 3)
	lw.register(lw.bridge, unifiedlimits.ProfilePrefix+"A16-2Q", 8)
	lw.register(lw.bridge, "something-else", 5) // not a vgpu: limit
	a, b := lw.project("limits-src-a", 1), lw.project("limits-src-b", -1)
	lw.limit(a, lw.bridge, unifiedlimits.ProfilePrefix+"T4-4Q", 0)
	lw.limit(b, lw.bridge, unifiedlimits.ProfilePrefix+"A16-2Q", 4)
	src := lw.source(testsvc.KeystoneURL())
	for _, tc := range []struct {
		project string
		want    []unifiedlimits.Limit
	}{
		{a, []unifiedlimits.Limit{{Resource: "class:VGPU", Limit: 1, Origin: "project"},
			{Resource: "vgpu:A16-2Q", Profile: "A16-2Q", Limit: 8, Origin: "registered"},
			{Resource: "vgpu:T4-4Q", Profile: "T4-4Q", Limit: 0, Origin: "project"}}},
		{b, []unifiedlimits.Limit{{Resource: "class:VGPU", Limit: 2, Origin: "registered"},
			{Resource: "vgpu:A16-2Q", Profile: "A16-2Q", Limit: 4, Origin: "project"},
			{Resource: "vgpu:T4-4Q", Profile: "T4-4Q", Limit: 3, Origin: "registered"}}},
	} {
		got, err := src.Limits(lw.ctx, tc.project)
		testsvc.Must(t, err, "limits")
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("limits of %s: %+v; want %+v", tc.project, got, tc.want)
		}
	}

	// No class:VGPU registered: 0, as oslo_limit takes a missing limit.
	none := newLimitsWorld(t, -1)
	got, err := none.source(testsvc.KeystoneURL()).Limits(lw.ctx, a)
	testsvc.Must(t, err, "limits")
	if want := []unifiedlimits.Limit{{Resource: "class:VGPU", Limit: 0, Origin: "none"}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("without a registered class:VGPU: %+v; want %+v", got, want)
	}

	_, err = lw.sourceScoped(testsvc.KeystoneURL(), "project_name: admin\n      project_domain_name: Default").Limits(lw.ctx, b)
	if err == nil || !errors.Is(err, unifiedlimits.ErrUnavailable) || !strings.Contains(err.Error(), "not system-scoped") {
		t.Errorf("with a project-scoped token: %v; want unified limits unavailable, not system-scoped", err)
	}
}
