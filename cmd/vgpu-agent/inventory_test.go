package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestInventoryFakeHost(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if rc := run([]string{"inventory", "--config", "", "--fake-host", dir, "-o", "json"}, &out, &errb); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errb.String())
	}
	var inv struct {
		GPUs []struct {
			Addr  string `json:"pci_address"`
			Mode  string `json:"mode"`
			VGPUs []struct {
				Instance string `json:"instance_uuid"`
			} `json:"vgpus"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(out.Bytes(), &inv); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(inv.GPUs) != 3 || inv.GPUs[0].Addr != "0000:3b:00.0" || inv.GPUs[1].Mode != "vendor_vfio" ||
		inv.GPUs[0].VGPUs[0].Instance != "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01" {
		t.Errorf("inventory: %s", out.String())
	}
	out.Reset()
	if rc := run([]string{"inventory", "--config", "", "--fake-host", dir}, &out, &errb); rc != 0 || !strings.Contains(out.String(), "GRID T4-4Q") {
		t.Errorf("table rc %d:\n%s%s", rc, out.String(), errb.String())
	}
	if rc := run([]string{"inventory", "--config", "", "--fake-host", dir, "-o", "yaml"}, &out, &errb); rc != exitUsage {
		t.Errorf("-o yaml rc = %d", rc)
	}
}

func TestDiagnoseFakeHost(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if rc := run([]string{"diagnose", "--config", "", "--fake-host", dir}, &out, &errb); rc != 0 {
		t.Fatalf("rc %d: %s%s", rc, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "worst: ok") {
		t.Errorf("diagnose:\n%s", out.String())
	}
	out.Reset()
	if rc := run([]string{"diagnose", "--config", "", "--fake-host", dir, "-o", "json", "--check", "license"}, &out, &errb); rc != 0 ||
		!strings.Contains(out.String(), `"check": "license"`) {
		t.Errorf("json rc %d: %s", rc, out.String())
	}
	if rc := run([]string{"diagnose", "--config", "", "--fake-host", dir, "--check", "nope"}, &out, &errb); rc != exitUsage {
		t.Errorf("unknown check rc = %d", rc)
	}
}

func TestInventoryNoNVMLNoLibvirt(t *testing.T) {
	// A host with nothing: NVML off, libvirt's test driver default, empty sysfs.
	var out, errb bytes.Buffer
	rc := run([]string{"inventory", "--config", "", "-o", "json",
		"--set", "nvml.backend=none", "--set", "libvirt.connection_uri=test:///default", "--set", "sysfs.root=" + t.TempDir()}, &out, &errb)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, errb.String())
	}
	if !strings.Contains(out.String(), `"nvml": false`) || !strings.Contains(out.String(), `"gpus": []`) {
		t.Errorf("inventory: %s", out.String())
	}
}
