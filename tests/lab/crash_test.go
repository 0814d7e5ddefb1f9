//go:build lab

package lab

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/direct"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/internal/failpoint"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// afterCreate is the agent's failpoint between an attach_vgpu's mdev
// creation (journaled) and its attach.
const afterCreate = agent.FailAfterStep + string(protocol.AttachVGPU) + "/mdev_created"

// killedAfterCreate starts vgpu-agent in the lab with the failpoint
// afterCreate armed, sends it the attach_vgpu of a new mtty_pci-1 vGPU for
// the nested guest, expiring at expires, and waits until the agent has
// killed itself (SIGKILL) there. The mdev then exists in the kernel and is
// in neither the live nor the persistent definition of the guest.
func killedAfterCreate(t *testing.T, expires time.Time) (*labAgent, flow.Attachment, protocol.Command) {
	t.Helper()
	a := startLabAgent(t, failpoint.Env+"="+afterCreate)
	at := a.attachment(uuid.New(), "mtty_pci-1", protocol.ModeLive)
	t.Cleanup(func() { cleanupMdev(t, at.ID.String()) })
	cmds, err := direct.AttachCommands(at, uuid.NewString(), time.Now(), expires)
	testsvc.Must(t, err, "attach commands")
	c := cmds[0]
	a.publish(&c)
	out, err := vm(t, fmt.Sprintf(`for i in $(seq 300); do
  if ! systemctl is-active -q %[1]s && journalctl -q -o cat -u %[1]s | grep -q 'failpoint %[2]s: SIGKILL'; then echo killed; exit 0; fi
  sleep 1
done
systemctl status %[1]s; journalctl -q -o cat -u %[1]s | tail -n 50`, a.unit, afterCreate))
	if err != nil || !strings.HasPrefix(out, "killed") {
		t.Fatalf("vgpu-agent did not die at failpoint %s: %v\n%s", afterCreate, err, out)
	}
	if s := mdevState(t, at.ID.String()); !s.Mdev || s.Live || s.Config {
		t.Fatalf("after the kill between create and attach: %+v, want the mdev in the kernel only", s)
	}
	return a, at, c
}

// TestAgentKilledAfterCreateResumes: vgpu-agent, killed with SIGKILL
// between creating an attach_vgpu's mdev (journaled) and attaching it, is
// started again: its recovery resumes the command, which has not expired,
// from the journal's next step — the same mdev, created once, is attached
// live to the running nested guest — and the bridge's command gets its
// result (succeeded, with both steps) over RabbitMQ.
func TestAgentKilledAfterCreateResumes(t *testing.T) {
	startGuest(t)
	a, at, c := killedAfterCreate(t, time.Now().Add(10*time.Minute))
	a.start() // no failpoint
	r := a.result(c)
	if r.Status != protocol.Succeeded {
		t.Fatalf("the resumed attach: %s %s %s", r.Status, r.Code, r.Message)
	}
	var det struct{ Steps []string }
	if err := json.Unmarshal(r.Details, &det); err != nil || !slices.Equal(det.Steps, []string{"mdev_created", "attached"}) {
		t.Errorf("the resumed attach's steps: %s, want mdev_created (before the kill) and attached", r.Details)
	}
	expectInGuest(t, at, "after the recovery")
	a.releaseLeavesNothing(at)
}

// TestAgentKilledAfterCreateExpiredRollsBack: the same kill, but the agent
// is back only after the command expired: its recovery rolls the command
// back as the journal says — the mdev it created is removed, nothing is
// attached — and the bridge's command gets its result, failed with code
// interrupted, over RabbitMQ.
func TestAgentKilledAfterCreateExpiredRollsBack(t *testing.T) {
	expires := time.Now().Add(time.Minute)
	a, at, c := killedAfterCreate(t, expires)
	// Past expires_at and command_clock_skew (5 s) by the VM's own clock,
	// which under TCG need not keep this machine's time.
	for {
		out, err := vm(t, "date +%s")
		sec, perr := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		if err != nil || perr != nil {
			t.Fatalf("the VM's clock: %v %v\n%s", err, perr, out)
		}
		if sec > expires.Add(10*time.Second).Unix() {
			break
		}
		time.Sleep(5 * time.Second)
	}
	a.start()
	r := a.result(c)
	if r.Status != protocol.Failed || r.Code != protocol.CodeInterrupted {
		t.Fatalf("the expired attach after the restart: %s %s %s, want failed %s", r.Status, r.Code, r.Message, protocol.CodeInterrupted)
	}
	var det struct {
		RolledBack []string `json:"rolled_back"`
		Problems   []string `json:"rollback_problems"`
	}
	if err := json.Unmarshal(r.Details, &det); err != nil || !slices.Contains(det.RolledBack, "remove mdev "+at.ID.String()) ||
		len(det.Problems) > 0 {
		t.Errorf("the rollback's details: %s, want the mdev removed and no problem", r.Details)
	}
	if s := mdevState(t, at.ID.String()); s.Live || s.Config || s.Mdev {
		t.Fatalf("after the rollback: %+v, want nothing left", s)
	}
}
