package pipeline_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi/computeapitest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// lookupOutsideTx is the pipeline's lookup of unknown instances, checked
// as the Placement calls are (outsideTx): a lookup that runs while its
// goroutine holds a transaction open fails the test.
type lookupOutsideTx struct {
	t     *testing.T
	watch *txWatch
	l     *ingest.Lookup
	mu    sync.Mutex
	bad   []string
}

func (o *lookupOutsideTx) LookUp(ctx context.Context, instance, project string) (bool, error) {
	if last, open := o.watch.open(); open {
		o.mu.Lock()
		o.bad = append(o.bad, instance+" (last statement: "+last+")")
		o.mu.Unlock()
	}
	return o.l.LookUp(ctx, instance, project)
}

// TestLookupUnknownInstance: a request naming a server Nova has and the
// bridge has not heard of is decided once the pipeline asked Nova for it
// (GET /servers/{id}, no transaction open) and stored it as a listing
// does; a request naming an id Nova does not have is rejected
// unknown_instance saying so; while Nova cannot answer, the request's
// event is retried, not rejected.
func TestLookupUnknownInstance(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.startAgent()
	// Two running domains of the host whose instances the bridge has not
	// heard of.
	first, second := w.domains[3].UUID, w.domains[4].UUID
	_, err := w.pool.Exec(w.ctx, `DELETE FROM instances WHERE uuid = ANY($1::uuid[])`, []string{first, second})
	testsvc.Must(t, err, "forget the instances")
	updated := time.Now().Add(-time.Hour)
	nova := computeapitest.New(computeapitest.Server{ID: first, TenantID: w.project, Host: w.host, Node: w.node, Updated: updated})
	srv := httptest.NewServer(nova)
	t.Cleanup(srv.Close)
	client, err := computeapi.New(w.ctx, computeapi.Config{Endpoint: srv.URL + "/v2.1", Token: "admin:admin"})
	testsvc.Must(t, err, "nova client")
	lk := &lookupOutsideTx{t: t, watch: w.txw, l: ingest.NewLookup(ingest.LookupConfig{AbsentTTL: time.Minute, ClockSkewTolerance: time.Minute},
		w.pool, client, nil)}
	t.Cleanup(func() {
		for _, b := range lk.bad {
			t.Errorf("a Nova lookup ran inside a transaction: %s", b)
		}
	})
	w.startBridge(replicaOpts{name: "r1", lookup: lk})

	// Known through the lookup: attached.
	id := w.submit("GPU_REQUEST", first, map[string]any{"vgpu_profile": "T4-4Q", "count": 1})
	if r := w.wait(id, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("request %s for %s, which Nova has: %s (%s: %s)", id, first, r.State, r.Code, r.Reason)
	}
	var project, last string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT coalesce(project_id, ''), coalesce(last_event_type, '') FROM instances WHERE uuid = $1`, first).
		Scan(&project, &last), "instance row")
	if project != w.project || last != ingest.ServerListEvent {
		t.Errorf("instance %s stored with project %q, last event %q; want %s, %s", first, project, last, w.project, ingest.ServerListEvent)
	}
	if n := nova.Calls(first); n != 1 {
		t.Errorf("Nova was asked %d times for %s, want once", n, first)
	}

	// An id Nova does not have: ended unknown_instance (failed, as a
	// request for an unknown instance always did), Nova's no in the reason.
	random := uuid.NewString()
	id = w.submit("GPU_REQUEST", random, map[string]any{"vgpu_profile": "T4-4Q", "count": 1})
	r := w.wait(id, 60*time.Second)
	if r.State != requests.Failed || r.Code != flow.CodeNoInstance || !strings.Contains(r.Reason, "Nova has no such server") {
		t.Errorf("request %s for %s, which Nova does not have: %s (%s: %s); want failed %s, Nova has no such server",
			id, random, r.State, r.Code, r.Reason, flow.CodeNoInstance)
	}

	// Nova away: the event waits and is tried again; Nova back, it acts.
	nova.Fail(http.StatusServiceUnavailable)
	id = w.submit("GPU_REQUEST", second, map[string]any{"vgpu_profile": "T4-4Q", "count": 1})
	deadline := time.Now().Add(30 * time.Second)
	for {
		var attempts int
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT attempts FROM events WHERE request_id = $1`, id.String()).Scan(&attempts), "event")
		if attempts >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the event of request %s was tried %d times in 30 s while Nova answered 503", id, attempts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r, err := w.requests.Get(w.ctx, id); err != nil || r.State.Final() {
		t.Fatalf("request %s while Nova answered 503: %s (%s: %s), %v; want it waiting", id, r.State, r.Code, r.Reason, err)
	}
	nova.Add(computeapitest.Server{ID: second, TenantID: w.project, Host: w.host, Node: w.node, Updated: updated})
	nova.Fail(0)
	if r := w.wait(id, 60*time.Second); r.State != requests.Succeeded {
		t.Errorf("request %s once Nova answered again: %s (%s: %s)", id, r.State, r.Code, r.Reason)
	}
}
