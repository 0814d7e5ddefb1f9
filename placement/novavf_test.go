package placement

import "testing"

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
