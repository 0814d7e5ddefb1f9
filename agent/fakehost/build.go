package fakehost

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
)

// Host is a built fake host.
type Host struct {
	Dir        string
	Spec       Spec
	SysRoot    string // DIR/sys
	ProcRoot   string // DIR/proc
	CgroupRoot string // DIR/cgroup
	LibvirtXML string // DIR/libvirt.xml (absolute)
	// Kernel applies writes the way the kernel would.
	Kernel *Kernel
	// Sysfs reads DIR/sys and writes through Kernel.
	Sysfs *sysfs.Host

	vms vmRegistry
}

// LibvirtURI is the test-driver URI of the host's node description.
func (h *Host) LibvirtURI() string { return "test://" + h.LibvirtXML }

// Build writes a fake host for spec under dir (created if missing; an
// existing tree there is replaced) and returns it.
func Build(dir string, spec Spec) (*Host, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"sys", "proc", "cgroup"} {
		if err := os.RemoveAll(filepath.Join(abs, sub)); err != nil {
			return nil, err
		}
	}
	b := &builder{root: filepath.Join(abs, "sys")}
	b.build(spec)
	b.buildProc(filepath.Join(abs, "proc"), spec)
	b.buildCgroup(filepath.Join(abs, "cgroup"), spec)
	if b.err != nil {
		return nil, fmt.Errorf("fake host: %w", b.err)
	}
	if err := os.WriteFile(filepath.Join(abs, "libvirt.xml"), []byte(LibvirtXML(spec)), 0o644); err != nil {
		return nil, err
	}
	js, _ := json.MarshalIndent(spec, "", "  ")
	if err := os.WriteFile(filepath.Join(abs, "spec.json"), js, 0o644); err != nil {
		return nil, err
	}
	return open(abs, spec), nil
}

// Load opens a fake host Build made earlier (reading DIR/spec.json); the
// sysfs tree keeps whatever state it has.
func Load(dir string) (*Host, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(abs, "spec.json"))
	if err != nil {
		return nil, fmt.Errorf("fake host %s: %w", dir, err)
	}
	var spec Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("fake host %s: spec.json: %w", dir, err)
	}
	return open(abs, spec), nil
}

// LoadOrBuild loads the fake host in dir, building DefaultSpec there first
// when it has none.
func LoadOrBuild(dir string) (*Host, error) {
	if _, err := os.Stat(filepath.Join(dir, "spec.json")); err == nil {
		return Load(dir)
	}
	return Build(dir, DefaultSpec())
}

func open(abs string, spec Spec) *Host {
	h := &Host{Dir: abs, Spec: spec, SysRoot: filepath.Join(abs, "sys"), ProcRoot: filepath.Join(abs, "proc"),
		CgroupRoot: filepath.Join(abs, "cgroup"), LibvirtXML: filepath.Join(abs, "libvirt.xml")}
	h.Kernel = &Kernel{root: h.SysRoot, spec: spec}
	h.Sysfs = sysfs.NewWithWriter(h.SysRoot, h.Kernel)
	return h
}

type builder struct {
	root string
	err  error
}

func (b *builder) file(rel, content string) {
	if b.err != nil {
		return
	}
	p := filepath.Join(b.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		b.err = err
		return
	}
	b.err = os.WriteFile(p, []byte(content), 0o644)
}

func (b *builder) dir(rel string) {
	if b.err == nil {
		b.err = os.MkdirAll(filepath.Join(b.root, rel), 0o755)
	}
}

// link makes rel a symlink to target (relative to rel's directory).
func (b *builder) link(rel, target string) {
	if b.err != nil {
		return
	}
	p := filepath.Join(b.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		b.err = err
		return
	}
	b.err = os.Symlink(target, p)
}

// devPath is where a PCI function's directory lives.
func devPath(a pci.Addr) string {
	return fmt.Sprintf("devices/pci%04x:%02x/%s", a.Domain, a.Bus&0xf0, a)
}

// up is the "../" prefix that leads from rel's directory back to the root.
func up(rel string) string {
	return strings.Repeat("../", strings.Count(rel, "/"))
}

func (b *builder) pciFunc(a pci.Addr, vendor, device, class, driver string, group int, bars []uint64) string {
	d := devPath(a)
	b.file(d+"/vendor", vendor+"\n")
	b.file(d+"/device", device+"\n")
	b.file(d+"/class", class+"\n")
	b.dir("bus/pci/drivers/" + driver)
	b.link(d+"/driver", up(d+"/driver")+"bus/pci/drivers/"+driver)
	g := "kernel/iommu_groups/" + strconv.Itoa(group)
	b.dir(g + "/devices")
	b.link(d+"/iommu_group", up(d+"/iommu_group")+g)
	b.link(g+"/devices/"+a.String(), up(g+"/devices/x")+d)
	b.link("bus/pci/devices/"+a.String(), up("bus/pci/devices/x")+d)
	var res strings.Builder
	base := uint64(0xd0000000) + uint64(a.Bus)<<28
	for i := range 13 {
		if i < len(bars) && bars[i] > 0 {
			fmt.Fprintf(&res, "0x%016x 0x%016x 0x0000000000040200\n", base, base+bars[i]-1)
			base += bars[i]
		} else {
			res.WriteString("0x0000000000000000 0x0000000000000000 0x0000000000000000\n")
		}
	}
	b.file(d+"/resource", res.String())
	return d
}

func (b *builder) build(spec Spec) {
	b.dir("class/mdev_bus")
	b.dir("bus/mdev/devices")
	b.dir("kernel/iommu_groups")
	for _, m := range spec.Modules {
		b.dir("module/" + m)
	}
	for _, g := range spec.MdevGPUs {
		d := b.pciFunc(g.Addr, "0x10de", g.DeviceID, "0x030200", "nvidia", g.IOMMUGroup, []uint64{16 << 20, 0, g.BAR1MB << 20, 0, 32 << 20})
		for _, t := range g.Types {
			td := d + "/mdev_supported_types/" + t.ID
			b.file(td+"/name", t.Name+"\n")
			b.file(td+"/description", description(t)+"\n")
			b.file(td+"/device_api", "vfio-pci\n")
			b.file(td+"/available_instances", "0\n")
			b.file(td+"/create", "")
			b.dir(td + "/devices")
		}
		b.link("class/mdev_bus/"+g.Addr.String(), up("class/mdev_bus/x")+d)
		for _, m := range g.Mdevs {
			b.mdev(d, m.Type, m.UUID)
		}
		if b.err == nil {
			b.err = recomputeMdev(filepath.Join(b.root, d), g)
		}
	}
	for _, g := range spec.VFIOGPUs {
		d := b.pciFunc(g.Addr, "0x10de", g.DeviceID, "0x030200", "nvidia", g.IOMMUGroup, []uint64{64 << 20, 0, g.BAR1MB << 20, 0, 32 << 20})
		b.file(d+"/sriov_totalvfs", strconv.Itoa(g.TotalVFs)+"\n")
		b.file(d+"/sriov_numvfs", strconv.Itoa(g.NumVFs)+"\n")
		for i, vf := range g.VFs() {
			vd := b.pciFunc(vf, "0x10de", g.VFDevice(), "0x030200", "nvidia", g.IOMMUGroup+1+i, []uint64{16 << 20, 0, 0, 0, 0})
			b.link(vd+"/physfn", "../"+g.Addr.String())
			b.link(d+"/virtfn"+strconv.Itoa(i), "../"+vf.String())
			cur := g.Current[vf.String()]
			if cur == "" {
				cur = "0"
			}
			b.file(vd+"/nvidia/current_vgpu_type", cur+"\n")
			b.file(vd+"/nvidia/creatable_vgpu_types", sysfs.FormatCreatableTypes(nil))
			b.file(vd+"/nvidia/vgpu_params", "")
		}
		if b.err == nil {
			b.err = recomputeVFs(b.root, g)
		}
	}
}

// mdev creates an mdev device directory and its links, as the kernel does.
func (b *builder) mdev(parentDir, typ, uuid string) {
	md := parentDir + "/" + uuid
	b.file(md+"/remove", "")
	b.file(md+"/nvidia/vgpu_params", "")
	b.link(md+"/mdev_type", "../mdev_supported_types/"+typ)
	b.link("bus/mdev/devices/"+uuid, up("bus/mdev/devices/x")+md)
	b.link(parentDir+"/mdev_supported_types/"+typ+"/devices/"+uuid, "../../../"+uuid)
}

func description(t Type) string {
	res := t.MaxResolution
	if res == "" {
		res = "0x0"
	}
	return fmt.Sprintf("num_heads=%d, frl_config=%d, framebuffer=%dM, max_resolution=%s, max_instance=%d",
		t.NumHeads, t.FRLConfig, t.FramebufferMB, res, t.MaxInstance)
}

func (b *builder) buildProc(dir string, spec Spec) {
	if b.err != nil {
		return
	}
	if b.err = os.MkdirAll(dir, 0o755); b.err != nil {
		return
	}
	b.err = os.WriteFile(filepath.Join(dir, "cmdline"), []byte(spec.KernelCmdline+"\n"), 0o644)
}

// ScopeName is libvirt's systemd scope of a QEMU domain: machine-qemu\x2d<id>\x2d<name>.scope.
func ScopeName(id int, name string) string {
	return `machine-qemu\x2d` + strconv.Itoa(id) + `\x2d` + strings.ReplaceAll(name, "-", `\x2d`) + ".scope"
}

func (b *builder) buildCgroup(dir string, spec Spec) {
	if b.err != nil {
		return
	}
	w := func(rel, content string) {
		if b.err != nil {
			return
		}
		p := filepath.Join(dir, rel)
		if b.err = os.MkdirAll(filepath.Dir(p), 0o755); b.err == nil {
			b.err = os.WriteFile(p, []byte(content), 0o644)
		}
	}
	if spec.CgroupV1 {
		w("cpu/machine.slice/cpu.cfs_quota_us", "-1\n")
		w("memory/machine.slice/memory.limit_in_bytes", "9223372036854771712\n")
		return
	}
	w("cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
	w("machine.slice/cgroup.controllers", "cpuset cpu io memory pids\n")
	id := 0
	for _, d := range spec.Domains {
		if !d.Running {
			continue
		}
		id++
		s := "machine.slice/" + ScopeName(id, d.Name)
		w(s+"/cgroup.controllers", "cpuset cpu io memory pids\n")
		w(s+"/cpu.max", "max 100000\n")
		w(s+"/memory.high", "max\n")
		w(s+"/memory.max", "max\n")
		w(s+"/libvirt/cgroup.controllers", "cpuset cpu io memory pids\n")
	}
}
