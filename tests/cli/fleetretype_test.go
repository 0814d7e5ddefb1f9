package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/fleetupgrade"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// startRetypeAPI serves the fleet and placement routes over a mirror of
// one host, cn1, whose agent reported GPU 0000:3b:00.0 with a T4-4Q vGPU
// and GPU 0000:3c:00.0 empty, typed T4-8Q in Placement.
func startRetypeAPI(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	cat := catalog.New()
	seed, err := catalog.LoadFile("testdata/profiles.yaml")
	testsvc.Must(t, err, "profiles")
	cat.Merge(seed)
	svc, err := placement.New(ctx, placement.Config{Client: placement.ClientConfig{Endpoint: "http://127.0.0.1:1", Token: "unused"}}, pool, cat, nil)
	testsvc.Must(t, err, "placement service")
	inv := func(total int) map[string]engine.Inventory {
		return map[string]engine.Inventory{"VGPU": {Total: total, MinUnit: 1, MaxUnit: total, StepSize: 1, AllocationRatio: 1}}
	}
	svc.Index().Load([]engine.Provider{
		{UUID: rootCN1, Name: "cn1.example.org", RootUUID: rootCN1},
		{UUID: gpuCN1a, Name: "cn1.example.org_pci_0000_3b_00_0", RootUUID: rootCN1, ParentUUID: rootCN1,
			Traits: []string{"CUSTOM_NVIDIA_232"}, Inventory: inv(4), Usages: map[string]int{"VGPU": 1}},
		{UUID: gpuCN1b, Name: "cn1.example.org_pci_0000_3c_00_0", RootUUID: rootCN1, ParentUUID: rootCN1,
			Traits: []string{"CUSTOM_NVIDIA_233"}, Inventory: inv(2)},
	})
	var types []protocol.VGPUType
	for _, id := range []string{"nvidia-222", "nvidia-231", "nvidia-232", "nvidia-233"} {
		types = append(types, protocol.VGPUType{ID: id})
	}
	rep, err := json.Marshal(protocol.Report{V: protocol.Version, Host: "cn1", Node: "cn1.example.org", GPUs: []protocol.GPU{
		{PCI: "0000:3b:00.0", Types: types, Active: []protocol.VGPU{{MdevUUID: "4b20d080-1b54-4048-85b3-a6a62d165c01", TypeID: "nvidia-232",
			InstanceUUID: vmTrain, Owner: "nova"}}, Health: "ok"},
		{PCI: "0000:3c:00.0", Types: types, Active: []protocol.VGPU{}, Health: "ok"},
	}})
	testsvc.Must(t, err, "report")
	_, err = pool.Exec(ctx, `INSERT INTO hosts (name, node, agent_version, last_report_at, report) VALUES ('cn1', 'cn1.example.org', '1.0', now(), $1)`, rep)
	testsvc.Must(t, err, "host")
	svc.RefreshHosts(ctx)

	tokens := writeFile(t, t.TempDir(), "tokens", adminToken+" admin ops\n"+readToken+" reader viewer\n")
	auth, err := api.LoadTokenFile(tokens)
	testsvc.Must(t, err, "tokens")
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: auth})
	placementapi.New(svc).Register(srv)
	(&fleetupgrade.API{Store: fleetupgrade.NewStore(pool, nil), Pool: pool, Retyper: svc}).Register(srv)
	testsvc.Must(t, srv.Start(), "start API")
	t.Cleanup(func() { srv.Shutdown() })
	return "http://" + srv.Addr()
}

// TestFleetRetypeCLI: vgpuctl fleet retype --dry-run prints the plan and
// the host's nova.conf change (golden), place --allow-retype answers the
// change and the command in JSON, and a GPU in use is refused.
func TestFleetRetypeCLI(t *testing.T) {
	url := startRetypeAPI(t)
	admin := ctl{url: url, token: adminToken}
	golden(t, "fleet-retype-dry-run", admin.must(t, 0, "fleet", "retype", "--gpu", "cn1/0000:3c:00.0=nvidia-222", "--dry-run").stdout)

	r := admin.must(t, 0, "place", "--dry-run", "--profile", "T4-1B", "--allow-retype", "-o", "json")
	var dr struct {
		Candidates []struct {
			NeedsRetype   bool   `json:"needs_retype"`
			RetypeCommand string `json:"retype_command"`
			NovaConf      struct {
				Text string `json:"nova_conf"`
			} `json:"nova_conf_change"`
		} `json:"candidates"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &dr); err != nil || len(dr.Candidates) != 1 || !dr.Candidates[0].NeedsRetype ||
		dr.Candidates[0].RetypeCommand != "vgpuctl fleet retype --gpu cn1/0000:3c:00.0=nvidia-222" ||
		!strings.Contains(dr.Candidates[0].NovaConf.Text, "enabled_mdev_types = nvidia-222, nvidia-232\n") {
		t.Errorf("place --allow-retype: %v %s", err, r.stdout)
	}

	r = admin.must(t, 0, "place", "--dry-run", "--profile", "T4-1B", "--allow-retype")
	if !strings.HasSuffix(r.stdout, "\nRe-type a Nova-owned GPU host by host (add --dry-run to print its nova.conf change):\n"+
		"  vgpuctl fleet retype --gpu cn1/0000:3c:00.0=nvidia-222\n") {
		t.Errorf("place --allow-retype table: %s", r.stdout)
	}

	r = admin.must(t, 1, "fleet", "retype", "--gpu", "cn1/0000:3b:00.0=nvidia-222", "--dry-run")
	if !strings.Contains(r.stderr, "holds 1 vGPU(s) of nvidia-232") {
		t.Errorf("GPU in use: %s", r)
	}
	r = admin.must(t, 2, "fleet", "retype")
	if !strings.Contains(r.stderr, "--gpu HOST/PCI=TYPE is required") {
		t.Errorf("no --gpu: %s", r)
	}
}
