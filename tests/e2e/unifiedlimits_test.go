package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/registeredlimits"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/unifiedlimits"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// limitsKeystone is what a unified-limits test makes in the real
// Keystone, deleted when the test ends.
type limitsKeystone struct {
	t      *testing.T
	ctx    context.Context
	admin  *gophercloud.ServiceClient
	region string
}

func newLimitsKeystone(t *testing.T) *limitsKeystone {
	t.Helper()
	ctx := context.Background()
	admin := testsvc.KeystoneAdmin(ctx, t)
	return &limitsKeystone{t: t, ctx: ctx, admin: admin, region: "RegionOne"}
}

// service creates a service of type typ (one of the test's own: the
// catalog's real compute services stay the only ones of type compute)
// with a public endpoint in the region; it returns the service and
// endpoint ids.
func (k *limitsKeystone) service(typ string) (string, string) {
	t := k.t
	svc, err := services.Create(k.ctx, k.admin, services.CreateOpts{Type: typ, Name: testsvc.Name(typ)}).Extract()
	testsvc.Must(t, err, "create service")
	t.Cleanup(func() { // its endpoints and registered limits go with it
		if err := services.Delete(context.Background(), k.admin, svc.ID).ExtractErr(); err != nil {
			t.Logf("delete service %s: %v", svc.ID, err)
		}
	})
	ep, err := endpoints.Create(k.ctx, k.admin, endpoints.CreateOpts{Availability: gophercloud.AvailabilityPublic, Region: k.region,
		URL: "http://127.0.0.1:1/" + typ, ServiceID: svc.ID}).Extract()
	testsvc.Must(t, err, "create endpoint")
	return svc.ID, ep.ID
}

// register registers default limits of service.
func (k *limitsKeystone) register(service string, defaults map[string]int) {
	var opts registeredlimits.BatchCreateOpts
	for r, n := range defaults {
		opts = append(opts, registeredlimits.CreateOpts{ServiceID: service, RegionID: k.region, ResourceName: r, DefaultLimit: n})
	}
	rls, err := registeredlimits.BatchCreate(k.ctx, k.admin, opts).Extract()
	testsvc.Must(k.t, err, "register limits")
	k.t.Cleanup(func() {
		for _, r := range rls {
			registeredlimits.Delete(context.Background(), k.admin, r.ID)
		}
	})
}

func (k *limitsKeystone) project(prefix string) string {
	p, err := projects.Create(k.ctx, k.admin, projects.CreateOpts{Name: testsvc.Name(prefix), DomainID: "default"}).Extract()
	testsvc.Must(k.t, err, "create project")
	k.t.Cleanup(func() { projects.Delete(context.Background(), k.admin, p.ID) })
	return p.ID
}

// limit gives project a limit n of resource of service and returns its id.
func (k *limitsKeystone) limit(project, service, resource string, n int) string {
	ls, err := limits.BatchCreate(k.ctx, k.admin, limits.BatchCreateOpts{{ServiceID: service, RegionID: k.region, ProjectID: project,
		ResourceName: resource, ResourceLimit: n}}).Extract()
	testsvc.Must(k.t, err, "project limit "+resource)
	k.t.Cleanup(func() { limits.Delete(context.Background(), k.admin, ls[0].ID) })
	return ls[0].ID
}

// novaOverLimit is oslo.limit's words for an exceeded limit, which Nova
// passes on in its 403 (oslo_limit.exception.OverLimitInfo.__str__).
var novaOverLimit = regexp.MustCompile(`Resource (\S+) is over limit of (\d+) due to current usage (\d+) and delta (\d+)`)

// TestUnifiedLimitsNova: one class:VGPU number for Nova and the bridge,
// against the real Nova (a Nova of its own with [quota] driver =
// nova.quota.UnifiedLimitsDriver and [oslo_limit] naming a compute
// endpoint of the real Keystone), Placement, Keystone, RabbitMQ and
// Postgres. The project's class:VGPU limit is 1 and its vgpu:T4-4Q
// limit (the bridge's own service) 1; server A holds a direct-path T4-4Q
// the bridge attached, which lives in A's consumer in Placement.
//
//   - (a) The tenant's own resize of server B to a resources:VGPU=1
//     flavor through Nova is refused by Nova: 403, class:VGPU over its
//     limit of 1 with usage 1 (A's direct-path vGPU) and delta 1; B keeps
//     its flavor and its allocations.
//   - (d) Meanwhile GET /v1/quota shows class:VGPU with Nova's numbers:
//     limit 1, usage 1, the project limit; and Placement's VGPU usage of
//     the project, which Nova counts, is 1.
//   - (c) With class:VGPU raised to 2, a bridge GPU_REQUEST of a T4-4Q for
//     B is rejected with code quota by vgpu:T4-4Q (limit 1, usage 1): the
//     per-profile limit is the bridge's alone.
//   - (b) The same resize of B passes (VERIFY_RESIZE, confirmed, ACTIVE
//     with the vGPU flavor and VGPU 1 in Placement), and GET /v1/quota
//     then shows class:VGPU limit 2, usage 2: Placement's count, as Nova
//     would enforce it on the next resize.
func TestUnifiedLimitsNova(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ks := newLimitsKeystone(t)
	compute, computeEP := ks.service("vgpu-test-compute")
	bridgeSvc, bridgeEP := ks.service("vgpu-test-bridge")
	// What nova.limit.placement._get_deltas_by_flavor asks of a server:
	// oslo.limit takes an unregistered resource as limit 0.
	ks.register(compute, map[string]int{"servers": 10, "class:VCPU": 64, "class:MEMORY_MB": 65536, "class:DISK_GB": 1000,
		unifiedlimits.ResourceVGPU: 0})
	ks.register(bridgeSvc, map[string]int{unifiedlimits.ProfilePrefix + "T4-4Q": 8}) // Keystone: a project limit needs one
	project := ks.project("ulimits")
	vgpuLimit := ks.limit(project, compute, unifiedlimits.ResourceVGPU, 1)
	ks.limit(project, bridgeSvc, unifiedlimits.ProfilePrefix+"T4-4Q", 1)
	password := testsvc.KeystoneAdminPassword(t)

	// A Nova of its own: the shared one keeps the database quota driver
	// (its tests share project admin, which has no unified limits).
	n := novaharness.Start(t, novaharness.Options{UnifiedLimits: &novaharness.UnifiedLimits{EndpointID: computeEP,
		AuthURL: strings.TrimSuffix(testsvc.KeystoneURL(), "/"), Username: "admin", Password: password, UserDomainName: "Default"}})
	host, gpu := addDirectHost(t, n, "ulimits")
	prefix := testsvc.Name("ulimits")
	plain := n.CreateFlavor(t, prefix+".small", 2, 2048, 10, nil)
	vgpuFlavor := n.CreateFlavor(t, prefix+".small.vgpu", 2, 2048, 10, map[string]string{"resources:VGPU": "1",
		"trait:" + directTrait: "required"})

	d, api := startNovaBridgeINI(t, n, "",
		"quota.driver=unified_limits",
		// nova.conf's [oslo_limit], a user of the bridge's.
		"quota.endpoint_id="+computeEP, "quota.auth_url="+testsvc.KeystoneURL(), "quota.username=admin", "quota.password="+password,
		"quota.user_domain_name=Default", "quota.system_scope=all",
		"quota.profile_endpoint_id="+bridgeEP,
		"quota.cache_ttl=1s",
		"pipeline.poll_interval=50ms",
		"placement.sync_interval=5s",
	)
	w := &directWorld{t: t, ctx: ctx, n: n, host: host, gpu: gpu, api: api, pool: d.Pool, flavor: plain}

	// Servers A and B of the project, created as its admin on the host
	// (Nova checks the create against the limits too).
	create := func(name string) string {
		var out struct {
			Server struct{ ID string } `json:"server"`
		}
		testsvc.Must(t, n.ComputeAs(ctx, http.MethodPost, "/servers", "admin:"+project, map[string]any{"server": map[string]any{
			"name": prefix + "-" + name, "flavorRef": plain, "imageRef": novaharness.ImageID, "networks": "none", "host": host}}, &out),
			"create server "+name+" in project "+project)
		return out.Server.ID
	}
	vmA, vmB := create("a"), create("b")
	for _, vm := range []string{vmA, vmB} {
		n.WaitServer(t, vm, "ACTIVE")
		w.waitFor(2*time.Minute, "the bridge knows "+vm+" in project "+project, func() bool {
			in, err := api.Instance(ctx, vm)
			return err == nil && in.Host != nil && *in.Host == host && in.ProjectID != nil && *in.ProjectID == project
		})
	}

	// A's direct-path vGPU, in A's consumer in Placement.
	if r := w.waitFinal(w.gpuRequest(vmA, "T4-4Q")); r.State != "succeeded" {
		t.Fatalf("direct-path T4-4Q for A: %s (%s): %s", r.State, r.Code, r.Reason)
	}
	if al := n.Allocations(t, vmA); al[gpu]["VGPU"] != 1 {
		t.Fatalf("allocations of A: %v, want VGPU 1 on %s", al, gpu)
	}
	if u := projectVGPUs(t, n, project); u != 1 {
		t.Fatalf("Placement's VGPU usage of the project: %d, want 1 (A's direct-path vGPU)", u)
	}

	// (a) The tenant's own resize of B (a member's token, not admin's)
	// over class:VGPU: refused by Nova's API.
	tenant := "tenant:" + project
	resize := func() error {
		return n.ComputeAs(ctx, http.MethodPost, "/servers/"+vmB+"/action", tenant, map[string]any{"resize": map[string]any{"flavorRef": vgpuFlavor}}, nil)
	}
	err := resize()
	var ae *novaharness.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Fatalf("resize of B to the vGPU flavor with class:VGPU = 1 and A's direct-path vGPU: %v; want Nova's 403", err)
	}
	m := novaOverLimit.FindStringSubmatch(ae.Body)
	if m == nil || m[1] != unifiedlimits.ResourceVGPU || m[2] != "1" || m[3] != "1" || m[4] != "1" || !strings.Contains(ae.Body, project) {
		t.Fatalf("Nova's refusal: %s; want project %s over class:VGPU's limit 1 with usage 1 and delta 1", ae.Body, project)
	}
	if s := n.Server(t, vmB); s.Status != "ACTIVE" || s.Flavor.ExtraSpecs["resources:VGPU"] != "" {
		t.Errorf("B after the refused resize: %s with flavor %+v; want ACTIVE on its old flavor", s.Status, s.Flavor)
	}
	if al := n.Allocations(t, vmB); al[gpu]["VGPU"] != 0 {
		t.Errorf("allocations of B after the refused resize: %v, want no VGPU", al)
	}

	// (d) The bridge shows the numbers Nova enforced: the same limit and
	// usage, read from the same Keystone limit and Placement usage.
	q := quotaOf(t, api, project, unifiedlimits.ResourceVGPU)
	if q.Limit != 1 || q.Usage != 1 || q.Origin != "project" || fmt.Sprint(q.Limit) != m[2] || fmt.Sprint(q.Usage) != m[3] {
		t.Errorf("GET /v1/quota class:VGPU: %+v; want limit %s, usage %s (Nova's), origin project", q, m[2], m[3])
	}

	// Raise class:VGPU to 2; the bridge reads it within its cache_ttl.
	two := 2
	_, err = limits.Update(ks.ctx, ks.admin, vgpuLimit, limits.UpdateOpts{ResourceLimit: &two}).Extract()
	testsvc.Must(t, err, "raise class:VGPU")
	w.waitFor(time.Minute, "the bridge to read class:VGPU = 2", func() bool {
		return quotaOf(t, api, project, unifiedlimits.ResourceVGPU).Limit == 2
	})

	// (c) A bridge request over the per-profile limit: class:VGPU would
	// allow it (usage 1 + 1 ≤ 2), vgpu:T4-4Q (limit 1, usage 1) does not.
	r := w.waitFinal(w.gpuRequest(vmB, "T4-4Q"))
	if r.State != "rejected" || r.Code != flow.CodeQuota || !strings.Contains(r.Reason, "vgpu:T4-4Q: limit 1, usage 1, request 1") {
		t.Errorf("T4-4Q for B over vgpu:T4-4Q: %s (%s): %s; want rejected with code quota naming vgpu:T4-4Q: limit 1, usage 1, request 1",
			r.State, r.Code, r.Reason)
	}
	if al := n.Allocations(t, vmB); al[gpu]["VGPU"] != 0 {
		t.Errorf("allocations of B after the rejected request: %v, want no VGPU", al)
	}
	if q := quotaOf(t, api, project, unifiedlimits.ProfilePrefix+"T4-4Q"); q.Limit != 1 || q.Usage != 1 || q.Origin != "project" {
		t.Errorf("GET /v1/quota vgpu:T4-4Q: %+v; want limit 1, usage 1, origin project", q)
	}

	// (b) The same resize under the raised limit passes.
	testsvc.Must(t, resize(), "resize of B with class:VGPU = 2")
	n.WaitServer(t, vmB, "VERIFY_RESIZE")
	testsvc.Must(t, n.ComputeAs(ctx, http.MethodPost, "/servers/"+vmB+"/action", tenant, map[string]any{"confirmResize": nil}, nil),
		"confirm the resize of B")
	if s := n.WaitServer(t, vmB, "ACTIVE"); s.Flavor.ExtraSpecs["resources:VGPU"] != "1" {
		t.Errorf("B after the resize: flavor %+v, want the vGPU flavor", s.Flavor)
	}
	if al := n.Allocations(t, vmB); al[gpu]["VGPU"] != 1 {
		t.Errorf("allocations of B after the resize: %v, want VGPU 1 on %s", al, gpu)
	}
	if u := projectVGPUs(t, n, project); u != 2 {
		t.Errorf("Placement's VGPU usage of the project: %d, want 2 (A's direct-path vGPU, B's flavor vGPU)", u)
	}
	// (d) Again the bridge's class:VGPU is Nova's count: Placement's 2,
	// at the limit 2.
	w.waitFor(time.Minute, "GET /v1/quota class:VGPU limit 2, usage 2", func() bool {
		q := quotaOf(t, api, project, unifiedlimits.ResourceVGPU)
		return q.Limit == 2 && q.Usage == 2
	})
}

// quotaOf is the project's unified limit resource in GET /v1/quota.
func quotaOf(t *testing.T, api *apiclient.Client, project, resource string) apiclient.QuotaLimit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := api.Quota(ctx, project)
	testsvc.Must(t, err, "GET /v1/quota?project="+project)
	if q.Driver != "unified_limits" {
		t.Fatalf("GET /v1/quota: driver %q, want unified_limits", q.Driver)
	}
	for _, l := range q.Limits {
		if l.Resource == resource {
			return l
		}
	}
	t.Fatalf("GET /v1/quota of %s has no %s: %+v", project, resource, q.Limits)
	return apiclient.QuotaLimit{}
}

// projectVGPUs is Placement's VGPU usage of the project, what Nova counts
// for class:VGPU (nova.limit.placement._get_usage): GET
// /usages?project_id= at Nova's microversion (GET_USAGES_VERSION, 1.9 in
// nova/scheduler/client/report.py; the shared Placement on Postgres
// cannot answer it at 1.38 and later, which group by consumer type).
func projectVGPUs(t *testing.T, n *novaharness.Nova, project string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.PlacementURL()+"/usages?project_id="+url.QueryEscape(project), nil)
	testsvc.Must(t, err, "usages request")
	req.Header.Set("X-Auth-Token", "admin")
	req.Header.Set("OpenStack-API-Version", "placement 1.9")
	req.Close = true // the test Placement closes every connection
	resp, err := http.DefaultClient.Do(req)
	testsvc.Must(t, err, "usages of "+project)
	defer resp.Body.Close()
	var out struct {
		Usages map[string]int `json:"usages"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /usages?project_id=%s: %s", project, resp.Status)
	}
	testsvc.Must(t, json.NewDecoder(resp.Body).Decode(&out), "usages of "+project)
	return out.Usages["VGPU"]
}
