//go:build lab

package lab

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// The vendor-VFIO stand-in. On a host with NVIDIA's vendor-specific VFIO
// (no mdev) a vGPU is an SR-IOV VF: the agent writes the vGPU type to the
// VF's nvidia/current_vgpu_type and hands the VF, bound to a VFIO driver,
// to QEMU as a PCI hostdev. In the lab a VF is QEMU's pci-testdev
// (tests/lab/lab.sh starts two, at 00:12.0 and 00:13.0 of the lab VM,
// behind the emulated intel-iommu; the lab's lab-vfio.service binds them
// to vfio-pci at boot), which no driver of the lab's kernel claims. What
// the kernel, VFIO, libvirtd and QEMU do with it is real; NVIDIA's files
// are not there, so the agent reads a sysfs root of its own (labVFSysfs)
// that is the VM's /sys plus plain files standing in for
// nvidia/creatable_vgpu_types and nvidia/current_vgpu_type of each stand-in
// function: writing current_vgpu_type changes the file and nothing else.
const (
	vfVendor  = 0x1b36
	vfDevice  = 0x0005
	vfGuestID = "0x1b36:0x0005" // as the nested guest's init lists it
	// vfTypeID is the simulated vGPU type (an H200's, as NVIDIA's driver
	// lists it in creatable_vgpu_types).
	vfTypeID   = "1428"
	vfTypeName = "NVIDIA H200X-141C"
)

// labVFs returns the lab's vendor-VFIO stand-ins (tests/lab/lab.sh starts
// two) and fails t unless each is bound to vfio-pci in an IOMMU group of
// its own.
func labVFs(t *testing.T) []pci.Addr {
	t.Helper()
	out, err := vm(t, fmt.Sprintf(`for d in /sys/bus/pci/devices/*; do
  [ "$(cat $d/vendor):$(cat $d/device)" = "0x%04x:0x%04x" ] || continue
  g=$(readlink -f $d/iommu_group)
  printf 'vf %%s driver=%%s group=%%s members=%%s\n' "${d##*/}" "$(basename "$(readlink -f $d/driver)")" "${g##*/}" "$(ls $g/devices | wc -l)"
done`, vfVendor, vfDevice))
	if err != nil {
		t.Fatalf("looking for the vendor-VFIO stand-ins: %v\n%s", err, out)
	}
	var vfs []pci.Addr
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 5 || f[0] != "vf" {
			continue
		}
		t.Logf("vendor-VFIO stand-in: %s", strings.Join(f[1:], " "))
		if f[2] != "driver=vfio-pci" || f[4] != "members=1" || f[3] == "group=" {
			t.Fatalf("the stand-in VF is not bound to vfio-pci alone in an IOMMU group: %s", strings.Join(f[1:], " "))
		}
		a, err := pci.Parse(f[1])
		if err != nil {
			t.Fatal(err)
		}
		vfs = append(vfs, a)
	}
	if len(vfs) == 0 {
		t.Fatalf("no pci-testdev (%04x:%04x) in the lab VM (tests/lab/lab.sh starts them): %s", vfVendor, vfDevice, out)
	}
	return vfs
}

// labVF returns the lab's first vendor-VFIO stand-in.
func labVF(t *testing.T) pci.Addr {
	t.Helper()
	return labVFs(t)[0]
}

// standInVF is a VF of the agent's sysfs root: a real function of the lab
// VM, the types its creatable_vgpu_types lists and, when pf is set, its
// physfn: the PF is a name only (no directory, as no PF of this kind is
// in the lab), which is all the agent reads of it to group VFs by GPU.
type standInVF struct {
	addr  pci.Addr
	pf    string
	types []sysfs.VFType
}

// labVFSysfs makes the agent's sysfs root for the test's host in the lab
// VM and returns its path: the VM's /sys, seen through symbolic links
// (class, kernel, module, bus/mdev, each PCI function of bus/pci/devices
// to its real directory), except each stand-in VF, whose directory holds
// links to each of its real attributes (the targets of its own links, such
// as driver and iommu_group, resolved, so that their names read as in
// /sys), its physfn link and a directory nvidia with the two simulated
// files: creatable_vgpu_types listing its types, current_vgpu_type 0.
func labVFSysfs(t *testing.T, host string, vfs ...standInVF) string {
	t.Helper()
	root := "/run/vgpu-lab-sys/" + host
	var b strings.Builder
	fmt.Fprintf(&b, `set -e
r=%s
rm -rf "$r"
mkdir -p "$r/bus/pci/devices"
for d in class kernel module; do ln -s /sys/$d "$r/$d"; done
ln -s /sys/bus/mdev "$r/bus/mdev"
for d in /sys/bus/pci/devices/*; do
  case " %s " in *" ${d##*/} "*) continue;; esac
  ln -s "$(readlink -f "$d")" "$r/bus/pci/devices/${d##*/}"
done
`, root, strings.Join(func() []string {
		var a []string
		for _, vf := range vfs {
			a = append(a, vf.addr.String())
		}
		return a
	}(), " "))
	for _, vf := range vfs {
		fmt.Fprintf(&b, `v=$r/bus/pci/devices/%[1]s
mkdir "$v"
for e in /sys/bus/pci/devices/%[1]s/*; do
  if [ -L "$e" ]; then ln -s "$(readlink -f "$e")" "$v/${e##*/}"; else ln -s "$e" "$v/${e##*/}"; fi
done
mkdir "$v/nvidia"
printf '%%s' '%[2]s' >"$v/nvidia/creatable_vgpu_types"
echo 0 >"$v/nvidia/current_vgpu_type"
`, vf.addr, sysfs.FormatCreatableTypes(vf.types))
		if vf.pf != "" {
			fmt.Fprintf(&b, "ln -s ../%s \"$v/physfn\"\n", vf.pf)
		}
	}
	out, err := vm(t, b.String())
	if err != nil {
		t.Fatalf("making the agent's sysfs root: %v\n%s", err, out)
	}
	t.Cleanup(func() { vm(t, "rm -rf "+root) })
	return root
}

// vfState is where the stand-in VF is: the guest's live and persistent
// domain XML, QEMU's PCI devices, the simulated current_vgpu_type and the
// driver the lab's kernel has bound it to.
type vfState struct {
	Live, Config bool
	QEMU         int // functions with the VF's vendor and device id in QMP query-pci
	Type         string
	Driver       string
}

func vfStateOf(t *testing.T, root string, vf pci.Addr) vfState {
	t.Helper()
	return vfStateIn(t, guestName, root, vf)
}

// vfStateIn is vfStateOf for the VF and the domain named domain.
func vfStateIn(t *testing.T, domain, root string, vf pci.Addr) vfState {
	t.Helper()
	src := fmt.Sprintf("<address domain='0x%04x' bus='0x%02x' slot='0x%02x' function='0x%x'/>", vf.Domain, vf.Bus, vf.Slot, vf.Func)
	out, err := vm(t, fmt.Sprintf(`v="virsh -c qemu:///system"
printf 'live=%%s\n' "$($v dumpxml %[1]s | grep -cF "%[2]s")"
printf 'config=%%s\n' "$($v dumpxml --inactive %[1]s | grep -cF "%[2]s")"
printf 'type=%%s\n' "$(cat %[3]s/bus/pci/devices/%[4]s/nvidia/current_vgpu_type)"
printf 'driver=%%s\n' "$(basename "$(readlink -f /sys/bus/pci/devices/%[4]s/driver)")"
printf 'qmp=%%s\n' "$($v qemu-monitor-command %[1]s '{"execute":"query-pci"}' 2>&1)"`, domain, src, root, vf))
	if err != nil && !strings.Contains(out, "qmp=") {
		t.Fatalf("reading the VF's state: %v\n%s", err, out)
	}
	var s vfState
	for _, l := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(l, "=")
		switch k {
		case "live":
			s.Live = v != "0"
		case "config":
			s.Config = v != "0"
		case "type":
			s.Type = v
		case "driver":
			s.Driver = v
		case "qmp":
			s.QEMU = countDevice(t, v, vfVendor, vfDevice)
		}
	}
	return s
}

// waitGuestHas waits until the guest's latest PCI listing has (or lacks)
// a function with id (vendor:device as its init lists it).
func waitGuestHas(t *testing.T, id string, want bool, within time.Duration) {
	t.Helper()
	last := poll(t, within, func() (bool, string) {
		last := lastGuestPCI(guestConsole(t))
		return strings.Contains(last, id) == want,
			fmt.Sprintf("the guest's PCI functions: %s (want %s: %v)", last, id, want)
	})
	t.Log(last)
}

// cleanupVF takes the VF out of the guest's live and persistent
// definitions when a test left it there.
func cleanupVF(t *testing.T, vf pci.Addr) {
	x := fmt.Sprintf("<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x%04x' bus='0x%02x' slot='0x%02x' function='0x%x'/></source></hostdev>",
		vf.Domain, vf.Bus, vf.Slot, vf.Func)
	src := x[strings.Index(x, "<address"):strings.Index(x, "</source>")]
	_, _ = vm(t, fmt.Sprintf(`v="virsh -c qemu:///system"
echo "%[2]s" >/run/vf.xml
if $v dumpxml %[1]s | grep -qF "%[3]s"; then
  $v detach-device %[1]s /run/vf.xml --live
  for i in $(seq 120); do $v dumpxml %[1]s | grep -qF "%[3]s" || break; sleep 1; done
fi
if $v dumpxml --inactive %[1]s | grep -qF "%[3]s"; then $v detach-device %[1]s /run/vf.xml --config; fi
true`, guestName, x, src))
}

// TestAgentVendorVFIOHotPlug: the vendor-VFIO path for real. The bridge's
// attach_vgpu of a vendor-VFIO vGPU (vendor_vfio, the VF as parent_pci, a
// numeric type), signed and sent over RabbitMQ to vgpu-agent in the lab,
// sets the VF's vGPU type (the simulated current_vgpu_type) and hot-plugs
// the VF — a PCI function bound to vfio-pci behind the lab's emulated
// IOMMU — into the running nested guest through libvirtd and QEMU: the
// live and persistent domain XML have the PCI hostdev, QEMU's query-pci
// has the function (VFIO passes its ids through) and the guest's kernel
// lists it. Its release (detach_vgpu, then remove_mdev with vendor_vfio:
// clear the type) leaves nothing: not in the domain, not in QEMU, not in
// the guest, and the type is 0 again.
func TestAgentVendorVFIOHotPlug(t *testing.T) {
	startGuest(t)
	vf := labVF(t)
	host := testsvc.Name("lab") + ".lab.test"
	root := labVFSysfs(t, host, standInVF{addr: vf, types: []sysfs.VFType{{ID: vfTypeID, Name: vfTypeName}}})
	a := startLabAgentWith(t, agentOpts{
		host: host,
		conf: "[devices]\nenabled_types = " + vfTypeID + "\n",
		sets: []string{"sysfs.root=" + root},
	})
	t.Cleanup(func() { cleanupVF(t, vf) })
	if s := vfStateOf(t, root, vf); s.Live || s.Config || s.QEMU != 0 || s.Type != "0" {
		t.Fatalf("before the attach: %+v, want the VF in no definition, not in QEMU, type 0", s)
	}

	req := uuid.NewString()
	now := time.Now()
	attach, err := pipeline.NewCommand(protocol.AttachVGPU, a.host, req, guestUUID,
		protocol.AttachParams{ParentPCI: vf.String(), TypeID: vfTypeID, VendorVFIO: true, Mode: protocol.ModeLive},
		now, now.Add(10*time.Minute))
	testsvc.Must(t, err, "attach_vgpu")
	if r := a.do(attach); r.Status != protocol.Succeeded {
		t.Fatalf("attach_vgpu (vendor VFIO): %s %s %s", r.Status, r.Code, r.Message)
	}
	if s := vfStateOf(t, root, vf); !s.Live || !s.Config || s.QEMU != 1 || s.Type != vfTypeID {
		t.Fatalf("after the attach: %+v, want live, config, one function in QEMU, type %s", s, vfTypeID)
	}
	waitGuestHas(t, vfGuestID, true, 5*time.Minute)

	now = time.Now()
	detach, err := pipeline.NewCommand(protocol.DetachVGPU, a.host, req, guestUUID,
		protocol.AttachParams{ParentPCI: vf.String(), VendorVFIO: true, Mode: protocol.ModeLive}, now, now.Add(10*time.Minute))
	testsvc.Must(t, err, "detach_vgpu")
	clearType, err := pipeline.NewCommand(protocol.RemoveMdev, a.host, req, guestUUID,
		protocol.MdevParams{ParentPCI: vf.String(), VendorVFIO: true}, now, now.Add(10*time.Minute))
	testsvc.Must(t, err, "remove_mdev")
	for _, c := range []protocol.Command{detach, clearType} {
		if r := a.do(c); r.Status != protocol.Succeeded {
			t.Fatalf("release, %s (vendor VFIO): %s %s %s", c.Kind, r.Status, r.Code, r.Message)
		}
	}
	s := vfStateOf(t, root, vf)
	if s.Live || s.Config || s.QEMU != 0 || s.Type != "0" {
		t.Fatalf("after the release: %+v, want nothing left and type 0", s)
	}
	// libvirt (managed='yes') gives the function back to the driver the
	// host bound it to: the VF is ready for the next attach.
	if s.Driver != "vfio-pci" {
		t.Errorf("the VF's driver after the release: %q, want vfio-pci as before the attach", s.Driver)
	}
	waitGuestHas(t, vfGuestID, false, 5*time.Minute)
}
