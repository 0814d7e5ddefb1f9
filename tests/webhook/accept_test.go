package webhook

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

func TestAcceptHubSignature(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	body := nativeBody(`"metrics":{"queue_depth":12,"util":0.93,"pool":"render","hot":true}`)
	id := e.want202(e.postHub("batch", secretNew, body, "job-1"))
	ctx := context.Background()
	var source, kind, state, inst string
	var stored json.RawMessage
	testsvc.Must(t, e.pool.QueryRow(ctx, `SELECT source, kind, state, instance_uuid::text, body FROM requests WHERE id = $1`, id).
		Scan(&source, &kind, &state, &inst, &stored), "request row")
	if source != "webhook:batch" || kind != "GPU_REQUEST" || state != "accepted" || inst != vmID {
		t.Errorf("request row = %s %s %s %s", source, kind, state, inst)
	}
	// The inbox row, in the same transaction.
	var evType, evInst, reqID string
	var payload json.RawMessage
	testsvc.Must(t, e.pool.QueryRow(ctx, `SELECT event_type, instance_uuid::text, request_id, payload FROM events
		WHERE source = 'webhook:batch' AND message_id = $1`, id.String()).Scan(&evType, &evInst, &reqID, &payload), "event row")
	if evType != "GPU_REQUEST" || evInst != vmID || reqID != id.String() {
		t.Errorf("event row = %s %s %s", evType, evInst, reqID)
	}
	var ev webhook.EventPayload
	testsvc.Must(t, json.Unmarshal(payload, &ev), "payload")
	if ev.RequestID != id || ev.Workload != "training" || ev.VGPUProfile != "T4-4Q" || ev.Metrics["queue_depth"] == nil {
		t.Errorf("event payload = %s", payload)
	}
	if n := e.count(`SELECT count(*) FROM audit_log WHERE object_type = 'request' AND object_id = $1 AND action = 'create'`, id.String()); n != 1 {
		t.Errorf("%d audit rows", n)
	}
	if got := e.metric("vgpu_bridge_webhook_accepted_total", `source="batch"`); got != 1 {
		t.Errorf("accepted metric = %v", got)
	}
	// The operator reads it.
	a := e.do(http.MethodGet, "/v1/requests/"+id.String(), nil, map[string]string{"X-Auth-Token": readToken})
	if a.status != 200 || a.json(t)["state"] != "accepted" {
		t.Errorf("GET status = %d %s", a.status, a.body)
	}
}

func TestAcceptStandardWebhooksAndClockSkew(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	now := time.Now()
	for _, c := range []struct {
		name string
		skew time.Duration
		ok   bool
	}{
		{"now", 0, true},
		{"4m late", -4 * time.Minute, true},
		{"4m early", 4 * time.Minute, true},
		{"6m late", -6 * time.Minute, false},
		{"6m early", 6 * time.Minute, false},
		{"a day late", -24 * time.Hour, false},
		// Beyond what a time.Duration holds (about 292 years).
		{"300 years early", 0, false},
		{"at the epoch", 0, false}, // the earliest webhook-timestamp can say
	} {
		t.Run(c.name, func(t *testing.T) {
			at := now.Add(c.skew)
			switch c.name {
			case "300 years early":
				at = now.AddDate(300, 0, 0)
			case "at the epoch":
				at = time.Unix(0, 0)
			}
			a := e.postStd("batch", secretNew, nativeBody(""), "msg_"+strings.ReplaceAll(c.name, " ", "_"), at)
			if c.ok {
				e.want202(a)
			} else {
				wantProblem(t, a, http.StatusUnauthorized, "timestamp_skew")
			}
		})
	}
}

// writeSecret writes a secret file readable by its owner only.
func writeSecret(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	testsvc.Must(t, os.WriteFile(p, []byte(text+"\n"), 0o600), "write secret")
	return p
}

// TestRotationFromConfig reads a source with two secret files through the
// bridge's configuration; both secrets verify during the rotation.
func TestRotationFromConfig(t *testing.T) {
	dir := t.TempDir()
	newF := writeSecret(t, dir, "batch.new", string(secretNew))
	// The old secret in Standard Webhooks form: whsec_ + base64 of the key.
	oldF := writeSecret(t, dir, "batch.old", "whsec_"+base64.StdEncoding.EncodeToString(secretOld))
	ini := filepath.Join(dir, "bridge.conf")
	testsvc.Must(t, os.WriteFile(ini, []byte(`[webhook_source:batch]
auth = hmac
secret_files = `+newF+`, `+oldF+`
rate = 100
burst = 100
callback_hosts = 127.0.0.1
`), 0o600), "write conf")
	v, err := bridge.LoadConfig(conf.Source{File: ini, Overrides: append([]string{
		"DEFAULT.transport_url=rabbit://guest:guest@127.0.0.1:5672/", "database.connection=postgres://x@127.0.0.1/x",
		"api.auth_strategy=noauth"}, testkeys.For(t).Bridge()...)})
	testsvc.Must(t, err, "load config")
	srcs, err := bridge.WebhookSources(v)
	testsvc.Must(t, err, "sources")
	if len(srcs) != 1 || len(srcs[0].Secrets) != 2 {
		t.Fatalf("sources = %+v", srcs)
	}
	e := newEnv(t, srcs)
	e.want202(e.postHub("batch", secretNew, nativeBody(""), "rot-new"))
	e.want202(e.postHub("batch", secretOld, nativeBody(""), "rot-old"))
	wantProblem(t, e.postHub("batch", secretOther, nativeBody(""), "rot-other"), http.StatusUnauthorized, "bad_signature")
	// A sender in mid-rotation sends two signatures: one matching is enough.
	body := nativeBody("")
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	sig := stdSign(secretOther, "rot-2", ts, body) + " " + stdSign(secretOld, "rot-2", ts, body)
	e.want202(e.do(http.MethodPost, "/v1/webhooks/batch", body, map[string]string{
		"webhook-id": "rot-2", "webhook-timestamp": ts, "webhook-signature": sig}))
	e.noSecretsLogged()
	// A world-readable secret file is refused when the configuration loads.
	testsvc.Must(t, os.Chmod(oldF, 0o644), "chmod")
	if _, err := bridge.WebhookSources(v); err == nil || !strings.Contains(err.Error(), "world-readable") {
		t.Errorf("world-readable secret accepted: %v", err)
	}
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	testsvc.Must(t, err, "fixture")
	return b
}

func TestAlertmanager(t *testing.T) {
	e := newEnv(t, []webhook.Source{alertSource()})
	bearer := map[string]string{"Authorization": "Bearer " + amToken}
	post := func(body []byte) answer { return e.do(http.MethodPost, "/v1/webhooks/alerts", body, bearer) }

	t.Run("current shape", func(t *testing.T) {
		a := post(readFixture(t, "current_shape.json"))
		id := e.want202(a)
		sk := a.json(t)["skipped"].([]any)
		if len(sk) != 1 || sk[0].(map[string]any)["index"].(float64) != 2 || sk[0].(map[string]any)["fingerprint"] != "f6e5d4c3b2a10987" {
			t.Errorf("skipped = %v", sk)
		}
		rows, err := e.pool.Query(context.Background(), `SELECT event_type, instance_uuid::text, occurred_at, payload FROM events
			WHERE source = 'webhook:alerts' AND request_id = $1 ORDER BY message_id`, id.String())
		testsvc.Must(t, err, "events")
		defer rows.Close()
		var got []webhook.EventPayload
		var at []time.Time
		for rows.Next() {
			var typ, inst string
			var occ time.Time
			var p json.RawMessage
			testsvc.Must(t, rows.Scan(&typ, &inst, &occ, &p), "scan")
			var ev webhook.EventPayload
			testsvc.Must(t, json.Unmarshal(p, &ev), "payload")
			if typ != "GPU_LOAD" || inst != ev.VMID {
				t.Errorf("event %s %s", typ, inst)
			}
			got = append(got, ev)
			at = append(at, occ)
		}
		if len(got) != 2 {
			t.Fatalf("%d events, want 2", len(got))
		}
		if got[0].VMID != vmID || got[0].Alert.Status != "firing" || got[0].Workload != "training" || got[0].Alert.Fingerprint != "a1b2c3d4e5f60718" {
			t.Errorf("firing event = %+v", got[0])
		}
		if got[1].Alert.Status != "resolved" || !at[1].Equal(time.Date(2026, 3, 1, 9, 45, 0, 0, time.UTC)) {
			t.Errorf("resolved event = %+v at %v (want its endsAt)", got[1], at[1])
		}
	})
	t.Run("older real payloads without the label", func(t *testing.T) {
		for _, f := range []string{"prom_post_request.json", "prom_post_request_2_alerts.json"} {
			a := post(readFixture(t, f))
			id := e.want202(a)
			var want int
			var raw map[string]json.RawMessage
			json.Unmarshal(readFixture(t, f), &raw)
			var alerts []any
			json.Unmarshal(raw["alerts"], &alerts)
			want = len(alerts)
			if sk := a.json(t)["skipped"].([]any); len(sk) != want {
				t.Errorf("%s: skipped %d, want %d", f, len(sk), want)
			}
			// Nothing to do: the request is rejected at once, saying why.
			r, err := e.store.Get(context.Background(), id)
			testsvc.Must(t, err, "get")
			if r.State != "rejected" || r.Code != webhook.CodeNoInstance {
				t.Errorf("%s: request %s %s %q", f, r.State, r.Code, r.Reason)
			}
		}
	})
	t.Run("wrong types are 422", func(t *testing.T) {
		a := post([]byte(`{"version":"4","status":"burning","alerts":[{"labels":"x"}]}`))
		p := wantProblem(t, a, http.StatusUnprocessableEntity, "invalid_params")
		if !strings.Contains(string(a.body), "alerts[0].labels") || !strings.Contains(string(a.body), `"status"`) {
			t.Errorf("invalid_params = %v", p["invalid_params"])
		}
	})
}

func TestStatusReadBySource(t *testing.T) {
	other := batchSource()
	other.Name, other.Secrets = "other", [][]byte{secretOther}
	e := newEnv(t, []webhook.Source{batchSource(), other, alertSource()})
	id := e.want202(e.postHub("batch", secretNew, nativeBody(""), "st-1"))
	path := "/v1/requests/" + id.String()
	signed := []byte("GET " + path)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	cases := []struct {
		name   string
		h      map[string]string
		status int
	}{
		{"standard webhooks", map[string]string{"webhook-id": "rd-1", "webhook-timestamp": ts, "webhook-signature": stdSign(secretOld, "rd-1", ts, signed)}, 200},
		{"hub", map[string]string{"X-Hub-Signature-256": hubSign(secretNew, signed)}, 200},
		{"operator reader", map[string]string{"X-Auth-Token": readToken}, 200},
		{"nothing", nil, 401},
		{"another source's secret", map[string]string{"X-Hub-Signature-256": hubSign(secretOther, signed)}, 401},
		{"signature of another path", map[string]string{"X-Hub-Signature-256": hubSign(secretNew, []byte("GET /v1/requests/x"))}, 401},
		{"another source's token", map[string]string{"Authorization": "Bearer " + amToken}, 401},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := e.do(http.MethodGet, path, nil, c.h)
			if a.status != c.status {
				t.Fatalf("status %d, want %d: %s", a.status, c.status, a.body)
			}
			if c.status == 200 && a.json(t)["id"] != id.String() {
				t.Errorf("body %s", a.body)
			}
		})
	}
	if a := e.do(http.MethodGet, "/v1/requests/"+uuid.NewString(), nil, map[string]string{"X-Auth-Token": readToken}); a.status != 404 {
		t.Errorf("unknown id: %d", a.status)
	}
	// A bearer source reads its own requests with its token.
	a := e.do(http.MethodPost, "/v1/webhooks/alerts", readFixture(t, "current_shape.json"), map[string]string{"Authorization": "Bearer " + amToken})
	aid := e.want202(a)
	if g := e.do(http.MethodGet, "/v1/requests/"+aid.String(), nil, map[string]string{"Authorization": "Bearer " + amToken}); g.status != 200 {
		t.Errorf("bearer source read: %d %s", g.status, g.body)
	}
	e.noSecretsLogged()
}

func TestCancel(t *testing.T) {
	e := newEnv(t, []webhook.Source{batchSource()})
	id := e.want202(e.postHub("batch", secretNew, nativeBody(""), "c-1"))
	path := "/v1/requests/" + id.String() + "/cancel"
	if a := e.do(http.MethodPost, path, nil, map[string]string{"X-Auth-Token": readToken}); a.status != 403 {
		t.Errorf("reader cancel: %d", a.status)
	}
	a := e.do(http.MethodPost, path, nil, map[string]string{"X-Auth-Token": adminToken})
	if a.status != 200 {
		t.Fatalf("cancel: %d %s", a.status, a.body)
	}
	m := a.json(t)
	if m["state"] != "failed" || m["code"] != "cancelled" || m["finished_at"] == nil {
		t.Errorf("cancelled = %s", a.body)
	}
	wantProblem(t, e.do(http.MethodPost, path, nil, map[string]string{"X-Auth-Token": adminToken}), http.StatusConflict, "final_state")
	if n := e.count(`SELECT count(*) FROM audit_log WHERE object_id = $1 AND action = 'transition' AND actor = 'ops'`, id.String()); n != 1 {
		t.Errorf("%d audit rows by ops", n)
	}
}
