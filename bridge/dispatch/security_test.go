package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

type nopResults struct{}

func (nopResults) HandleResult(context.Context, protocol.Result) error { return nil }

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestOwnRefusal: a signature refusal is about the bridge's command only
// when it carries the digest of the body the relay sent — signed and kept
// in the row as jsonb, or unsigned — never for a forgery that borrowed the
// command's id.
func TestOwnRefusal(t *testing.T) {
	ctx := context.Background()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	priv, _, err := protocol.GenerateKey("bridge-a", "")
	testsvc.Must(t, err, "key")
	signer, err := protocol.ParseSigner(priv, "bridge-a")
	testsvc.Must(t, err, "signer")
	x, err := New(Config{URLs: []string{"amqp://127.0.0.1:1/"}}, Deps{Pool: pool, Results: nopResults{}, Registry: prometheus.NewRegistry()})
	testsvc.Must(t, err, "dispatcher")

	// A command whose params jsonb reorders, with characters JSON escapes.
	newCmd := func() (uuid.UUID, []byte) {
		id := uuid.New()
		c := protocol.Command{V: protocol.Version, ID: id.String(), Kind: protocol.AttachVGPU, Host: "h<1>&",
			IssuedAt: time.Now().UTC(), ExpiresAt: time.Now().Add(time.Minute).UTC(),
			Params: json.RawMessage(`{"parent_pci":"0000:3b:00.0","mode":"live","mdev_uuid":"` + uuid.NewString() + `","type_id":"nvidia-232"}`)}
		b, _ := json.Marshal(c)
		_, err := pool.Exec(ctx, `INSERT INTO commands (id, host, kind, body) VALUES ($1, $2, $3, $4)`, id, c.Host, string(c.Kind), string(b))
		testsvc.Must(t, err, "insert command")
		var stored []byte
		testsvc.Must(t, pool.QueryRow(ctx, `SELECT body FROM commands WHERE id = $1`, id).Scan(&stored), "read command")
		return id, stored
	}
	refusal := func(id uuid.UUID, code, sum string) protocol.Result {
		r := protocol.Result{V: protocol.Version, CommandID: id.String(), Host: "h<1>&", Status: protocol.Refused, Code: code}
		if sum != "" {
			r.Details, _ = json.Marshal(map[string]string{"body_sha256": sum})
		}
		return r
	}
	check := func(name string, r protocol.Result, want bool) {
		t.Helper()
		got, err := x.ownRefusal(ctx, r)
		testsvc.Must(t, err, name)
		if got != want {
			t.Errorf("%s: applied = %v, want %v", name, got, want)
		}
	}

	// Signed: what the relay publishes and writes back to the row.
	id, stored := newCmd()
	minor := protocol.Minor
	sent, _, err := outgoing(stored, &minor, signer)
	testsvc.Must(t, err, "sign")
	_, err = pool.Exec(ctx, `UPDATE commands SET sent_at = now(), body = $2::jsonb WHERE id = $1`, id, string(sent))
	testsvc.Must(t, err, "keep signed body")
	check("own refusal of a signed command", refusal(id, protocol.CodeUnknownKey, digest(sent)), true)
	check("key_expired of the same body", refusal(id, protocol.CodeKeyExpired, digest(sent)), true)
	forged := append([]byte(nil), sent...)
	forged[len(forged)-3] ^= 1
	check("refusal of a forgery borrowing the id", refusal(id, protocol.CodeBadSignature, digest(forged)), false)
	check("refusal without a digest", refusal(id, protocol.CodeBadSignature, ""), false)
	check("other refusal codes pass", refusal(id, protocol.CodeWrongHost, ""), true)
	check("unknown command passes", refusal(uuid.New(), protocol.CodeBadSignature, ""), true)

	// Unsigned relay: the stored text went out as it is.
	id2, stored2 := newCmd()
	check("own refusal of an unsigned command", refusal(id2, protocol.CodeBadSignature, digest(stored2)), true)

	if got := counterValue(t, x.m.broken.WithLabelValues("result", ReasonForeignRefusal)); got != 2 {
		t.Errorf("foreign refusals counted: %v, want 2", got)
	}
}

// TestVerified: with a keyring, results and reports verify with their
// host's key; others are dropped by reason, unsigned ones too unless
// signed messages are not required.
func TestVerified(t *testing.T) {
	agentPriv, agentPub, err := protocol.GenerateKey("agent-a", "host-a")
	testsvc.Must(t, err, "key")
	otherPriv, _, err := protocol.GenerateKey("agent-a", "host-a")
	testsvc.Must(t, err, "key")
	ring, err := protocol.ParseKeyring(agentPub)
	testsvc.Must(t, err, "keyring")
	sign := func(priv []byte, host string) []byte {
		r := protocol.Report{V: protocol.Version, Host: host, Node: "n", SentAt: time.Now().UTC(), Seq: 3}
		if priv != nil {
			s, err := protocol.ParseSigner(priv, "agent-a")
			testsvc.Must(t, err, "signer")
			testsvc.Must(t, s.SignReport(&r), "sign")
		}
		b, _ := json.Marshal(r)
		return b
	}
	for _, require := range []bool{true, false} {
		x := &Dispatcher{log: testLog(), m: newMetrics(nil)}
		testsvc.Must(t, x.SetKeys(Keys{Keyring: ring, RequireSigned: require}), "set keys")
		for name, tc := range map[string]struct {
			body   []byte
			ok     bool
			reason string
		}{
			"good":           {sign(agentPriv, "host-a"), true, ""},
			"other key":      {sign(otherPriv, "host-a"), false, protocol.CodeBadSignature},
			"other host":     {sign(agentPriv, "host-b"), false, protocol.CodeUnknownKey},
			"unsigned":       {sign(nil, "host-a"), !require, ReasonUnsigned},
			"not even JSON!": {[]byte("{"), false, protocol.CodeBadSignature},
		} {
			if got := x.verified(protocol.TypeReport, amqp.Delivery{Body: tc.body}); got != tc.ok {
				t.Errorf("require=%v %s: verified = %v, want %v", require, name, got, tc.ok)
			}
			if !tc.ok && counterValue(t, x.m.broken.WithLabelValues("report", tc.reason)) == 0 {
				t.Errorf("require=%v %s: not counted under reason %s", require, name, tc.reason)
			}
		}
		if !require && counterValue(t, x.m.unsigned.WithLabelValues("report")) != 1 {
			t.Error("the accepted unsigned report is not counted")
		}
	}
}

func testLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	testsvc.Must(t, c.Write(&m), "read counter")
	return m.GetCounter().GetValue()
}

// TestKeyringReadAgainOnUnknownKey: a report signed with a key the
// keyring lacks makes the dispatcher read its file again when it changed
// (a host enrolled after the start needs no SIGHUP); a key that is not
// in the file either stays refused, and the file is not read again for
// it within a second; a file that no longer loads leaves the keys in use.
func TestKeyringReadAgainOnUnknownKey(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent-keys.pem")
	_, pubA, err := protocol.GenerateKey("agent-a", "host-a")
	testsvc.Must(t, err, "key")
	privB, pubB, err := protocol.GenerateKey("agent-b", "host-b")
	testsvc.Must(t, err, "key")
	privC, _, err := protocol.GenerateKey("agent-c", "host-c")
	testsvc.Must(t, err, "key")
	testsvc.Must(t, os.WriteFile(file, pubA, 0o644), "write keyring")
	ring, err := protocol.LoadKeyring(file)
	testsvc.Must(t, err, "keyring")
	x := &Dispatcher{log: testLog(), m: newMetrics(nil)}
	testsvc.Must(t, x.SetKeys(Keys{Keyring: ring, KeyringFile: file, RequireSigned: true}), "set keys")
	report := func(priv []byte, id, host string) amqp.Delivery {
		r := protocol.Report{V: protocol.Version, Host: host, Node: "n", SentAt: time.Now().UTC(), Seq: 1}
		s, err := protocol.ParseSigner(priv, id)
		testsvc.Must(t, err, "signer")
		testsvc.Must(t, s.SignReport(&r), "sign")
		b, _ := json.Marshal(r)
		return amqp.Delivery{Body: b}
	}

	if x.verified(protocol.TypeReport, report(privB, "agent-b", "host-b")) {
		t.Fatal("a key in no file verified")
	}
	// Enrolled now: the next report of host-b is read with the new file.
	testsvc.Must(t, os.WriteFile(file, append(append([]byte{}, pubA...), pubB...), 0o644), "enrol host-b")
	x.ring.checked = time.Time{} // the second since the last stat has passed
	if !x.verified(protocol.TypeReport, report(privB, "agent-b", "host-b")) {
		t.Fatal("a report signed with a key enrolled after the start was dropped")
	}
	if x.keys().Keyring.Len() != 2 {
		t.Fatalf("keys in use: %d, want 2", x.keys().Keyring.Len())
	}
	// An unknown key again within the second: no stat, still refused.
	before := x.ring.checked
	if x.verified(protocol.TypeReport, report(privC, "agent-c", "host-c")) || !x.ring.checked.Equal(before) {
		t.Fatal("an unknown key was accepted, or the file was stat'ed again within a second")
	}
	// A broken file keeps the keys in use.
	testsvc.Must(t, os.WriteFile(file, []byte("not PEM at all"), 0o644), "break keyring")
	x.ring.checked = time.Time{}
	if x.verified(protocol.TypeReport, report(privC, "agent-c", "host-c")) {
		t.Fatal("an unknown key was accepted")
	}
	if !x.verified(protocol.TypeReport, report(privB, "agent-b", "host-b")) || x.keys().Keyring.Len() != 2 {
		t.Fatal("a broken keyring file replaced the keys in use")
	}
}
