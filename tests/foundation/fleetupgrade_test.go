package foundation

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestFleetUpgradeAPI: POST /v1/fleet/upgrades on a running bridge with
// the shipped driver-compat.yaml: a dry run lists the guests the target
// branch cannot serve, a run to that branch is refused (409) before
// anything changes, and bad bodies and unknown hosts are refused.
func TestFleetUpgradeAPI(t *testing.T) {
	dbURL := testsvc.Postgres(t)
	d := start(t, config(t, dbURL))
	pool := testsvc.Pool(t, dbURL)
	base := "http://" + d.API.Addr()
	for _, h := range []string{"fu-a", "fu-b"} {
		rep := `{"v":1,"host":"` + h + `","node":"` + h + `","agent_version":"t","driver_version":"550.54.16","hypervisor":"KVM",
			"sent_at":"2026-12-01T00:00:00Z","seq":1,"gpus":[{"pci":"0000:3b:00.0","health":"ok","types":[],
			"active":[{"mdev_uuid":"4b20d080-1b54-4048-85b3-a6a62d165c01","type_id":"nvidia-232","owner":"nova",
			"instance_uuid":"8f0d4b5e-3c1a-4a59-9d43-6a2b7c1e0f11","guest_driver":"550.54.15"}]}]}`
		_, err := pool.Exec(context.Background(), `INSERT INTO hosts (name, node, driver_version, last_report_at, report)
			VALUES ($1, $1, '550.54.16', now(), $2)`, h, rep)
		testsvc.Must(t, err, "host")
	}
	post := func(body string) (int, map[string]any) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/fleet/upgrades", bytes.NewBufferString(body))
		req.Header.Set("X-Auth-Token", testbridge.AdminToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		testsvc.Must(t, err, "post")
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return resp.StatusCode, m
	}
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
		refusals   int
	}{
		{"dry run lists the refused guests", `{"branch":"580","hosts":["fu-a","fu-b"],"dry_run":true}`, 200, "", 2},
		{"dry run of a branch that serves them", `{"branch":"570","hosts":["fu-a","fu-b"],"dry_run":true}`, 200, "", 0},
		{"run refused", `{"branch":"580","hosts":["fu-a","fu-b"]}`, 409, "driver_incompatible", 0},
		{"unknown host", `{"branch":"570","hosts":["fu-a","nope"],"dry_run":true}`, 404, "host_not_found", 0},
		{"bad branch", `{"branch":"570;reboot","hosts":["fu-a"]}`, 422, "invalid_params", 0},
		{"max unavailable above the hosts", `{"branch":"570","hosts":["fu-a"],"max_unavailable":2}`, 422, "invalid_params", 0},
		{"host twice", `{"branch":"570","hosts":["fu-a","fu-a"]}`, 422, "invalid_params", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, m := post(tc.body)
			if status != tc.status || (tc.code != "" && m["code"] != tc.code) {
				t.Fatalf("%d %v, want %d %s", status, m, tc.status, tc.code)
			}
			if status == 200 {
				refs, _ := m["refusals"].([]any)
				hosts, _ := m["hosts"].([]any)
				if len(refs) != tc.refusals || len(hosts) != 2 {
					t.Errorf("plan %v: want %d refusals, 2 hosts", m, tc.refusals)
				}
			}
		})
	}
	var n int
	testsvc.Must(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM fleet_upgrades`).Scan(&n), "count")
	var drained int
	testsvc.Must(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM hosts WHERE drained`).Scan(&drained), "drained")
	if n != 0 || drained != 0 {
		t.Errorf("%d runs recorded, %d hosts drained; want nothing changed", n, drained)
	}
	if code, _ := get(t, base+"/v1/fleet/upgrades/00000000-0000-4000-8000-000000000000", testbridge.AdminToken); code != 404 {
		t.Errorf("GET unknown run: %d", code)
	}
}
