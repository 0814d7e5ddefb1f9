package webhook

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi/computeapitest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestScopedSourceLooksUpUnknownServers: a source limited to proj-a names
// servers the bridge has not heard of. Its own project's server is asked
// of Nova (GET /servers/{id}, Nova's own answer shape), stored and
// accepted; another project's server is refused with the very answer an
// id Nova does not have gets; Nova's 404 is remembered; Nova answering
// 503 is a 503 the caller retries, not a refusal.
func TestScopedSourceLooksUpUnknownServers(t *testing.T) {
	dbURL := testsvc.MigratedPostgres(t)
	mine, theirs := uuid.NewString(), uuid.NewString()
	at := time.Now().Add(-time.Hour)
	nova := computeapitest.New(computeapitest.Server{ID: mine, TenantID: "proj-a", Host: "cmp1", Updated: at},
		computeapitest.Server{ID: theirs, TenantID: "proj-b", Host: "cmp1", Updated: at})
	srv := httptest.NewServer(nova)
	t.Cleanup(srv.Close)
	client, err := computeapi.New(context.Background(), computeapi.Config{Endpoint: srv.URL + "/v2.1", Token: "admin:admin"})
	testsvc.Must(t, err, "nova client")
	lookup := ingest.NewLookup(ingest.LookupConfig{AbsentTTL: time.Minute, ClockSkewTolerance: time.Minute}, testsvc.Pool(t, dbURL), client, nil)
	s := batchSource()
	s.AllowedProjects = []string{"proj-a"}
	e := newEnvDB(t, dbURL, []webhook.Source{s}, func(wc *webhook.Config, _ *api.Config) { wc.Lookup = lookup })
	body := func(vm string) []byte {
		return []byte(`{"type":"GPU_REQUEST","vm_id":"` + vm + `","workload":"training","vgpu_profile":"T4-4Q","nonce":"` + uuid.NewString() + `"}`)
	}
	e.want202(e.postHub("batch", secretNew, body(mine), "k1"))
	if n := e.count(`SELECT count(*) FROM instances WHERE uuid = $1 AND project_id = 'proj-a' AND last_event_type = $2`, mine, ingest.ServerListEvent); n != 1 {
		t.Errorf("server %s not stored as listed in proj-a", mine)
	}

	random := uuid.NewString()
	refusal := func(vm, key string) string {
		t.Helper()
		p := wantProblem(t, e.postHub("batch", secretNew, body(vm), key), http.StatusForbidden, "project_not_allowed")
		d, _ := p["detail"].(string)
		return strings.ReplaceAll(d, vm, "<vm>")
	}
	if a, b := refusal(theirs, "k2"), refusal(random, "k3"); a != b || strings.Contains(a, "proj-b") {
		t.Errorf("another project's server: %q; an id Nova does not have: %q; want the same words, no project named", a, b)
	}
	refusal(random, "k4")
	if n := nova.Calls(random); n != 1 {
		t.Errorf("Nova asked %d times for %s, which it does not have, want once (the 404 remembered)", n, random)
	}
	if n := e.count(`SELECT count(*) FROM requests`); n != 1 {
		t.Errorf("%d requests stored, want 1", n)
	}

	nova.Fail(http.StatusServiceUnavailable)
	a := e.postHub("batch", secretNew, body(uuid.NewString()), "k5")
	wantProblem(t, a, http.StatusServiceUnavailable, "nova_unavailable")
}
