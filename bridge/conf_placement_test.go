package bridge

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

func TestPlacementConfig(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := LoadConfig(conf.Source{Overrides: []string{
		"database.connection=postgres://u@h/db", "DEFAULT.transport_url=rabbit://g:g@h:5672/",
		"api.auth_strategy=noauth",
		"placement.endpoint_override=http://127.0.0.1:8778",
		"placement.token_file=" + tok,
		"placement.vgpu_resource_classes=VGPU,CUSTOM_VGPU_A16",
		"placement.sync_interval=30s",
		"placement.bridge_owned_vf_gpus=cn-1.example.org/0000:c1:00.0=1430,cn-2/0000:41:00.0=1429",
	}})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := PlacementConfig(v, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if pc.Client.Endpoint != "http://127.0.0.1:8778" || pc.Client.Token != "admin" || pc.Client.Microversion != "1.39" ||
		len(pc.Classes) != 2 || pc.Classes[1] != "CUSTOM_VGPU_A16" || pc.SyncInterval != 30*time.Second ||
		pc.ConsumerType != "INSTANCE" || pc.Replica != "r1" {
		t.Fatalf("config %+v", pc)
	}
	want := []placement.OwnedDecl{{Host: "cn-1.example.org", PCI: "0000:c1:00.0", TypeID: "1430"}, {Host: "cn-2", PCI: "0000:41:00.0", TypeID: "1429"}}
	if !slices.Equal(pc.OwnedVFGPUs, want) {
		t.Errorf("OwnedVFGPUs = %+v, want %+v", pc.OwnedVFGPUs, want)
	}
}

func TestPlacementConfigErrors(t *testing.T) {
	base := []string{"database.connection=postgres://u@h/db", "DEFAULT.transport_url=rabbit://g:g@h:5672/", "api.auth_strategy=noauth"}
	for _, o := range []string{"placement.microversion=2.0", "placement.type_trait_prefix=NVIDIA_",
		"placement.bridge_owned_vf_gpus=cn-1/0000:c1:00.0", "placement.bridge_owned_vf_gpus=cn-1/0000:c1:00.0=nvidia-232"} {
		if _, err := LoadConfig(conf.Source{Overrides: append(base, o)}); err == nil {
			t.Errorf("%s accepted", o)
		}
	}
	v, err := LoadConfig(conf.Source{Overrides: base})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := PlacementConfig(v, ""); err == nil {
		t.Error("no cloud and no endpoint/token accepted")
	}
}
