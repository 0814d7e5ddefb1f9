//go:build lab

package lab

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
)

// TestSystemdIsInit: the VM runs systemd as PID 1 and its boot ends in
// "running" or "degraded" (the failed units, if any, are logged).
func TestSystemdIsInit(t *testing.T) {
	needLab(t)
	out, err := vm(t, `printf 'pid1=%s\n' "$(cat /proc/1/comm)"
printf 'state=%s\n' "$(systemctl is-system-running --wait)"
printf 'failed=%s\n' "$(systemctl list-units --failed --plain --no-legend | awk '{printf "%s ", $1}')"
printf 'libvirtd=%s\n' "$(systemctl is-active libvirtd)"`)
	if err != nil && !strings.Contains(out, "state=") {
		t.Fatalf("%v\n%s", err, out)
	}
	kv := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			kv[k] = strings.TrimSpace(v)
		}
	}
	if kv["pid1"] != "systemd" {
		t.Errorf("PID 1 is %q, want systemd", kv["pid1"])
	}
	switch kv["state"] {
	case "running":
	case "degraded":
		t.Logf("systemd: degraded; failed units: %s", kv["failed"])
	default:
		t.Errorf("systemctl is-system-running: %q, want running or degraded (failed units: %s)", kv["state"], kv["failed"])
	}
	if kv["libvirtd"] != "active" {
		t.Errorf("libvirtd is %q, want active", kv["libvirtd"])
	}
}

// TestMdevTypesAndLibvirt: the sample drivers' types are in the VM's real
// sysfs — mtty and mdpy on their virtual parents, mtty_pci on the emulated
// PCI function — and libvirt lists the PCI parent with mdev_types.
func TestMdevTypesAndLibvirt(t *testing.T) {
	needLab(t)
	out, err := vm(t, `cd /sys/class/mdev_bus && for p in *; do for ty in "$p"/mdev_supported_types/*; do
  printf 'type %s %s api=%s avail=%s\n' "$p" "${ty##*/}" "$(cat $ty/device_api)" "$(cat $ty/available_instances)"
done; done
virsh -c qemu:///system nodedev-list --cap mdev_types | sed 's/^/nodedev /'`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s", out)
	var types, nodedevs []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[0] == "type":
			types = append(types, f[1]+"/"+f[2])
		case len(f) == 2 && f[0] == "nodedev":
			nodedevs = append(nodedevs, f[1])
		}
	}
	var pciParent string
	for _, want := range []string{"mtty/mtty-1", "mtty/mtty-2", "mdpy/mdpy-vga", "mdpy/mdpy-xga", "mdpy/mdpy-hd"} {
		if !slices.Contains(types, want) {
			t.Errorf("mdev type %s missing from /sys/class/mdev_bus", want)
		}
	}
	for _, ty := range types {
		if p, id, _ := strings.Cut(ty, "/"); id == "mtty_pci-1" {
			pciParent = p
		}
	}
	if pciParent == "" {
		t.Fatalf("no PCI parent with type mtty_pci-1 (edu device, mtty_pci module): types %v", types)
	}
	a, err := pci.Parse(pciParent)
	if err != nil {
		t.Fatalf("mtty_pci's parent %q is not a PCI address: %v", pciParent, err)
	}
	want := "pci_" + strings.NewReplacer(":", "_", ".", "_").Replace(a.String())
	if !slices.Contains(nodedevs, want) {
		t.Errorf("virsh nodedev-list --cap mdev_types: %v, want %s among them", nodedevs, want)
	}
}

// TestAgentSysfsMdevLifecycle: the agent's sysfs driver (agent/sysfs, the
// code vgpu-agent runs) lists the PCI mdev parent, creates an mdev of
// mtty_pci-1 by writing the real create file, sees it, is refused a second
// one with the same UUID and one of an unknown type, and removes it.
func TestAgentSysfsMdevLifecycle(t *testing.T) {
	if !inVM {
		runInVM(t, t.Name())
		return
	}
	ctx := context.Background()
	h := sysfs.New("/sys")
	parents, err := h.MdevParents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var parent sysfs.Parent
	for _, p := range parents {
		if p.VendorID == "0x1234" && p.DeviceID == "0x11e8" {
			parent = p
		}
	}
	if parent.Driver != "mtty_pci" {
		t.Fatalf("no edu parent bound to mtty_pci among %+v", parents)
	}
	t.Logf("parent %+v", parent)
	types, err := h.Types(ctx, parent.Addr)
	if err != nil {
		t.Fatal(err)
	}
	before := -1
	for _, ty := range types {
		if ty.ID == "mtty_pci-1" {
			before = ty.AvailableInstances
			if ty.DeviceAPI != "vfio-pci" {
				t.Errorf("device_api %q, want vfio-pci", ty.DeviceAPI)
			}
		}
	}
	if before <= 0 {
		t.Fatalf("mtty_pci-1: available_instances %d in %+v", before, types)
	}
	id := newUUID(t)
	if err := h.CreateMdev(ctx, parent.Addr, "mtty_pci-1", id); err != nil {
		t.Fatalf("create: %v", err)
	}
	removed := false
	t.Cleanup(func() {
		if !removed {
			_ = h.RemoveMdev(ctx, id)
		}
	})
	m, err := h.Mdev(ctx, id)
	if err != nil {
		t.Fatalf("the kernel has no mdev %s after create: %v", id, err)
	}
	if m.Parent != parent.Addr || m.Type != "mtty_pci-1" {
		t.Errorf("mdev %+v, want parent %s type mtty_pci-1", m, parent.Addr)
	}
	if _, err := os.Stat(filepath.Join("/sys/bus/mdev/devices", id, "iommu_group")); err != nil {
		t.Errorf("mdev has no iommu_group: %v", err)
	}
	if err := h.CreateMdev(ctx, parent.Addr, "mtty_pci-1", id); !hosterr.Is(err, hosterr.Exists) {
		t.Errorf("second create with the same UUID: %v, want code %s", err, hosterr.Exists)
	}
	if err := h.CreateMdev(ctx, parent.Addr, "mtty_pci-9", newUUID(t)); !hosterr.Is(err, hosterr.NotFound) {
		t.Errorf("create of an unknown type: %v, want code %s", err, hosterr.NotFound)
	}
	types, err = h.Types(ctx, parent.Addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, ty := range types {
		if ty.ID == "mtty_pci-1" {
			if ty.AvailableInstances != before-1 {
				t.Errorf("available_instances %d with one mdev, want %d", ty.AvailableInstances, before-1)
			}
			if !slices.Contains(ty.Devices, id) {
				t.Errorf("type's devices %v lack %s", ty.Devices, id)
			}
		}
	}
	if err := h.RemoveMdev(ctx, id); err != nil {
		t.Fatalf("remove: %v", err)
	}
	removed = true
	if _, err := h.Mdev(ctx, id); !hosterr.Is(err, hosterr.NotFound) {
		t.Errorf("mdev after remove: %v, want code %s", err, hosterr.NotFound)
	}
	if err := h.RemoveMdev(ctx, id); !hosterr.Is(err, hosterr.NotFound) {
		t.Errorf("second remove: %v, want code %s", err, hosterr.NotFound)
	}
}

func newUUID(t *testing.T) string {
	t.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
