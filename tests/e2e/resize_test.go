// Package e2e proves the bridge's main job against a real Nova (Debian's
// python3-nova, run by tests/novaharness), the shared Placement, Postgres
// and RabbitMQ, and in-process vgpu-agents on simulated hosts: requests
// through the Nova-native path end with Nova's server, Placement's
// allocations and the bridge's request in agreement.
package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const (
	gpuPCI = "0000:3b:00.0"
	secret = "e2e-webhook-secret-0123456789abcdef"
)

// vgpuType is the T4 vGPU type a test's GPU is set to. The tests share
// one Nova (sharedNova), so each uses a type of its own: Nova's scheduler
// then finds the test's GPU only on the test's host, and only the test's
// flavors carry its trait.
type vgpuType struct {
	profile string // T4-2Q
	id      string // nvidia-231
	max     int    // instances per T4
}

// trait is Placement's trait of the type (CUSTOM_NVIDIA_231).
func (v vgpuType) trait() string {
	return "CUSTOM_" + strings.ToUpper(strings.ReplaceAll(v.id, "-", "_"))
}

// The T4 types the Nova-path tests use (etc/vgpu-bridge/profiles.yaml);
// the direct-path tests use T4-4Q (nvidia-232).
var (
	typeResize   = vgpuType{"T4-2Q", "nvidia-231", 8}
	typeVerify   = vgpuType{"T4-1Q", "nvidia-230", 16}
	typeTenant   = vgpuType{"T4-8Q", "nvidia-233", 2}
	typeNoHost   = vgpuType{"T4-16Q", "nvidia-234", 1}
	typeKill     = vgpuType{"T4-4A", "nvidia-227", 4}
	typeReplicas = vgpuType{"T4-2A", "nvidia-226", 8}
)

// e2ePolicy: the policy's default action path, nova-resize; a GPU_REQUEST
// asks for the profile it names, a GPU_RESIZE changes to the profile it
// names, a GPU_RELEASE gives the vGPU back; an operator rule tunes a VM Nova gave a
// vGPU (scenario 2). It sets cgroup limits: NVML refuses a vGPU scheduler
// change while vGPUs run on the GPU, so tune() cannot follow a resize.
var e2ePolicy = testsvc.NovaPolicy(`  - name: resize-on-request
    on: [webhook.GPU_RESIZE]
    when: event.profile != ""
    then: ['resize(event.profile)']
`, testsvc.RuleReleaseOnRequest, `  - name: limits-for-nova-vgpu
    description: Operator rule - a VM Nova gave a vGPU gets CPU and memory limits.
    on: [nova.instance.resize_finish.end]
    when: instance.vgpu_count > 0
    then: ['set_limits("800000 100000", "64G")']
`)

// world is one scenario's cloud: the package's Nova with a compute host
// of the test's own whose node has a T4 child provider set to the test's
// vGPU type, the host's agent, and a bridge (a subprocess) on a database
// and queues of its own.
type world struct {
	t      *testing.T
	ctx    context.Context
	n      *novaharness.Nova
	typ    vgpuType
	host   string
	gpu    string // GPU child provider
	root   string // compute node provider
	dbURL  string
	pool   *pgxpool.Pool
	dir    string
	args   []string // vgpu-bridge serve arguments
	api    string   // http://127.0.0.1:port
	br     *exec.Cmd
	brDone chan struct{}
	brLog  string
	runs   int
}

type worldOpts struct {
	typ     vgpuType
	noAgent bool     // start the agent later (kill test)
	extra   []string // more bridge overrides
}

func newWorld(t *testing.T, o worldOpts) *world {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &world{t: t, ctx: ctx, dir: t.TempDir(), typ: o.typ}
	w.n = sharedNova(t)
	w.host = w.n.AddHost(t, "nova-"+strings.ToLower(w.typ.profile)) // one type, one host per test
	w.root = w.n.ComputeNodeProvider(t, w.host)
	w.gpu = w.n.AddVGPUChild(t, w.host, gpuPCI, w.typ.trait(), w.typ.max)
	if !o.noAgent {
		w.startAgent()
	}
	w.dbURL = testsvc.Postgres(t)
	w.pool = testsvc.Pool(t, w.dbURL)

	rules := filepath.Join(w.dir, "policy.yaml")
	sf := filepath.Join(w.dir, "webhook.secret")
	tok := filepath.Join(w.dir, "nova-token")
	ini := filepath.Join(w.dir, "bridge.conf")
	testsvc.Must(t, os.WriteFile(rules, []byte(e2ePolicy), 0o600), "policy")
	testsvc.Must(t, os.WriteFile(sf, []byte(secret+"\n"), 0o600), "secret")
	testsvc.Must(t, os.WriteFile(tok, []byte(w.n.Token()+"\n"), 0o600), "nova token")
	testsvc.Must(t, os.WriteFile(ini, []byte("[webhook_source:e2e]\nauth = hmac\nsecret_files = "+sf+"\nrate = 100\nburst = 100\n"), 0o600), "bridge.conf")
	port := testsvc.FreePort(t)
	w.api = fmt.Sprintf("http://127.0.0.1:%d", port)
	sets := testbridge.Overrides(t, w.dbURL, append([]string{
		"DEFAULT.transport_url=" + w.n.TransportURL(), // Nova's vhost: its notifications, the agents' queues
		"api.listen=" + fmt.Sprintf("127.0.0.1:%d", port),
		"policy.rules_file=" + rules,
		"nova.endpoint_override=" + w.n.ComputeEndpoint(),
		"nova.token_file=" + tok,
		"nova.poll_interval=100ms",
		// Few connections: Nova's services and other packages' tests share the server.
		"database.max_connections=8",
		"pipeline.workers=2",
		// Queues of its own on the shared Nova's vhost.
		"dispatch.results_queue=" + testsvc.Name("e2e-results"),
		"dispatch.reports_queue=" + testsvc.Name("e2e-reports"),
		"pipeline.poll_interval=50ms",
		"pipeline.retry_min=200ms",
		"pipeline.retry_max=2s",
		"pipeline.max_attempts=10",
	}, o.extra...)...)
	w.args = []string{"serve", "--config", ini}
	for _, s := range sets {
		w.args = append(w.args, "--set", s)
	}
	w.brLog = filepath.Join(w.dir, "bridge.log")
	t.Cleanup(func() {
		w.stopBridge(syscall.SIGTERM)
		if t.Failed() {
			b, _ := os.ReadFile(w.brLog)
			t.Logf("bridge log (last 60 lines):\n%s", testsvc.LastLines(string(b), 60))
		}
	})
	return w
}

// startBridge runs the bridge binary and waits until /readyz answers 200.
func (w *world) startBridge() {
	t := w.t
	t.Helper()
	f, err := os.OpenFile(w.brLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	testsvc.Must(t, err, "bridge log")
	w.runs++
	fmt.Fprintf(f, "----- bridge run %d -----\n", w.runs)
	cmd := exec.Command(testsvc.Binary(t, "vgpu-bridge"), w.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	testsvc.Must(t, cmd.Start(), "start vgpu-bridge")
	f.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	w.br, w.brDone = cmd, done
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-done:
			b, _ := os.ReadFile(w.brLog)
			w.br = nil
			// The port FreePort gave was taken by another process
			// before the bridge bound it: a first start moves to another
			// (a restart keeps the address the test has been using).
			if w.runs == 1 && strings.Contains(testsvc.LastLines(string(b), 5), "address already in use") {
				port := testsvc.FreePort(t)
				for i, a := range w.args {
					if strings.HasPrefix(a, "api.listen=") {
						w.args[i] = fmt.Sprintf("api.listen=127.0.0.1:%d", port)
					}
				}
				w.api = fmt.Sprintf("http://127.0.0.1:%d", port)
				w.runs = 0
				w.startBridge()
				return
			}
			t.Fatalf("vgpu-bridge exited at start: %v\n%s", cmd.ProcessState, testsvc.LastLines(string(b), 40))
		default:
		}
		resp, err := http.Get(w.api + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("vgpu-bridge not ready within 2m")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopBridge signals the bridge's process group and waits until it is
// gone (SIGKILL after 30 s).
func (w *world) stopBridge(sig syscall.Signal) {
	if w.br == nil {
		return
	}
	pid := w.br.Process.Pid
	w.br = nil
	syscall.Kill(-pid, sig)
	select {
	case <-w.brDone:
	case <-time.After(30 * time.Second):
		syscall.Kill(-pid, syscall.SIGKILL)
		<-w.brDone
	}
}

// call makes an operator API call with the admin token and decodes the
// JSON answer into out (when not nil); it returns the status.
func (w *world) call(method, path string, body []byte, out any) int {
	w.t.Helper()
	req, err := http.NewRequestWithContext(w.ctx, method, w.api+path, bytes.NewReader(body))
	testsvc.Must(w.t, err, "request")
	req.Header.Set("X-Auth-Token", testbridge.AdminToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	testsvc.Must(w.t, err, method+" "+path)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		testsvc.Must(w.t, json.Unmarshal(b, out), "decode "+path+": "+string(b))
	}
	return resp.StatusCode
}

// flavor creates a flavor named after the test's host (flavor names are
// unique in the shared Nova) and returns its id; vgpus > 0 adds the
// test's vGPU type to its extra specs.
func (w *world) flavor(name string, vcpus, ram, disk, vgpus int) string {
	w.t.Helper()
	var specs map[string]string
	if vgpus > 0 {
		specs = map[string]string{"resources:VGPU": fmt.Sprint(vgpus), "trait:" + w.typ.trait(): "required"}
	}
	return w.n.CreateFlavor(w.t, w.flavorName(name), vcpus, ram, disk, specs)
}

// flavorName is the Nova name of the test's flavor name.
func (w *world) flavorName(name string) string { return w.host + "." + name }

// startAgent runs the host's agent; it reports every 5 s, so the bridge
// hears of the host soon even when it missed the report sent at start.
func (w *world) startAgent() { w.n.StartAgent(w.t, w.host, "DEFAULT.report_interval=5s") }

// waitAgent waits until the bridge has a report of the host's agent: the
// dry run of the Nova path considers only hosts whose agents report.
func (w *world) waitAgent() {
	w.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var n int
		testsvc.Must(w.t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM hosts WHERE name = $1 AND report IS NOT NULL`, w.host).Scan(&n), "hosts")
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no report of the agent of %s reached the bridge within 2m", w.host)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitInstance waits until the bridge knows the server (from Nova's
// notifications) on host.
func (w *world) waitInstance(id, host string, vgpus int) {
	w.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var in struct {
			Host  *string `json:"host"`
			VGPUs int     `json:"vgpus"`
		}
		if w.call(http.MethodGet, "/v1/instances/"+id, nil, &in) == http.StatusOK && in.Host != nil && *in.Host == host && in.VGPUs == vgpus {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("the bridge does not know instance %s on %s with %d vGPU(s) after 2m (last: %+v)", id, host, vgpus, in)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// gpuRequest posts a signed GPU_REQUEST webhook for vm and returns the
// request id.
func (w *world) gpuRequest(vm, profile string) uuid.UUID {
	w.t.Helper()
	return w.webhook(map[string]any{"type": "GPU_REQUEST", "vm_id": vm, "workload": "training", "vgpu_profile": profile, "count": 1})
}

// webhook posts a signed webhook of the fields (type, vm_id, …) and
// returns the request id.
func (w *world) webhook(fields map[string]any) uuid.UUID {
	w.t.Helper()
	// A nonce: a signed body acts once, and a test may ask twice.
	fields["nonce"], fields["timestamp"] = uuid.NewString(), time.Now().UTC().Format(time.RFC3339)
	body, _ := json.Marshal(fields)
	req, err := http.NewRequestWithContext(w.ctx, http.MethodPost, w.api+"/v1/webhooks/e2e", bytes.NewReader(body))
	testsvc.Must(w.t, err, "webhook")
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)))
	req.Header.Set("Idempotency-Key", uuid.NewString())
	resp, err := http.DefaultClient.Do(req)
	testsvc.Must(w.t, err, "post webhook")
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		w.t.Fatalf("webhook answered %d: %s", resp.StatusCode, b)
	}
	var out struct {
		RequestID uuid.UUID `json:"request_id"`
	}
	testsvc.Must(w.t, json.Unmarshal(b, &out), "webhook answer")
	return out.RequestID
}

// request is what GET /v1/requests/{id} shows.
type request struct {
	State  string `json:"state"`
	Phase  string `json:"phase"`
	Reason string `json:"reason"`
	Code   string `json:"code"`
}

func (w *world) request(id uuid.UUID) request {
	w.t.Helper()
	var r request
	if s := w.call(http.MethodGet, "/v1/requests/"+id.String(), nil, &r); s != http.StatusOK {
		w.t.Fatalf("GET request %s: %d", id, s)
	}
	return r
}

// waitFinal waits (3 min at most) for the request to end.
func (w *world) waitFinal(id uuid.UUID) request {
	w.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		r := w.request(id)
		if r.State == "succeeded" || r.State == "failed" || r.State == "rejected" {
			return r
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("request %s still %s/%s (%s) after 3m", id, r.State, r.Phase, r.Reason)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// novaCalls counts the bridge's audited Nova calls of a request by kind
// (resize, confirm_resize, revert_resize, none).
func (w *world) novaCalls(id uuid.UUID) map[string]int {
	w.t.Helper()
	rows, err := w.pool.Query(w.ctx, `SELECT detail->>'call' FROM audit_log WHERE request_id = $1 AND action = 'nova_call'`, id.String())
	testsvc.Must(w.t, err, "audit")
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var c string
		testsvc.Must(w.t, rows.Scan(&c), "audit")
		out[c]++
	}
	return out
}

// novaActions counts Nova's own record of the server's actions (resize,
// confirmResize, revertResize) — what Nova was asked, whoever asked.
func (w *world) novaActions(server string) map[string]int {
	w.t.Helper()
	return w.n.InstanceActions(w.t, server)
}

// assertResized checks Nova, Placement and the fake host after a
// successful resize of server to the vGPU flavor.
func (w *world) assertResized(server, flavorName string) {
	t := w.t
	t.Helper()
	s := w.n.Server(t, server)
	if s.Status != "ACTIVE" || s.TaskState != "" || s.Host != w.host {
		t.Errorf("server %s is %s (task %q) on %q, want ACTIVE on %s", server, s.Status, s.TaskState, s.Host, w.host)
	}
	// resources1:VGPU: the vGPU in request group 1, as flavor plan makes them.
	if s.Flavor.OriginalName != w.flavorName(flavorName) || s.Flavor.ExtraSpecs["resources:VGPU"]+s.Flavor.ExtraSpecs["resources1:VGPU"] != "1" {
		t.Errorf("server flavor %+v, want %s with resources:VGPU=1 (or resources1:VGPU=1)", s.Flavor, w.flavorName(flavorName))
	}
	al := w.n.Allocations(t, server)
	if al[w.gpu]["VGPU"] != 1 {
		t.Errorf("VGPU on the GPU child provider = %d, want 1 (allocations %v)", al[w.gpu]["VGPU"], al)
	}
	if al[w.root]["VGPU"] != 0 || al[w.root]["VCPU"] != 2 {
		t.Errorf("compute node allocations %v, want VCPU 2 and no VGPU", al[w.root])
	}
	if len(al) != 2 {
		t.Errorf("allocations on %d providers, want the node and the GPU: %v", len(al), al)
	}
	fh := w.n.FakeHost(w.host)
	dom, ok := fh.Domain(t, server)
	if !ok || len(dom.Mdevs()) != 1 {
		t.Fatalf("domain of %s: found %v, mdevs %v; want one vGPU", server, ok, dom.Mdevs())
	}
	if m := fh.Mdevs(t)[dom.Mdevs()[0]]; m.Type != w.typ.id || m.Parent != gpuPCI {
		t.Errorf("mdev %+v, want %s on %s", m, w.typ.id, gpuPCI)
	}
}

// TestResizeThroughNova is scenario 1: a signed GPU_REQUEST for a VM on a
// flavor without vGPU; the bridge picks the flavor of the same size with
// the T4-4Q, Nova resizes (its scheduler claims the VGPU on the GPU child
// provider), the host's agent verifies the vGPU, the bridge confirms.
func TestResizeThroughNova(t *testing.T) {
	w := newWorld(t, worldOpts{typ: typeResize})
	plain := w.flavor("small", 2, 2048, 10, 0)
	w.n.CreateFlavor(t, w.flavorName("small.other-type"), 2, 2048, 10, map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_229": "required"})
	w.flavor("large.vgpu", 4, 8192, 40, 1)
	w.flavor("small.vgpu2", 2, 2048, 10, 2)
	w.flavor("small.vgpu", 2, 2048, 10, 1)
	w.startBridge()
	vm := w.n.CreateServer(t, "e2e-vm", plain, w.host)
	w.n.WaitServer(t, vm, "ACTIVE")
	w.waitInstance(vm, w.host, 0)
	w.waitAgent()

	id := w.gpuRequest(vm, w.typ.profile)
	r := w.waitFinal(id)
	if r.State != "succeeded" {
		t.Fatalf("request %s: %s (%s): %s", id, r.State, r.Code, r.Reason)
	}
	if !strings.Contains(r.Reason, w.flavorName("small.vgpu")) {
		t.Errorf("reason %q does not name the flavor", r.Reason)
	}
	w.assertResized(vm, "small.vgpu")
	if got := w.novaCalls(id); got["resize"] != 1 || got["confirm_resize"] != 1 || got["revert_resize"] != 0 {
		t.Errorf("the bridge's Nova calls %v, want one resize and one confirm", got)
	}
	if got := w.novaActions(vm); got["resize"] != 1 || got["confirmResize"] != 1 {
		t.Errorf("Nova's instance actions %v, want one resize and one confirmResize", got)
	}
	// The bridge wrote no allocation: Nova's scheduler claimed.
	var claims int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM vgpu_attachments WHERE instance_uuid = $1`, vm).Scan(&claims), "attachments")
	if claims != 0 {
		t.Errorf("%d direct-path attachments recorded for a Nova resize", claims)
	}
	// The agent's verification is in the audit trail.
	var verified int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE request_id = $1 AND action = 'nova_verify' AND detail->>'status' = 'succeeded'`,
		id.String()).Scan(&verified), "audit")
	if verified != 1 {
		t.Errorf("%d successful verifications audited, want 1", verified)
	}

	// A VM whose size no vGPU flavor has: the bridge names the flavor to
	// create and leaves the server alone.
	tiny := w.flavor("tiny", 1, 512, 1, 0)
	vm2 := w.n.CreateServer(t, "e2e-vm2", tiny, w.host)
	w.n.WaitServer(t, vm2, "ACTIVE")
	w.waitInstance(vm2, w.host, 0)
	id2 := w.gpuRequest(vm2, w.typ.profile)
	r2 := w.waitFinal(id2)
	want := fmt.Sprintf("openstack flavor create --vcpus 1 --ram 512 --disk 1 --property resources:VGPU=1 --property trait:%s=required %s.vgpu-%s",
		w.typ.trait(), w.flavorName("tiny"), strings.ToLower(w.typ.profile))
	if r2.State != "failed" || r2.Code != "no_flavor" || !strings.Contains(r2.Reason, want) {
		t.Errorf("request for a size without vGPU flavor: %s (%s): %s\nwant no_flavor naming: %s", r2.State, r2.Code, r2.Reason, want)
	}
	if got := w.novaActions(vm2); got["resize"] != 0 {
		t.Errorf("Nova was asked to resize %s: %v", vm2, got)
	}
	if s := w.n.Server(t, vm2); s.Status != "ACTIVE" || s.Flavor.OriginalName != w.flavorName("tiny") {
		t.Errorf("server %s is %s on %s, want ACTIVE on %s", vm2, s.Status, s.Flavor.OriginalName, w.flavorName("tiny"))
	}
}

// TestVerifyFailureReverts: Nova resizes, but the vGPU is not in the
// domain when the agent verifies (here the domain is redefined without
// it before the agent runs): the bridge reverts the resize (phase
// compensating) and the request fails with the agent's reason; Nova
// gives the VGPU back.
func TestVerifyFailureReverts(t *testing.T) {
	w := newWorld(t, worldOpts{typ: typeVerify, noAgent: true, extra: []string{"nova.verify_timeout=10m"}})
	vm, id := w.requestWhileAgentStopped("e2e-verify")
	deadline := time.Now().Add(3 * time.Minute)
	for r := w.request(id); r.Phase != "verifying"; r = w.request(id) {
		if r.State == "succeeded" || r.State == "failed" || r.State == "rejected" || time.Now().After(deadline) {
			t.Fatalf("request %s is %s/%s (%s); want it verifying", id, r.State, r.Phase, r.Reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The domain loses its vGPU: defined again without the hostdev.
	fh := w.n.FakeHost(w.host)
	dom, ok := fh.Domain(t, vm)
	if !ok || len(dom.Mdevs()) != 1 {
		t.Fatalf("domain of %s after Nova's resize: found %v, mdevs %v", vm, ok, dom.Mdevs())
	}
	testsvc.Must(t, fh.Drivers.Libvirt.DestroyAndUndefine(w.ctx, vm), "undefine")
	testsvc.Must(t, fh.Drivers.Libvirt.DefineAndStart(w.ctx, fmt.Sprintf(`<domain type='test'><name>%s</name><uuid>%s</uuid>
		<memory unit='MiB'>2048</memory><vcpu>2</vcpu><os><type arch='x86_64'>hvm</type></os></domain>`, dom.Name, vm)), "define")
	w.startAgent()

	r := w.waitFinal(id)
	if r.State != "failed" || r.Code != "verify_failed" || !strings.Contains(r.Reason, "verify_vgpu failed") || !strings.Contains(r.Reason, "Nova reverted the resize") {
		t.Fatalf("request %s: %s (%s): %s; want failed with verify_failed, the agent's reason and the revert", id, r.State, r.Code, r.Reason)
	}
	s := w.n.WaitServer(t, vm, "ACTIVE")
	if s.Flavor.OriginalName != w.flavorName("small") {
		t.Errorf("server flavor %s after the revert, want %s", s.Flavor.OriginalName, w.flavorName("small"))
	}
	if al := w.n.Allocations(t, vm); al[w.gpu]["VGPU"] != 0 || len(al) != 1 {
		t.Errorf("allocations after the revert %v, want the node's only", al)
	}
	if got := w.novaCalls(id); got["resize"] != 1 || got["revert_resize"] != 1 || got["confirm_resize"] != 0 {
		t.Errorf("the bridge's Nova calls %v, want one resize and one revert", got)
	}
	if got := w.novaActions(vm); got["resize"] != 1 || got["revertResize"] != 1 || got["confirmResize"] != 0 {
		t.Errorf("Nova's instance actions %v, want one resize and one revertResize", got)
	}
	var compensating int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE request_id = $1 AND action = 'transition' AND detail->>'phase' = 'compensating'`,
		id.String()).Scan(&compensating), "audit")
	if compensating == 0 {
		t.Error("the request never went through phase compensating")
	}
}
