package libvirt

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const corpusUUID = "53764d0e-85a0-42b4-af5c-2046b460b1dc"

func TestParseDomainXMLCorpus(t *testing.T) {
	tests := []struct {
		file string
		want Domain
	}{
		{"hostdev-mdev-precreated.xml", Domain{Name: "QEMUGuest2", UUID: "c7a5fdbd-edaf-9455-926a-d65c16db1809",
			Hostdevs: []Hostdev{{Type: "mdev", MdevUUID: corpusUUID, Model: "vfio-pci"}}}},
		{"hostdev-mdev-precreated.x86_64-latest.xml", Domain{Name: "QEMUGuest2", UUID: "c7a5fdbd-edaf-9455-926a-d65c16db1809",
			Hostdevs: []Hostdev{{Type: "mdev", MdevUUID: corpusUUID, Model: "vfio-pci", Display: "off"}}}},
		{"hostdev-mdev-duplicate.xml", Domain{Name: "QEMUGuest2", UUID: "c7a5fdbd-edaf-9455-926a-d65c16db1809",
			Hostdevs: []Hostdev{{Type: "mdev", MdevUUID: corpusUUID, Model: "vfio-pci"}, {Type: "mdev", MdevUUID: corpusUUID, Model: "vfio-pci"}}}},
		{"hostdev-mdev-display-ramfb.xml", Domain{Name: "QEMUGuest2", UUID: "c7a5fdbd-edaf-9455-926a-d65c16db1809",
			Hostdevs: []Hostdev{{Type: "mdev", MdevUUID: corpusUUID, Model: "vfio-pci", Display: "on"}}}},
	}
	for _, tc := range tests {
		got, err := ParseDomainXML(readTestdata(t, tc.file))
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.file, got, tc.want)
		}
	}
}

func TestAddRemoveHostdev(t *testing.T) {
	doc := readTestdata(t, "hostdev-mdev-precreated.xml")
	const other = "9f1c3c5e-2f4b-4b8e-8d5e-000000000001"
	out, added, err := AddHostdev(doc, MdevHostdevXML(corpusUUID))
	if err != nil || added || out != doc {
		t.Fatalf("re-adding the present mdev: added=%v err=%v changed=%v", added, err, out != doc)
	}
	out, added, err = AddHostdev(doc, MdevHostdevXML(other))
	if err != nil || !added {
		t.Fatalf("add: %v %v", added, err)
	}
	d, err := ParseDomainXML(out)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(d.Mdevs(), ","); got != corpusUUID+","+other {
		t.Errorf("mdevs after add = %s", got)
	}
	// Everything outside the inserted element is byte-identical.
	if !strings.HasPrefix(out, doc[:strings.Index(doc, "    <memballoon")]) {
		t.Error("prefix of the document changed")
	}
	back, removed, err := RemoveHostdev(out, MdevHostdevXML(other))
	if err != nil || !removed {
		t.Fatalf("remove: %v %v", removed, err)
	}
	if d, _ := ParseDomainXML(back); strings.Join(d.Mdevs(), ",") != corpusUUID {
		t.Errorf("mdevs after remove = %v", d.Mdevs())
	}
	// Removing both copies of a duplicated hostdev.
	dup := readTestdata(t, "hostdev-mdev-duplicate.xml")
	out, removed, err = RemoveHostdev(dup, MdevHostdevXML(strings.ToUpper(corpusUUID)))
	if err != nil || !removed {
		t.Fatalf("remove dup: %v %v", removed, err)
	}
	if d, _ := ParseDomainXML(out); len(d.Hostdevs) != 0 {
		t.Errorf("hostdevs left: %+v", d.Hostdevs)
	}
	if _, removed, _ := RemoveHostdev(out, MdevHostdevXML(corpusUUID)); removed {
		t.Error("removed from a domain without it")
	}
	// PCI hostdevs (vendor-VFIO VFs).
	vf := pci.MustParse("0000:c1:00.4")
	out, added, err = AddHostdev(doc, PCIHostdevXML(vf))
	if err != nil || !added {
		t.Fatal(added, err)
	}
	if d, _ := ParseDomainXML(out); len(d.Hostdevs) != 2 || d.Hostdevs[1].Addr != vf || d.Hostdevs[1].Type != "pci" {
		t.Errorf("pci hostdev: %+v", d.Hostdevs)
	}
	if _, _, err := AddHostdev(doc, "<disk/>"); err == nil {
		t.Error("AddHostdev accepted a non-hostdev")
	}
	noDevices := "<domain type='kvm'><name>x</name></domain>"
	out, added, err = AddHostdev(noDevices, MdevHostdevXML(other))
	if d, _ := ParseDomainXML(out); err != nil || !added || len(d.Mdevs()) != 1 {
		t.Errorf("domain without <devices>: %q %v", out, err)
	}
}

func TestParseNodeDeviceXMLCorpus(t *testing.T) {
	n, ok, err := ParseNodeDeviceXML(readTestdata(t, "pci_0000_02_10_7_mdev_types.xml"))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	want := NodeDevice{Name: "pci_0000_02_10_7", Parent: "pci_0000_00_04_0", Kind: "pci", Addr: pci.MustParse("0000:02:10.7"),
		VendorID: "0x8086", ProductID: "0x10ca", Product: "82576 Virtual Function", ParentAddr: pci.MustParse("0000:00:04.0"),
		MdevTypes: []NodeMdevType{{"foo1", "bar1", "vfio-pci", 1}, {"foo2", "bar2", "vfio-pci", 2}}}
	if !reflect.DeepEqual(n, want) {
		t.Errorf("got  %+v\nwant %+v", n, want)
	}
	n, ok, err = ParseNodeDeviceXML(readTestdata(t, "mdev_d2441d39_495e_4243_ad9f_beb3f14c23d9.xml"))
	if err != nil || !ok || n.Kind != "mdev" || n.MdevType != "i915-GVTg_V5_8" || n.MdevUUID != "d2441d39-495e-4243-ad9f-beb3f14c23d9" {
		t.Errorf("mdev: %+v %v %v", n, ok, err)
	}
	n, ok, err = ParseNodeDeviceXML(readTestdata(t, "mdev_3627463d_b7f0_4fea_b468_f1da537d301b.xml"))
	if err != nil || !ok || n.MdevType != "mtty-1" || n.MdevUUID != "3627463d-b7f0-4fea-b468-f1da537d301b" {
		t.Errorf("mdev: %+v %v %v", n, ok, err)
	}
	n, ok, err = ParseNodeDeviceXML(readTestdata(t, "pci_8086_10c9_sriov_pf.xml"))
	if err != nil || !ok || len(n.MdevTypes) != 0 || n.Addr != pci.MustParse("0000:02:00.0") {
		t.Errorf("pf: %+v", n)
	}
}

func FuzzHostdevEdit(f *testing.F) {
	for _, name := range []string{"hostdev-mdev-precreated.xml", "hostdev-mdev-duplicate.xml", "hostdev-mdev-display-ramfb.xml"} {
		f.Add(readTestdata(f, name))
	}
	f.Add("<domain><devices></devices></domain>")
	const u = "9f1c3c5e-2f4b-4b8e-8d5e-000000000001"
	f.Fuzz(func(t *testing.T, doc string) {
		out, added, err := AddHostdev(doc, MdevHostdevXML(u))
		if err != nil || !added {
			return
		}
		again, added2, err := AddHostdev(out, MdevHostdevXML(u))
		if err != nil || added2 || again != out {
			t.Fatalf("second add not idempotent: %v %v", added2, err)
		}
		back, removed, err := RemoveHostdev(out, MdevHostdevXML(u))
		if err != nil || !removed {
			t.Fatalf("remove after add: %v %v", removed, err)
		}
		if _, still, _ := RemoveHostdev(back, MdevHostdevXML(u)); still {
			t.Fatal("hostdev survived removal")
		}
	})
}
