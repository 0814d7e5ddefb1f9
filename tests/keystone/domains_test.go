package keystone_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/domains"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// tenant is a user with the member role on a project, both in one domain.
type tenant struct {
	domain, project, user, password string
}

// domainTenant creates a domain holding a project and a user of the given
// names, the user a member of the project; all go when the test ends.
func (k *keystone) domainTenant(projectName, userName string) tenant {
	k.t.Helper()
	d, err := domains.Create(k.ctx, k.admin, domains.CreateOpts{Name: testsvc.Name("vgpu-test-domain")}).Extract()
	testsvc.Must(k.t, err, "create domain")
	k.t.Cleanup(func() {
		ctx := context.Background()
		off := false
		if _, err := domains.Update(ctx, k.admin, d.ID, domains.UpdateOpts{Enabled: &off}).Extract(); err != nil {
			k.t.Logf("disable domain %s: %v", d.Name, err)
		}
		// Keystone deletes the domain's projects and users with it.
		if err := domains.Delete(ctx, k.admin, d.ID).ExtractErr(); err != nil {
			k.t.Logf("delete domain %s: %v", d.Name, err)
		}
	})
	p, err := projects.Create(k.ctx, k.admin, projects.CreateOpts{Name: projectName, DomainID: d.ID}).Extract()
	testsvc.Must(k.t, err, "create project")
	tn := tenant{domain: d.ID, project: p.ID, user: userName, password: testsvc.Name("pw")}
	u, err := users.Create(k.ctx, k.admin, users.CreateOpts{Name: userName, Password: tn.password, DomainID: d.ID,
		DefaultProjectID: p.ID}).Extract()
	testsvc.Must(k.t, err, "create user")
	err = roles.Assign(k.ctx, k.admin, k.role("member", false), roles.AssignOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr()
	testsvc.Must(k.t, err, "assign member")
	return tn
}

// token logs tn's user in, scoped to its project.
func (k *keystone) tenantToken(tn tenant) string {
	k.t.Helper()
	r := tokens.Create(k.ctx, k.anon, &tokens.AuthOptions{Username: tn.user, Password: tn.password, DomainID: tn.domain,
		Scope: tokens.Scope{ProjectID: tn.project}})
	id, err := r.ExtractTokenID()
	testsvc.Must(k.t, err, "log in as "+tn.user)
	return id
}

// TestSameNamesInTwoDomains: two tenants whose user and project names are
// the same, in two Keystone domains, are two callers: the same
// Idempotency-Key makes a request of each (not a 409, nor the other's
// answer), and each reads its own request only.
func TestSameNamesInTwoDomains(t *testing.T) {
	w := newWorld(t)
	projName, userName := testsvc.Name("vgpu-test-same"), testsvc.Name("vgpu-test-alice")
	one, two := w.ks.domainTenant(projName, userName), w.ks.domainTenant(projName, userName)
	tokOne, tokTwo := w.ks.tenantToken(one), w.ks.tenantToken(two)
	inst := map[string]string{}
	for _, tn := range []tenant{one, two} {
		inst[tn.project] = uuid.NewString()
		_, err := w.pool.Exec(context.Background(), `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state)
			VALUES ($1, $2, 'u', 'host-k', 'node-k', 'active', 'running')`, inst[tn.project], tn.project)
		testsvc.Must(t, err, "insert instance")
	}
	post := func(token, vm string) answer {
		t.Helper()
		body := fmt.Sprintf(`{"type":"GPU_REQUEST","vm_id":"%s","workload":"inference","vgpu_profile":"T4-4Q"}`, vm)
		req, err := http.NewRequest(http.MethodPost, w.url+"/v1/requests", strings.NewReader(body))
		testsvc.Must(t, err, "request")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Auth-Token", token)
		req.Header.Set("Idempotency-Key", "nightly-run-1")
		resp, err := http.DefaultClient.Do(req)
		testsvc.Must(t, err, "POST /v1/requests")
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: b}
	}
	ids := map[string]string{}
	for _, c := range []struct {
		who, token string
		tn         tenant
	}{{"the first domain's", tokOne, one}, {"the second domain's", tokTwo, two}} {
		a := post(c.token, inst[c.tn.project])
		if a.status != http.StatusAccepted {
			t.Fatalf("%s alice, key nightly-run-1: %d %s, want 202", c.who, a.status, a.body)
		}
		var ans struct {
			RequestID string `json:"request_id"`
		}
		testsvc.Must(t, json.Unmarshal(a.body, &ans), "decode")
		ids[c.tn.project] = ans.RequestID
	}
	if ids[one.project] == ids[two.project] {
		t.Fatalf("both tenants got request %s: one key space for two callers", ids[one.project])
	}
	// Each retry is its own replay.
	for _, tn := range []tenant{one, two} {
		tok := map[string]string{one.project: tokOne, two.project: tokTwo}[tn.project]
		if a := post(tok, inst[tn.project]); a.status != http.StatusAccepted || !strings.Contains(string(a.body), ids[tn.project]) {
			t.Errorf("retry: %d %s, want the first answer (%s)", a.status, a.body, ids[tn.project])
		}
	}
	w.api.expect(200, "GET", "/v1/requests/"+ids[one.project], tokOne, "the first domain's alice, her request")
	w.api.expect(404, "GET", "/v1/requests/"+ids[one.project], tokTwo, "the second domain's alice, the other's request")
	w.api.expect(200, "GET", "/v1/requests/"+ids[two.project], tokTwo, "the second domain's alice, her request")
}
