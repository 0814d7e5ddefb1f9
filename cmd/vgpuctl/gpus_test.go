package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

// TestGPUTableMixed: a mixed GPU's row reads "mixed" with its vGPUs by
// type and its amounts in MiB; a single-type GPU's row is as before.
func TestGPUTableMixed(t *testing.T) {
	gs := []apiclient.GPU{
		{Host: "c7", PCIAddress: "0000:3b:00.0", Profile: "T4-4Q", Trait: "CUSTOM_NVIDIA_232", Capacity: 4, Used: 1, Free: 3, ProviderUUID: "p1", Mode: "single"},
		{Host: "c7", PCIAddress: "0000:c1:00.0", Capacity: 72091, Used: 53248, Free: 18843, ProviderUUID: "p2", Mode: apiclient.GPUModeMixed,
			TypesInUse: []apiclient.GPUTypeInUse{{TypeID: "1430", Profile: "H200X-35C", Count: 1}, {TypeID: "1431", Count: 2}}},
		{Host: "c7", PCIAddress: "0000:c2:00.0", Capacity: 100, Free: 100, ProviderUUID: "p3", Mode: apiclient.GPUModeMixed},
	}
	var b bytes.Buffer
	gpuTable(&b, gs, true)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("table:\n%s\nwant a header and 3 rows", b.String())
	}
	for i, want := range [][]string{
		{"c7", "0000:3b:00.0", "T4-4Q", "CUSTOM_NVIDIA_232", "4", "1", "3", "p1"},
		{"c7", "0000:c1:00.0", "mixed: H200X-35C×1, 1431×2", "72091 MiB", "53248 MiB", "18843 MiB", "p2"},
		{"c7", "0000:c2:00.0", "mixed", "100 MiB", "0 MiB", "100 MiB", "p3"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i+1], w) {
				t.Errorf("row %d %q lacks %q", i+1, lines[i+1], w)
			}
		}
	}
	if strings.Contains(lines[1], "MiB") {
		t.Errorf("single-type row %q in MiB", lines[1])
	}
}
