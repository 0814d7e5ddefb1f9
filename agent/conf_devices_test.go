package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

func TestAllowListFromNovaSections(t *testing.T) {
	f := filepath.Join(t.TempDir(), "agent.conf")
	os.WriteFile(f, []byte(`[devices]
enabled_mdev_types = nvidia-232, nvidia-222

[mdev_nvidia-232]
device_addresses = 0000:3b:00.0

[mdev_nvidia-222]
device_addresses = pci_0000_d8_00_0,00000000:5E:00.0
`), 0o644)
	v, err := LoadConfig(conf.Source{File: f})
	if err != nil {
		t.Fatal(err)
	}
	a, err := AllowList(v)
	if err != nil {
		t.Fatal(err)
	}
	if !a.AllowType(pci.MustParse("0000:3b:00.0"), "nvidia-232") || a.AllowType(pci.MustParse("0000:3b:00.0"), "nvidia-222") ||
		!a.AllowType(pci.MustParse("0000:5e:00.0"), "nvidia-222") || a.AllowGPU(pci.MustParse("0000:01:00.0")) {
		t.Errorf("allow-list = %+v", a)
	}
	os.WriteFile(f, []byte("[devices]\nenabled_types = nvidia-232,nvidia-222\n[mdev_nvidia-232]\ndevice_addresses = 0000:3b:00.0\n[mdev_nvidia-222]\ndevice_addresses = 0000:3b:00.0\n"), 0o644)
	if _, err := LoadConfig(conf.Source{File: f}); err == nil {
		t.Error("one GPU in two types accepted")
	}
	os.WriteFile(f, []byte("[mdev_nvidia-232]\ndevice_addresses = 3b\n"), 0o644)
	if _, err := LoadConfig(conf.Source{File: f}); err == nil {
		t.Error("bad address accepted")
	}
}
