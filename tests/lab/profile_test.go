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

// qemuMttyPorts is, for each mtty function on the guest's PCI bus as QEMU
// has it (QMP query-pci), its number of I/O BARs: one per serial port, so
// 1 for an mtty_pci-1 mdev and 2 for an mtty_pci-2 one.
func qemuMttyPorts(t *testing.T) []int {
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
					Type string `json:"type"`
				} `json:"regions"`
			} `json:"devices"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(out), &ans); err != nil {
		t.Fatalf("query-pci answer: %v\n%s", err, out)
	}
	var ports []int
	for _, b := range ans.Return {
		for _, d := range b.Devices {
			if d.ID.Vendor != mttyVendor {
				continue
			}
			n := 0
			for _, r := range d.Regions {
				if r.Type == "io" {
					n++
				}
			}
			ports = append(ports, n)
		}
	}
	return ports
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
	cmds, err := pipeline.ReleaseCommands(old, false, req, now, now.Add(10*time.Minute))
	testsvc.Must(t, err, "release commands")
	attach, err := pipeline.AttachCommands(nu, req, now, now.Add(10*time.Minute))
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
	if p := qemuMttyPorts(t); !slices.Equal(p, []int{2}) {
		t.Errorf("QEMU's mtty functions have %v I/O BARs, want one function with two (mtty_pci-2)", p)
	}
	want := map[string]kernelMdev{nu.ID.String(): {Parent: a.parent2, Type: "mtty_pci-2"}}
	if got := kernelMdevs(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the kernel's mdevs after the change: %v, want %v only", got, want)
	}
	waitGuestSwap(t, since, 5*time.Minute)

	if r := a.release(nu); r.Status != protocol.Succeeded {
		t.Fatalf("release: %s %s %s", r.Status, r.Code, r.Message)
	}
	if got := kernelMdevs(t); len(got) != 0 {
		t.Errorf("the kernel's mdevs after the release: %v, want none", got)
	}
	waitGuestPCI(t, false, 5*time.Minute)
}

// waitGuestSwap waits until the guest's console, after offset since, shows
// its PCI functions without an mtty function and later with one again: the
// guest's kernel saw the old vGPU go and the new one come (both have
// mtty's vendor and device id).
func waitGuestSwap(t *testing.T, since int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
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
		if time.Now().After(deadline) {
			t.Fatalf("the guest's PCI functions during the change, after %s:\n%s\nwant the mtty function gone, then back", within,
				strings.Join(lines, "\n"))
		}
		time.Sleep(5 * time.Second)
	}
}

var guestPCILine = regexp.MustCompile(`(?m)^lab-guest: pci .*$`)
