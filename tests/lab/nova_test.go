//go:build lab

package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Nova's own libvirt driver in the lab: nova-api, nova-conductor and
// nova-scheduler run on this machine (tests/novaharness: Debian's
// python3-nova 26, noauth2, the shared Placement), and one nova-compute
// runs inside the lab VM with compute_driver = libvirt.LibvirtDriver,
// virt_type = qemu and [devices] enabled_mdev_types naming a type of the
// mtty_pci sample driver, whose mdev parents are the VM's emulated edu PCI
// functions (so that libvirt lists them as pci_0000_00_1x_0 with
// mdev_types, the only parents Nova 26's driver handles). The compute
// reaches RabbitMQ and Placement at 10.0.2.2 (this machine's loopback
// through QEMU's user networking). Its images come from Nova's own
// GlanceFixture, given the nested guest's kernel and initramfs
// (launcher.py's NOVATEST_IMAGES): a server boots them as an AMI-style
// image (kernel_id, ramdisk_id, os_command_line) with no network.
const (
	// labNovaHost is the lab compute's host and its hypervisor's node name
	// (the VM's hostname), so its compute node provider is named so.
	labNovaHost = "lab"
	// labNovaType is the mdev type Nova offers: mtty_pci's dual-port
	// serial device.
	labNovaType = "mtty_pci-2"
	// labNovaUnit is the transient systemd unit nova-compute runs as.
	labNovaUnit = "vgpu-lab-nova-compute"
	// labNovaState is nova-compute's state_path in the VM.
	labNovaState = "/var/lib/vgpu-lab-nova"
	// labNovaStart bounds nova-compute's start (importing Nova under
	// emulation reads thousands of files over 9p: minutes on a busy
	// machine) until its providers are in Placement.
	labNovaStart = 15 * time.Minute
	// labNovaOp bounds one server operation through the lab's compute.
	labNovaOp = 10 * time.Minute
)

// labNova is a Nova whose one compute host is the lab VM.
type labNova struct {
	*novaharness.Nova
	disk  string // the image to boot servers from
	vmDir string // the run's directory as the VM sees it
}

// startLabNova starts Nova on this machine and its compute in the lab VM,
// and waits until the compute's provider tree is in Placement. Cleanup
// stops the compute, deletes what Nova left in the VM (domains, mdevs)
// and closes Nova.
func startLabNova(t *testing.T) *labNova {
	t.Helper()
	needLab(t)
	share, vmShare := labEnv["LAB_SHARE_DIR"], labEnv["LAB_VM_SHARE_DIR"]
	kernel, initrd := labEnv["LAB_GUEST_KERNEL"], labEnv["LAB_GUEST_INITRD"]
	if share == "" || vmShare == "" || kernel == "" || initrd == "" {
		t.Fatalf("lab.sh env lacks the share or the guest's kernel and initramfs: %v", labEnv)
	}
	name := fmt.Sprintf("nova-%d", time.Now().UnixNano())
	dir := filepath.Join(share, name)
	if err := os.MkdirAll(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The root disk: a megabyte of zeros (the guest runs from its
	// initramfs); Nova converts and layers it with qemu-img.
	disk := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	const kernelID, ramdiskID, diskID = "6b1d7c1e-0a4f-4f57-9a1e-6c0000000001", "6b1d7c1e-0a4f-4f57-9a1e-6c0000000002", "6b1d7c1e-0a4f-4f57-9a1e-6c0000000003"
	images := []map[string]any{
		{"id": kernelID, "name": "lab-guest-kernel", "disk_format": "aki", "container_format": "aki", "file": kernel},
		{"id": ramdiskID, "name": "lab-guest-initramfs", "disk_format": "ari", "container_format": "ari", "file": initrd},
		{"id": diskID, "name": "lab-guest", "disk_format": "raw", "container_format": "bare", "file": disk,
			"properties": map[string]any{"kernel_id": kernelID, "ramdisk_id": ramdiskID, "architecture": "x86_64",
				"hw_machine_type": "pc", "os_command_line": "console=ttyS0 rdinit=/init quiet panic=-1 mitigations=off"}},
	}
	b, err := json.Marshal(images)
	if err != nil {
		t.Fatal(err)
	}
	imagesFile := filepath.Join(dir, "images.json")
	if err := os.WriteFile(imagesFile, b, 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	n, err := novaharness.New(ctx, novaharness.Options{LogDir: filepath.Join(dir, "run"), ImagesFile: imagesFile})
	if err != nil {
		t.Fatalf("start Nova: %v", err)
	}
	ln := &labNova{Nova: n, disk: diskID, vmDir: filepath.Join(vmShare, name)}
	t.Cleanup(func() { ln.close(t) })
	t.Logf("Nova's services on this machine started in %s (%s)", n.StartupTime().Round(time.Second), n.StartupPhases())

	rc, err := n.AddRemoteHost(labNovaHost, "10.0.2.2")
	if err != nil {
		t.Fatal(err)
	}
	conf := rc.Config + fmt.Sprintf(`[DEFAULT]
compute_driver = libvirt.LibvirtDriver
state_path = %[1]s
instances_path = %[1]s/instances
# The nested guest runs no ACPI daemon: a clean shutdown before a resize
# would wait the whole timeout (60 s) before Nova destroys the guest.
shutdown_timeout = 0
[oslo_concurrency]
lock_path = %[1]s/lock
[libvirt]
virt_type = qemu
cpu_mode = none
[workarounds]
# Debian's python3-nova without nova-common has no rootwrap.conf; nova-compute
# runs as root here, and privsep's helper starts through sudo alone.
disable_rootwrap = true
[devices]
enabled_mdev_types = %[2]s
`, labNovaState, labNovaType)
	if err := os.WriteFile(filepath.Join(dir, "run", "lab-compute.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	vmRun := filepath.Join(ln.vmDir, "run")
	start := time.Now()
	// Nova 26's driver takes every device libvirt lists with mdev_types
	// for a PCI one (_get_mdev_capabilities_for_dev reads its
	// pci_capability): the plain mtty sample's virtual parent, which
	// libvirt 9.0 lists as mtty_mtty without one, makes its resource
	// update fail (AttributeError) and no VGPU inventory is reported. A
	// compute host has PCI parents only: the module is unloaded while
	// Nova runs, and loaded again after.
	out, err := vm(t, fmt.Sprintf(`set -e
systemctl stop %[1]s 2>/dev/null || true
systemctl reset-failed %[1]s 2>/dev/null || true
modprobe -r mtty
rm -rf %[2]s && mkdir -p %[2]s/instances %[2]s/lock
systemd-run --unit %[1]s --collect -p KillMode=control-group \
  --setenv=NOVATEST_IMAGES=%[3]s --setenv=PYTHONDONTWRITEBYTECODE=1 --setenv=PYTHONNOUSERSITE=1 \
  %[4]s %[5]s/launcher.py compute --config-file %[5]s/nova.conf --config-file %[5]s/lab-compute.conf`,
		labNovaUnit, labNovaState, imagesFile, novaharness.Python, vmRun))
	if err != nil {
		t.Fatalf("start nova-compute in the lab VM: %v\n%s", err, out)
	}
	if err := n.WaitHost(ctx2(t, labNovaStart), labNovaHost, labNovaStart); err != nil {
		t.Fatalf("the lab's nova-compute: %v\n%s", err, ln.journal(t))
	}
	// Nova's first update_available_resource writes the GPUs' providers
	// (one per mdev parent) after the compute node's.
	poll(t, labNovaStart, func() (bool, string) {
		g := ln.gpus(t)
		return len(g) == 2, fmt.Sprintf("Nova's VGPU providers under %s: %v", labNovaHost, g)
	})
	t.Logf("the lab's nova-compute (libvirt driver) up with its VGPU providers after %s", time.Since(start).Round(time.Second))
	return ln
}

// ctx2 is a context for one wait of the lab's Nova.
func ctx2(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// journal is the lab compute's log so far (its last lines).
func (ln *labNova) journal(t *testing.T) string {
	out, _ := vm(t, "journalctl -u "+labNovaUnit+" --no-pager -n 60 -o cat")
	return out
}

// gpus maps the VGPU providers Nova made under the lab's compute node to
// their VGPU inventory total and their PCI address (from their names:
// <node>_pci_0000_00_10_0).
func (ln *labNova) gpus(t *testing.T) map[string]labGPU {
	t.Helper()
	root := ln.ComputeNodeProvider(t, labNovaHost)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var tree struct {
		Providers []struct{ UUID, Name string } `json:"resource_providers"`
	}
	if err := ln.PlacementCall(ctx, http.MethodGet, "/resource_providers?in_tree="+root, nil, &tree); err != nil {
		t.Fatal(err)
	}
	out := map[string]labGPU{}
	for _, p := range tree.Providers {
		var inv struct {
			Inventories map[string]struct{ Total int } `json:"inventories"`
		}
		if err := ln.PlacementCall(ctx, http.MethodGet, "/resource_providers/"+p.UUID+"/inventories", nil, &inv); err != nil {
			t.Fatal(err)
		}
		v, ok := inv.Inventories["VGPU"]
		if !ok {
			continue
		}
		m := regexp.MustCompile(`_pci_(\w{4})_(\w{2})_(\w{2})_(\w)$`).FindStringSubmatch(p.Name)
		if m == nil {
			t.Fatalf("VGPU provider %s is not named <node>_pci_<address>", p.Name)
		}
		out[p.UUID] = labGPU{Name: p.Name, Total: v.Total, PCI: fmt.Sprintf("%s:%s:%s.%s", m[1], m[2], m[3], m[4])}
	}
	return out
}

type labGPU struct {
	Name  string
	PCI   string // sysfs form
	Total int
}

// removeMdevsOfType removes every mdev of Nova's type that no running
// domain holds (Nova leaves its mdevs behind for reuse).
const removeMdevsOfType = `for m in /sys/bus/mdev/devices/*; do
  [ -e "$m" ] || continue
  case "$(basename "$(readlink -f "$m/mdev_type")")" in ` + labNovaType + `) echo 1 >"$m/remove" 2>/dev/null || true;; esac
done`

func (ln *labNova) close(t *testing.T) {
	if out, err := vm(t, fmt.Sprintf(`systemctl stop %[1]s 2>/dev/null; systemctl reset-failed %[1]s 2>/dev/null
v="virsh -c qemu:///system"
for d in $($v list --all --name | grep '^instance-'); do $v destroy $d >/dev/null 2>&1; $v undefine $d >/dev/null 2>&1; done
%[2]s
rm -rf %[3]s
modprobe mtty`, labNovaUnit, removeMdevsOfType, labNovaState)); err != nil {
		t.Logf("cleaning the lab's Nova up: %v\n%s", err, out)
	}
	if t.Failed() {
		t.Logf("the lab's nova-compute log:\n%s", ln.journal(t))
		ln.MarkFailed()
	}
	if err := ln.Close(); err != nil {
		t.Errorf("stop Nova: %v", err)
	}
}

// domainMdevs lists the mdev UUIDs in a domain's live XML in the VM.
func domainMdevs(t *testing.T, domain string) []string {
	t.Helper()
	out, err := vm(t, "virsh -c qemu:///system dumpxml "+domain)
	if err != nil {
		t.Fatalf("dumpxml %s: %v\n%s", domain, err, out)
	}
	var ids []string
	for _, m := range regexp.MustCompile(`(?s)<hostdev[^>]*type='mdev'.*?<address uuid='([0-9a-f-]+)'`).FindAllStringSubmatch(out, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// mdevOf reads an mdev's type and parent (sysfs form) in the VM; ok is
// false when the kernel has no such mdev.
func mdevOf(t *testing.T, id string) (typ, parent string, ok bool) {
	t.Helper()
	out, err := vm(t, fmt.Sprintf(`d=/sys/bus/mdev/devices/%s; [ -e $d ] || { echo absent; exit 0; }
echo "type=$(basename "$(readlink -f $d/mdev_type)")"; echo "parent=$(basename "$(dirname "$(readlink -f $d)")")"`, id))
	if err != nil {
		t.Fatalf("reading mdev %s: %v\n%s", id, err, out)
	}
	if strings.Contains(out, "absent") {
		return "", "", false
	}
	for _, l := range strings.Split(out, "\n") {
		if k, v, found := strings.Cut(strings.TrimSpace(l), "="); found {
			switch k {
			case "type":
				typ = v
			case "parent":
				parent = v
			}
		}
	}
	return typ, parent, true
}

// consoleOf is a Nova instance's serial console log (virtlogd's file).
func consoleOf(t *testing.T, server string) string {
	out, _ := vm(t, fmt.Sprintf("cat %s/instances/%s/console.log 2>/dev/null", labNovaState, server))
	return out
}

// TestNovaLibvirtDriver runs, on one Nova whose compute is the lab VM
// (Nova's services and the compute start once: minutes under emulation),
// the server Nova boots with a vGPU of its own, the bridge's direct-path
// vGPU on a server Nova booted without one, and the bridge's Nova-path
// resizes (confirmed, then reverted).
func TestNovaLibvirtDriver(t *testing.T) {
	ln := startLabNova(t)
	t.Run("BootsVGPUServer", func(t *testing.T) { labNovaBootsVGPUServer(t, ln) })
	if out, err := vm(t, removeMdevsOfType); err != nil {
		t.Fatalf("removing the mdevs Nova left: %v\n%s", err, out)
	}
	t.Run("DirectPathAndRebuild", func(t *testing.T) { labNovaDirectPathAndRebuild(t, ln) })
	if out, err := vm(t, removeMdevsOfType); err != nil {
		t.Fatalf("removing the mdevs left: %v\n%s", err, out)
	}
	t.Run("NovaPathResizeConfirmAndRevert", func(t *testing.T) { labNovaPathResize(t, ln) })
	t.Run("BridgeOwnedVF", func(t *testing.T) { labNovaBridgeOwnedVF(t, ln) })
}

// labNovaBootsVGPUServer: Nova's real libvirt driver in the
// lab reports the mdev parents' VGPU inventory on child providers of its
// compute node, boots a resources:VGPU=1 server there through the real
// Nova API — an mdev of the enabled type created on the GPU whose
// provider holds the allocation, in the domain's XML and seen by the
// guest's kernel — and, as Nova 26's driver does, leaves the mdev when
// the server is deleted and hands that unassigned mdev to the next
// server on the same GPU rather than creating another
// (LibvirtDriver._allocate_mdevs, _get_existing_mdevs_not_assigned).
func labNovaBootsVGPUServer(t *testing.T, ln *labNova) {
	gpus := ln.gpus(t)
	for uuid, g := range gpus {
		if g.Total < 1 {
			t.Errorf("VGPU provider %s (%s) offers %d", g.Name, uuid, g.Total)
		}
	}
	// Both servers on one GPU, as an operator steers flavors with a trait
	// of their own on Nova's GPU provider.
	var gpuRP string
	for uuid := range gpus {
		gpuRP = uuid
		break
	}
	ln.addTrait(t, gpuRP, "CUSTOM_VGPU_LAB_REUSE")
	// No root disk size: the lab VM's overlay root is under 1 GB, so
	// Nova reports no DISK_GB (the root disk is the image's size).
	flavor := ln.CreateFlavor(t, "lab.vgpu", 1, 192, 0, map[string]string{
		"resources:VGPU": "1", "trait:CUSTOM_VGPU_LAB_REUSE": "required"})

	boot := func(name string, inGuest bool) (server, mdev string) {
		t.Helper()
		start := time.Now()
		id := ln.CreateServerFrom(t, name, flavor, ln.disk, labNovaHost)
		s := ln.WaitServerWithin(t, id, "ACTIVE", labNovaOp)
		t.Logf("%s ACTIVE on %s after %s", name, s.Host, time.Since(start).Round(time.Second))
		if s.Host != labNovaHost {
			t.Fatalf("%s on %s, want %s", name, s.Host, labNovaHost)
		}
		var vgpuOn []string
		for rp, res := range ln.Allocations(t, id) {
			if res["VGPU"] > 0 {
				vgpuOn = append(vgpuOn, rp)
			}
		}
		if len(vgpuOn) != 1 || vgpuOn[0] != gpuRP {
			t.Fatalf("%s's VGPU allocations on %v, want the one GPU provider %s", name, vgpuOn, gpuRP)
		}
		g := gpus[gpuRP]
		mdevs := domainMdevs(t, s.InstanceName)
		if len(mdevs) != 1 {
			t.Fatalf("domain %s has mdevs %v, want one", s.InstanceName, mdevs)
		}
		typ, parent, ok := mdevOf(t, mdevs[0])
		if !ok || typ != labNovaType || parent != g.PCI {
			t.Fatalf("mdev %s: type %q parent %q exists %v; want %s on %s (the allocated provider %s)",
				mdevs[0], typ, parent, ok, labNovaType, g.PCI, g.Name)
		}
		if !inGuest {
			return id, mdevs[0]
		}
		// The guest's kernel lists the mtty function Nova gave it (the
		// nested guest's boot is the slow part: once is enough).
		start = time.Now()
		poll(t, labNovaOp, func() (bool, string) {
			last := lastGuestPCI(consoleOf(t, id))
			return strings.Contains(last, mttyGuestID), fmt.Sprintf("%s's PCI functions: %q (want an mtty function)", name, last)
		})
		t.Logf("%s's kernel lists the mtty function after %s", name, time.Since(start).Round(time.Second))
		return id, mdevs[0]
	}

	first, mdev := boot("lab-vgpu-1", true)
	ln.DeleteServerWithin(t, first, labNovaOp)
	if typ, parent, ok := mdevOf(t, mdev); !ok || typ != labNovaType || parent != gpus[gpuRP].PCI {
		t.Fatalf("after the delete, mdev %s: exists %v (%s on %s); Nova 26 leaves it for reuse", mdev, ok, typ, parent)
	}
	second, reused := boot("lab-vgpu-2", false)
	if reused != mdev {
		t.Errorf("the second server on GPU %s got mdev %s, not the unassigned %s Nova left", gpus[gpuRP].PCI, reused, mdev)
	}
	ln.DeleteServerWithin(t, second, labNovaOp)
}

// addTrait adds trait to a provider's traits (creating the custom trait),
// under the provider's generation.
func (ln *labNova) addTrait(t *testing.T, rp, trait string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ln.PlacementCall(ctx, http.MethodPut, "/traits/"+trait, nil, nil); err != nil {
		t.Fatalf("create trait %s: %v", trait, err)
	}
	var cur struct {
		Traits     []string `json:"traits"`
		Generation int      `json:"resource_provider_generation"`
	}
	if err := ln.PlacementCall(ctx, http.MethodGet, "/resource_providers/"+rp+"/traits", nil, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Traits = append(cur.Traits, trait)
	if err := ln.PlacementCall(ctx, http.MethodPut, "/resource_providers/"+rp+"/traits", cur, nil); err != nil {
		t.Fatalf("set traits of %s: %v", rp, err)
	}
}

// labBridgeProfiles is the bridge's profile seed for the lab: the sample
// driver names its types "Dual port serial", not a vGPU profile, so the
// seed gives mtty_pci-2 a profile name of the usual form.
const labBridgeProfiles = `profiles:
  - {name: LAB-2Q, type_id: mtty_pci-2, max_instances: 12}
  - {name: H200X-141C, type_id: "1428", max_instances: 1}
  - {name: H200X-70C, type_id: "1429", max_instances: 2}
`

// startLabBridge runs an in-process bridge on a database of its own,
// listening to the lab Nova's notifications and serving its agents
// (Nova's vhost, as a deployment's bridge and agents share Nova's
// broker), with the given policy.
func startLabBridge(t *testing.T, ln *labNova, policy string, sets ...string) *apiclient.Client {
	t.Helper()
	dir := t.TempDir()
	rules := filepath.Join(dir, "policy.yaml")
	profiles := filepath.Join(dir, "profiles.yaml")
	token := filepath.Join(dir, "nova-token")
	testsvc.Must(t, os.WriteFile(rules, []byte(policy), 0o600), "policy")
	testsvc.Must(t, os.WriteFile(profiles, []byte(labBridgeProfiles), 0o600), "profiles")
	testsvc.Must(t, os.WriteFile(token, []byte(ln.Token()+"\n"), 0o600), "nova token")
	v := testbridge.Config(t, testsvc.Postgres(t), append([]string{
		"DEFAULT.transport_url=" + ln.TransportURL(),
		"policy.rules_file=" + rules,
		"policy.profiles_file=" + profiles,
		"nova.endpoint_override=" + ln.ComputeEndpoint(),
		"nova.token_file=" + token,
		"pipeline.poll_interval=100ms",
		"placement.sync_interval=5s",
		"dispatch.results_queue=" + testsvc.Name("lab-results"),
		"dispatch.reports_queue=" + testsvc.Name("lab-reports"),
	}, sets...)...)
	d := testbridge.Start(t, v)
	return apiclient.New(apiclient.Config{URL: "http://" + d.API.Addr(), Token: testbridge.AdminToken, Timeout: 30 * time.Second})
}

// vmURL is a broker URL of this machine as the lab VM reaches it.
func vmURL(u string) string {
	return strings.NewReplacer("@127.0.0.1:", "@10.0.2.2:", "@localhost:", "@10.0.2.2:").Replace(u)
}

// labVGPU is what the lab holds of an instance's vGPUs: its VGPU
// allocations in Placement (provider → units), the mdevs in its domain's
// live XML and every mdev of Nova's type on the lab's GPUs.
type labVGPU struct {
	Allocated  map[string]int
	InDomain   []string
	OfTypeHost []string
}

func (ln *labNova) vgpuOf(t *testing.T, server string) labVGPU {
	t.Helper()
	s := ln.Server(t, server)
	v := labVGPU{Allocated: map[string]int{}, InDomain: domainMdevs(t, s.InstanceName)}
	for rp, res := range ln.Allocations(t, server) {
		if res["VGPU"] > 0 {
			v.Allocated[rp] = res["VGPU"]
		}
	}
	out, err := vm(t, fmt.Sprintf(`for m in /sys/bus/mdev/devices/*; do [ -e "$m" ] || continue
[ "$(basename "$(readlink -f "$m/mdev_type")")" = %s ] && basename "$m"; done; true`, labNovaType))
	if err != nil {
		t.Fatalf("listing mdevs: %v\n%s", err, out)
	}
	v.OfTypeHost = strings.Fields(out)
	return v
}

// labNovaDirectPathAndRebuild: under Nova's own libvirt driver, the
// bridge attaches a direct-path vGPU to a server Nova booted without one
// (a claim on Nova's GPU provider in the instance's consumer, an mdev the
// agent creates and hot-plugs into Nova's domain), and a rebuild of that
// server through Nova then leaves it with one vGPU: Nova's driver spawns
// the rebuilt guest with the instance's whole allocation, the bridge's
// VGPU included, and takes the mdev the old domain left unassigned
// (LibvirtDriver._allocate_mdevs); the bridge must neither lose that vGPU
// nor add a second.
func labNovaDirectPathAndRebuild(t *testing.T, ln *labNova) {
	startLabAgentWith(t, agentOpts{
		host: labNovaHost,
		conf: "[devices]\nenabled_types = " + labNovaType + "\n",
		sets: []string{"DEFAULT.transport_url=" + vmURL(ln.TransportURL())},
	})
	api := startLabBridge(t, ln, testsvc.DirectPolicy(testsvc.RuleReleaseOnDelete))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	flavor := ln.CreateFlavor(t, "lab.small", 1, 192, 0, nil)
	id := ln.CreateServerFrom(t, "lab-direct", flavor, ln.disk, labNovaHost)
	ln.WaitServerWithin(t, id, "ACTIVE", labNovaOp)
	poll(t, 5*time.Minute, func() (bool, string) {
		in, err := api.Instance(ctx, id)
		return err == nil && in.Host != nil && *in.Host == labNovaHost, fmt.Sprintf("the bridge's instance %s: %+v %v", id, in, err)
	})

	start := time.Now()
	ans, err := api.CreateRequest(ctx, apiclient.NewRequest{Type: "GPU_REQUEST", VMID: id, Workload: "training", VGPUProfile: "LAB-2Q", Count: 1}, "")
	testsvc.Must(t, err, "GPU_REQUEST")
	req := waitLabRequest(t, ctx, api, ans.RequestID)
	if req.State != "succeeded" {
		gpus, gerr := api.GPUs(ctx, apiclient.GPUFilter{Host: labNovaHost})
		host, herr := api.Host(ctx, labNovaHost)
		t.Fatalf("GPU_REQUEST %s: %s %s %s\nthe bridge's GPUs of %s: %s %v\nits host: %s %v", ans.RequestID, req.State, req.Code, req.Reason,
			labNovaHost, gpus.Raw, gerr, host.Raw, herr)
	}
	t.Logf("direct-path vGPU attached to Nova's server in %s", time.Since(start).Round(time.Second))
	before := ln.vgpuOf(t, id)
	if len(before.Allocated) != 1 || len(before.InDomain) != 1 || len(before.OfTypeHost) != 1 || before.OfTypeHost[0] != before.InDomain[0] {
		t.Fatalf("after the attach: %+v; want one VGPU allocated, one mdev in the domain, the only one of its type", before)
	}

	// Rebuild through Nova (same image, same host).
	start = time.Now()
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	err = ln.ComputeAs(rctx, http.MethodPost, "/servers/"+id+"/action", ln.Token(), map[string]any{"rebuild": map[string]any{"imageRef": ln.disk}}, nil)
	rcancel()
	testsvc.Must(t, err, "rebuild")
	poll(t, labNovaOp, func() (bool, string) {
		s := ln.Server(t, id)
		return s.Status == "ACTIVE" && s.TaskState == "", fmt.Sprintf("server %s %s (task %q)", id, s.Status, s.TaskState)
	})
	t.Logf("rebuilt by Nova in %s", time.Since(start).Round(time.Second))
	// The bridge follows the rebuild from Nova's notifications; give it
	// the time to act on them (re-applying a vGPU would show below).
	var after labVGPU
	poll(t, 5*time.Minute, func() (bool, string) {
		after = ln.vgpuOf(t, id)
		reqs, err := api.Requests(ctx, apiclient.RequestFilter{InstanceUUID: id})
		busy := err != nil
		for _, r := range reqs.Requests {
			if r.State != "succeeded" && r.State != "failed" && r.State != "rejected" {
				busy = true
			}
		}
		return !busy && len(after.InDomain) > 0, fmt.Sprintf("after the rebuild: %+v, requests %+v %v", after, reqs.Requests, err)
	})
	if len(after.Allocated) != 1 || len(after.InDomain) != 1 || len(after.OfTypeHost) != 1 {
		t.Fatalf("after the rebuild: %+v; want one VGPU allocated, one mdev in the domain, one of its type on the host (before: %+v)", after, before)
	}
	if after.InDomain[0] != before.InDomain[0] {
		t.Errorf("the rebuilt domain has mdev %s, not the unassigned %s Nova's driver reuses", after.InDomain[0], before.InDomain[0])
	}

	// Deleted through Nova: the bridge releases the vGPU (release-on-
	// delete) and its agent removes the mdev it made, which Nova's driver
	// would have left. The subtest waits for it: an agent whose release
	// never came keeps the mdev in its journal.
	ln.DeleteServerWithin(t, id, labNovaOp)
	poll(t, 5*time.Minute, func() (bool, string) {
		reqs, err := api.Requests(ctx, apiclient.RequestFilter{InstanceUUID: id})
		busy := err != nil
		for _, r := range reqs.Requests {
			busy = busy || r.State != "succeeded" && r.State != "failed" && r.State != "rejected"
		}
		_, _, exists := mdevOf(t, after.InDomain[0])
		return !busy && !exists, fmt.Sprintf("after the delete: requests %+v %v; mdev %s exists: %v",
			reqs.Requests, err, after.InDomain[0], exists)
	})
}

// labNovaPathResize: under Nova's own libvirt driver, the bridge's Nova
// path. A GPU_REQUEST resizes a server Nova booted without a vGPU to the
// flavor of the same size with the profile's type (Nova's scheduler claims
// the VGPU, Nova's driver creates the mdev in finish_migration); the
// agent verifies the mdev in Nova's domain, the bridge confirms. A
// GPU_RELEASE resizes it back: Nova's driver leaves the mdev, unassigned.
// A second GPU_REQUEST, cancelled while Nova resizes, is reverted by the
// bridge once Nova has finished: the resized guest took the unassigned
// mdev (LibvirtDriver._allocate_mdevs, _get_existing_mdevs_not_assigned)
// and the revert destroys it and defines the old guest again
// (ComputeManager.revert_resize, LibvirtDriver.finish_revert_migration,
// which keeps only the mdevs still assigned to the instance: none). The
// server is back without a vGPU, the GPU holds the one mdev it had, and
// the bridge counts no vGPU for it: none lost, none doubled.
func labNovaPathResize(t *testing.T, ln *labNova) {
	startLabAgentWith(t, agentOpts{
		host: labNovaHost,
		conf: "[devices]\nenabled_types = " + labNovaType + "\n",
		sets: []string{"DEFAULT.transport_url=" + vmURL(ln.TransportURL())},
	})
	// The type's trait (the bridge's flavors require it), on one GPU
	// only, so that every resize lands on the GPU whose mdev Nova reuses.
	var gpu labGPU
	var gpuRP string
	for rp, g := range ln.gpus(t) {
		gpuRP, gpu = rp, g
		break
	}
	const trait = "CUSTOM_MTTY_PCI_2"
	ln.addTrait(t, gpuRP, trait)
	plain := ln.CreateFlavor(t, "lab.resize", 1, 192, 0, nil)
	ln.CreateFlavor(t, "lab.resize.vgpu", 1, 192, 0, map[string]string{
		"resources:VGPU": "1", "trait:" + trait: "required", "vgpu_bridge:release_flavor": "lab.resize"})
	api := startLabBridge(t, ln, testsvc.NovaPolicy(testsvc.RuleReleaseOnRequest))
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()

	id := ln.CreateServerFrom(t, "lab-resize", plain, ln.disk, labNovaHost)
	ln.WaitServerWithin(t, id, "ACTIVE", labNovaOp)
	poll(t, 5*time.Minute, func() (bool, string) {
		in, err := api.Instance(ctx, id)
		return err == nil && in.Host != nil && *in.Host == labNovaHost, fmt.Sprintf("the bridge's instance %s: %+v %v", id, in, err)
	})
	ask := func(typ string) string {
		t.Helper()
		ans, err := api.CreateRequest(ctx, apiclient.NewRequest{Type: typ, VMID: id, Workload: "training", VGPUProfile: "LAB-2Q", Count: 1}, "")
		testsvc.Must(t, err, typ)
		return ans.RequestID
	}
	// settled: the server ACTIVE with no task, on flavor, and the bridge's
	// count of its vGPUs; then what the lab holds of them.
	settled := func(flavor string, vgpus int) labVGPU {
		t.Helper()
		poll(t, labNovaOp, func() (bool, string) {
			s := ln.Server(t, id)
			in, err := api.Instance(ctx, id)
			return s.Status == "ACTIVE" && s.TaskState == "" && s.Flavor.OriginalName == flavor && err == nil && in.VGPUs == vgpus,
				fmt.Sprintf("server %s %s (task %q) on %s, the bridge counts %d vGPUs (%v); want ACTIVE on %s, %d",
					id, s.Status, s.TaskState, s.Flavor.OriginalName, in.VGPUs, err, flavor, vgpus)
		})
		return ln.vgpuOf(t, id)
	}

	// Grow: resize, verify, confirm.
	start := time.Now()
	req := waitLabRequest(t, ctx, api, ask("GPU_REQUEST"))
	if req.State != "succeeded" || !strings.Contains(req.Reason, "lab.resize.vgpu") {
		t.Fatalf("GPU_REQUEST %s: %s %s %s; want succeeded on lab.resize.vgpu", req.ID, req.State, req.Code, req.Reason)
	}
	t.Logf("resized through Nova, verified and confirmed in %s", time.Since(start).Round(time.Second))
	grown := settled("lab.resize.vgpu", 1)
	if len(grown.Allocated) != 1 || grown.Allocated[gpuRP] != 1 || len(grown.InDomain) != 1 || len(grown.OfTypeHost) != 1 {
		t.Fatalf("after the resize: %+v; want one VGPU on %s, one mdev in the domain, the only one of its type", grown, gpu.Name)
	}
	mdev := grown.InDomain[0]
	if typ, parent, ok := mdevOf(t, mdev); !ok || typ != labNovaType || parent != gpu.PCI {
		t.Fatalf("mdev %s: %s on %s (exists %v); want %s on %s", mdev, typ, parent, ok, labNovaType, gpu.PCI)
	}
	if got := ln.InstanceActions(t, id); got["resize"] != 1 || got["confirmResize"] != 1 {
		t.Errorf("Nova's instance actions %v, want one resize and one confirmResize", got)
	}

	// Give it back: a resize to the flavor the vGPU flavor names.
	req = waitLabRequest(t, ctx, api, ask("GPU_RELEASE"))
	if req.State != "succeeded" {
		t.Fatalf("GPU_RELEASE %s: %s %s %s", req.ID, req.State, req.Code, req.Reason)
	}
	released := settled("lab.resize", 0)
	if len(released.Allocated) != 0 || len(released.InDomain) != 0 || !slices.Equal(released.OfTypeHost, []string{mdev}) {
		t.Fatalf("after the release: %+v; want no VGPU, no mdev in the domain, %s left unassigned", released, mdev)
	}

	// Grow again, cancelled while Nova resizes: the bridge reverts.
	cancelled := ask("GPU_REQUEST")
	poll(t, labNovaOp, func() (bool, string) {
		r, err := api.Request(ctx, cancelled)
		return err == nil && r.Phase == "resizing", fmt.Sprintf("request %s: %s/%s %s %v", cancelled, r.State, r.Phase, r.Reason, err)
	})
	r, err := api.CancelRequest(ctx, cancelled)
	if err != nil || r.State != "failed" || r.Code != "cancelled" {
		t.Fatalf("cancel %s: %+v %v", cancelled, r, err)
	}
	start = time.Now()
	poll(t, labNovaOp, func() (bool, string) {
		got := ln.InstanceActions(t, id)
		return got["revertResize"] == 1, fmt.Sprintf("Nova's instance actions %v", got)
	})
	reverted := settled("lab.resize", 0)
	t.Logf("reverted by the bridge %s after the cancel", time.Since(start).Round(time.Second))
	if len(reverted.Allocated) != 0 || len(reverted.InDomain) != 0 || !slices.Equal(reverted.OfTypeHost, []string{mdev}) {
		t.Errorf("after the revert: %+v; want no VGPU, no mdev in the domain, only %s of its type on the GPU", reverted, mdev)
	}
	if got := ln.InstanceActions(t, id); got["resize"] != 3 || got["confirmResize"] != 2 || got["revertResize"] != 1 {
		t.Errorf("Nova's instance actions %v, want three resizes, two confirmed, one reverted", got)
	}
	ln.DeleteServerWithin(t, id, labNovaOp)
}

// waitLabRequest waits until a bridge request is final.
func waitLabRequest(t *testing.T, ctx context.Context, api *apiclient.Client, id string) apiclient.Request {
	t.Helper()
	var r apiclient.Request
	poll(t, labNovaOp, func() (bool, string) {
		var err error
		r, err = api.Request(ctx, id)
		return err == nil && (r.State == "succeeded" || r.State == "failed" || r.State == "rejected"),
			fmt.Sprintf("request %s: %s %s %v", id, r.State, r.Reason, err)
	})
	return r
}

// The lab's bridge-owned VF GPUs: two stand-in PFs (names only, see
// standInVF), each with one of the lab's stand-in VFs, declared to the
// bridge for an H200's two types.
const (
	labPFBig, labPFHalf     = "0000:3b:00.0", "0000:5e:00.0"
	labTypeBig, labTypeHalf = "1428", "1429"
	labTraitBig             = "CUSTOM_1428"
	labTraitHalf            = "CUSTOM_1429"
)

// labOwnedGPU is what Placement and the lab hold of one bridge-owned VF
// GPU: its provider, the provider's parent, inventory total, usage and
// traits, and the state of its VF.
type labOwnedGPU struct {
	Provider, Parent string
	Total, Used      int
	Traits           []string
	VF               vfState
}

// ownedGPU reads a bridge-owned VF GPU's provider (by the name the bridge
// gives it, under the lab's compute node) and its VF in domain.
func (ln *labNova) ownedGPU(t *testing.T, pf string, vf pci.Addr, domain, root string) labOwnedGPU {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := labOwnedGPU{VF: vfStateIn(t, domain, root, vf)}
	var list struct {
		Providers []struct {
			UUID   string `json:"uuid"`
			Parent string `json:"parent_provider_uuid"`
		} `json:"resource_providers"`
	}
	if err := ln.PlacementCall(ctx, http.MethodGet, "/resource_providers?name="+placement.GPUProviderName(labNovaHost, pf), nil, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Providers) != 1 {
		return g
	}
	g.Provider, g.Parent = list.Providers[0].UUID, list.Providers[0].Parent
	var inv struct {
		Inventories map[string]struct{ Total int } `json:"inventories"`
	}
	var use struct {
		Usages map[string]int `json:"usages"`
	}
	var tr struct {
		Traits []string `json:"traits"`
	}
	for path, into := range map[string]any{"/inventories": &inv, "/usages": &use, "/traits": &tr} {
		if err := ln.PlacementCall(ctx, http.MethodGet, "/resource_providers/"+g.Provider+path, nil, into); err != nil {
			t.Fatal(err)
		}
	}
	g.Total, g.Used, g.Traits = inv.Inventories[placement.BridgeClass].Total, use.Usages[placement.BridgeClass], tr.Traits
	return g
}

// labNovaBridgeOwnedVF: a bridge-owned VF GPU through the real bridge, the
// real VFIO hot-plug and Nova's own domain. Two GPUs the bridge owns
// ([placement] bridge_owned_gpus), one per type, each a stand-in PF
// with one of the lab's stand-in VFs (bound to vfio-pci behind the lab's
// emulated IOMMU). The bridge publishes a provider per GPU under the lab
// compute node's provider (CUSTOM_VGPU_BRIDGE: 1, the type's trait). A
// direct-path GPU_REQUEST on a server Nova booted without a vGPU claims
// on the first GPU, types its VF and hot-plugs it into Nova's running
// domain; a GPU_RESIZE to the other profile moves the vGPU to the other
// GPU's VF (the first VF cleared and out of the domain); a GPU_RELEASE
// leaves no claim, no type and no VF in the domain or in QEMU. Placement's
// providers, inventories, usages and the server's allocations, and the
// VFs' types, domain XML and QEMU's PCI devices are asserted after each
// step.
func labNovaBridgeOwnedVF(t *testing.T, ln *labNova) {
	vfs := labVFs(t)
	if len(vfs) < 2 {
		t.Fatalf("the lab has %d vendor-VFIO stand-ins, want 2 (tests/lab/lab.sh)", len(vfs))
	}
	types := []sysfs.VFType{{ID: labTypeBig, Name: "NVIDIA H200X-141C"}, {ID: labTypeHalf, Name: "NVIDIA H200X-70C"}}
	big, half := vfs[0], vfs[1]
	root := labVFSysfs(t, labNovaHost, standInVF{addr: big, pf: labPFBig, types: types}, standInVF{addr: half, pf: labPFHalf, types: types})
	startLabAgentWith(t, agentOpts{
		host: labNovaHost,
		conf: "[devices]\nenabled_types = " + labTypeBig + "," + labTypeHalf + "\n" +
			"[mdev_" + labTypeBig + "]\ndevice_addresses = " + labPFBig + "\n" +
			"[mdev_" + labTypeHalf + "]\ndevice_addresses = " + labPFHalf + "\n",
		sets: []string{"DEFAULT.transport_url=" + vmURL(ln.TransportURL()), "sysfs.root=" + root},
	})
	t.Cleanup(func() {
		for _, vf := range vfs {
			vm(t, fmt.Sprintf("echo 0 >%s/bus/pci/devices/%s/nvidia/current_vgpu_type", root, vf))
		}
	})
	api := startLabBridge(t, ln, testsvc.DirectPolicy(testsvc.RuleResizeOnRequest, testsvc.RuleReleaseOnRequest),
		"placement.bridge_owned_gpus="+labNovaHost+"/"+labPFBig+"="+labTypeBig+","+labNovaHost+"/"+labPFHalf+"="+labTypeHalf)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	computeRP := ln.ComputeNodeProvider(t, labNovaHost)
	flavor := ln.CreateFlavor(t, "lab.vf", 1, 192, 0, nil)
	id := ln.CreateServerFrom(t, "lab-vf", flavor, ln.disk, labNovaHost)
	ln.WaitServerWithin(t, id, "ACTIVE", labNovaOp)
	domain := ln.Server(t, id).InstanceName
	poll(t, 5*time.Minute, func() (bool, string) {
		in, err := api.Instance(ctx, id)
		return err == nil && in.Host != nil && *in.Host == labNovaHost, fmt.Sprintf("the bridge's instance %s: %+v %v", id, in, err)
	})
	// The guest's kernel up (its init lists its PCI functions): a live
	// detach needs a kernel that answers the ACPI unplug request (a guest
	// still booting, under emulation in emulation, leaves it standing).
	// inGuest is how many stand-in VFs the guest's latest listing has.
	inGuest := func() (int, string) {
		last := lastGuestPCI(consoleOf(t, id))
		return strings.Count(last, vfGuestID), last
	}
	start := time.Now()
	poll(t, labNovaOp, func() (bool, string) {
		_, last := inGuest()
		return last != "", "the guest's kernel has not listed its PCI functions yet"
	})
	t.Logf("the guest's kernel up after %s", time.Since(start).Round(time.Second))
	guestSees := func(step string, want int) {
		t.Helper()
		poll(t, 5*time.Minute, func() (bool, string) {
			n, last := inGuest()
			return n == want, fmt.Sprintf("%s: the guest's PCI functions %q, want %d of %s", step, last, want, vfGuestID)
		})
	}

	// state reads both GPUs and the server's bridge allocations; want
	// checks them: the GPU holding the vGPU (nil: none) has its VF typed
	// and in the domain and one unit used, the other is untouched.
	type gpuWant struct {
		pf, trait, typ string
		vf             pci.Addr
	}
	gpus := []gpuWant{{labPFBig, labTraitBig, labTypeBig, big}, {labPFHalf, labTraitHalf, labTypeHalf, half}}
	check := func(step string, holder *gpuWant) {
		t.Helper()
		var saw []labOwnedGPU
		alloc := map[string]int{}
		poll(t, 2*time.Minute, func() (bool, string) {
			saw = saw[:0]
			ok := true
			for _, g := range gpus {
				o := ln.ownedGPU(t, g.pf, g.vf, domain, root)
				saw = append(saw, o)
				has := holder != nil && holder.pf == g.pf
				used, typ := 0, "0"
				if has {
					used, typ = 1, g.typ
				}
				ok = ok && o.Provider != "" && o.Parent == computeRP && o.Total == 1 && o.Used == used &&
					slices.Equal(o.Traits, []string{g.trait}) &&
					o.VF.Type == typ && o.VF.Live == has && o.VF.Config == has && o.VF.Driver == "vfio-pci"
			}
			alloc = map[string]int{}
			for rp, res := range ln.Allocations(t, id) {
				if n := res[placement.BridgeClass] + res["VGPU"]; n > 0 {
					alloc[rp] = n
				}
			}
			want := 0
			if holder != nil {
				want = 1
				ok = ok && alloc[saw[slices.IndexFunc(gpus, func(g gpuWant) bool { return g.pf == holder.pf })].Provider] == 1
			}
			ok = ok && len(alloc) == want
			return ok, fmt.Sprintf("%s: GPUs %+v, the server's vGPU allocations %v (compute node %s)", step, saw, alloc, computeRP)
		})
		qemu := 0
		for _, o := range saw {
			qemu = max(qemu, o.VF.QEMU) // both stand-ins have the same ids: each counts all
		}
		if want := map[bool]int{true: 1, false: 0}[holder != nil]; qemu != want {
			t.Errorf("%s: QEMU lists %d functions %04x:%04x, want %d", step, qemu, vfVendor, vfDevice, want)
		}
		t.Logf("%s: %+v, allocations %v", step, saw, alloc)
	}
	ask := func(typ, profile string) {
		t.Helper()
		start = time.Now()
		ans, err := api.CreateRequest(ctx, apiclient.NewRequest{Type: typ, VMID: id, Workload: "training", VGPUProfile: profile, Count: 1}, "")
		testsvc.Must(t, err, typ)
		if req := waitLabRequest(t, ctx, api, ans.RequestID); req.State != "succeeded" {
			t.Fatalf("%s %s: %s %s %s", typ, ans.RequestID, req.State, req.Code, req.Reason)
		}
		t.Logf("%s %s: succeeded in %s", typ, profile, time.Since(start).Round(time.Second))
	}

	check("published", nil)
	ask("GPU_REQUEST", "H200X-141C")
	check("attached", &gpus[0])
	guestSees("attached", 1)
	ask("GPU_RESIZE", "H200X-70C")
	check("profile changed", &gpus[1])
	guestSees("profile changed", 1)
	ask("GPU_RELEASE", "")
	check("released", nil)
	guestSees("released", 0)
	ln.DeleteServerWithin(t, id, labNovaOp)
}
