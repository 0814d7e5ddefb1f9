package keystone_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestMemberWalksEveryRoute is the role contract, route by route: a
// Keystone member of project A, with a project-scoped token, calls every
// operation /v1/openapi.json lists. Each operation states its class
// (x-vgpu-access) and its access rule (x-vgpu-policy); fleet and admin
// ones answer 403 problem+json, project ones answer without a trace of
// project B (its instance, project id, request, allocation or event),
// public ones answer, and the custom ones (webhooks, a request by id)
// never show B either. Project B's data and the fleet routes are there:
// the admin token sees them.
func TestMemberWalksEveryRoute(t *testing.T) {
	w := newWorld(t)
	seedWalk(t, w)
	member := w.ks.user("walker", w.pa, "member")
	walkEveryRoute(t, w, "member of A", w.ks.token(member), nil)
}

// maintainerPolicy is a policy file's one override: the Keystone role
// vgpu-maintainer may drain hosts (and end their drains), nothing else
// that needs admin.
const maintainerPolicy = "# hosts' maintenance without admin\n" +
	"\"vgpu:hosts:drain\": \"rule:admin or role:vgpu-maintainer\"\n"

// TestMaintainerWalksEveryRoute is the same walk with a policy file that
// opens host drains to a maintenance role: a member of A that also holds
// vgpu-maintainer may drain and undrain a host (audited under its name)
// and is refused every other admin or fleet route, GPU drains and
// migrate-all included; a plain member walks as with the defaults; a
// token with only the maintenance role may drain and nothing else, not
// even its project's reads.
func TestMaintainerWalksEveryRoute(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	testsvc.Must(t, os.WriteFile(policy, []byte(maintainerPolicy), 0o600), "write policy file")
	w := newWorld(t, "oslo_policy.policy_file="+policy)
	seedWalk(t, w)
	drain := map[string]bool{"vgpu:hosts:drain": true}
	maint := w.ks.user("maint", w.pa, "member", "vgpu-maintainer")
	walkEveryRoute(t, w, "member+maintainer of A", w.ks.token(maint), drain)
	walkEveryRoute(t, w, "member of A", w.ks.token(w.ks.user("walker", w.pa, "member")), nil)

	// The drain itself, with a reason, and its undo: audited as the
	// maintainer's. (A host the bridge knows: agents would have reported it.)
	_, err := w.pool.Exec(context.Background(), `INSERT INTO hosts (name) VALUES ('node-k') ON CONFLICT DO NOTHING`)
	testsvc.Must(t, err, "seed host")
	only := w.ks.token(w.ks.user("onlymaint", w.pa, "vgpu-maintainer"))
	admin := w.ks.adminToken()
	for _, tc := range []struct {
		method, who, token string
	}{{"POST", "member+maintainer", w.ks.token(maint)}, {"DELETE", "member+maintainer", w.ks.token(maint)}, {"POST", "maintainer only", only}} {
		a := w.api.doBody(tc.method, "/v1/hosts/node-k/drain", tc.token, `{"reason": "CHG-1 fan swap"}`)
		if a.status != 200 {
			t.Errorf("%s: %s /v1/hosts/node-k/drain = %d (%s), want 200", tc.who, tc.method, a.status, a.body)
		}
	}
	if a := w.api.expect(200, "GET", "/v1/audit", admin, "admin"); !strings.Contains(string(a.body), "maint") {
		t.Errorf("the audit log does not name the maintainer: %s", a.body)
	}
	for _, route := range []string{"GET /v1/instances", "GET /v1/hosts", "POST /v1/gpus/x/drain", "POST /v1/hosts/node-k/migrate-all"} {
		m, path, _ := strings.Cut(route, " ")
		a := w.api.do(m, path, only)
		if a.status != 403 || a.problem(t)["code"] != "forbidden" {
			t.Errorf("maintainer only: %s = %d (%s), want 403 forbidden", route, a.status, a.body)
		}
	}
}

// seedWalk puts B's and A's allocations in the mirror, and an event of each.
func seedWalk(t *testing.T, w *world) {
	t.Helper()
	ctx := context.Background()
	w.gpu = uuid.NewString()
	root := uuid.NewString()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO placement_providers (uuid, name, generation, root_uuid) VALUES ($1, 'node-k', 1, $1)`, []any{root}},
		{`INSERT INTO placement_providers (uuid, name, generation, parent_uuid, root_uuid) VALUES ($1, 'node-k_pci_0000_3b_00_0', 1, $2, $2)`, []any{w.gpu, root}},
		{`INSERT INTO placement_allocations (provider_uuid, consumer_uuid, resource_class, used) VALUES ($1, $2, 'VGPU', 1), ($1, $3, 'VGPU', 1)`, []any{w.gpu, w.instA, w.instB}},
		{`INSERT INTO events (source, message_id, event_type, instance_uuid, payload, processed_at) VALUES
			('nova', $1, 'instance.update', $2::uuid, jsonb_build_object('instance', $2::text), now()),
			('nova', $3, 'instance.update', $4::uuid, jsonb_build_object('instance', $4::text, 'project', $5::text), now())`,
			[]any{uuid.NewString(), w.instA, uuid.NewString(), w.instB, w.projB}},
	} {
		_, err := w.pool.Exec(ctx, q.sql, q.args...)
		testsvc.Must(t, err, "seed")
	}
}

// walkEveryRoute calls every operation of the document with tok, a
// caller of project A: routes of class fleet or admin answer 403 unless
// their rule is one of opened (then they let the caller in: not 401, 403
// or 5xx), the others answer, and none shows project B's data.
func walkEveryRoute(t *testing.T, w *world, caller, tok string, opened map[string]bool) {
	t.Helper()
	admin := w.ks.adminToken()
	secrets := []string{w.instB, w.projB, w.reqB, w.reqNone}

	var doc struct {
		Paths map[string]map[string]map[string]any `json:"paths"`
	}
	testsvc.Must(t, json.Unmarshal(w.api.expect(200, "GET", "/v1/openapi.json", "", "anyone").body, &doc), "openapi")
	fill := strings.NewReplacer("{uuid}", w.instA, "{name}", "host-k", "{source}", "no-such-source", "{id}", "")
	counts := map[string]int{}
	seen := map[string]bool{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			access, _ := op["x-vgpu-access"].(string)
			rule, _ := op["x-vgpu-policy"].(string)
			counts[access]++
			seen[rule] = true
			target := fill.Replace(path)
			switch {
			case strings.HasPrefix(path, "/v1/requests/{id}"):
				target = strings.Replace(path, "{id}", w.reqA, 1)
			case strings.Contains(path, "{id}"):
				target = strings.Replace(path, "{id}", "1", 1)
			}
			if strings.HasPrefix(path, "/v1/gpus/{id}") {
				target = strings.Replace(path, "{id}", w.gpu, 1)
			}
			m := strings.ToUpper(method)
			if access != "public" && (access != "custom" || path == "/v1/requests/{id}") && rule == "" {
				t.Errorf("%s %s (%s) names no access rule (x-vgpu-policy)", m, path, access)
			}
			a := w.api.do(m, target, tok)
			who := caller + ": " + m + " " + target + " (" + access + ", " + rule + ")"
			switch access {
			case "fleet", "admin":
				if opened[rule] {
					if a.status == 401 || a.status == 403 || a.status >= 500 {
						t.Errorf("%s = %d, want it let in by the policy file (%s)", who, a.status, a.body)
					}
					break
				}
				if a.status != 403 {
					t.Errorf("%s = %d, want 403 (%s)", who, a.status, a.body)
					continue
				}
				if p := a.problem(t); p["code"] != "forbidden" || p["policy_rule"] != rule {
					t.Errorf("%s: problem %v, want forbidden naming the rule", who, p)
				}
				// The route works: the admin reads it (reads only: an
				// admin's sync or drain would change the world).
				if m != "GET" {
					break
				}
				if b := w.api.do(m, target, admin); b.status == 401 || b.status == 403 || b.status >= 500 {
					t.Errorf("admin: %s %s = %d (%s)", m, target, b.status, b.body)
				}
			case "project", "public", "custom":
				if a.status == 401 && access != "custom" || a.status == 403 || a.status >= 500 && path != "/readyz" {
					t.Errorf("%s = %d (%s)", who, a.status, a.body)
				}
			default:
				t.Errorf("%s %s has no access class (x-vgpu-access = %q)", m, path, access)
				continue
			}
			for _, s := range secrets {
				if strings.Contains(string(a.body), s) {
					t.Errorf("%s shows project B's data (%s): %s", who, s, a.body)
				}
			}
		}
	}
	if counts["project"] < 5 || counts["fleet"] < 8 || counts["admin"] < 8 {
		t.Fatalf("routes walked by class: %v; the document lists fewer than expected", counts)
	}
	for rule := range opened {
		if !seen[rule] {
			t.Errorf("no route of the document is guarded by %s", rule)
		}
	}
	t.Logf("%s: routes walked by class: %v", caller, counts)

	// What A's caller sees of its own: its instance, allocation, event.
	for path, field := range map[string]string{"/v1/instances": "instances", "/v1/allocations": "allocations", "/v1/events": "events"} {
		var page map[string][]map[string]any
		testsvc.Must(t, json.Unmarshal(w.api.expect(200, "GET", path, tok, caller).body, &page), "decode")
		if len(page[field]) != 1 {
			t.Errorf("%s: %s lists %d, want A's one: %v", caller, path, len(page[field]), page[field])
		}
		for _, row := range page[field] {
			if _, ok := row["host"]; ok && path == "/v1/allocations" {
				t.Errorf("%s: %s shows the host of an allocation: %v", caller, path, row)
			}
		}
		testsvc.Must(t, json.Unmarshal(w.api.expect(200, "GET", path, admin, "admin").body, &page), "decode")
		if len(page[field]) < 2 {
			t.Errorf("admin: %s lists %d, want A's and B's", path, len(page[field]))
		}
	}
}

// TestRequestsWithAPICredentials: POST /v1/requests makes a request with
// a Keystone token instead of a webhook secret — a member for its
// project's instances only, an admin for any, a reader not at all — and
// a retry under the same Idempotency-Key gets the first answer.
func TestRequestsWithAPICredentials(t *testing.T) {
	w := newWorld(t)
	member, reader := w.ks.user("asker", w.pa, "member"), w.ks.user("looker", w.pa, "reader")
	tMember, tReader, admin := w.ks.token(member), w.ks.token(reader), w.ks.adminToken()
	post := func(token, key, vm string, count ...int) answer {
		t.Helper()
		n := 1
		if len(count) > 0 {
			n = count[0]
		}
		body := fmt.Sprintf(`{"type":"GPU_REQUEST","vm_id":"%s","workload":"inference","vgpu_profile":"T4-4Q","count":%d}`, vm, n)
		req, err := http.NewRequest("POST", w.url+"/v1/requests", strings.NewReader(body))
		testsvc.Must(t, err, "request")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Auth-Token", token)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		testsvc.Must(t, err, "POST /v1/requests")
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: b}
	}
	var first struct {
		RequestID string `json:"request_id"`
	}
	a := post(tMember, "k-1", w.instA)
	if a.status != 202 {
		t.Fatalf("member of A, A's instance: %d %s", a.status, a.body)
	}
	testsvc.Must(t, json.Unmarshal(a.body, &first), "decode")
	if again := post(tMember, "k-1", w.instA); again.status != 202 || !strings.Contains(string(again.body), first.RequestID) {
		t.Errorf("retry under the same key: %d %s, want the first answer (%s)", again.status, again.body, first.RequestID)
	}
	// The request is the member's to read, and its source is "api".
	var r struct{ Source, Kind string }
	testsvc.Must(t, json.Unmarshal(w.api.expect(200, "GET", "/v1/requests/"+first.RequestID, tMember, "member").body, &r), "decode")
	if r.Source != "webhook:api" || r.Kind != "GPU_REQUEST" {
		t.Errorf("request as stored: %+v", r)
	}
	for _, tc := range []struct {
		who, token, vm string
		status         int
		code           string
	}{
		{"member of A, B's instance", tMember, w.instB, 403, "project_not_allowed"},
		{"member of A, an instance no one knows", tMember, uuid.NewString(), 403, "project_not_allowed"},
		{"reader of A", tReader, w.instA, 403, "forbidden"},
		{"admin, B's instance", admin, w.instB, 202, ""},
	} {
		a := post(tc.token, "", tc.vm)
		if a.status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.who, a.status, a.body, tc.status)
			continue
		}
		if tc.code != "" {
			if p := a.problem(t); p["code"] != tc.code {
				t.Errorf("%s: problem %v, want code %s", tc.who, p, tc.code)
			}
		}
	}
	// Another body under the member's key conflicts; the same key is
	// free for another caller.
	if a := post(tMember, "k-1", w.instA, 2); a.status != 409 || a.problem(t)["code"] != "idempotency_conflict" {
		t.Errorf("another body under the same key: %d %s, want 409 idempotency_conflict", a.status, a.body)
	}
	if a := post(admin, "k-1", w.instA); a.status != 202 || strings.Contains(string(a.body), first.RequestID) {
		t.Errorf("admin under the member's key: %d %s, want a request of its own", a.status, a.body)
	}

	// vgpuctl request: the same with a member's clouds.yaml entry.
	clouds := writeCloudsYAML(t, cloud{name: "asker", authURL: keystoneURL(), user: member.name, password: member.password,
		project: w.pa.Name, region: "RegionOne"})
	env := []string{"OS_CLIENT_CONFIG_FILE=" + clouds, "VGPUCTL_TOKEN=", "OS_CLOUD="}
	code, out, errs := vgpuctl(t, env, "--url", w.url, "--os-cloud", "asker", "request", "attach", w.instA, "T4-4Q", "--no-wait", "-o", "json")
	if code != 0 || !strings.Contains(out, `"request_id"`) {
		t.Errorf("vgpuctl request attach --no-wait: exit %d, out %s, err %s", code, out, errs)
	}
	code, _, errs = vgpuctl(t, env, "--url", w.url, "--os-cloud", "asker", "request", "release", w.instB)
	if code != 1 || !strings.Contains(errs, "project_not_allowed") && !strings.Contains(errs, "not in project") {
		t.Errorf("vgpuctl request release of B's instance: exit %d, stderr %s; want exit 1, project_not_allowed", code, errs)
	}
	// Followed to its end: this instance has no host with a GPU, so the
	// release has nothing to take back and ends without success (exit 5).
	code, _, errs = vgpuctl(t, env, "--url", w.url, "--os-cloud", "asker", "request", "release", w.instA, "--wait-timeout", "60s")
	if code != 5 || !strings.Contains(errs, "ended") {
		t.Errorf("vgpuctl request release, followed: exit %d, stderr %s; want exit 5 (ended without success)", code, errs)
	}
}
