// Package placement_test runs package placement (sync, mirror, index,
// claims, releases) against the real Placement service and Postgres.
package placement_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
	"github.com/vgpu-bridge/vgpu-bridge/placement/engine"
	"github.com/vgpu-bridge/vgpu-bridge/tests/placementfleet"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

func newService(t *testing.T, withDB bool) *placement.Service {
	t.Helper()
	url := testsvc.PlacementURL(t)
	cfg := placement.Config{Client: placement.ClientConfig{Endpoint: url, Token: "admin"}, SyncConcurrency: 4}
	if withDB {
		cfg.TraitListingMin = 1 // exercise the per-trait listing too
	}
	var s *placement.Service
	var err error
	if withDB {
		pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
		s, err = placement.New(context.Background(), cfg, pool, catalog.New(), nil)
	} else {
		s, err = placement.New(context.Background(), cfg, nil, catalog.New(), nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func load(t *testing.T, s *placement.Service, nodes []placementfleet.Node) *placementfleet.Fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := placementfleet.Load(ctx, s.Client().ServiceClient(), nodes, 4)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := f.Cleanup(ctx, extraConsumers(t)...); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

var (
	extraMu sync.Mutex
	extra   = map[string][]string{}
)

// consumer returns a fresh consumer uuid deleted at cleanup.
func consumer(t *testing.T) string {
	c := uuid.NewString()
	extraMu.Lock()
	extra[t.Name()] = append(extra[t.Name()], c)
	extraMu.Unlock()
	return c
}

func extraConsumers(t *testing.T) []string {
	extraMu.Lock()
	defer extraMu.Unlock()
	return extra[t.Name()]
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func name(prefix string) string { return testsvc.Name(prefix) }

// TestSyncNestedTrees: several types, reserved units and existing
// allocations come into the mirror and the index; an incremental sync
// picks up a change by generation and a removal.
func TestSyncNestedTrees(t *testing.T) {
	s := newService(t, true)
	ty1, ty2 := placementfleet.UniqueType(), placementfleet.UniqueType()
	n1, n2 := name("it-sync-a"), name("it-sync-b")
	f := load(t, s, []placementfleet.Node{
		{Name: n1, GPUs: []placementfleet.GPU{{Trait: ty1, Total: 4, Reserved: 1, Used: 2}, {Trait: ty2, Total: 8}}},
		{Name: n2, Traits: []string{"COMPUTE_STATUS_DISABLED"}, GPUs: []placementfleet.GPU{{Trait: ty1, Total: 4, Used: 4}, {Trait: ty1, Total: 4, Used: 1}, {Trait: ty2, Total: 8, Reserved: 8}}},
	})
	ctx := ctxT(t)
	st, err := s.SyncNow(ctx, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Providers < 7 || st.Fetched != st.Providers {
		t.Fatalf("full sync stats %+v", st)
	}
	want := map[string]int{f.GPUs[0][0]: 1, f.GPUs[0][1]: 8, f.GPUs[1][0]: 0, f.GPUs[1][1]: 3, f.GPUs[1][2]: 0}
	for u, free := range want {
		g, ok := s.Index().Lookup(u)
		if !ok {
			t.Fatalf("GPU %s not in the index", u)
		}
		if g.Free() != free {
			t.Errorf("GPU %s free = %d, want %d", u, g.Free(), free)
		}
	}
	g, _ := s.Index().Lookup(f.GPUs[1][0])
	if g.Host.Name != n2 || !g.Host.HasTrait("COMPUTE_STATUS_DISABLED") || g.PCIAddress() != "0000:3b:00.0" {
		t.Errorf("GPU host/pci: %+v host %+v", g, g.Host)
	}
	// The mirror holds the trees and the foundation's gpus rows.
	var node, pci, vt string
	if err := s.Store().Pool().QueryRow(ctx, `SELECT node, pci_address, vgpu_type FROM gpus WHERE provider_uuid = $1`, f.GPUs[0][1]).Scan(&node, &pci, &vt); err != nil {
		t.Fatal(err)
	}
	if node != n1 || pci != "0000:3c:00.0" || vt == "" {
		t.Errorf("gpus row: node %q pci %q type %q", node, pci, vt)
	}
	var root string
	if err := s.Store().Pool().QueryRow(ctx, `SELECT root_uuid::text FROM placement_providers WHERE uuid = $1`, f.GPUs[1][2]).Scan(&root); err != nil || root != f.Roots[1] {
		t.Errorf("root of GPU = %q (%v), want %q", root, err, f.Roots[1])
	}
	// Decisions: the disabled host is skipped when forbidden; pack first.
	dr, err := s.DryRun(placement.DryRunRequest{Traits: struct {
		Required  []string `json:"required,omitempty"`
		Forbidden []string `json:"forbidden,omitempty"`
	}{Required: []string{ty1}, Forbidden: []string{"COMPUTE_STATUS_DISABLED"}}, Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(dr.Candidates) != 1 || dr.Candidates[0].ProviderUUID != f.GPUs[0][0] || dr.Candidates[0].Reason == "" {
		t.Fatalf("dry run: %+v", dr)
	}
	// Someone else allocates on a GPU: its generation moves.
	c := consumer(t)
	err = allocations.Update(ctx, s.Client().ServiceClient(), c, allocations.UpdateOpts{
		Allocations: map[string]allocations.ProviderAllocationsOpts{f.GPUs[0][1]: {Resources: map[string]int{"VGPU": 3}}},
		ProjectID:   f.Project, UserID: f.User, ConsumerType: "INSTANCE",
	}).ExtractErr()
	if err != nil {
		t.Fatal(err)
	}
	st, err = s.SyncNow(ctx, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Fetched < 1 || st.Fetched >= st.Providers {
		t.Errorf("incremental sync fetched %d of %d", st.Fetched, st.Providers)
	}
	if g, _ := s.Index().Lookup(f.GPUs[0][1]); g.Free() != 5 {
		t.Errorf("after external allocation free = %d, want 5", g.Free())
	}
	al, err := s.Store().Allocations(ctx, c)
	if err != nil || len(al) != 1 || al[0].Used != 3 {
		t.Errorf("mirrored allocations of %s: %+v %v", c, al, err)
	}
}

// TestClaimKeepsExistingAllocations: a claim adds VGPU to a consumer that
// already holds VCPU/MEMORY_MB on the root, the index learns at once, and
// a release removes only the VGPU.
func TestClaimKeepsExistingAllocations(t *testing.T) {
	s := newService(t, true)
	ty := placementfleet.UniqueType()
	f := load(t, s, []placementfleet.Node{{Name: name("it-claim"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 4, Used: 1}, {Trait: ty, Total: 4}}}})
	ctx := ctxT(t)
	if _, err := s.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	inst := consumer(t)
	sc := s.Client().ServiceClient()
	if err := allocations.Update(ctx, sc, inst, allocations.UpdateOpts{
		Allocations: map[string]allocations.ProviderAllocationsOpts{f.Roots[0]: {Resources: map[string]int{"VCPU": 4, "MEMORY_MB": 4096}}},
		ProjectID:   f.Project, UserID: f.User, ConsumerType: "INSTANCE",
	}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	cl, err := s.Claim(ctx, placement.ClaimRequest{Consumer: inst, Request: engine.Request{Required: []string{ty}, Count: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if cl.Provider != f.GPUs[0][0] { // pack: the partly used GPU
		t.Errorf("claimed on %s, want %s", cl.Provider, f.GPUs[0][0])
	}
	if g, _ := s.Index().Lookup(cl.Provider); g.Free() != 1 {
		t.Errorf("index free after claim = %d, want 1", g.Free())
	}
	con, err := s.Client().Allocations(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	if con.Providers[f.Roots[0]]["VCPU"] != 4 || con.Providers[cl.Provider]["VGPU"] != 2 || con.Type != "INSTANCE" {
		t.Fatalf("consumer after claim: %+v", con)
	}
	hs, err := s.LookupVGPU(ctx, inst)
	if err != nil || len(hs) != 1 || hs[0].Provider != cl.Provider || hs[0].Amount != 2 || hs[0].PCIAddress != "0000:3b:00.0" {
		t.Fatalf("LookupVGPU = %+v, %v", hs, err)
	}
	if al, _ := s.Store().Allocations(ctx, inst); len(al) != 1 || al[0].Used != 2 {
		t.Errorf("mirror after claim: %+v", al)
	}
	if err := s.Release(ctx, inst, ""); err != nil {
		t.Fatal(err)
	}
	con, _ = s.Client().Allocations(ctx, inst)
	if con.Providers[f.Roots[0]]["VCPU"] != 4 || len(con.Providers[cl.Provider]) != 0 {
		t.Fatalf("consumer after release: %+v", con)
	}
	if g, _ := s.Index().Lookup(cl.Provider); g.Free() != 3 {
		t.Errorf("index free after release = %d, want 3", g.Free())
	}
	if hs, _ := s.LookupVGPU(ctx, inst); len(hs) != 0 {
		t.Errorf("LookupVGPU after release = %+v", hs)
	}
}

// TestGenerationConflicts provokes consumer generation conflicts on
// purpose: a stale write is classified as a conflict, and concurrent
// claims for one consumer all land through refresh and retry.
func TestGenerationConflicts(t *testing.T) {
	s := newService(t, false)
	ty := placementfleet.UniqueType()
	f := load(t, s, []placementfleet.Node{{Name: name("it-conflict"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 16}}}})
	ctx := ctxT(t)
	if _, err := s.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	inst := consumer(t)
	c := s.Client()
	con, err := c.Allocations(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	con.ProjectID, con.UserID, con.Type = f.Project, f.User, "INSTANCE"
	con.Providers[f.GPUs[0][0]] = map[string]int{"VGPU": 1}
	if err := c.PutAllocations(ctx, con); err != nil {
		t.Fatal(err)
	}
	// The same stale view again: generation null, but the consumer exists.
	err = c.PutAllocations(ctx, con)
	if !placement.IsConflict(err) {
		t.Fatalf("stale consumer generation: %v, want a conflict", err)
	}
	var pe *placement.Error
	if !errors.As(err, &pe) || pe.Code != placement.CodeConcurrentUpdate {
		t.Fatalf("error %v lacks code %s", err, placement.CodeConcurrentUpdate)
	}
	// Over capacity: a capacity error, not a conflict.
	con, _ = c.Allocations(ctx, inst)
	con.Providers[f.GPUs[0][0]] = map[string]int{"VGPU": 17}
	if err := c.PutAllocations(ctx, con); !placement.IsCapacity(err) {
		t.Fatalf("over capacity: %v, want a capacity error", err)
	}
	// Eight claims for one consumer at once: each must refresh and retry.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	attempts := make(chan int, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := s.Claim(ctx, placement.ClaimRequest{Consumer: inst, ProjectID: f.Project, UserID: f.User, Request: engine.Request{Required: []string{ty}}})
			if err != nil {
				errs <- err
				return
			}
			attempts <- cl.Attempts
		}()
	}
	wg.Wait()
	close(errs)
	close(attempts)
	for err := range errs {
		t.Error(err)
	}
	retried := 0
	for a := range attempts {
		if a > 1 {
			retried++
		}
	}
	con, _ = c.Allocations(ctx, inst)
	if got := con.Providers[f.GPUs[0][0]]["VGPU"]; got != 9 {
		t.Fatalf("consumer holds %d VGPU, want 9", got)
	}
	t.Logf("%d of 8 concurrent claims retried after a generation conflict", retried)
	if retried == 0 {
		t.Error("no claim met a generation conflict; the test provoked none")
	}
}

// TestRaceLastUnits: 32 claimers race for the last 20 free units across
// the fleet; exactly 20 win, and Placement's usages agree.
func TestRaceLastUnits(t *testing.T) {
	s := newService(t, true)
	ty := placementfleet.UniqueType()
	// Free: 3 + 2 + 4 + 1 + 6 + 4 = 20.
	f := load(t, s, []placementfleet.Node{
		{Name: name("it-race-a"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 4, Used: 1}, {Trait: ty, Total: 4, Reserved: 1, Used: 1}}},
		{Name: name("it-race-b"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 4}, {Trait: ty, Total: 4, Used: 3}}},
		{Name: name("it-race-c"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 8, Reserved: 2}, {Trait: ty, Total: 4, Ratio: 1}}},
	})
	ctx := ctxT(t)
	if _, err := s.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	var wins, full, other int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 32; i++ {
		wg.Add(1)
		inst := consumer(t)
		go func(i int) {
			defer wg.Done()
			_, err := s.Claim(ctx, placement.ClaimRequest{Consumer: inst, ProjectID: f.Project, UserID: f.User,
				Request: engine.Request{Required: []string{ty}, Strategy: []engine.Strategy{engine.Pack, engine.Spread}[i%2]}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, placement.ErrNoCapacity):
				full++
			default:
				other++
				t.Errorf("claimer %d: %v", i, err)
			}
		}(i)
	}
	wg.Wait()
	if wins != 20 || full != 12 || other != 0 {
		t.Fatalf("wins %d, no capacity %d, other %d; want 20, 12, 0", wins, full, other)
	}
	total := 0
	for _, id := range f.AllGPUs() {
		inv, _, err := s.Client().Inventories(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		u, _, err := s.Client().Usages(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		capacity := inv["VGPU"].Capacity()
		if u["VGPU"] != capacity {
			t.Errorf("GPU %s used %d of %d: not full", id, u["VGPU"], capacity)
		}
		if u["VGPU"] > capacity {
			t.Errorf("GPU %s overbooked", id)
		}
		if g, _ := s.Index().Lookup(id); g.Used != u["VGPU"] {
			t.Errorf("index says %d used on %s, Placement %d", g.Used, id, u["VGPU"])
		}
		total += u["VGPU"]
	}
	if want := 1 + 1 + 0 + 3 + 20; total != want {
		t.Errorf("total VGPU usage %d, want %d", total, want)
	}
}

// TestOneSyncerAndFollowers: the advisory lock lets one replica sync; a
// replica that does not hold it follows the mirror's notifications, so a
// claim made by another replica reaches its index without a sync.
// replica makes one bridge replica's placement service on pool, syncing
// only when told to (SyncInterval an hour).
func replica(t *testing.T, pool *pgxpool.Pool) *placement.Service {
	t.Helper()
	s, err := placement.New(context.Background(), placement.Config{Client: placement.ClientConfig{Endpoint: testsvc.PlacementURL(t), Token: "admin"},
		SyncConcurrency: 4, SyncInterval: time.Hour}, pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestOneSyncerAndFollowers(t *testing.T) {
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	a, b, c := replica(t, pool), replica(t, pool), replica(t, pool)
	ty := placementfleet.UniqueType()
	f := load(t, a, []placementfleet.Node{{Name: name("it-follow"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 4}}}})
	ctx := ctxT(t)
	if _, err := a.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	release, ok, err := a.Store().Lock(ctx)
	if err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	if _, err := b.SyncNow(ctx, false, nil); !errors.Is(err, placement.ErrSyncBusy) {
		t.Fatalf("second syncer: %v, want ErrSyncBusy", err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	gpu := f.GPUs[0][0]
	waitFor(t, func() bool { _, ok := c.Index().Lookup(gpu); return ok }, "follower loads the mirror")
	if _, err := a.Claim(ctx, placement.ClaimRequest{Consumer: consumer(t), ProjectID: f.Project, UserID: f.User,
		Request: engine.Request{Required: []string{ty}, Count: 3}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { g, _ := c.Index().Lookup(gpu); return g.Used == 3 }, "follower learns the claim")
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	release()
	if _, err := b.SyncNow(ctx, false, nil); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	testsvc.WaitFor(t, 20*time.Second, what, cond)
}

// TestClaimFromRead: a claim may start from the allocations its caller has
// just read (ReadVGPU), one GET fewer. A fresh read lands in one attempt
// and is not modified; a read that went stale (Nova wrote the consumer in
// between) costs a conflict and a fresh read, and loses nothing of what
// was written meanwhile.
func TestClaimFromRead(t *testing.T) {
	s := newService(t, false)
	ty := placementfleet.UniqueType()
	f := load(t, s, []placementfleet.Node{{Name: name("it-read"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 8}}}})
	ctx := ctxT(t)
	if _, err := s.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	setRoot := func(inst string, vcpu int) { t.Helper(); novaSetsRoot(ctx, t, s, f, inst, vcpu) }
	req := engine.Request{Required: []string{ty}, Count: 1}

	fresh := consumer(t)
	setRoot(fresh, 2)
	hs, read, err := s.ReadVGPU(ctx, fresh)
	if err != nil || len(hs) != 0 || read.Generation == nil {
		t.Fatalf("ReadVGPU = %+v, %+v, %v", hs, read, err)
	}
	before := len(read.Providers)
	cl, err := s.Claim(ctx, placement.ClaimRequest{Consumer: fresh, Request: req, Read: read})
	if err != nil {
		t.Fatal(err)
	}
	if cl.Attempts != 1 || cl.Held != 1 {
		t.Errorf("claim from a fresh read: attempts %d, held %d; want 1, 1", cl.Attempts, cl.Held)
	}
	if len(read.Providers) != before {
		t.Errorf("Claim modified the caller's read: %+v", read.Providers)
	}

	stale := consumer(t)
	setRoot(stale, 2)
	_, read, err = s.ReadVGPU(ctx, stale)
	if err != nil {
		t.Fatal(err)
	}
	setRoot(stale, 6) // Nova resizes the instance after the read
	cl, err = s.Claim(ctx, placement.ClaimRequest{Consumer: stale, Request: req, Read: read})
	if err != nil {
		t.Fatal(err)
	}
	if cl.Attempts != 2 {
		t.Errorf("claim from a stale read: %d attempts, want 2 (conflict, then a fresh read)", cl.Attempts)
	}
	con, err := s.Client().Allocations(ctx, stale)
	if err != nil {
		t.Fatal(err)
	}
	if con.Providers[f.Roots[0]]["VCPU"] != 6 || con.Providers[cl.Provider]["VGPU"] != 1 {
		t.Fatalf("consumer after a claim from a stale read: %+v (want VCPU 6 kept and VGPU 1)", con.Providers)
	}
}

// TestReleaseUnits: a direct-path release takes units off one provider and
// keeps the rest of the consumer's allocations; a retry after the release
// already happened (the consumer holds less than heldAfter) changes
// nothing, and a release of what is not there is a no-op.
func TestReleaseUnits(t *testing.T) {
	s := newService(t, false)
	ty := placementfleet.UniqueType()
	f := load(t, s, []placementfleet.Node{{Name: name("it-rel"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 8}}}})
	ctx := ctxT(t)
	if _, err := s.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	inst := consumer(t)
	req := engine.Request{Required: []string{ty}, Count: 1}
	var last *placement.Claim
	for range 3 {
		cl, err := s.Claim(ctx, placement.ClaimRequest{Consumer: inst, ProjectID: f.Project, UserID: f.User, Request: req})
		if err != nil {
			t.Fatal(err)
		}
		last = cl
	}
	if last.Held != 3 {
		t.Fatalf("held after three claims: %d, want 3", last.Held)
	}
	held := func() int {
		t.Helper()
		con, err := s.Client().Allocations(ctx, inst)
		if err != nil {
			t.Fatal(err)
		}
		return con.Providers[last.Provider][last.Class]
	}
	// Undo the third claim (heldAfter 3): 3 → 2.
	if err := s.ReleaseUnits(ctx, inst, last.Provider, last.Class, 1, 3); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 2 {
		t.Fatalf("held after releasing one: %d, want 2", n)
	}
	// The same release again, as after a crash before it was recorded:
	// the consumer holds less than heldAfter, so it is done already.
	if err := s.ReleaseUnits(ctx, inst, last.Provider, last.Class, 1, 3); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 2 {
		t.Fatalf("held after a repeated release: %d, want 2 (unchanged)", n)
	}
	// Release both that remain: the provider leaves the consumer.
	if err := s.ReleaseUnits(ctx, inst, last.Provider, last.Class, 2, 2); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 0 {
		t.Fatalf("held after releasing all: %d, want 0", n)
	}
	if err := s.ReleaseUnits(ctx, inst, last.Provider, last.Class, 1, 0); err != nil {
		t.Fatalf("release of nothing: %v, want a no-op", err)
	}
	if g, ok := s.Index().Lookup(last.Provider); !ok || g.Used != 0 {
		t.Errorf("index after the releases: %+v (found %v), want 0 used", g, ok)
	}
}

// TestReadyKnowsHosts: a bridge restarted on a synced mirror is ready at
// once, and from that moment a decision for a compute host by its name
// (which differs from its node's) finds the host's GPUs — the host ↔
// node map is read before readiness, not after the first sync round.
func TestReadyKnowsHosts(t *testing.T) {
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	a := replica(t, pool)
	ty := placementfleet.UniqueType()
	node := name("it-ready") + ".example"
	host := strings.TrimSuffix(node, ".example")
	load(t, a, []placementfleet.Node{{Name: node, GPUs: []placementfleet.GPU{{Trait: ty, Total: 4}}}})
	ctx := ctxT(t)
	if _, err := a.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO hosts (name, node) VALUES ($1, $2)`, host, node); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		b := replica(t, pool)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- b.Run(rctx) }()
		for b.Ready(ctx) != nil {
			if ctx.Err() != nil {
				t.Fatal("never ready")
			}
		}
		res, err := b.DryRun(placement.DryRunRequest{Host: host, Traits: struct {
			Required  []string `json:"required,omitempty"`
			Forbidden []string `json:"forbidden,omitempty"`
		}{Required: []string{ty}}, Count: 1})
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err != nil || len(res.Candidates) != 1 || res.Candidates[0].Host != host {
			t.Fatalf("start %d: dry run for host %s as soon as ready: %+v, %v; want its one GPU", i, host, res.Candidates, err)
		}
	}
}

// countCalls counts the service's Placement calls by method: those
// Placement answered (uwsgi resets idle keep-alive connections now and
// then, and the client sends such a request again).
type countCalls struct {
	mu sync.Mutex
	n  map[string]int
	rt http.RoundTripper
}

func (c *countCalls) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	c.mu.Lock()
	c.n[r.Method]++
	if resp != nil && resp.StatusCode >= 400 {
		c.n[r.Method+" "+resp.Status]++
	}
	c.mu.Unlock()
	return resp, err
}

func (c *countCalls) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.n
	c.n = map[string]int{}
	return out
}

// TestOneCallClaims: once the service has read a consumer (as the
// pipeline does when Nova says its allocations changed), each claim and
// claim on it is one PUT, and what the service keeps of the consumer is
// Placement's own generation; when someone else writes the consumer in
// between, the claim meets a 409, reads again and still keeps what Nova
// wrote.
func TestOneCallClaims(t *testing.T) {
	cc := &countCalls{n: map[string]int{}}
	s, err := placement.New(context.Background(), placement.Config{Client: placement.ClientConfig{Endpoint: testsvc.PlacementURL(t), Token: "admin",
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper { cc.rt = rt; return cc }}, SyncConcurrency: 4}, nil, catalog.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ty := placementfleet.UniqueType()
	f := load(t, s, []placementfleet.Node{{Name: name("it-one"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 8}}}})
	ctx := ctxT(t)
	if _, err := s.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	inst := consumer(t)
	novaWrites := func(vcpu int) { t.Helper(); novaSetsRoot(ctx, t, s, f, inst, vcpu) }
	novaWrites(2)
	if _, _, err := s.ReadVGPU(ctx, inst); err != nil { // Nova's notification arrived
		t.Fatal(err)
	}
	req := engine.Request{Required: []string{ty}, Count: 1}
	claim := func() *placement.Claim {
		t.Helper()
		_, read, cached, err := s.CachedVGPU(ctx, inst)
		if err != nil || !cached {
			t.Fatalf("CachedVGPU: cached %v, %v", cached, err)
		}
		cl, err := s.Claim(ctx, placement.ClaimRequest{Consumer: inst, Request: req, Read: read})
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	cc.take()
	for i := 1; i <= 2; i++ {
		cl := claim()
		if calls := cc.take(); calls["PUT"] != 1 || len(calls) != 1 || cl.Held != i {
			t.Errorf("claim %d: calls %v, held %d; want one PUT, held %d", i, calls, cl.Held, i)
		}
	}
	_, kept, _, _ := s.CachedVGPU(ctx, inst)
	real, err := s.Client().Allocations(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	if kept.Generation == nil || real.Generation == nil || *kept.Generation != *real.Generation {
		t.Fatalf("kept generation %v, Placement's %v", kept.Generation, real.Generation)
	}

	novaWrites(6) // Nova resizes the instance; its notification is not in yet
	cc.take()
	cl := claim()
	if cl.Attempts != 2 {
		t.Errorf("a claim on a stale view: %d attempts, want 2 (a 409, a read, a PUT)", cl.Attempts)
	}
	con, err := s.Client().Allocations(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	if con.Providers[f.Roots[0]]["VCPU"] != 6 || con.Providers[cl.Provider]["VGPU"] != 3 {
		t.Fatalf("after a claim on a stale view: %+v (want Nova's VCPU 6 kept and 3 VGPU)", con.Providers)
	}
}

// novaSetsRoot does what Nova does to inst's allocations when it creates
// or resizes it: VCPU and MEMORY_MB on the first root provider, the rest
// of the consumer's allocations kept.
func novaSetsRoot(ctx context.Context, t *testing.T, s *placement.Service, f *placementfleet.Fleet, inst string, vcpu int) {
	t.Helper()
	con, err := s.Client().Allocations(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	opts := allocations.UpdateOpts{Allocations: map[string]allocations.ProviderAllocationsOpts{},
		ProjectID: f.Project, UserID: f.User, ConsumerType: "INSTANCE", ConsumerGeneration: con.Generation}
	for rp, res := range con.Providers {
		opts.Allocations[rp] = allocations.ProviderAllocationsOpts{Resources: res}
	}
	opts.Allocations[f.Roots[0]] = allocations.ProviderAllocationsOpts{Resources: map[string]int{"VCPU": vcpu, "MEMORY_MB": 1024}}
	if err := allocations.Update(ctx, s.Client().ServiceClient(), inst, opts).ExtractErr(); err != nil {
		t.Fatal(err)
	}
}

// TestMirrorFollowsClaims: what a claim or release changes is in the
// mirror as soon as the call returns (one statement, no read back from
// Placement), as Placement holds it: the consumer's allocation and the
// provider's usage. The mirrored generation stays behind Placement's (the
// bridge cannot tell its own write from another's without reading), so
// the next incremental sync reads the provider again.
func TestMirrorFollowsClaims(t *testing.T) {
	s := newService(t, true)
	ty := placementfleet.UniqueType()
	f := load(t, s, []placementfleet.Node{{Name: name("it-mirror"), GPUs: []placementfleet.GPU{{Trait: ty, Total: 8}}}})
	ctx := ctxT(t)
	if _, err := s.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	inst := consumer(t)
	gpu := f.GPUs[0][0]
	check := func(step string, wantHeld int) {
		t.Helper()
		var held, used, gen int
		err := s.Store().Pool().QueryRow(ctx, `SELECT
				coalesce((SELECT used FROM placement_allocations WHERE provider_uuid = $1 AND consumer_uuid = $2 AND resource_class = 'VGPU'), 0),
				coalesce((SELECT used FROM placement_usages WHERE provider_uuid = $1 AND resource_class = 'VGPU'), 0),
				(SELECT generation FROM placement_providers WHERE uuid = $1)`, gpu, inst).Scan(&held, &used, &gen)
		if err != nil {
			t.Fatal(err)
		}
		usages, pgen, err := s.Client().Usages(ctx, gpu)
		if err != nil {
			t.Fatal(err)
		}
		if held != wantHeld || used != usages["VGPU"] || gen >= pgen {
			t.Errorf("%s: mirror holds %d for the consumer, usage %d, generation %d; want %d, Placement's usage %d and a generation below Placement's %d",
				step, held, used, gen, wantHeld, usages["VGPU"], pgen)
		}
	}
	req := engine.Request{Required: []string{ty}, Count: 1}
	for i := 1; i <= 2; i++ {
		if _, err := s.Claim(ctx, placement.ClaimRequest{Consumer: inst, ProjectID: f.Project, UserID: f.User, Request: req}); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("after claim %d", i), i)
	}
	if err := s.ReleaseUnits(ctx, inst, gpu, "VGPU", 1, 2); err != nil {
		t.Fatal(err)
	}
	check("after releasing one", 1)
	if err := s.ReleaseUnits(ctx, inst, gpu, "VGPU", 1, 1); err != nil {
		t.Fatal(err)
	}
	check("after releasing all", 0)
}

// TestClaimSyncsForUnknownHost: a claim on a host whose GPUs came into
// Placement after the last sync (a host added meanwhile, where Nova has
// just moved an instance) asks Placement before answering no capacity,
// and lands there; a claim on a host Placement has no GPU of still ends
// in ErrNoCapacity.
func TestClaimSyncsForUnknownHost(t *testing.T) {
	s := newService(t, true)
	ctx := ctxT(t)
	if _, err := s.SyncNow(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	ty := placementfleet.UniqueType()
	node := name("it-late")
	f := load(t, s, []placementfleet.Node{{Name: node, GPUs: []placementfleet.GPU{{Trait: ty, Total: 4}}}})
	if _, ok := s.Index().Lookup(f.GPUs[0][0]); ok {
		t.Fatal("the index knows the new host's GPU before any sync: the test proves nothing")
	}
	inst := consumer(t)
	cl, err := s.Claim(ctx, placement.ClaimRequest{Consumer: inst, ProjectID: f.Project, UserID: f.User,
		Request: engine.Request{Required: []string{ty}, Count: 1, Hosts: []string{node}}})
	if err != nil {
		t.Fatalf("claim on the host added after the sync: %v", err)
	}
	if cl.Provider != f.GPUs[0][0] {
		t.Errorf("claimed on %s, want the new host's GPU %s", cl.Provider, f.GPUs[0][0])
	}
	if con, err := s.Client().Allocations(ctx, inst); err != nil || con.Providers[f.GPUs[0][0]]["VGPU"] != 1 {
		t.Errorf("Placement after the claim: %+v, %v", con, err)
	}
	_, err = s.Claim(ctx, placement.ClaimRequest{Consumer: consumer(t), ProjectID: f.Project, UserID: f.User,
		Request: engine.Request{Required: []string{ty}, Count: 1, Hosts: []string{name("it-nohost")}}})
	if !errors.Is(err, placement.ErrNoCapacity) {
		t.Errorf("claim on a host with no GPU: %v, want ErrNoCapacity", err)
	}
}
