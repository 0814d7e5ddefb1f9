package controls_test

import (
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestControls runs the operator controls one after the other on one
// bridge and fleet: observe-only, pause and resume, GPU and host drains,
// a Nova compute service disabled and enabled, then the audit log and
// the profile catalog.
func TestControls(t *testing.T) {
	f := newFleet(t)
	f.start()
	a, b := f.hosts[0], f.hosts[1]
	f.startAgent(a)
	f.notifyCreates()

	t.Run("observe-only decides without acting", func(t *testing.T) {
		f.t = t
		c, err := f.admin.SetControls(f.ctx, apiclient.ControlsChange{ObserveOnly: ptr(true), Reason: "dry run of the new policy"})
		testsvc.Must(t, err, "observe-only on")
		if !c.ObserveOnly || c.Paused || !c.Changed || c.Actor != "ops" {
			t.Fatalf("controls after observe-only on: %+v", c)
		}
		if g := f.metric("vgpu_bridge_controls_observe_only"); g != 1 {
			t.Errorf("vgpu_bridge_controls_observe_only = %v, want 1", g)
		}
		id := f.request(a)
		r := f.final(id)
		if r.State != "rejected" || r.Code != "observe_only" || !strings.Contains(r.Reason, "would have: attach 1 × T4-4Q") {
			t.Errorf("request under observe-only: %s %s %q, want rejected observe_only saying it would attach", r.State, r.Code, r.Reason)
		}
		var cmds, decisions int
		testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM commands WHERE request_id = $1`, id).Scan(&cmds), "commands")
		testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM decisions WHERE request_id = $1`, id).Scan(&decisions), "decisions")
		if cmds != 0 || decisions != 1 {
			t.Errorf("observe-only: %d commands (want 0), %d decisions (want 1)", cmds, decisions)
		}
		if n := f.vgpuUnits(a.vm); n != 0 {
			t.Errorf("observe-only claimed %d VGPU in Placement", n)
		}
		_, err = f.admin.SetControls(f.ctx, apiclient.ControlsChange{ObserveOnly: ptr(false), Reason: "dry run done"})
		testsvc.Must(t, err, "observe-only off")
	})

	var firstGPU string // the GPU the paused request's vGPU lands on
	t.Run("pause holds a request, resume completes it", func(t *testing.T) {
		f.t = t
		// The X-OpenStack-Request-ID given goes into the audit row.
		rid := "req-5f1c0d6e-8a41-4c1e-9d55-3a7c2b9e0f11"
		st, body := f.call(http.MethodPost, "/v1/controls", map[string]any{"paused": true, "reason": "maintenance window CHG-1234"},
			"X-OpenStack-Request-ID", rid)
		if st != http.StatusOK {
			t.Fatalf("pause: %d %s", st, body)
		}
		var c apiclient.Controls
		testsvc.Must(t, json.Unmarshal(body, &c), "controls")
		if !c.Paused || c.PausedAt == nil || c.RequestID != rid {
			t.Fatalf("controls after pause: %s", body)
		}
		id := f.request(a)
		// Two inbox polls were held since the request was accepted: the
		// first started after its event was committed, and the second only
		// after the first was done, so a pipeline that did not hold would
		// have decided the request by then.
		held := f.metric(`vgpu_bridge_controls_held_total{part="pipeline"}`)
		f.waitFor(30*time.Second, "two held inbox polls", func() bool {
			return f.metric(`vgpu_bridge_controls_held_total{part="pipeline"}`) >= held+2
		})
		r, err := f.admin.Request(f.ctx, id)
		testsvc.Must(t, err, "request")
		var waiting int
		testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM events WHERE request_id = $1 AND processed_at IS NULL`, id).Scan(&waiting), "inbox")
		if r.State != "accepted" || waiting != 1 {
			t.Fatalf("paused: request %s (want accepted), %d events waiting in the inbox (want 1)", r.State, waiting)
		}
		if g := f.metric("vgpu_bridge_controls_paused"); g != 1 {
			t.Errorf("vgpu_bridge_controls_paused = %v, want 1", g)
		}
		// /readyz is not affected by the pause.
		if _, err := f.admin.Ready(f.ctx); err != nil {
			t.Errorf("readyz while paused: %v", err)
		}
		_, err = f.admin.SetControls(f.ctx, apiclient.ControlsChange{Paused: ptr(false), Reason: "window over"})
		testsvc.Must(t, err, "resume")
		r = f.final(id)
		if r.State != "succeeded" {
			t.Fatalf("after resume: %s %s %q, want succeeded", r.State, r.Code, r.Reason)
		}
		testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT provider_uuid::text FROM vgpu_attachments WHERE request_id = $1`, id).Scan(&firstGPU), "attachment")
		// The pipeline's audit rows of the request carry its request id.
		var tagged int
		testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM audit_log WHERE request_id = $1 AND global_request_id = 'req-' || $1`, id).Scan(&tagged), "audit")
		if tagged == 0 {
			t.Errorf("no audit row of request %s carries global_request_id req-%s", id, id)
		}
		// Placement logged the claim under the same global request id.
		f.waitFor(10*time.Second, "Placement's log shows the claim under req-"+id, func() bool {
			b, err := os.ReadFile(placementLog)
			if err != nil {
				t.Fatalf("read Placement's log (make services writes it): %v", err)
			}
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "[req-"+id+" ") && strings.Contains(line, "/allocations/"+a.vm) {
					return true
				}
			}
			return false
		})
	})

	t.Run("a drained GPU gets no new placement", func(t *testing.T) {
		f.t = t
		d, err := f.admin.SetDrain(f.ctx, apiclient.DrainGPU, firstGPU, "fan failure, ticket 4711", true)
		testsvc.Must(t, err, "drain GPU")
		if !d.Drained || !d.Changed || d.DrainedBy != "ops" {
			t.Fatalf("drain GPU: %s", d.Raw)
		}
		// Idempotent: the same drain again changes nothing.
		d, err = f.admin.SetDrain(f.ctx, apiclient.DrainGPU, firstGPU, "fan failure, ticket 4711", true)
		testsvc.Must(t, err, "drain GPU again")
		if d.Changed {
			t.Errorf("draining a drained GPU changed it")
		}
		gl, err := f.admin.GPUs(f.ctx, apiclient.GPUFilter{})
		testsvc.Must(t, err, "gpus")
		i := slices.IndexFunc(gl.GPUs, func(g apiclient.GPU) bool { return g.ProviderUUID == firstGPU })
		if i < 0 || !gl.GPUs[i].Drained || gl.GPUs[i].DrainReason != "fan failure, ticket 4711" {
			t.Errorf("GET /v1/gpus does not show the drain: %s", gl.Raw)
		}
		// Pack would fill the used GPU first; drained, the other one gets it.
		id := f.request(a)
		r := f.final(id)
		if r.State != "succeeded" {
			t.Fatalf("request with a GPU drained: %s %s %q", r.State, r.Code, r.Reason)
		}
		var gpu string
		testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT provider_uuid::text FROM vgpu_attachments WHERE request_id = $1`, id).Scan(&gpu), "attachment")
		if gpu == firstGPU {
			t.Errorf("the vGPU landed on the drained GPU %s", gpu)
		}
		// The existing vGPU on the drained GPU is untouched.
		var attached int
		testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM vgpu_attachments WHERE provider_uuid = $1 AND state = 'attached'`, firstGPU).Scan(&attached), "attached")
		if attached != 1 {
			t.Errorf("%d attached vGPUs left on the drained GPU, want 1", attached)
		}
		_, err = f.admin.SetDrain(f.ctx, apiclient.DrainGPU, firstGPU, "fan replaced", false)
		testsvc.Must(t, err, "undrain GPU")
	})

	t.Run("a drained host gets no new placement", func(t *testing.T) {
		f.t = t
		d, err := f.admin.SetDrain(f.ctx, apiclient.DrainHost, a.name, "kernel upgrade", true)
		testsvc.Must(t, err, "drain host")
		if !d.Drained || d.Node != a.node {
			t.Fatalf("drain host: %s", d.Raw)
		}
		h, err := f.admin.Host(f.ctx, a.node)
		testsvc.Must(t, err, "host")
		if !h.Drained || h.DrainReason != "kernel upgrade" {
			t.Errorf("GET /v1/hosts/%s does not show the drain: %s", a.node, h.Raw)
		}
		if n := dryRun(t, f, a.node); n != 0 {
			t.Errorf("dry run on the drained host: %d candidates, want 0", n)
		}
		r := f.final(f.request(a))
		if r.State != "failed" || r.Code != "no_capacity" {
			t.Errorf("request on a drained host: %s %s %q, want failed no_capacity", r.State, r.Code, r.Reason)
		}
		_, err = f.admin.SetDrain(f.ctx, apiclient.DrainHost, a.node, "", false) // by node name
		testsvc.Must(t, err, "undrain host")
		if n := dryRun(t, f, a.node); n == 0 {
			t.Errorf("dry run on the undrained host: no candidates")
		}
		if st, body := f.call(http.MethodPost, "/v1/hosts/no-such-host/drain", map[string]string{"reason": "x"}); st != http.StatusNotFound {
			t.Errorf("drain of an unknown host: %d %s, want 404", st, body)
		}
		if st, body := f.call(http.MethodPost, "/v1/hosts/"+a.name+"/drain", map[string]string{}); st != http.StatusUnprocessableEntity {
			t.Errorf("drain without a reason: %d %s, want 422", st, body)
		}
	})

	t.Run("a Nova compute service disabled excludes its host", func(t *testing.T) {
		f.t = t
		if n := dryRun(t, f, b.node); n == 0 {
			t.Fatalf("dry run on %s before the service is disabled: no candidates", b.name)
		}
		f.publish(serviceUpdate(t, b, true, "hardware check"))
		f.waitFor(30*time.Second, "GET /v1/hosts shows "+b.name+" disabled", func() bool {
			h, err := f.admin.Host(f.ctx, b.node)
			return err == nil && h.Disabled && h.DisabledReason == "hardware check"
		})
		// Every replica refreshes its exclusions on the change's NOTIFY.
		f.waitFor(30*time.Second, "no candidates on the disabled host", func() bool { return dryRun(t, f, b.node) == 0 })
		f.publish(serviceUpdate(t, b, false, ""))
		f.waitFor(30*time.Second, "candidates on the enabled host again", func() bool { return dryRun(t, f, b.node) > 0 })
	})

	t.Run("the audit log lists the changes", func(t *testing.T) {
		f.t = t
		al, err := f.admin.Audit(f.ctx, apiclient.AuditFilter{Actor: "ops", Since: time.Now().Add(-time.Hour)})
		testsvc.Must(t, err, "audit")
		var actions []string
		for _, r := range al.Records {
			actions = append(actions, r.Action+" "+r.ObjectType+"/"+r.ObjectID)
		}
		for _, want := range []string{"controls.set controls/global", "gpu.drain gpu/" + firstGPU, "gpu.undrain gpu/" + firstGPU,
			"host.drain host/" + a.name, "host.undrain host/" + a.name} {
			if !slices.Contains(actions, want) {
				t.Errorf("audit lacks %q; has %q", want, actions)
			}
		}
		// Filters and pages.
		pg, err := f.admin.Audit(f.ctx, apiclient.AuditFilter{Action: "host.*", Object: "host/" + a.name, Limit: 1})
		testsvc.Must(t, err, "audit page")
		if len(pg.Records) != 1 || pg.Records[0].Action != "host.drain" || pg.NextCursor == "" {
			t.Fatalf("first page of host.*: %s", pg.Raw)
		}
		pg2, err := f.admin.Audit(f.ctx, apiclient.AuditFilter{Action: "host.*", Object: "host/" + a.name, Limit: 1, Cursor: pg.NextCursor})
		testsvc.Must(t, err, "audit page 2")
		if len(pg2.Records) != 1 || pg2.Records[0].Action != "host.undrain" {
			t.Errorf("second page of host.*: %s", pg2.Raw)
		}
		byID, err := f.admin.Audit(f.ctx, apiclient.AuditFilter{RequestID: "req-5f1c0d6e-8a41-4c1e-9d55-3a7c2b9e0f11"})
		testsvc.Must(t, err, "audit by request id")
		if len(byID.Records) != 1 || byID.Records[0].Action != "controls.set" || !strings.Contains(string(byID.Records[0].Detail), "CHG-1234") {
			t.Errorf("audit of the pause's request id: %s", byID.Raw)
		}
		if st, body := f.call(http.MethodGet, "/v1/audit?since=yesterday", nil); st != http.StatusUnprocessableEntity {
			t.Errorf("bad since: %d %s", st, body)
		}
	})

	t.Run("profiles lists the catalog with the fleet's counts", func(t *testing.T) {
		f.t = t
		pl, err := f.admin.Profiles(f.ctx, "Q", "T4")
		testsvc.Must(t, err, "profiles")
		i := slices.IndexFunc(pl.Profiles, func(p apiclient.Profile) bool { return p.Name == "T4-4Q" })
		if i < 0 {
			t.Fatalf("no T4-4Q in %s", pl.Raw)
		}
		p := pl.Profiles[i]
		if p.TypeID != "nvidia-232" || p.Trait != t4q4Trait || p.FramebufferMiB != 4096 || p.MaxInstances != 4 || p.Series != "Q" {
			t.Errorf("T4-4Q: %+v", p)
		}
		// This test's four GPUs are T4-4Q; other tests' fleets may add more.
		if p.GPUs < 4 || p.Used < 2 || p.Capacity < 16 {
			t.Errorf("T4-4Q counts: %d GPUs, %d used of %d; want at least 4, 2 of 16", p.GPUs, p.Used, p.Capacity)
		}
		for _, x := range pl.Profiles {
			if x.Series != "Q" || x.GPU != "T4" {
				t.Errorf("filter series=Q gpu=T4 let %s (%s %s) through", x.Name, x.Series, x.GPU)
			}
		}
	})

	t.Run("reader may read, not change", func(t *testing.T) {
		f.t = t
		reader := apiclient.New(apiclient.Config{URL: f.url, Token: "test-reader-token"})
		if _, err := reader.Controls(f.ctx); err != nil {
			t.Errorf("reader GET /v1/controls: %v", err)
		}
		_, err := reader.SetControls(f.ctx, apiclient.ControlsChange{Paused: ptr(true), Reason: "x"})
		if apiclient.StatusCode(err) != http.StatusForbidden {
			t.Errorf("reader pause: %v, want 403", err)
		}
	})
}

// placementLog is where tests/services.sh has Placement log (oslo's
// context format: "[<global_request_id> <request_id> …]").
const placementLog = "/var/log/vgpu-bridge-test/placement.log"

// dryRun counts the candidates of a T4-4Q dry run on a host.
func dryRun(t *testing.T, f *fleet, host string) int {
	t.Helper()
	st, body := f.call(http.MethodPost, "/v1/placements/dry-run", map[string]any{"profile": "T4-4Q", "host": host})
	if st != http.StatusOK {
		t.Fatalf("dry run: %d %s", st, body)
	}
	var out struct {
		Candidates []json.RawMessage `json:"candidates"`
	}
	testsvc.Must(t, json.Unmarshal(body, &out), "dry run answer")
	return len(out.Candidates)
}

func ptr[T any](v T) *T { return &v }
