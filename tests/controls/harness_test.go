// Package controls_test runs the operator controls against a real bridge
// (Postgres, RabbitMQ, Placement) with a fleet in Placement and an
// in-process vgpu-agent on a fake host: pause and resume, observe-only,
// host and GPU drains, Nova compute services disabled, dead-letter
// replay, retention purge, the audit log and the profile catalog.
package controls_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testagent"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const (
	t4q4Trait = "CUSTOM_NVIDIA_232" // T4-4Q, 4 per GPU
	labSecret = "controls-test-webhook-secret-3b9d"
)

// host is a compute host of the test fleet: its Placement providers and,
// when agent is set, an in-process vgpu-agent on a fake host.
type host struct {
	name, node string
	agent      bool
	gpus       []string          // PCI addresses, T4-4Q × 4 each
	root       string            // root provider
	providers  map[string]string // PCI address → provider uuid
	vm         string            // an instance running on the host
}

// fleet is a real running bridge over a fleet in Placement.
type fleet struct {
	t        *testing.T
	ctx      context.Context
	dir      string
	url      string
	dbURL    string
	pool     *pgxpool.Pool
	hosts    []*host
	sc       *gophercloud.ServiceClient
	exchange string
	queues   []string // notifications, results, reports
	admin    *apiclient.Client
	key      []byte
	secret   string
	stop     func() // stops the bridge
	// proc and procDone are the bridge subprocess of crash tests
	// (startProcess); procDone closes when it has ended.
	proc     *exec.Cmd
	procDone <-chan struct{}
}

// TestMain removes the binaries the tests built (crash tests, vgpuctl).
func TestMain(m *testing.M) {
	code := m.Run()
	testsvc.RemoveBinaries()
	os.Exit(code)
}

// newFleet creates two compute hosts in Placement (A with an agent on a
// fake host, B without), each with two T4 GPUs typed T4-4Q and one
// instance, and the bridge's queues; the bridge is started by start.
func newFleet(t *testing.T) *fleet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	id := strings.TrimPrefix(testsvc.Name("ctl"), "ctl-")
	f := &fleet{t: t, ctx: ctx, dir: t.TempDir(), exchange: "nova-ctl-" + id}
	f.queues = []string{"vgpu-ctl-" + id + ".notifications", "vgpu-ctl-" + id + ".results", "vgpu-ctl-" + id + ".reports"}
	f.hosts = []*host{
		{name: "ctl-compute-a-" + id, agent: true, gpus: []string{"0000:3b:00.0", "0000:3c:00.0"}},
		{name: "ctl-compute-b-" + id, gpus: []string{"0000:3b:00.0", "0000:3c:00.0"}},
	}
	for _, h := range f.hosts {
		h.node = h.name + ".ctl.test"
		h.vm = uuid.NewString()
	}
	f.secret = filepath.Join(f.dir, "lab.secret")
	testsvc.Must(t, os.WriteFile(f.secret, []byte(labSecret+"\n"), 0o600), "secret file")
	var err error
	f.key, err = apiclient.WebhookKey(labSecret)
	testsvc.Must(t, err, "webhook key")
	f.dbURL = testsvc.Postgres(t)
	f.placement()
	t.Cleanup(func() {
		deleteQueues(t, append(f.queues, protocol.AgentQueue(f.hosts[0].name))...)
		if c, err := amqp.Dial(testsvc.RabbitURL(t)); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.ExchangeDelete(f.exchange, false, false) //nolint:errcheck
			}
			c.Close()
		}
	})
	return f
}

// start runs the bridge (stopping a running one first) with extra option
// overrides, until the test ends or stop.
func (f *fleet) start(extra ...string) {
	if f.stop != nil {
		f.stop()
	}
	var d *bridge.Daemon
	d, f.stop = f.launch(extra...)
	f.url = "http://" + d.API.Addr()
	f.pool = d.Pool
	f.admin = apiclient.New(apiclient.Config{URL: f.url, Token: testbridge.AdminToken, Timeout: 30 * time.Second})
}

// config writes the fleet's bridge.conf and returns its path and the
// option overrides of a bridge on the fleet's database and queues; extra
// ones win.
func (f *fleet) config(extra ...string) (string, []string) {
	t := f.t
	ini := filepath.Join(f.dir, "bridge.conf")
	testsvc.Must(t, os.WriteFile(ini, []byte("[webhook_source:lab]\nauth = hmac\nsecret_files = "+f.secret+"\nrate = 1000\nburst = 1000\n"), 0o600), "bridge.conf")
	return ini, testbridge.Overrides(t, f.dbURL, append([]string{
		"notifications.exchange=" + f.exchange,
		"notifications.queue=" + f.queues[0],
		"dispatch.results_queue=" + f.queues[1],
		"dispatch.reports_queue=" + f.queues[2],
		"policy.rules_file=" + abs(t, "testdata/policy.yaml"),
		"pipeline.poll_interval=100ms",
		"pipeline.request_timeout=2m",
		"placement.sync_interval=1h", // exclusions must follow NOTIFY, not the sync rounds
	}, extra...)...)
}

// launch runs one more bridge replica on the fleet's database and queues
// and waits until it is ready and consumes notifications.
func (f *fleet) launch(extra ...string) (*bridge.Daemon, func()) {
	t := f.t
	ini, over := f.config(extra...)
	v, err := bridge.LoadConfig(conf.Source{File: ini, Overrides: over})
	testsvc.Must(t, err, "bridge configuration")
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *bridge.Daemon, 1)
	done := make(chan error, 1)
	go func() { done <- bridge.Run(ctx, v, nil, func(d *bridge.Daemon) { started <- d }) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("bridge.Run returned %v on shutdown", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("bridge did not shut down within 30s")
		}
	}
	t.Cleanup(stop)
	var d *bridge.Daemon
	select {
	case d = <-started:
	case err := <-done:
		stopped = true
		t.Fatalf("bridge stopped at start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("bridge did not start within 60s")
	}
	admin := apiclient.New(apiclient.Config{URL: "http://" + d.API.Addr(), Token: testbridge.AdminToken, Timeout: 30 * time.Second})
	f.waitFor(2*time.Minute, "the bridge is ready", func() bool {
		_, err := admin.Ready(f.ctx)
		return err == nil
	})
	if u := d.API.Undescribed(); len(u) > 0 {
		t.Errorf("undescribed API routes: %v", u)
	}
	conn, err := amqp.Dial(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "dial broker")
	defer conn.Close()
	f.waitFor(30*time.Second, "the bridge consumes its notification queue", func() bool {
		c, err := conn.Channel()
		if err != nil {
			return false
		}
		defer c.Close()
		q, err := c.QueueDeclarePassive(f.queues[0], true, false, false, false, nil)
		return err == nil && q.Consumers > 0
	})
	return d, stop
}

func abs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	testsvc.Must(t, err, "abs")
	return a
}

// placement creates what Nova's libvirt driver would: per host a root
// provider named like the agent's node, one child per GPU with VGPU
// inventory and the type trait, and each host's instance holding VCPU and
// MEMORY_MB on the root.
func (f *fleet) placement() {
	c, err := placement.NewClient(f.ctx, placement.ClientConfig{Endpoint: testsvc.PlacementURL(f.t), Token: "admin"})
	testsvc.Must(f.t, err, "placement client")
	f.sc = c.ServiceClient()
	want := make([]testsvc.FleetHost, len(f.hosts))
	for i, h := range f.hosts {
		want[i] = testsvc.FleetHost{Node: h.node, VM: h.vm}
		for _, addr := range h.gpus {
			want[i].GPUs = append(want[i].GPUs, testsvc.FleetGPU{PCI: addr, Trait: t4q4Trait, Total: 4})
		}
	}
	for i, p := range testsvc.PlacementFleet(f.ctx, f.t, f.sc, want) {
		f.hosts[i].root, f.hosts[i].providers = p.Root, p.GPUs
	}
}

// startAgent runs vgpu-agent in this process on a fake host with h's
// GPUs and a running domain of h's instance, and waits for its report.
func (f *fleet) startAgent(h *host) {
	testagent.Start(f.ctx, f.t, f.pool, testagent.Host{Name: h.name, Node: h.node, GPUs: [2]string{h.gpus[0], h.gpus[1]}, VM: h.vm, Dir: f.dir})
}

// publish sends Nova notifications (raw bodies, as oslo.messaging would)
// to the bridge's exchange with publisher confirms.
func (f *fleet) publish(bodies ...[]byte) {
	t := f.t
	conn, err := amqp.Dial(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "dial broker")
	defer conn.Close()
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, ch.Confirm(false), "confirm mode")
	for _, b := range bodies {
		dc, err := ch.PublishWithDeferredConfirmWithContext(f.ctx, f.exchange, "versioned_notifications.info", false, false,
			amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: b})
		testsvc.Must(t, err, "publish")
		if ok, err := dc.WaitContext(f.ctx); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

// wire wraps a notification in oslo's envelope with a fresh message id.
func wire(t *testing.T, msg map[string]any) []byte {
	b, err := json.Marshal(msg)
	testsvc.Must(t, err, "marshal")
	w, err := nova.WireMessage(b, uuid.NewString(), time.Now().UTC())
	testsvc.Must(t, err, "wire")
	return w
}

// notifyCreates publishes Nova's instance.create.end of each host's
// instance and waits until the bridge knows them.
func (f *fleet) notifyCreates() {
	for i, h := range f.hosts {
		f.publish(wire(f.t, map[string]any{
			"event_type": "instance.create.end", "priority": "INFO", "publisher_id": "nova-compute:" + h.name,
			"payload": map[string]any{"nova_object.name": "InstanceActionPayload", "nova_object.namespace": "nova", "nova_object.version": "1.9",
				"nova_object.data": map[string]any{"uuid": h.vm, "display_name": fmt.Sprintf("ctl-vm-%d", i+1), "tenant_id": "p-ctl", "user_id": "u-ctl",
					"host": h.name, "node": h.node, "state": "active", "task_state": nil, "power_state": "running",
					"flavor": map[string]any{"nova_object.name": "FlavorPayload", "nova_object.namespace": "nova", "nova_object.version": "1.4",
						"nova_object.data": map[string]any{"flavorid": "f-ctl", "name": "m1.large", "vcpus": 2, "memory_mb": 2048, "extra_specs": map[string]string{}}}}},
		}))
	}
	for _, h := range f.hosts {
		f.waitFor(30*time.Second, "instance "+h.vm+" known", func() bool {
			in, err := f.admin.Instance(f.ctx, h.vm)
			return err == nil && in.Host != nil && *in.Host == h.name
		})
	}
}

// serviceUpdate is nova-compute's service.update notification of h.
func serviceUpdate(t *testing.T, h *host, disabled bool, reason string) []byte {
	var r any
	if reason != "" {
		r = reason
	}
	return wire(t, map[string]any{
		"event_type": "service.update", "priority": "INFO", "publisher_id": "nova-api:ctl-controller",
		"payload": map[string]any{"nova_object.name": "ServiceStatusPayload", "nova_object.namespace": "nova", "nova_object.version": "1.1",
			"nova_object.data": map[string]any{"uuid": uuid.NewString(), "host": h.name, "binary": "nova-compute", "topic": "compute",
				"disabled": disabled, "disabled_reason": r, "forced_down": false, "version": 66, "availability_zone": nil,
				"last_seen_up": "2024-05-01T12:00:00Z", "report_count": 100}},
	})
}

// request sends a GPU request for h's instance through the lab webhook
// source and returns the request id.
func (f *fleet) request(h *host) string {
	return f.send(map[string]any{"type": "GPU_REQUEST", "vm_id": h.vm, "workload": "vdi", "vgpu_profile": "T4-4Q", "count": 1})
}

// send posts body as a signed webhook of source lab and returns the
// request id. Each body gets a nonce: the same request sent twice is two
// bodies (a signed body acts once).
func (f *fleet) send(body map[string]any) string {
	if _, ok := body["nonce"]; !ok {
		body["nonce"] = uuid.NewString()
	}
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(f.ctx, 15*time.Second)
	defer cancel()
	ans, err := f.admin.SendWebhook(ctx, "lab", b, apiclient.WebhookAuth{Scheme: apiclient.SchemeHub, Key: f.key})
	testsvc.Must(f.t, err, "webhook")
	return ans.RequestID
}

// final waits until the request is final and returns it.
func (f *fleet) final(id string) apiclient.Request {
	f.t.Helper()
	var last apiclient.Request
	f.waitFor(90*time.Second, "request "+id+" final", func() bool {
		var err error
		last, err = f.admin.Request(f.ctx, id)
		return err == nil && apiclient.FinalState(last.State)
	})
	return last
}

// call makes an API call with the admin token and returns status and body.
func (f *fleet) call(method, path string, body any, hdr ...string) (int, []byte) {
	f.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(f.ctx, method, f.url+path, r)
	testsvc.Must(f.t, err, "request")
	req.Header.Set("X-Auth-Token", testbridge.AdminToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	testsvc.Must(f.t, err, method+" "+path)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// metric reads one sample of the bridge's /metrics ("name{labels}").
func (f *fleet) metric(sample string) float64 {
	f.t.Helper()
	return f.metricAt(f.url, sample)
}

// metricAt reads one sample of the /metrics of the replica at url.
func (f *fleet) metricAt(url, sample string) float64 {
	f.t.Helper()
	resp, err := http.Get(url + "/metrics")
	testsvc.Must(f.t, err, "metrics")
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			var x float64
			fmt.Sscan(v, &x)
			return x
		}
	}
	f.t.Fatalf("metric %s not exposed", sample)
	return 0
}

func (f *fleet) waitFor(within time.Duration, what string, ok func() bool) {
	f.t.Helper()
	testsvc.WaitFor(f.t, within, what, ok)
}

// vgpuUnits sums a consumer's VGPU allocations in Placement.
func (f *fleet) vgpuUnits(consumer string) int {
	a, err := allocations.Get(f.ctx, f.sc, consumer).Extract()
	testsvc.Must(f.t, err, "get allocations")
	n := 0
	for _, pa := range a.Allocations {
		n += pa.Resources["VGPU"]
	}
	return n
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
