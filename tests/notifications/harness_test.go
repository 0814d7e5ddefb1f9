// Package notifications_test consumes the bridge's own notifications
// (vgpu.attach.*, vgpu.resize.*, vgpu.detach.*, vgpu.request.error,
// vgpu.exists) with Debian's python3-oslo.messaging notification listener
// (tests/oslo_listen.py), from a real bridge (a subprocess, so that a
// failpoint can kill it) on the real Postgres, RabbitMQ and Placement,
// with an in-process vgpu-agent on a fake host.
package notifications_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testagent"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const (
	gpuA      = "0000:3b:00.0" // T4-4Q in Placement
	gpuB      = "0000:d8:00.0" // T4-2Q in Placement
	t44qTrait = "CUSTOM_NVIDIA_232"
	t42qTrait = "CUSTOM_NVIDIA_231"
	replica   = "ntf-bridge-1" // [DEFAULT] host: publisher_id vgpu-bridge:ntf-bridge-1
)

// TestMain removes the bridge binary the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	testsvc.RemoveBinaries()
	os.Exit(code)
}

// rig is one compute host in Placement (two T4s: gpuA typed T4-4Q, gpuB
// T4-2Q) with its fake host and agent, instances the bridge knows, the
// bridge as a subprocess, and an oslo.messaging listener on the bridge's
// notification exchange.
type rig struct {
	t       *testing.T
	ctx     context.Context
	dir     string
	dbURL   string
	pool    *pgxpool.Pool
	sc      *gophercloud.ServiceClient
	host    string // compute service host = fake host name = agent host
	node    string // root provider name
	root    string
	gpus    map[string]string // PCI address → provider uuid
	project string
	user    string
	vm      string // an instance with a running domain on the host
	ghost   string // an instance on the host whose domain the host does not have
	// Nova's exchange (nobody publishes there), the bridge's queues, and
	// the exchange and topic of the bridge's own notifications.
	novaExchange string
	queues       []string // notifications, results, reports
	outExchange  string
	outTopic     string
	policy       string
	fake         string

	proc     *exec.Cmd
	procDone <-chan struct{}
	logPath  string
	url      string
	admin    *apiclient.Client
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	id := strings.TrimPrefix(testsvc.Name("ntf"), "ntf-")
	r := &rig{t: t, ctx: ctx, dir: t.TempDir(), host: "ntf-compute-" + id, gpus: map[string]string{},
		project: strings.ReplaceAll(uuid.NewString(), "-", ""), user: strings.ReplaceAll(uuid.NewString(), "-", ""),
		vm: uuid.NewString(), ghost: uuid.NewString(),
		novaExchange: "nova-ntf-" + id, outExchange: "vgpu-bridge-ntf-" + id, outTopic: "ntf-" + id}
	r.node = r.host + ".ntf.test"
	r.queues = []string{"vgpu-ntf-" + id + ".notifications", "vgpu-ntf-" + id + ".results", "vgpu-ntf-" + id + ".reports"}
	r.logPath = filepath.Join(r.dir, "bridge.log")
	r.policy = filepath.Join(r.dir, "policy.yaml")
	testsvc.Must(t, os.WriteFile(r.policy, []byte(testsvc.DirectPolicy(testsvc.RuleResizeOnRequest, testsvc.RuleReleaseOnRequest)), 0o600), "policy")
	testsvc.RabbitURL(t) // fails loudly, with the command that starts it, when the broker is not there
	r.dbURL = testsvc.MigratedPostgres(t)
	r.pool = testsvc.Pool(t, r.dbURL)
	r.placement()
	for _, vm := range []string{r.vm, r.ghost} {
		_, err := r.pool.Exec(ctx, `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state)
			VALUES ($1, $2, $3, $4, $5, 'active', 'running')`, vm, r.project, r.user, r.host, r.node)
		testsvc.Must(t, err, "instance row")
	}
	t.Cleanup(func() {
		deleteQueues(t, append(r.queues, protocol.AgentQueue(r.host))...)
		deleteExchanges(t, r.novaExchange, r.outExchange)
	})
	return r
}

// placement creates what Nova's libvirt driver would: the root provider
// named like the agent's node, one child per GPU with VGPU inventory and
// its type trait, and each instance holding VCPU and MEMORY_MB on the
// root.
func (r *rig) placement() {
	t, ctx := r.t, r.ctx
	c, err := placement.NewClient(ctx, placement.ClientConfig{Endpoint: testsvc.PlacementURL(t), Token: "admin"})
	testsvc.Must(t, err, "placement client")
	r.sc = c.ServiceClient()
	for _, tr := range []string{t44qTrait, t42qTrait} {
		testsvc.Must(t, traits.Create(ctx, r.sc, tr).ExtractErr(), "create trait")
	}
	r.root = uuid.NewString()
	_, err = resourceproviders.Create(ctx, r.sc, resourceproviders.CreateOpts{Name: r.node, UUID: r.root}).Extract()
	testsvc.Must(t, err, "create root provider")
	t.Cleanup(r.cleanupPlacement)
	_, err = resourceproviders.UpdateInventories(ctx, r.sc, r.root, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
		"VCPU":      {Total: 64, MinUnit: 1, MaxUnit: 64, StepSize: 1, AllocationRatio: 4},
		"MEMORY_MB": {Total: 262144, MinUnit: 1, MaxUnit: 262144, StepSize: 1, AllocationRatio: 1},
	}}).Extract()
	testsvc.Must(t, err, "root inventory")
	for _, g := range []struct {
		addr, trait string
		total       int
	}{{gpuA, t44qTrait, 4}, {gpuB, t42qTrait, 8}} {
		id := uuid.NewString()
		_, err := resourceproviders.Create(ctx, r.sc, resourceproviders.CreateOpts{Name: testsvc.GPUProviderName(r.node, g.addr), UUID: id,
			ParentProviderUUID: r.root}).Extract()
		testsvc.Must(t, err, "create GPU provider")
		r.gpus[g.addr] = id
		rp, err := resourceproviders.UpdateInventories(ctx, r.sc, id, resourceproviders.UpdateInventoriesOpts{Inventories: map[string]resourceproviders.Inventory{
			"VGPU": {Total: g.total, MinUnit: 1, MaxUnit: g.total, StepSize: 1, AllocationRatio: 1},
		}}).Extract()
		testsvc.Must(t, err, "GPU inventory")
		_, err = resourceproviders.UpdateTraits(ctx, r.sc, id, resourceproviders.UpdateTraitsOpts{ResourceProviderGeneration: rp.ResourceProviderGeneration,
			Traits: []string{g.trait}}).Extract()
		testsvc.Must(t, err, "GPU traits")
	}
	for _, vm := range []string{r.vm, r.ghost} {
		err := allocations.Update(ctx, r.sc, vm, allocations.UpdateOpts{Allocations: map[string]allocations.ProviderAllocationsOpts{
			r.root: {Resources: map[string]int{"VCPU": 2, "MEMORY_MB": 2048}},
		}, ProjectID: r.project, UserID: r.user, ConsumerType: "INSTANCE"}).ExtractErr()
		testsvc.Must(t, err, "instance allocations")
	}
}

func (r *rig) cleanupPlacement() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []string{r.vm, r.ghost} {
		if err := allocations.Delete(ctx, r.sc, c).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
			r.t.Logf("cleanup: allocations of %s: %v", c, err)
		}
	}
	for _, id := range r.gpus {
		if err := resourceproviders.Delete(ctx, r.sc, id).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
			r.t.Logf("cleanup: provider %s: %v", id, err)
		}
	}
	if err := resourceproviders.Delete(ctx, r.sc, r.root).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
		r.t.Logf("cleanup: provider %s: %v", r.root, err)
	}
}

// vgpuUnits sums a consumer's VGPU allocations in Placement.
func (r *rig) vgpuUnits(consumer string) int {
	a, err := allocations.Get(r.ctx, r.sc, consumer).Extract()
	testsvc.Must(r.t, err, "get allocations")
	n := 0
	for _, pa := range a.Allocations {
		n += pa.Resources["VGPU"]
	}
	return n
}

// startBridge runs vgpu-bridge as a subprocess on the rig's database and
// queues, with failpoint fp armed when not "", and waits until it is
// ready. Its own notifications go to outExchange with topic outTopic;
// the relay looks for unsent ones every hour only, so each delivery
// rests on the NOTIFY of the commit that queued it.
func (r *rig) startBridge(fp string) {
	t := r.t
	t.Helper()
	addr := testbridge.FreeAddr(t)
	over := testbridge.Overrides(t, r.dbURL,
		"DEFAULT.host="+replica,
		"api.listen="+addr,
		"notifications.exchange="+r.novaExchange,
		"notifications.queue="+r.queues[0],
		"dispatch.results_queue="+r.queues[1],
		"dispatch.reports_queue="+r.queues[2],
		"policy.rules_file="+r.policy,
		"pipeline.poll_interval=100ms",
		"pipeline.request_timeout=1m",
		"oslo_messaging_notifications.exchange="+r.outExchange,
		"oslo_messaging_notifications.topics="+r.outTopic,
		"oslo_messaging_notifications.poll_interval=1h",
		"accounting.audit_period=1m",
		"accounting.close_delay=0s", // the default waits 5m after a period ends
	)
	args := []string{"serve"}
	for _, s := range over {
		args = append(args, "--set", s)
	}
	sp := testbridge.Spawn(t, addr, args, r.logPath, fp)
	r.proc, r.procDone, r.url = sp.Cmd, sp.Done, sp.URL
	r.admin = apiclient.New(apiclient.Config{URL: r.url, Token: testbridge.AdminToken, Timeout: 30 * time.Second})
}

// stopBridge stops the bridge with SIGTERM and waits until it has ended.
func (r *rig) stopBridge() {
	syscall.Kill(-r.proc.Process.Pid, syscall.SIGTERM) //nolint:errcheck
	select {
	case <-r.procDone:
	case <-time.After(30 * time.Second):
		r.t.Fatalf("the bridge did not stop within 30s of SIGTERM\n%s", r.bridgeLog(30))
	}
}

// waitKilled waits until the bridge killed itself at failpoint fp.
func (r *rig) waitKilled(fp string) {
	t := r.t
	t.Helper()
	select {
	case <-r.procDone:
	case <-time.After(60 * time.Second):
		t.Fatalf("the bridge did not reach failpoint %s within 60s\n%s", fp, r.bridgeLog(30))
	}
	ws, ok := r.proc.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the bridge ended with %v, want SIGKILL at failpoint %s\n%s", r.proc.ProcessState, fp, r.bridgeLog(30))
	}
	if !strings.Contains(r.bridgeLog(1000), "failpoint "+fp+": SIGKILL") {
		t.Fatalf("the bridge was killed, but not at failpoint %s\n%s", fp, r.bridgeLog(30))
	}
}

func (r *rig) bridgeLog(n int) string {
	b, _ := os.ReadFile(r.logPath)
	return testsvc.LastLines(string(b), n)
}

// startAgent runs vgpu-agent in this process on a fake host with the
// rig's two T4s (no mdev yet) and a running domain of r.vm (none of
// r.ghost), and waits until the bridge has its report.
func (r *rig) startAgent() {
	r.fake = testagent.Start(r.ctx, r.t, r.pool, testagent.Host{Name: r.host, Node: r.node, GPUs: [2]string{gpuA, gpuB}, VM: r.vm, Dir: r.dir})
}

// ask makes a request through the operator API (POST /v1/requests) and
// returns its id.
func (r *rig) ask(req apiclient.NewRequest) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.ctx, 15*time.Second)
	defer cancel()
	ans, err := r.admin.CreateRequest(ctx, req, "")
	testsvc.Must(r.t, err, "POST /v1/requests "+req.Type)
	return ans.RequestID
}

// final waits until the request is final and returns it.
func (r *rig) final(id string) apiclient.Request {
	r.t.Helper()
	var last apiclient.Request
	r.waitFor(90*time.Second, "request "+id+" final", func() bool {
		var err error
		last, err = r.admin.Request(r.ctx, id)
		return err == nil && apiclient.FinalState(last.State)
	})
	return last
}

func (r *rig) waitFor(within time.Duration, what string, ok func() bool) {
	r.t.Helper()
	testsvc.WaitFor(r.t, within, what, ok)
}

// attachments are the instance's vGPU attachments, oldest first.
func (r *rig) attachments(instance string) []attachment {
	rows, err := r.pool.Query(r.ctx, `SELECT id::text, coalesce(profile,''), coalesce(provider_uuid::text,''), coalesce(pci_address,''), state
		FROM vgpu_attachments WHERE instance_uuid = $1 ORDER BY created_at, id`, instance)
	testsvc.Must(r.t, err, "attachments")
	defer rows.Close()
	var out []attachment
	for rows.Next() {
		var a attachment
		testsvc.Must(r.t, rows.Scan(&a.id, &a.profile, &a.provider, &a.pci, &a.state), "scan attachment")
		out = append(out, a)
	}
	return out
}

type attachment struct {
	id, profile, provider, pci, state string
}

func deleteQueues(t *testing.T, names ...string) {
	c, err := amqp.Dial(testsvc.RabbitURL(t))
	if err != nil {
		return
	}
	defer c.Close()
	for _, q := range names {
		if ch, err := c.Channel(); err == nil {
			ch.QueueDelete(q, false, false, false) //nolint:errcheck
			ch.Close()
		}
	}
}

func deleteExchanges(t *testing.T, names ...string) {
	c, err := amqp.Dial(testsvc.RabbitURL(t))
	if err != nil {
		return
	}
	defer c.Close()
	for _, x := range names {
		if ch, err := c.Channel(); err == nil {
			ch.ExchangeDelete(x, false, false) //nolint:errcheck
			ch.Close()
		}
	}
}

// received is one notification as tests/oslo_listen.py printed it: what
// oslo.messaging's listener handed its endpoint.
type received struct {
	Priority    string          `json:"priority"` // the endpoint method: info, error, ...
	PublisherID string          `json:"publisher_id"`
	EventType   string          `json:"event_type"`
	Payload     json.RawMessage `json:"payload"`
	Metadata    struct {
		MessageID string `json:"message_id"`
		Timestamp string `json:"timestamp"`
	} `json:"metadata"`
}

// listener is tests/oslo_listen.py: Debian's python3-oslo.messaging
// notification listener on the bridge's exchange and topic, in a pool
// (a queue) of its own.
type listener struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	mu   sync.Mutex
	got  []received
	bad  []string // lines that are not notifications
	err  strings.Builder
	done chan struct{}
}

// listen starts tests/oslo_listen.py and waits until its queue is bound
// (it prints READY).
func (r *rig) listen() *listener {
	t := r.t
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "oslo_listen.py")
	pool := testsvc.Name("ntf-listener")
	const hint = "tests/oslo_listen.py needs Debian's python3-oslo.messaging and the local RabbitMQ; start them with `make services` (tests/services.sh)"
	cmd := exec.Command("/usr/bin/python3", script, "--url", testsvc.TransportURL(t),
		"--exchange", r.outExchange, "--topic", r.outTopic, "--pool", pool)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C.UTF-8"}
	l := &listener{t: t, cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &l.mu, w: &l.err}
	var err error
	l.in, err = cmd.StdinPipe()
	testsvc.Must(t, err, "stdin")
	out, err := cmd.StdoutPipe()
	testsvc.Must(t, err, "stdout")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start /usr/bin/python3 %s: %v; %s", script, err, hint)
	}
	ready := make(chan struct{})
	go func() {
		defer close(l.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch line {
			case "READY":
				close(ready)
				continue
			case "STOPPED":
				continue
			}
			var n received
			l.mu.Lock()
			if err := json.Unmarshal([]byte(line), &n); err != nil || n.EventType == "" {
				l.bad = append(l.bad, line)
			} else {
				l.got = append(l.got, n)
			}
			l.mu.Unlock()
		}
		cmd.Wait() //nolint:errcheck
	}()
	t.Cleanup(func() {
		l.in.Close() // the end of stdin stops it
		select {
		case <-l.done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill() //nolint:errcheck
			<-l.done
			t.Errorf("tests/oslo_listen.py did not stop within 15s of the end of its stdin")
		}
		deleteQueues(t, pool)
		if b := l.badLines(); len(b) > 0 {
			t.Errorf("tests/oslo_listen.py printed lines that are not notifications: %q", b)
		}
	})
	select {
	case <-ready:
	case <-l.done:
		t.Fatalf("tests/oslo_listen.py ended before it listened (%v):\n%s\n%s", cmd.ProcessState, l.stderr(), hint)
	case <-time.After(60 * time.Second):
		t.Fatalf("tests/oslo_listen.py not listening within 60s:\n%s\n%s", l.stderr(), hint)
	}
	return l
}

func (l *listener) stderr() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err.String()
}

func (l *listener) badLines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.bad...)
}

// all returns what the listener received so far, in order.
func (l *listener) all() []received {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]received(nil), l.got...)
}

// lockedWriter writes to w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}
