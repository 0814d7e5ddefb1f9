package placement_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/tests/placementfleet"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestTypeFromReportAndTraitAdded: a GPU provider Nova left without a type
// trait takes the type its agent reports, so the direct path places on
// it; with add_type_traits the sync leader writes that trait to the real
// Placement (keeping the provider's other traits, under its generation)
// and audits it, and the GPU is typed by Placement from then on.
func TestTypeFromReportAndTraitAdded(t *testing.T) {
	ctx := ctxT(t)
	trait := placementfleet.UniqueType() // CUSTOM_NVIDIA_T…
	typeID := "nvidia-t" + strings.ToLower(strings.TrimPrefix(trait, "CUSTOM_NVIDIA_T"))
	if catalog.TraitFor(typeID) != trait {
		t.Fatalf("type id %s maps to %s, not %s", typeID, catalog.TraitFor(typeID), trait)
	}
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	s, err := placement.New(ctx, placement.Config{Client: placement.ClientConfig{Endpoint: testsvc.PlacementURL(t), Token: "admin"},
		SyncInterval: 200 * time.Millisecond, AddTypeTraits: true, Replica: "traits-test",
		Auditor: requests.Auditor{DB: pool, Actor: "vgpu-bridge/traits-test"}}, pool, catalog.New(), nil)
	testsvc.Must(t, err, "service")
	sc := s.Client().ServiceClient()
	t.Cleanup(func() { traits.Delete(context.Background(), sc, trait) }) //nolint:errcheck // after the providers go
	node := name("untyped")
	f := load(t, s, []placementfleet.Node{{Name: node, GPUs: []placementfleet.GPU{{Trait: "HW_GPU_API_VULKAN", Total: 4}}}})
	gpu := f.GPUs[0][0]

	// The agent of the node reports the GPU, offering the one type.
	r := protocol.Report{V: protocol.Version, Minor: protocol.Minor, Host: node, Node: node, GPUs: []protocol.GPU{{PCI: "0000:3b:00.0",
		Health: protocol.HealthOK, Types: []protocol.VGPUType{{ID: typeID, Name: "GRID T4-4Q", MaxInstances: 4, AvailableInstances: 4}}}}}
	raw, _ := json.Marshal(r)
	_, err = pool.Exec(ctx, `INSERT INTO hosts (name, node, last_report_at, report) VALUES ($1, $1, now(), $2)`, node, raw)
	testsvc.Must(t, err, "host report")

	run, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(run); close(done) }() //nolint:errcheck
	t.Cleanup(func() { stop(); <-done })

	deadline := time.Now().Add(60 * time.Second)
	for {
		rt, err := resourceproviders.GetTraits(ctx, sc, gpu).Extract()
		testsvc.Must(t, err, "traits")
		if len(rt.Traits) == 2 {
			if !strings.Contains(strings.Join(rt.Traits, ","), trait) || !strings.Contains(strings.Join(rt.Traits, ","), "HW_GPU_API_VULKAN") {
				t.Fatalf("traits of the GPU = %v, want %s added beside HW_GPU_API_VULKAN", rt.Traits, trait)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no type trait added to the GPU within 60s: %v", rt.Traits)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var audited int
	testsvc.Must(t, pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE action = 'placement.trait_add' AND object_id = $1
		AND detail->>'trait' = $2`, gpu, trait).Scan(&audited), "audit")
	if audited != 1 {
		t.Errorf("%d audit records of the trait added, want 1", audited)
	}

	// The direct path places on it; the mirror has the trait from
	// Placement now.
	var d placement.DryRunRequest
	d.Traits.Required = []string{trait}
	deadline = time.Now().Add(30 * time.Second)
	for {
		res, err := s.DryRun(d)
		var mirrored bool
		pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM placement_traits WHERE provider_uuid = $1 AND trait = $2)`, gpu, trait).Scan(&mirrored) //nolint:errcheck
		if err == nil && len(res.Candidates) == 1 && res.Candidates[0].ProviderUUID == gpu && mirrored {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 30s: dry run %+v (%v), trait mirrored %v", res, err, mirrored)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
