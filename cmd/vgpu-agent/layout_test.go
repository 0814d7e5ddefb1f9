package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
)

func TestLayoutCommands(t *testing.T) {
	// H200 PF 0000:c1:00.0 with 8 VFs, c1:00.4 typed 1429 (which the GPU holds twice).
	dir := t.TempDir()
	h, err := fakehost.Build(dir, fakehost.DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	types := func() string {
		vfs, err := h.Sysfs.VFs(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, vf := range vfs {
			s = append(s, vf.Current)
		}
		return strings.Join(s, ",")
	}
	layout := func(sub, vfLayout string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run([]string{"layout", sub, "--config", "", "--fake-host", dir, "--set", "devices.vf_layout=" + vfLayout}, &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, errs := layout("check", "0000:c1:00.0=1429:2"); code != 0 ||
		!strings.Contains(out, "keep") || !strings.Contains(out, "would set_type   0000:c1:00.5 type 1429") || types() != "1429,,,,,,," {
		t.Errorf("check: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := layout("check", "0000:c1:00.0=1430:2"); code != 1 || !strings.Contains(errs, "0000:c1:00.4 has vGPU type 1429") {
		t.Errorf("check of a layout that would change a typed VF: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := layout("apply", "0000:c1:00.0=1429:3"); code != 1 || !strings.Contains(errs, "cleared") || types() != "1429,,,,,,," {
		t.Errorf("apply of 3 × 1429 on a GPU that holds 2: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := layout("apply", "0000:c1:00.0=1429:2"); code != 0 || !strings.Contains(out, "set_type   0000:c1:00.5") || types() != "1429,1429,,,,,," {
		t.Errorf("apply: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := layout("apply", "0000:c1:00.0=1429"); code != 2 {
		t.Errorf("a bad vf_layout: exit %d, want 2\n%s", code, errs)
	}
}
