package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
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

// amAlert is an alert as Alertmanager's webhook sends it.
type amAlert struct {
	Status      string            `json:"status"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations,omitempty"`
	StartsAt    time.Time         `json:"startsAt"`
	EndsAt      time.Time         `json:"endsAt"`
	Fingerprint string            `json:"fingerprint,omitempty"`
}

func amBody(alerts ...amAlert) []byte {
	status := "resolved"
	for _, a := range alerts {
		if a.Status == "firing" {
			status = "firing"
		}
	}
	b, _ := json.Marshal(map[string]any{"version": "4", "groupKey": `{}:{alertname="GPUBusy"}`, "status": status, "receiver": "bridge",
		"groupLabels": map[string]string{"alertname": "GPUBusy"}, "alerts": alerts})
	return b
}

// alertEvents are the metrics of the events stored for a request, by
// fingerprint (nil metrics: none).
func (e *env) alertEvents(id uuid.UUID) map[string]map[string]any {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT payload FROM events WHERE request_id = $1`, id.String())
	testsvc.Must(e.t, err, "events")
	defer rows.Close()
	out := map[string]map[string]any{}
	for rows.Next() {
		var p json.RawMessage
		testsvc.Must(e.t, rows.Scan(&p), "scan")
		var ev webhook.EventPayload
		testsvc.Must(e.t, json.Unmarshal(p, &ev), "payload")
		out[ev.Alert.Fingerprint] = ev.Metrics
	}
	return out
}

// TestAlertmanagerMetricsAndRepeats: numeric labels and annotations of a
// firing alert become metrics (renamed as alert_metrics says), a resolved
// one carries none; an alert sent again (a retry, a repeat_interval
// re-notification, or its group re-sent because another alert joined)
// acts once.
func TestAlertmanagerMetricsAndRepeats(t *testing.T) {
	src := alertSource()
	src.AlertMetrics = map[string]string{"value": "gpu_util"}
	e := newEnv(t, []webhook.Source{src})
	post := func(body []byte) answer {
		return e.do(http.MethodPost, "/v1/webhooks/alerts", body, map[string]string{"Authorization": "Bearer " + amToken})
	}
	vm2 := uuid.NewString()
	start := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	busy := amAlert{Status: "firing", Labels: map[string]string{"alertname": "GPUBusy", "instance_uuid": vmID, "value": "97.5", "gpu": "0"},
		Annotations: map[string]string{"fb_used_mib": "15000", "summary": "busy for 10m", "gpu_util": "not a number"}, StartsAt: start, Fingerprint: "fp-busy"}
	idle := amAlert{Status: "resolved", Labels: map[string]string{"alertname": "GPUBusy", "instance_uuid": vm2},
		Annotations: map[string]string{"gpu_util": "4"}, StartsAt: start, EndsAt: start.Add(time.Hour), Fingerprint: "fp-idle"}

	first := e.want202(post(amBody(busy, idle)))
	got := e.alertEvents(first)
	if m := got["fp-busy"]; len(m) != 3 || m["gpu_util"] != 97.5 || m["fb_used_mib"] != 15000.0 || m["gpu"] != 0.0 {
		t.Errorf("firing alert's metrics %v, want gpu_util 97.5 (label value renamed), fb_used_mib 15000, gpu 0", m)
	}
	if m, ok := got["fp-idle"]; !ok || m != nil {
		t.Errorf("resolved alert: stored %v, metrics %v; want stored without metrics", ok, m)
	}

	// Alertmanager's retry (or repeat) of the same notification: nothing acts.
	a := post(amBody(busy, idle))
	again := e.want202(a)
	if n := len(e.alertEvents(again)); n != 0 {
		t.Errorf("the repeat stored %d events, want none", n)
	}
	r, err := e.store.Get(context.Background(), again)
	testsvc.Must(t, err, "get")
	if r.State != "rejected" || r.Code != webhook.CodeRepeatedAlerts {
		t.Errorf("repeat request: %s %s %q", r.State, r.Code, r.Reason)
	}
	sk := a.json(t)["skipped"].([]any)
	if len(sk) != 2 || !strings.Contains(sk[0].(map[string]any)["reason"].(string), "by request "+first.String()) {
		t.Errorf("skipped %v, want both alerts naming request %s", sk, first)
	}

	// The group again with one new alert (another VM got busy): only the
	// new one acts. The busy alert firing again later (a new start) acts.
	vm3 := uuid.NewString()
	joined := amAlert{Status: "firing", Labels: map[string]string{"alertname": "GPUBusy", "instance_uuid": vm3, "value": "91"},
		StartsAt: start.Add(5 * time.Minute), Fingerprint: "fp-joined"}
	busyAgain := busy
	busyAgain.StartsAt = start.Add(2 * time.Hour)
	third := e.want202(post(amBody(busy, idle, joined, busyAgain)))
	got = e.alertEvents(third)
	if len(got) != 2 || got["fp-joined"]["gpu_util"] != 91.0 || got["fp-busy"]["gpu_util"] != 97.5 {
		t.Errorf("events of the grown group %v, want the new alert and the busy alert's new firing", got)
	}
}

// TestAlertmanagerLargeGroupFitsDefault: a group of 150 alerts (about
// 120 KB) fits the default body limit of an Alertmanager source read
// from the configuration; a native source keeps 64 KiB.
func TestAlertmanagerLargeGroupFitsDefault(t *testing.T) {
	srcs := sourcesFromConfig(t, "")
	e := newEnv(t, srcs)
	var alerts []amAlert
	for i := range 150 {
		alerts = append(alerts, amAlert{Status: "firing", StartsAt: time.Now().UTC(), Fingerprint: fmt.Sprintf("fp%04d", i),
			Labels: map[string]string{"alertname": "GPUBusy", "instance_uuid": uuid.NewString(), "severity": "warning",
				"job": "dcgm-exporter", "instance": fmt.Sprintf("compute-%03d.example.org:9400", i), "gpu": "0", "modelName": "Tesla T4"},
			Annotations: map[string]string{"gpu_util": "96", "summary": "GPU utilisation above 90 % for 10 minutes on a vGPU host",
				"description": strings.Repeat("The vGPU's SM utilisation stayed high; a bigger profile would help. ", 6),
				"runbook_url": "https://wiki.example.org/runbooks/gpu-busy"}})
	}
	body := amBody(alerts...)
	if len(body) < 100_000 {
		t.Fatalf("the group is %d bytes, want a realistic >100 KB", len(body))
	}
	id := e.want202(e.do(http.MethodPost, "/v1/webhooks/alerts", body, map[string]string{"Authorization": "Bearer " + amToken}))
	if n := len(e.alertEvents(id)); n != 150 {
		t.Errorf("%d events of the %d-byte group, want 150", n, len(body))
	}
	if srcs[1].MaxBodyBytes != 64<<10 {
		t.Errorf("native source's default body limit %d, want 65536", srcs[1].MaxBodyBytes)
	}
}

// sourcesFromConfig loads an Alertmanager source "alerts" (bearer
// amToken) and a native one "batch" from a configuration file with extra
// lines in the alerts section.
func sourcesFromConfig(t *testing.T, extra string) []webhook.Source {
	t.Helper()
	dir := t.TempDir()
	tok := writeSecret(t, dir, "am.token", amToken)
	sec := writeSecret(t, dir, "batch.secret", string(secretNew))
	ini := filepath.Join(dir, "bridge.conf")
	testsvc.Must(t, os.WriteFile(ini, []byte("[webhook_source:alerts]\nauth = bearer\nformat = alertmanager\ntoken_files = "+tok+
		"\nrate = 1000\nburst = 1000\n"+extra+"\n[webhook_source:batch]\nauth = hmac\nsecret_files = "+sec+"\n"), 0o600), "write conf")
	v, err := bridge.LoadConfig(conf.Source{File: ini, Overrides: append([]string{
		"DEFAULT.transport_url=rabbit://guest:guest@127.0.0.1:5672/", "database.connection=postgres://x@127.0.0.1/x",
		"api.auth_strategy=noauth"}, testkeys.For(t).Bridge()...)})
	testsvc.Must(t, err, "load config")
	srcs, err := bridge.WebhookSources(v)
	testsvc.Must(t, err, "sources")
	if len(srcs) != 2 || srcs[0].Name != "alerts" {
		t.Fatalf("sources %+v", srcs)
	}
	return srcs
}

// TestRealAlertmanager: Debian's prometheus-alertmanager, on a loopback
// port with its own configuration and storage, sends to the bridge: a
// group of 150 alerts posted to its v2 API arrives whole, each alert
// acts once though Alertmanager repeats the group every 2 s, and the
// alerts' annotations are the policy's metrics; resolving them sends a
// resolved group whose alerts act once more, without metrics.
func TestRealAlertmanager(t *testing.T) {
	bin := testsvc.AlertmanagerBinary(t)
	e := newEnv(t, sourcesFromConfig(t, "alert_metrics = value:gpu_util"))
	am := testsvc.StartAlertmanager(t, bin, e.url+"/v1/webhooks/alerts", amToken)

	const n = 150
	var posted []map[string]any
	vms := map[string]bool{}
	for i := range n {
		vm := uuid.NewString()
		vms[vm] = true
		posted = append(posted, map[string]any{
			"labels": map[string]string{"alertname": "GPUBusy", "instance_uuid": vm, "severity": "warning",
				"instance": fmt.Sprintf("compute-%03d.example.org:9400", i)},
			"annotations": map[string]string{"value": "95", "summary": "GPU utilisation above 90 % for 10 minutes",
				"description": strings.Repeat("The vGPU's SM utilisation stayed high. ", 10)}})
	}
	am.Post(t, posted)

	// Every alert acts once, however often the group is sent.
	deadline := time.Now().Add(90 * time.Second)
	for {
		var alerts, notifications int
		testsvc.Must(t, e.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM events WHERE source = 'webhook:alerts'),
			(SELECT count(*) FROM requests WHERE source = 'webhook:alerts')`).Scan(&alerts, &notifications), "count")
		if alerts == n && notifications >= 3 { // the group, then at least two repeats
			break
		}
		if alerts > n {
			t.Fatalf("%d events for %d alerts: a repeat acted", alerts, n)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90s: %d events from %d notifications, want %d events and at least 3 notifications", alerts, notifications, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	rows, err := e.pool.Query(context.Background(), `SELECT instance_uuid::text, payload FROM events WHERE source = 'webhook:alerts'`)
	testsvc.Must(t, err, "events")
	seen := map[string]bool{}
	for rows.Next() {
		var vm string
		var p json.RawMessage
		testsvc.Must(t, rows.Scan(&vm, &p), "scan")
		var ev webhook.EventPayload
		testsvc.Must(t, json.Unmarshal(p, &ev), "payload")
		if !vms[vm] || seen[vm] || ev.Metrics["gpu_util"] != 95.0 || ev.Alert.Status != "firing" {
			t.Errorf("event of %s (seen before %v): metrics %v, status %s", vm, seen[vm], ev.Metrics, ev.Alert.Status)
		}
		seen[vm] = true
	}
	rows.Close()
	var repeats int
	testsvc.Must(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM requests WHERE source = 'webhook:alerts' AND code = $1`,
		webhook.CodeRepeatedAlerts).Scan(&repeats), "repeats")
	if repeats < 2 {
		t.Errorf("%d notifications recorded as repeats, want at least 2", repeats)
	}

	// Resolved: each alert acts once more, with no metrics.
	for _, a := range posted {
		a["endsAt"] = time.Now().UTC().Add(-time.Second).Format(time.RFC3339Nano)
	}
	am.Post(t, posted)
	deadline = time.Now().Add(90 * time.Second)
	for {
		var resolved, withMetrics int
		testsvc.Must(t, e.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE payload::jsonb ? 'metrics') FROM events
			WHERE source = 'webhook:alerts' AND payload->'alert'->>'status' = 'resolved'`).Scan(&resolved, &withMetrics), "count")
		if resolved == n {
			if withMetrics != 0 {
				t.Errorf("%d resolved alerts carry metrics", withMetrics)
			}
			break
		}
		if resolved > n || time.Now().After(deadline) {
			t.Fatalf("%d resolved events, want %d", resolved, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
