package pipeline_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// alertRules: a firing alert gives a VM without a vGPU a T4-4Q; its
// resolution gives it back, at most once per 2 s cooldown of the change.
const alertRules = `  - name: busy-alert-attaches
    on: [alert]
    when: event.status == "firing" && instance.vgpu_count == 0
    then: ['attach("T4-4Q", 1)']
  - name: resolved-alert-releases
    on: [alert]
    when: event.status == "resolved" && instance.vgpu_count > 0
    cooldown: 2s
    then: ['release()']
`

// submitAlert stores an Alertmanager alert about instance as the webhook
// endpoint does (a GPU_LOAD request with the alert in its event), the
// event stamped at (Alertmanager's startsAt, or endsAt once resolved).
func (w *world) submitAlert(instance, status string, startsAt, at time.Time) uuid.UUID {
	t := w.t
	id := uuid.New()
	inst := uuid.MustParse(instance)
	alert := requests.WebhookAlert{Status: status, Labels: map[string]string{"alertname": "GPUBusy", "instance_uuid": instance},
		StartsAt: startsAt, Fingerprint: "fp-" + instance}
	if status == "resolved" {
		alert.EndsAt = at
	}
	body, _ := json.Marshal(requests.WebhookEvent{RequestID: id, Source: "am", Type: "GPU_LOAD", VMID: instance, Alert: &alert})
	err := pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error {
		if err := w.requests.Create(w.ctx, tx, requests.Request{ID: id, Source: "webhook:am", Kind: "GPU_LOAD", InstanceUUID: &inst, Body: body}); err != nil {
			return err
		}
		_, err := tx.Exec(w.ctx, `INSERT INTO events (source, message_id, event_type, instance_uuid, occurred_at, payload, request_id)
			VALUES ('webhook:am', $1, 'GPU_LOAD', $2, $3, $4, $1)`, id.String(), instance, at, body)
		return err
	})
	testsvc.Must(t, err, "submit alert")
	return id
}

// TestCooldownDefersRelease: an alert attaches a vGPU; the alert resolves
// inside the release rule's cooldown, and Alertmanager sends the resolve
// once. The release is deferred, not dropped: the request stays open
// (accepted, phase deferred, its first decision audited as deferred), and
// when the cooldown ends the rule is evaluated again and releases the
// vGPU, with no further event.
func TestCooldownDefersRelease(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy(alertRules))
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	inst := w.domains[3].UUID // instance-00000004, running, no vGPU

	t0 := time.Now()
	fire := w.submitAlert(inst, "firing", t0, t0)
	if r := w.wait(fire, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("firing alert %s: %s (%s: %s)", fire, r.State, r.Code, r.Reason)
	}
	if atts := w.attachments(inst); len(atts) != 1 || atts[0].state != flow.AttAttached {
		t.Fatalf("attachments after the firing alert = %+v, want one attached", atts)
	}

	// Resolved 0.5 s after it fired: inside the 2 s cooldown of the attach.
	resolve := w.submitAlert(inst, "resolved", t0, t0.Add(500*time.Millisecond))
	r := w.wait(resolve, 60*time.Second)
	if r.State != requests.Succeeded {
		t.Fatalf("resolved alert %s: %s (%s: %s), want the release carried out after the cooldown", resolve, r.State, r.Code, r.Reason)
	}
	w.waitFor(30*time.Second, "the vGPU released", func() bool {
		atts := w.attachments(inst)
		return len(atts) == 1 && atts[0].state == flow.AttReleased
	})
	if n := vgpuUnits(w.allocations(inst)); n != 0 {
		t.Errorf("VGPU units left in Placement after the deferred release: %d", n)
	}

	// Audited: the first decision deferred the event to the cooldown's end,
	// the follow-up (no failed attempt counted) released.
	rows, err := w.pool.Query(w.ctx, `SELECT d.decision->'plan'->>'outcome', coalesce(d.decision->'plan'->>'reason',''), e.attempts,
			coalesce(e.deferred_from, 0), coalesce(array_to_string(e.deferred_rules, ','), '')
		FROM decisions d JOIN events e ON e.id = d.event_id WHERE d.request_id = $1 ORDER BY d.id`, resolve)
	testsvc.Must(t, err, "decisions")
	type dec struct {
		outcome, reason, rules string
		attempts               int
		from                   int64
	}
	var decs []dec
	for rows.Next() {
		var d dec
		testsvc.Must(t, rows.Scan(&d.outcome, &d.reason, &d.attempts, &d.from, &d.rules), "scan decision")
		decs = append(decs, d)
	}
	testsvc.Must(t, rows.Err(), "decisions")
	if len(decs) != 2 || decs[0].outcome != string(flow.OutcomeDefer) || decs[0].from != 0 ||
		decs[1].outcome != string(flow.OutcomeAct) || decs[1].from == 0 || decs[1].rules != "resolved-alert-releases" || decs[1].attempts != 0 {
		t.Errorf("decisions of the resolved alert: %+v; want a deferral, then the follow-up's release (no attempts counted)", decs)
	}
	var phases []string
	prow, err := w.pool.Query(w.ctx, `SELECT coalesce(detail->>'phase','') FROM audit_log WHERE request_id = $1 AND action = 'transition' ORDER BY id`, resolve.String())
	testsvc.Must(t, err, "transitions")
	for prow.Next() {
		var p string
		testsvc.Must(t, prow.Scan(&p), "scan transition")
		phases = append(phases, p)
	}
	if len(phases) == 0 || phases[0] != flow.PhaseDeferred {
		t.Errorf("the request's transitions went through phases %v; want %q first", phases, flow.PhaseDeferred)
	}
}

// TestCooldownDeferredSuperseded: the latest state wins. An alert that
// resolves inside the cooldown and fires again (a newer alert of the same
// fingerprint) before the deferred release is evaluated again releases
// nothing: the deferred request ends rejected with code superseded and the
// vGPU stays.
func TestCooldownDeferredSuperseded(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy(alertRules))
	w.startAgent()
	w.startBridge(replicaOpts{name: "r1"})
	inst := w.domains[3].UUID

	t0 := time.Now()
	fire := w.submitAlert(inst, "firing", t0, t0)
	if r := w.wait(fire, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("firing alert %s: %s (%s: %s)", fire, r.State, r.Code, r.Reason)
	}
	// Resolved, then firing again, both inside the cooldown: the refire is a
	// newer event than the resolve whenever its re-evaluation comes.
	resolve := w.submitAlert(inst, "resolved", t0, t0.Add(500*time.Millisecond))
	refire := w.submitAlert(inst, "firing", t0.Add(time.Second), t0.Add(time.Second))
	r := w.wait(resolve, 60*time.Second)
	if r.State != requests.Rejected || r.Code != flow.CodeSuperseded {
		t.Fatalf("resolved alert %s: %s (%s: %s), want rejected %s", resolve, r.State, r.Code, r.Reason, flow.CodeSuperseded)
	}
	w.wait(refire, 60*time.Second)
	if atts := w.attachments(inst); len(atts) != 1 || atts[0].state != flow.AttAttached {
		t.Fatalf("attachments after the superseded release = %+v, want the one still attached", atts)
	}
}

// TestCooldownDeferralSurvivesRestart: the deferral is in Postgres. The
// replica that deferred the release stops before the cooldown ends; a new
// replica, with nothing in memory, carries the release out when it ends.
func TestCooldownDeferralSurvivesRestart(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, testsvc.DirectPolicy(strings.Replace(alertRules, "cooldown: 2s", "cooldown: 10s", 1)))
	w.startAgent()
	r1 := w.startBridge(replicaOpts{name: "r1"})
	inst := w.domains[3].UUID

	t0 := time.Now()
	fire := w.submitAlert(inst, "firing", t0, t0)
	if r := w.wait(fire, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("firing alert %s: %s (%s: %s)", fire, r.State, r.Code, r.Reason)
	}
	resolve := w.submitAlert(inst, "resolved", t0, time.Now())
	var followUp int64
	w.waitFor(30*time.Second, "the resolve deferred", func() bool {
		err := w.pool.QueryRow(w.ctx, `SELECT id FROM events WHERE request_id = $1 AND deferred_from IS NOT NULL`, resolve.String()).Scan(&followUp)
		return err == nil
	})
	r1.stop()
	r, err := w.requests.Get(w.ctx, resolve)
	testsvc.Must(t, err, "get request")
	if r.State != requests.Accepted || r.Phase != flow.PhaseDeferred || !strings.Contains(r.Reason, "deferred until") {
		t.Fatalf("the deferred request: %s phase %q (%s), want accepted, phase %s, naming when", r.State, r.Phase, r.Reason, flow.PhaseDeferred)
	}
	var processed bool
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT processed_at IS NOT NULL FROM events WHERE id = $1`, followUp).Scan(&processed), "follow-up")
	if processed {
		t.Fatalf("the follow-up was processed before the cooldown's end")
	}

	w.startBridge(replicaOpts{name: "r2"})
	if r := w.wait(resolve, 60*time.Second); r.State != requests.Succeeded {
		t.Fatalf("resolved alert %s after the restart: %s (%s: %s), want the release carried out", resolve, r.State, r.Code, r.Reason)
	}
	var replica string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT replica FROM decisions WHERE event_id = $1`, followUp).Scan(&replica), "follow-up decision")
	if replica != "r2" {
		t.Errorf("the follow-up was decided by %q, want the new replica r2", replica)
	}
	w.waitFor(30*time.Second, "the vGPU released", func() bool {
		atts := w.attachments(inst)
		return len(atts) == 1 && atts[0].state == flow.AttReleased
	})
}

// waitFor polls cond until it holds or within runs out.
func (w *world) waitFor(within time.Duration, what string, cond func() bool) {
	w.t.Helper()
	testsvc.WaitFor(w.t, within, what, cond)
}
