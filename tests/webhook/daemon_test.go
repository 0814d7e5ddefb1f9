package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestDaemonSeparateListener runs the whole bridge with [webhooks] listen
// apart from [api] listen: webhooks and their status reads are served on
// the second listener, which documents its routes.
func TestDaemonSeparateListener(t *testing.T) {
	dir := t.TempDir()
	sf := writeSecret(t, dir, "batch.secret", string(secretNew))
	tf := filepath.Join(dir, "tokens")
	os.WriteFile(tf, []byte(adminToken+" admin ops\n"), 0o600)
	ini := filepath.Join(dir, "bridge.conf")
	os.WriteFile(ini, []byte("[webhook_source:batch]\nauth = hmac\nsecret_files = "+sf+"\n"), 0o600)
	whAddr := fmt.Sprintf("127.0.0.1:%d", testsvc.FreePort(t))
	v, err := bridge.LoadConfig(conf.Source{File: ini, Overrides: append(testkeys.For(t).Bridge(),
		"DEFAULT.transport_url="+testsvc.TransportURL(t),
		"database.connection="+testsvc.Postgres(t),
		"database.auto_migrate=true",
		"api.listen=127.0.0.1:0",
		"api.token_file="+tf,
		"webhooks.listen="+whAddr,
		"webhooks.read_header_timeout=1s",
		// Other features' files, from the repository.
		"policy.rules_file=../../etc/vgpu-bridge/rules.yaml",
		"policy.profiles_file=../../etc/vgpu-bridge/profiles.yaml",
		"policy.driver_compat_file=../../etc/vgpu-bridge/driver-compat.yaml",
		"placement.endpoint_override="+testsvc.PlacementURL(t),
		"placement.token_file="+tf,
	)})
	testsvc.Must(t, err, "config")
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *bridge.Daemon, 1)
	done := make(chan error, 1)
	go func() { done <- bridge.Run(ctx, v, nil, func(d *bridge.Daemon) { started <- d }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	var d *bridge.Daemon
	select {
	case d = <-started:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("bridge did not start")
	}
	e := &env{t: t, url: "http://" + whAddr, pool: d.Pool}
	// The second listener starts as a component; wait for it.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(e.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("webhook listener: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	id := e.want202(e.postHub("batch", secretNew, nativeBody(""), "d-1"))
	path := "/v1/requests/" + id.String()
	if a := e.do(http.MethodGet, path, nil, map[string]string{"X-Hub-Signature-256": hubSign(secretNew, []byte("GET "+path))}); a.status != 200 {
		t.Errorf("status read on the webhook listener: %d %s", a.status, a.body)
	}
	// The operator API serves the request routes too, not the webhook.
	api := &env{t: t, url: "http://" + d.API.Addr()}
	if a := api.do(http.MethodGet, path, nil, map[string]string{"X-Auth-Token": adminToken}); a.status != 200 {
		t.Errorf("operator read: %d", a.status)
	}
	if a := api.postHub("batch", secretNew, nativeBody(""), "d-2"); a.status != http.StatusNotFound && a.status != http.StatusMethodNotAllowed {
		t.Errorf("webhook on the API listener: %d", a.status)
	}
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	a := e.do(http.MethodGet, "/v1/openapi.json", nil, nil)
	json.Unmarshal(a.body, &doc)
	if doc.Paths["/v1/webhooks/{source}"]["post"] == nil || doc.Paths["/v1/requests/{id}"]["get"] == nil {
		t.Errorf("webhook listener's document lacks its routes")
	}
	if u := d.API.Undescribed(); len(u) > 0 {
		t.Errorf("undescribed API routes: %v", u)
	}
}
