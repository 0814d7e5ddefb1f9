package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/agent/libvirt"
	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Profile changes (GPU_RESIZE), releases (GPU_RELEASE) and project quotas
// on the direct path against the real Nova: the bridge moves a VM's vGPU
// to another profile on a GPU of its own host (break before make), gives
// the old one back when the new one cannot be made, and admits exactly a
// project's quota of concurrent requests. Nova is never asked for
// anything: the server keeps its flavor and has no resize action.
//
// Each test boots its servers in a Nova project of its own (noauth2 token
// admin:<project>): the project's vGPU usage is the test's alone, and
// Nova's instance quota (10 per project) is not shared with the package's
// other tests. At the end its servers are deleted and its GPU providers
// removed from Placement, so that no later test's Nova scheduler (a Nova
// resize picks any host with the flavor's trait) lands on this test's
// GPUs.

// The fake host's two T4 (agent/fakehost.DefaultSpec).
const (
	elasticGPUA = "0000:3b:00.0"
	elasticGPUB = "0000:d8:00.0"
)

// elasticType is a T4 vGPU type (etc/vgpu-bridge/profiles.yaml). The types
// here are ones no Nova-path test's flavor asks for (see resize_test.go).
type elasticType struct {
	profile string // T4-1B
	id      string // nvidia-222
	max     int    // instances per T4
}

func (e elasticType) trait() string {
	return "CUSTOM_" + strings.ToUpper(strings.ReplaceAll(e.id, "-", "_"))
}

var (
	elasticFrom  = elasticType{"T4-1B", "nvidia-222", 16} // the profile attached first
	elasticTo    = elasticType{"T4-2B", "nvidia-223", 8}  // the profile it changes to
	elasticQuota = elasticType{"T4-1A", "nvidia-225", 16} // the quota test's
)

// elasticGPU is a GPU of the world's host in Placement, set to one type
// (a GPU holds one vGPU type; the bridge does not retype).
type elasticGPU struct {
	pci string
	typ elasticType
}

// elasticWorld is directWorld (one host of its own in the shared Nova, its
// agent and an in-process bridge) with GPUs of given types, a policy of the
// test's and servers in a Nova project of the test's.
type elasticWorld struct {
	*directWorld
	project    string
	apiURL     string // http://127.0.0.1:port of the bridge
	flavorName string
	gpus       map[string]string      // PCI address → GPU child provider
	types      map[string]elasticType // PCI address → its type

	mu      sync.Mutex
	servers []string
}

// newElasticWorld builds the world; policy gets the world's project id.
func newElasticWorld(t *testing.T, prefix string, policy func(project string) string, gpus ...elasticGPU) *elasticWorld {
	t.Helper()
	return newElasticWorldINI(t, prefix, policy, "", gpus...)
}

// newElasticWorldINI is newElasticWorld with more of the bridge's
// configuration file (sections of its own, e.g. another webhook source).
func newElasticWorldINI(t *testing.T, prefix string, policy func(project string) string, ini string, gpus ...elasticGPU) *elasticWorld {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &elasticWorld{directWorld: &directWorld{t: t, ctx: ctx, n: sharedNova(t)}, project: strings.ReplaceAll(uuid.NewString(), "-", ""),
		gpus: map[string]string{}, types: map[string]elasticType{}}
	w.host = w.n.AddHost(t, prefix)
	// Registered after AddHost and before the agent and the bridge start, so
	// it runs after they stopped and before the harness retires the host
	// (its compute must still run for Nova's API to delete the servers).
	t.Cleanup(w.cleanup)
	w.root = w.n.ComputeNodeProvider(t, w.host)
	for _, g := range gpus {
		w.gpus[g.pci] = w.n.AddVGPUChild(t, w.host, g.pci, g.typ.trait(), g.typ.max)
		w.types[g.pci] = g.typ
	}
	w.gpu = w.gpus[gpus[0].pci]
	w.flavorName = w.host + ".tiny"
	w.flavor = w.n.CreateFlavor(t, w.flavorName, 1, 512, 1, nil)
	w.n.StartAgent(t, w.host)

	dir := t.TempDir()
	rules := filepath.Join(dir, "policy.yaml")
	secretFile := filepath.Join(dir, "webhook.secret")
	iniFile := filepath.Join(dir, "bridge.conf")
	testsvc.Must(t, os.WriteFile(rules, []byte(policy(w.project)), 0o600), "policy")
	testsvc.Must(t, os.WriteFile(secretFile, []byte(directSecret+"\n"), 0o600), "secret")
	testsvc.Must(t, os.WriteFile(iniFile, []byte("[webhook_source:e2e]\nauth = hmac\nsecret_files = "+secretFile+
		"\nrate = 100\nburst = 100\n"+ini), 0o600), "bridge.conf")
	dbURL := testsvc.Postgres(t)
	v, err := bridge.LoadConfig(conf.Source{File: iniFile, Overrides: testbridge.Overrides(t, dbURL,
		"DEFAULT.transport_url="+w.n.TransportURL(), // Nova's vhost: its notifications, the agent's queues
		"policy.rules_file="+rules,
		"pipeline.poll_interval=50ms",
		"placement.sync_interval=5s",
	)})
	testsvc.Must(t, err, "bridge configuration")
	d := testbridge.Start(t, v)
	w.pool = d.Pool
	w.apiURL = "http://" + d.API.Addr()
	w.api = apiclient.New(apiclient.Config{URL: w.apiURL, Token: testbridge.AdminToken, Timeout: 30 * time.Second})
	return w
}

// nova calls the compute API with a noauth2 token (user:project).
func (w *elasticWorld) nova(ctx context.Context, method, path, token string, in, out any) error {
	return w.n.ComputeAs(ctx, method, path, token, in, out)
}

// placement calls the shared Placement as admin.
func (w *elasticWorld) placement(ctx context.Context, method, path string, in, out any) error {
	return w.n.PlacementCall(ctx, method, path, in, out)
}

// createServer asks Nova for a server of the world's flavor on its host,
// in its project, without waiting.
func (w *elasticWorld) createServer(name string) string {
	w.t.Helper()
	var out struct {
		Server struct{ ID string } `json:"server"`
	}
	err := w.nova(w.ctx, http.MethodPost, "/servers", "admin:"+w.project, map[string]any{"server": map[string]any{
		"name": name, "flavorRef": w.flavor, "imageRef": novaharness.ImageID, "networks": "none", "host": w.host}}, &out)
	testsvc.Must(w.t, err, "create server "+name+" in project "+w.project)
	w.mu.Lock()
	w.servers = append(w.servers, out.Server.ID)
	w.mu.Unlock()
	return out.Server.ID
}

// waitBooted waits until Nova has the server ACTIVE and the bridge knows
// it on the world's host, in the world's project (Nova's notifications).
func (w *elasticWorld) waitBooted(id string) {
	w.t.Helper()
	w.n.WaitServer(w.t, id, "ACTIVE")
	w.waitFor(2*time.Minute, "the bridge knows "+id+" on "+w.host+" in project "+w.project, func() bool {
		in, err := w.api.Instance(w.ctx, id)
		return err == nil && in.Host != nil && *in.Host == w.host && in.ProjectID != nil && *in.ProjectID == w.project
	})
}

// boot boots one server and waits for it (waitBooted).
func (w *elasticWorld) boot(name string) string {
	w.t.Helper()
	id := w.createServer(name)
	w.waitBooted(id)
	return id
}

// cleanup deletes the world's servers (Nova drops their allocations, the
// bridge's claims with them) and then the GPU providers the world added.
func (w *elasticWorld) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w.mu.Lock()
	servers := slices.Clone(w.servers)
	w.mu.Unlock()
	for _, s := range servers {
		if err := w.nova(ctx, http.MethodDelete, "/servers/"+s, "admin:admin", nil, nil); err != nil && !novaharness.IsNotFound(err) {
			w.t.Logf("cleanup: delete server %s: %v", s, err)
		}
	}
	for _, s := range servers {
		for {
			_, err := w.n.GetServer(ctx, s)
			if novaharness.IsNotFound(err) {
				break
			}
			if ctx.Err() != nil {
				w.t.Logf("cleanup: server %s not gone: %v", s, err)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for pci, rp := range w.gpus {
		if err := w.placement(ctx, http.MethodDelete, "/resource_providers/"+rp, nil, nil); err != nil && !novaharness.IsNotFound(err) {
			w.t.Logf("cleanup: delete GPU provider %s (%s): %v", rp, pci, err)
		}
	}
}

// send posts a signed native webhook for vm and returns the request id;
// fields are added to type and vm_id. It does not fail the test (for
// goroutines).
func (w *elasticWorld) send(kind, vm string, fields map[string]any) (string, error) {
	body := map[string]any{"type": kind, "vm_id": vm, "nonce": uuid.NewString()} // a signed body acts once
	maps.Copy(body, fields)
	b, _ := json.Marshal(body)
	a, err := w.api.SendWebhook(w.ctx, "e2e", b, apiclient.WebhookAuth{Scheme: apiclient.SchemeHub, Key: []byte(directSecret),
		IdempotencyKey: apiclient.NewIdempotencyKey()})
	if err != nil {
		return "", fmt.Errorf("%s webhook for %s: %w", kind, vm, err)
	}
	if a.RequestID == "" {
		return "", fmt.Errorf("%s webhook for %s: an answer without a request id: %+v", kind, vm, a)
	}
	return a.RequestID, nil
}

func (w *elasticWorld) mustSend(kind, vm string, fields map[string]any) string {
	w.t.Helper()
	id, err := w.send(kind, vm, fields)
	testsvc.Must(w.t, err, kind)
	return id
}

// transitions are the request's state changes as audit_log has them,
// "state/phase" (phase empty once final), oldest first, without repeats.
func (w *elasticWorld) transitions(id string) []string {
	w.t.Helper()
	rows, err := w.pool.Query(w.ctx, `SELECT detail->>'to', coalesce(detail->>'phase', '') FROM audit_log
		WHERE request_id = $1 AND action = 'transition' ORDER BY id`, id)
	testsvc.Must(w.t, err, "audit transitions")
	defer rows.Close()
	var out []string
	for rows.Next() {
		var to, phase string
		testsvc.Must(w.t, rows.Scan(&to, &phase), "audit transition")
		s := to + "/" + phase
		if len(out) == 0 || out[len(out)-1] != s {
			out = append(out, s)
		}
	}
	testsvc.Must(w.t, rows.Err(), "audit transitions")
	return out
}

// expectRequest waits for the request to end and checks its final state,
// code and the states and phases it went through.
func (w *elasticWorld) expectRequest(id, what, state, code string, phases ...string) apiclient.Request {
	w.t.Helper()
	r := w.waitFinal(id)
	if r.State != state || r.Code != code {
		w.t.Fatalf("%s: request %s ended %s/%s (%s): %s; want %s with code %q", what, id, r.State, r.Phase, r.Code, r.Reason, state, code)
	}
	if got := w.transitions(id); !slices.Equal(got, phases) {
		w.t.Errorf("%s: request %s went through %v, want %v", what, id, got, phases)
	}
	return r
}

// attachment is a row of the bridge's vgpu_attachments.
type attachment struct {
	ID, State, Profile, PCI, Provider string
}

func (w *elasticWorld) attachments(vm string) []attachment {
	w.t.Helper()
	rows, err := w.pool.Query(w.ctx, `SELECT id::text, state, coalesce(profile, ''), coalesce(pci_address, ''), coalesce(provider_uuid::text, '')
		FROM vgpu_attachments WHERE instance_uuid = $1 ORDER BY created_at, id`, vm)
	testsvc.Must(w.t, err, "attachments")
	defer rows.Close()
	var out []attachment
	for rows.Next() {
		var a attachment
		testsvc.Must(w.t, rows.Scan(&a.ID, &a.State, &a.Profile, &a.PCI, &a.Provider), "attachment")
		out = append(out, a)
	}
	testsvc.Must(w.t, rows.Err(), "attachments")
	return out
}

// novaActions counts Nova's record of the server's actions by name.
func (w *elasticWorld) novaActions(server string) map[string]int {
	w.t.Helper()
	var out struct {
		Actions []struct {
			Action string `json:"action"`
		} `json:"instanceActions"`
	}
	testsvc.Must(w.t, w.nova(w.ctx, http.MethodGet, "/servers/"+url.PathEscape(server)+"/os-instance-actions", "admin:admin", nil, &out),
		"instance actions of "+server)
	n := map[string]int{}
	for _, a := range out.Actions {
		n[a.Action]++
	}
	return n
}

// expectHeld checks, after a request of vm ended, that the VM holds one
// vGPU of the type of the GPU at pci — or none when pci is "" — and
// returns its mdev: in Placement (VGPU 1 on that GPU's provider and
// nothing on the others, Nova's own allocations on the compute node as in
// nodeBefore), on the fake host (one mdev of the type on that parent, live
// in the running domain; no other mdev on the host), in the bridge
// (GET /v1/allocations, one attached attachment whose id is the mdev's
// uuid) and in Nova (the server ACTIVE on its host and flavor, no action
// but its create).
func (w *elasticWorld) expectHeld(vm, pci string, nodeBefore map[string]int) string {
	t := w.t
	t.Helper()
	// Placement.
	al := w.n.Allocations(t, vm)
	if !maps.Equal(al[w.root], nodeBefore) {
		t.Errorf("Nova's allocations of %s on the compute node: %v, want them unchanged: %v", vm, al[w.root], nodeBefore)
	}
	for gpci, rp := range w.gpus {
		want := 0
		if gpci == pci {
			want = 1
		}
		if al[rp]["VGPU"] != want {
			t.Errorf("VGPU of %s on the GPU %s (%s): %d, want %d (allocations %v)", vm, gpci, w.types[gpci].profile, al[rp]["VGPU"], want, al)
		}
	}
	if wantProviders := map[bool]int{true: 1, false: 2}[pci == ""]; len(al) != wantProviders {
		t.Errorf("allocations of %s on %d providers, want %d: %v", vm, len(al), wantProviders, al)
	}

	// The host.
	fh := w.n.FakeHost(w.host)
	dom, ok := fh.Domain(t, vm)
	if !ok {
		t.Fatalf("no domain for %s on %s", vm, w.host)
	}
	if dom.State != "running" {
		t.Errorf("domain of %s is %s, want running", vm, dom.State)
	}
	mdevs := dom.Mdevs()
	all := fh.Mdevs(t)
	var mdev string
	if pci == "" {
		if len(mdevs) != 0 || len(all) != 0 {
			t.Errorf("after the release the domain of %s has mdevs %v and the host %v; want none", vm, mdevs, all)
		}
	} else {
		if len(mdevs) != 1 {
			t.Fatalf("domain of %s has mdevs %v (hostdevs %+v), want one", vm, mdevs, dom.Hostdevs)
		}
		mdev = mdevs[0]
		if !slices.ContainsFunc(dom.Hostdevs, func(h libvirt.Hostdev) bool { return h.MdevUUID == mdev && h.Live }) {
			t.Errorf("mdev %s is not live in the domain of %s: %+v", mdev, vm, dom.Hostdevs)
		}
		if m := all[mdev]; m.Type != w.types[pci].id || m.Parent != pci {
			t.Errorf("mdev %s is %+v, want %s on %s", mdev, m, w.types[pci].id, pci)
		}
		if len(all) != 1 {
			t.Errorf("the host has mdevs %v, want only %s", all, mdev)
		}
	}
	if own := fh.NovaMdevs(vm); len(own) != 0 {
		t.Errorf("Nova's driver made mdevs %v for %s; the direct path should not involve it", own, vm)
	}

	// The bridge.
	var attached []attachment
	for _, a := range w.attachments(vm) {
		if a.State == "attached" || a.State == "pending" || a.State == "releasing" {
			attached = append(attached, a)
		}
	}
	if pci == "" {
		if len(attached) != 0 {
			t.Errorf("the bridge's active attachments of %s after the release: %+v", vm, attached)
		}
		// The mirror follows Placement at its next sync (placement.sync_interval).
		w.waitFor(2*time.Minute, "the bridge's Placement mirror to drop the claim of "+vm, func() bool {
			l, err := w.api.Allocations(w.ctx, vm)
			testsvc.Must(t, err, "bridge allocations")
			return len(l.Allocations) == 0
		})
	} else {
		if len(attached) != 1 || attached[0].State != "attached" || attached[0].ID != mdev || attached[0].PCI != pci ||
			attached[0].Profile != w.types[pci].profile || attached[0].Provider != w.gpus[pci] {
			t.Errorf("the bridge's active attachments of %s: %+v, want one attached, mdev %s, %s on %s", vm, attached, mdev, w.types[pci].profile, pci)
		}
		// The mirror follows Placement at its next sync (placement.sync_interval):
		// a claim released there leaves it then.
		var l apiclient.AllocationList
		one := func() bool {
			var err error
			l, err = w.api.Allocations(w.ctx, vm)
			testsvc.Must(t, err, "bridge allocations")
			return len(l.Allocations) == 1 && l.Allocations[0].ProviderUUID == w.gpus[pci] && l.Allocations[0].Amount == 1 &&
				l.Allocations[0].PCIAddress == pci && l.Allocations[0].Host == w.host
		}
		for deadline := time.Now().Add(2 * time.Minute); !one(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("the bridge's allocations of %s after 2m: %+v, want VGPU 1 on %s (%s %s)", vm, l.Allocations, w.gpus[pci], w.host, pci)
				break
			}
		}
	}

	// Nova: the server runs on, on its flavor, and was never asked to resize.
	s := w.n.Server(t, vm)
	if s.Status != "ACTIVE" || s.TaskState != "" || s.Host != w.host || s.Flavor.OriginalName != w.flavorName || s.Flavor.ExtraSpecs["resources:VGPU"] != "" {
		t.Errorf("server %s: %s (task %q) on %s with flavor %+v; want ACTIVE on %s, flavor %s without vGPU", vm, s.Status, s.TaskState,
			s.Host, s.Flavor, w.host, w.flavorName)
	}
	if acts := w.novaActions(vm); len(acts) != 1 || acts["create"] != 1 {
		t.Errorf("Nova's instance actions of %s: %v, want its create only (no resize)", vm, acts)
	}
	return mdev
}

// Phases of the direct path's requests (audit_log transitions).
var (
	attachPhases  = []string{"decided/queued", "dispatched/attaching", "succeeded/"}
	changePhases  = []string{"decided/queued", "dispatched/detaching", "dispatched/removing_mdev", "dispatched/attaching", "succeeded/"}
	releasePhases = []string{"decided/queued", "dispatched/detaching", "dispatched/removing_mdev", "succeeded/"}
)

// elasticPolicy: attach on GPU_REQUEST (direct-live), change the profile
// on GPU_RESIZE, release on GPU_RELEASE.
func elasticPolicy(string) string {
	return testsvc.DirectPolicy(testsvc.RuleResizeOnRequest, testsvc.RuleReleaseOnRequest)
}

// newChangeWorld is a host with two T4: one set to the first profile, one
// to the second.
func newChangeWorld(t *testing.T, prefix string) *elasticWorld {
	return newElasticWorld(t, prefix, elasticPolicy, elasticGPU{elasticGPUA, elasticFrom}, elasticGPU{elasticGPUB, elasticTo})
}

// attachFrom attaches the first profile to vm and checks the result.
func (w *elasticWorld) attachFrom(vm string, node map[string]int) string {
	w.t.Helper()
	id := w.mustSend("GPU_REQUEST", vm, map[string]any{"workload": "vdi", "vgpu_profile": elasticFrom.profile, "count": 1})
	r := w.expectRequest(id, "GPU_REQUEST "+elasticFrom.profile, "succeeded", "", attachPhases...)
	if !strings.Contains(r.Reason, "1 vGPU(s) attached") {
		w.t.Errorf("attach reason %q", r.Reason)
	}
	return w.expectHeld(vm, elasticGPUA, node)
}

// TestDirectProfileChangeAndRelease: a VM on a host with two T4 (one set
// to T4-1B, one to T4-2B) gets a T4-1B (GPU_REQUEST), changes it to a
// T4-2B (GPU_RESIZE: the old vGPU detached and removed, the new one
// created on the other T4 and attached, the claim moved in Placement),
// then gives it back (GPU_RELEASE). After each step the request, Placement,
// the host, the bridge and Nova agree; Nova never resizes the server.
func TestDirectProfileChangeAndRelease(t *testing.T) {
	w := newChangeWorld(t, "elastic")
	vm := w.boot("e2e-elastic")
	node := w.n.Allocations(t, vm)[w.root]
	if len(node) == 0 {
		t.Fatalf("Nova's allocations of %s: none on the compute node", vm)
	}

	old := w.attachFrom(vm, node)

	id := w.mustSend("GPU_RESIZE", vm, map[string]any{"workload": "vdi", "vgpu_profile": elasticTo.profile})
	r := w.expectRequest(id, "GPU_RESIZE to "+elasticTo.profile, "succeeded", "", changePhases...)
	if !strings.Contains(r.Reason, "1 vGPU(s) attached") || !strings.Contains(r.Reason, "1 vGPU(s) detached and removed, claim released") {
		t.Errorf("profile change reason %q, want the attach and the release", r.Reason)
	}
	mdev := w.expectHeld(vm, elasticGPUB, node)
	if mdev == old {
		t.Errorf("the new vGPU has the old mdev's uuid %s", old)
	}
	if _, ok := w.n.FakeHost(w.host).Mdevs(t)[old]; ok {
		t.Errorf("the old mdev %s still exists", old)
	}
	atts := w.attachments(vm)
	if len(atts) != 2 || atts[0].ID != old || atts[0].State != "released" || atts[1].ID != mdev || atts[1].State != "attached" {
		t.Errorf("the bridge's attachments of %s: %+v, want %s released and %s attached", vm, atts, old, mdev)
	}

	id = w.mustSend("GPU_RELEASE", vm, nil)
	r = w.expectRequest(id, "GPU_RELEASE", "succeeded", "", releasePhases...)
	if !strings.Contains(r.Reason, "1 vGPU(s) detached and removed, claim released") {
		t.Errorf("release reason %q", r.Reason)
	}
	w.expectHeld(vm, "", node)
	for _, rp := range w.gpus {
		if u := w.n.Usages(t, rp); u["VGPU"] != 0 {
			t.Errorf("VGPU used on %s after the release: %d", rp, u["VGPU"])
		}
	}
	if atts := w.attachments(vm); len(atts) != 2 || atts[0].State != "released" || atts[1].State != "released" {
		t.Errorf("the bridge's attachments of %s after the release: %+v, want both released", vm, atts)
	}
}

// refuseType makes the fake host's kernel refuse new mdevs of the GPU's
// type behind Placement's back: the type's available_instances reads 0
// (as when the GPU's framebuffer is taken by something Placement does not
// count), so the agent's create fails with no capacity while Placement
// still has room. It returns the undo.
func (w *elasticWorld) refuseType(pci string) func() {
	w.t.Helper()
	fh := w.n.FakeHost(w.host)
	p := filepath.Join(fh.Drivers.Fake.SysRoot, "class", "mdev_bus", pci, "mdev_supported_types", w.types[pci].id, "available_instances")
	old, err := os.ReadFile(p)
	testsvc.Must(w.t, err, "available_instances")
	testsvc.Must(w.t, os.WriteFile(p, []byte("0\n"), 0o644), "available_instances")
	return func() { testsvc.Must(w.t, os.WriteFile(p, old, 0o644), "available_instances") }
}

// TestDirectProfileChangeFailureRestores: the profile change's new vGPU
// cannot be made (the host refuses the T4-2B though Placement has room):
// the request fails with the agent's code and reason, the claim on the
// T4-2B GPU is returned, and the old T4-1B vGPU — detached and removed by
// then — is created again and attached to the domain under the claim it
// kept. Once the host takes the type again, the same change succeeds.
func TestDirectProfileChangeFailureRestores(t *testing.T) {
	w := newChangeWorld(t, "elastic-fail")
	vm := w.boot("e2e-elastic-fail")
	node := w.n.Allocations(t, vm)[w.root]
	old := w.attachFrom(vm, node)

	undo := w.refuseType(elasticGPUB)
	id := w.mustSend("GPU_RESIZE", vm, map[string]any{"workload": "vdi", "vgpu_profile": elasticTo.profile})
	r := w.expectRequest(id, "GPU_RESIZE to "+elasticTo.profile+" refused by the host", "failed", "agent_failed",
		"decided/queued", "dispatched/detaching", "dispatched/removing_mdev", "dispatched/attaching", "dispatched/compensating", "failed/")
	t.Logf("the failed change: %s (%s): %s", r.State, r.Code, r.Reason)
	for _, want := range []string{"attach_vgpu failed", "no_capacity", "available_instances is 0", w.host} {
		if !strings.Contains(r.Reason, want) {
			t.Errorf("reason %q does not say %q", r.Reason, want)
		}
	}

	// The request ends failed when the restore is queued; the old vGPU
	// is back once the agent answered it.
	var restored, status string
	w.waitFor(2*time.Minute, "the restore of "+old+" to be answered", func() bool {
		err := w.pool.QueryRow(w.ctx, `SELECT c.kind, coalesce(c.result_status, '') FROM commands c WHERE c.request_id = $1 AND c.purpose = 'compensation'
			AND c.attachment_id = $2`, id, old).Scan(&restored, &status)
		return err == nil && status != ""
	})
	if restored != "attach_vgpu" || status != "succeeded" {
		t.Fatalf("the restore of %s: %s %s, want attach_vgpu succeeded", old, restored, status)
	}
	var audited int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE request_id = $1 AND action = 'restore' AND object_id = $2
		AND detail->>'profile' = $3 AND detail->>'gpu' = $4`, id, old, elasticFrom.profile, elasticGPUA).Scan(&audited), "audit")
	if audited != 1 {
		t.Errorf("%d restore records of %s in audit_log, want 1", audited, old)
	}
	// Back as it was: the old vGPU (its mdev made again under the same
	// uuid) live in the domain, the claim on the T4-1B GPU only.
	if got := w.expectHeld(vm, elasticGPUA, node); got != old {
		t.Errorf("the domain holds mdev %s, want the old vGPU %s made again", got, old)
	}
	atts := w.attachments(vm)
	if len(atts) != 2 || atts[0].ID != old || atts[0].State != "attached" || atts[1].State != "failed" || atts[1].Profile != elasticTo.profile {
		t.Errorf("the bridge's attachments of %s: %+v, want %s attached and the %s failed", vm, atts, old, elasticTo.profile)
	}
	if u := w.n.Usages(t, w.gpus[elasticGPUB]); u["VGPU"] != 0 {
		t.Errorf("VGPU used on the %s GPU after the failed change: %d", elasticTo.profile, u["VGPU"])
	}

	// The host takes the type again: the same change now goes through.
	undo()
	id = w.mustSend("GPU_RESIZE", vm, map[string]any{"workload": "vdi", "vgpu_profile": elasticTo.profile})
	w.expectRequest(id, "GPU_RESIZE to "+elasticTo.profile+" after the restore", "succeeded", "", changePhases...)
	if got := w.expectHeld(vm, elasticGPUB, node); got == old {
		t.Errorf("the new vGPU has the old mdev's uuid %s", old)
	}
}

// TestQuotaTenConcurrent: a project allowed 4 vGPUs, 10 of its servers on
// a host whose T4 (T4-1A, 16 per GPU) has room for all, 10 GPU_REQUESTs
// sent at once: exactly 4 succeed and 6 end rejected with code quota;
// Placement holds VGPU for exactly the 4 and the host has 4 mdevs, each
// live in the domain of one of them.
func TestQuotaTenConcurrent(t *testing.T) {
	const n, quota = 10, 4
	w := newElasticWorld(t, "elastic-quota", func(project string) string {
		return testsvc.DirectPolicy() + fmt.Sprintf("projects:\n  %s:\n    quota: {max_vgpus: %d}\n", project, quota)
	}, elasticGPU{elasticGPUA, elasticQuota})
	vms := make([]string, n)
	for i := range vms {
		vms[i] = w.createServer(fmt.Sprintf("e2e-quota-%d", i))
	}
	for _, vm := range vms {
		w.waitBooted(vm)
	}

	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, vm := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i], errs[i] = w.send("GPU_REQUEST", vm, map[string]any{"workload": "vdi", "vgpu_profile": elasticQuota.profile, "count": 1})
		}()
	}
	wg.Wait()
	testsvc.Must(t, errors.Join(errs...), "GPU_REQUEST webhooks")

	succeeded := map[string]bool{}
	rejected := 0
	for i, id := range ids {
		r := w.waitFinal(id)
		switch {
		case r.State == "succeeded":
			succeeded[vms[i]] = true
		case r.State == "rejected" && r.Code == "quota":
			rejected++
			if !strings.Contains(r.Reason, w.project) || !strings.Contains(r.Reason, fmt.Sprintf("its quota is %d", quota)) {
				t.Errorf("request %s rejected with reason %q, want the project's quota named", id, r.Reason)
			}
		default:
			t.Errorf("request %s for %s: %s/%s (%s): %s; want succeeded or rejected with code quota", id, vms[i], r.State, r.Phase, r.Code, r.Reason)
		}
	}
	if len(succeeded) != quota || rejected != n-quota {
		t.Fatalf("%d succeeded and %d rejected with code quota; want %d and %d", len(succeeded), rejected, quota, n-quota)
	}

	// Placement: the claims the rejected decisions made are given back
	// just after them (they claim before the quota check of their second
	// round); then exactly the four hold VGPU, on the T4.
	held := func() (units int, on map[string]int) {
		on = map[string]int{}
		for _, vm := range vms {
			for rp, res := range w.n.Allocations(t, vm) {
				if res["VGPU"] > 0 {
					units += res["VGPU"]
					on[vm] += res["VGPU"]
					if rp != w.gpu {
						t.Errorf("VGPU of %s on provider %s, want the T4 %s", vm, rp, w.gpu)
					}
				}
			}
		}
		return units, on
	}
	w.waitFor(time.Minute, "Placement to hold the quota's VGPU only", func() bool { u, _ := held(); return u == quota })
	_, on := held()
	for _, vm := range vms {
		if want := map[bool]int{true: 1, false: 0}[succeeded[vm]]; on[vm] != want {
			t.Errorf("VGPU of %s (request succeeded: %v): %d, want %d", vm, succeeded[vm], on[vm], want)
		}
	}
	if u := w.n.Usages(t, w.gpu); u["VGPU"] != quota {
		t.Errorf("VGPU used on the T4: %d, want %d", u["VGPU"], quota)
	}

	// The host: four mdevs of the type, each live in a succeeded VM's domain.
	fh := w.n.FakeHost(w.host)
	all := fh.Mdevs(t)
	if len(all) != quota {
		t.Errorf("the host has %d mdevs (%v), want %d", len(all), all, quota)
	}
	for _, vm := range vms {
		dom, ok := fh.Domain(t, vm)
		if !ok {
			t.Errorf("no domain of %s", vm)
			continue
		}
		mdevs := dom.Mdevs()
		if !succeeded[vm] {
			if len(mdevs) != 0 {
				t.Errorf("domain of %s, whose request was rejected, has mdevs %v", vm, mdevs)
			}
			continue
		}
		if len(mdevs) != 1 || !slices.ContainsFunc(dom.Hostdevs, func(h libvirt.Hostdev) bool { return h.MdevUUID == mdevs[0] && h.Live }) {
			t.Errorf("domain of %s has hostdevs %+v, want one live mdev", vm, dom.Hostdevs)
			continue
		}
		if m := all[mdevs[0]]; m.Type != elasticQuota.id || m.Parent != elasticGPUA {
			t.Errorf("mdev %s of %s is %+v, want %s on %s", mdevs[0], vm, m, elasticQuota.id, elasticGPUA)
		}
	}

	// The bridge: four attachments attached, none pending.
	var attached, other int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FILTER (WHERE state = 'attached'), count(*) FILTER (WHERE state <> 'attached')
		FROM vgpu_attachments`).Scan(&attached, &other), "attachments")
	if attached != quota || other != 0 {
		t.Errorf("the bridge has %d attachments attached and %d others, want %d and none", attached, other, quota)
	}
}
