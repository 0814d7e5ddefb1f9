package inventory_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/gpu"
	"github.com/vgpu-bridge/vgpu-bridge/agent/inventory"
	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
)

func scanner(t testing.TB, spec fakehost.Spec) (*inventory.Scanner, *fakehost.Host) {
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
	return &inventory.Scanner{Host: spec.Host, Sysfs: h.Sysfs, Domains: c, GPUs: b,
		CgroupVersion: func() string { return "v2" }, Allow: inventory.AllowList{All: true}}, h
}

func findType(g inventory.GPU, id string) inventory.Type {
	i := slices.IndexFunc(g.Types, func(t inventory.Type) bool { return t.ID == id })
	if i < 0 {
		return inventory.Type{}
	}
	return g.Types[i]
}

func TestScanFakeHost(t *testing.T) {
	ctx := context.Background()
	s, h := scanner(t, fakehost.DefaultSpec())
	inv, err := s.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Errors) != 0 || !inv.NVML || !slices.Equal(inv.DriverVersions, []string{"550.54.16"}) || inv.CgroupVersion != "v2" {
		t.Fatalf("inventory header: %+v", inv)
	}
	// libvirt's test driver names itself; its QEMU driver would be "KVM (QEMU x.y.z)".
	if !strings.HasPrefix(inv.Hypervisor, "TEST (") {
		t.Errorf("hypervisor %q, want libvirt's test driver with its version", inv.Hypervisor)
	}
	if len(inv.GPUs) != 3 {
		t.Fatalf("gpus = %d", len(inv.GPUs))
	}
	g := inv.GPUs[0]
	if g.Addr != pci.MustParse("0000:3b:00.0") || g.Mode != "mdev" || g.Name != "Tesla T4" || g.Health != "ok" || g.Driver != "nvidia" {
		t.Errorf("gpu0 = %+v", g)
	}
	t232 := findType(g, "nvidia-232")
	if t232 != (inventory.Type{ID: "nvidia-232", Name: "GRID T4-4Q", Class: "Quadro", FramebufferMB: 4096, MaxInstances: 4, Available: 3, InUse: 1, Allowed: true}) {
		t.Errorf("nvidia-232 = %+v", t232)
	}
	if len(g.VGPUs) != 1 || g.VGPUs[0].Instance != "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01" || !g.VGPUs[0].Live ||
		g.VGPUs[0].TypeName != "GRID T4-4Q" || g.VGPUs[0].FBUsage == 0 {
		t.Errorf("gpu0 vgpus = %+v", g.VGPUs)
	}
	h200 := inv.GPUs[1] // sorted by address: 3b, c1, d8
	if h200.Mode != "vendor_vfio" || len(h200.VFs) != 8 || len(h200.VGPUs) != 1 || h200.VGPUs[0].Kind != "vf" ||
		h200.VGPUs[0].Instance != "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c02" || h200.VGPUs[0].TypeName != "NVIDIA H200X-70C" {
		t.Errorf("h200 = %+v", h200)
	}
	if got := findType(h200, "1429"); got.InUse != 1 || got.Available != 1 || got.MaxInstances != 2 {
		t.Errorf("1429 = %+v", got)
	}
	if got := findType(h200, "1428"); got.Available != 0 || got.Name != "NVIDIA H200X-141C" {
		t.Errorf("1428 = %+v", got)
	}
	if len(inv.Orphans) != 0 || len(inv.Domains) != 3 {
		t.Errorf("orphans %v domains %+v", inv.Orphans, inv.Domains)
	}

	// The guest driver NVML reports once the guest loaded it.
	h.SetGuestDriver(g.VGPUs[0].ID, "550.54.15")
	if inv, _ := s.Scan(ctx); inv.GPUs[0].VGPUs[0].GuestDriver != "550.54.15" {
		t.Errorf("guest driver %q, want 550.54.15", inv.GPUs[0].VGPUs[0].GuestDriver)
	}

	// An mdev no domain uses is an orphan.
	const u = "6d7e9b1c-0f2a-4c4e-9e59-0b1d2a3c4d5e"
	if err := h.Sysfs.CreateMdev(ctx, pci.MustParse("0000:d8:00.0"), "nvidia-232", u); err != nil {
		t.Fatal(err)
	}
	inv, _ = s.Scan(ctx)
	if !slices.Equal(inv.Orphans, []string{u}) {
		t.Errorf("orphans = %v", inv.Orphans)
	}
	if got := findType(inv.GPUs[2], "nvidia-232"); got.Available != 3 || got.InUse != 1 {
		t.Errorf("after create: %+v", got)
	}

	b, err := json.Marshal(inv)
	if err != nil || !bytes.Contains(b, []byte(`"pci_address":"0000:3b:00.0"`)) {
		t.Errorf("json: %s %v", b, err)
	}
	var tbl strings.Builder
	if err := inventory.WriteTable(&tbl, inv); err != nil || !strings.Contains(tbl.String(), "GRID T4-4Q") || !strings.Contains(tbl.String(), "ORPHANS") {
		t.Errorf("table:\n%s", tbl.String())
	}
}

func TestScanWithoutNVMLOrLibvirt(t *testing.T) {
	ctx := context.Background()
	h, err := fakehost.Build(t.TempDir(), fakehost.DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	s := &inventory.Scanner{Host: "h", Sysfs: h.Sysfs, GPUs: gpu.None{Reason: "disabled"}, NVMLError: "disabled"}
	inv, err := s.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if inv.NVML || len(inv.GPUs) != 3 || inv.GPUs[0].Health != "unknown" || len(inv.Orphans) != 0 {
		t.Errorf("inventory without NVML/libvirt: %+v", inv)
	}
	if got := findType(inv.GPUs[0], "nvidia-232"); got.Available != 3 || got.MaxInstances != 4 || got.Allowed {
		t.Errorf("type from sysfs only: %+v", got)
	}
}

// failingDomains is a libvirt that does not answer (down, restarting).
type failingDomains struct{}

func (failingDomains) Domains(context.Context) ([]libvirt.Domain, error) {
	return nil, errors.New("cannot recv data: Connection reset by peer")
}

// TestScanLibvirtNotAnswering: when libvirt does not say which domains
// hold which vGPUs, none is called an orphan (the bridge's drift would
// release vGPUs guests use); the scan names libvirt's error.
func TestScanLibvirtNotAnswering(t *testing.T) {
	ctx := context.Background()
	s, h := scanner(t, fakehost.DefaultSpec())
	const u = "6d7e9b1c-0f2a-4c4e-9e59-0b1d2a3c4d5e" // held by no domain: an orphan while libvirt answers
	if err := h.Sysfs.CreateMdev(ctx, pci.MustParse("0000:d8:00.0"), "nvidia-232", u); err != nil {
		t.Fatal(err)
	}
	if inv, err := s.Scan(ctx); err != nil || !slices.Equal(inv.Orphans, []string{u}) {
		t.Fatalf("with libvirt: orphans %v (%v), want [%s]", inv.Orphans, err, u)
	}
	for name, sc := range map[string]*inventory.Scanner{
		"libvirt errs": {Host: "h", Sysfs: h.Sysfs, Domains: failingDomains{}, GPUs: s.GPUs},
		"no libvirt":   {Host: "h", Sysfs: h.Sysfs, GPUs: s.GPUs, LibvirtError: "connect qemu:///system: no such socket"},
	} {
		inv, err := sc.Scan(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(inv.Orphans) != 0 {
			t.Errorf("%s: orphans %v, want none: every vGPU looks unowned without libvirt", name, inv.Orphans)
		}
		if !slices.ContainsFunc(inv.Errors, func(e string) bool { return strings.HasPrefix(e, "libvirt: ") }) {
			t.Errorf("%s: errors %v, want libvirt's", name, inv.Errors)
		}
	}
}

func TestAllowList(t *testing.T) {
	t4a, t4b := pci.MustParse("0000:3b:00.0"), pci.MustParse("0000:d8:00.0")
	vf := pci.MustParse("0000:c1:00.5")
	pf := pci.MustParse("0000:c1:00.0")
	physfn := func(a pci.Addr) (pci.Addr, bool) { return pf, a == vf }
	one := inventory.AllowList{EnabledTypes: []string{"nvidia-232"}}
	many := inventory.AllowList{EnabledTypes: []string{"nvidia-232", "nvidia-222", "1429"}, PhysFn: physfn,
		DeviceAddresses: map[string][]pci.Addr{"nvidia-222": {t4b}, "nvidia-232": {t4a}, "nvidia-1429": {pf}}}
	tests := []struct {
		name string
		a    inventory.AllowList
		gpu  pci.Addr
		typ  string
		want bool
	}{
		{"one type, any gpu", one, t4b, "nvidia-232", true},
		{"one type, other type", one, t4b, "nvidia-222", false},
		{"empty list allows nothing", inventory.AllowList{}, t4a, "nvidia-232", false},
		{"mapped", many, t4b, "nvidia-222", true},
		{"mapped elsewhere", many, t4a, "nvidia-222", false},
		{"vf through its pf", many, vf, "1429", true},
		{"unmapped gpu gets none", many, pci.MustParse("0000:01:00.0"), "nvidia-232", false},
		{"all", inventory.AllowList{All: true}, t4a, "anything", true},
	}
	for _, tc := range tests {
		if got := tc.a.AllowType(tc.gpu, tc.typ); got != tc.want {
			t.Errorf("%s: AllowType = %v", tc.name, got)
		}
	}
	if !many.AllowGPU(t4a) || many.AllowGPU(pci.MustParse("0000:01:00.0")) {
		t.Error("AllowGPU")
	}
	if err := many.Validate(); err != nil {
		t.Error(err)
	}
	bad := inventory.AllowList{EnabledTypes: []string{"nvidia-232", "nvidia-222"},
		DeviceAddresses: map[string][]pci.Addr{"nvidia-222": {t4a}, "nvidia-232": {t4a}}}
	if bad.Validate() == nil {
		t.Error("address in two types accepted")
	}
	if (inventory.AllowList{EnabledTypes: []string{"nvidia-232"}, DeviceAddresses: map[string][]pci.Addr{"nvidia-9": {t4a}}}).Validate() == nil {
		t.Error("addresses for a type not enabled accepted")
	}
}

// bigSpec is 8 GPUs × 32 mdev types, each GPU with a few mdevs.
func bigSpec() fakehost.Spec {
	spec := fakehost.DefaultSpec()
	spec.VFIOGPUs = nil
	spec.Domains = nil
	spec.MdevGPUs = nil
	for i := range 8 {
		g := fakehost.MdevGPU{Addr: pci.Addr{Bus: uint8(0x10 + i)}, Name: "Tesla T4", DeviceID: "0x1eb8", MemoryMB: 65536,
			IOMMUGroup: 10 + i, BAR1MB: 256, Heterogeneous: true}
		for j := range 32 {
			g.Types = append(g.Types, fakehost.Type{ID: fmt.Sprintf("nvidia-%d", 400+j), Name: fmt.Sprintf("GRID X-%dQ", j),
				Class: "Quadro", FramebufferMB: 1024, MaxInstance: 64, NumHeads: 4, FRLConfig: 60, MaxResolution: "7680x4320"})
		}
		for k := range 4 {
			g.Mdevs = append(g.Mdevs, fakehost.Mdev{UUID: fmt.Sprintf("00000000-0000-4000-8000-%012d", i*10+k), Type: "nvidia-400"})
		}
		spec.MdevGPUs = append(spec.MdevGPUs, g)
	}
	return spec
}

// BenchmarkScan8x32 is one inventory scan of 8 GPUs × 32 types (sysfs +
// libvirt test driver + NVML mock).
func BenchmarkScan8x32(b *testing.B) {
	s, _ := scanner(b, bigSpec())
	ctx := context.Background()
	inv, err := s.Scan(ctx)
	if err != nil || len(inv.GPUs) != 8 || len(inv.GPUs[0].Types) != 32 {
		b.Fatalf("scan: %d gpus, %v", len(inv.GPUs), err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Scan(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScan8x32SysfsOnly isolates the sysfs part.
func BenchmarkScan8x32SysfsOnly(b *testing.B) {
	s, _ := scanner(b, bigSpec())
	s.Domains, s.GPUs = nil, nil
	ctx := context.Background()
	for b.Loop() {
		if _, err := s.Scan(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// racySysfs is the fake host's sysfs with a hand-made race: before each of
// the first `torn` reads of 0000:3b:00.0's types it empties one type's
// available_instances, as the file reads between the truncate and the write
// that rewrite it after an mdev is created or removed, and puts it back after
// the read. listEmpty lists no types; parentErr fails the parents' listing.
type racySysfs struct {
	inventory.Sysfs
	file      string
	torn      int
	listEmpty bool
	parentErr error
	calls     int
}

func (r *racySysfs) MdevParents(ctx context.Context) ([]sysfs.Parent, error) {
	if r.parentErr != nil {
		return nil, r.parentErr
	}
	return r.Sysfs.MdevParents(ctx)
}

func (r *racySysfs) Types(ctx context.Context, parent pci.Addr) ([]sysfs.MdevType, error) {
	if parent != pci.MustParse("0000:3b:00.0") {
		return r.Sysfs.Types(ctx, parent)
	}
	r.calls++
	if r.listEmpty {
		return []sysfs.MdevType{}, nil
	}
	if r.calls > r.torn {
		return r.Sysfs.Types(ctx, parent)
	}
	old, err := os.ReadFile(r.file)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(r.file, nil, 0o644); err != nil {
		return nil, err
	}
	defer os.WriteFile(r.file, old, 0o644) //nolint:errcheck // restored for the next read
	return r.Sysfs.Types(ctx, parent)
}

// TestScanMdevTypesUnreadable: an mdev GPU whose types cannot be read (or
// list empty) is never reported with NVML's numeric type ids ("230"), which
// would re-key the bridge's profile catalog; a torn read is retried.
func TestScanMdevTypesUnreadable(t *testing.T) {
	t4 := pci.MustParse("0000:3b:00.0")
	tests := []struct {
		name      string
		sys       racySysfs
		wantTypes bool // nvidia-232 reported with its sysfs counts
		wantErr   string
	}{
		{name: "torn read retried", sys: racySysfs{torn: 1}, wantTypes: true},
		{name: "torn twice retried", sys: racySysfs{torn: 2}, wantTypes: true},
		{name: "torn on every attempt", sys: racySysfs{torn: 1000}, wantErr: `available_instances: strconv.Atoi: parsing ""`},
		{name: "empty list", sys: racySysfs{listEmpty: true}},
		{name: "parents unreadable", sys: racySysfs{parentErr: errors.New("list mdev parents: EIO")}, wantErr: "sysfs: list mdev parents: EIO"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, h := scanner(t, fakehost.DefaultSpec())
			r := tc.sys
			r.Sysfs = s.Sysfs
			r.file = filepath.Join(h.SysRoot, "class/mdev_bus", t4.String(), "mdev_supported_types/nvidia-232/available_instances")
			s.Sysfs = &r
			inv, err := s.Scan(ctx)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(inv.GPUs, func(g inventory.GPU) bool { return g.Addr == t4 })
			if i < 0 {
				t.Fatalf("%s not reported: %+v", t4, inv.GPUs)
			}
			g := inv.GPUs[i]
			for _, ty := range g.Types {
				if !strings.HasPrefix(ty.ID, "nvidia-") {
					t.Errorf("%s reported type %q (%s); want only mdev type ids", t4, ty.ID, ty.Name)
				}
			}
			got := findType(g, "nvidia-232")
			if tc.wantTypes {
				if got.Available != 3 || got.InUse != 1 || got.Name != "GRID T4-4Q" {
					t.Errorf("nvidia-232 = %+v", got)
				}
			} else if len(g.Types) != 0 {
				t.Errorf("types = %+v, want none", g.Types)
			}
			errs := strings.Join(inv.Errors, "\n")
			if tc.wantErr == "" && errs != "" || !strings.Contains(errs, tc.wantErr) {
				t.Errorf("errors = %q, want %q", errs, tc.wantErr)
			}
			if tc.sys.parentErr == nil && (len(g.VGPUs) != 1 || g.VGPUs[0].Instance == "") {
				t.Errorf("vgpus = %+v, want its one mdev whatever its types", g.VGPUs)
			}
			if _, err := os.ReadFile(r.file); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMIGBackedTypesRefused: a GPU offering MIG-backed types (A100-1-5C)
// beside time-sliced ones lists them refused, with the reason, whatever
// the allow-list, and the agent's report offers only the time-sliced ones.
func TestMIGBackedTypesRefused(t *testing.T) {
	spec := fakehost.DefaultSpec()
	spec.VFIOGPUs, spec.Domains = nil, nil
	a100 := fakehost.MdevGPU{Addr: pci.MustParse("0000:af:00.0"), Name: "NVIDIA A100-PCIE-40GB", DeviceID: "0x20f1", MemoryMB: 40960,
		IOMMUGroup: 40, BAR1MB: 256,
		Types: []fakehost.Type{
			{ID: "nvidia-470", Name: "GRID A100-4C", Class: "Compute", FramebufferMB: 4096, MaxInstance: 10},
			{ID: "nvidia-699", Name: "GRID A100-1-5C", Class: "Compute", FramebufferMB: 4864, MaxInstance: 7},
		}}
	spec.MdevGPUs = []fakehost.MdevGPU{a100}
	s, _ := scanner(t, spec)
	inv, err := s.Scan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(inv.GPUs, func(g inventory.GPU) bool { return g.Addr == a100.Addr })
	if i < 0 {
		t.Fatalf("A100 not scanned: %+v", inv.GPUs)
	}
	g := inv.GPUs[i]
	if mig := findType(g, "nvidia-699"); mig.Allowed || !strings.Contains(mig.Refused, "MIG") {
		t.Errorf("MIG-backed type = %+v, want refused", mig)
	}
	if ts := findType(g, "nvidia-470"); !ts.Allowed || ts.Refused != "" {
		t.Errorf("time-sliced type = %+v, want allowed", ts)
	}
	rep := agent.ToReport(inv, nil)
	for _, rg := range rep.GPUs {
		for _, rt := range rg.Types {
			if rt.ID == "nvidia-699" {
				t.Errorf("report offers the MIG-backed type on %s", rg.PCI)
			}
		}
	}
	var out strings.Builder
	if err := inventory.WriteTable(&out, inv); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "nvidia-699 refused") {
		t.Errorf("table does not show the refusal:\n%s", out.String())
	}
}

// TestScanVFIOHeterogeneous: on a vendor-VFIO GPU in heterogeneous mode
// every free VF lists each type that fits once more; the scan counts how
// many of each the framebuffer left still holds (the 70C of Nova's VF and
// a 35C leave 36251 of 143771 MiB: one 35C or two 17C, no 70C).
func TestScanVFIOHeterogeneous(t *testing.T) {
	ctx := context.Background()
	spec := fakehost.DefaultSpec()
	spec.VFIOGPUs[0].Heterogeneous = true
	s, h := scanner(t, spec)
	if err := h.Sysfs.SetVFType(ctx, pci.MustParse("0000:c1:00.5"), "1430"); err != nil {
		t.Fatal(err)
	}
	inv, err := s.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h200 := inv.GPUs[1]
	if h200.Heterogeneous == nil || !*h200.Heterogeneous {
		t.Errorf("heterogeneous = %v, want true (NVML's mode)", h200.Heterogeneous)
	}
	for _, c := range []struct {
		id           string
		inUse, avail int
	}{{"1428", 0, 0}, {"1429", 1, 0}, {"1430", 1, 1}, {"1431", 0, 2}} {
		if got := findType(h200, c.id); got.InUse != c.inUse || got.Available != c.avail {
			t.Errorf("%s: in use %d, available %d; want %d, %d", c.id, got.InUse, got.Available, c.inUse, c.avail)
		}
	}
}

// TestReportDeviceIDs: the report carries the GPUs' PCI device ids as
// Nova's product_id (4 hex digits), the VFs' read from their own sysfs
// device file, which may differ from the PF's.
func TestReportDeviceIDs(t *testing.T) {
	for _, tc := range []struct{ name, vfDev, want string }{
		{"same as the PF", "", "2335"},
		{"own VF id", "0x233B", "233b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := fakehost.DefaultSpec()
			spec.Domains = nil
			spec.VFIOGPUs[0].VFDeviceID = tc.vfDev
			s, _ := scanner(t, spec)
			inv, err := s.Scan(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			rep := agent.ToReport(inv, nil)
			i := slices.IndexFunc(rep.GPUs, func(g protocol.GPU) bool { return g.PCI == spec.VFIOGPUs[0].Addr.String() })
			if i < 0 {
				t.Fatalf("no report of %s: %+v", spec.VFIOGPUs[0].Addr, rep.GPUs)
			}
			if g := rep.GPUs[i]; g.DeviceID != "2335" || g.VFDeviceID != tc.want || !g.VendorVFIO {
				t.Errorf("device_id %q vf_device_id %q, want 2335 and %s", g.DeviceID, g.VFDeviceID, tc.want)
			}
			for _, g := range rep.GPUs {
				if !g.VendorVFIO && (g.DeviceID != "1eb8" || g.VFDeviceID != "") {
					t.Errorf("%s: device_id %q vf_device_id %q, want 1eb8 and none", g.PCI, g.DeviceID, g.VFDeviceID)
				}
			}
		})
	}
}
