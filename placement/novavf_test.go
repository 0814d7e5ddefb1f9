package placement

import (
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

func TestParseNovaVFClass(t *testing.T) {
	tests := []struct {
		in, class, typ string
		ok             bool
	}{
		{"CUSTOM_VGPU_VF_1430=1430", "CUSTOM_VGPU_VF_1430", "1430", true},
		{" CUSTOM_X=7 ", "CUSTOM_X", "7", true},
		{"CUSTOM_VGPU_VF_1430", "", "", false},
		{"VGPU=1430", "", "", false},
		{"CUSTOM_vf=1430", "", "", false},
		{BridgeClass + "=1430", "", "", false},
		{"CUSTOM_VF=nvidia-232", "", "", false},
		{"CUSTOM_VF=", "", "", false},
	}
	for _, tc := range tests {
		c, typ, err := ParseNovaVFClass(tc.in)
		if (err == nil) != tc.ok || c != tc.class || typ != tc.typ {
			t.Errorf("ParseNovaVFClass(%q) = %q, %q, %v; want %q, %q, ok %v", tc.in, c, typ, err, tc.class, tc.typ, tc.ok)
		}
	}
}

func TestParseNovaVFAlias(t *testing.T) {
	tests := []struct {
		in, alias, class string
		ok               bool
	}{
		{"h200x-35c=CUSTOM_VGPU_VF_1430", "h200x-35c", "CUSTOM_VGPU_VF_1430", true},
		{" a = CUSTOM_X ", "a", "CUSTOM_X", true},
		{"h200x-35c", "", "", false},
		{"=CUSTOM_X", "", "", false},
		{"a:1=CUSTOM_X", "", "", false},
		{"a,b=CUSTOM_X", "", "", false},
		{"a=VGPU", "", "", false},
	}
	for _, tc := range tests {
		a, c, err := ParseNovaVFAlias(tc.in)
		if (err == nil) != tc.ok || a != tc.alias || c != tc.class {
			t.Errorf("ParseNovaVFAlias(%q) = %q, %q, %v; want %q, %q, ok %v", tc.in, a, c, err, tc.alias, tc.class, tc.ok)
		}
	}
}

// An alias's class must be one of nova_vf_resource_classes, which gives
// its type.
func TestNovaVFAliasesOption(t *testing.T) {
	load := func(aliases string) (*conf.Values, error) {
		set := conf.NewSet("VGPU_TEST_", Options())
		v, err := set.Load(conf.Source{Overrides: []string{
			"placement.nova_vf_resource_classes=CUSTOM_VGPU_VF_1430=1430", "placement.nova_vf_aliases=" + aliases}})
		if err == nil {
			if errs := set.Check(v); len(errs) > 0 {
				err = errs
			}
		}
		return v, err
	}
	v, err := load("h200x-35c=CUSTOM_VGPU_VF_1430")
	if err != nil {
		t.Fatal(err)
	}
	got := NovaVFAliases(v)
	if want := (NovaVFAlias{Class: "CUSTOM_VGPU_VF_1430", TypeID: "1430"}); len(got) != 1 || got["h200x-35c"] != want {
		t.Errorf("NovaVFAliases = %+v, want h200x-35c: %+v", got, want)
	}
	if _, err := load("h200x-35c=CUSTOM_VGPU_VF_1429"); err == nil || !strings.Contains(err.Error(), "not in nova_vf_resource_classes") {
		t.Errorf("an alias of a class not in nova_vf_resource_classes: %v, want refused", err)
	}
}
