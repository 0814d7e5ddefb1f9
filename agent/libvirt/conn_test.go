package libvirt

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	lv "libvirt.org/go/libvirt"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

const (
	vm1 = "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01" // running, one mdev + one VF
	vm2 = "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c02" // shut off, no devices
	md2 = "9f1c3c5e-2f4b-4b8e-8d5e-000000000002"
)

// openTest opens the test driver on testdata/node.xml; each Conn has its own state.
func openTest(t *testing.T) *Conn {
	t.Helper()
	abs, err := filepath.Abs("testdata/node.xml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open("test://" + abs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestDomains(t *testing.T) {
	ctx := context.Background()
	c := openTest(t)
	doms, err := c.Domains(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(doms) != 2 {
		t.Fatalf("domains = %+v", doms)
	}
	d := doms[0]
	if d.Name != "instance-00000001" || d.UUID != vm1 || d.State != "running" {
		t.Errorf("domain 1 = %+v", d)
	}
	want := []Hostdev{
		{Type: "mdev", MdevUUID: corpusUUID, Model: "vfio-pci", Live: true, Config: true},
		{Type: "pci", Addr: pci.MustParse("0000:c1:00.4"), Live: true, Config: true},
	}
	if !slices.Equal(d.Hostdevs, want) {
		t.Errorf("hostdevs = %+v\nwant %+v", d.Hostdevs, want)
	}
	if doms[1].State != "shutoff" || len(doms[1].Hostdevs) != 0 || doms[1].Running() {
		t.Errorf("domain 2 = %+v", doms[1])
	}
}

func TestNodeDevices(t *testing.T) {
	c := openTest(t)
	devs, err := c.NodeDevices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var gpu, mdev *NodeDevice
	for i := range devs {
		switch devs[i].Name {
		case "pci_0000_3b_00_0":
			gpu = &devs[i]
		case "mdev_53764d0e_85a0_42b4_af5c_2046b460b1dc_0000_3b_00_0":
			mdev = &devs[i]
		}
	}
	if gpu == nil || gpu.Addr != pci.MustParse("0000:3b:00.0") || len(gpu.MdevTypes) != 2 || gpu.MdevTypes[1] != (NodeMdevType{"nvidia-232", "GRID T4-4Q", "vfio-pci", 3}) {
		t.Errorf("gpu = %+v", gpu)
	}
	if mdev == nil || mdev.MdevUUID != corpusUUID || mdev.MdevType != "nvidia-232" || mdev.ParentAddr != gpu.Addr {
		t.Errorf("mdev = %+v", mdev)
	}
}

func TestDefineWithHostdev(t *testing.T) {
	ctx := context.Background()
	c := openTest(t)
	for range 2 { // idempotent
		if err := c.DefineWithHostdev(ctx, vm2, md2); err != nil {
			t.Fatal(err)
		}
	}
	d, err := c.Domain(ctx, vm2)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Mdevs(); !slices.Equal(got, []string{md2}) || !d.Hostdevs[0].Config || d.Hostdevs[0].Live {
		t.Errorf("after define: %+v", d.Hostdevs)
	}
	// Config changes to a running domain wait for the next start.
	if err := c.DefineWithHostdev(ctx, vm1, md2); err != nil {
		t.Fatal(err)
	}
	d, _ = c.Domain(ctx, vm1)
	i := slices.IndexFunc(d.Hostdevs, func(h Hostdev) bool { return h.MdevUUID == md2 })
	if i < 0 || !d.Hostdevs[i].Config || d.Hostdevs[i].Live {
		t.Errorf("running domain after define: %+v", d.Hostdevs)
	}
	// Cold path: shutdown, start → live.
	if err := c.Shutdown(ctx, vm1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Shutdown(ctx, vm1, time.Second); err != nil {
		t.Errorf("second shutdown: %v", err)
	}
	if err := c.Start(ctx, vm1); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, vm1); err != nil {
		t.Errorf("second start: %v", err)
	}
	d, _ = c.Domain(ctx, vm1)
	i = slices.IndexFunc(d.Hostdevs, func(h Hostdev) bool { return h.MdevUUID == md2 })
	if d.State != "running" || i < 0 || !d.Hostdevs[i].Live {
		t.Errorf("after restart: %+v", d)
	}
	for range 2 {
		if err := c.RemoveHostdevConfig(ctx, vm2, md2); err != nil {
			t.Fatal(err)
		}
	}
	if d, _ := c.Domain(ctx, vm2); len(d.Hostdevs) != 0 {
		t.Errorf("after remove: %+v", d.Hostdevs)
	}
	if err := c.DefineWithHostdev(ctx, "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3cff", md2); !errors.Is(err, hosterr.ErrNotFound) {
		t.Errorf("unknown domain: %v", err)
	}
}

// TestErrorMapping proves each libvirt error maps to its stable code, with
// the real test driver wherever it produces the error.
func TestErrorMapping(t *testing.T) {
	ctx := context.Background()
	c := openTest(t)
	raw := c.raw()
	dom2, err := raw.LookupDomainByUUIDString(vm2)
	if err != nil {
		t.Fatal(err)
	}
	defer dom2.Free()
	_, lookupErr := raw.LookupDomainByUUIDString("0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3cff")
	_, nodeErr := raw.LookupDeviceByName("pci_0000_99_00_0")
	tests := []struct {
		name string
		err  error
		want hosterr.Code
	}{
		// real test driver errors
		{"attach unsupported (ERR_NO_SUPPORT)", LiveHotPlugger{Conn: c}.AttachLive(ctx, vm1, MdevHostdevXML(md2)), hosterr.Unsupported},
		{"detach unsupported (ERR_NO_SUPPORT)", LiveHotPlugger{Conn: c}.DetachLive(ctx, vm1, MdevHostdevXML(corpusUUID)), hosterr.Unsupported},
		{"detach of a device the domain does not have", LiveHotPlugger{Conn: c}.DetachLive(ctx, vm1, MdevHostdevXML(md2)), hosterr.NotFound},
		{"destroy shut-off domain (domain is not running)", dom2.Destroy(), hosterr.DomainNotRunning},
		{"shutdown shut-off domain (internal error: not running)", dom2.Shutdown(), hosterr.DomainNotRunning},
		{"unknown domain (ERR_NO_DOMAIN)", lookupErr, hosterr.NotFound},
		{"unknown node device (ERR_NO_NODE_DEVICE)", nodeErr, hosterr.NotFound},
		{"unsupported flags", dom2.SetSchedulerParametersFlags(&lv.DomainSchedulerParameters{CpuSharesSet: true, CpuShares: 2}, lv.DOMAIN_AFFECT_CONFIG), hosterr.Unsupported},
		// errors only QEMU produces: the error libvirt returns, built by hand
		{"qemu: requires VFIO support", lv.Error{Code: lv.ERR_CONFIG_UNSUPPORTED, Domain: lv.FROM_QEMU,
			Message: "unsupported configuration: Mediated host device assignment requires VFIO support"}, hosterr.VFIOUnavailable},
		{"qemu: device not found (ERR_DEVICE_MISSING)", lv.Error{Code: lv.ERR_DEVICE_MISSING, Domain: lv.FROM_DOMAIN,
			Message: "device not found: mediated device '53764d0e-85a0-42b4-af5c-2046b460b1dc' not found"}, hosterr.NotFound},
		{"qemu: bus without hot-plug (seen in tests/lab)", lv.Error{Code: lv.ERR_INTERNAL_ERROR, Domain: lv.FROM_QEMU,
			Message: "internal error: unable to execute QEMU command 'device_add': Bus 'pci.0' does not support hotplugging"}, hosterr.Unsupported},
		{"qemu: operation unsupported", lv.Error{Code: lv.ERR_OPERATION_UNSUPPORTED, Message: "Operation not supported: cannot hotplug"}, hosterr.Unsupported},
		{"timeout", lv.Error{Code: lv.ERR_OPERATION_TIMEOUT, Message: "Timed out during operation"}, hosterr.Timeout},
		{"access denied", lv.Error{Code: lv.ERR_ACCESS_DENIED, Message: "access denied"}, hosterr.PermissionDenied},
		{"other", lv.Error{Code: lv.ERR_INTERNAL_ERROR, Message: "internal error: something"}, hosterr.Internal},
	}
	for _, tc := range tests {
		if tc.err == nil {
			t.Errorf("%s: no error from libvirt", tc.name)
			continue
		}
		if got := hosterr.CodeOf(Classify("op", tc.err)); got != tc.want {
			t.Errorf("%s: %v -> %q, want %q", tc.name, tc.err, got, tc.want)
		}
	}
	if hosterr.NvidiaCode(hosterr.VFIOUnavailable) != 62 {
		t.Error("VFIO failure must carry label 62")
	}
}

func TestFakeHotPlugger(t *testing.T) {
	ctx := context.Background()
	c := openTest(t)
	hp := &FakeHotPlugger{Conn: c}
	x := MdevHostdevXML(md2)
	if err := hp.AttachLive(ctx, vm1, x); err != nil {
		t.Fatal(err)
	}
	d, _ := c.Domain(ctx, vm1)
	i := slices.IndexFunc(d.Hostdevs, func(h Hostdev) bool { return h.MdevUUID == md2 })
	if i < 0 || !d.Hostdevs[i].Live || !d.Hostdevs[i].Config || d.State != "running" {
		t.Fatalf("after attach: %+v", d)
	}
	if err := hp.AttachLive(ctx, vm1, x); !errors.Is(err, hosterr.ErrExists) {
		t.Errorf("attach twice: %v", err)
	}
	if err := hp.DetachLive(ctx, vm1, x); err != nil {
		t.Fatal(err)
	}
	if err := hp.DetachLive(ctx, vm1, x); !errors.Is(err, hosterr.ErrNotFound) {
		t.Errorf("detach twice: %v", err)
	}
	if err := hp.AttachLive(ctx, vm2, x); !errors.Is(err, hosterr.ErrDomainNotRunning) {
		t.Errorf("attach to shut-off domain: %v", err)
	}
	hp.SetErr(lv.Error{Code: lv.ERR_CONFIG_UNSUPPORTED, Message: "unsupported configuration: Mediated host device assignment requires VFIO support"})
	if err := hp.AttachLive(ctx, vm1, x); !errors.Is(err, hosterr.ErrVFIOUnavailable) {
		t.Errorf("programmed VFIO error: %v", err)
	}
}

func TestSetTunables(t *testing.T) {
	ctx := context.Background()
	c := openTest(t)
	if err := c.SetTunables(ctx, vm2, Tunables{MemoryHighKiB: 524288}); err != nil {
		t.Errorf("memory soft limit on the test driver: %v", err)
	}
	// The test driver has no CPU bandwidth control: the caller falls back to cgroup files.
	if err := c.SetTunables(ctx, vm2, Tunables{CPUPeriodUs: 100000, CPUQuotaUs: 50000}); !errors.Is(err, hosterr.ErrUnsupported) {
		t.Errorf("cpu quota on the test driver: %v", err)
	}
}
