//go:build lab

package lab

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The nested guest: a small domain that libvirtd inside the lab boots with
// its QEMU driver (TCG inside the TCG lab VM) from a small kernel built
// from Debian's linux-source-6.1 (tests/lab/guest-kernel.config: its
// drivers built in) and a busybox initramfs (tests/lab/guest-init), so
// that devices can be
// hot-plugged into a running domain as on a compute host. Its serial console
// is a file in the lab VM; the init writes "lab-guest: up" there once
// running and "lab-guest: pci ..." whenever the guest's PCI functions change.
const (
	guestName = "lab-guest"
	guestUUID = "6c0d5a9e-8f3b-4d51-9a0e-1f2e3d4c5b01"
	// guestSerial is the guest's console in the lab VM.
	guestSerial = "/var/lib/libvirt/qemu/lab-guest.serial"
	// guestBootWait bounds the nested boot (emulation inside emulation on
	// a shared machine).
	guestBootWait = 15 * time.Minute
)

// guestXML is the nested guest's domain: machine pc, so that hostdevs are
// hot-plugged onto the root bus through ACPI (the guest's acpiphp), as
// Nova's i440fx guests have them.
func guestXML(name, uuid string) string {
	return fmt.Sprintf(`<domain type='qemu'>
  <name>%s</name>
  <uuid>%s</uuid>
  <memory unit='MiB'>192</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>%s</kernel>
    <initrd>%s</initrd>
    <cmdline>console=ttyS0 rdinit=/init quiet panic=-1 mitigations=off</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <serial type='file'><source path='%s'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>`, name, uuid, labEnv["LAB_GUEST_KERNEL"], labEnv["LAB_GUEST_INITRD"], guestSerial)
}

// startGuest defines the nested guest (from scratch: no hostdev left by an
// earlier run) and starts it when it does not run, then waits until its init
// reports. It returns how long the boot took (0 when it ran already).
func startGuest(t *testing.T) time.Duration {
	t.Helper()
	needLab(t)
	if labEnv["LAB_GUEST_KERNEL"] == "" || labEnv["LAB_GUEST_INITRD"] == "" {
		t.Fatalf("lab.sh env names no guest kernel and initramfs: %v", labEnv)
	}
	out, err := vm(t, fmt.Sprintf(`set -e
if [ "$(virsh -c qemu:///system domstate %[1]s 2>/dev/null)" = running ]; then
  grep -q 'lab-guest: up' %[2]s && echo state=running || echo state=booting
  exit 0
fi
virsh -c qemu:///system destroy %[1]s >/dev/null 2>&1 || true
virsh -c qemu:///system undefine %[1]s >/dev/null 2>&1 || true
rm -f %[2]s
cat >/run/%[1]s.xml <<'XML'
%[3]s
XML
virsh -c qemu:///system define /run/%[1]s.xml >/dev/null
virsh -c qemu:///system start %[1]s >/dev/null
echo state=started`, guestName, guestSerial, guestXML(guestName, guestUUID)))
	if err != nil {
		t.Fatalf("defining and starting the nested guest: %v\n%s", err, out)
	}
	if strings.Contains(out, "state=running") {
		return 0
	}
	// started now, or earlier and still booting
	start := time.Now()
	waitSerial(t, regexp.MustCompile(`lab-guest: up`), guestBootWait)
	return time.Since(start)
}

// guestConsole returns the nested guest's serial console so far.
func guestConsole(t *testing.T) string {
	t.Helper()
	out, err := vm(t, "cat "+guestSerial)
	if err != nil {
		t.Fatalf("reading the guest's console: %v\n%s", err, out)
	}
	return out
}

// waitSerial waits until the guest's console matches re (the guest's init
// reports in its own time: there is no event to wait on from here).
func waitSerial(t *testing.T, re *regexp.Regexp, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, err := vm(t, fmt.Sprintf(`for i in $(seq 60); do grep -qE '%s' %s 2>/dev/null && break; sleep 1; done; cat %[2]s`,
			re.String(), guestSerial))
		if err == nil && re.MatchString(out) {
			return out
		}
		if time.Now().After(deadline) {
			st, _ := vm(t, "virsh -c qemu:///system domstate "+guestName+"; tail -n 20 /var/log/libvirt/qemu/"+guestName+".log")
			t.Fatalf("the guest's console did not show %q within %s:\n%s\ndomain: %s", re, within, out, st)
		}
	}
}

// TestNestedGuestBoots: libvirtd in the lab boots the nested guest with its
// QEMU driver and the guest's init runs and lists its PCI functions. A
// guest that runs already (the lab keeps it between runs) is not booted
// again; the guest's own boot time (kernel start to init) is logged.
func TestNestedGuestBoots(t *testing.T) {
	took := startGuest(t)
	console := waitSerial(t, regexp.MustCompile(`lab-guest: pci [0-9a-f]{4}:`), 5*time.Minute)
	if took > 0 {
		t.Logf("waited %s for the guest's init (from its start when this test started it)", took.Round(time.Second))
	}
	if m := regexp.MustCompile(`lab-guest: up after (\S+)s`).FindStringSubmatch(console); m != nil {
		t.Logf("the guest's kernel reached init after %ss", m[1])
	}
	out, err := vm(t, "virsh -c qemu:///system domstate "+guestName)
	if err != nil || !strings.Contains(out, "running") {
		t.Fatalf("domstate: %v\n%s", err, out)
	}
}
