package secrets

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestSecrets runs one bridge and one agent with every secret configured
// (newWorld): the rotations first, then the check of both daemons' logs
// over the whole run, rotated secrets included.
func TestSecrets(t *testing.T) {
	w := newWorld(t)
	w.addInstances()
	steps := []struct {
		name string
		fn   func(*testing.T, *world)
	}{
		{"rotate webhook secret and API token", rotateWebhookSecretAndAPIToken},
		{"rotate signing keys", rotateSigningKeys},
		{"no secret in logs", noSecretInLogs},
	}
	// Each step runs even after a failed one: the log check covers what
	// a failed step logged too.
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) { s.fn(t, w) })
	}
}

// noSecretInLogs exercises what handles secrets — API calls with good
// and bad tokens, the three webhook schemes, a request carried to the
// agent by a signed command and back by a signed result, signed reports,
// a good and a refused SIGHUP reload — and then looks for every secret
// the run used, in its plain, hex and base64 forms, in every log line of
// both daemons (debug level).
func noSecretInLogs(t *testing.T, w *world) {
	refusedToken := randText("refused-token")
	refusedSecret := []byte(randText("refused-hmac"))
	brokenToken := randText("broken-token")
	w.secrets = append(w.secrets, textSecret("a token the API refused", refusedToken),
		bytesSecret("an HMAC key the webhook refused", refusedSecret),
		textSecret("a token in a token file a reload refused", brokenToken))

	// Operator API: good tokens both ways, a refused one.
	for _, c := range []struct {
		hdr    map[string]string
		status int
	}{
		{map[string]string{"X-Auth-Token": w.adminToken}, http.StatusOK},
		{map[string]string{"Authorization": "Bearer " + w.readerToken}, http.StatusOK},
		{map[string]string{"X-Auth-Token": refusedToken}, http.StatusUnauthorized},
	} {
		if a := w.do(nil, http.MethodGet, "/v1/requests", nil, c.hdr); a.status != c.status {
			t.Errorf("GET /v1/requests: %d %s, want %d", a.status, a.body, c.status)
		}
	}

	// Webhooks: X-Hub-Signature-256 carried to the agent and back.
	a := w.hub(nil, "batch", w.hmacSecret, requestBody(w.vms[0]))
	if a.status != http.StatusAccepted {
		t.Fatalf("webhook batch: %d %s", a.status, a.body)
	}
	if r := w.waitRequest(a.field("request_id"), 90*time.Second); r.field("state") != "succeeded" {
		t.Fatalf("request through the agent: %s", r.body)
	}
	if a := w.hub(nil, "batch", refusedSecret, requestBody(w.vms[1])); a.status != http.StatusUnauthorized {
		t.Errorf("webhook with a wrong key: %d", a.status)
	}
	// Standard Webhooks with the whsec_ secret.
	body := []byte(`{"type":"GPU_LOAD","vm_id":"` + w.vms[1] + `","workload":"vdi","metrics":{"gpu_util":0.5}}`)
	id, ts := "msg_"+uuid.NewString(), strconv.FormatInt(time.Now().Unix(), 10)
	if a := w.do(nil, http.MethodPost, "/v1/webhooks/std", body, map[string]string{webhook.HeaderWebhookID: id,
		webhook.HeaderWebhookTimestamp: ts, webhook.HeaderWebhookSignature: webhook.StandardSignature(id, ts, body, w.whsec)}); a.status != http.StatusAccepted {
		t.Errorf("webhook std: %d %s", a.status, a.body)
	}
	// Bearer, Alertmanager format; and a refused bearer token.
	alert, _ := json.Marshal(map[string]any{"version": "4", "status": "firing", "receiver": "vgpu", "alerts": []map[string]any{{
		"status": "firing", "labels": map[string]string{"alertname": "GPUBusy", "instance_uuid": w.vms[2]},
		"startsAt": time.Now().UTC().Format(time.RFC3339)}}})
	if a := w.do(nil, http.MethodPost, "/v1/webhooks/alerts", alert, map[string]string{"Authorization": "Bearer " + w.bearer}); a.status != http.StatusAccepted {
		t.Errorf("webhook alerts: %d %s", a.status, a.body)
	}
	if a := w.do(nil, http.MethodPost, "/v1/webhooks/alerts", alert, map[string]string{"Authorization": "Bearer " + refusedToken}); a.status != http.StatusUnauthorized {
		t.Errorf("webhook alerts with a wrong token: %d", a.status)
	}

	// A reload that works, one that is refused (a token file with a bad
	// line), and the agent's reload: all on SIGHUP.
	w.sighup(t, reloadedOK, agentReloaded)
	w.writeFile("api-tokens", w.adminToken+" admin ops\n"+brokenToken+" superuser\n")
	w.sighup(t, reloadRefused, agentReloaded)
	w.writeFile("api-tokens", w.adminToken+" admin ops\n"+w.readerToken+" reader viewer\n")

	// What was logged: at debug level, from both daemons.
	for _, l := range []struct {
		name string
		buf  *logBuffer
		want []string
	}{
		{"bridge", w.bridgeLog, []string{`"level":"DEBUG"`, `"msg":"http request"`, reloadedOK, reloadRefused}},
		{"agent", w.agentLog, []string{`"level":"DEBUG"`, agentReloaded}},
	} {
		lines := l.buf.Lines()
		for _, want := range l.want {
			if !l.buf.Contains(want) {
				t.Errorf("the %s log (%d lines) has no %s: the run did not log what it should", l.name, len(lines), want)
			}
		}
		leaks := 0
		for n, line := range lines {
			for _, s := range w.secrets {
				for _, f := range s.forms {
					if strings.Contains(line, f) {
						leaks++
						t.Errorf("%s log line %d holds the %s: %s", l.name, n+1, s.name, strings.ReplaceAll(line, f, "<SECRET>"))
					}
				}
			}
		}
		t.Logf("%s log: %d lines, %d secrets × forms checked, %d leaks", l.name, len(lines), len(w.secrets), leaks)
	}
}

// Log messages of reloads.
const (
	reloadedOK     = `"msg":"secrets reloaded`
	reloadRefused  = `"msg":"reload refused`
	agentReloaded  = `"msg":"keys reloaded"`
	agentRefused   = `"msg":"key reload failed`
	signalDeadline = 20 * time.Second
)

// sighup sends SIGHUP to the test process (both daemons listen) and
// waits for the bridge and the agent to log one more of the messages.
func (w *world) sighup(t *testing.T, bridgeMsg, agentMsg string) {
	t.Helper()
	nb, na := w.bridgeLog.Count(bridgeMsg), w.agentLog.Count(agentMsg)
	testsvc.Must(t, sendHUP(), "SIGHUP")
	w.eventually(signalDeadline, "bridge logs "+bridgeMsg, func() bool { return w.bridgeLog.Count(bridgeMsg) > nb })
	w.eventually(signalDeadline, "agent logs "+agentMsg, func() bool { return w.agentLog.Count(agentMsg) > na })
}
