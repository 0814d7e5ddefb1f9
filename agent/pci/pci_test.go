package pci

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestParseForms(t *testing.T) {
	want := Addr{Domain: 0, Bus: 0x3b, Slot: 0, Func: 0}
	for _, s := range []string{
		"00000000:3B:00.0", "0000:3b:00.0", "pci_0000_3b_00_0", "3b:00.0", " 0000:3B:00.0\n",
	} {
		got, err := Parse(s)
		if err != nil {
			t.Fatalf("Parse(%q): %v", s, err)
		}
		if got != want {
			t.Errorf("Parse(%q) = %+v, want %+v", s, got, want)
		}
	}
}

func TestForms(t *testing.T) {
	a := Addr{Domain: 0x10, Bus: 0x84, Slot: 0x1f, Func: 7}
	if got, want := a.String(), "0010:84:1f.7"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	if got, want := a.NVML(), "00000010:84:1F.7"; got != want {
		t.Errorf("NVML = %q, want %q", got, want)
	}
	if got, want := a.Libvirt(), "pci_0010_84_1f_7"; got != want {
		t.Errorf("Libvirt = %q, want %q", got, want)
	}
	for _, s := range []string{a.String(), a.NVML(), a.Libvirt()} {
		if got := MustParse(s); got != a {
			t.Errorf("round trip %q = %+v", s, got)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, s := range []string{
		"", "3b", "0000:3b:00", "0000:3b:00.8", "0000:3b:20.0", "0000:3bb:00.0",
		"00010000:3b:00.0", "pci_0000_3b_00", "zz:00.0", "0000:3b:00.0.1", "pci_0000_3b_00_0_1",
		"0000:-1:00.0", "0000:+1:00.0",
	} {
		if _, err := Parse(s); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) err = %v, want ErrSyntax", s, err)
		}
	}
}

func TestJSON(t *testing.T) {
	in := map[string]Addr{"gpu": MustParse("00000000:3B:00.0")}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"gpu":"0000:3b:00.0"}`; got != want {
		t.Errorf("json = %s, want %s", got, want)
	}
	var out map[string]Addr
	if err := json.Unmarshal(b, &out); err != nil || out["gpu"] != in["gpu"] {
		t.Errorf("unmarshal = %v, %v", out, err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"00000000:3B:00.0", "0000:3b:00.0", "pci_0000_3b_00_0", "3b:00.0", "pci_0000_02_10_7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := Parse(s)
		if err != nil {
			return
		}
		for _, form := range []string{a.String(), a.NVML(), a.Libvirt()} {
			b, err := Parse(form)
			if err != nil || b != a {
				t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, a, form, b, err)
			}
		}
	})
}
