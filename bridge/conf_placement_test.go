package bridge

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
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
		"placement.bridge_owned_gpus=cn-1.example.org/0000:c1:00.0=1430,cn-2/0000:41:00.0=1429,cn-2/0000:3b:00.0=nvidia-231",
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
	want := []placement.OwnedDecl{{Host: "cn-1.example.org", PCI: "0000:c1:00.0", TypeID: "1430"}, {Host: "cn-2", PCI: "0000:41:00.0", TypeID: "1429"},
		{Host: "cn-2", PCI: "0000:3b:00.0", TypeID: "nvidia-231"}}
	if !slices.Equal(pc.OwnedGPUs, want) {
		t.Errorf("OwnedGPUs = %+v, want %+v", pc.OwnedGPUs, want)
	}
}

// TestPlacementConfigOwnedVFGPUsDeprecated: [placement]
// bridge_owned_vf_gpus, the option's former name, is still read into
// bridge_owned_gpus, with a warning naming the new name; set in the same
// file, the new name wins.
func TestPlacementConfigOwnedVFGPUsDeprecated(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "[DEFAULT]\ntransport_url = rabbit://g:g@h:5672/\n[database]\nconnection = postgres://u@h/db\n[api]\nauth_strategy = noauth\n" +
		"[placement]\nendpoint_override = http://127.0.0.1:8778\ntoken_file = " + tok + "\n"
	for _, tc := range []struct {
		name, conf string
		want       []placement.OwnedDecl
	}{
		{"old name", "bridge_owned_vf_gpus = cn-1/0000:c1:00.0=1430\n", []placement.OwnedDecl{{Host: "cn-1", PCI: "0000:c1:00.0", TypeID: "1430"}}},
		{"both", "bridge_owned_vf_gpus = cn-1/0000:c1:00.0=1430\nbridge_owned_gpus = cn-1/0000:3b:00.0=nvidia-231\n",
			[]placement.OwnedDecl{{Host: "cn-1", PCI: "0000:3b:00.0", TypeID: "nvidia-231"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "bridge.conf")
			if err := os.WriteFile(f, []byte(base+tc.conf), 0o600); err != nil {
				t.Fatal(err)
			}
			v, err := LoadConfig(conf.Source{File: f})
			if err != nil {
				t.Fatal(err)
			}
			warned := slices.ContainsFunc(v.Warnings, func(w string) bool {
				return strings.Contains(w, "bridge_owned_vf_gpus is deprecated") && strings.Contains(w, "bridge_owned_gpus")
			})
			if !warned {
				t.Errorf("warnings %q: none says bridge_owned_vf_gpus is deprecated for bridge_owned_gpus", v.Warnings)
			}
			pc, err := PlacementConfig(v, "r1")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pc.OwnedGPUs, tc.want) {
				t.Errorf("OwnedGPUs = %+v, want %+v", pc.OwnedGPUs, tc.want)
			}
		})
	}
}

func TestPlacementConfigErrors(t *testing.T) {
	base := []string{"database.connection=postgres://u@h/db", "DEFAULT.transport_url=rabbit://g:g@h:5672/", "api.auth_strategy=noauth"}
	for _, o := range []string{"placement.microversion=2.0", "placement.type_trait_prefix=NVIDIA_",
		"placement.bridge_owned_gpus=cn-1/0000:c1:00.0", "placement.bridge_owned_gpus=cn-1/0000:c1:00.0=nvidia 232",
		"placement.bridge_owned_vf_gpus=cn-1/0000:c1:00.0"} {
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
