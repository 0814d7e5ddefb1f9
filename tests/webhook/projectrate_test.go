package webhook

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestProjectRateLimit: each project has one bucket over every route that
// makes requests (POST /v1/requests and each webhook source): once project
// A has used its burst, its next request is 429 rate_limited_project with
// Retry-After whichever route it comes by, and nothing of it is stored,
// while project B's requests are still accepted. Before, nothing limited a
// project (a member sent 20,000 requests in 8 s), and the webhook events
// carried no project. An instance the bridge does not know counts for no
// project; an Alertmanager message is accepted and spends the budget.
func TestProjectRateLimit(t *testing.T) {
	const burst = 3
	tf := filepath.Join(t.TempDir(), "api-tokens")
	testsvc.Must(t, os.WriteFile(tf, []byte("member-a-token member alice proj-a\nmember-b-token member bob proj-b\n"), 0o600), "token file")
	members, err := api.LoadTokenFile(tf)
	testsvc.Must(t, err, "token file")
	e := newEnv(t, []webhook.Source{batchSource(), alertSource()}, func(wc *webhook.Config, ac *api.Config) {
		wc.ProjectRate, wc.ProjectBurst = 0.0001, burst // no refill within the test
		ac.Auth = members
	})
	instA, instB, unknown := uuid.NewString(), uuid.NewString(), uuid.NewString()
	for vm, proj := range map[string]string{instA: "proj-a", instB: "proj-b"} {
		_, err := e.pool.Exec(context.Background(), `INSERT INTO instances (uuid, project_id, host) VALUES ($1, $2, 'cmp1')`, vm, proj)
		testsvc.Must(t, err, "instance")
	}
	body := func(vm string) []byte {
		return []byte(`{"type":"GPU_LOAD","vm_id":"` + vm + `","workload":"training","nonce":"` + uuid.NewString() + `"}`)
	}
	operator := func(token, vm string) answer {
		return e.do(http.MethodPost, "/v1/requests", body(vm), map[string]string{"X-Auth-Token": token})
	}
	hook := func(vm string) answer { return e.postHub("batch", secretNew, body(vm), uuid.NewString()) }

	// A: its burst over both routes, then 429 on both.
	var accepted []uuid.UUID
	accepted = append(accepted, e.want202(operator("member-a-token", instA)), e.want202(hook(instA)), e.want202(operator("member-a-token", instA)))
	before := e.count(`SELECT count(*) FROM requests`)
	for name, a := range map[string]answer{"POST /v1/requests": operator("member-a-token", instA), "webhook": hook(instA)} {
		p := wantProblem(t, a, http.StatusTooManyRequests, webhook.CodeRateLimitedProject)
		if ra, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("%s: Retry-After %q, want whole seconds ≥ 1", name, a.header.Get("Retry-After"))
		}
		if d, _ := p["detail"].(string); d == "" {
			t.Errorf("%s: no detail", name)
		}
	}
	if n := e.count(`SELECT count(*) FROM requests`); n != before {
		t.Errorf("%d requests stored by the refused ones, want none", n-before)
	}
	// B is not held back by A, over either route.
	e.want202(operator("member-b-token", instB))
	e.want202(hook(instB))
	e.want202(operator("member-b-token", instB))
	// An Alertmanager message is not refused for A's rate (Alertmanager
	// does not retry a 429); it is accepted and spends A's budget.
	msg := []byte(`{"version":"4","status":"firing","receiver":"vgpu","groupKey":"g","alerts":[` +
		`{"status":"firing","labels":{"alertname":"GPUBusy","instance_uuid":"` + instA + `"},"startsAt":"2026-12-03T10:00:00Z","fingerprint":"f1"}]}`)
	e.want202(e.do(http.MethodPost, "/v1/webhooks/alerts", msg, map[string]string{"Authorization": "Bearer " + amToken}))
	wantProblem(t, operator("member-a-token", instA), http.StatusTooManyRequests, webhook.CodeRateLimitedProject)
	// An instance the bridge does not know is in no project's bucket.
	e.want202(hook(unknown))
	if got := e.metric("vgpu_bridge_webhook_refused_total", `reason="rate_limited_project",source="batch"`); got != 1 {
		t.Errorf("refused{rate_limited_project} = %v, want 1 (the webhook)", got)
	}

	// The inbox rows carry the instance's project (the pipeline shares its
	// batches by it).
	for _, id := range accepted {
		var proj string
		testsvc.Must(t, e.pool.QueryRow(context.Background(), `SELECT coalesce(project_id, '') FROM events WHERE request_id = $1`, id.String()).Scan(&proj), "event")
		if proj != "proj-a" {
			t.Errorf("event of request %s: project_id %q, want proj-a", id, proj)
		}
	}
	if n := e.count(`SELECT count(*) FROM events WHERE instance_uuid = $1 AND project_id IS NULL`, unknown); n != 1 {
		t.Errorf("%d events of the unknown instance without a project, want 1", n)
	}
	e.noSecretsLogged()
}
