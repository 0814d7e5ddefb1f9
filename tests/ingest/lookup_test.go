package ingest_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi/computeapitest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// lookupRig is a Lookup on a migrated database and a server answering
// GET /servers/{id} with Nova's own sample (computeapitest).
type lookupRig struct {
	t    *testing.T
	nova *computeapitest.Nova
	l    *ingest.Lookup
	reg  *prometheus.Registry
	ctx  context.Context
}

func newLookupRig(t *testing.T, cfg ingest.LookupConfig, servers ...computeapitest.Server) (*lookupRig, func(string) (string, string)) {
	t.Helper()
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	nova := computeapitest.New(servers...)
	srv := httptest.NewServer(nova)
	t.Cleanup(srv.Close)
	c, err := computeapi.New(context.Background(), computeapi.Config{Endpoint: srv.URL + "/v2.1", Token: "admin:admin"})
	testsvc.Must(t, err, "nova client")
	reg := prometheus.NewRegistry()
	lr := &lookupRig{t: t, nova: nova, l: ingest.NewLookup(cfg, pool, c, reg), reg: reg, ctx: context.Background()}
	row := func(id string) (project, last string) {
		t.Helper()
		err := pool.QueryRow(lr.ctx, `SELECT coalesce(project_id, ''), coalesce(last_event_type, '') FROM instances WHERE uuid = $1`, id).Scan(&project, &last)
		if err != nil {
			return "", ""
		}
		return project, last
	}
	return lr, row
}

func (lr *lookupRig) count(outcome string) int {
	lr.t.Helper()
	mfs, err := lr.reg.Gather()
	testsvc.Must(lr.t, err, "gather")
	for _, mf := range mfs {
		if mf.GetName() != "vgpu_bridge_nova_server_lookups_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "outcome" && lp.GetValue() == outcome {
					return int(m.GetCounter().GetValue())
				}
			}
		}
	}
	lr.t.Fatalf("no series vgpu_bridge_nova_server_lookups_total{outcome=%q}", outcome)
	return 0
}

// TestLookupStoresServerAsListed: a server Nova has is stored as the
// listing stores it (the listing's event type, its project), and reported
// found only to a caller of its project; Nova's 404 is no error.
func TestLookupStoresServerAsListed(t *testing.T) {
	id := uuid.NewString()
	lr, row := newLookupRig(t, ingest.LookupConfig{AbsentTTL: time.Minute, ClockSkewTolerance: time.Minute},
		computeapitest.Server{ID: id, TenantID: "pA", Host: "cmp1", Updated: time.Now().Add(-time.Hour)})
	if found, err := lr.l.LookUp(lr.ctx, id, "pA"); err != nil || !found {
		t.Fatalf("look up %s for its own project: found %v, %v; want found", id, found, err)
	}
	if project, last := row(id); project != "pA" || last != ingest.ServerListEvent {
		t.Errorf("stored: project %q, last event %q; want pA, %s", project, last, ingest.ServerListEvent)
	}
	if found, err := lr.l.LookUp(lr.ctx, id, "pB"); err != nil || found {
		t.Errorf("look up %s for another project: found %v, %v; want not found", id, found, err)
	}
	absent := uuid.NewString()
	if found, err := lr.l.LookUp(lr.ctx, absent, ""); err != nil || found {
		t.Errorf("look up %s, which Nova does not have: found %v, %v; want not found, no error", absent, found, err)
	}
	if project, _ := row(absent); project != "" {
		t.Errorf("a server Nova does not have was stored")
	}
	for outcome, want := range map[string]int{ingest.LookupFound: 1, ingest.LookupOtherProject: 1, ingest.LookupAbsent: 1} {
		if got := lr.count(outcome); got != want {
			t.Errorf("lookups %s: %d, want %d", outcome, got, want)
		}
	}
}

// TestLookupBounded: a flood of requests naming ids Nova does not have
// does not hammer Nova: one call per id in flight, a 404 remembered for
// AbsentTTL, at most Concurrency calls at once; a Nova that fails is an
// error, not remembered, so the next try asks again.
func TestLookupBounded(t *testing.T) {
	const ttl = 2 * time.Second
	lr, _ := newLookupRig(t, ingest.LookupConfig{AbsentTTL: ttl, Concurrency: 3, ClockSkewTolerance: time.Minute})
	lr.nova.Slow(100 * time.Millisecond)
	flood := func(ids []string, per int) {
		var wg sync.WaitGroup
		for _, id := range ids {
			for range per {
				wg.Go(func() {
					if found, err := lr.l.LookUp(lr.ctx, id, ""); err != nil || found {
						t.Errorf("look up %s: found %v, %v; want not found", id, found, err)
					}
				})
			}
		}
		wg.Wait()
	}
	one := uuid.NewString()
	flood([]string{one}, 50)
	if n := lr.nova.Calls(one); n != 1 {
		t.Errorf("50 lookups of one id at once: Nova asked %d times, want 1", n)
	}
	flood([]string{one}, 10)
	if n := lr.nova.Calls(one); n != 1 {
		t.Errorf("lookups within the TTL of a 404: Nova asked %d times, want still 1", n)
	}
	if got := lr.count(ingest.LookupRemembered); got != 10 {
		t.Errorf("lookups answered from the remembered 404: %d, want 10", got)
	}
	var many []string
	for range 30 {
		many = append(many, uuid.NewString())
	}
	flood(many, 3)
	if got := lr.nova.TotalCalls(); got != 31 {
		t.Errorf("30 ids looked up 3 times each: Nova asked %d times in all, want 31", got)
	}
	if got := lr.nova.MaxInFlight(); got > 3 {
		t.Errorf("%d calls to Nova at once, want at most 3 (Concurrency)", got)
	}
	time.Sleep(ttl)
	flood([]string{one}, 1)
	if n := lr.nova.Calls(one); n != 2 {
		t.Errorf("after the TTL: Nova asked %d times, want 2", n)
	}

	lr.nova.Slow(0)
	lr.nova.Fail(http.StatusServiceUnavailable)
	away := uuid.NewString()
	for i := range 2 {
		if found, err := lr.l.LookUp(lr.ctx, away, ""); err == nil || found {
			t.Errorf("Nova answering 503, try %d: found %v, %v; want an error", i, found, err)
		}
	}
	if n := lr.nova.Calls(away); n < 2 {
		t.Errorf("a failed lookup was remembered: Nova asked %d times for 2 tries", n)
	}
	if got := lr.count(ingest.LookupError); got != 2 {
		t.Errorf("lookups failed: %d, want 2", got)
	}
}
