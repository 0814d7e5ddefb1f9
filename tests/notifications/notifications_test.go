package notifications_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/notify"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// object is a payload as oslo.versionedobjects serialises one.
type object struct {
	Name      string          `json:"versioned_object.name"`
	Namespace string          `json:"versioned_object.namespace"`
	Version   string          `json:"versioned_object.version"`
	Data      json.RawMessage `json:"versioned_object.data"`
}

// vgpuData and actionData are VGPUActionPayload 1.0's fields, all of them:
// a payload is decoded with unknown fields refused.
type vgpuData struct {
	AttachmentID  string `json:"attachment_id"`
	Profile       string `json:"profile"`
	VGPUType      string `json:"vgpu_type"`
	ResourceClass string `json:"resource_class"`
	Amount        int    `json:"amount"`
	Host          string `json:"host"`
	ProviderUUID  string `json:"provider_uuid"`
	PCIAddress    string `json:"pci_address"`
	State         string `json:"state"`
}

type actionData struct {
	RequestID    string     `json:"request_id"`
	RequestKind  string     `json:"request_kind"`
	Source       string     `json:"source"`
	InstanceUUID string     `json:"instance_uuid"`
	ProjectID    string     `json:"project_id"`
	UserID       string     `json:"user_id"`
	Path         string     `json:"path"`
	State        string     `json:"state"`
	Code         string     `json:"code"`
	Reason       string     `json:"reason"`
	Flavor       string     `json:"flavor"`
	OldFlavor    string     `json:"old_flavor"`
	VGPUs        []vgpuData `json:"vgpus"`
	OldVGPUs     []vgpuData `json:"old_vgpus"`
}

// existsData is VGPUExistsPayload 1.0's fields.
type existsData struct {
	InstanceUUID  string `json:"instance_uuid"`
	ProjectID     string `json:"project_id"`
	UserID        string `json:"user_id"`
	Path          string `json:"path"`
	AttachmentID  string `json:"attachment_id"`
	Flavor        string `json:"flavor"`
	Host          string `json:"host"`
	Profile       string `json:"profile"`
	VGPUType      string `json:"vgpu_type"`
	ResourceClass string `json:"resource_class"`
	Amount        int    `json:"amount"`
	Seconds       int64  `json:"seconds"`
	VGPUSeconds   int64  `json:"vgpu_seconds"`
	AuditPeriod   object `json:"audit_period"`
}

// decode reads a versioned object, checks its name, namespace and
// version, and decodes its data into out, refusing unknown fields.
func decode(t *testing.T, raw []byte, name, version string, out any) {
	t.Helper()
	var o object
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatalf("payload %s: %v", raw, err)
	}
	if o.Name != name || o.Namespace != notify.Namespace || o.Version != version {
		t.Errorf("payload object %s/%s %s, want %s/%s %s", o.Namespace, o.Name, o.Version, notify.Namespace, name, version)
	}
	dec := json.NewDecoder(bytes.NewReader(o.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Fatalf("%s data %s: %v", name, o.Data, err)
	}
}

// step is a request the test made and what its notifications must say.
type step struct {
	what     string
	id       string
	instance string
	kind     string   // GPU_REQUEST, GPU_RESIZE, GPU_RELEASE
	events   []string // in order
	final    string   // the request's final state
	profile  string   // of vgpus at the end ("" for none)
	oldProf  string   // of old_vgpus ("" for none)
}

// TestOsloListenerSeesEachRequest drives requests through a real bridge
// and reads what it sends with Debian's oslo.messaging notification
// listener (tests/oslo_listen.py), each message as the listener's
// endpoint gets it:
//
//   - an attach, during which the bridge is killed (SIGKILL, failpoint
//     notify.queued:vgpu.attach.start) after its vgpu.attach.start was
//     queued and before the decision committed, then started again: the
//     listener gets one vgpu.attach.start (of the decision that
//     committed) and one vgpu.attach.end, nothing of the rolled-back one;
//   - a profile change T4-4Q → T4-2Q: vgpu.resize.start and .end with the
//     old vGPU in old_vgpus and the new one in vgpus;
//   - a release: vgpu.detach.start and .end;
//   - requests that fail before a decision (no capacity, an unknown
//     instance), one the policy rejects (quota): vgpu.request.error alone,
//     at priority error, with the request's state and code;
//   - an attach the host fails: vgpu.attach.start, then
//     vgpu.request.error with the failed vGPU;
//   - the audit period (1m) that held the attach closing: vgpu.exists.
//
// It checks each event's type, priority, publisher, versioned object
// and payload, the order (start before end, requests in the order they
// were made), and that what the listener got is exactly the outbox's
// committed rows, each once, with their message ids.
func TestOsloListenerSeesEachRequest(t *testing.T) {
	r := newRig(t)
	l := r.listen()

	// The attach, killed after its vgpu.attach.start was queued.
	fp := notify.FailQueued + notify.AttachStart
	r.startBridge(fp)
	r.startAgent()
	attach := step{what: "attach", instance: r.vm, id: r.ask(apiclient.NewRequest{Type: "GPU_REQUEST", VMID: r.vm, Workload: "vdi", VGPUProfile: "T4-4Q", Count: 1}),
		kind: "GPU_REQUEST", events: []string{notify.AttachStart, notify.AttachEnd}, final: "succeeded", profile: "T4-4Q"}
	r.waitKilled(fp)
	var queued int
	var seqUsed bool
	testsvc.Must(t, r.pool.QueryRow(r.ctx, `SELECT (SELECT count(*) FROM bridge_notifications), (SELECT is_called FROM bridge_notifications_id_seq)`).
		Scan(&queued, &seqUsed), "outbox after the kill")
	if queued != 0 || !seqUsed {
		t.Fatalf("after the kill: %d notifications in the outbox, an id drawn %v; want none (rolled back) after one was inserted", queued, seqUsed)
	}
	var state string
	testsvc.Must(t, r.pool.QueryRow(r.ctx, `SELECT state FROM requests WHERE id = $1`, attach.id).Scan(&state), "request after the kill")
	if state != "accepted" {
		t.Fatalf("the attach is %s after the kill, want accepted (its decision rolled back)", state)
	}
	// The claim is made in Placement before the transaction that records
	// the decision: the kill was in that transaction, the one that would
	// have committed, not in an earlier round that stopped for the claim.
	if n := r.vgpuUnits(r.vm); n != 1 {
		t.Errorf("VGPU of the instance in Placement at the kill: %d, want 1 (claimed before the decision's transaction)", n)
	}
	time.Sleep(500 * time.Millisecond)
	if got := l.all(); len(got) != 0 {
		t.Fatalf("the listener got %d notification(s) of a change that rolled back: %+v", len(got), got)
	}

	r.startBridge("")
	steps := []step{attach}
	r.expectFinal(attach)
	if n := r.vgpuUnits(r.vm); n != 1 {
		t.Errorf("VGPU of the instance in Placement after the attach: %d, want 1", n)
	}
	r.expect(l, steps)
	time.Sleep(2 * time.Second) // held for 2 s at least: vgpu.exists has seconds to count

	steps = append(steps, step{what: "profile change", instance: r.vm, id: r.ask(apiclient.NewRequest{Type: "GPU_RESIZE", VMID: r.vm, Workload: "vdi", VGPUProfile: "T4-2Q"}),
		kind: "GPU_RESIZE", events: []string{notify.ResizeStart, notify.ResizeEnd}, final: "succeeded", profile: "T4-2Q", oldProf: "T4-4Q"})
	r.expectFinal(steps[len(steps)-1])
	r.expect(l, steps)

	steps = append(steps, step{what: "release", instance: r.vm, id: r.ask(apiclient.NewRequest{Type: "GPU_RELEASE", VMID: r.vm}),
		kind: "GPU_RELEASE", events: []string{notify.DetachStart, notify.DetachEnd}, final: "succeeded", oldProf: "T4-2Q"})
	r.expectFinal(steps[len(steps)-1])
	r.expect(l, steps)

	// No GPU of the host offers T4-16Q: the request fails before any
	// decision to act (no vgpu.attach.start).
	steps = append(steps, step{what: "failed request", instance: r.vm,
		id:   r.ask(apiclient.NewRequest{Type: "GPU_REQUEST", VMID: r.vm, Workload: "vdi", VGPUProfile: "T4-16Q", Count: 1}),
		kind: "GPU_REQUEST", events: []string{notify.RequestError}, final: "failed"})
	r.expectFinal(steps[len(steps)-1])
	r.expect(l, steps)

	// More vGPUs than the policy's quota per instance: rejected.
	steps = append(steps, step{what: "over quota", instance: r.vm,
		id:   r.ask(apiclient.NewRequest{Type: "GPU_REQUEST", VMID: r.vm, Workload: "vdi", VGPUProfile: "T4-4Q", Count: 5}),
		kind: "GPU_REQUEST", events: []string{notify.RequestError}, final: "rejected"})
	r.expectFinal(steps[len(steps)-1])
	r.expect(l, steps)

	// An instance the bridge does not know (no Nova notification of it):
	// the request fails without a decision to act.
	stranger := uuid.NewString()
	steps = append(steps, step{what: "unknown instance", instance: stranger,
		id:   r.ask(apiclient.NewRequest{Type: "GPU_REQUEST", VMID: stranger, Workload: "vdi", VGPUProfile: "T4-4Q", Count: 1}),
		kind: "GPU_REQUEST", events: []string{notify.RequestError}, final: "failed"})
	r.expectFinal(steps[len(steps)-1])
	r.expect(l, steps)

	// The host has no domain of the ghost instance: the agent fails the
	// attach the bridge decided.
	steps = append(steps, step{what: "failed attach", instance: r.ghost,
		id:   r.ask(apiclient.NewRequest{Type: "GPU_REQUEST", VMID: r.ghost, Workload: "vdi", VGPUProfile: "T4-4Q", Count: 1}),
		kind: "GPU_REQUEST", events: []string{notify.AttachStart, notify.RequestError}, final: "failed", profile: "T4-4Q"})
	r.expectFinal(steps[len(steps)-1])
	r.expect(l, steps)

	r.expectExists(l, attachmentOf(t, l, attach.id))
	r.expectOutbox(l)
	if testing.Verbose() {
		for _, n := range l.all() {
			t.Logf("%s %s %s", n.Priority, n.EventType, n.Payload)
		}
	}
}

// expectFinal waits for s's request to end in s.final.
func (r *rig) expectFinal(s step) {
	r.t.Helper()
	if got := r.final(s.id); got.State != s.final {
		r.t.Fatalf("%s %s: %s (%s: %s), want %s", s.what, s.id, got.State, got.Code, got.Reason, s.final)
	}
}

// expect waits until the listener got the notifications of steps (and
// vgpu.exists, which may come between them) and checks them: exactly
// each step's events in order, steps in the order made, and each payload.
func (r *rig) expect(l *listener, steps []step) {
	t := r.t
	t.Helper()
	var want []string
	for _, s := range steps {
		for _, e := range s.events {
			want = append(want, s.id+" "+e)
		}
	}
	var got []received
	deadline := time.Now().Add(30 * time.Second)
	for {
		got = actions(l.all())
		if len(got) >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var have []string
	for _, n := range got {
		var p actionData
		decode(t, n.Payload, "VGPUActionPayload", notify.ActionPayloadVersion, &p)
		have = append(have, p.RequestID+" "+n.EventType)
	}
	if strings.Join(have, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the listener got (request event):\n%s\nwant:\n%s\n%s", strings.Join(have, "\n"), strings.Join(want, "\n"), r.bridgeLog(20))
	}
	// The payloads of the last step.
	s := steps[len(steps)-1]
	for i, n := range got[len(got)-len(s.events):] {
		r.checkAction(s, n, i == len(s.events)-1)
	}
}

// actions are the notifications other than vgpu.exists.
func actions(ns []received) []received {
	var out []received
	for _, n := range ns {
		if n.EventType != notify.Exists {
			out = append(out, n)
		}
	}
	return out
}

// checkAction checks one notification of step s (last: its final one).
func (r *rig) checkAction(s step, n received, last bool) {
	t := r.t
	t.Helper()
	var p actionData
	decode(t, n.Payload, "VGPUActionPayload", notify.ActionPayloadVersion, &p)
	where := fmt.Sprintf("%s: %s of request %s", s.what, n.EventType, s.id)
	wantPrio := "info"
	if n.EventType == notify.RequestError {
		wantPrio = "error"
	}
	if n.Priority != wantPrio {
		t.Errorf("%s: priority %s, want %s", where, n.Priority, wantPrio)
	}
	if n.PublisherID != "vgpu-bridge:"+replica {
		t.Errorf("%s: publisher_id %q, want vgpu-bridge:%s", where, n.PublisherID, replica)
	}
	if _, err := time.Parse("2006-01-02 15:04:05.000000", n.Metadata.Timestamp); err != nil || n.Metadata.MessageID == "" {
		t.Errorf("%s: metadata %+v, want a message_id and oslo's timestamp", where, n.Metadata)
	}
	req, err := r.admin.Request(r.ctx, s.id)
	testsvc.Must(t, err, "request "+s.id)
	instance, project, user := s.instance, r.project, r.user
	if instance != r.vm && instance != r.ghost {
		project, user = "", "" // an instance the bridge does not know
	}
	wantState := "decided"
	if last {
		wantState = s.final
	}
	if p.RequestKind != s.kind || p.Source != "webhook:api" || p.InstanceUUID != instance || p.ProjectID != project || p.UserID != user ||
		p.State != wantState || p.Flavor != "" || p.OldFlavor != "" {
		t.Errorf("%s: payload %+v, want kind %s, source webhook:api, instance %s, project %s, user %s, state %s, no flavor",
			where, p, s.kind, instance, project, user, wantState)
	}
	switch {
	case n.EventType == notify.RequestError:
		if p.Code == "" || p.Code != req.Code || p.Reason != req.Reason {
			t.Errorf("%s: code %q reason %q, want the request's: %q %q", where, p.Code, p.Reason, req.Code, req.Reason)
		}
	case p.Code != "":
		t.Errorf("%s: code %q, want none", where, p.Code)
	}
	wantPath := "direct"
	if s.profile == "" && s.oldProf == "" {
		wantPath = "" // it changed no vGPU
	}
	if p.Path != wantPath {
		t.Errorf("%s: path %q, want %q", where, p.Path, wantPath)
	}
	atts := map[string]attachment{}
	for _, a := range r.attachments(instance) {
		atts[a.id] = a
	}
	checkVGPUs := func(name string, vs []vgpuData, profile string) {
		if profile == "" {
			if len(vs) != 0 {
				t.Errorf("%s: %s %+v, want none", where, name, vs)
			}
			return
		}
		if len(vs) != 1 {
			t.Errorf("%s: %s %+v, want one %s", where, name, vs, profile)
			return
		}
		v := vs[0]
		a, ok := atts[v.AttachmentID]
		if !ok {
			t.Errorf("%s: %s attachment %s, which the bridge does not record (a decision that never committed?)", where, name, v.AttachmentID)
			return
		}
		wantType, wantPCI := "nvidia-232", gpuA
		if profile == "T4-2Q" {
			wantType, wantPCI = "nvidia-231", gpuB
		}
		if v.Profile != profile || a.profile != profile || v.VGPUType != wantType || v.ResourceClass != "VGPU" || v.Amount != 1 ||
			v.Host != r.host || v.ProviderUUID != r.gpus[wantPCI] || v.PCIAddress != wantPCI || v.State == "" {
			t.Errorf("%s: %s %+v, want one %s (%s) on %s of host %s, provider %s", where, name, v, profile, wantType, wantPCI, r.host, r.gpus[wantPCI])
		}
		if last && (s.final == "succeeded" || name == "vgpus") {
			wantAtt := "attached"
			switch {
			case name == "old_vgpus":
				wantAtt = "released"
			case s.final != "succeeded":
				wantAtt = "failed"
			}
			if v.State != wantAtt || a.state != wantAtt {
				t.Errorf("%s: %s state %s (recorded %s), want %s", where, name, v.State, a.state, wantAtt)
			}
		}
	}
	checkVGPUs("vgpus", p.VGPUs, s.profile)
	checkVGPUs("old_vgpus", p.OldVGPUs, s.oldProf)
	if s.what == "profile change" && len(p.OldVGPUs) == 1 {
		// The old vGPU is the attach's.
		if prev := r.attachments(r.vm); len(prev) < 1 || p.OldVGPUs[0].AttachmentID != prev[0].id {
			t.Errorf("%s: old_vgpus %s, want the first attachment %+v", where, p.OldVGPUs[0].AttachmentID, prev)
		}
	}
}

// attachmentOf returns the attachment in the vgpu.attach.end of request id.
func attachmentOf(t *testing.T, l *listener, id string) string {
	t.Helper()
	for _, n := range l.all() {
		if n.EventType != notify.AttachEnd {
			continue
		}
		var p actionData
		decode(t, n.Payload, "VGPUActionPayload", notify.ActionPayloadVersion, &p)
		if p.RequestID == id && len(p.VGPUs) == 1 {
			return p.VGPUs[0].AttachmentID
		}
	}
	t.Fatalf("no vgpu.attach.end of request %s", id)
	return ""
}

// expectExists closes the audit period (1m) in which attachment att's
// use began: once it has ended, the bridge is stopped and started again,
// and a starting bridge closes the periods that ended (else it would look
// a minute after its start). It waits for the vgpu.exists of att and
// checks it and every other vgpu.exists against the usage the bridge
// recorded.
func (r *rig) expectExists(l *listener, att string) {
	t := r.t
	t.Helper()
	var started time.Time
	var ended *time.Time
	testsvc.Must(t, r.pool.QueryRow(r.ctx, `SELECT started_at, ended_at FROM vgpu_usage WHERE attachment_id = $1`, att).Scan(&started, &ended), "usage of "+att)
	periodStart := started.UTC().Truncate(time.Minute)
	periodEnd := periodStart.Add(time.Minute)
	time.Sleep(time.Until(periodEnd) + 200*time.Millisecond)
	r.stopBridge()
	r.startBridge("")
	var exists []received
	deadline := time.Now().Add(30 * time.Second)
	for {
		exists = exists[:0]
		found := false
		for _, n := range l.all() {
			if n.EventType != notify.Exists {
				continue
			}
			exists = append(exists, n)
			var e existsData
			decode(t, n.Payload, "VGPUExistsPayload", notify.ExistsPayloadVersion, &e)
			found = found || e.AttachmentID == att
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no vgpu.exists of attachment %s (used from %s) within 30s of a restart after its period ended; got %d vgpu.exists\n%s",
				att, started.UTC().Format(time.RFC3339), len(exists), r.bridgeLog(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range exists {
		var e existsData
		decode(t, n.Payload, "VGPUExistsPayload", notify.ExistsPayloadVersion, &e)
		var ap struct {
			Begin string `json:"audit_period_beginning"`
			End   string `json:"audit_period_ending"`
		}
		if e.AuditPeriod.Name != "AuditPeriodPayload" || e.AuditPeriod.Version != "1.0" || json.Unmarshal(e.AuditPeriod.Data, &ap) != nil {
			t.Errorf("vgpu.exists audit_period %+v, want an AuditPeriodPayload 1.0", e.AuditPeriod)
		}
		begin, err1 := time.Parse(time.RFC3339, ap.Begin)
		end, err2 := time.Parse(time.RFC3339, ap.End)
		if err1 != nil || err2 != nil || end.Sub(begin) != time.Minute || !begin.Equal(begin.Truncate(time.Minute)) {
			t.Errorf("vgpu.exists audit period %s – %s, want one minute", ap.Begin, ap.End)
		}
		// What the bridge recorded of that use, within that period.
		var profile, vgpuType string
		var seconds int64
		var from time.Time
		var to *time.Time
		err := r.pool.QueryRow(r.ctx, `SELECT coalesce(u.profile,''), coalesce(u.vgpu_type,''),
				round(extract(epoch FROM least(coalesce(u.ended_at, $2), $2) - greatest(u.started_at, $1)))::bigint, started_at, ended_at
			FROM vgpu_usage u WHERE u.attachment_id = $3`, begin, end, e.AttachmentID).Scan(&profile, &vgpuType, &seconds, &from, &to)
		if err != nil {
			t.Errorf("vgpu.exists of attachment %q: no usage recorded (%v)", e.AttachmentID, err)
			continue
		}
		if e.InstanceUUID != r.vm || e.ProjectID != r.project || e.UserID != r.user || e.Path != "direct" || e.Flavor != "" ||
			e.Host != r.host || e.Profile != profile || e.VGPUType != vgpuType || e.ResourceClass != "VGPU" || e.Amount != 1 ||
			e.Seconds != seconds || e.Seconds < 0 || e.Seconds > 60 || e.VGPUSeconds != e.Seconds*int64(e.Amount) {
			t.Errorf("vgpu.exists %+v for %s – %s, want instance %s, project %s, user %s, direct, host %s, %s (%s), VGPU 1, %d s (used from %s to %v)",
				e, ap.Begin, ap.End, r.vm, r.project, r.user, r.host, profile, vgpuType, seconds, from.UTC().Format(time.RFC3339Nano), to)
		}
		if n.Priority != "info" || n.PublisherID != "vgpu-bridge:"+replica {
			t.Errorf("vgpu.exists: priority %s, publisher %s", n.Priority, n.PublisherID)
		}
		if e.AttachmentID == att {
			if !begin.Equal(periodStart) {
				t.Errorf("vgpu.exists of %s for the period from %s, want from %s (its first)", att, ap.Begin, periodStart.Format(time.RFC3339))
			}
			if ended != nil && !ended.After(periodEnd) && e.Seconds < 2 {
				t.Errorf("vgpu.exists of %s: %d s, want 2 at least (it was held that long within the period)", att, e.Seconds)
			}
		}
	}
	// The ghost's attach failed: it held no vGPU, nothing is accounted.
	var ghostUsage int
	testsvc.Must(t, r.pool.QueryRow(r.ctx, `SELECT count(*) FROM vgpu_usage WHERE instance_uuid = $1`, r.ghost).Scan(&ghostUsage), "ghost usage")
	if ghostUsage != 0 {
		t.Errorf("%d usage interval(s) of the instance whose attach failed, want none", ghostUsage)
	}
}

// expectOutbox checks that the listener got exactly the outbox's
// committed rows, each once: the same message ids, event types,
// priorities and payloads.
func (r *rig) expectOutbox(l *listener) {
	t := r.t
	t.Helper()
	type row struct {
		id                     int64
		messageID, event, prio string
		payload                []byte
		sent                   bool
	}
	var rows []row
	r.waitFor(30*time.Second, "every notification sent", func() bool {
		rows = rows[:0]
		rs, err := r.pool.Query(r.ctx, `SELECT id, message_id::text, event_type, priority, payload, sent_at IS NOT NULL FROM bridge_notifications ORDER BY id`)
		testsvc.Must(t, err, "outbox")
		defer rs.Close()
		all := true
		for rs.Next() {
			var x row
			testsvc.Must(t, rs.Scan(&x.id, &x.messageID, &x.event, &x.prio, &x.payload, &x.sent), "outbox row")
			rows = append(rows, x)
			all = all && x.sent
		}
		return all && len(l.all()) >= len(rows)
	})
	time.Sleep(300 * time.Millisecond) // anything sent twice would be here by now
	got := l.all()
	if len(got) != len(rows) {
		t.Errorf("the listener got %d notifications, the outbox holds %d", len(got), len(rows))
	}
	if len(rows) > 0 && rows[0].id == 1 {
		t.Errorf("the first committed notification has id 1: the killed decision's insert drew none (failpoint hit before the insert?)")
	}
	byID := map[string]row{}
	for _, x := range rows {
		byID[x.messageID] = x
	}
	seen := map[string]bool{}
	for _, n := range got {
		if seen[n.Metadata.MessageID] {
			t.Errorf("message %s (%s) received twice", n.Metadata.MessageID, n.EventType)
		}
		seen[n.Metadata.MessageID] = true
		x, ok := byID[n.Metadata.MessageID]
		if !ok {
			t.Errorf("the listener got %s %s, which is no committed row of the outbox", n.Metadata.MessageID, n.EventType)
			continue
		}
		var a, b any
		json.Unmarshal(n.Payload, &a) //nolint:errcheck
		json.Unmarshal(x.payload, &b) //nolint:errcheck
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if n.EventType != x.event || n.Priority != strings.ToLower(x.prio) || !bytes.Equal(ja, jb) {
			t.Errorf("message %s: the listener got %s %s %s, the outbox's row %d is %s %s %s", n.Metadata.MessageID,
				n.EventType, n.Priority, ja, x.id, x.event, x.prio, jb)
		}
	}
}
