package pipeline_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// keyPair writes an Ed25519 private key (PEM PKCS#8, mode 0600) and its
// keyring entry (PEM PKIX with headers) the way an operator's openssl
// commands would, and returns the private key.
func keyPair(t *testing.T, dir, name string, headers map[string]string) (priv ed25519.PrivateKey, keyFile, pubBlock string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	testsvc.Must(t, err, "generate key")
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	testsvc.Must(t, err, "marshal private key")
	keyFile = filepath.Join(dir, name+".key")
	testsvc.Must(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600), "write key")
	pder, err := x509.MarshalPKIXPublicKey(pub)
	testsvc.Must(t, err, "marshal public key")
	return priv, keyFile, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Headers: headers, Bytes: pder}))
}

// TestSignedCommandsAndForgedReports: the bridge signs its commands
// ([security] of the bridge, read by bridge.SecurityConfig), an agent
// that requires signed commands executes the direct attach, and reports
// for the agent's host that are forged (another key under the agent's
// key id, an unknown key, no signature) are dropped and counted without
// touching the hosts table.
func TestSignedCommandsAndForgedReports(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	dir := t.TempDir()
	_, bridgeKey, bridgePub := keyPair(t, dir, "bridge", map[string]string{"Key-Id": "bridge-test"})
	_, agentKey, agentPub := keyPair(t, dir, "agent", map[string]string{"Key-Id": "agent-test", "Host": w.host})
	forgerPriv, _, _ := keyPair(t, dir, "forger", nil)
	bridgeKeys, agentKeys := filepath.Join(dir, "bridge-keys.pem"), filepath.Join(dir, "agent-keys.pem")
	testsvc.Must(t, os.WriteFile(bridgeKeys, []byte(bridgePub), 0o644), "bridge keyring")
	testsvc.Must(t, os.WriteFile(agentKeys, []byte(agentPub), 0o644), "agent keyring")

	w.startAgent("security.bridge_keys_file="+bridgeKeys, "security.require_signed_commands=true",
		"security.signing_key_file="+agentKey, "security.key_id=agent-test")
	bv, err := bridge.LoadConfig(conf.Source{Overrides: []string{"security.signing_key_file=" + bridgeKey,
		"security.key_id=bridge-test", "security.agent_keys_file=" + agentKeys,
		"DEFAULT.transport_url=" + testsvc.TransportURL(t), "database.connection=" + w.dbURL, "api.auth_strategy=noauth"}})
	testsvc.Must(t, err, "bridge config")
	reg := prometheus.NewRegistry()
	w.startBridge(replicaOpts{name: "r1", registry: reg, dispatch: func(c *dispatch.Config) {
		testsvc.Must(t, bridge.SecurityConfig(bv, c, nil), "bridge [security]")
		if c.Signer == nil || c.Keyring == nil || !c.RequireSigned {
			t.Fatalf("[security] mapped to signer %v, keyring %v, require %v", c.Signer, c.Keyring, c.RequireSigned)
		}
	}})

	inst := w.domains[3].UUID
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q", "count": 1})
	r := w.wait(id, 60*time.Second)
	if r.State != requests.Succeeded {
		t.Fatalf("request %s: %s (%s: %s)", id, r.State, r.Code, r.Reason)
	}
	// The outbox rows keep the signed commands that went out.
	rows, err := w.pool.Query(w.ctx, `SELECT body FROM commands WHERE request_id = $1`, id)
	testsvc.Must(t, err, "commands")
	n := 0
	for rows.Next() {
		var c protocol.Command
		testsvc.Must(t, rows.Scan(&c), "scan command")
		if c.KeyID != "bridge-test" || c.Sig == "" {
			t.Errorf("command %s kept with key_id %q, sig %q", c.ID, c.KeyID, c.Sig)
		}
		n++
	}
	rows.Close()
	if n == 0 {
		t.Fatal("no commands")
	}

	// The agent's signed reports are kept.
	var node string
	for deadline := time.Now().Add(20 * time.Second); ; {
		err := w.pool.QueryRow(w.ctx, `SELECT node FROM hosts WHERE name = $1`, w.host).Scan(&node)
		if err == nil && node == w.node {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's signed report was not kept: hosts.node = %q (%v), want %q", node, err, w.node)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Forgeries, each claiming the host moved to another Placement node.
	forged := func(keyID string, key ed25519.PrivateKey) []byte {
		rep := protocol.Report{V: protocol.Version, Host: w.host, Node: "forged.nodes.test", AgentVersion: "forged",
			SentAt: time.Now().UTC(), Seq: 1, GPUs: []protocol.GPU{}}
		if key != nil {
			s, err := protocol.NewSigner(keyID, key)
			testsvc.Must(t, err, "signer")
			testsvc.Must(t, s.SignReport(&rep), "sign report")
		}
		b, err := json.Marshal(rep)
		testsvc.Must(t, err, "marshal report")
		return b
	}
	conn, err := amqp.Dial(w.amqpURL)
	testsvc.Must(t, err, "dial")
	defer conn.Close()
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	for _, body := range [][]byte{forged("agent-test", forgerPriv), forged("forger", forgerPriv), forged("", nil)} {
		testsvc.Must(t, ch.PublishWithContext(w.ctx, protocol.Exchange, protocol.ReportRoutingKey(w.host), false, false,
			amqp.Publishing{ContentType: "application/json", Body: body}), "publish forged report")
	}
	want := map[string]float64{protocol.CodeBadSignature: 1, protocol.CodeUnknownKey: 1, dispatch.ReasonUnsigned: 1}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := dropped(t, reg, "report")
		if got[protocol.CodeBadSignature] == 1 && got[protocol.CodeUnknownKey] == 1 && got[dispatch.ReasonUnsigned] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dropped reports by reason = %v, want %v", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var agentVersion string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT node, agent_version FROM hosts WHERE name = $1`, w.host).Scan(&node, &agentVersion), "host row")
	if node != w.node || agentVersion == "forged" {
		t.Errorf("after the forgeries hosts has node %q, agent_version %q; want %q and the agent's", node, agentVersion, w.node)
	}
}

// dropped returns vgpu_bridge_dispatch_invalid_messages_total of type by reason.
func dropped(t *testing.T, g prometheus.Gatherer, typ string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	testsvc.Must(t, err, "gather")
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "vgpu_bridge_dispatch_invalid_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["type"] == typ {
				out[labels["reason"]] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}
