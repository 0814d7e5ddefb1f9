// Package agent_test runs vgpu-agent against the real RabbitMQ and a fake
// host: duplicate deliveries, refusals, a kill -9 in the middle of a
// command and the reboot recovery.
package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/transport"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Environment of a child agent process (this test binary re-executed).
const (
	envChild    = "VGPU_TEST_AGENT_CHILD"
	envFakeHost = "VGPU_TEST_AGENT_FAKE_HOST"
	envCrashAt  = "VGPU_TEST_AGENT_CRASH_AT" // "kind/step"
	envMarker   = "VGPU_TEST_AGENT_MARKER"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

// child runs the agent as a process; with envCrashAt it stops dead after
// that step (writes the marker and blocks) so the test can kill -9 it there.
func child() int {
	v, err := agent.LoadConfig(conf.Source{Environ: os.Environ()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	crashAt, marker := os.Getenv(envCrashAt), os.Getenv(envMarker)
	hook := func(c protocol.Command, step string) {
		if crashAt != "" && string(c.Kind)+"/"+step == crashAt {
			_ = os.WriteFile(marker, []byte(c.ID), 0o644)
			select {} // wait for SIGKILL
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := agent.RunWith(ctx, v, log, agent.RunOptions{FakeHostDir: os.Getenv(envFakeHost), AfterStep: hook}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

const (
	gpuFree   = "0000:d8:00.0" // a fake T4 with no mdev
	t4q       = "nvidia-232"
	novaMdev  = "4b20d080-1b54-4048-85b3-a6a62d165c01" // in the fake host's spec: Nova's
	runningVM = "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01"
)

// bridge is the test's side of RabbitMQ: it sends commands and reads
// results and reports for one host.
type bridge struct {
	t       *testing.T
	host    string
	ch      *amqp.Channel
	results <-chan amqp.Delivery
	reports <-chan amqp.Delivery
}

func newBridge(t *testing.T, host string) *bridge {
	t.Helper()
	ch := agentQueue(t, testsvc.RabbitURL(t), host)
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

// agentQueue declares host's command queue on the broker at url (deleted
// at the end), before the agent starts so that no command is lost, and
// returns a channel for the test's side.
func agentQueue(t *testing.T, url, host string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
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
	return ch
}

func (b *bridge) command(id string, k protocol.Kind, instance string, params any) protocol.Command {
	c := protocol.Command{V: 1, ID: id, Kind: k, Host: b.host, InstanceUUID: instance, IssuedAt: time.Now().UTC(),
		ExpiresAt: time.Now().UTC().Add(2 * time.Minute)}
	testsvc.Must(b.t, c.MarshalParams(params), "params")
	return c
}

// send signs c with the test's bridge key and publishes it to the host's
// routing key (whatever c.Host says).
func (b *bridge) send(c protocol.Command) {
	b.t.Helper()
	testsvc.Must(b.t, testkeys.For(b.t).Signer().SignCommand(&c), "sign")
	body, _ := json.Marshal(c)
	testsvc.Must(b.t, b.ch.PublishWithContext(context.Background(), protocol.Exchange, protocol.CommandRoutingKey(b.host), false, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: c.ID, Body: body}), "publish")
}

func (b *bridge) result(within time.Duration) protocol.Result {
	b.t.Helper()
	select {
	case d := <-b.results:
		r, err := protocol.DecodeResult(d.Body)
		testsvc.Must(b.t, err, "decode result")
		return r
	case <-time.After(within):
		b.t.Fatalf("no result within %s", within)
	}
	return protocol.Result{}
}

func (b *bridge) noResult(within time.Duration) {
	b.t.Helper()
	select {
	case d := <-b.results:
		b.t.Fatalf("unexpected result %s", d.Body)
	case <-time.After(within):
	}
}

func (b *bridge) report(within time.Duration) protocol.Report {
	b.t.Helper()
	select {
	case d := <-b.reports:
		r, err := protocol.DecodeReport(d.Body)
		testsvc.Must(b.t, err, "decode report")
		return r
	case <-time.After(within):
		b.t.Fatalf("no report within %s", within)
	}
	return protocol.Report{}
}

// settings are the agent's configuration overrides for a test host.
func settings(t *testing.T, host, state string) []string {
	return append([]string{"DEFAULT.host=" + host, "DEFAULT.transport_url=" + testsvc.TransportURL(t),
		"DEFAULT.state_path=" + state, "DEFAULT.listen=127.0.0.1:0", "DEFAULT.report_check_interval=1s",
		"DEFAULT.reconnect_max_backoff=2s", "DEFAULT.shutdown_timeout=5s"}, testkeys.For(t).Agent(host)...)
}

// startInProcess runs the agent in this process until the returned stop.
func startInProcess(t *testing.T, host, fake, state string, extra ...string) (stop func()) {
	t.Helper()
	v, err := agent.LoadConfig(conf.Source{Overrides: append(settings(t, host, state), extra...)})
	testsvc.Must(t, err, "config")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.RunWith(ctx, v, testLogger(t), agent.RunOptions{FakeHostDir: fake}) }()
	var once bool
	stop = func() {
		if once {
			return
		}
		once = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("agent did not stop")
		}
	}
	t.Cleanup(stop)
	return stop
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// startProcess runs the agent as a child process.
func startProcess(t *testing.T, host, fake, state string, extraEnv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1", envFakeHost+"="+fake)
	for _, s := range settings(t, host, state) {
		k, val, _ := strings.Cut(s, "=")
		sec, opt, _ := strings.Cut(k, ".")
		cmd.Env = append(cmd.Env, "VGPU_AGENT_"+strings.ToUpper(sec)+"_"+strings.ToUpper(opt)+"="+val)
	}
	cmd.Env = append(cmd.Env, extraEnv...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "agent.log"))
	testsvc.Must(t, err, "log file")
	cmd.Stdout, cmd.Stderr = logf, logf
	testsvc.Must(t, cmd.Start(), "start agent process")
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("agent log (%d):\n%s", cmd.Process.Pid, b)
		}
	})
	return cmd
}

func newFakeHost(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	_, err := fakehost.Build(dir, fakehost.DefaultSpec())
	testsvc.Must(t, err, "fake host")
	return dir
}

func available(t *testing.T, fake, parent, typeID string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fake, "sys", "class", "mdev_bus", parent, "mdev_supported_types", typeID, "available_instances"))
	testsvc.Must(t, err, "available_instances")
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	testsvc.Must(t, err, "available_instances")
	return n
}

func mdevExists(fake, uuid string) bool {
	_, err := os.Lstat(filepath.Join(fake, "sys", "bus", "mdev", "devices", uuid))
	return err == nil
}

func newUUID(t *testing.T) string {
	var b [16]byte
	f, _ := os.Open("/dev/urandom")
	defer f.Close()
	f.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func wantResult(t *testing.T, r protocol.Result, id string, st protocol.Status, code string) {
	t.Helper()
	if r.CommandID != id || r.Status != st || r.Code != code {
		t.Fatalf("result %s: %s/%s %q, want %s: %s/%s", r.CommandID, r.Status, r.Code, r.Message, id, st, code)
	}
}

func TestDuplicateDeliveryExecutedOnce(t *testing.T) {
	t.Parallel()
	host := testsvc.Name("agent-dup") + ".example.org" // host names contain dots
	b := newBridge(t, host)
	fake, state := newFakeHost(t), t.TempDir()
	before := available(t, fake, gpuFree, t4q)
	stop := startInProcess(t, host, fake, state)

	rep := b.report(30 * time.Second)
	if rep.Host != host || len(rep.GPUs) == 0 || rep.AgentVersion == "" {
		t.Errorf("first report: %+v", rep)
	}
	uuid := newUUID(t)
	c := b.command("dup-1", protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: uuid, ParentPCI: gpuFree, TypeID: t4q})
	b.send(c)
	b.send(c) // the same command delivered twice
	r1, r2 := b.result(30*time.Second), b.result(30*time.Second)
	wantResult(t, r1, c.ID, protocol.Succeeded, "")
	if r2.Status != r1.Status || !r2.FinishedAt.Equal(r1.FinishedAt) {
		t.Errorf("duplicate answered %+v, want the recorded %+v", r2, r1)
	}
	if got := available(t, fake, gpuFree, t4q); got != before-1 || !mdevExists(fake, uuid) {
		t.Errorf("available_instances %d → %d, mdev exists %v: want one creation", before, got, mdevExists(fake, uuid))
	}
	// A report after the change shows the new vGPU as the agent's.
	deadline := time.Now().Add(30 * time.Second)
	for found := false; !found; {
		if time.Now().After(deadline) {
			t.Fatal("no report with the new mdev")
		}
		for _, g := range b.report(30 * time.Second).GPUs {
			for _, a := range g.Active {
				if a.MdevUUID == uuid && a.Owner == protocol.OwnerAgent {
					found = true
				}
			}
		}
	}

	// After a restart the journal still answers the duplicate.
	stop()
	startInProcess(t, host, fake, state)
	b.send(c)
	if r3 := b.result(30 * time.Second); !r3.FinishedAt.Equal(r1.FinishedAt) {
		t.Errorf("duplicate after restart answered %+v", r3)
	}
	if got := available(t, fake, gpuFree, t4q); got != before-1 {
		t.Errorf("available_instances %d after restart duplicate, want %d", got, before-1)
	}
}

func TestRefusedWrongHostAndExpired(t *testing.T) {
	t.Parallel()
	host := testsvc.Name("agent-refuse")
	b := newBridge(t, host)
	fake := newFakeHost(t)
	before := available(t, fake, gpuFree, t4q)
	startInProcess(t, host, fake, t.TempDir())

	wrong := b.command("wrong-1", protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: newUUID(t), ParentPCI: gpuFree, TypeID: t4q})
	wrong.Host = "some-other-host"
	b.send(wrong)
	wantResult(t, b.result(30*time.Second), wrong.ID, protocol.Refused, protocol.CodeWrongHost)

	old := b.command("old-1", protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: newUUID(t), ParentPCI: gpuFree, TypeID: t4q})
	old.ExpiresAt = time.Now().Add(-time.Minute)
	b.send(old)
	wantResult(t, b.result(30*time.Second), old.ID, protocol.Refused, protocol.CodeExpired)

	nova := b.command("nova-1", protocol.RemoveMdev, "", protocol.MdevParams{MdevUUID: novaMdev})
	b.send(nova)
	wantResult(t, b.result(30*time.Second), nova.ID, protocol.Refused, protocol.CodeNotOwned)

	// Signed, an unknown kind is invalid; unsigned, anything is refused
	// first for its signature (signed commands are the default).
	garbage := []byte(`{"v":1,"id":"bad-1","kind":"format_disk","host":"` + host + `","expires_at":"2099-01-01T00:00:00Z"}`)
	signed, err := testkeys.For(t).Signer().SignBody(protocol.TypeCommand, garbage)
	testsvc.Must(t, err, "sign")
	testsvc.Must(t, b.ch.PublishWithContext(context.Background(), protocol.Exchange, protocol.CommandRoutingKey(host), false, false,
		amqp.Publishing{Body: signed}), "publish")
	wantResult(t, b.result(30*time.Second), "bad-1", protocol.Refused, protocol.CodeInvalidCommand)
	unsigned := b.command("unsigned-1", protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: newUUID(t), ParentPCI: gpuFree, TypeID: t4q})
	body, _ := json.Marshal(unsigned)
	testsvc.Must(t, b.ch.PublishWithContext(context.Background(), protocol.Exchange, protocol.CommandRoutingKey(host), false, false,
		amqp.Publishing{Body: body}), "publish")
	wantResult(t, b.result(30*time.Second), unsigned.ID, protocol.Refused, protocol.CodeBadSignature)

	if got := available(t, fake, gpuFree, t4q); got != before || !mdevExists(fake, novaMdev) {
		t.Errorf("refused commands changed the host: available %d → %d, Nova's mdev exists %v", before, got, mdevExists(fake, novaMdev))
	}
}

// TestKill9BetweenCreateAndAttach kills the agent process (SIGKILL) after it
// created the mdev and before it attached it; the restarted agent completes
// the command exactly once.
func TestKill9BetweenCreateAndAttach(t *testing.T) {
	t.Parallel()
	host := testsvc.Name("agent-kill")
	b := newBridge(t, host)
	fake, state := newFakeHost(t), t.TempDir()
	before := available(t, fake, gpuFree, t4q)
	marker := filepath.Join(t.TempDir(), "crashed")
	p := startProcess(t, host, fake, state, envCrashAt+"=attach_vgpu/mdev_created", envMarker+"="+marker)

	uuid := newUUID(t)
	c := b.command("kill-1", protocol.AttachVGPU, runningVM,
		protocol.AttachParams{MdevUUID: uuid, ParentPCI: gpuFree, TypeID: t4q, Mode: protocol.ModeLive})
	b.send(c)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent never reached the crash point")
		}
		time.Sleep(50 * time.Millisecond)
	}
	testsvc.Must(t, p.Process.Signal(syscall.SIGKILL), "kill -9")
	p.Wait()
	if !mdevExists(fake, uuid) {
		t.Fatal("the mdev was not created before the crash")
	}
	b.noResult(500 * time.Millisecond)

	startProcess(t, host, fake, state)
	// Recovery publishes the result; the redelivered command is answered
	// from the journal with the same result.
	r1 := b.result(60 * time.Second)
	wantResult(t, r1, c.ID, protocol.Succeeded, "")
	var det struct{ Steps []string }
	json.Unmarshal(r1.Details, &det)
	if strings.Join(det.Steps, ",") != "mdev_created,attached" {
		t.Errorf("steps = %v", det.Steps)
	}
	r2 := b.result(30 * time.Second)
	if r2.CommandID != c.ID || !r2.FinishedAt.Equal(r1.FinishedAt) {
		t.Errorf("second result %+v, want the same as %+v", r2, r1)
	}
	if got := available(t, fake, gpuFree, t4q); got != before-1 {
		t.Errorf("available_instances %d → %d: the mdev was created more than once", before, got)
	}
	v := b.command("kill-verify", protocol.VerifyVGPU, runningVM, protocol.VerifyParams{TypeID: t4q, MdevUUID: uuid})
	b.send(v)
	wantResult(t, b.result(30*time.Second), v.ID, protocol.Succeeded, "")
}

// TestRebootRecovery: the journal says mdev X should exist, the host
// (rebooted) lacks it → the agent recreates it at start; Nova's are not
// touched.
func TestRebootRecovery(t *testing.T) {
	t.Parallel()
	host := testsvc.Name("agent-reboot")
	b := newBridge(t, host)
	fake, state := newFakeHost(t), t.TempDir()
	stop := startInProcess(t, host, fake, state)
	uuid := newUUID(t)
	c := b.command("reboot-1", protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: uuid, ParentPCI: gpuFree, TypeID: t4q})
	b.send(c)
	wantResult(t, b.result(30*time.Second), c.ID, protocol.Succeeded, "")
	stop()

	// Reboot: the sysfs tree comes back as built, without the agent's mdev
	// and without Nova's (Nova recreates its own).
	spec := fakehost.DefaultSpec()
	spec.MdevGPUs[0].Mdevs = nil
	_, err := fakehost.Build(fake, spec)
	testsvc.Must(t, err, "rebuild fake host")
	if mdevExists(fake, uuid) {
		t.Fatal("rebuild kept the mdev")
	}
	before := available(t, fake, gpuFree, t4q)
	startInProcess(t, host, fake, state)
	deadline := time.Now().Add(30 * time.Second)
	// The fake kernel updates available_instances just after the device.
	for !mdevExists(fake, uuid) || available(t, fake, gpuFree, t4q) != before-1 {
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not recreate its mdev (exists %v, available_instances %d → %d)",
				mdevExists(fake, uuid), before, available(t, fake, gpuFree, t4q))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if mdevExists(fake, novaMdev) {
		t.Error("the agent recreated Nova's mdev")
	}
}

// TestFirstReportBeforeBinding: an agent that starts before the bridge
// has bound its reports queue publishes into the void; the broker
// returns the report (mandatory) and the agent sends it again, so the
// bridge has it within seconds of binding, not at the next report period
// (a minute). Before, the first report was dropped until then.
func TestFirstReportBeforeBinding(t *testing.T) {
	host := testsvc.Name("agent-first-report")
	// A vhost of its own: on the shared one, queues of other tests and
	// runs are bound to report.# and would take the report.
	vh := testsvc.PrivateVHost(t)
	ch := agentQueue(t, vh, host)
	startInProcess(t, host, newFakeHost(t), t.TempDir(), "DEFAULT.transport_url=rabbit://"+strings.TrimPrefix(vh, "amqp://"))
	time.Sleep(3 * time.Second) // the first report went out with no queue bound
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	testsvc.Must(t, err, "declare reports queue")
	testsvc.Must(t, ch.QueueBind(q.Name, protocol.ReportRoutingKey(host), protocol.Exchange, false, nil), "bind")
	d, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	testsvc.Must(t, err, "consume")
	select {
	case m := <-d:
		r, err := protocol.DecodeReport(m.Body)
		testsvc.Must(t, err, "decode report")
		if r.Host != host || len(r.GPUs) == 0 {
			t.Errorf("report %+v", r)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no report within 15 s of binding the reports queue (the report period is a minute)")
	}
}
