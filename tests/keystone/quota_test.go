package keystone_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/registeredlimits"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestQuotaShowProjectScope: GET /v1/quota and vgpuctl quota show with
// Keystone tokens: a member of A reads A's limits and usage (without
// naming it), not B's (403); an admin names the project (422 without).
func TestQuotaShowProjectScope(t *testing.T) {
	w := newWorld(t)
	alice := w.ks.user("alice", w.pa, "member")
	tAlice, admin := w.ks.token(alice), w.ks.adminToken()

	var got struct {
		ProjectID string `json:"project_id"`
		Driver    string `json:"driver"`
	}
	mustOK(t, json.Unmarshal(w.api.expect(200, "GET", "/v1/quota", tAlice, "alice").body, &got))
	if got.ProjectID != w.projA || got.Driver != "bridge" {
		t.Errorf("alice's quota: %+v; want project A's, driver bridge", got)
	}
	w.api.expect(200, "GET", "/v1/quota?project="+w.projA, tAlice, "alice")
	if p := w.api.expect(403, "GET", "/v1/quota?project="+w.projB, tAlice, "alice").problem(t); p["code"] != "project_not_allowed" {
		t.Errorf("alice asking for B: problem %v, want project_not_allowed", p)
	}
	w.api.expect(422, "GET", "/v1/quota", admin, "admin without a project")
	mustOK(t, json.Unmarshal(w.api.expect(200, "GET", "/v1/quota?project="+w.projB, admin, "admin").body, &got))
	if got.ProjectID != w.projB {
		t.Errorf("admin's quota of B: %+v", got)
	}

	clouds := writeCloudsYAML(t,
		cloud{name: "alice", authURL: keystoneURL(), user: alice.name, password: alice.password, project: w.pa.Name, region: "RegionOne"})
	env := []string{"OS_CLIENT_CONFIG_FILE=" + clouds, "VGPUCTL_TOKEN=", "OS_CLOUD="}
	code, out, errs := vgpuctl(t, env, "--url", w.url, "--os-cloud", "alice", "quota", "show")
	if code != 0 || !strings.Contains(out, "project "+w.projA) || !strings.Contains(out, "policy max_vgpus") {
		t.Errorf("vgpuctl quota show as alice: exit %d, out %s, err %s; want A's quota", code, out, errs)
	}
	code, _, errs = vgpuctl(t, env, "--url", w.url, "--os-cloud", "alice", "quota", "show", "--project", w.projB)
	if code == 0 || !strings.Contains(errs, "403") && !strings.Contains(strings.ToLower(errs), "forbidden") && !strings.Contains(errs, "project_not_allowed") {
		t.Errorf("vgpuctl quota show --project B as alice: exit %d, err %s; want refused", code, errs)
	}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestQuotaUnifiedLimitsDaemon: the daemon with [quota] driver =
// unified_limits and oslo.limit's options (endpoint_id and a
// system-scoped user of its own, not [keystone]'s service user) reads class:VGPU from the real Keystone: project A's
// project limit, B's registered one, each with Placement's usage.
func TestQuotaUnifiedLimitsDaemon(t *testing.T) {
	ks := newKeystone(t)
	ctx := ks.ctx
	svc, err := services.Create(ctx, ks.admin, services.CreateOpts{Type: "vgpu-test-compute", Name: testsvc.Name("nova-limits")}).Extract()
	testsvc.Must(t, err, "create service")
	t.Cleanup(func() { services.Delete(context.Background(), ks.admin, svc.ID) })
	ep, err := endpoints.Create(ctx, ks.admin, endpoints.CreateOpts{Availability: gophercloud.AvailabilityPublic, Region: "RegionOne",
		URL: "http://127.0.0.1:1/compute", ServiceID: svc.ID}).Extract()
	testsvc.Must(t, err, "create endpoint")
	rl, err := registeredlimits.BatchCreate(ctx, ks.admin, registeredlimits.BatchCreateOpts{{ServiceID: svc.ID, RegionID: "RegionOne",
		ResourceName: "class:VGPU", DefaultLimit: 3}}).Extract()
	testsvc.Must(t, err, "register class:VGPU")
	t.Cleanup(func() { registeredlimits.Delete(context.Background(), ks.admin, rl[0].ID) })

	w := newWorld(t, "quota.driver=unified_limits",
		// oslo.limit's options (TestQuotaConfig: read from nova.conf's [oslo_limit] too).
		"quota.endpoint_id="+ep.ID, "quota.auth_url="+keystoneURL(), "quota.username=admin",
		"quota.password="+adminPassword(t), "quota.user_domain_name=Default", "quota.system_scope=all")
	pl, err := limits.BatchCreate(ctx, ks.admin, limits.BatchCreateOpts{{ServiceID: svc.ID, RegionID: "RegionOne", ProjectID: w.projA,
		ResourceName: "class:VGPU", ResourceLimit: 1}}).Extract()
	testsvc.Must(t, err, "project limit")
	t.Cleanup(func() { limits.Delete(context.Background(), ks.admin, pl[0].ID) })

	alice := w.ks.user("alice", w.pa, "member")
	tAlice, admin := w.ks.token(alice), w.ks.adminToken()
	type view struct {
		ProjectID string `json:"project_id"`
		Driver    string `json:"driver"`
		Limits    []struct {
			Resource string `json:"resource"`
			Limit    int    `json:"limit"`
			Usage    int    `json:"usage"`
			Origin   string `json:"origin"`
		} `json:"limits"`
	}
	for _, tc := range []struct {
		who, token, path, want string
	}{
		{"alice", tAlice, "/v1/quota", "{class:VGPU 1 0 project}"},
		{"admin", admin, "/v1/quota?project=" + w.projB, "{class:VGPU 3 0 registered}"},
	} {
		var v view
		mustOK(t, json.Unmarshal(w.api.expect(200, "GET", tc.path, tc.token, tc.who).body, &v))
		if v.Driver != "unified_limits" || len(v.Limits) != 1 || fmt.Sprint(v.Limits[0]) != tc.want {
			t.Errorf("%s: %s = %+v; want driver unified_limits and %s", tc.who, tc.path, v, tc.want)
		}
	}
}
