// Package agentsecurity_test runs a real vgpu-agent (fake host) against the
// real RabbitMQ and shows that it executes only commands signed by a key it
// trusts, for its host, not expired and not executed before; that every
// refusal says why; that results and reports come back signed with the
// host's key; that a rotated-out key is refused after its grace period and
// that SIGHUP reloads the keys without a restart.
package agentsecurity_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/transport"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const (
	gpuFree   = "0000:d8:00.0" // a fake T4 with no mdev
	t4q       = "nvidia-232"
	runningVM = "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01"
)

// keys are a test's key material: the bridge's signing keys (by id) and
// the host's agent key.
type keys struct {
	t        *testing.T
	dir      string
	host     string
	bridge   map[string]*protocol.Signer
	agent    *protocol.Signer
	agentPEM []byte
	ring     *protocol.Keyring // the bridge's view: the agent's key
}

func newKeys(t *testing.T, host string, bridgeIDs ...string) *keys {
	t.Helper()
	k := &keys{t: t, dir: t.TempDir(), host: host, bridge: map[string]*protocol.Signer{}}
	for _, id := range bridgeIDs {
		k.bridge[id] = newSigner(t, id)
	}
	priv, pub, err := protocol.GenerateKey(host+"-2025a", host)
	testsvc.Must(t, err, "agent key")
	k.agentPEM = priv
	testsvc.Must(t, os.WriteFile(k.path("agent.key"), priv, 0o600), "write agent key")
	k.agent, err = protocol.LoadSigner(k.path("agent.key"), host+"-2025a")
	testsvc.Must(t, err, "load agent key")
	k.ring, err = protocol.ParseKeyring(pub)
	testsvc.Must(t, err, "agent keyring")
	return k
}

func newSigner(t *testing.T, id string) *protocol.Signer {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	testsvc.Must(t, err, "key")
	s, err := protocol.NewSigner(id, priv)
	testsvc.Must(t, err, "signer")
	return s
}

func (k *keys) path(name string) string { return filepath.Join(k.dir, name) }

// writeRing writes the agent's bridge_keys_file: the bridge keys ids, each
// with its Not-After (zero: none).
func (k *keys) writeRing(notAfter map[string]time.Time, ids ...string) {
	k.t.Helper()
	var b bytes.Buffer
	for _, id := range ids {
		pem, err := protocol.MarshalTrustedKey(protocol.TrustedKey{ID: id, Key: k.bridge[id].PublicKey(), NotAfter: notAfter[id]})
		testsvc.Must(k.t, err, "marshal key")
		b.Write(pem)
	}
	tmp := k.path("bridge-keys.pem.tmp")
	testsvc.Must(k.t, os.WriteFile(tmp, b.Bytes(), 0o644), "write keyring")
	testsvc.Must(k.t, os.Rename(tmp, k.path("bridge-keys.pem")), "install keyring")
}

// bridge is the test's side of RabbitMQ for one host.
type bridge struct {
	t       *testing.T
	host    string
	ch      *amqp.Channel
	results <-chan amqp.Delivery
	reports <-chan amqp.Delivery
	seq     atomic.Int64
}

func newBridge(t *testing.T, host string) *bridge {
	t.Helper()
	conn, err := amqp.Dial(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "dial")
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, transport.Declare(ch, host), "declare")
	t.Cleanup(func() {
		if c, err := conn.Channel(); err == nil {
			c.QueueDelete(protocol.AgentQueue(host), false, false, false)
		}
	})
	b := &bridge{t: t, host: host, ch: ch}
	for key, dst := range map[string]*<-chan amqp.Delivery{protocol.ResultRoutingKey(host): &b.results, protocol.ReportRoutingKey(host): &b.reports} {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		testsvc.Must(t, err, "declare test queue")
		testsvc.Must(t, ch.QueueBind(q.Name, key, protocol.Exchange, false, nil), "bind")
		d, err := ch.Consume(q.Name, "", true, true, false, false, nil)
		testsvc.Must(t, err, "consume")
		*dst = d
	}
	return b
}

// command returns a command for the host with a fresh id.
func (b *bridge) command(k protocol.Kind, instance string, params any) protocol.Command {
	c := protocol.Command{V: 1, ID: fmt.Sprintf("%s-%d", b.host, b.seq.Add(1)), Kind: k, Host: b.host,
		InstanceUUID: instance, IssuedAt: time.Now().UTC(), ExpiresAt: time.Now().UTC().Add(2 * time.Minute)}
	testsvc.Must(b.t, c.MarshalParams(params), "params")
	return c
}

// verify is a harmless command: any answer but a refusal means it ran.
func (b *bridge) verify() protocol.Command {
	return b.command(protocol.VerifyVGPU, runningVM, protocol.VerifyParams{})
}

func (b *bridge) sign(s *protocol.Signer, c protocol.Command) protocol.Command {
	testsvc.Must(b.t, s.SignCommand(&c), "sign")
	return c
}

func (b *bridge) sendBody(body []byte) {
	b.t.Helper()
	testsvc.Must(b.t, b.ch.PublishWithContext(context.Background(), protocol.Exchange, protocol.CommandRoutingKey(b.host), false, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body}), "publish")
}

func (b *bridge) send(c protocol.Command) {
	b.t.Helper()
	body, _ := json.Marshal(c)
	b.sendBody(body)
}

// result waits for the next result and checks its signature with the
// agent's key (the bridge's keyring).
func (b *bridge) result(ring *protocol.Keyring) protocol.Result {
	b.t.Helper()
	select {
	case d := <-b.results:
		k, err := ring.Verify(protocol.TypeResult, d.Body, time.Now())
		if err != nil || k.Host != b.host {
			b.t.Fatalf("result not signed by the host's key: %v\n%s", err, d.Body)
		}
		r, err := protocol.DecodeResult(d.Body)
		testsvc.Must(b.t, err, "decode result")
		return r
	case <-time.After(30 * time.Second):
		b.t.Fatal("no result within 30s")
	}
	return protocol.Result{}
}

func (b *bridge) report(ring *protocol.Keyring) protocol.Report {
	b.t.Helper()
	select {
	case d := <-b.reports:
		if _, err := ring.Verify(protocol.TypeReport, d.Body, time.Now()); err != nil {
			b.t.Fatalf("report not signed by the host's key: %v", err)
		}
		r, err := protocol.DecodeReport(d.Body)
		testsvc.Must(b.t, err, "decode report")
		return r
	case <-time.After(30 * time.Second):
		b.t.Fatal("no report within 30s")
	}
	return protocol.Report{}
}

// expect sends c (or body) and checks the answer.
func (b *bridge) expect(ring *protocol.Keyring, id string, st protocol.Status, code string) protocol.Result {
	b.t.Helper()
	r := b.result(ring)
	if r.CommandID != id || r.Status != st || r.Code != code {
		b.t.Fatalf("result %s: %s/%s %q, want %s: %s/%s", r.CommandID, r.Status, r.Code, r.Message, id, st, code)
	}
	return r
}

// ran checks that the command ran (any status but refused).
func (b *bridge) ran(ring *protocol.Keyring, id string) {
	b.t.Helper()
	r := b.result(ring)
	if r.CommandID != id || r.Status == protocol.Refused {
		b.t.Fatalf("result %s: %s/%s %q, want %s executed", r.CommandID, r.Status, r.Code, r.Message, id)
	}
}

// logBuffer collects the agent's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type agentRun struct {
	fake string
	log  *logBuffer
}

// clock is the agent's signature clock, which tests move forward.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// start runs the agent in this process with the test's keys and extra
// settings until the test ends.
func start(t *testing.T, k *keys, clk *clock, extra ...string) *agentRun {
	t.Helper()
	fake := t.TempDir()
	_, err := fakehost.Build(fake, fakehost.DefaultSpec())
	testsvc.Must(t, err, "fake host")
	settings := append([]string{"DEFAULT.host=" + k.host, "DEFAULT.transport_url=" + testsvc.TransportURL(t),
		"DEFAULT.state_path=" + t.TempDir(), "DEFAULT.listen=127.0.0.1:0", "DEFAULT.reconnect_max_backoff=2s",
		"DEFAULT.shutdown_timeout=5s", "security.bridge_keys_file=" + k.path("bridge-keys.pem"),
		"security.signing_key_file=" + k.path("agent.key"), "security.key_id=" + k.agent.KeyID()}, extra...)
	v, err := agent.LoadConfig(conf.Source{Overrides: settings})
	testsvc.Must(t, err, "config")
	run := &agentRun{fake: fake, log: &logBuffer{}}
	var w io.Writer = run.log
	if testing.Verbose() {
		w = io.MultiWriter(run.log, os.Stderr)
	}
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var now func() time.Time
	if clk != nil {
		now = clk.now
	}
	go func() { done <- agent.RunWith(ctx, v, log, agent.RunOptions{FakeHostDir: fake, Now: now}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("agent did not stop")
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", run.log.String())
		}
	})
	return run
}

func available(t *testing.T, fake string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fake, "sys", "class", "mdev_bus", gpuFree, "mdev_supported_types", t4q, "available_instances"))
	testsvc.Must(t, err, "available_instances")
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	testsvc.Must(t, err, "available_instances")
	return n
}

func mdevExists(fake, uuid string) bool {
	_, err := os.Lstat(filepath.Join(fake, "sys", "bus", "mdev", "devices", uuid))
	return err == nil
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// TestRefusals: forged, unsigned, tampered, unknown-key, expired,
// wrong-host and replayed commands are each refused (or answered from the
// journal) and never executed; a valid signed command executes; every
// result and report is signed with the host's key.
func TestRefusals(t *testing.T) {
	t.Parallel()
	host := testsvc.Name("sec") + ".example.org"
	k := newKeys(t, host, "bridge-2025a")
	k.writeRing(nil, "bridge-2025a")
	b := newBridge(t, host)
	run := start(t, k, nil)
	bk := k.bridge["bridge-2025a"]

	rep := b.report(k.ring)
	if rep.KeyID != k.agent.KeyID() || rep.Sig == "" {
		t.Errorf("report key_id %q sig %q", rep.KeyID, rep.Sig)
	}
	before := available(t, run.fake)

	// A valid signed command executes.
	uuid := newUUID()
	valid := b.sign(bk, b.command(protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: uuid, ParentPCI: gpuFree, TypeID: t4q}))
	b.send(valid)
	r1 := b.expect(k.ring, valid.ID, protocol.Succeeded, "")
	if !mdevExists(run.fake, uuid) || available(t, run.fake) != before-1 {
		t.Fatal("the valid command did not create its mdev")
	}

	// Replayed: the same signed command again is answered with the
	// recorded result, not executed again.
	b.send(valid)
	if r := b.expect(k.ring, valid.ID, protocol.Succeeded, ""); !r.FinishedAt.Equal(r1.FinishedAt) {
		t.Errorf("replay answered %+v, want the recorded %+v", r, r1)
	}

	forger := newSigner(t, "bridge-2025a") // the bridge's key id, another key
	type refusal struct {
		name string
		body func() (id string, body []byte)
		code string
	}
	create := func() protocol.Command {
		return b.command(protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: newUUID(), ParentPCI: gpuFree, TypeID: t4q})
	}
	marshal := func(c protocol.Command) (string, []byte) { body, _ := json.Marshal(c); return c.ID, body }
	for _, tc := range []refusal{
		{"forged", func() (string, []byte) { return marshal(b.sign(forger, create())) }, protocol.CodeBadSignature},
		{"unsigned", func() (string, []byte) { return marshal(create()) }, protocol.CodeBadSignature},
		{"tampered", func() (string, []byte) {
			c := b.sign(bk, b.command(protocol.VerifyVGPU, runningVM, protocol.VerifyParams{}))
			c.Kind, c.Params = protocol.CreateMdev, json.RawMessage(`{"mdev_uuid":"`+newUUID()+`","parent_pci":"`+gpuFree+`","type_id":"`+t4q+`"}`)
			return marshal(c)
		}, protocol.CodeBadSignature},
		{"unknown key", func() (string, []byte) { return marshal(b.sign(newSigner(t, "bridge-2031"), create())) }, protocol.CodeUnknownKey},
		{"agent key", func() (string, []byte) { return marshal(b.sign(k.agent, create())) }, protocol.CodeUnknownKey},
		{"expired", func() (string, []byte) {
			c := create()
			c.ExpiresAt = time.Now().Add(-time.Minute)
			return marshal(b.sign(bk, c))
		}, protocol.CodeExpired},
		{"wrong host", func() (string, []byte) {
			c := create()
			c.Host = "compute-other"
			return marshal(b.sign(bk, c))
		}, protocol.CodeWrongHost},
		// A forgery reusing the executed id must not get the recorded
		// result (nor run): the signature is checked before the journal.
		{"forged reuse of an executed id", func() (string, []byte) {
			c := b.command(protocol.RemoveMdev, "", protocol.MdevParams{MdevUUID: uuid})
			c.ID = valid.ID
			return marshal(b.sign(forger, c))
		}, protocol.CodeBadSignature},
		{"unsigned reuse of an executed id", func() (string, []byte) {
			c := b.command(protocol.RemoveMdev, "", protocol.MdevParams{MdevUUID: uuid})
			c.ID = valid.ID
			return marshal(c)
		}, protocol.CodeBadSignature},
	} {
		id, body := tc.body()
		b.sendBody(body)
		r := b.expect(k.ring, id, protocol.Refused, tc.code)
		if tc.code == protocol.CodeBadSignature || tc.code == protocol.CodeUnknownKey {
			var det struct {
				BodySHA256 string `json:"body_sha256"`
			}
			if json.Unmarshal(r.Details, &det); len(det.BodySHA256) != 64 {
				t.Errorf("%s: details %s lack body_sha256", tc.name, r.Details)
			}
		}
		if !strings.Contains(run.log.String(), "reason="+tc.code) {
			t.Errorf("%s: no log line with reason=%s", tc.name, tc.code)
		}
	}
	if got := available(t, run.fake); got != before-1 || !mdevExists(run.fake, uuid) {
		t.Errorf("refused commands changed the host: available %d → %d, mdev exists %v", before-1, got, mdevExists(run.fake, uuid))
	}
	// The agent's private key never reaches the log.
	lines := strings.Split(strings.TrimSpace(string(k.agentPEM)), "\n")
	for _, l := range lines[1 : len(lines)-1] {
		if strings.Contains(run.log.String(), l) {
			t.Error("the agent logged its private key")
		}
	}
}

// TestRotation: the bridge's key is rotated while the agent runs. After
// SIGHUP the agent trusts the new key and, until the old key's Not-After,
// the old one too; after it, the old key is refused (key_expired). A
// broken keyring on SIGHUP keeps the keys in use.
func TestRotation(t *testing.T) {
	t.Parallel()
	host := testsvc.Name("rot")
	k := newKeys(t, host, "bridge-2025a", "bridge-2025b")
	k.writeRing(nil, "bridge-2025a")
	b := newBridge(t, host)
	clk := &clock{}
	start(t, k, clk)
	oldK, newK := k.bridge["bridge-2025a"], k.bridge["bridge-2025b"]
	b.report(k.ring)

	c := b.sign(oldK, b.verify())
	b.send(c)
	b.ran(k.ring, c.ID)
	c = b.sign(newK, b.verify())
	b.send(c)
	b.expect(k.ring, c.ID, protocol.Refused, protocol.CodeUnknownKey)

	// Rotate: the new key, and the old one for a grace hour.
	graceEnd := time.Now().Add(time.Hour)
	k.writeRing(map[string]time.Time{"bridge-2025a": graceEnd}, "bridge-2025b", "bridge-2025a")
	testsvc.Must(t, syscall.Kill(os.Getpid(), syscall.SIGHUP), "SIGHUP")
	deadline := time.Now().Add(30 * time.Second)
	for {
		c = b.sign(newK, b.verify())
		b.send(c)
		r := b.result(k.ring)
		if r.Status != protocol.Refused {
			break
		}
		if r.Code != protocol.CodeUnknownKey || time.Now().After(deadline) {
			t.Fatalf("after SIGHUP: %+v", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c = b.sign(oldK, b.verify()) // within the grace period
	b.send(c)
	b.ran(k.ring, c.ID)

	// The grace period ends.
	clk.advance(time.Until(graceEnd) + time.Minute)
	c = b.sign(oldK, b.verify())
	b.send(c)
	b.expect(k.ring, c.ID, protocol.Refused, protocol.CodeKeyExpired)
	c = b.sign(newK, b.verify())
	b.send(c)
	b.ran(k.ring, c.ID)

	// A broken keyring is not installed: the new key still works.
	testsvc.Must(t, os.WriteFile(k.path("bridge-keys.pem"), []byte("not a keyring"), 0o644), "break keyring")
	testsvc.Must(t, syscall.Kill(os.Getpid(), syscall.SIGHUP), "SIGHUP")
	time.Sleep(500 * time.Millisecond)
	c = b.sign(newK, b.verify())
	b.send(c)
	b.ran(k.ring, c.ID)
}

// TestSwitchOver: with require_signed_commands = false (the switch-over)
// unsigned commands run, but a bad signature is still refused.
func TestSwitchOver(t *testing.T) {
	t.Parallel()
	host := testsvc.Name("switch")
	k := newKeys(t, host, "bridge-2025a")
	k.writeRing(nil, "bridge-2025a")
	b := newBridge(t, host)
	start(t, k, nil, "security.require_signed_commands=false")
	b.report(k.ring)
	c := b.verify()
	b.send(c)
	b.ran(k.ring, c.ID)
	c = b.sign(newSigner(t, "bridge-2025a"), b.verify())
	b.send(c)
	b.expect(k.ring, c.ID, protocol.Refused, protocol.CodeBadSignature)
	c = b.sign(k.bridge["bridge-2025a"], b.verify())
	b.send(c)
	b.ran(k.ring, c.ID)
}
