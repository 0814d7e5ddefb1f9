package webhook

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestSourceScopedToProjects: a source with allowed_projects acts only on
// instances of those projects. A native request for another project's
// instance, or one the bridge does not know, is 403 project_not_allowed,
// and nothing is stored; an Alertmanager message keeps the alerts of
// allowed instances and lists the others as skipped. Before, any source
// with a valid secret could act on any project's instance.
func TestSourceScopedToProjects(t *testing.T) {
	s := batchSource()
	s.AllowedProjects = []string{"proj-a"}
	am := alertSource()
	am.AllowedProjects = []string{"proj-a"}
	e := newEnv(t, []webhook.Source{s, am})
	mine, theirs, unknown := uuid.NewString(), uuid.NewString(), uuid.NewString()
	for vm, proj := range map[string]string{mine: "proj-a", theirs: "proj-b"} {
		_, err := e.pool.Exec(context.Background(), `INSERT INTO instances (uuid, project_id, host) VALUES ($1, $2, 'cmp1')`, vm, proj)
		testsvc.Must(t, err, "instance")
	}
	body := func(vm string) []byte {
		return []byte(`{"type":"GPU_REQUEST","vm_id":"` + vm + `","workload":"training","vgpu_profile":"T4-4Q","nonce":"` + uuid.NewString() + `"}`)
	}
	e.want202(e.postHub("batch", secretNew, body(mine), "p1"))
	for i, vm := range []string{theirs, unknown} {
		p := wantProblem(t, e.postHub("batch", secretNew, body(vm), "p"+string(rune('2'+i))), http.StatusForbidden, "project_not_allowed")
		if d, _ := p["detail"].(string); d == "" || strings.Contains(d, "proj-b") {
			t.Errorf("detail %q: want a reason that does not name the other project", d)
		}
	}
	if n := e.count(`SELECT count(*) FROM requests`); n != 1 {
		t.Errorf("%d requests stored, want 1", n)
	}

	msg := []byte(`{"version":"4","status":"firing","receiver":"vgpu","groupKey":"g","alerts":[` +
		`{"status":"firing","labels":{"alertname":"GPUBusy","instance_uuid":"` + theirs + `"},"startsAt":"2026-12-03T10:00:00Z","fingerprint":"f0"},` +
		`{"status":"firing","labels":{"alertname":"GPUBusy","instance_uuid":"` + mine + `"},"startsAt":"2026-12-03T10:00:00Z","fingerprint":"f1"}]}`)
	a := e.do(http.MethodPost, "/v1/webhooks/alerts", msg, map[string]string{"Authorization": "Bearer " + amToken})
	id := e.want202(a)
	skipped, _ := a.json(t)["skipped"].([]any)
	if len(skipped) != 1 || skipped[0].(map[string]any)["fingerprint"] != "f0" || skipped[0].(map[string]any)["index"] != float64(0) {
		t.Errorf("skipped %v, want the other project's alert (index 0)", skipped)
	}
	if n := e.count(`SELECT count(*) FROM events WHERE request_id = $1`, id.String()); n != 1 {
		t.Errorf("%d events for the Alertmanager request, want 1", n)
	}
	var inst string
	testsvc.Must(t, e.pool.QueryRow(context.Background(), `SELECT coalesce(instance_uuid::text,'') FROM requests WHERE id = $1`, id).Scan(&inst), "request")
	if inst != mine {
		t.Errorf("request's instance %q, want %s", inst, mine)
	}
}
