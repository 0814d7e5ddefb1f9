package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/policyapi"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/policy"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Provider UUIDs of the fleet fixture.
const (
	rootCN1 = "10000000-0000-4000-8000-000000000001"
	gpuCN1a = "10000000-0000-4000-8000-0000000000a1"
	gpuCN1b = "10000000-0000-4000-8000-0000000000b1"
	rootCN2 = "20000000-0000-4000-8000-000000000002"
	gpuCN2a = "20000000-0000-4000-8000-0000000000a2"
	gpuCN2b = "20000000-0000-4000-8000-0000000000b2"
)

// startFleetAPI serves the real placement and policy handlers with static
// token auth, over a mirror in a fresh database and an index loaded with a
// fixed fleet: bridge.Run does not serve these routes yet, and a fixed
// fleet keeps the golden tables stable (the shared Placement holds other
// tests' providers). The Placement endpoint is never called.
func startFleetAPI(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	cat := catalog.New()
	seed, err := catalog.LoadFile("testdata/profiles.yaml")
	testsvc.Must(t, err, "profiles")
	cat.Merge(seed)
	svc, err := placement.New(ctx, placement.Config{Client: placement.ClientConfig{Endpoint: "http://127.0.0.1:1", Token: "unused"}}, pool, cat, nil)
	testsvc.Must(t, err, "placement service")
	inv := func(total, reserved int) map[string]engine.Inventory {
		return map[string]engine.Inventory{"VGPU": {Total: total, Reserved: reserved, MinUnit: 1, MaxUnit: total, StepSize: 1, AllocationRatio: 1}}
	}
	svc.Index().Load([]engine.Provider{
		{UUID: rootCN1, Name: "cn1.example.org", RootUUID: rootCN1},
		{UUID: gpuCN1a, Name: "cn1.example.org_pci_0000_3b_00_0", RootUUID: rootCN1, ParentUUID: rootCN1,
			Traits: []string{"CUSTOM_NVIDIA_232"}, Inventory: inv(4, 0), Usages: map[string]int{"VGPU": 1}},
		{UUID: gpuCN1b, Name: "cn1.example.org_pci_0000_3c_00_0", RootUUID: rootCN1, ParentUUID: rootCN1,
			Traits: []string{"CUSTOM_NVIDIA_233"}, Inventory: inv(2, 0)},
		{UUID: rootCN2, Name: "cn2.example.org", RootUUID: rootCN2, Traits: []string{"COMPUTE_STATUS_DISABLED"}},
		{UUID: gpuCN2a, Name: "cn2.example.org_pci_0000_3b_00_0", RootUUID: rootCN2, ParentUUID: rootCN2,
			Traits: []string{"CUSTOM_NVIDIA_232"}, Inventory: inv(4, 0), Usages: map[string]int{"VGPU": 2}},
		{UUID: gpuCN2b, Name: "cn2.example.org_pci_0000_3c_00_0", RootUUID: rootCN2, ParentUUID: rootCN2,
			Traits: []string{"CUSTOM_NVIDIA_232"}, Inventory: inv(4, 4)},
	})
	// The mirror's allocations (what the syncer writes from Placement).
	_, err = pool.Exec(ctx, `INSERT INTO placement_providers (uuid, name, generation, parent_uuid, root_uuid) VALUES
		($1, 'cn1.example.org', 1, NULL, $1), ($2, 'cn1.example.org_pci_0000_3b_00_0', 3, $1, $1),
		($3, 'cn2.example.org', 1, NULL, $3), ($4, 'cn2.example.org_pci_0000_3b_00_0', 5, $3, $3)`,
		rootCN1, gpuCN1a, rootCN2, gpuCN2a)
	testsvc.Must(t, err, "mirror providers")
	_, err = pool.Exec(ctx, `INSERT INTO placement_allocations (provider_uuid, consumer_uuid, resource_class, used) VALUES
		($1, $3, 'VGPU', 1), ($2, $4, 'VGPU', 2)`, gpuCN1a, gpuCN2a, vmTrain, vmRender)
	testsvc.Must(t, err, "mirror allocations")

	h, err := policy.NewHolder(policy.Config{RulesFile: "testdata/rules.yaml", CompatFile: "testdata/driver-compat.yaml"}, cat)
	testsvc.Must(t, err, "policy")

	tokens := writeFile(t, t.TempDir(), "tokens", adminToken+" admin ops\n"+readToken+" reader viewer\n")
	auth, err := api.LoadTokenFile(tokens)
	testsvc.Must(t, err, "tokens")
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: auth})
	placementapi.New(svc).Register(srv)
	policyapi.New(policyapi.Config{Holder: h}).Register(srv)
	testsvc.Must(t, srv.Start(), "start API")
	t.Cleanup(func() { srv.Shutdown() })
	return "http://" + srv.Addr()
}

func TestFleetViews(t *testing.T) {
	url := startFleetAPI(t)
	reader := ctl{url: url, token: readToken}

	t.Run("hosts", func(t *testing.T) {
		golden(t, "hosts", reader.must(t, 0, "hosts").stdout)
		golden(t, "host-show", reader.must(t, 0, "hosts", "show", "cn1.example.org").stdout)
		var h struct {
			Name string           `json:"name"`
			GPUs []map[string]any `json:"gpus"`
		}
		r := reader.must(t, 0, "hosts", "show", "cn2.example.org", "-o", "json")
		if err := json.Unmarshal([]byte(r.stdout), &h); err != nil || len(h.GPUs) != 2 {
			t.Errorf("hosts show json: %v\n%s", err, r.stdout)
		}
		r = reader.must(t, 1, "hosts", "show", "cn9")
		if !strings.HasPrefix(r.stderr, "vgpuctl: Not Found: no host or node named cn9 holds GPUs\n") {
			t.Errorf("unknown host: %s", r)
		}
	})

	t.Run("gpus", func(t *testing.T) {
		golden(t, "gpus", reader.must(t, 0, "gpus").stdout)
		golden(t, "gpus-t4-8q", reader.must(t, 0, "gpus", "--profile", "T4-8Q").stdout)
		r := reader.must(t, 0, "gpus", "--host", "cn2.example.org", "-o", "yaml")
		if strings.Count(r.stdout, " provider_uuid:") != 2 || !strings.Contains(r.stdout, "free: 2\n") {
			t.Errorf("gpus yaml: %s", r.stdout)
		}
	})

	t.Run("allocations", func(t *testing.T) {
		golden(t, "allocations", reader.must(t, 0, "allocations").stdout)
		r := reader.must(t, 0, "allocations", "--instance", vmRender, "-o", "json")
		var al struct {
			Allocations []map[string]any `json:"allocations"`
		}
		if json.Unmarshal([]byte(r.stdout), &al) != nil || len(al.Allocations) != 1 || al.Allocations[0]["amount"] != 2.0 {
			t.Errorf("allocations json: %s", r.stdout)
		}
		r = reader.must(t, 1, "allocations", "--instance", "nope")
		if !strings.Contains(r.stderr, "\n  instance: must be an instance UUID\n") {
			t.Errorf("bad instance: %s", r)
		}
	})

	t.Run("place", func(t *testing.T) {
		golden(t, "place-pack", reader.must(t, 0, "place", "--dry-run", "--profile", "T4-4Q").stdout)
		golden(t, "place-spread", reader.must(t, 0, "place", "--dry-run", "--profile", "T4-4Q", "--strategy", "spread",
			"--forbid-trait", "COMPUTE_STATUS_DISABLED", "--count", "2").stdout)
		golden(t, "place-retype", reader.must(t, 0, "place", "--dry-run", "--profile", "T4-2Q", "--allow-retype", "--limit", "3").stdout)
		r := reader.must(t, 0, "place", "--dry-run", "--profile", "T4-4Q", "--count", "4", "--host", "cn1.example.org", "-o", "json")
		var dr apiclient.DryRunResponse
		if err := json.Unmarshal([]byte(r.stdout), &dr); err != nil || len(dr.Candidates) != 0 {
			t.Errorf("no room: %v %s", err, r)
		}
		r = reader.must(t, 0, "place", "--dry-run", "--profile", "T4-4Q", "--count", "4", "--host", "cn1.example.org")
		if r.stderr != "no GPU can hold this request now\n" {
			t.Errorf("no room (table): %s", r)
		}
		r = reader.must(t, 1, "place", "--dry-run", "--profile", "Z9-99Q")
		if !strings.HasPrefix(r.stderr, "vgpuctl: Invalid request: 1 invalid field(s)\n  profile: unknown vGPU profile \"Z9-99Q\"\n  request id: req-") {
			t.Errorf("unknown profile: %s", r)
		}
		r = reader.must(t, 1, "place", "--dry-run", "--profile", "T4-4Q", "--strategy", "random", "--limit", "5000")
		if !strings.Contains(r.stderr, "\n  limit: must be within 1..1000\n") || !strings.Contains(r.stderr, "\n  strategy: must be pack or spread\n") {
			t.Errorf("two invalid params: %s", r)
		}
		ctl{url: url}.must(t, 1, "place", "--dry-run", "--profile", "T4-4Q")
	})

	t.Run("policy explain", func(t *testing.T) {
		dir := t.TempDir()
		ev := writeFile(t, dir, "event.json", `{"kind": "webhook.GPU_REQUEST", "source": "webhook:lab", "instance_uuid": "`+vmTrain+`",
			"project_id": "p1", "workload": "training", "time": "2024-05-01T12:00:00Z"}`)
		golden(t, "policy-explain", reader.must(t, 0, "policy", "explain", "--event", ev).stdout)
		r := reader.must(t, 0, "policy", "explain", "--event", ev, "-o", "json")
		var d map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || d["event"] != "webhook.GPU_REQUEST" || d["text"] == "" {
			t.Errorf("explain json: %v %s", err, r.stdout)
		}
		r = reader.runIn(t, []byte(`{"event": {"workload": "training"}}`), "policy", "explain", "--event", "-")
		if r.code != 1 || !strings.Contains(r.stderr, "\n  event.kind: is required, e.g. webhook.GPU_REQUEST\n") {
			t.Errorf("explain without kind: %s", r)
		}
	})
}
