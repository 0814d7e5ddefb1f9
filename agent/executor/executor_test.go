package executor

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/journal"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/agent/sysfs"
)

const (
	host     = "compute-0012"
	dom1     = "8f0d4b5e-3c1a-4a59-9d43-6a2b7c1e0f11"
	mdev1    = "4b20d080-1b54-4048-85b3-a6a62d165c01"
	mdevNova = "0b7d4e2a-9f31-4c55-8a0b-000000000002"
	gpu0     = "0000:3b:00.0"
	t4q      = "nvidia-232"
)

var now = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

type env struct {
	t    *testing.T
	h    *fakeHost
	path string
	j    *journal.Journal
	e    *Executor
	now  time.Time
	hook func(protocol.Command, string)
}

func newEnv(t *testing.T) *env {
	h := newFakeHost()
	h.available[gpu0+"/"+t4q] = 4
	h.mdevs[mdevNova] = sysfs.Mdev{UUID: mdevNova, Parent: pci.MustParse(gpu0), Type: t4q}
	h.doms[dom1] = &Domain{UUID: dom1, Running: true}
	en := &env{t: t, h: h, path: filepath.Join(t.TempDir(), "journal"), now: now}
	en.open()
	return en
}

func (en *env) open() {
	en.t.Helper()
	j, err := journal.Open(en.path, journal.Options{Now: func() time.Time { return en.now }})
	if err != nil {
		en.t.Fatal(err)
	}
	en.j = j
	en.t.Cleanup(func() { j.Close() })
	e, err := New(Config{Host: host, Journal: j, Sysfs: en.h, Domains: en.h, GPUs: en.h, Limiter: en.h,
		Now: func() time.Time { return en.now }, AfterStep: func(c protocol.Command, s string) {
			if en.hook != nil {
				en.hook(c, s)
			}
		}})
	if err != nil {
		en.t.Fatal(err)
	}
	en.e = e
}

// crash simulates kill -9: the journal is dropped as is and reopened.
func (en *env) crash() {
	en.j.Close()
	en.hook = nil
	en.open()
}

func command(t *testing.T, id string, k protocol.Kind, params any) protocol.Command {
	t.Helper()
	c := protocol.Command{V: 1, ID: id, Kind: k, Host: host, InstanceUUID: dom1, IssuedAt: now, ExpiresAt: now.Add(5 * time.Minute)}
	if err := c.MarshalParams(params); err != nil {
		t.Fatal(err)
	}
	return c
}

func (en *env) exec(c protocol.Command) protocol.Result {
	return en.e.Execute(context.Background(), c)
}

func wantStatus(t *testing.T, r protocol.Result, st protocol.Status, code string) {
	t.Helper()
	if r.Status != st || r.Code != code {
		t.Fatalf("result = %s/%s (%s), want %s/%s", r.Status, r.Code, r.Message, st, code)
	}
}

func TestCreateMdevIdempotent(t *testing.T) {
	en := newEnv(t)
	c := command(t, "c1", protocol.CreateMdev, protocol.MdevParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q})
	r1 := en.exec(c)
	wantStatus(t, r1, protocol.Succeeded, "")
	r2 := en.exec(c) // duplicate delivery
	if !r2.FinishedAt.Equal(r1.FinishedAt) || r2.Status != r1.Status {
		t.Errorf("duplicate answered %+v, want the recorded %+v", r2, r1)
	}
	if n := en.h.count("create_mdev"); n != 1 {
		t.Errorf("CreateMdev called %d times", n)
	}
	if _, ok := en.j.Owned(journal.MdevKey(mdev1)); !ok {
		t.Error("created mdev not owned")
	}
	// A new command id for the same mdev: already there and ours → success, nothing done.
	wantStatus(t, en.exec(command(t, "c2", protocol.CreateMdev, protocol.MdevParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q})),
		protocol.Succeeded, "")
	if n := en.h.count("create_mdev"); n != 1 {
		t.Errorf("CreateMdev called %d times", n)
	}
}

func TestRefusals(t *testing.T) {
	en := newEnv(t)
	create := protocol.MdevParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q}
	other := command(t, "r1", protocol.CreateMdev, create)
	other.Host = "compute-0013"
	wantStatus(t, en.exec(other), protocol.Refused, protocol.CodeWrongHost)

	old := command(t, "r2", protocol.CreateMdev, create)
	old.ExpiresAt = now.Add(-time.Second)
	wantStatus(t, en.exec(old), protocol.Refused, protocol.CodeExpired)

	bad := command(t, "r3", protocol.CreateMdev, protocol.MdevParams{MdevUUID: "x"})
	wantStatus(t, en.exec(bad), protocol.Refused, protocol.CodeInvalidCommand)

	nova := command(t, "r4", protocol.RemoveMdev, protocol.MdevParams{MdevUUID: mdevNova})
	r := en.exec(nova)
	wantStatus(t, r, protocol.Refused, protocol.CodeNotOwned)
	if r.Remediation == "" {
		t.Error("no remediation")
	}
	createNova := command(t, "r5", protocol.CreateMdev, protocol.MdevParams{MdevUUID: mdevNova, ParentPCI: gpu0, TypeID: t4q})
	wantStatus(t, en.exec(createNova), protocol.Failed, string(hosterr.Exists))

	if ops := en.h.opList(); len(ops) != 0 {
		t.Errorf("refused commands touched the host: %v", ops)
	}
	if _, ok := en.h.mdevs[mdevNova]; !ok {
		t.Error("Nova's mdev removed")
	}
	if _, ok := en.j.Lookup("r1"); ok {
		t.Error("wrong-host command journaled")
	}
}

func TestNotAllowed(t *testing.T) {
	en := newEnv(t)
	en.e.cfg.Allow = denyAll{}
	wantStatus(t, en.exec(command(t, "a", protocol.CreateMdev, protocol.MdevParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q})),
		protocol.Refused, protocol.CodeNotAllowed)
	wantStatus(t, en.exec(command(t, "b", protocol.SetClocks, protocol.ClockParams{GPUPCI: gpu0, MemoryMHz: 1, SMMHz: 1})),
		protocol.Refused, protocol.CodeNotAllowed)
	if ops := en.h.opList(); len(ops) != 0 {
		t.Errorf("host touched: %v", ops)
	}
}

type denyAll struct{}

func (denyAll) AllowType(pci.Addr, string) bool { return false }
func (denyAll) AllowGPU(pci.Addr) bool          { return false }

func TestRemoveMdev(t *testing.T) {
	en := newEnv(t)
	wantStatus(t, en.exec(command(t, "c", protocol.CreateMdev, protocol.MdevParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q})), protocol.Succeeded, "")
	wantStatus(t, en.exec(command(t, "r", protocol.RemoveMdev, protocol.MdevParams{MdevUUID: mdev1})), protocol.Succeeded, "")
	if _, ok := en.h.mdevs[mdev1]; ok {
		t.Error("mdev still there")
	}
	if _, ok := en.j.Owned(journal.MdevKey(mdev1)); ok {
		t.Error("still owned")
	}
	// Removing again: no longer ours.
	wantStatus(t, en.exec(command(t, "r2", protocol.RemoveMdev, protocol.MdevParams{MdevUUID: mdev1})), protocol.Refused, protocol.CodeNotOwned)
}

// An mdev still attached to a running domain is not removed: the kernel
// would not refuse, the write would wait for QEMU to let the device go (and
// the agent with it). remove_mdev is refused with code in_use, nothing is
// touched; after the detach the same mdev is removed.
func TestRemoveMdevAttachedToRunningDomainRefused(t *testing.T) {
	en := newEnv(t)
	other := "3a1e0c55-7d7b-4f0e-8f43-2d9c1b7e0a22"
	en.h.doms[other] = &Domain{UUID: other, Running: true}
	wantStatus(t, en.exec(command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q,
		Mode: protocol.ModeLive})), protocol.Succeeded, "")
	for _, tc := range []struct {
		name, id, instance string
	}{
		{"the command's domain", "r1", dom1},
		{"no domain named", "r2", ""},
		{"another domain named", "r3", other}, // the bridge's view is stale: the host decides
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := command(t, tc.id, protocol.RemoveMdev, protocol.MdevParams{MdevUUID: mdev1})
			c.InstanceUUID = tc.instance
			r := en.exec(c)
			wantStatus(t, r, protocol.Refused, string(hosterr.InUse))
			if !strings.Contains(r.Message, dom1) || r.Remediation == "" {
				t.Errorf("refusal %q (remediation %q) does not name the domain %s or say what to do", r.Message, r.Remediation, dom1)
			}
		})
	}
	if n := en.h.count("remove_mdev"); n != 0 {
		t.Errorf("the kernel was asked to remove the attached mdev %d times", n)
	}
	if _, ok := en.h.mdevs[mdev1]; !ok {
		t.Error("mdev gone")
	}
	if h, ok := en.h.doms[dom1].Has(Hostdev{MdevUUID: mdev1}); !ok || !h.Live {
		t.Errorf("guest lost its vGPU: %+v", en.h.doms[dom1])
	}
	if _, ok := en.j.Owned(journal.MdevKey(mdev1)); !ok {
		t.Error("refused remove released the mdev from the journal")
	}
	wantStatus(t, en.exec(command(t, "d", protocol.DetachVGPU, protocol.AttachParams{MdevUUID: mdev1, Mode: protocol.ModeLive})),
		protocol.Succeeded, "")
	wantStatus(t, en.exec(command(t, "r4", protocol.RemoveMdev, protocol.MdevParams{MdevUUID: mdev1})), protocol.Succeeded, "")
	if _, ok := en.h.mdevs[mdev1]; ok {
		t.Error("mdev still there after detach and remove")
	}
}

// In a domain's persistent definition only (the domain is shut off), the
// mdev is no QEMU's: removing it is not refused.
func TestRemoveMdevOfStoppedDomainConfig(t *testing.T) {
	en := newEnv(t)
	wantStatus(t, en.exec(command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q,
		Mode: protocol.ModeConfig})), protocol.Succeeded, "")
	wantStatus(t, en.exec(command(t, "r", protocol.RemoveMdev, protocol.MdevParams{MdevUUID: mdev1})), protocol.Succeeded, "")
}

// A live detach from a domain that no longer exists (Nova destroyed the
// guest an evacuation left on the host) has nothing to detach: it
// succeeds, and the mdev can be removed.
func TestDetachFromGoneDomain(t *testing.T) {
	en := newEnv(t)
	wantStatus(t, en.exec(command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q,
		Mode: protocol.ModeLive})), protocol.Succeeded, "")
	en.h.mu.Lock()
	delete(en.h.doms, dom1)
	en.h.mu.Unlock()
	wantStatus(t, en.exec(command(t, "d", protocol.DetachVGPU, protocol.AttachParams{MdevUUID: mdev1, Mode: protocol.ModeLive})),
		protocol.Succeeded, "")
	wantStatus(t, en.exec(command(t, "r", protocol.RemoveMdev, protocol.MdevParams{MdevUUID: mdev1})), protocol.Succeeded, "")
	if _, ok := en.h.mdevs[mdev1]; ok {
		t.Error("mdev still there after detach and remove")
	}
}

func TestAttachModes(t *testing.T) {
	for _, mode := range []string{protocol.ModeLive, protocol.ModeConfig, protocol.ModeCold} {
		t.Run(mode, func(t *testing.T) {
			en := newEnv(t)
			r := en.exec(command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q, Mode: mode}))
			wantStatus(t, r, protocol.Succeeded, "")
			d := en.h.doms[dom1]
			h, ok := d.Has(Hostdev{MdevUUID: mdev1})
			if !ok || !h.Config || h.Live != (mode != protocol.ModeConfig) || !d.Running {
				t.Errorf("domain after %s attach: %+v", mode, d)
			}
			want := map[string][]string{
				protocol.ModeLive:   {"create_mdev " + mdev1, "attach_live mdev " + mdev1},
				protocol.ModeConfig: {"create_mdev " + mdev1, "define mdev " + mdev1},
				protocol.ModeCold:   {"create_mdev " + mdev1, "shutdown " + dom1, "define mdev " + mdev1, "start " + dom1},
			}[mode]
			if got := en.h.opList(); !slices.Equal(got, want) {
				t.Errorf("ops = %q, want %q", got, want)
			}
			var det struct{ Steps []string }
			json.Unmarshal(r.Details, &det)
			if len(det.Steps) == 0 || det.Steps[0] != stepMdevCreated {
				t.Errorf("details = %s", r.Details)
			}
			// Detach the same way.
			wantStatus(t, en.exec(command(t, "d", protocol.DetachVGPU, protocol.AttachParams{MdevUUID: mdev1, Mode: mode})), protocol.Succeeded, "")
			if _, ok := en.h.doms[dom1].Has(Hostdev{MdevUUID: mdev1}); ok {
				t.Errorf("still attached after %s detach: %+v", mode, en.h.doms[dom1])
			}
		})
	}
}

func TestAttachLiveFailureRollsBackCreatedMdev(t *testing.T) {
	en := newEnv(t)
	en.h.errs["attach_live"] = hosterr.Errorf(hosterr.VFIOUnavailable, "attach live",
		"Mediated host device assignment requires VFIO support")
	r := en.exec(command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q, Mode: protocol.ModeLive}))
	wantStatus(t, r, protocol.Failed, string(hosterr.VFIOUnavailable))
	if r.NvidiaCode != 62 || r.Remediation == "" {
		t.Errorf("nvidia_code %d remediation %q", r.NvidiaCode, r.Remediation)
	}
	if _, ok := en.h.mdevs[mdev1]; ok {
		t.Error("created mdev left behind")
	}
	if _, ok := en.j.Owned(journal.MdevKey(mdev1)); ok {
		t.Error("rolled-back mdev still owned")
	}
}

// The frame-rate limiter is set in vgpu_params after the device exists and
// before the VM opens it; a device whose driver takes no parameters fails
// the attach and the device this command created goes away again.
func TestAttachFrameRateLimit(t *testing.T) {
	off, on := false, true
	for _, tc := range []struct {
		name string
		frl  *bool
		err  error
		want []string
	}{
		{"off", &off, nil, []string{"create_mdev " + mdev1, "set_vgpu_params " + mdev1 + " frame_rate_limiter=0", "attach_live mdev " + mdev1}},
		{"on", &on, nil, []string{"create_mdev " + mdev1, "set_vgpu_params " + mdev1 + " frame_rate_limiter=1", "attach_live mdev " + mdev1}},
		{"unset", nil, nil, []string{"create_mdev " + mdev1, "attach_live mdev " + mdev1}},
		{"unsupported", &off, hosterr.Errorf(hosterr.Unsupported, "set vgpu_params", "no vgpu_params"),
			[]string{"create_mdev " + mdev1, "set_vgpu_params " + mdev1 + " frame_rate_limiter=0", "remove_mdev " + mdev1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			en := newEnv(t)
			if tc.err != nil {
				en.h.errs["set_vgpu_params"] = tc.err
			}
			r := en.exec(command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q,
				Mode: protocol.ModeLive, FrameRateLimit: tc.frl}))
			if tc.err != nil {
				wantStatus(t, r, protocol.Failed, string(hosterr.Unsupported))
			} else {
				wantStatus(t, r, protocol.Succeeded, "")
			}
			if got := en.h.opList(); !slices.Equal(got, tc.want) {
				t.Errorf("ops = %q, want %q", got, tc.want)
			}
			var det struct {
				VGPUParams string `json:"vgpu_params"`
			}
			json.Unmarshal(r.Details, &det)
			if tc.frl != nil && det.VGPUParams != protocol.VGPUParams(*tc.frl) {
				t.Errorf("details = %s", r.Details)
			}
		})
	}
}

func TestNoCapacity(t *testing.T) {
	en := newEnv(t)
	en.h.available[gpu0+"/"+t4q] = 0
	r := en.exec(command(t, "a", protocol.CreateMdev, protocol.MdevParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q}))
	wantStatus(t, r, protocol.Failed, string(hosterr.NoCapacity))
	if r.NvidiaCode != 48 {
		t.Errorf("nvidia_code = %d", r.NvidiaCode)
	}
	if _, ok := en.j.Owned(journal.MdevKey(mdev1)); ok {
		t.Error("failed create left an owned device")
	}
}

func TestLiveAttachToStoppedDomain(t *testing.T) {
	en := newEnv(t)
	en.h.doms[dom1].Running = false
	r := en.exec(command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdevNova, Mode: protocol.ModeLive}))
	wantStatus(t, r, protocol.Failed, string(hosterr.DomainNotRunning))
	// Cold on a stopped domain defines it and leaves it stopped.
	r = en.exec(command(t, "b", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdevNova, Mode: protocol.ModeCold}))
	wantStatus(t, r, protocol.Succeeded, "")
	if en.h.doms[dom1].Running || en.h.count("shutdown") != 0 || en.h.count("start") != 0 {
		t.Errorf("cold attach on a stopped domain: %v", en.h.opList())
	}
}

// crashAt makes the hook stop the command after step, as kill -9 would.
type crashed struct{}

func (en *env) crashAfter(step string) {
	en.hook = func(_ protocol.Command, s string) {
		if s == step {
			panic(crashed{})
		}
	}
}

func (en *env) execCrashing(c protocol.Command) {
	en.t.Helper()
	defer func() {
		if v := recover(); v != (crashed{}) {
			en.t.Fatalf("did not crash: %v", v)
		}
	}()
	en.exec(c)
}

func TestCrashBetweenCreateAndAttachCompletesOnce(t *testing.T) {
	en := newEnv(t)
	c := command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q, Mode: protocol.ModeLive})
	en.crashAfter(stepMdevCreated)
	en.execCrashing(c)
	en.crash()
	res := en.e.Recover(context.Background())
	if len(res) != 1 {
		t.Fatalf("recovered %d", len(res))
	}
	wantStatus(t, res[0], protocol.Succeeded, "")
	// The redelivered command gets the recorded answer.
	if r := en.exec(c); r.FinishedAt != res[0].FinishedAt {
		t.Errorf("redelivery answered %+v", r)
	}
	if n, m := en.h.count("create_mdev"), en.h.count("attach_live"); n != 1 || m != 1 {
		t.Errorf("create_mdev %d, attach_live %d; want 1 and 1 (%v)", n, m, en.h.opList())
	}
}

func TestCrashBeforeStepRecordDoesNotRepeat(t *testing.T) {
	// A crash after the kernel made the mdev but before the step was
	// journaled: the restart finds it and does not create it again.
	en := newEnv(t)
	c := command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q, Mode: protocol.ModeConfig})
	en.h.errs["define"] = errors.New("boom")
	en.crashAfter(stepMdevCreated)
	en.execCrashing(c)
	// Forget the step record: as if the process died just before it.
	en.j.Close()
	en.h.errs = map[string]error{}
	en.open()
	res := en.e.Recover(context.Background())
	wantStatus(t, res[0], protocol.Succeeded, "")
	if n := en.h.count("create_mdev"); n != 1 {
		t.Errorf("create_mdev %d", n)
	}
}

func TestExpiredInterruptedCommandRollsBack(t *testing.T) {
	en := newEnv(t)
	c := command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q, Mode: protocol.ModeCold})
	en.crashAfter(stepDefined)
	en.execCrashing(c)
	en.crash()
	en.now = now.Add(time.Hour)
	res := en.e.Recover(context.Background())
	wantStatus(t, res[0], protocol.Failed, protocol.CodeInterrupted)
	d := en.h.doms[dom1]
	if _, ok := d.Has(Hostdev{MdevUUID: mdev1}); ok || !d.Running {
		t.Errorf("domain after rollback: %+v", d)
	}
	if _, ok := en.h.mdevs[mdev1]; ok {
		t.Error("mdev not removed")
	}
	if len(en.j.Pending()) != 0 || len(en.j.Devices()) != 0 {
		t.Errorf("journal after rollback: pending %v devices %v", en.j.Pending(), en.j.Devices())
	}
}

// An expired attach interrupted after the hot-plug is rolled back; when the
// guest does not give the device back (the detach fails), the mdev is left
// in the guest and in the journal instead of being removed under it.
func TestRollbackLeavesMdevTheGuestHolds(t *testing.T) {
	en := newEnv(t)
	c := command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q, Mode: protocol.ModeLive})
	en.crashAfter(stepAttached)
	en.execCrashing(c)
	en.crash()
	en.now = now.Add(time.Hour)
	en.h.errs["detach_live"] = hosterr.Errorf(hosterr.Timeout, "detach live", "the guest has not released the device")
	res := en.e.Recover(context.Background())
	wantStatus(t, res[0], protocol.Failed, protocol.CodeInterrupted)
	var det struct {
		Problems []string `json:"rollback_problems"`
	}
	if err := json.Unmarshal(res[0].Details, &det); err != nil || !slices.ContainsFunc(det.Problems, func(p string) bool {
		return strings.Contains(p, "remove mdev "+mdev1) && strings.Contains(p, dom1)
	}) {
		t.Errorf("rollback problems %v (%s), want the mdev left because %s holds it", det.Problems, res[0].Details, dom1)
	}
	if n := en.h.count("remove_mdev"); n != 0 {
		t.Errorf("remove_mdev called %d times on an mdev the guest holds", n)
	}
	if _, ok := en.h.mdevs[mdev1]; !ok {
		t.Error("mdev removed under the guest")
	}
	if _, ok := en.j.Owned(journal.MdevKey(mdev1)); !ok {
		t.Error("mdev left in the guest is no longer in the journal")
	}
}

func TestReconcileRecreatesOwnedOnly(t *testing.T) {
	en := newEnv(t)
	wantStatus(t, en.exec(command(t, "c", protocol.CreateMdev, protocol.MdevParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q})), protocol.Succeeded, "")
	// Reboot: every mdev is gone.
	en.h.mdevs = map[string]sysfs.Mdev{}
	en.h.available[gpu0+"/"+t4q] = 4
	en.crash()
	rec, err := en.e.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rec.Recreated, []string{journal.MdevKey(mdev1)}) {
		t.Errorf("reconcile = %+v", rec)
	}
	if _, ok := en.h.mdevs[mdev1]; !ok {
		t.Error("owned mdev not recreated")
	}
	if _, ok := en.h.mdevs[mdevNova]; ok {
		t.Error("Nova's mdev recreated")
	}
	rec, _ = en.e.Reconcile(context.Background())
	if len(rec.Recreated) != 0 || len(rec.Present) != 1 {
		t.Errorf("second reconcile = %+v", rec)
	}
}

func TestVendorVFIO(t *testing.T) {
	en := newEnv(t)
	vf := pci.MustParse("0000:41:00.4")
	en.h.vfs[vf] = &sysfs.VF{Addr: vf, PhysFn: pci.MustParse("0000:41:00.0"), Creatable: []sysfs.VFType{{ID: "1428"}}}
	r := en.exec(command(t, "c", protocol.AttachVGPU, protocol.AttachParams{ParentPCI: vf.String(), TypeID: "1428", VendorVFIO: true, Mode: protocol.ModeLive}))
	wantStatus(t, r, protocol.Succeeded, "")
	if en.h.vfs[vf].Current != "1428" {
		t.Error("vf type not set")
	}
	if _, ok := en.h.doms[dom1].Has(Hostdev{PCI: vf}); !ok {
		t.Error("vf not attached")
	}
	wantStatus(t, en.exec(command(t, "v", protocol.VerifyVGPU, protocol.VerifyParams{TypeID: "1428"})), protocol.Succeeded, "")
	// Reboot clears the VF; reconcile sets it again.
	en.h.vfs[vf].Current = ""
	if rec, _ := en.e.Reconcile(context.Background()); len(rec.Recreated) != 1 || en.h.vfs[vf].Current != "1428" {
		t.Errorf("reconcile = %+v", rec)
	}
	wantStatus(t, en.exec(command(t, "d", protocol.DetachVGPU, protocol.AttachParams{ParentPCI: vf.String(), VendorVFIO: true, Mode: protocol.ModeLive})), protocol.Succeeded, "")
	wantStatus(t, en.exec(command(t, "r", protocol.RemoveMdev, protocol.MdevParams{ParentPCI: vf.String(), VendorVFIO: true})), protocol.Succeeded, "")
	if en.h.vfs[vf].Current != "" {
		t.Error("vf type not cleared")
	}
}

// TestVendorVFIOLateReleaseOfEarlierOwner: a VF released by vGPU A and
// typed again for vGPU B (here in the same domain) is left alone by A's
// release delivered late with new command ids: the detach does nothing,
// the remove is refused not_owned and B's type stays.
func TestVendorVFIOLateReleaseOfEarlierOwner(t *testing.T) {
	en := newEnv(t)
	vf := pci.MustParse("0000:41:00.4")
	en.h.vfs[vf] = &sysfs.VF{Addr: vf, PhysFn: pci.MustParse("0000:41:00.0"), Creatable: []sysfs.VFType{{ID: "1428"}}}
	const ownerA, ownerB = "7f0c4a52-0000-4000-8000-00000000000a", "7f0c4a52-0000-4000-8000-00000000000b"
	attach := func(id, owner string) protocol.Command {
		return command(t, id, protocol.AttachVGPU, protocol.AttachParams{MdevUUID: owner, ParentPCI: vf.String(), TypeID: "1428", VendorVFIO: true, Mode: protocol.ModeLive})
	}
	detach := func(id, owner string) protocol.Command {
		return command(t, id, protocol.DetachVGPU, protocol.AttachParams{MdevUUID: owner, ParentPCI: vf.String(), VendorVFIO: true, Mode: protocol.ModeLive})
	}
	remove := func(id, owner string) protocol.Command {
		return command(t, id, protocol.RemoveMdev, protocol.MdevParams{MdevUUID: owner, ParentPCI: vf.String(), TypeID: "1428", VendorVFIO: true})
	}
	wantStatus(t, en.exec(attach("a1", ownerA)), protocol.Succeeded, "")
	wantStatus(t, en.exec(detach("a2", ownerA)), protocol.Succeeded, "")
	wantStatus(t, en.exec(remove("a3", ownerA)), protocol.Succeeded, "")
	wantStatus(t, en.exec(attach("b1", ownerB)), protocol.Succeeded, "")

	wantStatus(t, en.exec(detach("a2-late", ownerA)), protocol.Succeeded, "")
	if _, ok := en.h.doms[dom1].Has(Hostdev{PCI: vf}); !ok {
		t.Error("A's late detach detached B's VF")
	}
	wantStatus(t, en.exec(remove("a3-late", ownerA)), protocol.Refused, protocol.CodeNotOwned)
	if en.h.vfs[vf].Current != "1428" {
		t.Errorf("A's late remove cleared B's VF type (now %q)", en.h.vfs[vf].Current)
	}
	// B's own release still works.
	wantStatus(t, en.exec(detach("b2", ownerB)), protocol.Succeeded, "")
	wantStatus(t, en.exec(remove("b3", ownerB)), protocol.Succeeded, "")
	if en.h.vfs[vf].Current != "" {
		t.Error("B's release did not clear the VF type")
	}
}

func TestVerify(t *testing.T) {
	en := newEnv(t)
	v := command(t, "v1", protocol.VerifyVGPU, protocol.VerifyParams{TypeID: t4q})
	wantStatus(t, en.exec(v), protocol.Failed, protocol.CodeVerifyFailed)
	wantStatus(t, en.exec(command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q, Mode: protocol.ModeLive})), protocol.Succeeded, "")
	r := en.exec(command(t, "v2", protocol.VerifyVGPU, protocol.VerifyParams{TypeID: t4q, MdevUUID: mdev1}))
	wantStatus(t, r, protocol.Succeeded, "")
	wantStatus(t, en.exec(command(t, "v3", protocol.VerifyVGPU, protocol.VerifyParams{TypeID: "nvidia-233"})), protocol.Failed, protocol.CodeVerifyFailed)
	wantStatus(t, en.exec(command(t, "v4", protocol.VerifyVGPU, protocol.VerifyParams{TypeID: t4q, Count: 2})), protocol.Failed, protocol.CodeVerifyFailed)
}

func TestTuning(t *testing.T) {
	en := newEnv(t)
	wantStatus(t, en.exec(command(t, "s", protocol.SetVGPUScheduler, protocol.SchedulerParams{GPUPCI: gpu0, Policy: protocol.SchedFixedShare, TimesliceUs: 2000})), protocol.Succeeded, "")
	rc := en.exec(command(t, "c", protocol.SetClocks, protocol.ClockParams{GPUPCI: "00000000:3B:00.0", MemoryMHz: 5001, SMMHz: 1590}))
	wantStatus(t, rc, protocol.Succeeded, "")
	// The result carries what NVML read back after the change.
	if d := string(rc.Details); !strings.Contains(d, `"applied":{"changed":true,"app_sm_mhz":1590,"app_mem_mhz":5001}`) || !strings.Contains(d, `"verified":true`) {
		t.Errorf("set_clocks details = %s, want the read-back clocks, verified", d)
	}
	wantStatus(t, en.exec(command(t, "r", protocol.ResetClocks, protocol.ClockParams{GPUPCI: gpu0})), protocol.Succeeded, "")
	wantStatus(t, en.exec(command(t, "l", protocol.SetVMLimits, protocol.LimitParams{CPUMax: "200000 100000"})), protocol.Succeeded, "")
	want := []string{"scheduler 0000:3b:00.0 fixed_share 2000", "clocks 0000:3b:00.0 5001 1590", "reset_clocks 0000:3b:00.0",
		"limits " + dom1 + " 200000 100000"}
	if got := en.h.opList(); !slices.Equal(got, want) {
		t.Errorf("ops = %q, want %q", got, want)
	}
	en.e.cfg.GPUs = nil
	r := en.exec(command(t, "s2", protocol.SetVGPUScheduler, protocol.SchedulerParams{GPUPCI: gpu0, Policy: protocol.SchedBestEffort}))
	wantStatus(t, r, protocol.Failed, string(hosterr.NVMLUnavailable))
	wantStatus(t, en.exec(command(t, "d", protocol.CollectDiagnostics, nil)), protocol.Failed, string(hosterr.Unsupported))
}

func TestStoppingLeavesCommandPending(t *testing.T) {
	en := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	en.hook = func(protocol.Command, string) { cancel() }
	en.h.errs["attach_live"] = context.Canceled
	r := en.e.Execute(ctx, command(t, "a", protocol.AttachVGPU, protocol.AttachParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q, Mode: protocol.ModeLive}))
	if r.CommandID != "" {
		t.Fatalf("a cancelled command was answered: %+v", r)
	}
	if len(en.j.Pending()) != 1 {
		t.Error("not pending")
	}
}

// TestIDReusedForAnotherCommand: a delivery whose id the journal holds for
// a different command is refused, not answered with the recorded result;
// the same command re-signed or with new times is still a duplicate.
func TestIDReusedForAnotherCommand(t *testing.T) {
	en := newEnv(t)
	c := command(t, "u1", protocol.CreateMdev, protocol.MdevParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q})
	r1 := en.exec(c)
	wantStatus(t, r1, protocol.Succeeded, "")

	again := c
	again.KeyID, again.Sig, again.ExpiresAt = "bridge-2025b", "c2lnbmF0dXJl", c.ExpiresAt.Add(time.Minute)
	again.Params = json.RawMessage(" {\"type_id\": \"nvidia-232\", \"parent_pci\":\"0000:3b:00.0\",\"mdev_uuid\":\"" + mdev1 + "\"} ")
	if r := en.exec(again); !r.FinishedAt.Equal(r1.FinishedAt) || r.Status != protocol.Succeeded {
		t.Errorf("same command re-signed answered %+v, want the recorded %+v", r, r1)
	}
	forged := command(t, "u1", protocol.RemoveMdev, protocol.MdevParams{MdevUUID: mdev1})
	wantStatus(t, en.exec(forged), protocol.Refused, protocol.CodeIDReused)
	if n := en.h.count("remove_mdev"); n != 0 {
		t.Errorf("RemoveMdev called %d times", n)
	}
	if got := counterValue(en.e.refused.WithLabelValues(protocol.CodeIDReused)); got != 1 {
		t.Errorf("refused{reason=id_reused} = %v", got)
	}
	// A refusal's kind label is bounded whatever the message says.
	junk := command(t, "u2", protocol.Kind("rm -rf /"), nil)
	en.e.Refuse(junk, protocol.CodeBadSignature, "x")
	if got := counterValue(en.e.outcomes.WithLabelValues("unknown", "refused", protocol.CodeBadSignature)); got != 1 {
		t.Errorf("commands_total{kind=unknown} = %v", got)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestMIGBackedTypeRefused: a MIG-backed type is never created, on an mdev
// GPU or a VF, even when the allow-list lets everything through and the
// kernel would have capacity; nothing is created or owned.
func TestMIGBackedTypeRefused(t *testing.T) {
	en := newEnv(t)
	const mig = "nvidia-699"
	en.h.available[gpu0+"/"+mig] = 7
	en.h.names[gpu0+"/"+mig] = "GRID A100-1-5C"
	r := en.exec(command(t, "m", protocol.CreateMdev, protocol.MdevParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: mig}))
	wantStatus(t, r, protocol.Failed, string(hosterr.Unsupported))
	if !strings.Contains(r.Message, "MIG") {
		t.Errorf("message %q does not name MIG", r.Message)
	}
	if n := en.h.count("create_mdev"); n != 0 {
		t.Errorf("CreateMdev called %d times", n)
	}
	if _, ok := en.j.Owned(journal.MdevKey(mdev1)); ok {
		t.Error("refused create left an owned device")
	}

	vf := pci.MustParse("0000:41:00.4")
	en.h.vfs[vf] = &sysfs.VF{Addr: vf, PhysFn: pci.MustParse("0000:41:00.0"),
		Creatable: []sysfs.VFType{{ID: "1428", Name: "NVIDIA H100-1-10C"}}}
	r = en.exec(command(t, "v", protocol.AttachVGPU, protocol.AttachParams{ParentPCI: vf.String(), TypeID: "1428", VendorVFIO: true, Mode: protocol.ModeLive}))
	wantStatus(t, r, protocol.Failed, string(hosterr.Unsupported))
	if en.h.vfs[vf].Current != "" || en.h.count("set_vf_type") != 0 {
		t.Errorf("vf typed: current %q", en.h.vfs[vf].Current)
	}
	if _, ok := en.h.doms[dom1].Has(Hostdev{PCI: vf}); ok {
		t.Error("vf attached")
	}

	// A time-sliced type on the same GPU is still created.
	en.h.names[gpu0+"/"+t4q] = "GRID T4-4Q"
	wantStatus(t, en.exec(command(t, "t", protocol.CreateMdev, protocol.MdevParams{MdevUUID: mdev1, ParentPCI: gpu0, TypeID: t4q})), protocol.Succeeded, "")
}
