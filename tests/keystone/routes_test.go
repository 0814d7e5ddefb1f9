package keystone_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestMemberWalksEveryRoute is the role contract, route by route: a
// Keystone member of project A, with a project-scoped token, calls every
// operation /v1/openapi.json lists. Each operation states its class
// (x-vgpu-access); fleet and admin ones answer 403 problem+json, project
// ones answer without a trace of project B (its instance, project id,
// request, allocation or event), public ones answer, and the custom ones
// (webhooks, a request by id) never show B either. Project B's data and
// the fleet routes are there: the admin token sees them.
func TestMemberWalksEveryRoute(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	// B's and A's allocations in the mirror, and an event of each.
	gpu, root := uuid.NewString(), uuid.NewString()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO placement_providers (uuid, name, generation, root_uuid) VALUES ($1, 'node-k', 1, $1)`, []any{root}},
		{`INSERT INTO placement_providers (uuid, name, generation, parent_uuid, root_uuid) VALUES ($1, 'node-k_pci_0000_3b_00_0', 1, $2, $2)`, []any{gpu, root}},
		{`INSERT INTO placement_allocations (provider_uuid, consumer_uuid, resource_class, used) VALUES ($1, $2, 'VGPU', 1), ($1, $3, 'VGPU', 1)`, []any{gpu, w.instA, w.instB}},
		{`INSERT INTO events (source, message_id, event_type, instance_uuid, payload, processed_at) VALUES
			('nova', $1, 'instance.update', $2::uuid, jsonb_build_object('instance', $2::text), now()),
			('nova', $3, 'instance.update', $4::uuid, jsonb_build_object('instance', $4::text, 'project', $5::text), now())`,
			[]any{uuid.NewString(), w.instA, uuid.NewString(), w.instB, w.projB}},
	} {
		_, err := w.pool.Exec(ctx, q.sql, q.args...)
		testsvc.Must(t, err, "seed")
	}
	member := w.ks.user("walker", w.pa, "member")
	tok, admin := w.ks.token(member), w.ks.adminToken()
	secrets := []string{w.instB, w.projB, w.reqB, w.reqNone}

	var doc struct {
		Paths map[string]map[string]map[string]any `json:"paths"`
	}
	testsvc.Must(t, json.Unmarshal(w.api.expect(200, "GET", "/v1/openapi.json", "", "anyone").body, &doc), "openapi")
	fill := strings.NewReplacer("{uuid}", w.instA, "{name}", "host-k", "{source}", "no-such-source", "{id}", "")
	counts := map[string]int{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			access, _ := op["x-vgpu-access"].(string)
			counts[access]++
			target := fill.Replace(path)
			switch {
			case strings.HasPrefix(path, "/v1/requests/{id}"):
				target = strings.Replace(path, "{id}", w.reqA, 1)
			case strings.Contains(path, "{id}"):
				target = strings.Replace(path, "{id}", "1", 1)
			}
			if strings.HasPrefix(path, "/v1/gpus/{id}") {
				target = strings.Replace(path, "{id}", gpu, 1)
			}
			m := strings.ToUpper(method)
			a := w.api.do(m, target, tok)
			who := "member of A: " + m + " " + target + " (" + access + ")"
			switch access {
			case "fleet", "admin":
				if a.status != 403 {
					t.Errorf("%s = %d, want 403 (%s)", who, a.status, a.body)
					continue
				}
				if p := a.problem(t); p["code"] != "forbidden" {
					t.Errorf("%s: problem %v", who, p)
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
	t.Logf("routes walked by class: %v", counts)

	// What A's member sees of its own: its instance, allocation, event.
	for path, field := range map[string]string{"/v1/instances": "instances", "/v1/allocations": "allocations", "/v1/events": "events"} {
		var page map[string][]map[string]any
		testsvc.Must(t, json.Unmarshal(w.api.expect(200, "GET", path, tok, "member of A").body, &page), "decode")
		if len(page[field]) != 1 {
			t.Errorf("member of A: %s lists %d, want A's one: %v", path, len(page[field]), page[field])
		}
		for _, row := range page[field] {
			if _, ok := row["host"]; ok && path == "/v1/allocations" {
				t.Errorf("member of A: %s shows the host of an allocation: %v", path, row)
			}
		}
		testsvc.Must(t, json.Unmarshal(w.api.expect(200, "GET", path, admin, "admin").body, &page), "decode")
		if len(page[field]) < 2 {
			t.Errorf("admin: %s lists %d, want A's and B's", path, len(page[field]))
		}
	}
}
