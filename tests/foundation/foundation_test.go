// Package foundation tests the bridge daemon as a whole against the real
// Postgres and RabbitMQ: schema migrations, readiness, the OpenAPI
// document and shutdown.
package foundation

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/migrations"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

func TestMigrationsOnEmptyDatabaseTwice(t *testing.T) {
	ctx := context.Background()
	pool := testsvc.Pool(t, testsvc.Postgres(t))
	files, _ := fs.Glob(migrations.FS, "*.sql")
	first, err := store.Migrate(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != len(files) {
		t.Errorf("first run applied %d migrations, want %d", len(first), len(files))
	}
	second, err := store.Migrate(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(second) != 0 {
		t.Errorf("second run applied %v, want nothing", second)
	}
	for _, table := range []string{"hosts", "gpus", "instances", "events", "requests", "commands", "dead_letters", "audit_log"} {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s missing (%v)", table, err)
		}
	}
	n, err := store.Pending(ctx, pool)
	if err != nil || n != 0 {
		t.Errorf("pending = %d, %v", n, err)
	}
}

func config(t *testing.T, dbURL string, extra ...string) *conf.Values {
	t.Helper()
	return testbridge.Config(t, dbURL, extra...)
}

func start(t *testing.T, v *conf.Values) *bridge.Daemon {
	t.Helper()
	return testbridge.Start(t, v)
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("X-Auth-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func waitStatus(t *testing.T, url string, want int, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, body := get(t, url, "")
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s = %d %s; want %d within %v", url, code, body, want, within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestReadyzFollowsTheDatabase(t *testing.T) {
	dbURL := testsvc.Postgres(t)
	proxy := testsvc.NewProxy(t, "127.0.0.1:5432")
	viaProxy := strings.Replace(dbURL, "127.0.0.1:5432", proxy.Addr(), 1)
	d := start(t, config(t, viaProxy, "database.connect_timeout=1s"))
	base := "http://" + d.API.Addr()

	waitStatus(t, base+"/readyz", http.StatusOK, 2*time.Minute)
	proxy.Cut()
	body := waitStatus(t, base+"/readyz", http.StatusServiceUnavailable, 10*time.Second)
	var p struct {
		Detail string `json:"detail"`
	}
	json.Unmarshal([]byte(body), &p)
	if p.Detail != "unreachable: database" {
		t.Errorf("detail = %q, want the database named alone", p.Detail)
	}
	if code, _ := get(t, base+"/healthz", ""); code != http.StatusOK {
		t.Errorf("healthz = %d while the database is away; it must stay 200", code)
	}
	proxy.Restore(t)
	waitStatus(t, base+"/readyz", http.StatusOK, 15*time.Second)
}

func TestEveryRouteIsDescribed(t *testing.T) {
	d := start(t, config(t, testsvc.Postgres(t)))
	if u := d.API.Undescribed(); len(u) > 0 {
		t.Errorf("routes missing from /v1/openapi.json: %v", u)
	}
	code, body := get(t, "http://"+d.API.Addr()+"/v1/openapi.json", "")
	var doc struct {
		OpenAPI string         `json:"openapi"`
		Paths   map[string]any `json:"paths"`
	}
	if err := json.Unmarshal([]byte(body), &doc); code != 200 || err != nil || doc.OpenAPI == "" {
		t.Fatalf("openapi.json: %d %v", code, err)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if doc.Paths[p] == nil {
			t.Errorf("document lacks %s", p)
		}
	}
}

func TestMetricsExposed(t *testing.T) {
	d := start(t, config(t, testsvc.Postgres(t)))
	code, body := get(t, "http://"+d.API.Addr()+"/metrics", "")
	if code != 200 || !strings.Contains(body, "vgpu_bridge_build_info") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("metrics = %d, lacking build info or Go metrics", code)
	}
}

func TestServeRefusesAnOldSchema(t *testing.T) {
	v := config(t, testsvc.Postgres(t), "database.auto_migrate=false")
	err := bridge.Run(context.Background(), v, nil, nil)
	if !errors.Is(err, bridge.ErrSchemaBehind) || !strings.Contains(err.Error(), "vgpu-bridge migrate up") {
		t.Fatalf("Run on an empty database = %v; want ErrSchemaBehind naming the command", err)
	}
}
