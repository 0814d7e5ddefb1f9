package fakehost

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
)

const newMdev = "6d7e9b1c-0f2a-4c4e-9e59-0b1d2a3c4d5e"

var (
	t4a = pci.MustParse("0000:3b:00.0")
	t4b = pci.MustParse("0000:d8:00.0")
)

func typeByID(t *testing.T, ts []sysfs.MdevType, id string) sysfs.MdevType {
	t.Helper()
	i := slices.IndexFunc(ts, func(x sysfs.MdevType) bool { return x.ID == id })
	if i < 0 {
		t.Fatalf("type %s missing", id)
	}
	return ts[i]
}

func TestBuildDefault(t *testing.T) {
	ctx := context.Background()
	h, err := Build(t.TempDir(), DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	parents, err := h.Sysfs.MdevParents(ctx)
	if err != nil || len(parents) != 2 || parents[0].Addr != t4a || parents[0].Driver != "nvidia" || parents[0].IOMMUGroup != 27 {
		t.Fatalf("parents = %+v, %v", parents, err)
	}
	types, err := h.Sysfs.Types(ctx, t4a)
	if err != nil || len(types) != 13 {
		t.Fatalf("types = %d, %v", len(types), err)
	}
	t232 := typeByID(t, types, "nvidia-232")
	if t232.Name != "GRID T4-4Q" || t232.AvailableInstances != 3 || t232.Desc.FramebufferMB != 4096 || t232.Desc.MaxInstance != 4 ||
		!slices.Equal(t232.Devices, []string{"4b20d080-1b54-4048-85b3-a6a62d165c01"}) {
		t.Errorf("nvidia-232 = %+v", t232)
	}
	if typeByID(t, types, "nvidia-222").AvailableInstances != 0 {
		t.Error("other types must be 0 while a nvidia-232 exists (no heterogeneous mode)")
	}
	if other, _ := h.Sysfs.Types(ctx, t4b); typeByID(t, other, "nvidia-222").AvailableInstances != 16 {
		t.Error("empty T4 must offer 16 × nvidia-222")
	}
	vfs, err := h.Sysfs.VFs(ctx)
	if err != nil || len(vfs) != 8 {
		t.Fatalf("vfs = %+v, %v", vfs, err)
	}
	if vfs[0].Addr != pci.MustParse("0000:c1:00.4") || vfs[0].Current != "1429" || vfs[0].CurrentName != "NVIDIA H200X-70C" || vfs[0].PhysFn != pci.MustParse("0000:c1:00.0") {
		t.Errorf("vf0 = %+v", vfs[0])
	}
	if len(vfs[1].Creatable) != 1 || vfs[1].Creatable[0].ID != "1429" {
		t.Errorf("vf1 creatable = %+v (only the type in use, one left)", vfs[1].Creatable)
	}
	if vfs[7].Addr != pci.MustParse("0000:c1:01.3") {
		t.Errorf("vf7 = %v", vfs[7].Addr)
	}
	pfs, _ := h.Sysfs.PFs(ctx)
	if len(pfs) != 1 || pfs[0].TotalVFs != 16 || len(pfs[0].VFs) != 8 {
		t.Errorf("pfs = %+v", pfs)
	}
	bars, _ := h.Sysfs.BARs(ctx, pci.MustParse("0000:c1:00.0"))
	if len(bars) < 2 || bars[1].Size != 262144<<20 {
		t.Errorf("bars = %+v", bars)
	}
	if !h.Sysfs.ModuleLoaded("vfio_pci") || h.Sysfs.ModuleLoaded("nouveau") {
		t.Error("modules")
	}
	if n, _ := h.Sysfs.IOMMUGroups(ctx); n != 2+1+8 {
		t.Errorf("iommu groups = %d", n)
	}
	if b, _ := os.ReadFile(filepath.Join(h.ProcRoot, "cmdline")); len(b) == 0 {
		t.Error("no cmdline")
	}
}

func TestKernelEmulationMdev(t *testing.T) {
	ctx := context.Background()
	h, err := Build(t.TempDir(), DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Sysfs.CreateMdev(ctx, t4a, "nvidia-232", newMdev); err != nil {
		t.Fatal(err)
	}
	ms, _ := h.Sysfs.Mdevs(ctx)
	if !slices.ContainsFunc(ms, func(m sysfs.Mdev) bool { return m.UUID == newMdev && m.Parent == t4a && m.Type == "nvidia-232" }) {
		t.Fatalf("created mdev missing: %+v", ms)
	}
	types, _ := h.Sysfs.Types(ctx, t4a)
	if got := typeByID(t, types, "nvidia-232"); got.AvailableInstances != 2 || len(got.Devices) != 2 {
		t.Errorf("after create: %+v", got)
	}
	if err := h.Sysfs.CreateMdev(ctx, t4a, "nvidia-232", newMdev); !errors.Is(err, hosterr.ErrExists) {
		t.Errorf("create twice: %v", err)
	}
	if err := h.Sysfs.CreateMdev(ctx, t4a, "nvidia-222", "6d7e9b1c-0f2a-4c4e-9e59-0b1d2a3c4d5f"); !errors.Is(err, hosterr.ErrNoCapacity) {
		t.Errorf("mixed type: %v", err)
	}
	// Kernel-level refusal (bypassing sysfs' own checks) is classified too.
	err = h.Kernel.WriteFile(filepath.Join(h.SysRoot, "class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-222/create"), []byte("6d7e9b1c-0f2a-4c4e-9e59-0b1d2a3c4d5f"))
	if !errors.Is(err, syscall.EUSERS) {
		t.Errorf("kernel create over capacity: %v", err)
	}
	// An mdev a VM holds: the kernel does not refuse its removal, the
	// write waits until the VM lets it go.
	var held atomic.Bool
	held.Store(true)
	h.Kernel.InUse = func(u string) bool { return u == newMdev && held.Load() }
	removed := make(chan error, 1)
	go func() { removed <- h.Sysfs.RemoveMdev(ctx, newMdev) }()
	for h.Kernel.Waiting() == 0 {
		select {
		case err := <-removed:
			t.Fatalf("removing an mdev in use returned (%v) instead of waiting for it", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	held.Store(false)
	if err := <-removed; err != nil {
		t.Fatalf("remove once the VM let the mdev go: %v", err)
	}
	if err := h.Sysfs.RemoveMdev(ctx, "4b20d080-1b54-4048-85b3-a6a62d165c01"); err != nil {
		t.Fatal(err)
	}
	types, _ = h.Sysfs.Types(ctx, t4a)
	if typeByID(t, types, "nvidia-222").AvailableInstances != 16 || typeByID(t, types, "nvidia-232").AvailableInstances != 4 {
		t.Error("empty GPU must offer every type again")
	}
	if ms, _ := h.Sysfs.Mdevs(ctx); len(ms) != 0 {
		t.Errorf("mdevs left: %+v", ms)
	}
	// Fill a T4 with 4 × T4-4Q: the fifth is refused.
	for i := range 4 {
		u := "00000000-0000-4000-8000-00000000000" + string(rune('1'+i))
		if err := h.Sysfs.CreateMdev(ctx, t4b, "nvidia-232", u); err != nil {
			t.Fatal(i, err)
		}
	}
	if err := h.Sysfs.CreateMdev(ctx, t4b, "nvidia-232", "00000000-0000-4000-8000-000000000009"); !errors.Is(err, hosterr.ErrNoCapacity) {
		t.Errorf("fifth T4-4Q: %v", err)
	}
}

func TestHeterogeneous(t *testing.T) {
	ctx := context.Background()
	spec := DefaultSpec()
	spec.MdevGPUs[1].Heterogeneous = true
	h, err := Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Sysfs.CreateMdev(ctx, t4b, "nvidia-233", newMdev); err != nil { // 8Q
		t.Fatal(err)
	}
	types, _ := h.Sysfs.Types(ctx, t4b)
	if got := typeByID(t, types, "nvidia-232").AvailableInstances; got != 2 {
		t.Errorf("4Q next to an 8Q: %d, want 2", got)
	}
	if got := typeByID(t, types, "nvidia-234").AvailableInstances; got != 0 {
		t.Errorf("16Q next to an 8Q: %d, want 0", got)
	}
}

func TestKernelEmulationVFIO(t *testing.T) {
	ctx := context.Background()
	h, err := Build(t.TempDir(), DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	vf1 := pci.MustParse("0000:c1:00.5")
	if err := h.Sysfs.SetVFType(ctx, vf1, "1429"); err != nil {
		t.Fatal(err)
	}
	vfs, _ := h.Sysfs.VFs(ctx)
	if vfs[1].Current != "1429" {
		t.Errorf("vf1 = %+v", vfs[1])
	}
	if len(vfs[2].Creatable) != 0 {
		t.Errorf("H200 full with 2 × 70C, still creatable: %+v", vfs[2].Creatable)
	}
	if err := h.Sysfs.SetVFType(ctx, pci.MustParse("0000:c1:00.6"), "1429"); !errors.Is(err, hosterr.ErrNoCapacity) {
		t.Errorf("third 70C: %v", err)
	}
	for _, a := range []string{"0000:c1:00.4", "0000:c1:00.5"} {
		if err := h.Sysfs.SetVFType(ctx, pci.MustParse(a), "0"); err != nil {
			t.Fatal(err)
		}
	}
	vfs, _ = h.Sysfs.VFs(ctx)
	if len(vfs[3].Creatable) != 4 {
		t.Errorf("empty H200 creatable = %+v", vfs[3].Creatable)
	}
	if err := h.Sysfs.SetVFType(ctx, pci.MustParse("0000:c1:00.6"), "1428"); err != nil {
		t.Fatal(err)
	}
	vfs, _ = h.Sysfs.VFs(ctx)
	if len(vfs[0].Creatable) != 0 {
		t.Errorf("after 141C the GPU is full: %+v", vfs[0].Creatable)
	}
}

// TestKernelEmulationVFIOHeterogeneous: in heterogeneous mode VFs of
// types of different framebuffer sizes coexist on the H200-like GPU, and
// creatable_vgpu_types lists only what the framebuffer left still holds.
func TestKernelEmulationVFIOHeterogeneous(t *testing.T) {
	ctx := context.Background()
	spec := DefaultSpec()
	spec.VFIOGPUs[0].Heterogeneous = true
	h, err := Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	ids := func(vf sysfs.VF) []string {
		var out []string
		for _, c := range vf.Creatable {
			out = append(out, c.ID)
		}
		return out
	}
	// 0000:c1:00.4 holds a 70C (71680 MiB) of the 143771 MiB.
	steps := []struct {
		vf, typ string
		want    []string // creatable on a free VF afterwards
	}{
		{"", "", []string{"1429", "1430", "1431"}},         // 72091 MiB left: no 141C
		{"0000:c1:00.5", "1430", []string{"1430", "1431"}}, // a 35C beside the 70C: 36251 left
		{"0000:c1:00.6", "1431", []string{"1431"}},         // a 17C: 18843 left
		{"0000:c1:00.7", "1431", nil},                      // a second 17C: 1435 left
	}
	for _, st := range steps {
		if st.vf != "" {
			if err := h.Sysfs.SetVFType(ctx, pci.MustParse(st.vf), st.typ); err != nil {
				t.Fatalf("type %s %s: %v", st.vf, st.typ, err)
			}
		}
		vfs, _ := h.Sysfs.VFs(ctx)
		if got := ids(vfs[7]); !slices.Equal(got, st.want) {
			t.Errorf("after %s=%s creatable = %v, want %v", st.vf, st.typ, got, st.want)
		}
	}
	if err := h.Sysfs.SetVFType(ctx, pci.MustParse("0000:c1:01.0"), "1431"); !errors.Is(err, hosterr.ErrNoCapacity) {
		t.Errorf("a third 17C on a full GPU: %v", err)
	}
	// Freeing the 35C gives its framebuffer back.
	if err := h.Sysfs.SetVFType(ctx, pci.MustParse("0000:c1:00.5"), "0"); err != nil {
		t.Fatal(err)
	}
	vfs, _ := h.Sysfs.VFs(ctx)
	if got := ids(vfs[7]); !slices.Equal(got, []string{"1430", "1431"}) {
		t.Errorf("after the 35C's release creatable = %v, want [1430 1431]", got)
	}
}

func TestLibvirtMatches(t *testing.T) {
	ctx := context.Background()
	h, err := Build(t.TempDir(), DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	c, err := libvirt.Open(h.LibvirtURI())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	doms, err := c.Domains(ctx)
	if err != nil || len(doms) != 3 {
		t.Fatalf("domains = %+v, %v", doms, err)
	}
	if doms[0].State != "running" || !slices.Equal(doms[0].Mdevs(), []string{"4b20d080-1b54-4048-85b3-a6a62d165c01"}) {
		t.Errorf("dom0 = %+v", doms[0])
	}
	if doms[1].Hostdevs[0].Type != "pci" || doms[1].Hostdevs[0].Addr != pci.MustParse("0000:c1:00.4") {
		t.Errorf("dom1 = %+v", doms[1])
	}
	if doms[2].State != "shutoff" {
		t.Errorf("dom2 = %+v", doms[2])
	}
	devs, err := c.NodeDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(devs, func(d libvirt.NodeDevice) bool { return d.Name == t4a.Libvirt() })
	if i < 0 || len(devs[i].MdevTypes) != 13 {
		t.Fatalf("gpu node device: %+v", devs)
	}
	j := slices.IndexFunc(devs[i].MdevTypes, func(m libvirt.NodeMdevType) bool { return m.ID == "nvidia-232" })
	if devs[i].MdevTypes[j].AvailableInstances != 3 || devs[i].MdevTypes[j].Name != "GRID T4-4Q" {
		t.Errorf("nvidia-232 in libvirt: %+v", devs[i].MdevTypes[j])
	}
	if !slices.ContainsFunc(devs, func(d libvirt.NodeDevice) bool { return d.Kind == "mdev" && d.ParentAddr == t4a }) {
		t.Error("mdev node device missing")
	}
}

func TestNVMLMatches(t *testing.T) {
	ctx := context.Background()
	h, err := Build(t.TempDir(), DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := h.NVML()
	defer b.Close()
	gpus, err := b.GPUs(ctx)
	if err != nil || len(gpus) != 3 {
		t.Fatalf("gpus = %d, %v", len(gpus), err)
	}
	if gpus[0].Addr != t4a || len(gpus[0].Active) != 1 || gpus[0].Active[0].TypeName != "GRID T4-4Q" ||
		gpus[0].Active[0].VMID != "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01" {
		t.Errorf("gpu0 = %+v", gpus[0])
	}
	if len(gpus[0].CreatableTypes) != 1 || gpus[0].CreatableTypes[0].ID != 232 {
		t.Errorf("gpu0 creatable = %+v", gpus[0].CreatableTypes)
	}
	if err := h.Sysfs.CreateMdev(ctx, t4b, "nvidia-234", newMdev); err != nil {
		t.Fatal(err)
	}
	h.SetLicensed(newMdev, false)
	gpus, _ = b.GPUs(ctx)
	g := gpus[1]
	if len(g.Active) != 1 || g.Active[0].MdevUUID != newMdev || g.Active[0].VMID != "" || g.License.Unlicensed != 1 || len(g.CreatableTypes) != 0 {
		t.Errorf("after create on gpu1: %+v", g)
	}
	if g.Memory.Used != 16384<<20 {
		t.Errorf("fb used = %d", g.Memory.Used)
	}
	if gpus[2].HostVGPUMode != "sriov" || len(gpus[2].Active) != 1 || gpus[2].Active[0].TypeID != 1429 {
		t.Errorf("h200 = %+v", gpus[2])
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	if _, err := Build(dir, DefaultSpec()); err != nil {
		t.Fatal(err)
	}
	h, err := LoadOrBuild(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Sysfs.CreateMdev(context.Background(), t4b, "nvidia-232", newMdev); err != nil {
		t.Fatal(err)
	}
	h2, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ms, _ := h2.Sysfs.Mdevs(context.Background()); len(ms) != 2 {
		t.Errorf("state not kept: %+v", ms)
	}
}

func TestVGPUParams(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	h, err := Build(dir, DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Sysfs.CreateMdev(ctx, t4b, "nvidia-222", newMdev); err != nil {
		t.Fatal(err)
	}
	if err := h.Sysfs.SetVGPUParams(ctx, newMdev, pci.Addr{}, "frame_rate_limiter=0"); err != nil {
		t.Fatal(err)
	}
	if got, err := VGPUParams(dir, newMdev); got != "frame_rate_limiter=0" || err != nil {
		t.Errorf("mdev vgpu_params = %q, %v", got, err)
	}
	if err := h.Sysfs.SetVGPUParams(ctx, "00000000-0000-0000-0000-00000000abcd", pci.Addr{}, "frame_rate_limiter=0"); !errors.Is(err, hosterr.ErrNotFound) {
		t.Errorf("unknown mdev: %v", err)
	}
	if err := h.Sysfs.SetVGPUParams(ctx, newMdev, pci.Addr{}, "a=1\nb=2"); !errors.Is(err, hosterr.ErrInvalid) {
		t.Errorf("two lines: %v", err)
	}
	// A PCI device that is not an NVIDIA vGPU has no vgpu_params.
	if err := h.Sysfs.SetVGPUParams(ctx, "", t4a, "frame_rate_limiter=1"); !errors.Is(err, hosterr.ErrUnsupported) {
		t.Errorf("physical GPU: %v", err)
	}

	vf := pci.MustParse("0000:c1:00.6")
	if err := h.Sysfs.SetVFType(ctx, vf, "1429"); err != nil {
		t.Fatal(err)
	}
	if err := h.Sysfs.SetVGPUParams(ctx, "", vf, "frame_rate_limiter=1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := VGPUParams(dir, vf.String()); got != "frame_rate_limiter=1" {
		t.Errorf("vf vgpu_params = %q", got)
	}
	if err := h.Sysfs.SetVFType(ctx, vf, "0"); err != nil {
		t.Fatal(err)
	}
	if got, _ := VGPUParams(dir, vf.String()); got != "" {
		t.Errorf("vf vgpu_params after clearing its type = %q", got)
	}
}

// TestDriverVersionFile: the loaded driver is the spec's until a
// (simulated) upgrade writes driver_version; NVML reports the file's from
// the next read on.
func TestDriverVersionFile(t *testing.T) {
	h, err := Build(t.TempDir(), DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	backend, _ := h.NVML()
	defer backend.Close()
	version := func() string {
		gs, err := backend.GPUs(context.Background())
		if err != nil || len(gs) == 0 {
			t.Fatalf("gpus = %v, %v", gs, err)
		}
		return gs[0].DriverVersion
	}
	if v := version(); v != DefaultSpec().DriverVersion {
		t.Fatalf("driver = %s, want the spec's %s", v, DefaultSpec().DriverVersion)
	}
	if err := os.WriteFile(filepath.Join(h.Dir, DriverVersionFile), []byte("570.133.10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v := version(); v != "570.133.10" {
		t.Errorf("driver after the upgrade = %s, want 570.133.10", v)
	}
}
