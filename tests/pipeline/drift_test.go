// The drift tests run the drift reconciler against the real Postgres,
// RabbitMQ and Placement, with the bridge's pipeline and dispatcher and an
// in-process vgpu-agent on a fake host: each kind of drift is made for
// real (an mdev the bridge never asked for, a claim whose instance was
// deleted, a vGPU detached or unclaimed behind the bridge's back, a
// consumer the bridge does not know), then found and, where safe,
// repaired.

package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/drift"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// driftPolicy has no rule that releases on instance.delete.end, so a
// deleted instance's claim stays behind as a stale claim.
var driftPolicy = testsvc.DirectPolicy(testsvc.RuleReleaseOnRequest)

type finding struct {
	id                                 int64
	kind, host, instance, mdev, detail string
	repairable, repaired               bool
	repairRequest                      string
	resolved                           bool
}

func (w *world) findings() []finding {
	rows, err := w.pool.Query(w.ctx, `SELECT id, kind, coalesce(host,''), coalesce(instance_uuid::text,''), coalesce(mdev_uuid::text,''), detail,
		repairable, repaired, coalesce(repair_request_id::text,''), resolved_at IS NOT NULL FROM drift_findings ORDER BY id`)
	testsvc.Must(w.t, err, "findings")
	defer rows.Close()
	var out []finding
	for rows.Next() {
		var f finding
		testsvc.Must(w.t, rows.Scan(&f.id, &f.kind, &f.host, &f.instance, &f.mdev, &f.detail, &f.repairable, &f.repaired, &f.repairRequest, &f.resolved), "scan finding")
		out = append(out, f)
	}
	return out
}

// find returns the one finding of kind about instance and/or mdev.
func (w *world) find(kind drift.Kind, instance, mdev string) (finding, bool) {
	var hit []finding
	for _, f := range w.findings() {
		if f.kind == string(kind) && (instance == "" || f.instance == instance) && (mdev == "" || f.mdev == mdev) {
			hit = append(hit, f)
		}
	}
	if len(hit) > 1 {
		w.t.Fatalf("%d findings %s for %s %s: %+v", len(hit), kind, instance, mdev, hit)
	}
	if len(hit) == 0 {
		return finding{}, false
	}
	return hit[0], true
}

func (w *world) mustFind(kind drift.Kind, instance, mdev string) finding {
	w.t.Helper()
	f, ok := w.find(kind, instance, mdev)
	if !ok {
		w.t.Fatalf("no %s finding for instance %q mdev %q; findings: %+v", kind, instance, mdev, w.findings())
	}
	return f
}

// rawCommand sends an agent command outside any request, through the
// outbox, as another tool (or a lost record) might have: the bridge's
// vGPU records know nothing of it. It waits for the agent's answer.
func (w *world) rawCommand(kind protocol.Kind, instance string, params any) {
	w.t.Helper()
	now := time.Now()
	c, err := pipeline.NewCommand(kind, w.host, "", instance, params, now, now.Add(time.Minute))
	testsvc.Must(w.t, err, "command")
	body, _ := json.Marshal(c)
	var inst *string
	if instance != "" {
		inst = &instance
	}
	_, err = w.pool.Exec(w.ctx, `INSERT INTO commands (id, host, kind, body, expires_at, instance_uuid) VALUES ($1, $2, $3, $4, $5, $6::uuid)`,
		c.ID, c.Host, string(c.Kind), body, c.ExpiresAt, inst)
	testsvc.Must(w.t, err, "queue command")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var st *string
		testsvc.Must(w.t, w.pool.QueryRow(w.ctx, `SELECT result_status FROM commands WHERE id = $1`, c.ID).Scan(&st), "command state")
		if st != nil {
			if *st != string(protocol.Succeeded) {
				w.t.Fatalf("%s: %s", kind, *st)
			}
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s was not answered", kind)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (w *world) attach(inst string) attachmentRow {
	w.t.Helper()
	id := w.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q"})
	if r := w.wait(id, 60*time.Second); r.State != requests.Succeeded {
		w.t.Fatalf("attach %s: %s (%s: %s)", inst, r.State, r.Code, r.Reason)
	}
	atts := w.attachments(inst)
	if len(atts) != 1 {
		w.t.Fatalf("attachments of %s: %+v", inst, atts)
	}
	w.reportedActive(atts[0].id, inst, true, 30*time.Second)
	return atts[0]
}

func runOnce(t *testing.T, rec *drift.Reconciler) drift.RunResult {
	t.Helper()
	res, err := rec.RunOnce(context.Background())
	testsvc.Must(t, err, "drift run")
	return res
}

func gauge(t *testing.T, reg *prometheus.Registry, name, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	testsvc.Must(t, err, "gather")
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					if m.GetGauge() != nil {
						return m.GetGauge().GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// TestDrift makes each kind of drift for real and asserts that the
// reconciler finds it and repairs what is safe.
func TestDrift(t *testing.T) {
	w := newWorldWith(t, driftPolicy)
	// Nova's own vGPU instance: its flavor carries the unit it holds.
	_, err := w.pool.Exec(w.ctx, `UPDATE instances SET vgpus = 1 WHERE uuid = $1`, w.domains[0].UUID)
	testsvc.Must(t, err, "flavor units")
	br := w.startBridge(replicaOpts{name: "r1"}) // its queues exist before the agent's first report
	w.startAgent()
	reg := prometheus.NewRegistry()
	rec, err := drift.New(drift.Config{Replica: "d1", Interval: time.Hour, Repair: true, RepairGrace: 0, StaleReportAge: 5 * time.Minute},
		drift.Deps{Pool: w.pool, Placement: newOutsideTx(t, w.txw, br.svc), Log: logger(), Registry: reg})
	testsvc.Must(t, err, "reconciler")
	// The agent's first report is in.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM hosts WHERE name = $1 AND report IS NOT NULL`, w.host).Scan(&n), "hosts")
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no report from the agent")
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Everything in agreement: nothing to find.
	if res := runOnce(t, rec); res.Findings != 0 || len(res.SkippedHosts) != 0 {
		t.Fatalf("first run: %+v; findings %+v", res, w.findings())
	}

	// orphan_mdev: an mdev the agent made on GPU B that no request of the
	// bridge asked for → found, removed with remove_mdev, resolved.
	orphan := uuid.NewString()
	w.rawCommand(protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: orphan, ParentPCI: gpuB, TypeID: t4q})
	if !w.mdevExists(orphan) {
		t.Fatal("create_mdev made no mdev")
	}
	w.reportedActive(orphan, "", true, 30*time.Second)
	res := runOnce(t, rec)
	f := w.mustFind(drift.OrphanMdev, "", orphan)
	if !f.repairable || f.host != w.host || f.repairRequest == "" || res.Repairs != 1 || res.New != 1 {
		t.Fatalf("orphan finding %+v, run %+v; want repairable, on %s, a repair request", f, res, w.host)
	}
	if got := gauge(t, reg, "vgpu_bridge_drift_findings", "orphan_mdev"); got != 1 {
		t.Errorf("vgpu_bridge_drift_findings{kind=orphan_mdev} = %v, want 1", got)
	}
	repair := w.wait(mustUUID(t, f.repairRequest), 60*time.Second)
	if repair.State != requests.Succeeded || repair.Source != drift.Source {
		t.Fatalf("repair request: %+v", repair)
	}
	var kinds string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT string_agg(kind || ':' || result_status, ',') FROM commands WHERE request_id = $1`, f.repairRequest).
		Scan(&kinds), "repair commands")
	if kinds != "remove_mdev:succeeded" {
		t.Errorf("repair commands = %s", kinds)
	}
	if w.mdevExists(orphan) {
		t.Errorf("orphan mdev %s still exists after the repair", orphan)
	}
	w.reportedActive(orphan, "", false, 30*time.Second)
	res = runOnce(t, rec)
	if f := w.mustFind(drift.OrphanMdev, "", orphan); !f.resolved || !f.repaired {
		t.Errorf("after the repair: %+v, want resolved and repaired", f)
	}
	if res.Resolved != 1 || res.Findings != 0 {
		t.Errorf("run after the repair: %+v", res)
	}

	// missing_device and unclaimed_device: a vGPU the bridge attached is
	// detached behind its back, and Nova rewrites the instance's
	// allocations without the bridge's VGPU (as a move does). Both are
	// reported, neither repaired.
	inst3 := w.domains[3].UUID
	a3 := w.attach(inst3)
	w.rawCommand(protocol.DetachVGPU, inst3, protocol.AttachParams{MdevUUID: a3.id, Mode: protocol.ModeLive})
	w.reportedActive(a3.id, "", true, 30*time.Second) // exists, in no domain
	testsvc.Must(t, allocations.Update(w.ctx, w.sc, inst3, allocations.UpdateOpts{
		Allocations: map[string]allocations.ProviderAllocationsOpts{w.root: {Resources: map[string]int{"VCPU": 2, "MEMORY_MB": 2048}}},
		ProjectID:   w.project, UserID: w.user, ConsumerType: "INSTANCE", ConsumerGeneration: w.consumerGeneration(inst3)}).ExtractErr(), "rewrite allocations")
	runOnce(t, rec)
	md := w.mustFind(drift.MissingDevice, inst3, a3.id)
	if md.repairable || !strings.Contains(md.detail, "no domain") {
		t.Errorf("missing_device: %+v", md)
	}
	uc := w.mustFind(drift.UnclaimedDevice, inst3, "")
	if uc.repairable || !strings.Contains(uc.detail, "0 unit(s) claimed") {
		t.Errorf("unclaimed_device: %+v", uc)
	}

	// unknown_instance: a Placement consumer the bridge never heard of
	// holds a vGPU on GPU B.
	stranger := uuid.NewString()
	w.created = append(w.created, stranger)
	testsvc.Must(t, allocations.Update(w.ctx, w.sc, stranger, allocations.UpdateOpts{
		Allocations: map[string]allocations.ProviderAllocationsOpts{w.gpus[gpuB]: {Resources: map[string]int{"VGPU": 1}}},
		ProjectID:   w.project, UserID: w.user, ConsumerType: "INSTANCE"}).ExtractErr(), "stranger allocation")
	runOnce(t, rec)
	if u := w.mustFind(drift.UnknownInstance, stranger, ""); u.repairable || !strings.Contains(u.detail, "no record") {
		t.Errorf("unknown_instance: %+v", u)
	}
	if n := vgpuUnits(w.allocations(stranger)); n != 1 {
		t.Errorf("the stranger's claim was touched: %d units", n)
	}

	// Consumers that hold a vGPU for an instance while it moves are no
	// unknown instances: a Nova migration consumer (consumer type
	// MIGRATION, Nova 2023.1+), the bridge's reservation consumer, and one
	// of another type (older Nova writes none) that a running maintenance
	// operation recorded as its Nova migration.
	migration, reservation, recorded := uuid.NewString(), uuid.NewString(), uuid.NewString()
	w.created = append(w.created, migration, reservation, recorded)
	for c, typ := range map[string]string{migration: drift.ConsumerTypeMigration, reservation: placement.ReservationConsumerType, recorded: "INSTANCE"} {
		testsvc.Must(t, allocations.Update(w.ctx, w.sc, c, allocations.UpdateOpts{
			Allocations: map[string]allocations.ProviderAllocationsOpts{w.gpus[gpuB]: {Resources: map[string]int{"VGPU": 1}}},
			ProjectID:   w.project, UserID: w.user, ConsumerType: typ}).ExtractErr(), "moving consumer "+c)
	}
	opID := uuid.New()
	_, err = w.pool.Exec(w.ctx, `INSERT INTO maintenance_operations (id, host, options, created_by) VALUES ($1, $2, '{}', 'test')`, opID, w.host)
	testsvc.Must(t, err, "maintenance operation")
	_, err = w.pool.Exec(w.ctx, `INSERT INTO maintenance_vms (operation_id, instance_uuid, seq, action, state, migration_uuid)
		VALUES ($1, $2, 0, 'move_direct', 'migrating', $3)`, opID, uuid.New(), recorded)
	testsvc.Must(t, err, "maintenance VM")
	runOnce(t, rec)
	for _, c := range []string{migration, reservation, recorded} {
		if f, ok := w.find(drift.UnknownInstance, c, ""); ok {
			t.Errorf("a consumer of a move is reported: %+v", f)
		}
	}
	for _, c := range []string{migration, reservation, recorded} {
		testsvc.Must(t, allocations.Delete(w.ctx, w.sc, c).ExtractErr(), "delete moving consumer")
	}
	_, err = w.pool.Exec(w.ctx, `DELETE FROM maintenance_operations WHERE id = $1`, opID)
	testsvc.Must(t, err, "delete maintenance operation")

	// stale_claim: an instance with a bridge vGPU is deleted (what the
	// ingest records for instance.delete.end) and no rule released it →
	// the bridge's claim is released and its record closed; the domain
	// still holding the mdev is then reported, never touched.
	inst4 := w.domains[4].UUID
	a4 := w.attach(inst4)
	_, err = w.pool.Exec(w.ctx, `UPDATE instances SET deleted_at = now(), vm_state = 'deleted' WHERE uuid = $1`, inst4)
	testsvc.Must(t, err, "delete instance")
	res = runOnce(t, rec)
	sc := w.mustFind(drift.StaleClaim, inst4, "")
	if !sc.repairable || !sc.repaired {
		t.Fatalf("stale_claim: %+v (run %+v)", sc, res)
	}
	al := w.allocations(inst4)
	if n := vgpuUnits(al); n != 0 || al[w.root]["VCPU"] != 2 {
		t.Errorf("allocations of the deleted instance after the repair: %v, want VCPU/MEMORY_MB only", al)
	}
	if st := w.attachments(inst4)[0].state; st != flow.AttReleased {
		t.Errorf("attachment of the deleted instance: %s, want released", st)
	}
	runOnce(t, rec)
	if f := w.mustFind(drift.StaleClaim, inst4, ""); !f.resolved {
		t.Errorf("stale claim not resolved after its repair: %+v", f)
	}
	om := w.mustFind(drift.OrphanMdev, inst4, a4.id)
	if om.repairable || om.repairRequest != "" {
		t.Errorf("an mdev inside a domain must not be repaired: %+v", om)
	}
	w.mustFind(drift.UnknownInstance, inst4, a4.id)
	if !w.mdevExists(a4.id) {
		t.Errorf("mdev %s in a domain was removed", a4.id)
	}

	// Every new finding and repair is audited.
	var found, repairs int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FILTER (WHERE action = 'drift_found'), count(*) FILTER (WHERE action = 'drift_repair')
		FROM audit_log WHERE object_type = 'drift_finding'`).Scan(&found, &repairs), "audit")
	if found != len(w.findings()) || repairs != 2 {
		t.Errorf("audit: %d drift_found for %d findings, %d drift_repair (want 2)", found, len(w.findings()), repairs)
	}

	// Repair off: found, not repaired.
	off, err := drift.New(drift.Config{Replica: "d2", Interval: time.Hour, RepairGrace: 0},
		drift.Deps{Pool: w.pool, Placement: newOutsideTx(t, w.txw, br.svc), Log: logger()})
	testsvc.Must(t, err, "reconciler")
	orphan2 := uuid.NewString()
	w.rawCommand(protocol.CreateMdev, "", protocol.MdevParams{MdevUUID: orphan2, ParentPCI: gpuB, TypeID: t4q})
	w.reportedActive(orphan2, "", true, 30*time.Second)
	if res := runOnce(t, off); res.Repairs != 0 {
		t.Errorf("repairs with repair off: %+v", res)
	}
	if f := w.mustFind(drift.OrphanMdev, "", orphan2); f.repaired || f.repairRequest != "" || !w.mdevExists(orphan2) {
		t.Errorf("repair off, yet: %+v", f)
	}
	// Repair on but held (operators paused the bridge): found, not repaired.
	held, err := drift.New(drift.Config{Replica: "d3", Interval: time.Hour, Repair: true, RepairGrace: 0},
		drift.Deps{Pool: w.pool, Placement: newOutsideTx(t, w.txw, br.svc), Log: logger(), Hold: func(context.Context) bool { return true }})
	testsvc.Must(t, err, "reconciler")
	if res := runOnce(t, held); res.Repairs != 0 {
		t.Errorf("repairs while held: %+v", res)
	}
	if f := w.mustFind(drift.OrphanMdev, "", orphan2); f.repaired || f.repairRequest != "" {
		t.Errorf("held, yet: %+v", f)
	}

	// GET /v1/drift answers what the table holds.
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: api.NoAuth{}})
	rec.Register(srv)
	if u := srv.Undescribed(); len(u) != 0 {
		t.Errorf("undescribed routes: %v", u)
	}
	get := func(q string) (int, drift.Answer, string) {
		r := httptest.NewRecorder()
		srv.Echo().ServeHTTP(r, httptest.NewRequest(http.MethodGet, "/v1/drift"+q, nil))
		var a drift.Answer
		_ = json.Unmarshal(r.Body.Bytes(), &a)
		return r.Code, a, r.Body.String()
	}
	var open, all int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FILTER (WHERE resolved_at IS NULL), count(*) FROM drift_findings`).Scan(&open, &all), "count")
	if code, a, body := get(""); code != http.StatusOK || len(a.Findings) != open || a.LastRun == nil || !a.Repair {
		t.Errorf("GET /v1/drift: %d, %d findings (want %d open): %s", code, len(a.Findings), open, body)
	}
	if _, a, _ := get("?state=all"); len(a.Findings) != all {
		t.Errorf("state=all: %d findings, want %d", len(a.Findings), all)
	}
	if _, a, _ := get("?kind=stale_claim&state=resolved"); len(a.Findings) != 1 || !a.Findings[0].Repaired {
		t.Errorf("resolved stale claims: %+v", a.Findings)
	}
	if code, _, body := get("?kind=bogus&limit=0"); code != http.StatusUnprocessableEntity || !strings.Contains(body, `"name":"kind"`) || !strings.Contains(body, `"name":"limit"`) {
		t.Errorf("bad query: %d %s", code, body)
	}
}

// TestOneReplicaRuns: while another replica holds the reconciler's lock,
// a run answers ErrBusy and writes nothing.
func TestOneReplicaRuns(t *testing.T) {
	dbURL := testsvc.MigratedPostgres(t)
	pool := testsvc.Pool(t, dbURL)
	rec, err := drift.New(drift.Config{Replica: "d1"}, drift.Deps{Pool: pool, Placement: nopPlacement{}})
	testsvc.Must(t, err, "reconciler")
	conn, err := pool.Acquire(context.Background())
	testsvc.Must(t, err, "acquire")
	defer conn.Release()
	_, err = conn.Exec(context.Background(), `SELECT pg_advisory_lock(hashtextextended('vgpu-drift-reconciler', 0))`)
	testsvc.Must(t, err, "lock")
	if _, err := rec.RunOnce(context.Background()); !errors.Is(err, drift.ErrBusy) {
		t.Fatalf("run while locked: %v, want ErrBusy", err)
	}
	_, err = conn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtextextended('vgpu-drift-reconciler', 0))`)
	testsvc.Must(t, err, "unlock")
	res, err := rec.RunOnce(context.Background())
	testsvc.Must(t, err, "run")
	var runs int
	testsvc.Must(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM drift_runs`).Scan(&runs), "runs")
	if runs != 1 || res.ID == 0 {
		t.Errorf("drift_runs = %d (result %+v), want the one unlocked run", runs, res)
	}
}

type nopPlacement struct{}

func (nopPlacement) ProviderAllocations(context.Context, string) (map[string]map[string]int, error) {
	return nil, nil
}

func (nopPlacement) ReleaseUnits(context.Context, string, string, string, int, int) error { return nil }

func (w *world) consumerGeneration(consumer string) *int {
	a, err := allocations.Get(w.ctx, w.sc, consumer).Extract()
	testsvc.Must(w.t, err, "get allocations")
	return a.ConsumerGeneration
}
