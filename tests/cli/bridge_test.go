package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"gopkg.in/yaml.v3"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/tests/placementfleet"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Credentials of the test bridge. None may reach output or logs.
const (
	adminToken   = "cli-admin-token-4b1d9e"
	readToken    = "cli-reader-token-7c2a0f"
	projectToken = "cli-project-token-5e8a31" // a reader of project p1 only
	labSecret    = "lab-webhook-secret-0123456789abcdef"
)

// Instances the test publishes Nova notifications about.
const (
	vmTrain  = "00000000-0000-4000-8000-000000000001"
	vmWeb    = "00000000-0000-4000-8000-000000000002"
	vmRender = "00000000-0000-4000-8000-000000000003"
)

var t0 = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

type bridgeEnv struct {
	url      string
	pool     *pgxpool.Pool
	secret   string // path of the lab source's secret file
	exchange string
	pub      *amqp.Channel
	admin    ctl
	reader   ctl
	project  ctl // a reader scoped to project p1
	anon     ctl
}

// startBridge runs bridge.Run with its own database, exchanges and queue
// until the test ends. The bridge's own notifications go to an exchange
// of this test's, not the shared default (vgpu_bridge).
func startBridge(t *testing.T) *bridgeEnv {
	t.Helper()
	dir := t.TempDir()
	e := &bridgeEnv{exchange: testsvc.Name("nova-cli"), secret: writeFile(t, dir, "lab.secret", labSecret+"\n")}
	queue := testsvc.Name("vgpu-bridge-cli")
	outExchange := testsvc.Name("vgpu-bridge-cli-out")
	tokens := writeFile(t, dir, "tokens", adminToken+" admin ops\n"+readToken+" reader viewer\n"+projectToken+" reader p1-viewer p1\n")
	placementToken := writeFile(t, dir, "placement-token", "admin\n")
	ini := fmt.Sprintf(`[DEFAULT]
transport_url = %s

[database]
connection = %s
auto_migrate = true

[api]
listen = 127.0.0.1:0
auth_strategy = token
token_file = %s

[notifications]
exchange = %s
queue = %s
committers = 1
silence_warning = 0

[policy]
rules_file = %s
profiles_file = %s
driver_compat_file = %s

[placement]
endpoint_override = %s
token_file = %s

[webhook_source:lab]
auth = hmac
secret_files = %s
rate = 1000
burst = 1000

[oslo_messaging_notifications]
exchange = %s
`, testsvc.TransportURL(t), testsvc.Postgres(t), tokens, e.exchange, queue,
		abs(t, "testdata/rules.yaml"), abs(t, "testdata/profiles.yaml"), abs(t, "testdata/driver-compat.yaml"),
		testsvc.PlacementURL(t), placementToken, e.secret, outExchange)
	v, err := bridge.LoadConfig(conf.Source{File: writeFile(t, dir, "bridge.conf", ini), Overrides: testkeys.For(t).Bridge()})
	testsvc.Must(t, err, "bridge configuration")

	conn, err := amqp.Dial(testsvc.RabbitURL(t))
	testsvc.Must(t, err, "dial broker")
	t.Cleanup(func() {
		if c, err := conn.Channel(); err == nil {
			c.QueueDelete(queue, false, false, false)   //nolint:errcheck
			c.ExchangeDelete(e.exchange, false, false)  //nolint:errcheck
			c.ExchangeDelete(outExchange, false, false) //nolint:errcheck
		}
		conn.Close()
	})
	e.pub, err = conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, e.pub.Confirm(false), "confirm mode")

	d := testbridge.Start(t, v)
	e.url, e.pool = "http://"+d.API.Addr(), d.Pool
	// Publish only once the bridge consumes: its queue is then declared
	// and bound (a passive declare that fails closes its channel).
	waitFor(t, 30*time.Second, "the bridge consumes its queue", func() bool {
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Consumers > 0
	})
	e.admin = ctl{url: e.url, token: adminToken}
	e.reader = ctl{url: e.url, token: readToken}
	e.project = ctl{url: e.url, token: projectToken}
	e.anon = ctl{url: e.url}
	return e
}

// notification builds an oslo envelope of an instance action.
func notification(t *testing.T, msgID, eventType, vm, name, project, host, vmState string, vgpus int, at time.Time) []byte {
	t.Helper()
	specs := map[string]string{}
	if vgpus > 0 {
		specs = map[string]string{"resources:VGPU": fmt.Sprint(vgpus), "trait:CUSTOM_NVIDIA_232": "required"}
	}
	flavor := map[string]any{"nova_object.name": "FlavorPayload", "nova_object.namespace": "nova", "nova_object.version": "1.4",
		"nova_object.data": map[string]any{"flavorid": "f-" + name, "name": map[bool]string{true: "g1.t4-4q", false: "m1.large"}[vgpus > 0],
			"vcpus": 4, "memory_mb": 8192, "extra_specs": specs}}
	sample := map[string]any{
		"event_type": eventType, "priority": "INFO", "publisher_id": "nova-compute:" + host,
		"payload": map[string]any{"nova_object.name": "InstanceActionPayload", "nova_object.namespace": "nova", "nova_object.version": "1.9",
			"nova_object.data": map[string]any{"uuid": vm, "display_name": name, "tenant_id": project, "user_id": "u1", "host": host,
				"node": host + ".example.org", "state": vmState, "task_state": nil, "power_state": "running", "flavor": flavor}},
	}
	b, err := json.Marshal(sample)
	testsvc.Must(t, err, "marshal")
	w, err := nova.WireMessage(b, msgID, at)
	testsvc.Must(t, err, "wire")
	return w
}

func (e *bridgeEnv) publish(t *testing.T, bodies ...[]byte) {
	t.Helper()
	for _, b := range bodies {
		dc, err := e.pub.PublishWithDeferredConfirmWithContext(context.Background(), e.exchange, "versioned_notifications.info", false, false,
			amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: b})
		testsvc.Must(t, err, "publish")
		if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

func (e *bridgeEnv) client(token string) *apiclient.Client {
	return apiclient.New(apiclient.Config{URL: e.url, Token: token})
}

func TestAgainstBridge(t *testing.T) {
	e := startBridge(t)
	e.publish(t,
		notification(t, "m1", "instance.create.end", vmTrain, "train-1", "p1", "cn1", "active", 1, t0),
		notification(t, "m2", "instance.create.end", vmWeb, "web-1", "p2", "cn2", "active", 0, t0.Add(time.Second)),
		notification(t, "m3", "instance.create.end", vmRender, "render-1", "p1", "cn1", "active", 2, t0.Add(2*time.Second)),
		notification(t, "m4", "instance.power_off.end", vmRender, "render-1", "p1", "cn1", "stopped", 2, t0.Add(time.Minute)),
		[]byte("this is not JSON"),
	)
	api := e.client(adminToken)
	ctx := context.Background()
	waitFor(t, 30*time.Second, "four events and a dead letter ingested", func() bool {
		el, err1 := api.Events(ctx, apiclient.EventFilter{})
		dl, err2 := api.DeadLetters(ctx, apiclient.DeadLetterFilter{})
		return err1 == nil && err2 == nil && len(el.Events) == 4 && len(dl.DeadLetters) == 1
	})

	t.Run("health", func(t *testing.T) {
		r := e.anon.must(t, 0, "health")
		golden(t, "health", r.stdout)
	})

	t.Run("instances", func(t *testing.T) {
		golden(t, "instances", e.reader.must(t, 0, "instances").stdout)
		golden(t, "instances-vgpu-cn1", e.reader.must(t, 0, "instances", "--has-vgpu", "--host", "cn1").stdout)
		golden(t, "instances-novgpu", e.reader.must(t, 0, "instances", "--has-vgpu=false").stdout)
		golden(t, "instances-p2", e.reader.must(t, 0, "instances", "--project", "p2").stdout)

		// JSON is the API's answer as sent.
		var page struct {
			Instances []map[string]any `json:"instances"`
		}
		r := e.reader.must(t, 0, "instances", "-o", "json")
		if err := json.Unmarshal([]byte(r.stdout), &page); err != nil || len(page.Instances) != 3 {
			t.Fatalf("json: %v\n%s", err, r.stdout)
		}
		if page.Instances[2]["uuid"] != vmRender || page.Instances[2]["vm_state"] != "stopped" || page.Instances[2]["vgpus"] != 2.0 {
			t.Errorf("json instance: %v", page.Instances[2])
		}
		var y struct {
			Instances []struct {
				UUID    string `yaml:"uuid"`
				VGPUs   int    `yaml:"vgpus"`
				HasVGPU bool   `yaml:"has_vgpu"`
			} `yaml:"instances"`
		}
		r = e.reader.must(t, 0, "instances", "--has-vgpu", "-o", "yaml")
		if err := yaml.Unmarshal([]byte(r.stdout), &y); err != nil || len(y.Instances) != 2 || y.Instances[1].VGPUs != 2 || !y.Instances[1].HasVGPU {
			t.Fatalf("yaml: %v %+v\n%s", err, y, r.stdout)
		}
		// Paging: the cursor is offered on stderr in table output.
		r = e.reader.must(t, 0, "instances", "--limit", "2")
		if !strings.Contains(r.stderr, "more: add --cursor ") {
			t.Fatalf("no cursor hint: %s", r)
		}
		cursor := strings.TrimSpace(strings.TrimPrefix(r.stderr, "more: add --cursor "))
		r = e.reader.must(t, 0, "instances", "--limit", "2", "--cursor", cursor)
		if !strings.Contains(r.stdout, vmRender) || strings.Contains(r.stdout, vmTrain) || r.stderr != "" {
			t.Errorf("second page: %s", r)
		}

		golden(t, "instance-show", mask(e.reader.must(t, 0, "instances", "show", vmRender).stdout, nil))
		r = e.reader.must(t, 1, "instances", "show", "00000000-0000-4000-8000-000000000099")
		if !strings.HasPrefix(r.stderr, "vgpuctl: Instance not found: no notification about instance 00000000-0000-4000-8000-000000000099 has been received\n  request id: req-") {
			t.Errorf("unknown instance: %s", r)
		}
		r = e.reader.must(t, 1, "instances", "--limit", "5000", "--has-vgpu=true")
		if !strings.HasPrefix(r.stderr, "vgpuctl: Invalid request: 1 invalid field(s)\n  limit: an integer from 1 to 1000\n") {
			t.Errorf("invalid params: %s", r)
		}
	})

	t.Run("events", func(t *testing.T) {
		golden(t, "events", e.reader.must(t, 0, "events", "--type", "instance.*").stdout)
		golden(t, "events-render-poweroff", e.reader.must(t, 0, "events", "--instance", vmRender, "--since", "2024-05-01T12:00:30Z").stdout)
		r := e.reader.must(t, 0, "events", "--instance", vmRender, "--payload", "-o", "json")
		var el apiclient.EventList
		if err := json.Unmarshal([]byte(r.stdout), &el); err != nil || len(el.Events) != 2 || !strings.Contains(string(el.Events[1].Payload), `"stopped"`) {
			t.Errorf("events json: %v\n%s", err, r.stdout)
		}
		// A recent --since as a duration: nothing occurred in the last hour of 2024.
		if r := e.reader.must(t, 0, "events", "--since", "1h"); strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("events --since 1h: %s", r)
		}
	})

	t.Run("dead-letters", func(t *testing.T) {
		golden(t, "dead-letters", mask(e.admin.must(t, 0, "dead-letters").stdout, nil))
		r := e.reader.must(t, 1, "dead-letters")
		if !strings.HasPrefix(r.stderr, "vgpuctl: Forbidden: role \"reader\" may not do this; it needs admin\n") {
			t.Errorf("reader on dead letters: %s", r)
		}
	})

	t.Run("auth", func(t *testing.T) {
		r := e.anon.must(t, 1, "instances")
		if !strings.HasPrefix(r.stderr, "vgpuctl: Unauthorized: send a token in X-Auth-Token or Authorization: Bearer\n") {
			t.Errorf("no token: %s", r)
		}
		r = ctl{url: e.url, token: "wrong-token"}.must(t, 1, "instances")
		if !strings.HasPrefix(r.stderr, "vgpuctl: Unauthorized: the token is not valid\n") {
			t.Errorf("bad token: %s", r)
		}
		// --token beats the environment.
		e.anon.must(t, 0, "instances", "--token", readToken)
		// Nothing listens: exit 4.
		ctl{url: "http://127.0.0.1:1", token: readToken}.must(t, 4, "instances")
	})

	t.Run("webhooks and requests", func(t *testing.T) { testWebhooks(t, e) })
	t.Run("placement", func(t *testing.T) { testPlacement(t, e) })
	t.Run("policy", func(t *testing.T) {
		ev := writeFile(t, t.TempDir(), "event.json", `{"kind": "webhook.GPU_REQUEST", "instance_uuid": "`+vmWeb+`",
			"project_id": "p2", "workload": "training", "time": "2024-05-01T12:00:00Z"}`)
		r := e.reader.must(t, 0, "policy", "explain", "--event", ev)
		if !strings.HasPrefix(r.stdout, "event webhook.GPU_REQUEST instance "+vmWeb+" project p2 at 2024-05-01T12:00:00Z (policy ") ||
			!strings.Contains(r.stdout, "\nrules:\n") {
			t.Errorf("policy explain: %s", r)
		}
		e.anon.must(t, 1, "policy", "explain", "--event", ev)
	})
}

// testPlacement creates a node with two GPUs in the real Placement, has
// the bridge sync it and reads it back through hosts, gpus, allocations and
// a dry run. Names and UUIDs are random (the Placement is shared); the
// golden tables mask them.
func testPlacement(t *testing.T, e *bridgeEnv) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pc, err := placement.NewClient(ctx, placement.ClientConfig{Endpoint: testsvc.PlacementURL(t), Token: "admin"})
	testsvc.Must(t, err, "placement client")
	ty := placementfleet.UniqueType()
	node := testsvc.Name("cli-node")
	f, err := placementfleet.Load(ctx, pc.ServiceClient(), []placementfleet.Node{{Name: node,
		GPUs: []placementfleet.GPU{{Trait: ty, Total: 4, Used: 1}, {Trait: ty, Total: 2}}}}, 2)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.Cleanup(ctx); err != nil {
			t.Errorf("placement cleanup: %v", err)
		}
	})
	testsvc.Must(t, err, "load the fleet")
	masks := map[string]string{node: "node", f.Roots[0]: "root", f.GPUs[0][0]: "gpu-a", f.GPUs[0][1]: "gpu-b", ty: "trait", f.Consumers[0]: "consumer"}

	e.reader.must(t, 1, "sync") // admin only
	r := e.admin.must(t, 0, "sync", "--full")
	if !strings.Contains(r.stdout, "Full:       yes\n") {
		t.Errorf("sync: %s", r)
	}
	golden(t, "placement-host-show", mask(e.reader.must(t, 0, "hosts", "show", node).stdout, masks))
	golden(t, "placement-gpus", mask(e.reader.must(t, 0, "gpus", "--host", node).stdout, masks))
	golden(t, "placement-allocations", mask(e.reader.must(t, 0, "allocations", "--instance", f.Consumers[0]).stdout, masks))
	golden(t, "placement-dry-run", mask(e.reader.must(t, 0, "place", "--dry-run", "--trait", ty, "--host", node, "--count", "2").stdout, masks))
	r = e.reader.must(t, 0, "hosts", "-o", "json")
	var hl apiclient.HostList
	testsvc.Must(t, json.Unmarshal([]byte(r.stdout), &hl), "hosts json")
	found := false
	for _, h := range hl.Hosts {
		found = found || (h.Node == node && h.GPUCount == 2 && h.Capacity == 6 && h.Used == 1)
	}
	if !found {
		t.Errorf("hosts lacks %s with 2 GPUs, 6 vGPUs, 1 used: %s", node, r.stdout)
	}
}

func testWebhooks(t *testing.T, e *bridgeEnv) {
	dir := t.TempDir()
	body := writeFile(t, dir, "request.json", `{"type":"GPU_REQUEST","vm_id":"`+vmTrain+`","workload":"training","vgpu_profile":"T4-4Q","count":1}`)
	other := writeFile(t, dir, "other.json", `{"type":"GPU_RELEASE","vm_id":"`+vmTrain+`"}`)
	api := e.client(adminToken)
	ctx := context.Background()

	// hub scheme (X-Hub-Signature-256 + Idempotency-Key), no operator token needed.
	r := e.anon.must(t, 0, "webhook", "send", "lab", "--secret-file", e.secret, "--body", body, "--idempotency-key", "job-1", "-o", "json")
	var ans apiclient.WebhookAnswer
	if err := json.Unmarshal([]byte(r.stdout), &ans); err != nil || ans.RequestID == "" || ans.StatusURL != "/v1/requests/"+ans.RequestID {
		t.Fatalf("202 answer: %v %s", err, r)
	}
	id := ans.RequestID
	// The same key and body again: the same request.
	r = e.anon.must(t, 0, "webhook", "send", "lab", "--secret-file", e.secret, "--body", body, "--idempotency-key", "job-1")
	golden(t, "webhook-send", mask(r.stdout, map[string]string{id: "request-id"}))
	// The same key with another body: 409.
	r = e.anon.must(t, 1, "webhook", "send", "lab", "--secret-file", e.secret, "--body", other, "--idempotency-key", "job-1")
	if !strings.HasPrefix(r.stderr, "vgpuctl: Conflict: ") {
		t.Errorf("idempotency conflict: %s", r)
	}
	// A wrong secret: 401.
	wrong := writeFile(t, dir, "wrong.secret", "not-the-lab-secret-0123456789")
	r = e.anon.must(t, 1, "webhook", "send", "lab", "--secret-file", wrong, "--body", body)
	if !strings.HasPrefix(r.stderr, "vgpuctl: Unauthorized: ") || strings.Contains(r.stderr, labSecret) {
		t.Errorf("wrong secret: %s", r)
	}
	// An unknown source: 404.
	e.anon.must(t, 1, "webhook", "send", "nosuch", "--secret-file", e.secret, "--body", body)
	// Standard Webhooks scheme, body from stdin.
	r = e.anon.runIn(t, []byte(`{"type":"GPU_LOAD","vm_id":"`+vmWeb+`","workload":"inference","metrics":{"gpu_util":93}}`),
		"webhook", "send", "lab", "--secret-file", e.secret, "--body", "-", "--scheme", "standard", "-o", "yaml")
	var yans struct {
		RequestID string `yaml:"request_id"`
	}
	if r.code != 0 || yaml.Unmarshal([]byte(r.stdout), &yans) != nil || yans.RequestID == "" {
		t.Fatalf("standard scheme: %s", r)
	}

	// requests show finds it.
	// The pipeline may decide it at any moment: the golden file is the
	// table of a request still accepted.
	r = e.reader.must(t, 0, "requests", "show", id)
	if strings.Contains(r.stdout, "State:         accepted\n") {
		golden(t, "request-show", mask(r.stdout, map[string]string{id: "request-id"}))
	}
	if !strings.Contains(r.stdout, "Source:        webhook:lab\n") || !strings.Contains(r.stdout, "Instance:      "+vmTrain+"\n") {
		t.Errorf("requests show: %s", r)
	}
	r = e.reader.must(t, 0, "requests", "--source", "webhook:lab", "-o", "json")
	var rl apiclient.RequestList
	if json.Unmarshal([]byte(r.stdout), &rl) != nil || len(rl.Requests) != 2 {
		t.Errorf("requests list: %s", r)
	}
	e.reader.must(t, 1, "requests", "show", uuid.NewString())

	// Cancel: admin only; a watched cancelled request exits 5.
	r = e.reader.must(t, 1, "requests", "cancel", id)
	if !strings.HasPrefix(r.stderr, "vgpuctl: Forbidden: ") {
		t.Errorf("reader cancel: %s", r)
	}
	r = e.admin.run(t, "requests", "cancel", id)
	switch r.code {
	case 0:
		if !strings.Contains(r.stdout, "State:         failed\n") || !strings.Contains(r.stdout, "Code:          cancelled\n") {
			t.Errorf("cancel: %s", r)
		}
		r = e.admin.must(t, 1, "requests", "cancel", id)
		if !strings.HasPrefix(r.stderr, "vgpuctl: Conflict: request "+id+" is already failed") {
			t.Errorf("second cancel: %s", r)
		}
	case 1: // the bridge finished it first (a pipeline at work): 409
		if !strings.Contains(r.stderr, "Conflict") {
			t.Fatalf("cancel: %s", r)
		}
	default:
		t.Fatalf("cancel: %s", r)
	}
	r = e.reader.must(t, 5, "requests", "show", id, "--watch", "--interval", "50ms")
	if !strings.Contains(r.stderr, "vgpuctl: request "+id+" ended ") || !strings.Contains(r.stdout, "Finished:") {
		t.Errorf("watch of a failed request: %s", r)
	}

	// Watch a request to success while it moves through its states. The
	// same request again is a new body (a nonce): a signed body acts once.
	again := writeFile(t, dir, "request-again.json", `{"type":"GPU_REQUEST","vm_id":"`+vmTrain+`","workload":"training","vgpu_profile":"T4-4Q","count":1,"nonce":"2"}`)
	r = e.anon.must(t, 0, "webhook", "send", "lab", "--secret-file", e.secret, "--body", again, "-o", "json")
	testsvc.Must(t, json.Unmarshal([]byte(r.stdout), &ans), "answer")
	id2, err := uuid.Parse(ans.RequestID)
	testsvc.Must(t, err, "request id")
	store := requests.NewStore(e.pool, "cli-test")
	go func() {
		for _, s := range []struct {
			to    requests.State
			phase string
		}{{requests.Decided, "placing"}, {requests.Dispatched, "attaching"}, {requests.Succeeded, ""}} {
			time.Sleep(300 * time.Millisecond)
			err := store.Do(ctx, func(tx pgx.Tx) error {
				_, err := store.Transition(ctx, tx, id2, s.to, s.phase, "", "")
				return err
			})
			if err != nil { // a pipeline moved it first; the watch judges whatever end it reaches
				return
			}
		}
	}()
	r = e.reader.run(t, "requests", "show", id2.String(), "--watch", "--interval", "50ms", "--wait-timeout", "30s")
	final, err := api.Request(ctx, id2.String())
	testsvc.Must(t, err, "read request")
	want := map[string]int{"succeeded": 0, "failed": 5, "rejected": 5}[final.State]
	if r.code != want || !strings.Contains(r.stdout, "State:         "+final.State+"\n") {
		t.Fatalf("watch to %s: %s", final.State, r)
	}
	if final.State == "succeeded" && !strings.Contains(r.stderr, "request "+id2.String()+": dispatched (attaching)") {
		t.Errorf("progress lines: %s", r.stderr)
	}

	// Giving up: a request nobody moves.
	r = e.anon.must(t, 0, "webhook", "send", "lab", "--secret-file", e.secret, "--body", other, "-o", "json")
	testsvc.Must(t, json.Unmarshal([]byte(r.stdout), &ans), "answer")
	// The pipeline may finish it during the watch; then the exit code must
	// say how it ended (the give-up path itself is covered against a fake
	// API in cmd/vgpuctl).
	if now, _ := api.Request(ctx, ans.RequestID); !apiclient.FinalState(now.State) {
		r = e.reader.run(t, "requests", "show", ans.RequestID, "--watch", "--interval", "50ms", "--wait-timeout", "300ms")
		end, err := api.Request(ctx, ans.RequestID)
		testsvc.Must(t, err, "read request")
		switch {
		case r.code == 6:
			if !strings.Contains(r.stderr, "vgpuctl: request "+ans.RequestID+" is still ") {
				t.Errorf("give up: %s", r)
			}
		case apiclient.FinalState(end.State):
			if want := map[string]int{"succeeded": 0, "failed": 5, "rejected": 5}[end.State]; r.code != want {
				t.Errorf("watch ended %s with exit %d, want %d: %s", end.State, r.code, want, r)
			}
		default:
			t.Errorf("watch exit %d on a request still %s: %s", r.code, end.State, r)
		}
	}
	// webhook send --watch follows with the operator token.
	third := writeFile(t, dir, "request-third.json", strings.Replace(readFileT(t, other), `{`, `{"nonce":"3",`, 1))
	r = ctl{url: e.url, token: readToken}.run(t, "webhook", "send", "lab", "--secret-file", e.secret, "--body", third,
		"--watch", "--interval", "50ms", "--wait-timeout", "300ms")
	if r.code != 6 && r.code != 5 && r.code != 0 {
		t.Errorf("webhook send --watch: %s", r)
	}
	if !strings.Contains(r.stderr, " accepted\n") {
		t.Errorf("webhook send --watch progress: %s", r)
	}
}

func readFileT(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	testsvc.Must(t, err, "read "+path)
	return string(b)
}
