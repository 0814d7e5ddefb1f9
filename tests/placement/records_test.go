package placement_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/placement/index"
	"github.com/vgpu-bridge/vgpu-bridge/placement/mirror"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestRecordsLoadAsProviders: the index the mirror's records make
// (Store.Records, Index.LoadRecords and ApplyRecord: no maps, no
// allocations) is the one its providers make (Store.Load, Index.Load and
// Apply), whole and for some providers: roots with traits in any order
// and aggregates, GPUs with allocations, one with two vGPU classes (the
// first configured wins), one with usage of another class only, a child
// without vGPU inventory, a child whose root is not mirrored.
func TestRecordsLoadAsProviders(t *testing.T) {
	ctx := ctxT(t)
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	classes := []string{"CUSTOM_VGPU_A16", "VGPU"}
	st := mirror.New(pool, classes, "")
	id := func() string { return uuid.NewString() }
	inv := func(total int) engine.Inventory {
		return engine.Inventory{Total: total, Reserved: total / 8, MinUnit: 1, MaxUnit: total, StepSize: 1, AllocationRatio: 1.5}
	}
	var ps []engine.Provider
	for h := range 6 {
		root := id()
		traits := []string{"HW_CPU_X86_AVX2", "COMPUTE_NODE", "CUSTOM_ZONE_B", "COMPUTE_STATUS_DISABLED"}[:2+h%3]
		if h%2 == 1 {
			slices.Reverse(traits)
		}
		ps = append(ps, engine.Provider{UUID: root, Name: fmt.Sprintf("node-%d", 5-h), RootUUID: root, Generation: h + 1,
			Traits: traits, Aggregates: []string{id()},
			Inventory: map[string]engine.Inventory{"VCPU": {Total: 64, MinUnit: 1, MaxUnit: 64, StepSize: 1, AllocationRatio: 4}},
			Usages:    map[string]int{"VCPU": 8}})
		for g := range 3 {
			p := engine.Provider{UUID: id(), Name: fmt.Sprintf("node-%d_pci_0000_%02x_00_0", 5-h, 0x3b+g), ParentUUID: root, RootUUID: root,
				Generation: 10 + g, Traits: []string{"CUSTOM_NVIDIA_" + fmt.Sprint(230+g), "CUSTOM_NVLINK"}[:1+g%2],
				Inventory: map[string]engine.Inventory{"VGPU": inv(8 + 8*g)}, Usages: map[string]int{"VGPU": g},
				Allocations: map[string]map[string]int{}}
			for range g {
				p.Allocations[id()] = map[string]int{"VGPU": 1}
			}
			switch {
			case h == 1 && g == 0: // two vGPU classes: the first configured wins
				p.Inventory["CUSTOM_VGPU_A16"] = inv(4)
				p.Usages["CUSTOM_VGPU_A16"] = 3
			case h == 2 && g == 1: // usage of another class only
				p.Usages = map[string]int{"CUSTOM_VGPU_A16": 2}
			case h == 3 && g == 2: // untyped
				p.Traits = nil
			}
			ps = append(ps, p)
		}
		// A NIC: a child without vGPU inventory.
		ps = append(ps, engine.Provider{UUID: id(), Name: fmt.Sprintf("node-%d_nic", 5-h), ParentUUID: root, RootUUID: root,
			Traits: []string{"CUSTOM_NIC"}, Inventory: map[string]engine.Inventory{"NET_BW_EGR_KILOBIT_PER_SEC": {Total: 10, MaxUnit: 10}}})
	}
	// A GPU whose root is not mirrored.
	ps = append(ps, engine.Provider{UUID: id(), Name: "lost_pci_0000_3b_00_0", RootUUID: id(), ParentUUID: id(), Generation: 1,
		Traits: []string{"CUSTOM_NVIDIA_232"}, Inventory: map[string]engine.Inventory{"VGPU": inv(4)}})
	testsvc.Must(t, st.Put(ctx, ps, nil), "mirror put")

	same := func(what string, a, b *index.Index) {
		t.Helper()
		if ga, gb := a.GPUs(), b.GPUs(); !reflect.DeepEqual(ga, gb) {
			t.Fatalf("%s: GPUs differ:\nproviders %+v\nrecords   %+v", what, ga, gb)
		}
		if ta, tb := a.Types(), b.Types(); !slices.Equal(ta, tb) {
			t.Errorf("%s: types %v, records %v", what, ta, tb)
		}
		for h := range 6 {
			n := fmt.Sprintf("node-%d", h)
			if ha, hb := a.HostGPUs(n), b.HostGPUs(n); !slices.Equal(ha, hb) {
				t.Errorf("%s: GPUs of %s %v, records %v", what, n, ha, hb)
			}
		}
		for _, k := range []string{"", "CUSTOM_NVIDIA_231", "CUSTOM_NVLINK", "COMPUTE_NODE"} {
			if sa, sb := a.Size(k), b.Size(k); sa != sb {
				t.Errorf("%s: %d GPUs with %q, records %d", what, sa, k, sb)
			}
			for f := range 20 {
				if ba, bb := a.Bucket(k, f), b.Bucket(k, f); !slices.Equal(ba, bb) {
					t.Errorf("%s: bucket %q/%d %v, records %v", what, k, f, ba, bb)
				}
			}
		}
		e := &engine.Engine{}
		for _, q := range []engine.Request{{Required: []string{"CUSTOM_NVIDIA_231"}, Limit: 100},
			{Count: 2, Strategy: engine.Spread, Limit: 100, Forbidden: []string{"COMPUTE_STATUS_DISABLED"}}} {
			ca, _ := a.Decide(e, q)
			cb, _ := b.Decide(e, q)
			if !reflect.DeepEqual(ca, cb) {
				t.Errorf("%s: %+v decides %+v, records %+v", what, q, ca, cb)
			}
		}
	}
	all, err := st.Load(ctx)
	testsvc.Must(t, err, "mirror load")
	recs, err := st.Records(ctx)
	testsvc.Must(t, err, "mirror records")
	if len(recs) != len(ps) {
		t.Fatalf("%d records of %d providers", len(recs), len(ps))
	}
	a, b := index.New(index.Config{Classes: classes}), index.New(index.Config{Classes: classes})
	a.Load(all)
	b.LoadRecords(recs)
	if a.Len() != 19 {
		t.Fatalf("%d GPUs in the index, want 19", a.Len())
	}
	same("load", a, b)
	if g, _ := b.Lookup(ps[1].UUID); g.Host.Name != "node-5" || len(g.Host.Traits) != 2 || g.Used != 0 {
		t.Errorf("GPU %+v (host %+v)", g, g.Host)
	}

	// Some providers change: a GPU's usage and traits, a host's traits, a
	// GPU loses its vGPU inventory.
	ps[1].Usages["VGPU"], ps[1].Traits, ps[1].Generation = 5, []string{"CUSTOM_NVIDIA_233"}, 20
	ps[0].Traits = []string{"CUSTOM_ZONE_C"}
	ps[2].Inventory = map[string]engine.Inventory{"DISK_GB": {Total: 1, MaxUnit: 1}}
	changed := []string{ps[0].UUID, ps[1].UUID, ps[2].UUID, id()}
	testsvc.Must(t, st.Put(ctx, ps[:3], nil), "mirror put")
	some, err := st.Load(ctx, changed...)
	testsvc.Must(t, err, "mirror load")
	srecs, err := st.Records(ctx, changed...)
	testsvc.Must(t, err, "mirror records")
	if len(srecs) != 3 {
		t.Fatalf("%d records of 3 providers", len(srecs))
	}
	for _, p := range some {
		a.Apply(p)
	}
	for _, r := range srecs {
		b.ApplyRecord(r)
	}
	same("apply", a, b)
	if g, _ := b.Lookup(ps[1].UUID); g.Used != 5 || g.Generation != 20 || !slices.Equal(g.Types, []string{"CUSTOM_NVIDIA_233"}) ||
		!slices.Equal(g.Host.Traits, []string{"CUSTOM_ZONE_C"}) {
		t.Errorf("changed GPU %+v (host %+v)", g, g.Host)
	}
	if _, ok := b.Lookup(ps[2].UUID); ok {
		t.Errorf("a provider without vGPU inventory is still a GPU")
	}
}

// TestReadReportedTypes: the types the service reads from the hosts
// table (Postgres picks the fields out of the reports) are those
// ReportedTypes finds in each whole report.
func TestReadReportedTypes(t *testing.T) {
	ctx := ctxT(t)
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	t4 := []protocol.VGPUType{{ID: "nvidia-232", Name: "GRID T4-4Q", MaxInstances: 4}}
	two := []protocol.VGPUType{{ID: "nvidia-231", Name: "GRID T4-2Q", MaxInstances: 8}, {ID: "nvidia-232", Name: "GRID T4-4Q", MaxInstances: 4}}
	active := func(typ string, n int) []protocol.VGPU {
		var vs []protocol.VGPU
		for range n {
			vs = append(vs, protocol.VGPU{MdevUUID: uuid.NewString(), TypeID: typ, InstanceUUID: uuid.NewString(), Owner: protocol.OwnerNova})
		}
		return vs
	}
	hosts := []struct {
		name, node string // the hosts row's (node "" is NULL)
		r          protocol.Report
	}{
		{"cmp1", "cmp1.example.org", protocol.Report{Node: "cmp1.example.org", GPUs: []protocol.GPU{
			{PCI: "0000:3b:00.0", Types: t4},                                   // the one type offered
			{PCI: "0000:3c:00.0", Types: two},                                  // several, none in use: Nova's choice
			{PCI: "0000:3a:00.0", Types: two, EnabledType: "nvidia-231"},       // which the allow-list names
			{PCI: "0000:3d:00.0", Types: two, Active: active("nvidia-231", 2)}, // the type in use
			{PCI: "0000:3e:00.0", Types: nil, Active: active("nvidia-232", 1)},
			{PCI: "", Types: t4},  // no address
			{PCI: "0000:3f:00.0"}, // nothing offered
		}}},
		{"cmp2", "", protocol.Report{GPUs: []protocol.GPU{{PCI: "0000:d8:00.0", Types: t4}}}},         // the row's name
		{"cmp3", "cmp3-row", protocol.Report{GPUs: []protocol.GPU{{PCI: "0000:d8:00.0", Types: t4}}}}, // the row's node
		{"cmp4", "cmp4-row", protocol.Report{Node: "cmp4-report", GPUs: []protocol.GPU{{PCI: "0000:d8:00.0", Types: t4}}}},
		{"cmp5", "", protocol.Report{Node: "cmp5"}}, // no GPUs (null)
		{"cmp6", "", protocol.Report{GPUs: []protocol.GPU{}}},
		{"cmp7", "", protocol.Report{GPUs: []protocol.GPU{{PCI: "0000:3b:00.0", Types: t4, Active: []protocol.VGPU{{TypeID: ""}}}}}},
		{"cmp8", "", protocol.Report{GPUs: []protocol.GPU{{PCI: "0000:c1:00.4", Types: []protocol.VGPUType{{ID: "1429"}}}}}}, // vendor VFIO
	}
	want := map[string]string{}
	for _, h := range hosts {
		raw, err := json.Marshal(h.r)
		testsvc.Must(t, err, "report")
		_, err = pool.Exec(ctx, `INSERT INTO hosts (name, node, last_report_at, report) VALUES ($1, nullif($2, ''), now(), $3)`, h.name, h.node, raw)
		testsvc.Must(t, err, "host "+h.name)
		maps.Copy(want, placement.ReportedTypes(cmp.Or(h.r.Node, h.node, h.name), h.r))
	}
	_, err := pool.Exec(ctx, `INSERT INTO hosts (name) VALUES ('never-reported')`)
	testsvc.Must(t, err, "host without a report")
	got, err := placement.ReadReportedTypes(ctx, pool)
	testsvc.Must(t, err, "read reported types")
	if !maps.Equal(got, want) {
		t.Errorf("read %v\nwant %v", got, want)
	}
	if len(want) != 8 || want["cmp1.example.org_pci_0000_3a_00_0"] != "CUSTOM_NVIDIA_231" {
		t.Errorf("ReportedTypes found %d GPUs, want 8 with the enabled type: %v", len(want), want)
	}
}

// TestLoadedOnce: a follower's Loaded is closed once its index holds a
// full sync, not before: here when a "reload everything" notification
// finds the mirror synced.
func TestLoadedOnce(t *testing.T) {
	ctx := ctxT(t)
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	st := mirror.New(pool, nil, "")
	release, ok, err := st.Lock(ctx)
	if err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	defer release()
	s := replica(t, pool)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	defer func() { stop(); <-done }()
	select {
	case <-s.Loaded():
		t.Fatal("loaded before any full sync")
	case <-time.After(time.Second):
	}
	testsvc.Must(t, st.MarkSynced(ctx, true, 0, "other"), "mark synced")
	_, err = pool.Exec(ctx, `SELECT pg_notify($1, '*')`, mirror.Channel)
	testsvc.Must(t, err, "notify")
	select {
	case <-s.Loaded():
	case <-time.After(20 * time.Second):
		t.Fatal("not loaded after the full sync")
	}
	if err := s.Ready(ctx); err != nil {
		t.Errorf("loaded but not ready: %v", err)
	}
}
