//go:build lab

package lab

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/direct"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// kernelMdev is an mdev as the lab's kernel has it.
type kernelMdev struct{ Parent, Type string }

// kernelMdevs lists every mdev of the lab's kernel by UUID.
func kernelMdevs(t *testing.T) map[string]kernelMdev {
	t.Helper()
	out, err := vm(t, `for d in /sys/bus/mdev/devices/*; do
  [ -e "$d" ] || continue
  r=$(readlink -f "$d")
  printf 'mdev %s %s %s\n' "${d##*/}" "$(basename "$(dirname "$r")")" "$(basename "$(readlink -f "$r/mdev_type")")"
done`)
	if err != nil {
		t.Fatalf("listing the kernel's mdevs: %v\n%s", err, out)
	}
	m := map[string]kernelMdev{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "mdev" {
			m[f[1]] = kernelMdev{Parent: f[2], Type: f[3]}
		}
	}
	return m
}

// mttyFunc is an mtty function on the guest's PCI bus as QEMU has it (QMP
// query-pci): its I/O BARs, one per serial port (1 for an mtty_pci-1 mdev,
// 2 for an mtty_pci-2 one), and how many of them the guest's kernel has
// given an address (QEMU answers -1 for a BAR the guest has not mapped).
type mttyFunc struct{ Ports, Mapped int }

func qemuMttys(t *testing.T) []mttyFunc {
	t.Helper()
	out, err := vm(t, fmt.Sprintf(`virsh -c qemu:///system qemu-monitor-command %s '{"execute":"query-pci"}'`, guestName))
	if err != nil {
		t.Fatalf("query-pci: %v\n%s", err, out)
	}
	var ans struct {
		Return []struct {
			Devices []struct {
				ID struct {
					Vendor int `json:"vendor"`
				} `json:"id"`
				Regions []struct {
					Type    string      `json:"type"`
					Address json.Number `json:"address"`
				} `json:"regions"`
			} `json:"devices"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(out), &ans); err != nil {
		t.Fatalf("query-pci answer: %v\n%s", err, out)
	}
	var fs []mttyFunc
	for _, b := range ans.Return {
		for _, d := range b.Devices {
			if d.ID.Vendor != mttyVendor {
				continue
			}
			var f mttyFunc
			for _, r := range d.Regions {
				if r.Type != "io" {
					continue
				}
				f.Ports++
				if a, err := r.Address.Int64(); err == nil && a > 0 {
					f.Mapped++
				}
			}
			fs = append(fs, f)
		}
	}
	return fs
}

// waitGuestMapped waits until the guest's kernel has mapped every I/O BAR
// of the one mtty function QEMU has: the guest enumerated the hot-added
// function. (The guest's own listing on its console can lag by minutes:
// its ACPI interpreter, emulated inside an emulated VM, hits its loop
// timeout in the hot-plug methods on a busy machine.)
func waitGuestMapped(t *testing.T, ports int, within time.Duration) {
	t.Helper()
	poll(t, within, func() (bool, string) {
		fs := qemuMttys(t)
		return len(fs) == 1 && fs[0].Ports == ports && fs[0].Mapped == ports,
			fmt.Sprintf("QEMU's mtty functions: %+v, want one with %d I/O BARs, all mapped by the guest", fs, ports)
	})
}

// TestAgentProfileChangeSwapsVGPU: a direct-path profile change as the
// bridge plans it (break before make: the old vGPU's detach_vgpu and
// remove_mdev, then the new one's attach_vgpu, in one request), signed and
// sent over RabbitMQ to vgpu-agent in the lab, swaps a live mtty_pci-1 vGPU
// on the first edu function of the running nested guest for an mtty_pci-2
// one on the second: afterwards the guest's live and persistent XML have
// only the new mdev, QEMU has one mtty function with the new type's two
// ports, the guest's kernel sees it, and the kernel has the new mdev only,
// on the other parent — no leftover.
//
// Before the swap, a remove_mdev of the attached mdev without its detach (a
// bridge that skipped a step) is refused with code in_use and leaves the
// guest's vGPU alone: the kernel would not refuse it, the write would wait
// for QEMU to let the device go, and the agent with it.
func TestAgentProfileChangeSwapsVGPU(t *testing.T) {
	startGuest(t)
	a := startLabAgent(t)
	if a.parent2 == "" {
		t.Fatalf("the lab has one mtty_pci parent (%s); tests/lab/lab.sh starts two edu functions", a.parent)
	}
	old := a.attachment(uuid.New(), "mtty_pci-1", protocol.ModeLive)
	t.Cleanup(func() { cleanupMdev(t, old.ID.String()) })
	if r := a.attach(old); r.Status != protocol.Succeeded {
		t.Fatalf("attach %s: %s %s %s", old.TypeID, r.Status, r.Code, r.Message)
	}
	if s := mdevState(t, old.ID.String()); !s.Live || !s.Config || !s.Mdev || s.QEMUMttys != 1 {
		t.Fatalf("after the attach: %+v, want live, config, mdev and one mtty function in QEMU", s)
	}
	waitGuestPCI(t, true, 5*time.Minute)

	now := time.Now()
	rm, err := pipeline.NewCommand(protocol.RemoveMdev, a.host, uuid.NewString(), guestUUID,
		protocol.MdevParams{MdevUUID: old.ID.String()}, now, now.Add(10*time.Minute))
	testsvc.Must(t, err, "remove_mdev")
	if r := a.do(rm); r.Status != protocol.Refused || r.Code != string(hosterr.InUse) || !strings.Contains(r.Message, guestUUID) {
		t.Fatalf("remove_mdev of an attached mdev: %s %s %q, want refused %s naming the guest", r.Status, r.Code, r.Message, hosterr.InUse)
	}
	if s := mdevState(t, old.ID.String()); !s.Live || !s.Config || !s.Mdev || s.QEMUMttys != 1 {
		t.Fatalf("after the refused remove: %+v, want the vGPU untouched", s)
	}

	// The profile change: one request, its commands in the plan's order.
	since := len(guestConsole(t))
	nu := a.attachment(uuid.New(), "mtty_pci-2", protocol.ModeLive)
	nu.PCIAddress = a.parent2
	t.Cleanup(func() { cleanupMdev(t, nu.ID.String()) })
	req := uuid.NewString()
	now = time.Now()
	cmds, err := direct.ReleaseCommands(old, false, req, now, now.Add(10*time.Minute))
	testsvc.Must(t, err, "release commands")
	attach, err := direct.AttachCommands(nu, req, now, now.Add(10*time.Minute))
	testsvc.Must(t, err, "attach commands")
	for _, c := range append(cmds, attach...) {
		if r := a.do(c); r.Status != protocol.Succeeded {
			t.Fatalf("profile change, %s: %s %s %s", c.Kind, r.Status, r.Code, r.Message)
		}
	}

	if s := mdevState(t, old.ID.String()); s.Live || s.Config || s.Mdev {
		t.Errorf("the old vGPU after the change: %+v, want it gone from the domain and the kernel", s)
	}
	if s := mdevState(t, nu.ID.String()); !s.Live || !s.Config || !s.Mdev || s.QEMUMttys != 1 {
		t.Errorf("the new vGPU after the change: %+v, want live, config, mdev and one mtty function in QEMU", s)
	}
	if fs := qemuMttys(t); len(fs) != 1 || fs[0].Ports != 2 {
		t.Errorf("QEMU's mtty functions: %+v, want one with two I/O BARs (mtty_pci-2)", fs)
	}
	want := map[string]kernelMdev{nu.ID.String(): {Parent: a.parent2, Type: "mtty_pci-2"}}
	if got := kernelMdevs(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the kernel's mdevs after the change: %v, want %v only", got, want)
	}
	waitGuestMapped(t, 2, 5*time.Minute)
	logGuestSwap(t, since)

	if r := a.release(nu); r.Status != protocol.Succeeded {
		t.Fatalf("release: %s %s %s", r.Status, r.Code, r.Message)
	}
	if got := kernelMdevs(t); len(got) != 0 {
		t.Errorf("the kernel's mdevs after the release: %v, want none", got)
	}
	waitGuestPCI(t, false, 5*time.Minute)
}

// logGuestSwap logs the guest's own listings of its PCI functions since
// offset since of its console (the old function gone, the new one there),
// or says that the guest has not listed them yet.
func logGuestSwap(t *testing.T, since int) {
	t.Helper()
	console := guestConsole(t)
	var lines []string
	if since <= len(console) {
		lines = guestPCILine.FindAllString(console[since:], -1)
	}
	gone := slices.IndexFunc(lines, func(l string) bool { return !strings.Contains(l, mttyGuestID) })
	if gone >= 0 && slices.ContainsFunc(lines[gone:], func(l string) bool { return strings.Contains(l, mttyGuestID) }) {
		t.Logf("the guest's PCI functions during the change:\n%s", strings.Join(lines, "\n"))
		return
	}
	t.Logf("the guest's console does not list the new function yet (its kernel mapped its BARs); since the change:\n%s",
		console[min(since, len(console)):])
}

var guestPCILine = regexp.MustCompile(`(?m)^lab-guest: pci .*$`)
