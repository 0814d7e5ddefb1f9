package sysfs

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

const h200Creatable = `ID    : vGPU Name
1428  : NVIDIA H200X-141C
1429  : NVIDIA H200X-70C
1430  : NVIDIA H200X-35C
`

// vfioTree lays out a PF at c1:00.0 with VFs c1:00.4 (types creatable, none
// set), c1:00.5 (header only: nothing fits) and c1:00.6 (type 1429 set).
func vfioTree(t *testing.T) *tree {
	tr := newTree(t)
	pf := "devices/pci0000:c0/0000:c1:00.0"
	tr.file(pf+"/vendor", "0x10de\n")
	tr.file(pf+"/device", "0x2335\n")
	tr.file(pf+"/sriov_totalvfs", "16\n")
	tr.file(pf+"/sriov_numvfs", "3\n")
	tr.mkdir("bus/pci/drivers/nvidia")
	tr.link(pf+"/driver", "../../../bus/pci/drivers/nvidia")
	tr.link("bus/pci/devices/0000:c1:00.0", "../../../"+pf)
	vfs := map[string][2]string{
		"0000:c1:00.4": {h200Creatable, "0\n"},
		"0000:c1:00.5": {"ID    : vGPU Name\n", "0\n"},
		"0000:c1:00.6": {h200Creatable, "1429\n"},
	}
	i := 0
	for _, a := range []string{"0000:c1:00.4", "0000:c1:00.5", "0000:c1:00.6"} {
		d := "devices/pci0000:c0/" + a
		tr.file(d+"/vendor", "0x10de\n")
		tr.file(d+"/nvidia/creatable_vgpu_types", vfs[a][0])
		tr.file(d+"/nvidia/current_vgpu_type", vfs[a][1])
		tr.link(d+"/physfn", "../0000:c1:00.0")
		tr.link(pf+"/virtfn"+string(rune('0'+i)), "../"+a)
		tr.link("bus/pci/devices/"+a, "../../../"+d)
		i++
	}
	// A non-NVIDIA SR-IOV NIC is not a PF we report.
	nic := "devices/pci0000:00/0000:02:00.0"
	tr.file(nic+"/vendor", "0x8086\n")
	tr.file(nic+"/sriov_totalvfs", "64\n")
	tr.link("bus/pci/devices/0000:02:00.0", "../../../"+nic)
	return tr
}

func TestVFs(t *testing.T) {
	ctx := context.Background()
	tr := vfioTree(t)
	h := New(tr.root)
	vfs, err := h.VFs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pf := pci.MustParse("0000:c1:00.0")
	all := []VFType{{"1428", "NVIDIA H200X-141C"}, {"1429", "NVIDIA H200X-70C"}, {"1430", "NVIDIA H200X-35C"}}
	want := []VF{
		{Addr: pci.MustParse("0000:c1:00.4"), PhysFn: pf, Creatable: all},
		{Addr: pci.MustParse("0000:c1:00.5"), PhysFn: pf, Creatable: []VFType{}},
		{Addr: pci.MustParse("0000:c1:00.6"), PhysFn: pf, Creatable: all, Current: "1429", CurrentName: "NVIDIA H200X-70C"},
	}
	if !reflect.DeepEqual(vfs, want) {
		t.Errorf("vfs =\n%+v\nwant\n%+v", vfs, want)
	}
	pfs, err := h.PFs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantPF := []PF{{Addr: pf, VendorID: "0x10de", DeviceID: "0x2335", Driver: "nvidia", TotalVFs: 16, NumVFs: 3,
		VFs: []pci.Addr{want[0].Addr, want[1].Addr, want[2].Addr}}}
	if !reflect.DeepEqual(pfs, wantPF) {
		t.Errorf("pfs = %+v\nwant %+v", pfs, wantPF)
	}
}

func TestSetVFType(t *testing.T) {
	ctx := context.Background()
	tr := vfioTree(t)
	cur := func(a string) string {
		b, _ := os.ReadFile(filepath.Join(tr.root, "bus/pci/devices", a, "nvidia/current_vgpu_type"))
		return string(b)
	}
	h := New(tr.root) // KernelWriter on plain files: the write itself lands
	if err := h.SetVFType(ctx, pci.MustParse("0000:c1:00.4"), "1428"); err != nil {
		t.Fatal(err)
	}
	if got := cur("0000:c1:00.4"); got != "1428" {
		t.Errorf("current = %q", got)
	}
	if err := h.SetVFType(ctx, pci.MustParse("0000:c1:00.4"), "1428"); err != nil {
		t.Errorf("same type again = %v, want no-op", err)
	}
	if err := h.SetVFType(ctx, pci.MustParse("0000:c1:00.6"), "0"); err != nil {
		t.Fatal(err)
	}
	if got := cur("0000:c1:00.6"); got != "0" {
		t.Errorf("cleared = %q", got)
	}
	tests := []struct {
		vf, typ string
		want    hosterr.Code
	}{
		{"0000:c1:00.4", "1430", hosterr.Exists},     // has 1428 now
		{"0000:c1:00.5", "1428", hosterr.NoCapacity}, // header only
		{"0000:c1:00.6", "9999", hosterr.NoCapacity}, // not listed
		{"0000:c1:00.7", "1428", hosterr.NotFound},
		{"0000:02:00.0", "1428", hosterr.NotFound}, // not a vendor-VFIO function
		{"0000:c1:00.6", "H200X-141C", hosterr.Invalid},
	}
	for _, tc := range tests {
		err := h.SetVFType(ctx, pci.MustParse(tc.vf), tc.typ)
		if got := hosterr.CodeOf(err); got != tc.want {
			t.Errorf("SetVFType(%s, %s) = %v (%q), want %q", tc.vf, tc.typ, err, got, tc.want)
		}
	}
	if err := h.SetVFType(ctx, pci.MustParse("0000:c1:00.5"), "0"); err != nil {
		t.Errorf("clear empty vf = %v, want no-op", err)
	}
}

func TestParseCreatableTypes(t *testing.T) {
	tests := []struct {
		in      string
		want    []VFType
		wantErr bool
	}{
		{"", []VFType{}, false},
		{"ID    : vGPU Name\n", []VFType{}, false},
		{h200Creatable, []VFType{{"1428", "NVIDIA H200X-141C"}, {"1429", "NVIDIA H200X-70C"}, {"1430", "NVIDIA H200X-35C"}}, false},
		{"ID : vGPU Name\r\n1428 : NVIDIA H200X-141C\r\n", []VFType{{"1428", "NVIDIA H200X-141C"}}, false},
		{"ID : vGPU Name\n1428\n", []VFType{}, true},
		{"ID : vGPU Name\n1428 : NVIDIA L40S-48Q : extra\n", []VFType{{"1428", "NVIDIA L40S-48Q : extra"}}, false},
	}
	for _, tc := range tests {
		got, err := ParseCreatableTypes(tc.in)
		if (err != nil) != tc.wantErr || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseCreatableTypes(%q) = %+v, %v; want %+v, err %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
	if got, _ := ParseCreatableTypes(FormatCreatableTypes(tests[2].want)); !reflect.DeepEqual(got, tests[2].want) {
		t.Errorf("format round trip = %+v", got)
	}
}

func FuzzParseCreatableTypes(f *testing.F) {
	f.Add(h200Creatable)
	f.Add("ID    : vGPU Name\n")
	f.Add("")
	f.Add("1428:x\n:\n 12 : \n")
	f.Fuzz(func(t *testing.T, s string) {
		types, _ := ParseCreatableTypes(s)
		for _, ty := range types {
			if ty.ID == "" || ty.Name == "" {
				t.Fatalf("empty field in %+v", ty)
			}
		}
		again, err := ParseCreatableTypes(FormatCreatableTypes(types))
		if err != nil || !reflect.DeepEqual(again, types) {
			t.Fatalf("round trip %+v -> %+v, %v", types, again, err)
		}
	})
}

func TestSetNumVFs(t *testing.T) {
	ctx := context.Background()
	pf := pci.MustParse("0000:c1:00.0")
	numvfs := func(tr *tree) string {
		b, _ := os.ReadFile(filepath.Join(tr.root, "bus/pci/devices/0000:c1:00.0/sriov_numvfs"))
		return string(b)
	}
	for _, tc := range []struct {
		name    string
		current string // sriov_numvfs before
		n       int
		code    hosterr.Code // "" for success
		after   string
	}{
		{"from 0", "0\n", 4, "", "4"},
		{"the count it has", "3\n", 3, "", "3\n"},
		{"another count while VFs are enabled", "3\n", 4, hosterr.Exists, "3\n"},
		{"more than sriov_totalvfs", "0\n", 17, hosterr.Invalid, "0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := vfioTree(t)
			tr.file("devices/pci0000:c0/0000:c1:00.0/sriov_numvfs", tc.current)
			err := New(tr.root).SetNumVFs(ctx, pf, tc.n)
			if tc.code == "" && err != nil || tc.code != "" && !hosterr.Is(err, tc.code) {
				t.Errorf("err = %v, want code %q", err, tc.code)
			}
			if got := numvfs(tr); got != tc.after {
				t.Errorf("sriov_numvfs = %q, want %q", got, tc.after)
			}
		})
	}
}
