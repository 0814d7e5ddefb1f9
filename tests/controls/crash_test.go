package controls_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/pipeline"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestCrashAtEachClaimStep kills the bridge (SIGKILL, as a power loss) at
// each step of a direct-path decision — stopped for a claim and none made,
// the claim made in Placement and not recorded, recorded and committed but
// the outbox not kicked — and starts it again on the same database and
// queues. Each time the request finishes once, and Placement holds exactly
// the vGPU the bridge records: none leaked, none doubled.
func TestCrashAtEachClaimStep(t *testing.T) {
	for _, fp := range []string{pipeline.FailBeforePlacement, pipeline.FailAfterPlacement, pipeline.FailAfterRecord} {
		t.Run(fp, func(t *testing.T) {
			f := newFleet(t)
			a := f.hosts[0]
			f.startProcess(fp)
			f.startAgent(a)
			f.notifyCreates()
			id := f.request(a)
			f.waitKilled(fp)
			f.startProcess("")

			r := f.final(id)
			if r.State != "succeeded" {
				t.Fatalf("request %s after the restart: %s (%s: %s), want succeeded", id, r.State, r.Code, r.Reason)
			}
			// Placement holds exactly what the bridge records.
			al, err := allocations.Get(f.ctx, f.sc, a.vm).Extract()
			testsvc.Must(t, err, "allocations")
			held := map[string]int{}
			for rp, pa := range al.Allocations {
				if n := pa.Resources["VGPU"]; n > 0 {
					held[rp] = n
				}
			}
			rows, err := f.pool.Query(f.ctx, `SELECT provider_uuid::text, amount, state FROM vgpu_attachments WHERE instance_uuid = $1`, a.vm)
			testsvc.Must(t, err, "attachments")
			recorded := map[string]int{}
			var states []string
			for rows.Next() {
				var rp, st string
				var n int
				testsvc.Must(t, rows.Scan(&rp, &n, &st), "scan")
				states = append(states, st)
				if st == "attached" {
					recorded[rp] += n
				}
			}
			rows.Close()
			if len(states) != 1 || states[0] != "attached" || fmt.Sprint(held) != fmt.Sprint(recorded) {
				t.Errorf("Placement holds %v VGPU by provider; the bridge records %v (attachments %v); want one and the same", held, recorded, states)
			}
			var attaches, transitions int
			testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM commands WHERE request_id = $1 AND kind = 'attach_vgpu'`, id).Scan(&attaches), "commands")
			testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM audit_log WHERE request_id = $1 AND action = 'transition' AND detail->>'to' = 'succeeded'`, id).Scan(&transitions), "audit")
			if attaches != 1 || transitions != 1 {
				t.Errorf("attach_vgpu commands %d, transitions to succeeded %d; want 1 and 1", attaches, transitions)
			}
		})
	}
}

// TestCrashAfterRelease kills the bridge after it gave a released vGPU's
// claim back to Placement and before it recorded that (the planned
// release and the request's planned end committed before): the request is
// not final at the crash, nor after the restart until the sweep (once the
// release's lease ran out) finds the release done and ends it; it then
// reads succeeded once, with the claim given back and the vGPU released.
func TestCrashAfterRelease(t *testing.T) {
	f := newFleet(t)
	a, id := f.releaseKilledAt(pipeline.FailAfterPlacement)
	f.expectEnding(id, a.vm)
	if n := f.vgpuUnits(a.vm); n != 0 {
		t.Errorf("VGPU at the crash: %d, want 0 (given back before the record)", n)
	}
	f.startProcess("")
	// The lease (a minute from the crash) has not run out: the restarted
	// bridge leaves the release, and the request is still not final.
	f.expectEnding(id, a.vm)
	f.expectEndedOnce(id, a.vm)
}

// TestCrashBeforeRelease kills the bridge after the agent's last result
// of a release was recorded, with the planned release and the request's
// planned end, and before the claim was given back to Placement: the
// request is not final at the crash; after a restart the sweep gives the
// claim back once (its lease ran out) and ends the request, once.
func TestCrashBeforeRelease(t *testing.T) {
	f := newFleet(t)
	a, id := f.releaseKilledAt(pipeline.FailBeforePlacement)
	f.expectEnding(id, a.vm)
	if n := f.vgpuUnits(a.vm); n != 1 {
		t.Errorf("VGPU at the crash: %d, want 1 (not given back yet)", n)
	}
	f.startProcess("")
	f.expectEndedOnce(id, a.vm)
}

// expectEnding checks that request id is not final and that its end
// waits for the planned release of the vGPU of vm.
func (f *fleet) expectEnding(id, vm string) {
	t := f.t
	t.Helper()
	var state string
	var planned, ends int
	testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT state, (SELECT count(*) FROM planned_releases WHERE instance_uuid = $2),
		(SELECT count(*) FROM planned_finishes WHERE request_id = $1) FROM requests WHERE id = $1`,
		id, vm).Scan(&state, &planned, &ends), "request")
	if state == "succeeded" || state == "failed" || planned != 1 || ends != 1 {
		t.Errorf("request %s, planned releases %d, planned ends %d; want it not final, waiting for 1 release", state, planned, ends)
	}
}

// expectEndedOnce waits until request id is final (a restarted bridge's
// sweep makes what a crash left once its lease, a minute, ran out) and
// checks that, when it first reads final, Placement has vm's vGPU back
// and nothing is left planned; the request succeeded, once, and the vGPU
// is recorded released.
func (f *fleet) expectEndedOnce(id, vm string) {
	f.t.Helper()
	f.endedOnce(id, vm, "succeeded")
	f.expectReleased(vm)
}

// endedOnce waits until request id is final (see expectEndedOnce) and
// checks that, when it first reads final, Placement has vm's vGPU back
// and nothing is left planned, and that it reached state want, once. It
// returns the request as it first read final.
func (f *fleet) endedOnce(id, vm, want string) apiclient.Request {
	t := f.t
	t.Helper()
	var r apiclient.Request
	f.waitFor(150*time.Second, "request "+id+" final", func() bool {
		var err error
		r, err = f.admin.Request(f.ctx, id)
		return err == nil && apiclient.FinalState(r.State)
	})
	if n := f.vgpuUnits(vm); n != 0 {
		t.Errorf("VGPU when the request read %s: %d, want 0", r.State, n)
	}
	if r.State != want {
		t.Errorf("request after the restart: %s (%s: %s), want %s", r.State, r.Code, r.Reason, want)
	}
	var planned, ends, transitions int
	testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM planned_releases WHERE instance_uuid = $2),
		(SELECT count(*) FROM planned_finishes WHERE request_id::text = $1),
		(SELECT count(*) FROM audit_log WHERE request_id::text = $1 AND action = 'transition' AND detail->>'to' = $3)`,
		id, vm, want).Scan(&planned, &ends, &transitions), "plans")
	if planned != 0 || ends != 0 || transitions != 1 {
		t.Errorf("planned releases %d, planned ends %d, transitions to %s %d; want 0, 0, 1", planned, ends, want, transitions)
	}
	return r
}

// releaseKilledAt attaches a vGPU to the first host's VM, restarts the
// bridge with failpoint fp armed, sends GPU_RELEASE and waits until the
// bridge killed itself at fp. It returns the host and the release's id.
func (f *fleet) releaseKilledAt(fp string) (*host, string) {
	t := f.t
	t.Helper()
	a := f.hosts[0]
	f.startProcess("")
	f.startAgent(a)
	f.notifyCreates()
	if r := f.final(f.request(a)); r.State != "succeeded" {
		t.Fatalf("attach: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	if n := f.vgpuUnits(a.vm); n != 1 {
		t.Fatalf("VGPU after the attach: %d, want 1", n)
	}
	syscall.Kill(-f.proc.Process.Pid, syscall.SIGTERM) //nolint:errcheck
	<-f.procDone
	f.startProcess(fp)
	id := f.send(map[string]any{"type": "GPU_RELEASE", "vm_id": a.vm})
	f.waitKilled(fp)
	return a, id
}

// expectReleased checks that the VM's one vGPU is recorded released.
func (f *fleet) expectReleased(vm string) {
	t := f.t
	t.Helper()
	var states string
	testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT string_agg(state, ',') FROM vgpu_attachments WHERE instance_uuid = $1`, vm).Scan(&states), "attachments")
	if states != "released" {
		t.Errorf("attachments %q, want one released", states)
	}
}

// startProcess runs the bridge as a subprocess on the fleet's database and
// queues, with failpoint armed when not "", and waits until it is ready.
func (f *fleet) startProcess(fp string) {
	t := f.t
	t.Helper()
	addr := testbridge.FreeAddr(t)
	ini, over := f.config("api.listen=" + addr)
	args := []string{"serve", "--config", ini}
	for _, s := range over {
		args = append(args, "--set", s)
	}
	sp := testbridge.Spawn(t, addr, args, filepath.Join(f.dir, "bridge.log"), fp)
	f.proc, f.procDone, f.url = sp.Cmd, sp.Done, sp.URL
	f.admin = apiclient.New(apiclient.Config{URL: f.url, Token: testbridge.AdminToken, Timeout: 30 * time.Second})
	if f.pool == nil {
		f.pool = testsvc.Pool(t, f.dbURL)
	}
}

// waitKilled waits until the subprocess killed itself at failpoint fp.
func (f *fleet) waitKilled(fp string) {
	t := f.t
	t.Helper()
	select {
	case <-f.procDone:
	case <-time.After(90 * time.Second):
		t.Fatalf("the bridge did not reach failpoint %s within 90s", fp)
	}
	ws, ok := f.proc.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		b, _ := os.ReadFile(filepath.Join(f.dir, "bridge.log"))
		t.Fatalf("the bridge ended with %v, want SIGKILL at failpoint %s\n%s", f.proc.ProcessState, fp, testsvc.LastLines(string(b), 30))
	}
	b, _ := os.ReadFile(filepath.Join(f.dir, "bridge.log"))
	if !strings.Contains(string(b), "failpoint "+fp+": SIGKILL") {
		t.Fatalf("the bridge was killed, but not at failpoint %s", fp)
	}
}

// TestCrashAtEachCancelStep cancels (POST /v1/requests/{id}/cancel) a
// request whose agent has not answered, its vGPU claimed, and kills the
// bridge before the claim is given back to Placement, and after that but
// before it is recorded. Each time the request is not final at the crash,
// its release and its cancelled end planned; after a restart the sweep
// (once the release's lease ran out) gives the claim back once, if not
// given already, and only then does the request read failed, cancelled,
// once.
func TestCrashAtEachCancelStep(t *testing.T) {
	for _, step := range []struct {
		fp   string
		held int // VGPU in Placement at the crash
	}{{pipeline.FailBeforePlacement, 1}, {pipeline.FailAfterPlacement, 0}} {
		t.Run(step.fp, func(t *testing.T) {
			f := newFleet(t)
			a := f.hosts[0]
			f.startProcess("")
			f.notifyCreates()
			id := f.request(a) // no agent: the request waits, dispatched, its claim held
			f.waitFor(60*time.Second, "request "+id+" dispatched", func() bool {
				r, err := f.admin.Request(f.ctx, id)
				return err == nil && r.State == "dispatched"
			})
			if n := f.vgpuUnits(a.vm); n != 1 {
				t.Fatalf("VGPU while the agent is silent: %d, want 1", n)
			}
			syscall.Kill(-f.proc.Process.Pid, syscall.SIGTERM) //nolint:errcheck
			<-f.procDone
			f.startProcess(step.fp)
			go f.admin.CancelRequest(f.ctx, id) //nolint:errcheck // the bridge dies under it
			f.waitKilled(step.fp)

			f.expectEnding(id, a.vm)
			var code string
			testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT code FROM planned_finishes WHERE request_id = $1`, id).Scan(&code), "planned end")
			if code != "cancelled" {
				t.Errorf("planned end's code %q, want cancelled", code)
			}
			if n := f.vgpuUnits(a.vm); n != step.held {
				t.Errorf("VGPU at the crash: %d, want %d", n, step.held)
			}
			f.startProcess("")
			r := f.endedOnce(id, a.vm, "failed")
			if r.Code != "cancelled" {
				t.Errorf("request after the restart: %s (%s: %s), want failed cancelled", r.State, r.Code, r.Reason)
			}
			var states string
			testsvc.Must(t, f.pool.QueryRow(f.ctx, `SELECT string_agg(state, ',') FROM vgpu_attachments WHERE instance_uuid = $1`, a.vm).Scan(&states), "attachments")
			if states != "failed" {
				t.Errorf("attachments %q, want one failed", states)
			}
		})
	}
}
