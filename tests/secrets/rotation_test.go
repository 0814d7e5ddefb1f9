package secrets

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// keepAlive is an HTTP client on one kept-alive connection that counts
// its dials: a listener restarted by a reload would cost a new dial.
func keepAlive() (*http.Client, *atomic.Int64) {
	var dials atomic.Int64
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, IdleConnTimeout: time.Minute,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return d.DialContext(ctx, network, addr)
		}}
	return &http.Client{Timeout: 15 * time.Second, Transport: tr}, &dials
}

// rotateWebhookSecretAndAPIToken: new contents in the secret and token
// files, SIGHUP; the old secret and token are refused, the new ones
// accepted, on the same listener and the same kept-alive connection. A
// broken new file is refused by the reload and the secrets in use stay.
func rotateWebhookSecretAndAPIToken(t *testing.T, w *world) {
	c, dials := keepAlive()
	addr := w.d.API.Addr()
	oldAdmin, oldSecret := w.adminToken, w.hmacSecret
	get := func(token string) int {
		return w.do(c, http.MethodGet, "/v1/requests", nil, map[string]string{"X-Auth-Token": token}).status
	}
	post := func(key []byte) answer { return w.hub(c, "batch", key, requestBody(uuid.NewString())) }
	if s := get(oldAdmin); s != http.StatusOK {
		t.Fatalf("admin token before the rotation: %d", s)
	}
	if a := post(oldSecret); a.status != http.StatusAccepted {
		t.Fatalf("webhook secret before the rotation: %d %s", a.status, a.body)
	}

	newAdmin, newSecret := randText("admin-token-2"), []byte(randText("hmac-2"))
	w.secrets = append(w.secrets, textSecret("rotated-in API admin token", newAdmin), bytesSecret("rotated-in HMAC secret", newSecret))
	w.writeFile("api-tokens", newAdmin+" admin ops\n"+w.readerToken+" reader viewer\n")
	w.writeFile("batch.secret", string(newSecret)+"\n")
	w.sighup(t, reloadedOK, agentReloaded)

	if s := get(oldAdmin); s != http.StatusUnauthorized {
		t.Errorf("old admin token after the rotation: %d, want 401", s)
	}
	if s := get(newAdmin); s != http.StatusOK {
		t.Errorf("new admin token after the rotation: %d, want 200", s)
	}
	if a := post(oldSecret); a.status != http.StatusUnauthorized || a.field("code") != "bad_signature" {
		t.Errorf("old webhook secret after the rotation: %d %s, want 401 bad_signature", a.status, a.body)
	}
	if a := post(newSecret); a.status != http.StatusAccepted {
		t.Errorf("new webhook secret after the rotation: %d %s, want 202", a.status, a.body)
	}

	// A bad new file: a secret too short, a token line without a role.
	broken := randText("admin-token-3")
	w.secrets = append(w.secrets, textSecret("a token of a token file a reload refused", broken))
	w.writeFile("batch.secret", "short\n")
	w.writeFile("api-tokens", broken+"\n")
	w.sighup(t, reloadRefused, agentReloaded)
	if s := get(newAdmin); s != http.StatusOK {
		t.Errorf("after a refused reload the token in use: %d, want 200", s)
	}
	if a := post(newSecret); a.status != http.StatusAccepted {
		t.Errorf("after a refused reload the secret in use: %d %s, want 202", a.status, a.body)
	}
	line := w.bridgeLog.Last(reloadRefused)
	for _, want := range []string{"token_file", "secret_files", "at least 16 characters"} {
		if !strings.Contains(line, want) {
			t.Errorf("the refused reload's log line does not say %q: %s", want, line)
		}
	}
	if failed := w.metric("vgpu_bridge_reloads_total", `outcome="failed"`); failed < 1 {
		t.Errorf("vgpu_bridge_reloads_total{outcome=failed} = %v", failed)
	}

	// No listener restart: same address, and every request rode the
	// connection of the first one.
	if w.d.API.Addr() != addr {
		t.Errorf("API address %s after the reloads, was %s", w.d.API.Addr(), addr)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("the client dialled %d times; want 1 (one kept-alive connection across the reloads)", n)
	}
	// Good files again, for what follows.
	w.adminToken, w.hmacSecret = newAdmin, newSecret
	w.writeFile("api-tokens", newAdmin+" admin ops\n"+w.readerToken+" reader viewer\n")
	w.writeFile("batch.secret", string(newSecret)+"\n")
	w.sighup(t, reloadedOK, agentReloaded)
}

// rotateSigningKeys: the bridge's command key and the agent's result key
// are rotated while both run, by SIGHUP only. Commands signed with the
// new bridge key are executed by the agent; results signed with the
// agent's new key are accepted by the bridge; once the old bridge key's
// grace period is over, a command signed with it is refused.
func rotateSigningKeys(t *testing.T, w *world) {
	request := func(vm string) string {
		t.Helper()
		a := w.hub(nil, "batch", w.hmacSecret, requestBody(vm))
		if a.status != http.StatusAccepted {
			t.Fatalf("webhook: %d %s", a.status, a.body)
		}
		id := a.field("request_id")
		if r := w.waitRequest(id, 90*time.Second); r.field("state") != "succeeded" {
			t.Fatalf("request %s: %s", id, r.body)
		}
		return id
	}
	keyIDs := func(reqID string) map[string]int {
		rows, err := w.d.Pool.Query(w.ctx, `SELECT body->>'key_id' FROM commands WHERE request_id = $1`, reqID)
		testsvc.Must(t, err, "commands")
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var k string
			testsvc.Must(t, rows.Scan(&k), "scan")
			out[k]++
		}
		return out
	}
	if got := keyIDs(request(w.vms[3])); got["bridge-a"] == 0 || len(got) != 1 {
		t.Fatalf("commands before the rotation signed with %v, want bridge-a", got)
	}

	// 1. The agent trusts the new bridge key, and the old one for a few
	// seconds more; the bridge trusts the agent's new key, and its old
	// one until then.
	graceEnd := time.Now().Add(4 * time.Second).Truncate(time.Second)
	bridgeBKey, bridgeB := keyFiles(t, w.path("bridge-b.key"), map[string]string{"Key-Id": "bridge-b"})
	agentBKey, agentB := keyFiles(t, w.path("agent-b.key"), map[string]string{"Key-Id": "agent-b", "Host": w.host})
	w.secrets = append(w.secrets, keySecret("rotated-in bridge signing key", bridgeBKey), keySecret("rotated-in agent signing key", agentBKey))
	w.writeFile("bridge-keys.pem", bridgeB+w.publicBlock(w.bridgeKey, map[string]string{"Key-Id": "bridge-a",
		"Not-After": graceEnd.UTC().Format(time.RFC3339)}))
	w.writeFile("agent-keys.pem", agentB+w.publicBlock(w.agentKey, map[string]string{"Key-Id": "agent-a", "Host": w.host,
		"Not-After": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}))
	w.sighup(t, reloadedOK, agentReloaded)
	// 2. Both sign with their new keys: new key file and key_id in the
	// configuration, SIGHUP.
	w.writeConf("bridge-b", "bridge-b.key")
	ov := append([]string{}, *w.agentOverrides.Load()...)
	for i, o := range ov {
		switch {
		case strings.HasPrefix(o, "security.signing_key_file="):
			ov[i] = "security.signing_key_file=" + w.path("agent-b.key")
		case strings.HasPrefix(o, "security.key_id="):
			ov[i] = "security.key_id=agent-b"
		}
	}
	w.agentOverrides.Store(&ov)
	w.sighup(t, reloadedOK, agentReloaded)
	if l := w.bridgeLog.Last(reloadedOK); !strings.Contains(l, `"key_id":"bridge-b"`) {
		t.Errorf("the bridge's reload line does not name the new key: %s", l)
	}
	if l := w.agentLog.Last(agentReloaded); !strings.Contains(l, `"key_id":"agent-b"`) || !strings.Contains(l, "bridge-b") {
		t.Errorf("the agent's reload line does not name the new keys: %s", l)
	}

	// 3. A request after the rotation: new bridge key on the commands,
	// the agent's results under its new key accepted.
	if got := keyIDs(request(w.vms[1])); got["bridge-b"] == 0 || len(got) != 1 {
		t.Errorf("commands after the rotation signed with %v, want bridge-b", got)
	}
	var reportKey string
	w.eventually(20*time.Second, "a report signed with agent-b", func() bool {
		err := w.d.Pool.QueryRow(w.ctx, `SELECT coalesce(report->>'key_id','') FROM hosts WHERE name = $1`, w.host).Scan(&reportKey)
		return err == nil && reportKey == "agent-b"
	})

	// 4. After the grace period a command signed with the old key is
	// refused (key_expired) and not executed.
	time.Sleep(time.Until(graceEnd) + time.Second)
	old, err := protocol.NewSigner("bridge-a", w.bridgeKey)
	testsvc.Must(t, err, "old signer")
	cmd := protocol.Command{V: 1, ID: uuid.NewString(), Kind: protocol.VerifyVGPU, Host: w.host, InstanceUUID: w.vms[2],
		IssuedAt: time.Now().UTC(), ExpiresAt: time.Now().UTC().Add(2 * time.Minute)}
	testsvc.Must(t, cmd.MarshalParams(protocol.VerifyParams{}), "params")
	testsvc.Must(t, old.SignCommand(&cmd), "sign")
	body, _ := json.Marshal(cmd)
	conn, err := amqp.Dial(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, ch.PublishWithContext(w.ctx, protocol.Exchange, protocol.CommandRoutingKey(w.host), false, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body}), "publish")
	w.eventually(20*time.Second, "the agent refuses the old key's command", func() bool {
		l := w.agentLog.Last(cmd.ID)
		return strings.Contains(l, protocol.CodeKeyExpired)
	})
	// The new key still works after the grace period.
	if got := keyIDs(request(w.vms[2])); got["bridge-b"] == 0 || len(got) != 1 {
		t.Errorf("commands after the grace period signed with %v, want bridge-b", got)
	}
}
