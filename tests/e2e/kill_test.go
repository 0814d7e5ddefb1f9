package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestKillDuringResize is scenario 6: the bridge is killed (SIGKILL) in
// the middle of scenario 1 — after its resize call, while Nova resizes
// or the agent has yet to verify — and started again on the same
// database and queues. The request finishes, and every effect happened
// once: one resize and one confirm in Nova, one verification, one
// success.
//
// The host's agent reports once and stops before the request, and runs
// again only after the kill: the request is surely still in flight when
// the bridge dies (its verify_vgpu waits in the agent's queue).
func TestKillDuringResize(t *testing.T) {
	w := newWorld(t, worldOpts{typ: typeKill, noAgent: true, extra: []string{"nova.verify_timeout=10m"}})
	vm, id := w.requestWhileAgentStopped("e2e-kill")
	deadline := time.Now().Add(3 * time.Minute)
	var at request
	for {
		at = w.request(id)
		if at.State == "dispatched" && (at.Phase == "resizing" || at.Phase == "verifying") {
			break
		}
		if at.State == "succeeded" || at.State == "failed" || at.State == "rejected" || time.Now().After(deadline) {
			t.Fatalf("request %s is %s/%s (%s) before the kill; want dispatched, resizing or verifying", id, at.State, at.Phase, at.Reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.stopBridge(syscall.SIGKILL)
	t.Logf("killed the bridge with the request %s/%s", at.State, at.Phase)

	// While the bridge is dead, Nova finishes the resize; its
	// notifications wait in the bridge's queue.
	w.n.WaitServer(t, vm, "VERIFY_RESIZE")
	w.startAgent()
	w.startBridge()

	r := w.waitFinal(id)
	if r.State != "succeeded" {
		t.Fatalf("request %s after the restart: %s (%s): %s", id, r.State, r.Code, r.Reason)
	}
	w.assertResized(vm, "small.vgpu")
	if got := w.novaCalls(id); got["resize"] != 1 || got["confirm_resize"] != 1 || got["revert_resize"] != 0 {
		t.Errorf("the bridge's Nova calls %v, want one resize and one confirm", got)
	}
	if got := w.novaActions(vm); got["resize"] != 1 || got["confirmResize"] != 1 || got["revertResize"] != 0 {
		t.Errorf("Nova's instance actions %v, want one resize and one confirmResize", got)
	}
	var verifies, successes int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM commands WHERE request_id = $1 AND kind = 'verify_vgpu'`, id).Scan(&verifies), "commands")
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE request_id = $1 AND action = 'transition' AND detail->>'to' = 'succeeded'`,
		id.String()).Scan(&successes), "audit")
	if verifies != 1 || successes != 1 {
		t.Errorf("%d verify_vgpu commands and %d transitions to succeeded, want 1 and 1", verifies, successes)
	}
}

// requestWhileAgentStopped creates a server of a plain flavor (a vGPU
// twin of it exists), lets the host's agent report once and stops it,
// starts the bridge and asks for the type's profile for the server: the
// request's verify_vgpu will wait in the agent's queue until the agent
// runs again.
func (w *world) requestWhileAgentStopped(name string) (vm string, id uuid.UUID) {
	t := w.t
	plain := w.flavor("small", 2, 2048, 10, 0)
	w.flavor("small.vgpu", 2, 2048, 10, 1)
	stopAgent := w.runAgent()
	w.startBridge()
	vm = w.n.CreateServer(t, name, plain, w.host)
	w.n.WaitServer(t, vm, "ACTIVE")
	w.waitInstance(vm, w.host, 0)
	w.waitAgent()
	stopAgent()
	return vm, w.gpuRequest(vm, w.typ.profile)
}

// runAgent runs the host's agent in this process on the harness's drivers
// (which it keeps) until the returned stop is called.
func (w *world) runAgent() (stop func()) {
	t := w.t
	t.Helper()
	fh := w.n.FakeHost(w.host)
	v, err := agent.LoadConfig(conf.Source{Overrides: append([]string{"DEFAULT.host=" + w.host, "DEFAULT.node=" + w.host,
		"DEFAULT.transport_url=" + w.n.TransportURL(), "DEFAULT.state_path=" + t.TempDir(), "DEFAULT.listen=127.0.0.1:0",
		"DEFAULT.report_interval=5s", "DEFAULT.report_check_interval=1s", "DEFAULT.reconnect_max_backoff=2s", "DEFAULT.shutdown_timeout=5s"},
		testkeys.For(t).Agent(w.host)...)})
	testsvc.Must(t, err, "agent config")
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- agent.RunWith(ctx, v, nil, agent.RunOptions{FakeHostDir: fh.Dir, Drivers: fh.Drivers}) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("agent: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Error("agent did not stop within 20s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestTwoReplicasOnce runs scenario 1 with two bridge replicas on the same
// database and queues: both see every notification and result and both
// run the Nova loop, yet Nova is asked to resize and confirm once.
func TestTwoReplicasOnce(t *testing.T) {
	w := newWorld(t, worldOpts{typ: typeReplicas})
	plain := w.flavor("small", 2, 2048, 10, 0)
	w.flavor("small.vgpu", 2, 2048, 10, 1)
	w.startBridge()
	w.startReplica("replica-b")
	vm := w.n.CreateServer(t, "e2e-replicas", plain, w.host)
	w.n.WaitServer(t, vm, "ACTIVE")
	w.waitInstance(vm, w.host, 0)
	w.waitAgent()

	id := w.gpuRequest(vm, w.typ.profile)
	r := w.waitFinal(id)
	if r.State != "succeeded" {
		t.Fatalf("request %s: %s (%s): %s", id, r.State, r.Code, r.Reason)
	}
	w.assertResized(vm, "small.vgpu")
	if got := w.novaCalls(id); got["resize"] != 1 || got["confirm_resize"] != 1 || got["revert_resize"] != 0 {
		t.Errorf("the bridges' Nova calls %v, want one resize and one confirm", got)
	}
	if got := w.novaActions(vm); got["resize"] != 1 || got["confirmResize"] != 1 {
		t.Errorf("Nova's instance actions %v, want one resize and one confirmResize", got)
	}
	var verifies, successes int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM commands WHERE request_id = $1 AND kind = 'verify_vgpu'`, id).Scan(&verifies), "commands")
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE request_id = $1 AND action = 'transition' AND detail->>'to' = 'succeeded'`,
		id.String()).Scan(&successes), "audit")
	if verifies != 1 || successes != 1 {
		t.Errorf("%d verify_vgpu commands and %d transitions to succeeded, want 1 and 1", verifies, successes)
	}
}

// startReplica runs a second bridge process on the world's database and
// queues, with an API of its own, until the test ends.
func (w *world) startReplica(name string) {
	t := w.t
	t.Helper()
	port := testsvc.FreePort(t)
	api := fmt.Sprintf("127.0.0.1:%d", port)
	f, err := os.OpenFile(w.brLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	testsvc.Must(t, err, "bridge log")
	cmd := exec.Command(testsvc.Binary(t, "vgpu-bridge"), append(append([]string{}, w.args...), "--set", "api.listen="+api, "--set", "DEFAULT.host="+name)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	testsvc.Must(t, cmd.Start(), "start the second replica")
	f.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-done:
			t.Fatalf("replica %s exited at start: %v", name, cmd.ProcessState)
		default:
		}
		if resp, err := http.Get("http://" + api + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s not ready within 2m", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
