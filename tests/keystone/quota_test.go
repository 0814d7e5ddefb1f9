package keystone_test

import (
	"encoding/json"
	"strings"
	"testing"
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
