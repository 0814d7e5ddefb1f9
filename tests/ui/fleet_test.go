package ui

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const (
	t4q4Trait = "CUSTOM_NVIDIA_232" // T4-4Q, 4 per GPU
	t4q8Trait = "CUSTOM_NVIDIA_233" // T4-8Q, 2 per GPU
	labSecret = "ui-test-webhook-secret-5e0c1f7a"
)

// gpuSpec is one GPU provider of a test host.
type gpuSpec struct {
	pci   string
	trait string
	total int
	used  int // held by a consumer of its own, as Nova's vGPU instances are
}

// host is a compute host of the test fleet: its Placement providers and,
// when agent is set, an in-process vgpu-agent on a fake host.
type host struct {
	name, node string
	agent      bool
	gpus       []gpuSpec
	root       string
	providers  map[string]string // PCI address → provider uuid
	vm         string            // an instance running on the host
}

// fleet is a real running bridge with a fleet in Placement, agents,
// Nova notifications and requests.
type fleet struct {
	t        *testing.T
	ctx      context.Context
	url      string
	dbURL    string
	hosts    []*host
	sc       *gophercloud.ServiceClient
	exchange string
	admin    *apiclient.Client
	key      []byte
	requests map[string]string // label → request id
	overr    []string          // the bridge's option overrides
	secret   string            // the lab source's secret file
	mixed    bool              // host A's H200 is a mixed bridge-owned GPU (withMixedGPU)
}

// fleetOpt changes the fleet startFleet builds.
type fleetOpt func(*fleet)

// withMixedGPU puts host A's fake H200 in heterogeneous mode and declares
// it a mixed bridge-owned GPU ([placement] bridge_owned_gpus
// HOST/0000:c1:00.0=mixed): the bridge publishes its provider.
func withMixedGPU() fleetOpt { return func(f *fleet) { f.mixed = true } }

// mixedPF is the PF of host A's H200 (fakehost.DefaultSpec).
const mixedPF = "0000:c1:00.0"

// startFleet creates two compute hosts in Placement (one with an agent on
// a fake host, one without), runs the bridge on them, publishes Nova's
// create notifications of an instance on each, and sends two webhook
// requests, waiting until they are final and the fleet shows the claim.
func startFleet(t *testing.T, opts ...fleetOpt) *fleet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	id := strings.TrimPrefix(testsvc.Name("ui"), "ui-")
	f := &fleet{t: t, ctx: ctx, exchange: "nova-ui-" + id, requests: map[string]string{}}
	for _, o := range opts {
		o(f)
	}
	f.hosts = []*host{
		{name: "ui-compute-a-" + id, agent: true, gpus: []gpuSpec{
			{pci: "0000:3b:00.0", trait: t4q4Trait, total: 4},
			{pci: "0000:3c:00.0", trait: t4q4Trait, total: 4},
		}},
		{name: "ui-compute-b-" + id, gpus: []gpuSpec{
			{pci: "0000:3b:00.0", trait: t4q4Trait, total: 4, used: 3},
			{pci: "0000:3c:00.0", trait: t4q8Trait, total: 2},
		}},
	}
	for _, h := range f.hosts {
		h.node = h.name + ".ui.test"
		h.vm = uuid.NewString()
	}
	f.placement()
	if f.mixed {
		// The provider the bridge creates goes before the host's root
		// (cleanups run last first; the bridge has stopped by then).
		t.Cleanup(func() { f.deleteProviders(placement.GPUProviderName(f.hosts[0].node, mixedPF)) })
	}

	dir := t.TempDir()
	f.secret = filepath.Join(dir, "lab.secret")
	testsvc.Must(t, os.WriteFile(f.secret, []byte(labSecret+"\n"), 0o600), "secret file")
	var err error
	f.key, err = apiclient.WebhookKey(labSecret)
	testsvc.Must(t, err, "webhook key")
	f.dbURL = testsvc.Postgres(t)
	queues := []string{"vgpu-ui-" + id + ".notifications", "vgpu-ui-" + id + ".results", "vgpu-ui-" + id + ".reports"}
	f.overr = []string{
		"notifications.exchange=" + f.exchange,
		"notifications.queue=" + queues[0],
		"dispatch.results_queue=" + queues[1],
		"dispatch.reports_queue=" + queues[2],
		"policy.rules_file=" + abs(t, "testdata/policy.yaml"),
		"pipeline.poll_interval=100ms",
		"pipeline.request_timeout=2m",
		"placement.sync_interval=1s", // the host ↔ node map follows the agent's first report promptly
	}
	if f.mixed {
		f.overr = append(f.overr, "placement.bridge_owned_gpus="+f.hosts[0].name+"/"+mixedPF+"=mixed")
	}
	d := testbridge.Start(t, f.config(dir))
	f.url = "http://" + d.API.Addr()
	f.admin = apiclient.New(apiclient.Config{URL: f.url, Token: testbridge.AdminToken, Timeout: 10 * time.Second})
	t.Cleanup(func() { deleteQueues(t, append(queues, protocol.AgentQueue(f.hosts[0].name))...) })

	f.startAgent(f.hosts[0], dir)
	f.notifyCreates()
	f.sendRequests()
	return f
}

// config is the bridge configuration: testbridge's, with the lab webhook
// source (a templated section, which only a file can hold).
func (f *fleet) config(dir string, extra ...string) *conf.Values {
	ini := filepath.Join(dir, "bridge.conf")
	testsvc.Must(f.t, os.WriteFile(ini, []byte("[webhook_source:lab]\nauth = hmac\nsecret_files = "+f.secret+"\nrate = 1000\nburst = 1000\n"), 0o600), "bridge.conf")
	v, err := bridge.LoadConfig(conf.Source{File: ini, Overrides: testbridge.Overrides(f.t, f.dbURL, append(f.overr, extra...)...)})
	testsvc.Must(f.t, err, "bridge configuration")
	return v
}

func abs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	testsvc.Must(t, err, "abs")
	return a
}

// placement creates what Nova's libvirt driver would: per host a root
// provider named like the agent's node, one child per GPU with VGPU
// inventory and the type trait; a consumer holding a GPU's used units;
// and each host's instance holding VCPU and MEMORY_MB on the root.
func (f *fleet) placement() {
	c, err := placement.NewClient(f.ctx, placement.ClientConfig{Endpoint: testsvc.PlacementURL(f.t), Token: "admin"})
	testsvc.Must(f.t, err, "placement client")
	f.sc = c.ServiceClient()
	want := make([]testsvc.FleetHost, len(f.hosts))
	for i, h := range f.hosts {
		want[i] = testsvc.FleetHost{Node: h.node, VM: h.vm}
		for _, g := range h.gpus {
			want[i].GPUs = append(want[i].GPUs, testsvc.FleetGPU{PCI: g.pci, Trait: g.trait, Total: g.total, Used: g.used})
		}
	}
	for i, p := range testsvc.PlacementFleet(f.ctx, f.t, f.sc, want) {
		f.hosts[i].root, f.hosts[i].providers = p.Root, p.GPUs
	}
}

// startAgent runs vgpu-agent in this process on a fake host with h's
// GPUs and a running domain of h's instance.
func (f *fleet) startAgent(h *host, dir string) {
	t := f.t
	spec := fakehost.DefaultSpec()
	spec.Host = h.name
	spec.MdevGPUs[0].Addr, spec.MdevGPUs[1].Addr = pci.MustParse(h.gpus[0].pci), pci.MustParse(h.gpus[1].pci)
	spec.MdevGPUs[0].Mdevs = nil
	spec.VFIOGPUs[0].Heterogeneous = f.mixed
	spec.Domains = []fakehost.Domain{{Name: "instance-00000001", UUID: h.vm, Running: true}}
	fake := filepath.Join(dir, "fake-"+h.name)
	_, err := fakehost.Build(fake, spec)
	testsvc.Must(t, err, "fake host")
	v, err := agent.LoadConfig(conf.Source{Overrides: append([]string{"DEFAULT.host=" + h.name, "DEFAULT.node=" + h.node,
		"DEFAULT.transport_url=" + testsvc.TransportURL(t), "DEFAULT.state_path=" + filepath.Join(dir, "state-"+h.name),
		"DEFAULT.listen=127.0.0.1:0", "DEFAULT.report_check_interval=1s", "DEFAULT.reconnect_max_backoff=2s", "DEFAULT.shutdown_timeout=5s"},
		testkeys.For(t).Agent(h.name)...)})
	testsvc.Must(t, err, "agent config")
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- agent.RunWith(ctx, v, nil, agent.RunOptions{FakeHostDir: fake}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("agent did not stop")
		}
	})
	f.waitFor(30*time.Second, "the agent of "+h.name+" reports", func() bool {
		var st struct {
			Hosts []struct {
				Name         string     `json:"name"`
				LastReportAt *time.Time `json:"last_report_at"`
			} `json:"hosts"`
		}
		if f.getJSON("/v1/status", &st) != nil {
			return false
		}
		for _, x := range st.Hosts {
			if x.Name == h.name && x.LastReportAt != nil {
				return true
			}
		}
		return false
	})
}

// notifyCreates publishes Nova's instance.create.end of each host's
// instance, as nova-compute would, and waits until both are known.
func (f *fleet) notifyCreates() {
	t := f.t
	conn, err := amqp.Dial(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "dial broker")
	defer conn.Close()
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, ch.Confirm(false), "confirm mode")
	t.Cleanup(func() {
		if c, err := amqp.Dial(testsvc.RabbitURL(t)); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.ExchangeDelete(f.exchange, false, false) //nolint:errcheck
			}
			c.Close()
		}
	})
	f.waitFor(30*time.Second, "the bridge consumes its notification queue", func() bool {
		c, err := conn.Channel()
		if err != nil {
			return false
		}
		defer c.Close()
		q, err := c.QueueDeclarePassive(strings.TrimPrefix(f.overr[1], "notifications.queue="), true, false, false, false, nil)
		return err == nil && q.Consumers > 0
	})
	for i, h := range f.hosts {
		payload := map[string]any{
			"event_type": "instance.create.end", "priority": "INFO", "publisher_id": "nova-compute:" + h.name,
			"payload": map[string]any{"nova_object.name": "InstanceActionPayload", "nova_object.namespace": "nova", "nova_object.version": "1.9",
				"nova_object.data": map[string]any{"uuid": h.vm, "display_name": fmt.Sprintf("ui-vm-%d", i+1), "tenant_id": "p-ui", "user_id": "u-ui",
					"host": h.name, "node": h.node, "state": "active", "task_state": nil, "power_state": "running",
					"flavor": map[string]any{"nova_object.name": "FlavorPayload", "nova_object.namespace": "nova", "nova_object.version": "1.4",
						"nova_object.data": map[string]any{"flavorid": "f-ui", "name": "m1.large", "vcpus": 2, "memory_mb": 2048, "extra_specs": map[string]string{}}}}},
		}
		b, err := json.Marshal(payload)
		testsvc.Must(t, err, "marshal")
		w, err := nova.WireMessage(b, uuid.NewString(), time.Now().UTC())
		testsvc.Must(t, err, "wire")
		dc, err := ch.PublishWithDeferredConfirmWithContext(f.ctx, f.exchange, "versioned_notifications.info", false, false,
			amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: w})
		testsvc.Must(t, err, "publish")
		if ok, err := dc.WaitContext(f.ctx); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
	for _, h := range f.hosts {
		f.waitFor(30*time.Second, "instance "+h.vm+" known", func() bool {
			var in struct {
				Host string `json:"host"`
			}
			return f.getJSON("/v1/instances/"+h.vm, &in) == nil && in.Host == h.name
		})
	}
}

// sendRequests sends, through the lab webhook source, a GPU request for
// the instance on the host with an agent (the agent hot-plugs a T4-4Q:
// succeeded) and a release for the other one (nothing to release), and
// waits until both are final and the claim shows in GET /v1/hosts.
func (f *fleet) sendRequests() {
	t := f.t
	for _, r := range []struct {
		label string
		body  map[string]any
	}{
		{"attach", map[string]any{"type": "GPU_REQUEST", "vm_id": f.hosts[0].vm, "workload": "vdi", "vgpu_profile": "T4-4Q", "count": 1}},
		{"release", map[string]any{"type": "GPU_RELEASE", "vm_id": f.hosts[1].vm}},
	} {
		b, _ := json.Marshal(r.body)
		ctx, cancel := context.WithTimeout(f.ctx, 15*time.Second)
		ans, err := f.admin.SendWebhook(ctx, "lab", b, apiclient.WebhookAuth{Scheme: apiclient.SchemeHub, Key: f.key})
		cancel()
		testsvc.Must(t, err, "webhook "+r.label)
		f.requests[r.label] = ans.RequestID
	}
	for label, id := range f.requests {
		var last apiclient.Request
		f.waitFor(90*time.Second, "request "+label+" final", func() bool {
			var err error
			last, err = f.admin.Request(f.ctx, id)
			return err == nil && apiclient.FinalState(last.State)
		})
		if label == "attach" && last.State != "succeeded" {
			t.Fatalf("request attach ended %s (%s: %s), want succeeded", last.State, last.Code, last.Reason)
		}
	}
	f.waitFor(30*time.Second, "GET /v1/hosts shows the claim on "+f.hosts[0].name+", named after its agent's report", func() bool {
		var hl apiclient.HostList
		if f.getJSON("/v1/hosts", &hl) != nil {
			return false
		}
		for _, x := range hl.Hosts {
			if x.Node == f.hosts[0].node {
				return x.Used == 1 && x.Name == f.hosts[0].name
			}
		}
		return false
	})
}

func (f *fleet) getJSON(path string, out any) error {
	req, err := http.NewRequestWithContext(f.ctx, http.MethodGet, f.url+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Auth-Token", testbridge.ReaderToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (f *fleet) waitFor(within time.Duration, what string, ok func() bool) {
	f.t.Helper()
	testsvc.WaitFor(f.t, within, what, ok)
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

// deleteProviders deletes the Placement providers named name.
func (f *fleet) deleteProviders(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pages, err := resourceproviders.List(f.sc, resourceproviders.ListOpts{Name: name}).AllPages(ctx)
	if err != nil {
		f.t.Logf("cleanup: providers named %s: %v", name, err)
		return
	}
	ps, err := resourceproviders.ExtractResourceProviders(pages)
	if err != nil {
		f.t.Logf("cleanup: providers named %s: %v", name, err)
		return
	}
	for _, p := range ps {
		if err := resourceproviders.Delete(ctx, f.sc, p.UUID).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
			f.t.Logf("cleanup: provider %s: %v", p.UUID, err)
		}
	}
}
