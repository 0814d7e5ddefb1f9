package diagnose_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/diagnose"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

func setup(t *testing.T, spec fakehost.Spec) (*diagnose.Diagnoser, *fakehost.Host, *inventory.Scanner) {
	t.Helper()
	h, err := fakehost.Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	c, err := libvirt.Open(h.LibvirtURI())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b, _ := h.NVML()
	t.Cleanup(b.Close)
	s := &inventory.Scanner{Host: spec.Host, Sysfs: h.Sysfs, Domains: c, GPUs: b,
		Allow: inventory.AllowList{EnabledTypes: []string{"nvidia-232"}}}
	return &diagnose.Diagnoser{Scanner: s, Host: h.Sysfs, ProcRoot: h.ProcRoot}, h, s
}

func findings(r *diagnose.Report, check string) []diagnose.Finding {
	var out []diagnose.Finding
	for _, f := range r.Findings {
		if f.Check == check && f.Severity != diagnose.OK {
			out = append(out, f)
		}
	}
	return out
}

func TestHealthyHost(t *testing.T) {
	d, _, _ := setup(t, fakehost.DefaultSpec())
	r, err := d.Run(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Worst != diagnose.OK {
		for _, f := range r.Findings {
			t.Logf("%+v", f)
		}
		t.Errorf("worst = %s on the default fake host", r.Worst)
	}
	if len(r.Findings) != len(diagnose.AllChecks) {
		t.Errorf("findings = %d, want one OK per check", len(r.Findings))
	}
}

func TestEachCheckFires(t *testing.T) {
	ctx := context.Background()
	spec := fakehost.DefaultSpec()
	spec.KernelCmdline = "root=/dev/sda1 ro"                      // no IOMMU flags, no pci=realloc=off
	spec.Modules = []string{"nvidia", "vfio", "vfio_iommu_type1"} // vfio_pci, nvidia_vgpu_vfio missing
	d, h, _ := setup(t, spec)
	t4b := pci.MustParse("0000:d8:00.0")
	// Fill the second T4 with 4 × T4-4Q: no capacity (48); two of them orphans.
	for _, u := range []string{"00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002",
		"00000000-0000-4000-8000-000000000003", "00000000-0000-4000-8000-000000000004"} {
		if err := h.Sysfs.CreateMdev(ctx, t4b, "nvidia-232", u); err != nil {
			t.Fatal(err)
		}
	}
	h.SetLicensed("4b20d080-1b54-4048-85b3-a6a62d165c01", false)          // 74
	h.SetGuestDriver("4b20d080-1b54-4048-85b3-a6a62d165c01", "570.86.15") // host 550: 43
	// An unrelated device in the first T4's IOMMU group (no ACS).
	os.MkdirAll(filepath.Join(h.SysRoot, "devices/pci0000:30/0000:3a:00.0"), 0o755)
	os.Symlink("../../../../devices/pci0000:30/0000:3a:00.0", filepath.Join(h.SysRoot, "kernel/iommu_groups/27/devices/0000:3a:00.0"))

	r, err := d.Run(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		sev  diagnose.Severity
		code int
	}{
		diagnose.CheckDriverMatch: {diagnose.Error, 43},
		diagnose.CheckCapacity:    {diagnose.Warning, 48},
		diagnose.CheckHotAdd:      {diagnose.Error, 62},
		diagnose.CheckLicense:     {diagnose.Error, 74},
		diagnose.CheckBAR:         {diagnose.Warning, 0},
		diagnose.CheckOrphans:     {diagnose.Warning, 0},
	}
	for check, w := range want {
		fs := findings(r, check)
		if len(fs) == 0 {
			t.Errorf("%s did not fire", check)
			continue
		}
		f := fs[0]
		if f.Severity != w.sev || f.NvidiaCode != w.code || f.Fix == "" || len(f.Evidence) == 0 {
			t.Errorf("%s = %+v", check, f)
		}
	}
	if fs := findings(r, diagnose.CheckHotAdd); len(fs) != 2 || !strings.Contains(fs[0].Evidence[0], "vfio_pci") ||
		!strings.Contains(fs[1].Evidence[1], "0000:3a:00.0") {
		t.Errorf("hot-add findings = %+v", fs)
	}
	if fs := findings(r, diagnose.CheckBAR); len(fs) != 1 || fs[0].Subject != "0000:c1:00.0" {
		t.Errorf("bar findings = %+v", fs)
	}
	if r.Worst != diagnose.Error {
		t.Errorf("worst = %s", r.Worst)
	}
	var sb strings.Builder
	diagnose.WriteTable(&sb, r)
	if !strings.Contains(sb.String(), "code 43") && !strings.Contains(sb.String(), "43") {
		t.Errorf("table:\n%s", sb.String())
	}
	raw, err := d.Diagnose(ctx, []string{diagnose.CheckLicense})
	var back diagnose.Report
	if err != nil || json.Unmarshal(raw, &back) != nil || len(back.Findings) != 1 || back.Findings[0].NvidiaCode != 74 {
		t.Errorf("Diagnose(license) = %s, %v", raw, err)
	}
	if _, err := d.Run(ctx, []string{"nope"}); err == nil {
		t.Error("unknown check accepted")
	}
}

func TestNoNVMLNoIOMMU(t *testing.T) {
	ctx := context.Background()
	spec := fakehost.DefaultSpec()
	h, err := fakehost.Build(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(h.SysRoot, "kernel/iommu_groups"))
	s := &inventory.Scanner{Host: "h", Sysfs: h.Sysfs, GPUs: gpu.None{}, NVMLError: "NVML library not found (libnvidia-ml.so.1)"}
	d := &diagnose.Diagnoser{Scanner: s, Host: h.Sysfs, ProcRoot: h.ProcRoot}
	r, err := d.Run(ctx, []string{diagnose.CheckNVML, diagnose.CheckHotAdd})
	if err != nil {
		t.Fatal(err)
	}
	if fs := findings(r, diagnose.CheckNVML); len(fs) != 1 || fs[0].Severity != diagnose.Warning || !strings.Contains(fs[0].Evidence[1], "libnvidia-ml") {
		t.Errorf("nvml = %+v", fs)
	}
	if fs := findings(r, diagnose.CheckHotAdd); len(fs) == 0 || !strings.Contains(fs[0].Title, "IOMMU is off") {
		t.Errorf("iommu = %+v", fs)
	}
}

// TestLibvirtDownNVMLOff: a host whose libvirt does not answer is
// diagnosed (a critical finding naming libvirt's error; orphans not
// judged), not refused; NVML turned off by [nvml] backend = none is not a
// finding, as the NVML finding's fix promises.
func TestLibvirtDownNVMLOff(t *testing.T) {
	ctx := context.Background()
	h, err := fakehost.Build(t.TempDir(), fakehost.DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	const u = "6d7e9b1c-0f2a-4c4e-9e59-0b1d2a3c4d5e" // an mdev that would look orphaned
	if err := h.Sysfs.CreateMdev(ctx, pci.MustParse("0000:d8:00.0"), "nvidia-232", u); err != nil {
		t.Fatal(err)
	}
	s := &inventory.Scanner{Host: "h", Sysfs: h.Sysfs, GPUs: gpu.None{Reason: gpu.DisabledByConfig}, NVMLError: gpu.DisabledByConfig,
		LibvirtError: "connect qemu:///system: Failed to connect socket to '/var/run/libvirt/libvirt-sock'"}
	d := &diagnose.Diagnoser{Scanner: s, Host: h.Sysfs, ProcRoot: h.ProcRoot}
	r, err := d.Run(ctx, []string{diagnose.CheckLibvirt, diagnose.CheckNVML, diagnose.CheckOrphans})
	if err != nil {
		t.Fatal(err)
	}
	if fs := findings(r, diagnose.CheckLibvirt); len(fs) != 1 || fs[0].Severity != diagnose.Critical ||
		!strings.Contains(strings.Join(fs[0].Evidence, " "), "libvirt-sock") {
		t.Errorf("libvirt = %+v, want one critical finding naming the error", fs)
	}
	if fs := findings(r, diagnose.CheckNVML); len(fs) != 0 {
		t.Errorf("nvml = %+v, want no finding when backend = none", fs)
	}
	if fs := findings(r, diagnose.CheckOrphans); len(fs) != 1 || fs[0].Severity != diagnose.Info || !strings.Contains(fs[0].Title, "not checked") {
		t.Errorf("orphans = %+v, want not checked", fs)
	}
	if r.Worst != diagnose.Critical {
		t.Errorf("worst %s, want critical", r.Worst)
	}
}

func TestMixedTypes(t *testing.T) {
	ctx := context.Background()
	spec := fakehost.DefaultSpec()
	spec.MdevGPUs[1].Heterogeneous = true
	d, h, _ := setup(t, spec)
	t4b := pci.MustParse("0000:d8:00.0")
	h.Sysfs.CreateMdev(ctx, t4b, "nvidia-232", "00000000-0000-4000-8000-000000000001")
	h.Sysfs.CreateMdev(ctx, t4b, "nvidia-231", "00000000-0000-4000-8000-000000000002")
	r, _ := d.Run(ctx, []string{diagnose.CheckMixedTypes})
	if fs := findings(r, diagnose.CheckMixedTypes); len(fs) != 1 || fs[0].Severity != diagnose.Info {
		t.Errorf("mixed = %+v", fs)
	}
}
