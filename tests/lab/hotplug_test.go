//go:build lab

package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/transport"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/direct"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// mtty's PCI identity as QEMU and the guest see an mtty mdev (WCH CH35x).
const (
	mttyVendor    = 0x4348
	mttyGuestID   = "0x4348:"
	resultTimeout = 5 * time.Minute
)

// labAgent is vgpu-agent (cmd/vgpu-agent, built here) running inside the
// lab VM as a transient systemd service on the VM's real sysfs and libvirtd,
// connected to this machine's RabbitMQ, and the test's bridge side of it:
// commands are built by the pipeline's own AttachCommands/ReleaseCommands,
// signed with the test's bridge key and published as the bridge does.
type labAgent struct {
	t       *testing.T
	host    string
	parent  string // the mtty_pci mdev parent of mtty_pci-1 (the first edu PCI function)
	parent2 string // the one of mtty_pci-2 (the second edu function; "" when the lab has one)
	ch      *amqp.Channel
	results <-chan amqp.Delivery

	unit  string   // the systemd unit of the agent's current run
	units []string // every run's unit, for the logs
	serve string   // the agent's command line
	bin   string   // the binary and its global options (serve's first part)
	sets  string   // the --set options (serve's last part)
}

// startLabAgent starts vgpu-agent in the lab for a new host of the test,
// with env (KEY=value) added to its environment.
func startLabAgent(t *testing.T, env ...string) *labAgent {
	t.Helper()
	return startLabAgentWith(t, agentOpts{env: env})
}

// agentOpts are what a test changes of the lab agent's setup.
type agentOpts struct {
	host string   // the agent's host name ("": a new one)
	env  []string // KEY=value added to the agent's environment
	// conf replaces agent.conf ("": the mtty_pci types, one per edu function).
	conf string
	// sets are more --set section.option=value, after the lab's own.
	sets []string
	// statePath is the agent's [DEFAULT] state_path, its journal ("": a
	// new one of this agent's on the VM's tmpfs, lost when the VM stops).
	statePath string
}

// startLabAgentWith starts vgpu-agent in the lab for a new host of the
// test, set up as o says.
func startLabAgentWith(t *testing.T, o agentOpts) *labAgent {
	t.Helper()
	needLab(t)
	a := &labAgent{t: t, host: o.host}
	if a.host == "" {
		a.host = testsvc.Name("lab") + ".lab.test"
	}
	out, err := vm(t, `ls /sys/bus/pci/drivers/mtty_pci | grep -E '^[0-9a-f]{4}:' | sort`)
	parents := strings.Fields(out)
	if err != nil || len(parents) == 0 {
		t.Fatalf("no PCI function bound to mtty_pci in the lab: %v\n%s", err, out)
	}
	a.parent = parents[0]
	if len(parents) > 1 {
		a.parent2 = parents[1]
	}

	// The broker side first, so that no command or result is lost.
	conn, err := amqp.Dial(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "dial")
	t.Cleanup(func() { conn.Close() })
	a.ch, err = conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, transport.Declare(a.ch, a.host), "declare")
	t.Cleanup(func() {
		if c, err := conn.Channel(); err == nil {
			c.QueueDelete(protocol.AgentQueue(a.host), false, false, false)
		}
	})
	q, err := a.ch.QueueDeclare("", false, true, true, false, nil)
	testsvc.Must(t, err, "declare result queue")
	testsvc.Must(t, a.ch.QueueBind(q.Name, protocol.ResultRoutingKey(a.host), protocol.Exchange, false, nil), "bind")
	a.results, err = a.ch.Consume(q.Name, "", true, true, false, false, nil)
	testsvc.Must(t, err, "consume")

	// The binary and the agent's keys go to the lab's share (/lab in the VM;
	// the VM has its own /tmp).
	share, vmShare := labEnv["LAB_SHARE_DIR"], labEnv["LAB_VM_SHARE_DIR"]
	dir := filepath.Join(share, "agents", a.host)
	testsvc.Must(t, os.MkdirAll(filepath.Join(share, "bin"), 0o755), "share")
	testsvc.Must(t, os.MkdirAll(dir, 0o700), "share")
	t.Cleanup(func() { os.RemoveAll(dir) })
	testsvc.Must(t, copyFile(testsvc.Binary(t, "vgpu-agent"), filepath.Join(share, "bin", "vgpu-agent")), "copy vgpu-agent")
	var sets []string
	for _, ov := range testkeys.For(t).Agent(a.host) {
		k, v, _ := strings.Cut(ov, "=")
		if strings.HasSuffix(k, "_file") {
			dst := filepath.Join(dir, filepath.Base(v))
			testsvc.Must(t, copyFile(v, dst), "copy "+v)
			testsvc.Must(t, os.Chmod(dst, 0o600), "chmod "+dst) // the agent refuses keys others can read
			v = filepath.Join(vmShare, "agents", a.host, filepath.Base(v))
		}
		sets = append(sets, k+"="+v)
	}
	state := o.statePath
	if state == "" {
		// A journal of its own: an agent of a host name another test
		// used (the lab Nova's "lab") must not recreate what that test's
		// agent owned.
		state = "/var/lib/vgpu-lab-agent/" + testsvc.Name(a.host)
	}
	// 10.0.2.2 is this machine's loopback as the VM sees it.
	turl := strings.NewReplacer("@127.0.0.1:", "@10.0.2.2:", "@localhost:", "@10.0.2.2:").Replace(testsvc.TransportURL(t))
	sets = append(sets, "DEFAULT.host="+a.host, "DEFAULT.transport_url="+turl,
		"DEFAULT.state_path="+state, "DEFAULT.listen=127.0.0.1:0",
		"DEFAULT.report_check_interval=5s", "DEFAULT.reconnect_max_backoff=2s", "DEFAULT.shutdown_timeout=20s",
		"libvirt.connection_uri=qemu:///system", "nvml.backend=none",
	)
	// As in nova.conf, one type per parent: mtty_pci-1 on the first edu
	// function, mtty_pci-2 on the second. The per-type sections come from a
	// file: --set cannot name a templated section.
	conf := "[devices]\nenabled_types = mtty_pci-1\n"
	if a.parent2 != "" {
		conf = fmt.Sprintf("[devices]\nenabled_types = mtty_pci-1,mtty_pci-2\n\n[mdev_mtty_pci-1]\ndevice_addresses = %s\n\n"+
			"[mdev_mtty_pci-2]\ndevice_addresses = %s\n", a.parent, a.parent2)
	}
	if o.conf != "" {
		conf = o.conf
	}
	sets = append(sets, o.sets...)
	testsvc.Must(t, os.WriteFile(filepath.Join(dir, "agent.conf"), []byte(conf), 0o600), "agent.conf")
	a.bin = fmt.Sprintf("%s/bin/vgpu-agent --config %s/agents/%s/agent.conf --debug", vmShare, vmShare, a.host)
	for _, s := range sets {
		a.sets += " --set '" + s + "'"
	}
	a.serve = a.bin + " serve" + a.sets
	t.Cleanup(func() {
		a.stop()
		out, _ := vm(t, "journalctl -q -o cat -u "+strings.Join(a.units, " -u ")+" | tail -n 300")
		if t.Failed() || testing.Verbose() {
			t.Logf("vgpu-agent in the lab (%s):\n%s", strings.Join(a.units, ", "), out)
		}
	})
	a.start(o.env...)
	return a
}

// start runs vgpu-agent in the lab as a new transient systemd unit (a
// restart is a new unit: the one before may not be collected yet), with env
// (KEY=value, e.g. a failpoint) added to its environment.
func (a *labAgent) start(env ...string) {
	a.t.Helper()
	a.unit = fmt.Sprintf("vgpu-lab-agent-%s-%d", strings.TrimSuffix(a.host, ".lab.test"), len(a.units))
	a.units = append(a.units, a.unit)
	cmd := "systemd-run --quiet --collect --unit=" + a.unit
	for _, e := range env {
		cmd += " --setenv='" + e + "'"
	}
	if out, err := vm(a.t, cmd+" "+a.serve); err != nil {
		a.t.Fatalf("starting vgpu-agent in the lab: %v\n%s", err, out)
	}
}

// stop stops the agent's current run (nothing when it has ended).
func (a *labAgent) stop() {
	a.t.Helper()
	if a.unit != "" {
		vm(a.t, "systemctl stop "+a.unit+" 2>/dev/null; true")
	}
}

// publish signs c with the test's bridge key and publishes it to the
// agent's host, as the bridge does.
func (a *labAgent) publish(c *protocol.Command) {
	a.t.Helper()
	testsvc.Must(a.t, testkeys.For(a.t).Signer().SignCommand(c), "sign")
	body, err := json.Marshal(c)
	testsvc.Must(a.t, err, "marshal")
	testsvc.Must(a.t, a.ch.PublishWithContext(context.Background(), protocol.Exchange, protocol.CommandRoutingKey(a.host), false, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: c.ID, Body: body}), "publish")
}

// result waits for the result of command c.
func (a *labAgent) result(c protocol.Command) protocol.Result {
	a.t.Helper()
	deadline := time.After(resultTimeout)
	for {
		select {
		case d := <-a.results:
			r, err := protocol.DecodeResult(d.Body)
			testsvc.Must(a.t, err, "decode result")
			if r.CommandID != c.ID {
				continue // an earlier command's late duplicate
			}
			a.t.Logf("%s %s: %s %s %s", c.Kind, c.ID, r.Status, r.Code, r.Message)
			return r
		case <-deadline:
			a.t.Fatalf("no result for %s %s within %s", c.Kind, c.ID, resultTimeout)
		}
	}
}

// do builds nothing itself: it signs c with the test's bridge key,
// publishes it to the agent's host and waits for its result.
func (a *labAgent) do(c protocol.Command) protocol.Result {
	a.t.Helper()
	a.publish(&c)
	return a.result(c)
}

func (a *labAgent) attachment(id uuid.UUID, typeID, mode string) flow.Attachment {
	return flow.Attachment{ID: id, InstanceUUID: guestUUID, Host: a.host, PCIAddress: a.parent, TypeID: typeID, Mode: mode}
}

// attach runs the commands of a new attachment and returns their last result.
func (a *labAgent) attach(at flow.Attachment) protocol.Result {
	a.t.Helper()
	now := time.Now()
	cmds, err := direct.AttachCommands(at, uuid.NewString(), now, now.Add(10*time.Minute))
	testsvc.Must(a.t, err, "attach commands")
	var r protocol.Result
	for _, c := range cmds {
		if r = a.do(c); r.Status != protocol.Succeeded {
			break
		}
	}
	return r
}

// release runs the commands that take an attachment back (detach, remove).
func (a *labAgent) release(at flow.Attachment) protocol.Result {
	a.t.Helper()
	now := time.Now()
	cmds, err := direct.ReleaseCommands(at, false, uuid.NewString(), now, now.Add(10*time.Minute))
	testsvc.Must(a.t, err, "release commands")
	var r protocol.Result
	for _, c := range cmds {
		if r = a.do(c); r.Status != protocol.Succeeded {
			break
		}
	}
	return r
}

// devState is where an mdev is: the guest's live and persistent domain
// XML, QEMU's PCI devices, the kernel.
type devState struct {
	Live, Config, Mdev bool
	QEMUMttys          int // PCI functions with mtty's vendor id in QMP query-pci
}

func mdevState(t *testing.T, id string) devState {
	t.Helper()
	out, err := vm(t, fmt.Sprintf(`v="virsh -c qemu:///system"
printf 'live=%%s\n' "$($v dumpxml %[1]s | grep -c "uuid='%[2]s'")"
printf 'config=%%s\n' "$($v dumpxml --inactive %[1]s | grep -c "uuid='%[2]s'")"
printf 'mdev=%%s\n' "$(test -e /sys/bus/mdev/devices/%[2]s && echo 1 || echo 0)"
printf 'qmp=%%s\n' "$($v qemu-monitor-command %[1]s '{"execute":"query-pci"}' 2>&1)"`, guestName, id))
	if err != nil && !strings.Contains(out, "qmp=") {
		t.Fatalf("reading the device's state: %v\n%s", err, out)
	}
	var s devState
	for _, l := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(l, "=")
		switch k {
		case "live":
			s.Live = v != "0"
		case "config":
			s.Config = v != "0"
		case "mdev":
			s.Mdev = v == "1"
		case "qmp":
			s.QEMUMttys = countDevice(t, v, mttyVendor, -1)
		}
	}
	return s
}

// countDevice counts the PCI functions of vendor and device (-1: any) in
// a query-pci answer (-1 when QEMU gave none: the domain does not run).
func countDevice(t *testing.T, qmp string, vendor, device int) int {
	var ans struct {
		Return []struct {
			Devices []struct {
				ID struct {
					Vendor int `json:"vendor"`
					Device int `json:"device"`
				} `json:"id"`
			} `json:"devices"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(qmp), &ans); err != nil {
		t.Logf("query-pci: %s", qmp)
		return -1
	}
	n := 0
	for _, b := range ans.Return {
		for _, d := range b.Devices {
			if d.ID.Vendor == vendor && (device < 0 || d.ID.Device == device) {
				n++
			}
		}
	}
	return n
}

// lastGuestPCI is the guest's latest "lab-guest: pci" line.
func lastGuestPCI(console string) string {
	m := regexp.MustCompile(`(?m)^lab-guest: pci (.*)$`).FindAllStringSubmatch(console, -1)
	if len(m) == 0 {
		return ""
	}
	return m[len(m)-1][1]
}

// poll asks check every 5 s until it says done, and fails the test with
// what check last saw once within has passed.
func poll(t *testing.T, within time.Duration, check func() (done bool, saw string)) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		done, saw := check()
		if done {
			return saw
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, saw)
		}
		time.Sleep(5 * time.Second)
	}
}

// waitGuestPCI waits until the guest's latest PCI listing has (or lacks) an
// mtty function.
func waitGuestPCI(t *testing.T, want bool, within time.Duration) {
	t.Helper()
	last := poll(t, within, func() (bool, string) {
		last := lastGuestPCI(guestConsole(t))
		return strings.Contains(last, mttyGuestID) == want,
			fmt.Sprintf("the guest's PCI functions: %s (want an mtty function: %v)", last, want)
	})
	t.Log(last)
}

// expectInGuest checks that at's mdev is attached everywhere it should be
// (live and persistent XML, the kernel, one mtty function in QEMU) and
// waits for the guest's kernel to list it.
func expectInGuest(t *testing.T, at flow.Attachment, when string) {
	t.Helper()
	if s := mdevState(t, at.ID.String()); !s.Live || !s.Config || !s.Mdev || s.QEMUMttys != 1 {
		t.Fatalf("%s: %+v, want live, config, mdev and one mtty function in QEMU", when, s)
	}
	waitGuestPCI(t, true, 5*time.Minute)
}

// releaseLeavesNothing releases at as the bridge does (detach_vgpu,
// remove_mdev) and checks that nothing is left, in the domain, QEMU, the
// kernel or the guest.
func (a *labAgent) releaseLeavesNothing(at flow.Attachment) {
	t := a.t
	t.Helper()
	if r := a.release(at); r.Status != protocol.Succeeded {
		t.Fatalf("release: %s %s %s", r.Status, r.Code, r.Message)
	}
	if s := mdevState(t, at.ID.String()); s.Live || s.Config || s.Mdev || s.QEMUMttys != 0 {
		t.Fatalf("after the release: %+v, want nothing left", s)
	}
	waitGuestPCI(t, false, 5*time.Minute)
}

// TestAgentLiveHotPlug: the bridge's commands for a direct-path attachment
// (attach_vgpu with the parent and type: create the mdev and attach it
// live) and its release (detach_vgpu, remove_mdev), signed and sent over
// RabbitMQ to vgpu-agent in the lab, hot-plug a real mdev of mtty_pci into
// the running nested guest through libvirtd and QEMU: the live and
// persistent domain XML, QEMU's PCI bus and the guest's kernel show it, and
// after the release nothing is left, neither in the domain nor in the kernel.
func TestAgentLiveHotPlug(t *testing.T) {
	startGuest(t)
	a := startLabAgent(t)
	at := a.attachment(uuid.New(), "mtty_pci-1", protocol.ModeLive)
	t.Cleanup(func() { cleanupMdev(t, at.ID.String()) })
	if r := a.attach(at); r.Status != protocol.Succeeded {
		t.Fatalf("attach: %s %s %s", r.Status, r.Code, r.Message)
	}
	expectInGuest(t, at, "after attach")
	a.releaseLeavesNothing(at)
}

// cleanupMdev takes a test's mdev out of the guest and the kernel when the
// test left it behind (a failure half-way). As the agent, it removes the
// mdev only once no running domain has it live: a remove while QEMU holds
// it waits in the kernel until the guest lets it go, and when that happens
// in the middle of libvirt's detach, libvirt leaves the device's
// /dev/vfio/<group> node, still labelled, in QEMU's mount namespace and
// refuses every later hot-plug into that guest of an mdev whose IOMMU group
// gets the same number ("Setting different DAC user or group on
// /dev/vfio/N which is already in use"), until the guest is restarted.
func cleanupMdev(t *testing.T, id string) {
	_, _ = vm(t, fmt.Sprintf(`v="virsh -c qemu:///system"
x="<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='%[2]s'/></source></hostdev>"
echo "$x" >/run/h.xml
if $v dumpxml %[1]s | grep -q "%[2]s"; then
  $v detach-device %[1]s /run/h.xml --live
  for i in $(seq 120); do $v dumpxml %[1]s | grep -q "%[2]s" || break; sleep 1; done
fi
if $v dumpxml --inactive %[1]s | grep -q "%[2]s"; then $v detach-device %[1]s /run/h.xml --config; fi
for d in $($v list --name); do
  if $v dumpxml "$d" | grep -q "%[2]s"; then echo "mdev %[2]s still in domain $d: not removed"; exit 0; fi
done
[ -e /sys/bus/mdev/devices/%[2]s ] && echo 1 >/sys/bus/mdev/devices/%[2]s/remove
true`, guestName, id))
}

// TestAgentRefusedAttachLeavesNoMdev: an attach_vgpu that QEMU refuses (a
// running domain whose root bus does not take hot-plugged devices) fails,
// and the mdev the agent created for it is removed again: nothing is left
// in the kernel or the domain.
func TestAgentRefusedAttachLeavesNoMdev(t *testing.T) {
	needLab(t)
	const name, id = "lab-nohotplug", "6c0d5a9e-8f3b-4d51-9a0e-1f2e3d4c5b02"
	// No kernel: the domain runs its firmware, which is all QEMU needs to
	// answer a hot-plug.
	out, err := vm(t, fmt.Sprintf(`set -e
v="virsh -c qemu:///system"
$v destroy %[1]s >/dev/null 2>&1 || true
$v undefine %[1]s >/dev/null 2>&1 || true
cat >/run/%[1]s.xml <<'XML'
<domain type='qemu'><name>%[1]s</name><uuid>%[2]s</uuid><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type></os>
<devices><controller type='pci' index='0' model='pci-root'><target hotplug='off'/></controller>
<memballoon model='none'/></devices></domain>
XML
$v define /run/%[1]s.xml >/dev/null
$v start %[1]s >/dev/null`, name, id))
	if err != nil {
		t.Fatalf("starting %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		vm(t, fmt.Sprintf("virsh -c qemu:///system destroy %[1]s; virsh -c qemu:///system undefine %[1]s", name))
	})
	a := startLabAgent(t)
	at := a.attachment(uuid.New(), "mtty_pci-1", protocol.ModeLive)
	at.InstanceUUID = id
	t.Cleanup(func() { cleanupMdev(t, at.ID.String()) })
	r := a.attach(at)
	if r.Status != protocol.Failed {
		t.Fatalf("attach to a domain without hot-plug: %s %s %s, want failed", r.Status, r.Code, r.Message)
	}
	out, err = vm(t, fmt.Sprintf(`test -e /sys/bus/mdev/devices/%[1]s && echo mdev=1 || echo mdev=0
virsh -c qemu:///system dumpxml %[2]s | grep -c "%[1]s" || true
virsh -c qemu:///system dumpxml --inactive %[2]s | grep -c "%[1]s" || true`, at.ID, name))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if f := strings.Fields(out); len(f) != 3 || f[0] != "mdev=0" || f[1] != "0" || f[2] != "0" {
		t.Errorf("after the refused attach: %q, want no mdev and no hostdev in the live or persistent domain", out)
	}
}

// TestAgentConfigAttachSurvivesRestart: attach_vgpu in mode config puts
// the new mdev in the domain's persistent definition only; after the guest
// is restarted QEMU has it. Released while the guest is off (detach in
// mode config, remove_mdev), nothing is left.
func TestAgentConfigAttachSurvivesRestart(t *testing.T) {
	startGuest(t)
	a := startLabAgent(t)
	at := a.attachment(uuid.New(), "mtty_pci-1", protocol.ModeConfig)
	t.Cleanup(func() { cleanupMdev(t, at.ID.String()) })
	if r := a.attach(at); r.Status != protocol.Succeeded {
		t.Fatalf("attach (config): %s %s %s", r.Status, r.Code, r.Message)
	}
	if s := mdevState(t, at.ID.String()); s.Live || !s.Config || !s.Mdev || s.QEMUMttys != 0 {
		t.Fatalf("after a config attach: %+v, want the mdev in the persistent definition only", s)
	}
	v := "virsh -c qemu:///system "
	if out, err := vm(t, v+"destroy "+guestName+" && "+v+"start "+guestName); err != nil {
		t.Fatalf("restarting the guest: %v\n%s", err, out)
	}
	if s := mdevState(t, at.ID.String()); !s.Live || !s.Config || !s.Mdev || s.QEMUMttys != 1 {
		t.Fatalf("after the restart: %+v, want the vGPU live and in QEMU", s)
	}
	if out, err := vm(t, v+"destroy "+guestName); err != nil {
		t.Fatalf("stopping the guest: %v\n%s", err, out)
	}
	if r := a.release(at); r.Status != protocol.Succeeded {
		t.Fatalf("release (config): %s %s %s", r.Status, r.Code, r.Message)
	}
	if s := mdevState(t, at.ID.String()); s.Live || s.Config || s.Mdev {
		t.Fatalf("after the release: %+v, want nothing left", s)
	}
	vm(t, v+"start "+guestName) // it boots again for the next test
}
