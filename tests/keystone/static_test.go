package keystone_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	bapi "github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// The project scoping Keystone tokens get applies as well to static tokens
// with a PROJECT ([api] token_file): here without Keystone, over the real
// handlers and Postgres.
func TestStaticTokenProjectScope(t *testing.T) {
	pool := testsvc.Pool(t, testsvc.MigratedPostgres(t))
	ctx := context.Background()
	instA, instB := uuid.NewString(), uuid.NewString()
	for inst, proj := range map[string]string{instA: "proj-a", instB: "proj-b"} {
		_, err := pool.Exec(ctx, `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state)
			VALUES ($1, $2, 'u', 'h', 'n', 'active', 'running')`, inst, proj)
		testsvc.Must(t, err, "insert instance")
	}
	store := requests.NewStore(pool, "test")
	ia, ib := uuid.MustParse(instA), uuid.MustParse(instB)
	rs := []requests.Request{
		{ID: uuid.New(), Source: "operator", Kind: "GPU_REQUEST", InstanceUUID: &ia},
		{ID: uuid.New(), Source: "operator", Kind: "GPU_REQUEST", InstanceUUID: &ib},
		{ID: uuid.New(), Source: "operator", Kind: "GPU_LOAD"},
	}
	testsvc.Must(t, store.Do(ctx, func(tx pgx.Tx) error { return store.CreateBatch(ctx, tx, rs) }), "create requests")
	reqA, reqB, reqNone := rs[0].ID.String(), rs[1].ID.String(), rs[2].ID.String()

	tf := filepath.Join(t.TempDir(), "api-tokens")
	testsvc.Must(t, os.WriteFile(tf, []byte("t-admin admin ops\nt-read-a reader viewer-a proj-a\nt-admin-b admin ops-b proj-b\n"), 0o600), "token file")
	st, err := bapi.LoadTokenFile(tf)
	testsvc.Must(t, err, "load token file")
	srv := bapi.New(bapi.Config{Auth: st})
	ingest.NewAPI(pool).Register(srv)
	requests.NewHandler(store, st, nil, nil).Register(srv)
	hs := httptest.NewServer(srv.Echo())
	defer hs.Close()
	c := api{t: t, base: hs.URL}

	if got := ids(t, c.expect(200, "GET", "/v1/requests", "t-admin", "admin"), "requests", "id"); !equal(got, sorted(reqA, reqB, reqNone)) {
		t.Errorf("admin requests = %v, want all three", got)
	}
	if got := ids(t, c.expect(200, "GET", "/v1/requests", "t-read-a", "reader of A"), "requests", "id"); !equal(got, []string{reqA}) {
		t.Errorf("reader of A requests = %v, want only %s", got, reqA)
	}
	if got := ids(t, c.expect(200, "GET", "/v1/instances", "t-read-a", "reader of A"), "instances", "uuid"); !equal(got, []string{instA}) {
		t.Errorf("reader of A instances = %v, want only %s", got, instA)
	}
	c.expect(200, "GET", "/v1/requests/"+reqA, "t-read-a", "reader of A")
	c.expect(404, "GET", "/v1/requests/"+reqB, "t-read-a", "reader of A").problem(t)
	c.expect(404, "GET", "/v1/requests/"+reqNone, "t-read-a", "reader of A")
	c.expect(404, "GET", "/v1/instances/"+instB, "t-read-a", "reader of A")
	// An admin limited to project B cancels B's request, not A's.
	c.expect(404, "POST", "/v1/requests/"+reqA+"/cancel", "t-admin-b", "admin of B").problem(t)
	c.expect(200, "POST", "/v1/requests/"+reqB+"/cancel", "t-admin-b", "admin of B")
	c.expect(401, "GET", "/v1/requests", "t-wrong", "unknown token").problem(t)
}
