package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/usage"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// vGPU usage accounting against the real services: the seconds GET
// /v1/usage adds up per instance and profile are the seconds the test saw
// each vGPU held, on the direct path (the bridge's attach, profile change
// and release) and on the flavor path (a tenant's resizes through Nova),
// across a restart of the bridge during which Nova's notifications wait
// in its queue.

// The accounting test's types: the host's first T4 (gpuPCI) set to
// T4-2B, the second (gpu2PCI) to T4-1B. Instance A attaches a T4-1B
// directly, changes it to a T4-2B and releases it; instance B resizes
// through Nova to a flavor with a T4-2B and back. Its host is named after
// T4-2B (nova-t4-2b), which no other test's world is; its GPU providers
// are removed at the end, so no later test's Nova resize lands on them.
var (
	typeAcctNova  = typeElasticTo   // T4-2B: A's second profile, B's flavor
	typeAcctFirst = typeElasticFrom // T4-1B: A's first profile
)

// acctTenantToken is an operator API token of a reader scoped to
// instance B's project.
const acctTenantToken = "e2e-accounting-tenant-token"

// observed is when the test saw something happen: not before lo, not
// after hi.
type observed struct{ lo, hi time.Time }

func (o observed) String() string {
	return fmt.Sprintf("[%s, %s]", o.lo.UTC().Format("15:04:05.000"), o.hi.UTC().Format("15:04:05.000"))
}

// contains reports whether at lies in o, widened by slack on both sides.
func (o observed) contains(at time.Time, slack time.Duration) bool {
	return !at.Before(o.lo.Add(-slack)) && !at.After(o.hi.Add(slack))
}

// heldSeconds is the range of durations from a moment in from to one in to.
func heldSeconds(from, to observed) (lo, hi float64) {
	return to.lo.Sub(from.hi).Seconds(), to.hi.Sub(from.lo).Seconds()
}

// usageRow is a row of the bridge's vgpu_usage.
type usageRow struct {
	Path, Profile, VGPUType, Project, Host, Flavor string
	Amount                                         int
	Started                                        time.Time
	Ended                                          *time.Time
}

// TestUsageAccounting: instance A (project pA) gets a T4-1B on the direct
// path, changes it to a T4-2B, and after a restart of the bridge releases
// it; instance B (project pB) is resized by its tenant through Nova to a
// flavor with a T4-2B, and back to its plain flavor while the bridge is
// stopped. GET /v1/usage (group_by=instance,profile) gives, for each
// instance and profile, the seconds between the moments the test saw the
// vGPU come and go, within one second: over the whole test and over a
// window that starts in the middle of the holds. The vgpu_usage rows begin
// and end within a second of what the test saw, with the path, project,
// type, host and flavor of the change; a reader scoped to pB sees B's
// usage only.
func TestUsageAccounting(t *testing.T) {
	testStart := time.Now()
	pA := strings.ReplaceAll(uuid.NewString(), "-", "")
	pB := strings.ReplaceAll(uuid.NewString(), "-", "")
	n := sharedNova(t)
	gone := &elasticWorld{directWorld: &directWorld{t: t, n: n}, gpus: map[string]string{}}
	var own string

	tokens := filepath.Join(t.TempDir(), "api-tokens")
	testsvc.Must(t, os.WriteFile(tokens, []byte(testbridge.AdminToken+" admin ops\n"+testbridge.ReaderToken+" reader viewer\n"+
		acctTenantToken+" reader tenant-b "+pB+"\n"), 0o600), "api tokens")
	w := newWorld(t, worldOpts{typ: typeAcctNova, extra: []string{"api.token_file=" + tokens}})
	// At the end the test's servers go, then its GPU providers
	// (elasticWorld.cleanup) and its trait, so that no later test's Nova
	// scheduler lands on them. Registered after the world's host (whose
	// compute must still run for Nova's API to delete the servers) and
	// before its bridge starts, so it runs after the bridge stopped.
	t.Cleanup(func() {
		gone.cleanup()
		if own != "" {
			if err := n.PlacementCall(context.Background(), http.MethodDelete, "/traits/"+own, nil, nil); err != nil && !novaharness.IsNotFound(err) {
				t.Logf("cleanup: delete trait %s: %v", own, err)
			}
		}
	})
	// The direct path: every request goes direct-live; GPU_RESIZE changes
	// the profile, GPU_RELEASE gives the vGPU back. A tenant's resize
	// through Nova is no request of the bridge's.
	testsvc.Must(t, os.WriteFile(filepath.Join(w.dir, "policy.yaml"), []byte(elasticPolicy("")), 0o600), "policy")
	gpuFirst := w.n.AddVGPUChild(t, w.host, gpu2PCI, typeAcctFirst.trait(), typeAcctFirst.max)
	gone.gpus[gpuPCI], gone.gpus[gpu2PCI] = w.gpu, gpuFirst
	// B's vGPU flavor asks for a trait only this test's T4-2B has: Nova's
	// scheduler cannot take B to another test's GPU of the type.
	own = "CUSTOM_E2E_ACCT_" + strings.ToUpper(testsvc.Name("h")[2:])
	w.addTrait(w.gpu, own)

	plain := w.flavor("small", 2, 2048, 10, 0)
	vgpuFlavor := w.flavorName("small.vgpu")
	vgpu := w.n.CreateFlavor(t, vgpuFlavor, 2, 2048, 10, map[string]string{"resources:VGPU": "1",
		"trait:" + typeAcctNova.trait(): "required", "trait:" + own: "required"})
	w.startBridge()

	vmA := w.createIn(pA, "e2e-acct-a", plain)
	vmB := w.createIn(pB, "e2e-acct-b", plain)
	gone.servers = []string{vmA, vmB}
	for _, vm := range []string{vmA, vmB} {
		w.n.WaitServer(t, vm, "ACTIVE")
		w.waitInstance(vm, w.host, 0)
	}
	w.waitAgent()

	// A: a T4-1B on the direct path.
	a0 := w.timedRequest("GPU_REQUEST", vmA, typeAcctFirst.profile)
	// B: its tenant's resize to the flavor with a T4-2B.
	b0 := w.timedResize(pB, vmB, vgpu)
	w.waitInstance(vmB, w.host, 1)
	sleepUntil(a0.hi.Add(6 * time.Second))

	// A: the profile change to a T4-2B.
	a1 := w.timedRequest("GPU_RESIZE", vmA, typeAcctNova.profile)
	sleepUntil(a1.hi.Add(3 * time.Second))

	// The bridge stops; meanwhile B's tenant resizes it back to its plain
	// flavor: Nova's notifications of it wait in the bridge's queue.
	mid := time.Now()
	w.stopBridge(syscall.SIGTERM)
	stopped := time.Now()
	t.Logf("stopped the bridge at %s", stopped.UTC().Format("15:04:05.000"))
	b1 := w.timedResize(pB, vmB, plain)
	// Down 2 s more: B's usage can end within a second of b1 only at
	// Nova's time of the event, not when the bridge reads it.
	sleepUntil(b1.hi.Add(2 * time.Second))
	restarted := time.Now()
	w.startBridge()
	t.Logf("the bridge is back after %s", time.Since(stopped).Round(time.Millisecond))
	sleepUntil(time.Now().Add(3 * time.Second))

	// A: the release, by the bridge started again.
	a2 := w.timedRequest("GPU_RELEASE", vmA, "")
	// The restarted bridge accounts B's resize back from the queued notifications.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("B's inbox and usage when the test failed:\n%s", w.instanceTrail(vmB))
		}
	})
	w.waitFor(time.Minute, "the restarted bridge to end B's flavor usage", func() bool {
		var open, all int
		testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FILTER (WHERE ended_at IS NULL), count(*) FROM vgpu_usage WHERE instance_uuid = $1`,
			vmB).Scan(&open, &all), "vgpu_usage of B")
		return all > 0 && open == 0
	})
	t.Logf("observed: A %s %s, %s %s, release %s; B to the vGPU flavor %s, back %s", typeAcctFirst.profile, a0, typeAcctNova.profile, a1, a2, b0, b1)

	// The rows: where each interval begins and ends.
	rows := w.usageRows()
	w.checkDirectRows(rows[vmA], pA, a0, a1, a2)
	w.checkFlavorRows(rows[vmB], pB, vgpuFlavor, b0, b1)
	if rs := rows[vmB]; len(rs) > 0 && (rs[len(rs)-1].Ended == nil || !rs[len(rs)-1].Ended.Before(restarted)) {
		t.Errorf("B's flavor usage ended at %v, not before the bridge started again (%s): not at Nova's time of the resize back",
			rs[len(rs)-1].Ended, restarted.UTC().Format("15:04:05.000"))
	}
	for vm, rs := range rows {
		if vm != vmA && vm != vmB {
			t.Errorf("usage of an instance the test did not make: %s %+v", vm, rs)
		}
	}

	// The report over the whole test: per instance and profile, the
	// seconds the test saw, within one second.
	type key struct{ instance, profile string }
	type want struct{ from, to observed }
	whole := map[key]want{
		{vmA, typeAcctFirst.profile}: {a0, a1},
		{vmA, typeAcctNova.profile}:  {a1, a2},
		{vmB, typeAcctNova.profile}:  {b0, b1},
	}
	check := func(what string, rep usage.Report, wants map[key]want) {
		t.Helper()
		var total int64
		got := map[key]int64{}
		for _, r := range rep.Usage {
			got[key{r.InstanceUUID, r.Profile}] += r.VGPUSeconds
			total += r.VGPUSeconds
			if r.ProjectID != "" || r.Host != "" || r.Path != "" {
				t.Errorf("%s: row %+v has columns not grouped by", what, r)
			}
		}
		// The total is rounded once: within half a second per row of the
		// sum of the rounded rows.
		if d := rep.Total - total; 2*d > int64(len(rep.Usage)) || -2*d > int64(len(rep.Usage)) {
			t.Errorf("%s: total_vgpu_seconds %d, the rows add up to %d", what, rep.Total, total)
		}
		for k, wt := range wants {
			lo, hi := heldSeconds(wt.from, wt.to)
			s, ok := got[k]
			if !ok {
				t.Errorf("%s: no usage of %s with %s, want %.1f–%.1f s", what, k.instance, k.profile, lo, hi)
				continue
			}
			if float64(s) < lo-1 || float64(s) > hi+1 {
				t.Errorf("%s: %s with %s: %d vGPU-seconds, want %.1f–%.1f (held from %s to %s), within 1 s", what, k.instance, k.profile, s, lo, hi, wt.from, wt.to)
			} else {
				t.Logf("%s: %s with %s: %d vGPU-seconds; the test saw %.1f–%.1f", what, k.instance, k.profile, s, lo, hi)
			}
			delete(got, k)
		}
		for k, s := range got {
			t.Errorf("%s: usage of %s with %s: %d vGPU-seconds, want none", what, k.instance, k.profile, s)
		}
	}
	end := time.Now().Add(2 * time.Second)
	q := url.Values{"start": {testStart.Add(-time.Second).UTC().Format(time.RFC3339)}, "end": {end.UTC().Format(time.RFC3339)},
		"group_by": {"instance,profile"}}
	rep := w.usage(testbridge.AdminToken, q, http.StatusOK)
	if strings.Join(rep.GroupBy, ",") != "instance,profile" {
		t.Errorf("group_by in the answer: %v", rep.GroupBy)
	}
	check("the whole test", rep, whole)

	// A window that starts in the middle (just before the bridge stopped):
	// what was held before it does not count; A's T4-1B had ended.
	at := observed{mid, mid}
	q.Set("start", mid.UTC().Format(time.RFC3339Nano))
	check("from the stop on", w.usage(testbridge.AdminToken, q, http.StatusOK), map[key]want{
		{vmA, typeAcctNova.profile}: {at, a2},
		{vmB, typeAcctNova.profile}: {at, b1},
	})

	// A reader scoped to B's project sees B's usage only, and may not ask
	// for another project's.
	q.Set("start", testStart.Add(-time.Second).UTC().Format(time.RFC3339))
	check("a reader of "+pB, w.usage(acctTenantToken, q, http.StatusOK), map[key]want{{vmB, typeAcctNova.profile}: whole[key{vmB, typeAcctNova.profile}]})
	q.Set("project", pA)
	w.usage(acctTenantToken, q, http.StatusForbidden)
	// An operator filters by project.
	check("project "+pA, w.usage(testbridge.AdminToken, q, http.StatusOK), map[key]want{
		{vmA, typeAcctFirst.profile}: whole[key{vmA, typeAcctFirst.profile}],
		{vmA, typeAcctNova.profile}:  whole[key{vmA, typeAcctNova.profile}],
	})
}

// sleepUntil sleeps until t (not at all when it has passed).
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }

// createIn asks Nova for a server of flavor on the world's host in
// project (noauth2 token admin:<project>), without waiting.
func (w *world) createIn(project, name, flavor string) string {
	w.t.Helper()
	var out struct {
		Server struct{ ID string } `json:"server"`
	}
	testsvc.Must(w.t, w.n.ComputeAs(w.ctx, http.MethodPost, "/servers", "admin:"+project, map[string]any{"server": map[string]any{
		"name": name, "flavorRef": flavor, "imageRef": novaharness.ImageID, "networks": "none", "host": w.host}}, &out),
		"create server "+name+" in project "+project)
	return out.Server.ID
}

// addTrait adds trait to a provider's traits in Placement.
func (w *world) addTrait(rp, trait string) {
	w.t.Helper()
	testsvc.Must(w.t, w.n.PlacementCall(w.ctx, http.MethodPut, "/traits/"+trait, nil, nil), "trait "+trait)
	var cur struct {
		Traits     []string `json:"traits"`
		Generation int      `json:"resource_provider_generation"`
	}
	testsvc.Must(w.t, w.n.PlacementCall(w.ctx, http.MethodGet, "/resource_providers/"+rp+"/traits", nil, &cur), "traits of "+rp)
	testsvc.Must(w.t, w.n.PlacementCall(w.ctx, http.MethodPut, "/resource_providers/"+rp+"/traits", map[string]any{
		"resource_provider_generation": cur.Generation, "traits": append(cur.Traits, trait)}, nil), "traits of "+rp)
}

// timedRequest sends a webhook of kind for vm (with the profile unless
// it is empty), waits for the request to succeed and returns when it was
// sent and when the test saw it succeeded: the vGPU changed in between.
func (w *world) timedRequest(kind, vm, profile string) observed {
	w.t.Helper()
	fields := map[string]any{"type": kind, "vm_id": vm}
	if profile != "" {
		fields["workload"], fields["vgpu_profile"] = "vdi", profile
	}
	if kind == "GPU_REQUEST" {
		fields["count"] = 1
	}
	lo := time.Now()
	id := w.webhook(fields)
	r := w.waitFinal(id)
	hi := time.Now()
	if r.State != "succeeded" {
		w.t.Fatalf("%s %s for %s: request %s %s/%s (%s): %s", kind, profile, vm, id, r.State, r.Phase, r.Code, r.Reason)
	}
	return observed{lo, hi}
}

// preFinish are the task states of a resize before Nova's finish_resize
// gives the server its new flavor.
var preFinish = map[string]bool{"resize_prep": true, "resize_migrating": true, "resize_migrated": true}

// timedResize has the tenant of project resize vm to flavor through
// Nova's API, waits for VERIFY_RESIZE, confirms and waits for ACTIVE. It
// returns when the server took the new flavor as the test saw it: after
// the last look that found the resize before its finish (or the call),
// before the first that found it waiting for its confirmation.
func (w *world) timedResize(project, vm, flavor string) observed {
	t := w.t
	t.Helper()
	token := "admin:" + project
	o := observed{lo: time.Now()}
	testsvc.Must(t, w.n.ComputeAs(w.ctx, http.MethodPost, "/servers/"+vm+"/action", token,
		map[string]any{"resize": map[string]any{"flavorRef": flavor}}, nil), "resize "+vm)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		asked := time.Now()
		s, err := w.n.GetServer(w.ctx, vm)
		seen := time.Now()
		testsvc.Must(t, err, "server "+vm)
		if s.Status == "VERIFY_RESIZE" {
			o.hi = seen
			break
		}
		if s.Status == "ERROR" {
			t.Fatalf("server %s went to ERROR resizing: %s", vm, s.Fault)
		}
		if s.Status == "RESIZE" && preFinish[s.TaskState] {
			o.lo = asked
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %s is %s (task %q), not VERIFY_RESIZE, 2m after its resize", vm, s.Status, s.TaskState)
		}
		time.Sleep(50 * time.Millisecond)
	}
	testsvc.Must(t, w.n.ComputeAs(w.ctx, http.MethodPost, "/servers/"+vm+"/action", token, map[string]any{"confirmResize": nil}, nil),
		"confirm the resize of "+vm)
	w.n.WaitServer(t, vm, "ACTIVE")
	return o
}

// usageRows reads the bridge's vgpu_usage by instance, oldest first.
func (w *world) usageRows() map[string][]usageRow {
	w.t.Helper()
	rows, err := w.pool.Query(w.ctx, `SELECT instance_uuid::text, path, coalesce(profile,''), coalesce(vgpu_type,''), coalesce(project_id,''),
			coalesce(host,''), coalesce(flavor,''), amount, started_at, ended_at
		FROM vgpu_usage ORDER BY instance_uuid, started_at, id`)
	testsvc.Must(w.t, err, "vgpu_usage")
	defer rows.Close()
	out := map[string][]usageRow{}
	for rows.Next() {
		var vm string
		var r usageRow
		testsvc.Must(w.t, rows.Scan(&vm, &r.Path, &r.Profile, &r.VGPUType, &r.Project, &r.Host, &r.Flavor, &r.Amount, &r.Started, &r.Ended), "vgpu_usage")
		out[vm] = append(out[vm], r)
	}
	testsvc.Must(w.t, rows.Err(), "vgpu_usage")
	return out
}

// checkDirectRows checks A's intervals: a direct T4-1B from the attach to
// the profile change, a direct T4-2B from there to the release, each
// bound within a second of what the test saw.
func (w *world) checkDirectRows(rows []usageRow, project string, attach, change, release observed) {
	t := w.t
	t.Helper()
	want := []struct {
		typ      vgpuType
		from, to observed
	}{{typeAcctFirst, attach, change}, {typeAcctNova, change, release}}
	if len(rows) != len(want) {
		t.Errorf("usage rows of A: %+v, want a %s then a %s, direct", rows, typeAcctFirst.profile, typeAcctNova.profile)
		return
	}
	for i, wt := range want {
		r := rows[i]
		if r.Path != "direct" || r.Profile != wt.typ.profile || r.VGPUType != wt.typ.id || r.Project != project || r.Host != w.host ||
			r.Amount != 1 || r.Flavor != "" {
			t.Errorf("usage row %d of A: %+v, want direct, %s (%s), project %s, host %s, 1 vGPU", i, r, wt.typ.profile, wt.typ.id, project, w.host)
		}
		w.checkBounds(fmt.Sprintf("A's %s", wt.typ.profile), r, wt.from, wt.to)
	}
}

// checkFlavorRows checks B's intervals: the flavor's T4-2B from the
// resize to it to the resize back (one row, or more when Nova moved B
// between hosts in between, each starting where the last ended).
func (w *world) checkFlavorRows(rows []usageRow, project, flavor string, to, back observed) {
	t := w.t
	t.Helper()
	if len(rows) == 0 {
		t.Errorf("no usage rows of B, want its flavor's %s", typeAcctNova.profile)
		return
	}
	for i, r := range rows {
		if r.Path != "flavor" || r.Profile != typeAcctNova.profile || r.VGPUType != typeAcctNova.id || r.Project != project ||
			r.Flavor != flavor || r.Amount != 1 || r.Host == "" {
			t.Errorf("usage row %d of B: %+v, want flavor %s, %s (%s), project %s, 1 vGPU", i, r, flavor, typeAcctNova.profile, typeAcctNova.id, project)
		}
		if i > 0 && (rows[i-1].Ended == nil || !rows[i-1].Ended.Equal(r.Started)) {
			t.Errorf("usage rows of B are not contiguous: %+v then %+v", rows[i-1], r)
		}
	}
	if rows[0].Host != w.host {
		t.Errorf("B's flavor usage began on %s, want %s", rows[0].Host, w.host)
	}
	first, last := rows[0], rows[len(rows)-1]
	w.checkBounds("B's flavor", usageRow{Started: first.Started, Ended: last.Ended}, to, back)
}

// checkBounds checks that r began in from and ended in to, within a second.
func (w *world) checkBounds(what string, r usageRow, from, to observed) {
	t := w.t
	t.Helper()
	if !from.contains(r.Started, time.Second) {
		t.Errorf("%s began at %s, the test saw it begin in %s", what, r.Started.UTC().Format("15:04:05.000"), from)
	}
	if r.Ended == nil {
		t.Errorf("%s has not ended; the test saw it end in %s", what, to)
	} else if !to.contains(*r.Ended, time.Second) {
		t.Errorf("%s ended at %s, the test saw it end in %s", what, r.Ended.UTC().Format("15:04:05.000"), to)
	}
}

// usage calls GET /v1/usage with token and q, expecting status; it
// returns the report of a 200.
func (w *world) usage(token string, q url.Values, status int) usage.Report {
	t := w.t
	t.Helper()
	req, err := http.NewRequestWithContext(w.ctx, http.MethodGet, w.api+"/v1/usage?"+q.Encode(), nil)
	testsvc.Must(t, err, "usage request")
	req.Header.Set("X-Auth-Token", token)
	resp, err := http.DefaultClient.Do(req)
	testsvc.Must(t, err, "GET /v1/usage")
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var rep usage.Report
	if resp.StatusCode != status {
		t.Fatalf("GET /v1/usage?%s: %d %s, want %d", q.Encode(), resp.StatusCode, b, status)
	}
	if status == http.StatusOK {
		testsvc.Must(t, json.Unmarshal(b, &rep), "decode usage: "+string(b))
	}
	return rep
}

// instanceTrail is what the bridge holds about an instance, for a failed
// test's log: each inbox row (type, Nova's time, receipt, when processed)
// and each usage interval.
func (w *world) instanceTrail(vm string) string {
	var b strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT id, source, event_type, coalesce(occurred_at::text,''), received_at::text, coalesce(processed_at::text,'-')
		FROM events WHERE instance_uuid = $1 ORDER BY id`, vm)
	if err != nil {
		return "events: " + err.Error()
	}
	for rows.Next() {
		var id int64
		var source, typ, occurred, received, processed string
		if err := rows.Scan(&id, &source, &typ, &occurred, &received, &processed); err != nil {
			return "events: " + err.Error()
		}
		fmt.Fprintf(&b, "event %d %s %s occurred %s received %s processed %s\n", id, source, typ, occurred, received, processed)
	}
	rows.Close()
	urows, err := w.pool.Query(ctx, `SELECT path, coalesce(flavor,''), coalesce(profile,''), started_at::text, coalesce(ended_at::text,'-')
		FROM vgpu_usage WHERE instance_uuid = $1 ORDER BY started_at, id`, vm)
	if err != nil {
		return b.String() + "usage: " + err.Error()
	}
	defer urows.Close()
	for urows.Next() {
		var path, flavor, profile, started, ended string
		if err := urows.Scan(&path, &flavor, &profile, &started, &ended); err != nil {
			return b.String() + "usage: " + err.Error()
		}
		fmt.Fprintf(&b, "usage %s flavor %q profile %q %s – %s\n", path, flavor, profile, started, ended)
	}
	return b.String()
}
