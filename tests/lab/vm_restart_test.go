//go:build lab

package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// restartLab powers the lab VM off (as a power cut: QEMU is killed) and
// boots it again, and returns how long that took.
func restartLab(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	for _, c := range []string{"down", "up"} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		out, err := exec.CommandContext(ctx, "bash", labScript, c).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("lab.sh %s: %v\n%s", c, err, out)
		}
	}
	return time.Since(start)
}

// unitProps reads properties of a systemd unit in the lab VM.
func unitProps(t *testing.T, unit string, props ...string) map[string]string {
	t.Helper()
	out, err := vm(t, "systemctl show "+unit+" -p "+strings.Join(props, ","))
	if err != nil {
		t.Fatalf("systemctl show %s: %v\n%s", unit, err, out)
	}
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// TestLabRestartRecreatesMdevsBeforeGuests: the reboot recovery for real.
// vgpu-agent attaches a new mtty_pci-1 mdev to a domain's persistent
// definition (mode config); the domain is set to autostart, the agent's
// journal is on the VM's disk (the lab's share) and its two packaged units
// (etc/systemd: vgpu-agent-restore.service, vgpu-agent.service, their
// ExecStart pointed at the lab's binary and configuration) are enabled.
// The VM is then powered off and booted again: the kernel has no mdev any
// more, and libvirtd autostarts the domain at its own start. The domain
// runs with the mdev in its live definition only if the mdev existed
// before libvirtd started it: vgpu-agent-restore.service recreated it from
// the journal (same UUID, parent and type) and had finished before
// libvirtd started, as systemd's timestamps show. vgpu-agent.service
// starts after libvirtd, and its first reports, which the bridge reads,
// list the mdev on its parent, of its type, owned by the agent and used by
// the domain. The packaged vgpu-agent-layout.service (no vf_layout here:
// it types nothing) is enabled too, with a nova-compute.service of the
// lab's (a oneshot: systemd orders units by name, and Nova's compute
// would take minutes to import under emulation at every boot): the
// timestamps show layout, then restore, done before nova-compute started.
func TestLabRestartRecreatesMdevsBeforeGuests(t *testing.T) {
	needLab(t)
	const name, domID = "lab-restart", "6c0d5a9e-8f3b-4d51-9a0e-1f2e3d4c5b03"
	share, vmShare := labEnv["LAB_SHARE_DIR"], labEnv["LAB_VM_SHARE_DIR"]
	seed := filepath.Join(share, "seed")
	host := testsvc.Name("lab") + ".lab.test"
	mdev := uuid.NewString()
	a := startLabAgentWith(t, agentOpts{host: host, statePath: vmShare + "/agents/" + host + "/state"})
	// Registered after the agent's cleanups, so run before them; in this
	// order: the agent, the domain, then its mdev (a remove while QEMU
	// holds it would wait in the kernel).
	t.Cleanup(func() {
		os.RemoveAll(seed) // the next boot is the lab's own again
		vm(t, fmt.Sprintf(`v="virsh -c qemu:///system"
systemctl stop vgpu-agent vgpu-agent-restore vgpu-agent-layout nova-compute 2>/dev/null
$v destroy %[1]s >/dev/null 2>&1; $v undefine %[1]s >/dev/null 2>&1
rm -rf /etc/systemd/system/vgpu-agent* /etc/systemd/system/lab.target.wants/vgpu-agent*
rm -f /etc/systemd/system/nova-compute.service /etc/systemd/system/lab.target.wants/nova-compute.service
systemctl daemon-reload; systemctl reset-failed 2>/dev/null
[ ! -e /sys/bus/mdev/devices/%[2]s ] || echo 1 >/sys/bus/mdev/devices/%[2]s/remove
true`, name, mdev))
	})
	a.units = append(a.units, "vgpu-agent-layout", "vgpu-agent-restore", "vgpu-agent")

	// The bridge's side of the agent's reports, from before the restart.
	q, err := a.ch.QueueDeclare("", false, true, true, false, nil)
	testsvc.Must(t, err, "declare report queue")
	testsvc.Must(t, a.ch.QueueBind(q.Name, protocol.ReportRoutingKey(a.host), protocol.Exchange, false, nil), "bind")
	reports, err := a.ch.Consume(q.Name, "", true, true, false, false, nil)
	testsvc.Must(t, err, "consume reports")

	out, err := vm(t, fmt.Sprintf(`set -e
v="virsh -c qemu:///system"
$v destroy %[1]s >/dev/null 2>&1 || true
$v undefine %[1]s >/dev/null 2>&1 || true
cat >/run/%[1]s.xml <<'XML'
<domain type='qemu'><name>%[1]s</name><uuid>%[2]s</uuid><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type></os>
<devices><memballoon model='none'/></devices></domain>
XML
$v define /run/%[1]s.xml >/dev/null`, name, domID))
	if err != nil {
		t.Fatalf("defining %s: %v\n%s", name, err, out)
	}
	at := a.attachment(uuid.MustParse(mdev), "mtty_pci-1", protocol.ModeConfig)
	at.InstanceUUID = domID
	if r := a.attach(at); r.Status != protocol.Succeeded {
		t.Fatalf("attach (config): %s %s %s", r.Status, r.Code, r.Message)
	}
	a.stop()

	// What the VM keeps across the restart: the domain (autostarted), the
	// agent's two units as packaged, enabled, with the lab's binary and
	// configuration. The journal is on the share already.
	unitDir := filepath.Join(seed, "etc", "systemd", "system")
	for _, u := range []string{"vgpu-agent.service", "vgpu-agent-restore.service", "vgpu-agent-layout.service"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "etc", "systemd", u))
		testsvc.Must(t, err, "read "+u)
		testsvc.Must(t, os.MkdirAll(filepath.Join(unitDir, u+".d"), 0o755), "mkdir")
		testsvc.Must(t, os.WriteFile(filepath.Join(unitDir, u), b, 0o644), "write "+u)
		sub := map[string]string{"vgpu-agent.service": "serve", "vgpu-agent-restore.service": "restore-devices",
			"vgpu-agent-layout.service": "layout apply"}[u]
		// systemd expands % specifiers in ExecStart.
		cmd := strings.ReplaceAll(a.bin+" "+sub+a.sets, "%", "%%")
		dropIn := fmt.Sprintf("[Service]\nExecStart=\nExecStart=%s\n# The journal and keys are on the lab's share.\nReadWritePaths=%s/agents\n",
			cmd, vmShare)
		testsvc.Must(t, os.WriteFile(filepath.Join(unitDir, u+".d", "lab.conf"), []byte(dropIn), 0o644), "drop-in")
		testsvc.Must(t, os.MkdirAll(filepath.Join(unitDir, "lab.target.wants"), 0o755), "mkdir")
		testsvc.Must(t, os.Symlink("/etc/systemd/system/"+u, filepath.Join(unitDir, "lab.target.wants", u)), "enable "+u)
	}
	const novaCompute = "[Unit]\nDescription=the lab's nova-compute (ordering only)\n" +
		"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n"
	testsvc.Must(t, os.WriteFile(filepath.Join(unitDir, "nova-compute.service"), []byte(novaCompute), 0o644), "nova-compute.service")
	testsvc.Must(t, os.Symlink("/etc/systemd/system/nova-compute.service", filepath.Join(unitDir, "lab.target.wants", "nova-compute.service")),
		"enable nova-compute.service")
	out, err = vm(t, fmt.Sprintf(`set -e
d=%[2]s/seed/etc/libvirt/qemu
mkdir -p $d/autostart
cp /etc/libvirt/qemu/%[1]s.xml $d/
ln -sf /etc/libvirt/qemu/%[1]s.xml $d/autostart/%[1]s.xml
grep -c "uuid='%[3]s'" $d/%[1]s.xml`, name, vmShare, mdev))
	if err != nil {
		t.Fatalf("keeping the domain for the restart: %v\n%s", err, out)
	}

	restarted := time.Now()
	took := restartLab(t)
	t.Logf("the lab VM restarted in %s", took.Round(time.Second))

	// The domain libvirtd autostarted runs, with the mdev.
	poll(t, 3*time.Minute, func() (bool, string) {
		out, _ := vm(t, "virsh -c qemu:///system domstate "+name)
		return strings.TrimSpace(out) == "running", "domstate " + name + ": " + out
	})
	out, err = vm(t, fmt.Sprintf(`virsh -c qemu:///system dumpxml %[1]s | grep -c "uuid='%[2]s'"`, name, mdev))
	if err != nil || strings.TrimSpace(out) != "1" {
		t.Errorf("the autostarted domain's live definition lacks mdev %s: %v %s", mdev, err, out)
	}
	if got, want := kernelMdevs(t)[mdev], (kernelMdev{Parent: a.parent, Type: "mtty_pci-1"}); got != want {
		t.Errorf("the kernel's mdev %s after the restart: %+v, want %+v", mdev, got, want)
	}

	// vgpu-agent-restore ran, recreated the mdev, and was done before
	// libvirtd started.
	rs := unitProps(t, "vgpu-agent-restore", "Result", "ActiveState", "ExecMainStatus", "ActiveEnterTimestampMonotonic")
	lv := unitProps(t, "libvirtd", "ExecMainStartTimestampMonotonic")
	if rs["Result"] != "success" || rs["ActiveState"] != "active" || rs["ExecMainStatus"] != "0" {
		t.Errorf("vgpu-agent-restore: %v, want it active (exited) with success", rs)
	}
	done, _ := strconv.ParseUint(rs["ActiveEnterTimestampMonotonic"], 10, 64)
	lvStart, _ := strconv.ParseUint(lv["ExecMainStartTimestampMonotonic"], 10, 64)
	if done == 0 || lvStart == 0 || done > lvStart {
		t.Errorf("vgpu-agent-restore done at %d µs, libvirtd started at %d µs (monotonic): want the restore first", done, lvStart)
	} else {
		t.Logf("vgpu-agent-restore done %.1f s before libvirtd started", float64(lvStart-done)/1e6)
	}
	// vgpu-agent-layout, then vgpu-agent-restore, done before nova-compute
	// started.
	ly := unitProps(t, "vgpu-agent-layout", "Result", "ActiveState", "ActiveEnterTimestampMonotonic")
	rsStart := unitProps(t, "vgpu-agent-restore", "ExecMainStartTimestampMonotonic")["ExecMainStartTimestampMonotonic"]
	nc := unitProps(t, "nova-compute", "ExecMainStartTimestampMonotonic")["ExecMainStartTimestampMonotonic"]
	if ly["Result"] != "success" || ly["ActiveState"] != "active" {
		t.Errorf("vgpu-agent-layout: %v, want it active (exited) with success", ly)
	}
	for _, o := range []struct {
		first, then       string
		firstAt, thenFrom string
	}{
		{"vgpu-agent-layout done", "vgpu-agent-restore started", ly["ActiveEnterTimestampMonotonic"], rsStart},
		{"vgpu-agent-layout done", "nova-compute started", ly["ActiveEnterTimestampMonotonic"], nc},
		{"vgpu-agent-restore done", "nova-compute started", rs["ActiveEnterTimestampMonotonic"], nc},
	} {
		a, _ := strconv.ParseUint(o.firstAt, 10, 64)
		b, _ := strconv.ParseUint(o.thenFrom, 10, 64)
		if a == 0 || b == 0 || a > b {
			t.Errorf("%s at %d µs, %s at %d µs (monotonic): want the first before the second", o.first, a, o.then, b)
		} else {
			t.Logf("%s %.2f s before %s", o.first, float64(b-a)/1e6, o.then)
		}
	}
	out, _ = vm(t, "journalctl -q -o cat -u vgpu-agent-restore")
	if !regexp.MustCompile(`(?m)^recreated +mdev:` + mdev + `$`).MatchString(out) {
		t.Errorf("vgpu-agent-restore's output does not say it recreated mdev %s:\n%s", mdev, out)
	}

	// vgpu-agent runs (after libvirtd) and its reports list the mdev as the
	// bridge needs it.
	poll(t, 5*time.Minute, func() (bool, string) {
		out, _ := vm(t, "systemctl is-active vgpu-agent")
		return strings.TrimSpace(out) == "active", "vgpu-agent: " + out
	})
	deadline := time.After(3 * time.Minute)
	var last string
	for {
		select {
		case d := <-reports:
			r, err := protocol.DecodeReport(d.Body)
			if err != nil {
				t.Fatalf("a report: %v", err)
			}
			if r.SentAt.Before(restarted) {
				continue
			}
			for _, g := range r.GPUs {
				for _, v := range g.Active {
					if v.MdevUUID == mdev {
						last = fmt.Sprintf("gpu %s: %+v", g.PCI, v)
						if g.PCI == a.parent && v.TypeID == "mtty_pci-1" && v.InstanceUUID == domID && v.Owner == "agent" {
							t.Logf("the agent's report after the restart: %s", last)
							return
						}
					}
				}
			}
		case <-deadline:
			t.Fatalf("no report after the restart lists mdev %s on %s, type mtty_pci-1, instance %s, owner agent (last seen: %s)",
				mdev, a.parent, domID, last)
		}
	}
}
