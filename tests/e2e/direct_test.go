package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Scenarios 4 and 5: the direct path against the real Nova. The bridge
// claims the VGPU itself (on the instance's consumer in Placement) and has
// the host's agent create the mdev and attach it; Nova knows nothing of
// the device, and when Nova deletes the instance the bridge releases it.

const (
	directGPU    = "0000:3b:00.0"
	directTrait  = "CUSTOM_NVIDIA_232" // nvidia-232 = GRID T4-4Q, 4 per T4
	directType   = "nvidia-232"
	directSecret = "e2e-direct-webhook-secret-0123456789"
)

// directPolicy: every request goes the direct-live path; a deleted
// instance's vGPUs are released.
var directPolicy = testsvc.DirectPolicy(testsvc.RuleReleaseOnDelete)

// directWorld is one direct-path scenario: a compute host of its own in
// the shared Nova with a T4 child provider, the host's agent, and an
// in-process bridge on its own database, listening to Nova's vhost.
type directWorld struct {
	t      *testing.T
	ctx    context.Context
	n      *novaharness.Nova
	host   string
	root   string // compute node provider
	gpu    string // T4 child provider
	api    *apiclient.Client
	pool   *pgxpool.Pool
	flavor string // 2 vCPU, 2 GiB, 10 GB, no vGPU
	policy string // the bridge's rules (directPolicy unless set)
}

func newDirectWorld(t *testing.T, prefix string) *directWorld {
	t.Helper()
	return newDirectWorldWith(t, prefix, directPolicy)
}

// newDirectWorldWith is newDirectWorld with the bridge's policy and extra
// overrides (section.option=value).
func newDirectWorldWith(t *testing.T, prefix, policy string, extra ...string) *directWorld {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &directWorld{t: t, ctx: ctx, n: sharedNova(t)}
	w.host = w.n.AddHost(t, prefix)
	w.root = w.n.ComputeNodeProvider(t, w.host)
	w.gpu = w.n.AddVGPUChild(t, w.host, directGPU, directTrait, 4)
	w.flavor = w.n.CreateFlavor(t, prefix+".small", 2, 2048, 10, nil)
	w.n.StartAgent(t, w.host)
	w.policy = policy
	w.startBridge(extra...)
	return w
}

// startBridge starts the world's in-process bridge on a database of its
// own, with the direct policy and extra overrides (section.option=value).
func (w *directWorld) startBridge(extra ...string) {
	t := w.t
	t.Helper()
	dir := t.TempDir()
	rules := filepath.Join(dir, "policy.yaml")
	secretFile := filepath.Join(dir, "webhook.secret")
	ini := filepath.Join(dir, "bridge.conf")
	testsvc.Must(t, os.WriteFile(rules, []byte(cmp.Or(w.policy, directPolicy)), 0o600), "policy")
	testsvc.Must(t, os.WriteFile(secretFile, []byte(directSecret+"\n"), 0o600), "secret")
	testsvc.Must(t, os.WriteFile(ini, []byte("[webhook_source:e2e]\nauth = hmac\nsecret_files = "+secretFile+
		"\nrate = 100\nburst = 100\n"), 0o600), "bridge.conf")
	dbURL := testsvc.Postgres(t)
	v, err := bridge.LoadConfig(conf.Source{File: ini, Overrides: testbridge.Overrides(t, dbURL, append([]string{
		"DEFAULT.transport_url=" + w.n.TransportURL(), // Nova's vhost: its notifications, the agent's queues
		"policy.rules_file=" + rules,
		"pipeline.poll_interval=50ms",
		"placement.sync_interval=5s",
	}, extra...)...)})
	testsvc.Must(t, err, "bridge configuration")
	d := testbridge.Start(t, v)
	w.pool = d.Pool
	w.api = apiclient.New(apiclient.Config{URL: "http://" + d.API.Addr(), Token: testbridge.AdminToken, Timeout: 30 * time.Second})
}

// bootServer boots a server without vGPU on the world's host and waits
// until Nova has it ACTIVE and the bridge knows it there (from Nova's
// notifications).
func (w *directWorld) bootServer(name string) string {
	t := w.t
	t.Helper()
	id := w.n.CreateServer(t, name, w.flavor, w.host)
	w.n.WaitServer(t, id, "ACTIVE")
	w.waitFor(2*time.Minute, "the bridge knows "+id+" on "+w.host, func() bool {
		in, err := w.api.Instance(w.ctx, id)
		return err == nil && in.Host != nil && *in.Host == w.host
	})
	return id
}

// gpuRequest sends a signed GPU_REQUEST webhook and returns the request id.
func (w *directWorld) gpuRequest(vm, profile string) string {
	w.t.Helper()
	body, _ := json.Marshal(map[string]any{"type": "GPU_REQUEST", "vm_id": vm, "workload": "training", "vgpu_profile": profile, "count": 1,
		"nonce": uuid.NewString()}) // a signed body acts once
	a, err := w.api.SendWebhook(w.ctx, "e2e", body, apiclient.WebhookAuth{Scheme: apiclient.SchemeHub, Key: []byte(directSecret),
		IdempotencyKey: apiclient.NewIdempotencyKey()})
	testsvc.Must(w.t, err, "GPU_REQUEST webhook")
	if a.RequestID == "" {
		w.t.Fatalf("webhook answer without a request id: %+v", a)
	}
	return a.RequestID
}

// waitFinal waits (3 min at most) until the request is final.
func (w *directWorld) waitFinal(id string) apiclient.Request {
	w.t.Helper()
	var r apiclient.Request
	w.waitFor(3*time.Minute, "request "+id+" to end", func() bool {
		var err error
		r, err = w.api.Request(w.ctx, id)
		testsvc.Must(w.t, err, "get request")
		return r.State == "succeeded" || r.State == "failed" || r.State == "rejected"
	})
	return r
}

func (w *directWorld) waitFor(within time.Duration, what string, ok func() bool) {
	w.t.Helper()
	waitFor(w.t, within, what, ok)
}

// attachDirect is scenario 4's request: a T4-4Q for vm on the direct
// path, asserted in the bridge, Placement, the host and Nova. It returns
// the mdev attached.
func (w *directWorld) attachDirect(vm string) string {
	t := w.t
	t.Helper()
	before := w.n.Allocations(t, vm)
	id := w.gpuRequest(vm, "T4-4Q")
	r := w.waitFinal(id)
	if r.State != "succeeded" {
		t.Fatalf("request %s: %s/%s (%s): %s", id, r.State, r.Phase, r.Code, r.Reason)
	}

	// Placement: the claim sits on the T4 of the VM's own host, on the
	// instance's consumer, next to Nova's own allocations, which are
	// unchanged.
	al := w.n.Allocations(t, vm)
	if al[w.gpu]["VGPU"] != 1 {
		t.Errorf("VGPU on the T4 provider = %d, want 1 (allocations %v)", al[w.gpu]["VGPU"], al)
	}
	for class, amount := range before[w.root] {
		if al[w.root][class] != amount {
			t.Errorf("compute node %s changed: %d → %d", class, amount, al[w.root][class])
		}
	}
	if len(al) != 2 {
		t.Errorf("allocations on %d providers, want the compute node and the T4: %v", len(al), al)
	}

	// The host: one mdev of the type, on that T4, live in the running
	// domain; it is the agent's, not one Nova's driver made.
	fh := w.n.FakeHost(w.host)
	dom, ok := fh.Domain(t, vm)
	if !ok {
		t.Fatalf("no domain for %s on %s", vm, w.host)
	}
	mdevs := dom.Mdevs()
	if len(mdevs) != 1 || dom.State != "running" {
		t.Fatalf("domain %s is %s with mdevs %v, want running with one", dom.Name, dom.State, mdevs)
	}
	if !slices.ContainsFunc(dom.Hostdevs, func(h libvirt.Hostdev) bool { return h.MdevUUID == mdevs[0] && h.Live }) {
		t.Errorf("mdev %s is not live in the domain: %+v", mdevs[0], dom.Hostdevs)
	}
	if m := fh.Mdevs(t)[mdevs[0]]; m.Type != directType || m.Parent != directGPU {
		t.Errorf("mdev %s is %+v, want %s on %s", mdevs[0], m, directType, directGPU)
	}
	if own := fh.NovaMdevs(vm); len(own) != 0 {
		t.Errorf("Nova's driver made mdevs %v for %s; the direct path should not involve it", own, vm)
	}

	// Nova: the server runs on, on its flavor, untouched.
	s := w.n.Server(t, vm)
	if s.Status != "ACTIVE" || s.TaskState != "" || s.Host != w.host || s.Flavor.ExtraSpecs["resources:VGPU"] != "" {
		t.Errorf("server %s: %s (task %q) on %s with flavor %+v; want ACTIVE on %s, flavor without vGPU", vm, s.Status, s.TaskState,
			s.Host, s.Flavor, w.host)
	}

	// The bridge: it records the claim as the instance's, on that GPU.
	al2, err := w.api.Allocations(w.ctx, vm)
	testsvc.Must(t, err, "bridge allocations")
	if len(al2.Allocations) != 1 || al2.Allocations[0].ProviderUUID != w.gpu || al2.Allocations[0].Amount != 1 ||
		al2.Allocations[0].Host != w.host || al2.Allocations[0].PCIAddress != directGPU {
		t.Errorf("the bridge's allocations of %s: %+v, want VGPU 1 on %s (%s %s)", vm, al2.Allocations, w.gpu, w.host, directGPU)
	}
	return mdevs[0]
}

// TestDirectAttachOnHost is scenario 4: a signed GPU_REQUEST for a VM
// whose policy path is direct-live → the bridge claims VGPU on a GPU of
// the VM's host in Placement, the host's agent creates the mdev and
// attaches it → succeeded; Placement shows the claim, Nova the server
// unchanged.
func TestDirectAttachOnHost(t *testing.T) {
	w := newDirectWorld(t, "direct")
	vm := w.bootServer("e2e-direct")
	w.attachDirect(vm)
	w.n.DeleteServer(t, vm)
}

// TestDeleteReleases is scenario 5: after a direct attach, deleting the
// instance in Nova releases everything: Nova drops the instance's
// allocations (the bridge's VGPU claim with them) and its domain, and on
// instance.delete.end the bridge removes the mdev its agent made and ends
// the release request succeeded.
func TestDeleteReleases(t *testing.T) {
	w := newDirectWorld(t, "delete")
	vm := w.bootServer("e2e-delete")
	mdev := w.attachDirect(vm)
	fh := w.n.FakeHost(w.host)

	w.n.DeleteServer(t, vm)
	if _, ok := fh.Domain(t, vm); ok {
		t.Errorf("the domain of the deleted server is still defined")
	}

	// The bridge's release, triggered by instance.delete.end.
	var rel apiclient.Request
	w.waitFor(2*time.Minute, "the bridge's request for instance.delete.end of "+vm, func() bool {
		l, err := w.api.Requests(w.ctx, apiclient.RequestFilter{InstanceUUID: vm})
		testsvc.Must(t, err, "list requests")
		for _, r := range l.Requests {
			if r.Kind != "GPU_REQUEST" {
				rel = r
				return true
			}
		}
		return false
	})
	if r := w.waitFinal(rel.ID); r.State != "succeeded" {
		t.Fatalf("release request %s (%s): %s/%s (%s): %s", r.ID, r.Kind, r.State, r.Phase, r.Code, r.Reason)
	}

	// The host: the mdev is gone; Placement: no claim left, the T4 free.
	if m, ok := fh.Mdevs(t)[mdev]; ok {
		t.Errorf("mdev %s (%+v) still exists after the release", mdev, m)
	}
	if al := w.n.Allocations(t, vm); len(al) != 0 {
		t.Errorf("allocations of the deleted instance: %v", al)
	}
	if u := w.n.Usages(t, w.gpu); u["VGPU"] != 0 {
		t.Errorf("VGPU used on the T4 provider after the release: %d", u["VGPU"])
	}
	// The bridge: the instance is deleted, its attachment released.
	if in, err := w.api.Instance(w.ctx, vm); err != nil || in.DeletedAt == nil {
		t.Errorf("the bridge's instance %s: %+v (%v), want it deleted", vm, in, err)
	}
	var states []string
	rows, err := w.pool.Query(w.ctx, `SELECT state FROM vgpu_attachments WHERE instance_uuid = $1`, vm)
	testsvc.Must(t, err, "attachments")
	for rows.Next() {
		var st string
		testsvc.Must(t, rows.Scan(&st), "attachment")
		states = append(states, st)
	}
	rows.Close()
	if len(states) != 1 || states[0] != "released" {
		t.Errorf("the bridge's attachments of %s: %v, want one released", vm, states)
	}
	// Its Placement mirror (GET /v1/allocations) drops the claim at the
	// latest with the next incremental sync (placement.sync_interval=5s
	// here): Nova had deleted the consumer's allocations before the
	// release ran, so the release itself found nothing to write.
	w.waitFor(30*time.Second, "the bridge's Placement mirror to drop the claim of "+vm, func() bool {
		al, err := w.api.Allocations(w.ctx, vm)
		testsvc.Must(t, err, "bridge allocations")
		return len(al.Allocations) == 0
	})
}
