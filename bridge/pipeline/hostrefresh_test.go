package pipeline

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestRefreshHostsKeepsUnchanged: a refresh decodes only the reports whose
// hosts row changed since the last view (a new report, a new host), drops
// the hosts gone or without a report, re-reads every time a host whose
// profile came from the catalog, and gives the view a full read gives.
func TestRefreshHostsKeepsUnchanged(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testsvc.MigratedPostgres(t))
	testsvc.Must(t, err, "pool")
	t.Cleanup(pool.Close)
	cat := catalog.New()
	if _, err := cat.Observe("nvidia-230", "GRID T4-1Q", 16); err != nil {
		t.Fatal(err)
	}
	t4 := []protocol.VGPUType{{ID: "nvidia-231", Name: "GRID T4-2Q", MaxInstances: 8}}
	inst := uuid.NewString()
	report := func(host, driver string, active ...protocol.VGPU) protocol.Report {
		return protocol.Report{Host: host, DriverVersion: driver, GPUs: []protocol.GPU{{PCI: "0000:3b:00.0", Types: t4, Active: active}}}
	}
	put := func(r protocol.Report) {
		t.Helper()
		raw, err := json.Marshal(r)
		testsvc.Must(t, err, "report")
		_, err = pool.Exec(ctx, `INSERT INTO hosts (name, report) VALUES ($1, $2)
			ON CONFLICT (name) DO UPDATE SET report = EXCLUDED.report, updated_at = clock_timestamp()`, r.Host, raw)
		testsvc.Must(t, err, "write report")
	}
	put(report("h1", "550.90.05", protocol.VGPU{TypeID: "nvidia-231", InstanceUUID: inst, GuestDriver: "550.90.07"}))
	put(report("h2", "550.90.05"))
	put(report("h3", "550.90.05", protocol.VGPU{TypeID: "nvidia-230"})) // a type it does not offer: the catalog's
	_, err = pool.Exec(ctx, `INSERT INTO hosts (name) VALUES ('h4')`)   // never reported
	testsvc.Must(t, err, "host without a report")

	// same is the view a full read gives now.
	same := func(hs *hostSet) {
		t.Helper()
		full, err := loadHosts(ctx, pool, cat)
		testsvc.Must(t, err, "load hosts")
		if !reflect.DeepEqual(hs.hosts, full.hosts) || !reflect.DeepEqual(hs.byName, full.byName) || !reflect.DeepEqual(hs.guest, full.guest) {
			t.Errorf("refreshed view\n %+v %v %v\nfull read\n %+v %v %v", hs.hosts, hs.byName, hs.guest, full.hosts, full.byName, full.guest)
		}
	}
	// decoded says which hosts the last refresh decoded: a kept host
	// shares its GPUs with the earlier view's.
	decoded := func(prev, hs *hostSet) map[string]bool {
		out := map[string]bool{}
		for name, i := range hs.byName {
			j, ok := prev.byName[name]
			out[name] = !ok || len(hs.hosts[i].GPUs) == 0 || &hs.hosts[i].GPUs[0] != &prev.hosts[j].GPUs[0]
		}
		return out
	}
	v1, err := refreshHosts(ctx, pool, cat, &hostSet{byName: map[string]int{}})
	testsvc.Must(t, err, "first refresh")
	same(v1)
	if got := v1.guest[uuid.MustParse(inst)]; got != "550.90.07" {
		t.Errorf("guest driver %q", got)
	}

	v2, err := refreshHosts(ctx, pool, cat, v1)
	testsvc.Must(t, err, "second refresh")
	same(v2)
	if got, want := decoded(v1, v2), map[string]bool{"h1": false, "h2": false, "h3": true}; !reflect.DeepEqual(got, want) {
		t.Errorf("decoded %v, want %v (only the host whose profile is the catalog's)", got, want)
	}

	put(report("h2", "550.127.05", protocol.VGPU{TypeID: "nvidia-231"}))
	put(report("h5", "550.90.05"))
	_, err = pool.Exec(ctx, `DELETE FROM hosts WHERE name = 'h1'`)
	testsvc.Must(t, err, "delete host")
	v3, err := refreshHosts(ctx, pool, cat, v2)
	testsvc.Must(t, err, "third refresh")
	same(v3)
	if got, want := decoded(v2, v3), map[string]bool{"h2": true, "h3": true, "h5": true}; !reflect.DeepEqual(got, want) {
		t.Errorf("decoded %v, want %v", got, want)
	}
	if h := v3.hosts[v3.byName["h2"]]; h.DriverVersion != "550.127.05" || h.GPUs[0].Used != 1 {
		t.Errorf("h2 not re-read: %+v", h)
	}
	if _, ok := v3.guest[uuid.MustParse(inst)]; ok {
		t.Error("the deleted host's guest driver is still in the view")
	}
}
