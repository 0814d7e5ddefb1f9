package pipeline_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/allocations"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/agent"
	"github.com/vgpu-bridge/vgpu-bridge/agent/fakehost"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testkeys"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// moveWorld adds to a world a second compute host (fake host, agent,
// Placement root provider with two T4 children) and Nova's notification
// path: the bridge's ingest consumer on a private exchange, fed with the
// corpus samples made to name the test's instance and hosts.
type moveWorld struct {
	*world
	hostB, nodeB, fakeB string
	drvB                *agent.Drivers // host B's drivers, shared with its agent
	stateB              string         // agent B's state_path, kept across its runs
	stopB               func()         // stops host B's agent (startAgentB)
	rootB               string
	gpusB               map[string]string
	exchange, queue     string
	pub                 *amqp.Channel
	// maxAttempts bounds the bridge's attempts at an event (the default
	// when 0): an event that waits for another request retries meanwhile.
	maxAttempts int
}

func newMoveWorld(t *testing.T) *moveWorld {
	t.Helper()
	m := &moveWorld{world: newWorld(t), gpusB: map[string]string{}}
	m.hostB = testsvc.Name("pipe-hostb")
	m.nodeB = m.hostB + ".nodes.test"
	m.exchange, m.queue = testsvc.Name("nova-move"), testsvc.Name("vgpu-bridge-move")

	// Host B: the same domains (the instances Nova moves there), no vGPU.
	spec := fakehost.DefaultSpec()
	spec.Host = m.hostB
	spec.VFIOGPUs = nil
	for i := range spec.MdevGPUs {
		spec.MdevGPUs[i].Mdevs = nil
	}
	spec.Domains = nil
	for _, d := range m.domains {
		spec.Domains = append(spec.Domains, fakehost.Domain{Name: d.Name, UUID: d.UUID, Running: true})
	}
	m.fakeB = filepath.Join(t.TempDir(), "fakeb")
	_, err := fakehost.Build(m.fakeB, spec)
	testsvc.Must(t, err, "fake host B")

	ctx := m.ctx
	m.rootB = uuid.NewString()
	_, err = resourceproviders.Create(ctx, m.sc, resourceproviders.CreateOpts{Name: m.nodeB, UUID: m.rootB}).Extract()
	testsvc.Must(t, err, "create root provider B")
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, c := range m.created { // before the providers: allocations block their deletion
			allocations.Delete(cctx, m.sc, c).ExtractErr() //nolint:errcheck
		}
		for _, id := range m.gpusB {
			if err := resourceproviders.Delete(cctx, m.sc, id).ExtractErr(); err != nil && !gophercloud.ResponseCodeIs(err, 404) {
				t.Logf("cleanup: provider %s: %v", id, err)
			}
		}
		resourceproviders.Delete(cctx, m.sc, m.rootB).ExtractErr() //nolint:errcheck
	})
	m.computeNode(m.rootB, m.nodeB, m.gpusB)

	conn, err := amqp.Dial(m.amqpURL)
	testsvc.Must(t, err, "dial broker")
	ch, err := conn.Channel()
	testsvc.Must(t, err, "channel")
	testsvc.Must(t, ch.Confirm(false), "confirm mode")
	m.pub = ch
	t.Cleanup(func() {
		if c, err := conn.Channel(); err == nil {
			for _, q := range []string{m.queue, protocol.AgentQueue(m.hostB)} {
				c.QueueDelete(q, false, false, false) //nolint:errcheck
			}
			c.ExchangeDelete(m.exchange, false, false) //nolint:errcheck
		}
		conn.Close()
	})
	return m
}

// startAgentB runs host B's agent and returns what stops it (once).
func (m *moveWorld) startAgentB() (stop func()) {
	t := m.t
	if m.stateB == "" {
		m.stateB = t.TempDir()
	}
	v, err := agent.LoadConfig(conf.Source{Overrides: append([]string{"DEFAULT.host=" + m.hostB, "DEFAULT.node=" + m.nodeB,
		"DEFAULT.transport_url=" + testsvc.TransportURL(t), "DEFAULT.state_path=" + m.stateB, "DEFAULT.listen=127.0.0.1:0",
		"DEFAULT.report_check_interval=1s", "DEFAULT.reconnect_max_backoff=2s", "DEFAULT.shutdown_timeout=5s"},
		testkeys.For(t).Agent(m.hostB)...)})
	testsvc.Must(t, err, "agent B config")
	if m.drvB == nil {
		m.drvB, err = agent.OpenFakeHost(m.fakeB)
		testsvc.Must(t, err, "open fake host B")
		t.Cleanup(m.drvB.Close) // after agent B stopped (cleanups run last first)
	}
	ctx, cancel := context.WithCancel(m.ctx)
	done := make(chan error, 1)
	go func() {
		done <- agent.RunWith(ctx, v, logger(), agent.RunOptions{FakeHostDir: m.fakeB, Drivers: m.drvB})
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("agent B: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Error("agent B did not stop")
			}
		})
	}
}

// start runs the bridge (one replica, listening to both hosts), both
// agents and the ingest consumer.
func (m *moveWorld) start() *bridgeReplica {
	t := m.t
	br := m.startBridge(replicaOpts{name: "r1", maxAttempts: m.maxAttempts, dispatch: func(c *dispatch.Config) {
		c.ResultsBindings = append(c.ResultsBindings, protocol.ResultRoutingKey(m.hostB))
		c.ReportsBindings = append(c.ReportsBindings, protocol.ReportRoutingKey(m.hostB))
	}})
	m.startAgent()
	m.stopB = m.startAgentB()
	t.Cleanup(func() { m.stopB() })

	cfg := ingest.DefaultConfig()
	cfg.URLs = []string{m.amqpURL}
	cfg.Exchange, cfg.Queue = m.exchange, m.queue
	cfg.SilenceWarning = 0
	c, err := ingest.New(cfg, m.pool, nil, logger())
	testsvc.Must(t, err, "ingest consumer")
	testsvc.Must(t, c.CheckTopology(m.ctx), "declare nova topology")
	ictx, icancel := context.WithCancel(m.ctx)
	idone := make(chan error, 1)
	go func() { idone <- c.Run(ictx) }()
	t.Cleanup(func() {
		icancel()
		if err := <-idone; err != nil && m.ctx.Err() == nil {
			t.Errorf("ingest: %v", err)
		}
	})
	// Host B's agent has reported: the bridge maps it to its node.
	m.waitFor(30*time.Second, "host B's report", func() bool {
		var n int
		testsvc.Must(t, m.pool.QueryRow(m.ctx, `SELECT count(*) FROM hosts WHERE name = $1 AND node = $2`, m.hostB, m.nodeB).Scan(&n), "host B")
		return n == 1
	})
	// The placement mirror knows host B's GPUs.
	_, err = br.svc.SyncNow(m.ctx, true, nil)
	testsvc.Must(t, err, "placement sync")
	return br
}

func (m *moveWorld) waitFor(within time.Duration, what string, ok func() bool) {
	m.t.Helper()
	testsvc.WaitFor(m.t, within, what, ok)
}

var corpus map[string]novatest.Sample

// notify publishes Nova's sample of eventType, made to name instance on
// host (none when host is ""), as nova-compute of that host would.
func (m *moveWorld) notify(eventType, instance, host, node, vmState string) {
	m.t.Helper()
	m.notifyTask(eventType, instance, host, node, vmState, nil)
}

// notifyTask is notify with the instance's task state as the sender had
// it (nil: none).
func (m *moveWorld) notifyTask(eventType, instance, host, node, vmState string, task any) {
	m.t.Helper()
	m.notifyFrom(eventType, instance, host, node, vmState, task, host)
}

// notifyFrom is notifyTask sent by the nova-compute of host from ("": the
// payload's host), whatever host its payload names.
func (m *moveWorld) notifyFrom(eventType, instance, host, node, vmState string, task any, from string) {
	t := m.t
	t.Helper()
	loadCorpus(t)
	s, ok := corpus["instance-"+strings.ReplaceAll(strings.TrimPrefix(eventType, "instance."), ".", "-")]
	if !ok {
		t.Fatalf("no corpus sample for %s", eventType)
	}
	var msg map[string]any
	testsvc.Must(t, json.Unmarshal(s.JSON, &msg), "sample")
	data := msg["payload"].(map[string]any)["nova_object.data"].(map[string]any)
	data["uuid"], data["tenant_id"], data["user_id"], data["state"], data["task_state"] = instance, m.project, m.user, vmState, task
	data["power_state"] = "running"
	if host == "" {
		data["host"], data["node"] = nil, nil
		data["power_state"] = "pending"
	} else {
		data["host"], data["node"] = host, node
	}
	if from != "" {
		msg["publisher_id"] = "nova-compute:" + from
	}
	m.publish(msg, eventType)
}

// publish sends msg (a notification as Nova's samples have it) the way
// oslo.messaging does, and waits for the broker's confirm.
func (m *moveWorld) publish(msg map[string]any, what string) {
	t := m.t
	t.Helper()
	b, err := json.Marshal(msg)
	testsvc.Must(t, err, "marshal")
	wire, err := nova.WireMessage(b, uuid.NewString(), time.Now().UTC())
	testsvc.Must(t, err, "wire")
	dc, err := m.pub.PublishWithDeferredConfirmWithContext(m.ctx, m.exchange, "versioned_notifications.info", false, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: wire})
	testsvc.Must(t, err, "publish")
	if ok, err := dc.WaitContext(m.ctx); err != nil || !ok {
		t.Fatalf("broker did not confirm %s: %v", what, err)
	}
}

// novaAllocations rewrites the instance's allocations as Nova does at the
// end of a move: its own resources on root, nothing of the bridge's.
func (m *moveWorld) novaAllocations(instance, root string) {
	m.t.Helper()
	a, err := allocations.Get(m.ctx, m.sc, instance).Extract()
	testsvc.Must(m.t, err, "get allocations")
	res := map[string]allocations.ProviderAllocationsOpts{}
	if root != "" {
		res[root] = allocations.ProviderAllocationsOpts{Resources: map[string]int{"VCPU": 2, "MEMORY_MB": 2048}}
	}
	testsvc.Must(m.t, allocations.Update(m.ctx, m.sc, instance, allocations.UpdateOpts{Allocations: res, ProjectID: m.project, UserID: m.user,
		ConsumerType: "INSTANCE", ConsumerGeneration: a.ConsumerGeneration}).ExtractErr(), "nova's allocations")
}

// moveRequests waits until the bridge's requests for the instance's
// eventType are all final and returns them by their "move" half ("" for
// one that is not half of a move, such as a re-attach).
func (m *moveWorld) moveRequests(instance, eventType string, want int) map[string]requests.Request {
	m.t.Helper()
	out := map[string]requests.Request{}
	m.waitFor(90*time.Second, "move requests of "+eventType, func() bool {
		rows, err := m.pool.Query(m.ctx, `SELECT id, coalesce(body->>'move', '') FROM requests WHERE source = 'nova' AND kind = $1 AND instance_uuid = $2`, eventType, instance)
		testsvc.Must(m.t, err, "requests")
		defer rows.Close()
		clear(out)
		for rows.Next() {
			var id uuid.UUID
			var half string
			testsvc.Must(m.t, rows.Scan(&id, &half), "scan")
			r, err := m.requests.Get(m.ctx, id)
			testsvc.Must(m.t, err, "get")
			if !r.State.Final() {
				return false
			}
			out[half] = r
		}
		return len(out) == want
	})
	return out
}

func (m *moveWorld) mdevOn(dir, id string) bool {
	_, err := os.Lstat(filepath.Join(dir, "sys", "bus", "mdev", "devices", id))
	return err == nil
}

// reportedOn waits for host's report to show mdev attached to instance.
func (m *moveWorld) reportedOn(host, mdev, instance string) {
	m.t.Helper()
	m.waitFor(30*time.Second, "host "+host+" to report mdev "+mdev, func() bool {
		var raw []byte
		if err := m.pool.QueryRow(m.ctx, `SELECT report FROM hosts WHERE name = $1`, host).Scan(&raw); err != nil {
			return false
		}
		var r protocol.Report
		testsvc.Must(m.t, json.Unmarshal(raw, &r), "report")
		for _, g := range r.GPUs {
			for _, a := range g.Active {
				if a.MdevUUID == mdev && a.InstanceUUID == instance && a.Owner == protocol.OwnerAgent {
					return true
				}
			}
		}
		return false
	})
}

type attFull struct {
	id, host, provider, state string
	shelved                   bool
}

func (m *moveWorld) atts(instance string) []attFull {
	rows, err := m.pool.Query(m.ctx, `SELECT id::text, host, coalesce(provider_uuid::text,''), state, shelved FROM vgpu_attachments
		WHERE instance_uuid = $1 ORDER BY created_at, id`, instance)
	testsvc.Must(m.t, err, "attachments")
	defer rows.Close()
	var out []attFull
	for rows.Next() {
		var a attFull
		testsvc.Must(m.t, rows.Scan(&a.id, &a.host, &a.provider, &a.state, &a.shelved), "scan")
		out = append(out, a)
	}
	return out
}

// attachOnA gives the instance a direct-path vGPU on host A.
func (m *moveWorld) attachOnA(inst string) attFull {
	m.t.Helper()
	id := m.submit("GPU_REQUEST", inst, map[string]any{"vgpu_profile": "T4-4Q"})
	if r := m.wait(id, 60*time.Second); r.State != requests.Succeeded {
		m.t.Fatalf("attach: %s (%s: %s)", r.State, r.Code, r.Reason)
	}
	a := m.atts(inst)
	if len(a) != 1 || a[0].host != m.host {
		m.t.Fatalf("attachments %+v", a)
	}
	m.reportedOn(m.host, a[0].id, inst)
	return a[0]
}

// checkOnB asserts that the instance's one live vGPU is on host B: claim
// on a GPU provider of B in its consumer and none on A, the mdev in B's
// sysfs attached to its domain, the old one gone from A.
func (m *moveWorld) checkOnB(inst string, old attFull) attFull {
	m.t.Helper()
	var live []attFull
	for _, a := range m.atts(inst) {
		switch {
		case a.id == old.id:
			if a.state != flow.AttReleased {
				m.t.Errorf("old vGPU %s: %s, want released", a.id, a.state)
			}
		case a.state == flow.AttAttached:
			live = append(live, a)
		}
	}
	if len(live) != 1 || live[0].host != m.hostB {
		m.t.Fatalf("live vGPUs %+v, want one on %s", live, m.hostB)
	}
	al := m.allocations(inst)
	onB := 0
	for _, id := range m.gpusB {
		onB += al[id]["VGPU"]
	}
	if onB != 1 || al[live[0].provider]["VGPU"] != 1 || vgpuUnits(al) != 1 {
		m.t.Errorf("allocations %v: want 1 VGPU on host B's provider %s and nothing else", al, live[0].provider)
	}
	if m.mdevOn(m.fake, old.id) {
		m.t.Errorf("old mdev %s still on host A", old.id)
	}
	if !m.mdevOn(m.fakeB, live[0].id) {
		m.t.Errorf("no mdev %s on host B", live[0].id)
	}
	m.reportedOn(m.hostB, live[0].id, inst)
	return live[0]
}

// TestMoveToAnotherHost: an instance with a direct-path vGPU on host A
// is moved to host B by Nova (Nova rewrites its allocations without the
// bridge's VGPU) → on the notification that ends the move the bridge
// claims again on B, creates and attaches the mdev there and removes the
// one on A, in two requests; Placement and both hosts agree. The same
// event again finds everything in place and does nothing more, except
// that a rebuild.end on host B is a rebuild there: the vGPU is attached
// again where it is (one more request), nothing moves. A cold migration,
// which keeps the source's vGPU until its confirm, is
// TestMoveColdMigrationConfirmOrRevert.
func TestMoveToAnotherHost(t *testing.T) {
	m := newMoveWorld(t)
	m.start()
	for _, tc := range []struct {
		name, event, vmState, then string
		domain                     int
		reattach                   int          // re-attach requests the then event makes
		source                     func(string) // what Nova's driver did to the domain on host A
		// fromSource: Nova's source compute sends the event from its own
		// copy of the instance, after the destination's dest event moved
		// it (ComputeManager._post_live_migration: host = the source, task
		// migrating); the dest event goes first, from host B.
		dest       string
		fromSource bool
		// fromDest: the destination sends the event from the instance
		// before its host changes (Nova 26's evacuation: rebuild.end,
		// then ResourceTracker.finish_evacuation): host = the source.
		fromDest bool
	}{
		{"live migration", "instance.live_migration_post.end", "active", "", 3, 0, m.novaLeavesA,
			"instance.live_migration_post_dest.end", true, false},
		{"evacuation", "instance.rebuild.end", "active", "", 4, 1, m.novaLeavesA, "", false, false},
		{"evacuation as Nova 26 sends it", "instance.rebuild.end", "active", "", 5, 1, m.novaLeavesA, "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := m.domains[tc.domain].UUID
			old := m.attachOnA(inst)
			tc.source(inst)
			m.novaAllocations(inst, m.rootB)
			send := func(event string) {
				t.Helper()
				if tc.fromSource && event == tc.event {
					m.notifyTask(event, inst, m.host, m.node, tc.vmState, "migrating")
					return
				}
				if tc.fromDest && event == tc.event {
					m.notifyFrom(event, inst, m.host, m.node, tc.vmState, nil, m.hostB)
					return
				}
				m.notify(event, inst, m.hostB, m.nodeB, tc.vmState)
			}
			if tc.dest != "" {
				send(tc.dest)
			}
			send(tc.event)
			reqs := m.moveRequests(inst, tc.event, 2)
			for half, r := range reqs {
				if r.State != requests.Succeeded {
					t.Errorf("%s request: %s (%s: %s)", half, r.State, r.Code, r.Reason)
				}
			}
			m.checkOnB(inst, old)
			// The re-apply is a change the bridge made: its follow-up event
			// says move, on host B (the release half writes none).
			var changes string
			testsvc.Must(t, m.pool.QueryRow(m.ctx, `SELECT coalesce(string_agg(payload->>'change', ',' ORDER BY id), '') FROM events
				WHERE source = 'bridge' AND event_type = 'vgpu_changed' AND instance_uuid = $1`, inst).Scan(&changes), "bridge events")
			if changes != "attach,move" {
				t.Errorf("bridge events of %s say %q, want attach,move", inst, changes)
			}
			var moved int
			testsvc.Must(t, m.pool.QueryRow(m.ctx, `SELECT count(*) FROM events WHERE source = 'bridge' AND instance_uuid = $1
				AND payload->>'change' = 'move' AND payload->>'host' = $2`, inst, m.hostB).Scan(&moved), "bridge events")
			if moved != 1 {
				t.Errorf("%d move events on %s for %s, want 1", moved, m.hostB, inst)
			}
			var host string
			testsvc.Must(t, m.pool.QueryRow(m.ctx, `SELECT host FROM instances WHERE uuid = $1`, inst).Scan(&host), "instance")
			if host != m.hostB {
				t.Errorf("instance host %s, want %s", host, m.hostB)
			}
			then := tc.then
			if then == "" {
				then = tc.event // the same notification again
			}
			sent := 1
			if tc.dest != "" {
				sent = 2
			}
			if tc.fromSource && then == tc.event {
				m.notifyTask(then, inst, m.host, m.node, "active", "migrating")
			} else if tc.fromDest && then == tc.event {
				m.notifyFrom(then, inst, m.host, m.node, "active", nil, m.hostB)
			} else {
				m.notify(then, inst, m.hostB, m.nodeB, "active")
			}
			m.waitFor(30*time.Second, "the next event processed", func() bool {
				var open, all int
				testsvc.Must(t, m.pool.QueryRow(m.ctx, `SELECT count(*) FILTER (WHERE processed_at IS NULL), count(*) FROM events WHERE instance_uuid = $1 AND source = 'nova'`,
					inst).Scan(&open, &all), "events")
				return open == 0 && all == sent+1
			})
			var n int
			testsvc.Must(t, m.pool.QueryRow(m.ctx, `SELECT count(*) FROM requests WHERE source = 'nova' AND instance_uuid = $1`, inst).Scan(&n), "requests")
			if n != 2+tc.reattach {
				t.Errorf("%d nova requests after %s, want %d", n, then, 2+tc.reattach)
			}
			if tc.reattach > 0 && then == tc.event {
				reqs := m.moveRequests(inst, then, 2+tc.reattach)
				if r, ok := reqs[""]; !ok || r.State != requests.Succeeded {
					t.Errorf("re-attach after %s on the new host: %+v", then, r)
				}
			}
			m.checkOnB(inst, old)
		})
	}
}

// TestMoveColdMigrationConfirmOrRevert: a cold migration of an instance
// with a direct-path vGPU from host A to B, as Nova 26 makes it (the
// source's allocations, the bridge's VGPU with them, go to the
// migration's consumer; the instance's consumer claims on B; the source's
// domain is shut off and kept) → at resize_finish.end the bridge applies
// a vGPU on B and keeps the one on A (mdev there, claim in the migration
// consumer). Confirmed (the source's domain destroyed, the migration's
// consumer deleted) → the mdev on A is removed. Reverted (the domain on B
// destroyed, the migration's allocations moved back to the instance, the
// source's domain started again) → the vGPU on A is attached again with
// its claim, the one on B is removed; one VGPU in Placement, on A.
// Reverted while B's vGPU is still being attached (B's agent away) → the
// revert waits for that request, then ends as a revert does.
func TestMoveColdMigrationConfirmOrRevert(t *testing.T) {
	m := newMoveWorld(t)
	// The revert that waits for B's attach retries until B's agent is back
	// (retry_max is 1 s here): with the default 5 attempts it would go
	// ahead after about 3 s, before a slow machine has started the agent.
	m.maxAttempts = 100
	m.start()
	for i, mode := range []string{"confirm", "revert", "revert during the re-apply"} {
		revert, racing := mode != "confirm", mode == "revert during the re-apply"
		t.Run(mode, func(t *testing.T) {
			inst := m.domains[3+i].UUID
			old := m.attachOnA(inst)
			m.novaStopsOnA(inst)
			mig := m.novaMigrationConsumer(inst)
			m.novaAllocations(inst, m.rootB)
			if racing {
				m.stopB() // B's attach waits in its queue
			}
			m.notify("instance.resize_finish.end", inst, m.hostB, m.nodeB, "resized")
			if racing {
				m.waitFor(30*time.Second, "the source's vGPU kept and one pending on B", func() bool {
					kept, pending := false, false
					for _, a := range m.atts(inst) {
						kept = kept || (a.id == old.id && a.state == flow.AttKept)
						pending = pending || (a.host == m.hostB && a.state == flow.AttPending)
					}
					return kept && pending
				})
				testsvc.Must(t, m.drvB.Libvirt.DestroyAndUndefine(m.ctx, inst), "Nova destroys the domain on host B")
				m.novaRevertAllocations(inst, mig)
				testsvc.Must(t, m.drv.Libvirt.Start(m.ctx, inst), "Nova starts the source's domain again")
				m.notify("instance.resize_revert.end", inst, m.host, m.node, "active")
				time.Sleep(2 * time.Second)
				var n int
				testsvc.Must(t, m.pool.QueryRow(m.ctx, `SELECT count(*) FROM requests WHERE source = 'nova' AND kind = 'instance.resize_revert.end' AND instance_uuid = $1`,
					inst).Scan(&n), "requests")
				if n != 0 {
					t.Errorf("the revert was followed while B's vGPU was still being attached: %d request(s)", n)
				}
				m.stopB = m.startAgentB()
				m.waitFor(90*time.Second, "the revert followed", func() bool {
					for _, a := range m.atts(inst) {
						if a.id == old.id {
							return a.state == flow.AttAttached
						}
					}
					return false
				})
				m.checkReverted(inst, old, "")
				return
			}
			if r := m.moveRequests(inst, "instance.resize_finish.end", 1)["reapply"]; r.State != requests.Succeeded {
				t.Fatalf("re-apply at resize_finish.end: %+v", r)
			}
			var onB attFull
			for _, a := range m.atts(inst) {
				switch {
				case a.id == old.id:
					if a.state != flow.AttKept || a.provider != old.provider {
						t.Errorf("awaiting the confirm: the source's vGPU %+v, want kept with its provider %s", a, old.provider)
					}
				case a.state == flow.AttAttached && a.host == m.hostB:
					onB = a
				default:
					t.Errorf("awaiting the confirm: unexpected vGPU %+v", a)
				}
			}
			if onB.id == "" || !m.mdevOn(m.fakeB, onB.id) {
				t.Fatalf("awaiting the confirm: no vGPU attached on host B: %+v", m.atts(inst))
			}
			if !m.mdevOn(m.fake, old.id) {
				t.Errorf("awaiting the confirm: the source's mdev %s gone from host A", old.id)
			}
			if al := m.allocations(mig); al[old.provider]["VGPU"] != 1 {
				t.Errorf("awaiting the confirm: the migration consumer holds %v, want the source's VGPU on %s", al, old.provider)
			}

			if !revert {
				m.novaLeavesA(inst)
				testsvc.Must(t, allocations.Delete(m.ctx, m.sc, mig).ExtractErr(), "Nova deletes the migration's allocations")
				m.notify("instance.resize_confirm.end", inst, m.hostB, m.nodeB, "active")
				if r := m.moveRequests(inst, "instance.resize_confirm.end", 1)["release"]; r.State != requests.Succeeded {
					t.Fatalf("release at resize_confirm.end: %+v", r)
				}
				if got := m.checkOnB(inst, old); got.id != onB.id {
					t.Errorf("after the confirm: vGPU %s on B, want %s", got.id, onB.id)
				}
				return
			}

			// Nova's revert: revert_resize destroys the guest on B, then
			// finish_revert_resize moves the migration's allocations back
			// to the instance and starts the source's guest again.
			testsvc.Must(t, m.drvB.Libvirt.DestroyAndUndefine(m.ctx, inst), "Nova destroys the domain on host B")
			m.novaRevertAllocations(inst, mig)
			testsvc.Must(t, m.drv.Libvirt.Start(m.ctx, inst), "Nova starts the source's domain again")
			m.notify("instance.resize_revert.end", inst, m.host, m.node, "active")
			reqs := m.moveRequests(inst, "instance.resize_revert.end", 2)
			for half, r := range reqs {
				if r.State != requests.Succeeded {
					t.Errorf("%s request at resize_revert.end: %s (%s: %s)", half, r.State, r.Code, r.Reason)
				}
			}
			m.checkReverted(inst, old, onB.id)
		})
	}
}

// checkReverted asserts that after a revert the instance's one live vGPU
// is old, attached on A with its claim, its mdev reported in the domain,
// and that B's vGPU (onB; any, when "") is ended with no mdev left on B;
// one VGPU in the consumer, on old's GPU.
func (m *moveWorld) checkReverted(inst string, old attFull, onB string) {
	t := m.t
	t.Helper()
	var other []string
	for _, a := range m.atts(inst) {
		switch {
		case a.id == old.id:
			if a.state != flow.AttAttached || a.host != m.host || a.provider != old.provider {
				t.Errorf("after the revert: the source's vGPU %+v, want attached on %s with provider %s", a, m.host, old.provider)
			}
		case a.host == m.hostB && (onB == "" || a.id == onB):
			if a.state != flow.AttReleased && a.state != flow.AttFailed {
				t.Errorf("after the revert: B's vGPU %+v, want released (or failed)", a)
			}
			m.waitFor(30*time.Second, "mdev "+a.id+" gone from host B", func() bool { return !m.mdevOn(m.fakeB, a.id) })
			other = append(other, a.id)
		default:
			t.Errorf("after the revert: unexpected vGPU %+v", a)
		}
	}
	if len(other) != 1 {
		t.Errorf("after the revert: B's vGPUs %v, want one", other)
	}
	if al := m.allocations(inst); vgpuUnits(al) != 1 || al[old.provider]["VGPU"] != 1 {
		t.Errorf("after the revert: allocations %v, want one VGPU, on %s", al, old.provider)
	}
	if !m.mdevOn(m.fake, old.id) {
		t.Errorf("after the revert: mdev %s gone from host A", old.id)
	}
	m.reportedOn(m.host, old.id, inst)
}

// novaMigrationConsumer plays the start of Nova 26's cold migration
// (conductor's replace_allocation_with_migration): the instance's
// allocations, the bridge's VGPU with them, move to a new migration
// consumer, which it returns.
func (m *moveWorld) novaMigrationConsumer(inst string) string {
	m.t.Helper()
	mig := uuid.NewString()
	m.created = append(m.created, mig)
	res := map[string]allocations.ProviderAllocationsOpts{}
	for rp, r := range m.allocations(inst) {
		res[rp] = allocations.ProviderAllocationsOpts{Resources: r}
	}
	testsvc.Must(m.t, allocations.Update(m.ctx, m.sc, mig, allocations.UpdateOpts{Allocations: res, ProjectID: m.project, UserID: m.user,
		ConsumerType: "MIGRATION"}).ExtractErr(), "the migration's allocations")
	return mig
}

// novaRevertAllocations plays finish_revert_resize's _revert_allocation:
// the migration's allocations replace the instance's, and the migration's
// consumer is emptied.
func (m *moveWorld) novaRevertAllocations(inst, mig string) {
	m.t.Helper()
	a, err := allocations.Get(m.ctx, m.sc, inst).Extract()
	testsvc.Must(m.t, err, "get allocations")
	res := map[string]allocations.ProviderAllocationsOpts{}
	for rp, r := range m.allocations(mig) {
		res[rp] = allocations.ProviderAllocationsOpts{Resources: r}
	}
	testsvc.Must(m.t, allocations.Delete(m.ctx, m.sc, mig).ExtractErr(), "empty the migration's consumer")
	testsvc.Must(m.t, allocations.Update(m.ctx, m.sc, inst, allocations.UpdateOpts{Allocations: res, ProjectID: m.project, UserID: m.user,
		ConsumerType: "INSTANCE", ConsumerGeneration: a.ConsumerGeneration}).ExtractErr(), "the instance's allocations back")
}

// TestMoveShelveOffloadUnshelve: shelve offload (Nova deletes the
// allocations, the domain leaves host A) → the mdev on A is removed and
// the vGPU kept as shelved; unshelve on host B → applied again there.
func TestMoveShelveOffloadUnshelve(t *testing.T) {
	m := newMoveWorld(t)
	m.start()
	inst := m.domains[5].UUID
	old := m.attachOnA(inst)

	m.novaLeavesA(inst)
	m.novaAllocations(inst, "")
	m.notify("instance.shelve_offload.end", inst, "", "", "shelved_offloaded")
	rel := m.moveRequests(inst, "instance.shelve_offload.end", 1)
	if r := rel["release"]; r.State != requests.Succeeded {
		t.Fatalf("release at shelve offload: %+v", r)
	}
	a := m.atts(inst)
	if len(a) != 1 || a[0].state != flow.AttReleased || !a[0].shelved {
		t.Fatalf("after the offload: %+v, want one released and shelved", a)
	}
	if m.mdevOn(m.fake, old.id) {
		t.Errorf("mdev %s still on host A after the offload", old.id)
	}

	m.novaAllocations(inst, m.rootB)
	m.notify("instance.unshelve.end", inst, m.hostB, m.nodeB, "active")
	re := m.moveRequests(inst, "instance.unshelve.end", 1)
	if r := re["reapply"]; r.State != requests.Succeeded {
		t.Fatalf("re-apply at unshelve: %+v", r)
	}
	m.checkOnB(inst, old)
	for _, x := range m.atts(inst) {
		if x.shelved {
			t.Errorf("vGPU %s still shelved after the unshelve", x.id)
		}
	}
}

// TestMoveResizeSameHost: a resize on the same host (Nova's new
// allocations drop the VGPU; the domain is redefined without the mdev) →
// claim and device applied again on host A, the old mdev removed.
func TestMoveResizeSameHost(t *testing.T) {
	m := newMoveWorld(t)
	m.start()
	inst := m.domains[6].UUID
	old := m.attachOnA(inst)

	m.novaRedefinesOnA(inst)
	m.novaAllocations(inst, m.root)
	m.notify("instance.resize_finish.end", inst, m.host, m.node, "resized")
	reqs := m.moveRequests(inst, "instance.resize_finish.end", 2)
	for half, r := range reqs {
		if r.State != requests.Succeeded {
			t.Errorf("%s request: %s (%s: %s)", half, r.State, r.Code, r.Reason)
		}
	}
	var live []attFull
	for _, a := range m.atts(inst) {
		if a.state == flow.AttAttached {
			live = append(live, a)
		}
	}
	if len(live) != 1 || live[0].id == old.id || live[0].host != m.host {
		t.Fatalf("live vGPUs %+v, want one new on %s", live, m.host)
	}
	if n := vgpuUnits(m.allocations(inst)); n != 1 {
		t.Errorf("VGPU units after the resize: %d, want 1", n)
	}
	if m.mdevOn(m.fake, old.id) || !m.mdevOn(m.fake, live[0].id) {
		t.Errorf("mdevs on A: old %v (want gone), new %v (want there)", m.mdevOn(m.fake, old.id), m.mdevOn(m.fake, live[0].id))
	}
	m.reportedOn(m.host, live[0].id, inst)
}

// novaLeavesA plays Nova's libvirt driver on host A when the instance
// leaves it for good: the source's domain is destroyed and undefined, with
// the vGPUs the bridge hot-plugged into it (LibvirtDriver.cleanup after a
// live migration's post_live_migration_at_source, destroy at shelve
// offload, _destroy_evacuated_instances when an evacuated host's
// nova-compute starts again). The mdevs stay: they are the agent's, for
// the bridge's release to remove.
func (m *moveWorld) novaLeavesA(inst string) {
	m.t.Helper()
	testsvc.Must(m.t, m.drv.Libvirt.DestroyAndUndefine(m.ctx, inst), "Nova undefines the domain on host A")
}

// novaStopsOnA plays a cold migration's source: migrate_disk_and_power_off
// shuts the domain down; it stays defined until the resize is confirmed.
func (m *moveWorld) novaStopsOnA(inst string) {
	m.t.Helper()
	testsvc.Must(m.t, m.drv.Libvirt.Shutdown(m.ctx, inst, 10*time.Second), "Nova powers the domain off on host A")
}

// novaRedefinesOnA plays a same-host resize or rebuild: Nova destroys the
// domain and defines and starts it again from its own guest XML
// (_get_guest_xml, through finish_migration or rebuild's spawn), which
// holds Nova's devices only, not the vGPUs the bridge hot-plugged.
func (m *moveWorld) novaRedefinesOnA(inst string) {
	m.t.Helper()
	conn := m.drv.Libvirt
	d, err := conn.Domain(m.ctx, inst)
	testsvc.Must(m.t, err, "domain on host A")
	testsvc.Must(m.t, conn.Shutdown(m.ctx, inst, 10*time.Second), "Nova powers the domain off")
	for _, id := range d.Mdevs() {
		testsvc.Must(m.t, conn.RemoveHostdevConfig(m.ctx, inst, id), "Nova's guest XML")
	}
	testsvc.Must(m.t, conn.Start(m.ctx, inst), "Nova starts the domain again")
}

// serviceUpdate sends Nova's service.update for host's nova-compute
// (Nova's sample), forced down or not, as nova-api does on `openstack
// compute service set --down/--up`.
func (m *moveWorld) serviceUpdate(host string, forcedDown bool) {
	t := m.t
	t.Helper()
	loadCorpus(t)
	s, ok := corpus["service-update"]
	if !ok {
		t.Fatal("no corpus sample for service.update")
	}
	var msg map[string]any
	testsvc.Must(t, json.Unmarshal(s.JSON, &msg), "sample")
	data := msg["payload"].(map[string]any)["nova_object.data"].(map[string]any)
	data["host"], data["binary"], data["forced_down"], data["disabled"] = host, "nova-compute", forcedDown, false
	msg["publisher_id"] = "nova-api:api1"
	m.publish(msg, "service.update")
}

// TestHostDownHoldAndRestore: Nova forces host A's compute service down →
// the bridge takes the direct-path vGPU's claim out of the instance's
// consumer (held: no VGPU in Placement, the mdev still in the domain),
// so that an evacuation would not hand it to the destination; the service
// is up again and the instance was not evacuated → the claim is made
// again on the same GPU and the vGPU is attached again. Each is a request
// of kind host_down that succeeded, the hold audited.
func TestHostDownHoldAndRestore(t *testing.T) {
	m := newMoveWorld(t)
	m.start()
	inst := m.domains[4].UUID
	old := m.attachOnA(inst)
	if al := m.allocations(inst); al[old.provider]["VGPU"] != 1 {
		t.Fatalf("attached: allocations %v, want VGPU 1 on %s", al, old.provider)
	}
	m.serviceUpdate(m.host, true)
	m.waitFor(30*time.Second, "the vGPU held off host A", func() bool {
		a := m.atts(inst)
		return len(a) == 1 && a[0].state == flow.AttHeld && a[0].provider == old.provider && vgpuUnits(m.allocations(inst)) == 0
	})
	if !m.mdevOn(m.fake, old.id) {
		t.Errorf("held: mdev %s gone from host A", old.id)
	}
	var audited int
	testsvc.Must(t, m.pool.QueryRow(m.ctx, `SELECT count(*) FROM audit_log a JOIN requests r ON r.id::text = a.request_id
		WHERE r.instance_uuid = $1 AND r.kind = 'host_down' AND a.action = 'hold' AND a.object_id = $2`, inst, old.id).Scan(&audited), "audit")
	if audited != 1 {
		t.Errorf("held: %d hold entries in the history, want 1", audited)
	}
	// A service notification that changes nothing of the kind (still
	// forced down, sent again) holds nothing more.
	m.serviceUpdate(m.host, true)
	m.serviceUpdate(m.host, false)
	m.waitFor(30*time.Second, "the vGPU attached again", func() bool {
		a := m.atts(inst)
		return len(a) == 1 && a[0].state == flow.AttAttached
	})
	al := m.allocations(inst)
	if al[old.provider]["VGPU"] != 1 || vgpuUnits(al) != 1 {
		t.Errorf("restored: allocations %v, want VGPU 1 on %s and nothing else", al, old.provider)
	}
	if !m.mdevOn(m.fake, old.id) {
		t.Errorf("restored: mdev %s gone from host A", old.id)
	}
	m.waitFor(30*time.Second, "the host_down requests to end", func() bool {
		rows, err := m.pool.Query(m.ctx, `SELECT state || '/' || (body->>'half') FROM requests WHERE instance_uuid = $1 AND kind = 'host_down' ORDER BY created_at`, inst)
		testsvc.Must(t, err, "requests")
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		testsvc.Must(t, err, "requests")
		return strings.Join(got, ",") == "succeeded/hold,succeeded/restore"
	})
}

// loadCorpus reads Nova's notification samples into corpus, once.
func loadCorpus(t testing.TB) {
	t.Helper()
	if corpus != nil {
		return
	}
	_, file, _, _ := runtime.Caller(0)
	all, err := novatest.Samples(filepath.Join(filepath.Dir(file), "..", "..", novatest.SamplesDir))
	testsvc.Must(t, err, "samples")
	corpus = map[string]novatest.Sample{}
	for _, s := range all {
		corpus[s.Name] = s
	}
}
