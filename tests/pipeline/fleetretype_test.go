package pipeline_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/resourceproviders"
	"github.com/gophercloud/gophercloud/v2/openstack/placement/v1/traits"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/fleetupgrade"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/placementapi"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
	"github.com/vgpu-bridge/vgpu-bridge/placement/novaconf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// The re-type the tests ask for: the world's empty Nova-owned GPU B
// (T4-4Q, nvidia-232) to T4-1B (nvidia-222, 16 per GPU), while GPU A keeps
// T4-4Q and its vGPU: a host with GPUs of two types after the change.
const (
	retypeNovaTo    = "nvidia-222"
	retypeNovaTrait = "CUSTOM_NVIDIA_222"
	// retypeNovaConf is the host's [devices] and [mdev_<type>] sections
	// after the change (Nova 26's _get_supported_vgpu_types: two types,
	// each with its device_addresses group).
	retypeNovaConf = `[devices]
enabled_mdev_types = nvidia-222, nvidia-232

[mdev_nvidia-222]
device_addresses = 0000:d8:00.0

[mdev_nvidia-232]
device_addresses = 0000:3b:00.0
`
)

// retypeWorld is a world whose agent runs hook as its
// gpu_retype_command, with a bridge replica (its outbox, dispatcher and
// placement service) and the agent's first report in.
func retypeWorld(t *testing.T, hook string) (*world, *bridgeReplica) {
	w := newWorld(t)
	r := w.startBridge(replicaOpts{name: "r1"})
	w.startAgent("DEFAULT.gpu_retype_command=" + hook)
	w.waitFor(15*time.Second, "a report from the agent", func() bool { _, ok := w.report(); return ok })
	r.svc.RefreshHosts(w.ctx) // the compute host ↔ node mapping of the report
	testsvc.Must(t, traits.Create(w.ctx, w.sc, retypeNovaTrait).ExtractErr(), "create trait")
	return w, r
}

// retypeHook writes a re-type command that keeps what it was handed
// (the nova.conf change on its standard input, VGPU_RETYPE_GPUS and
// VGPU_RETYPE_TRAITS) in dir and exits 0.
func retypeHook(t *testing.T, dir string) string {
	hook := filepath.Join(dir, "retype.sh")
	testsvc.Must(t, os.WriteFile(hook, []byte(`#!/bin/sh
echo run >> "`+dir+`/ran"
cat > "`+dir+`/nova.conf.tmp"
printf '%s' "$VGPU_RETYPE_GPUS" > "`+dir+`/gpus"
printf '%s' "$VGPU_RETYPE_TRAITS" > "`+dir+`/traits"
mv "`+dir+`/nova.conf.tmp" "`+dir+`/nova.conf"
echo "nova.conf written, nova-compute restarted"
`), 0o755), "hook")
	return hook
}

// playNovaRestart plays, once the hook wrote nova.conf in dir, what the
// host does after it: nova-compute restarts and its resource tracker
// writes GPU B's provider inventory for the new type (Nova 26's
// LibvirtDriver._update_provider_tree_for_vgpu, from _get_gpu_inventories:
// total = the new type's available instances), and the host's re-type
// command sets the provider's type trait (Nova 26 writes no type trait:
// driver.py update_provider_tree's "TODO(sbauza): Use traits ..." leaves
// it to osc-placement, `openstack resource provider trait set`).
func (w *world) playNovaRestart(ctx context.Context, dir string) {
	for {
		if _, err := os.Stat(filepath.Join(dir, "nova.conf")); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	rp := w.gpus[gpuB]
	p, err := resourceproviders.Get(ctx, w.sc, rp).Extract()
	if err != nil {
		w.t.Errorf("provider %s: %v", rp, err)
		return
	}
	inv, err := resourceproviders.UpdateInventories(ctx, w.sc, rp, resourceproviders.UpdateInventoriesOpts{ResourceProviderGeneration: p.Generation,
		Inventories: map[string]resourceproviders.Inventory{
			"VGPU": {Total: 16, MinUnit: 1, MaxUnit: 16, StepSize: 1, AllocationRatio: 1},
		}}).Extract()
	if err != nil {
		w.t.Errorf("inventory of %s: %v", rp, err)
		return
	}
	if _, err := resourceproviders.UpdateTraits(ctx, w.sc, rp, resourceproviders.UpdateTraitsOpts{ResourceProviderGeneration: inv.ResourceProviderGeneration,
		Traits: []string{retypeNovaTrait}}).Extract(); err != nil {
		w.t.Errorf("traits of %s: %v", rp, err)
	}
}

// fleetAPI posts body to path on an API server with the fleet routes
// over svc: the status and the body.
func (w *world) fleetAPI(svc *placement.Service, path, body string) (int, string) {
	w.t.Helper()
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Auth: api.NoAuth{}})
	(&fleetupgrade.API{Store: fleetupgrade.NewStore(w.pool, logger()), Pool: w.pool, Retyper: svc}).Register(srv)
	placementapi.New(svc).Register(srv)
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	srv.Echo().ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func (w *world) retypeRunner() *fleetupgrade.Runner {
	pc, err := placement.NewClient(w.ctx, placement.ClientConfig{Endpoint: testsvc.PlacementURL(w.t), Token: "admin"})
	testsvc.Must(w.t, err, "placement client")
	return &fleetupgrade.Runner{Store: fleetupgrade.NewStore(w.pool, logger()), Pool: w.pool, Drain: controls.NewStore(w.pool, nil, logger()),
		Who: controls.Actor{Name: "vgpu-bridge/r1"}, Log: logger(), Poll: 100 * time.Millisecond, Placement: pc, VerifyTimeout: 20 * time.Second}
}

func (w *world) drained() bool {
	var d bool
	testsvc.Must(w.t, w.pool.QueryRow(w.ctx, `SELECT drained FROM hosts WHERE name = $1`, w.host).Scan(&d), "host")
	return d
}

// TestFleetRetypeNovaGPU: the dry run's needs_retype answer on the empty
// Nova-owned GPU carries the host's exact nova.conf change and the
// vgpuctl command; the re-type's dry run prints the plan with it; the run
// drains the host, sends the change to the agent's gpu_retype_command
// (signed, over RabbitMQ, its output kept), waits until Placement's
// provider of the GPU carries the new type's trait (the test plays
// nova-compute's restart) and undrains it, each step audited.
func TestFleetRetypeNovaGPU(t *testing.T) {
	dir := t.TempDir()
	w, br := retypeWorld(t, retypeHook(t, dir))
	gpu := w.host + "/" + gpuB + "=" + retypeNovaTo

	// needs_retype in a placement dry run.
	code, body := w.fleetAPI(br.svc, "/v1/placements/dry-run",
		`{"traits": {"required": ["`+retypeNovaTrait+`"]}, "host": "`+w.host+`", "allow_retype": true}`)
	var dr placement.DryRunResponse
	if code != http.StatusOK || json.Unmarshal([]byte(body), &dr) != nil || len(dr.Candidates) == 0 {
		t.Fatalf("dry run: %d %s", code, body)
	}
	c := dr.Candidates[0]
	if !c.NeedsRetype || c.PCIAddress != gpuB || c.NovaConf == nil || !strings.HasSuffix(c.NovaConf.Text, retypeNovaConf) ||
		c.RetypeCommand != "vgpuctl fleet retype --gpu "+gpu {
		t.Fatalf("needs_retype answer %s", body)
	}

	// The re-type's dry run: the plan and the change, nothing started.
	code, body = w.fleetAPI(br.svc, "/v1/fleet/retypes", `{"gpus": ["`+gpu+`"], "dry_run": true}`)
	var plan fleetupgrade.RetypePlan
	if code != http.StatusOK || json.Unmarshal([]byte(body), &plan) != nil || len(plan.Hosts) != 1 ||
		!strings.HasSuffix(plan.Hosts[0].Change.Text, retypeNovaConf) || len(plan.Hosts[0].Change.GPUs) != 1 {
		t.Fatalf("dry run: %d %s", code, body)
	}
	g := plan.Hosts[0].Change.GPUs[0]
	if g.From != "nvidia-232" || g.To != retypeNovaTo || g.ProviderUUID != w.gpus[gpuB] || g.FromTrait != t4qTrait || g.ToTrait != retypeNovaTrait {
		t.Errorf("planned GPU %+v", g)
	}
	var n int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM fleet_upgrades f JOIN fleet_upgrade_hosts h ON h.upgrade_id = f.id
		WHERE h.host = $1`, w.host).Scan(&n), "runs")
	if n != 0 {
		t.Fatalf("a dry run recorded %d run(s)", n)
	}

	// The run.
	code, body = w.fleetAPI(br.svc, "/v1/fleet/retypes", `{"gpus": ["`+gpu+`"]}`)
	var op fleetupgrade.Operation
	if code != http.StatusAccepted || json.Unmarshal([]byte(body), &op) != nil || op.Kind != fleetupgrade.KindRetype {
		t.Fatalf("start: %d %s", code, body)
	}
	ctx, cancel := context.WithTimeout(w.ctx, 60*time.Second)
	defer cancel()
	go w.playNovaRestart(ctx, dir)
	r := w.retypeRunner()
	var drainedAtCommand bool
	r.AfterStep = func(_ uuid.UUID, _ string, to fleetupgrade.State) {
		if to == fleetupgrade.Upgrading {
			drainedAtCommand = w.drained()
		}
	}
	start := time.Now()
	testsvc.Must(t, r.Drive(ctx, op.ID), "drive")
	t.Logf("re-type run took %s", time.Since(start))
	got, err := r.Store.Get(w.ctx, op.ID)
	testsvc.Must(t, err, "get")
	h := got.Hosts[0]
	if got.State != fleetupgrade.OpDone || h.State != fleetupgrade.Done {
		t.Fatalf("run %s (%s), host %s: %s", got.State, got.Error, h.State, h.Error)
	}
	if !drainedAtCommand || w.drained() || !strings.Contains(h.Output, "nova-compute restarted") {
		t.Errorf("drained when the command was sent %v, drained now %v, output %q", drainedAtCommand, w.drained(), h.Output)
	}
	conf, _ := os.ReadFile(filepath.Join(dir, "nova.conf"))
	gpus, _ := os.ReadFile(filepath.Join(dir, "gpus"))
	trs, _ := os.ReadFile(filepath.Join(dir, "traits"))
	if !strings.HasSuffix(string(conf), retypeNovaConf) || string(gpus) != gpuB+"="+retypeNovaTo ||
		string(trs) != w.gpus[gpuB]+" "+t4qTrait+" "+retypeNovaTrait {
		t.Errorf("the hook got nova.conf %q, gpus %q, traits %q", conf, gpus, trs)
	}
	var kind, status string
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT kind, result_status FROM commands WHERE id = $1`, *h.UpgradeCommand).Scan(&kind, &status), "command")
	if kind != "retype_gpus" || status != "succeeded" {
		t.Errorf("command %s %s", kind, status)
	}
	var audits int
	testsvc.Must(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM audit_log WHERE object_id LIKE $1`, op.ID.String()+"%").Scan(&audits), "audit")
	if audits < 7 { // start, 5 steps, finish
		t.Errorf("%d audit records of the run", audits)
	}
}

// TestFleetRetypeResumes: a bridge that stops once the re-type command is
// queued (the step recorded) resumes the run at that step: it waits on
// the same command, which the agent runs once, verifies and undrains.
func TestFleetRetypeResumes(t *testing.T) {
	dir := t.TempDir()
	w, br := retypeWorld(t, retypeHook(t, dir))
	code, body := w.fleetAPI(br.svc, "/v1/fleet/retypes", `{"gpus": ["`+w.host+"/"+gpuB+"="+retypeNovaTo+`"]}`)
	var op fleetupgrade.Operation
	if code != http.StatusAccepted || json.Unmarshal([]byte(body), &op) != nil {
		t.Fatalf("start: %d %s", code, body)
	}
	ctx, cancel := context.WithTimeout(w.ctx, 60*time.Second)
	defer cancel()
	go w.playNovaRestart(ctx, dir)
	first := w.retypeRunner()
	stopCtx, stop := context.WithCancel(ctx)
	first.AfterStep = func(_ uuid.UUID, _ string, to fleetupgrade.State) {
		if to == fleetupgrade.Upgrading {
			stop()
		}
	}
	if err := first.Drive(stopCtx, op.ID); err == nil {
		t.Fatal("the first bridge's drive ended without being stopped")
	}
	mid, err := first.Store.Get(w.ctx, op.ID)
	testsvc.Must(t, err, "get")
	if mid.State != fleetupgrade.OpRunning || mid.Hosts[0].State != fleetupgrade.Upgrading || mid.Hosts[0].UpgradeCommand == nil {
		t.Fatalf("after the stop: %s, host %+v", mid.State, mid.Hosts[0])
	}
	testsvc.Must(t, w.retypeRunner().Drive(ctx, op.ID), "resume")
	got, err := first.Store.Get(w.ctx, op.ID)
	testsvc.Must(t, err, "get")
	h := got.Hosts[0]
	if got.State != fleetupgrade.OpDone || h.State != fleetupgrade.Done || *h.UpgradeCommand != *mid.Hosts[0].UpgradeCommand || w.drained() {
		t.Fatalf("run %s (%s), host %+v, drained %v", got.State, got.Error, h, w.drained())
	}
	if ran, _ := os.ReadFile(filepath.Join(dir, "ran")); string(ran) != "run\n" {
		t.Errorf("the re-type command ran %q", ran)
	}
}

// TestFleetRetypeVerifyFails: the agent's command succeeds but the GPU's
// provider never gets the new type's trait: the run fails at verifying,
// the host stays drained, and the run stops there (the next host of the
// run is not started).
func TestFleetRetypeVerifyFails(t *testing.T) {
	dir := t.TempDir()
	w, br := retypeWorld(t, retypeHook(t, dir))
	ch, err := br.svc.NovaRetype(w.ctx, w.host, map[string]string{gpuB: retypeNovaTo}, false)
	testsvc.Must(t, err, "change")
	next := testsvc.Name("pipe-next")
	r := w.retypeRunner()
	r.VerifyTimeout = 2 * time.Second
	op, err := r.Store.Create(w.ctx, controls.Actor{Name: "ops"}, fleetupgrade.Options{Kind: fleetupgrade.KindRetype, Hosts: []string{w.host, next},
		Retypes: map[string]novaconf.Change{w.host: ch, next: ch}, MaxUnavailable: 1, StopOnFailure: true})
	testsvc.Must(t, err, "create")
	ctx, cancel := context.WithTimeout(w.ctx, 60*time.Second)
	defer cancel()
	testsvc.Must(t, r.Drive(ctx, op.ID), "drive")
	got, err := r.Store.Get(w.ctx, op.ID)
	testsvc.Must(t, err, "get")
	h := got.Hosts[0]
	if got.State != fleetupgrade.OpFailed || got.Error != "1 host(s) failed; stopped with 1 host(s) not re-typed" ||
		h.State != fleetupgrade.Failed || !strings.HasPrefix(h.Error, "verifying: the re-type did not show in Placement") ||
		!strings.Contains(h.Error, "want "+retypeNovaTrait) || got.Hosts[1].State != fleetupgrade.Pending {
		t.Fatalf("run %s (%s), host %s: %s, next host %s", got.State, got.Error, h.State, h.Error, got.Hosts[1].State)
	}
	if !w.drained() {
		t.Error("the host was undrained after a failed verify")
	}
	if _, err := os.Stat(filepath.Join(dir, "nova.conf")); err != nil {
		t.Errorf("the agent's re-type command did not run: %v", err)
	}
}

// TestFleetRetypeRefusesGPUInUse: GPU A holds Nova's vGPU: the API
// refuses it (409 gpu_in_use), and a run that holds it (its vGPU came
// after the start) fails at its first step without draining the host.
func TestFleetRetypeRefusesGPUInUse(t *testing.T) {
	w, br := retypeWorld(t, retypeHook(t, t.TempDir()))
	code, body := w.fleetAPI(br.svc, "/v1/fleet/retypes", `{"gpus": ["`+w.host+"/"+gpuA+"="+retypeNovaTo+`"], "dry_run": true}`)
	if code != http.StatusConflict || !strings.Contains(body, `"gpu_in_use"`) || !strings.Contains(body, "holds 1 vGPU") {
		t.Fatalf("dry run on GPU A: %d %s", code, body)
	}
	ch, err := br.svc.NovaRetype(w.ctx, w.host, map[string]string{gpuA: retypeNovaTo}, true)
	testsvc.Must(t, err, "change")
	r := w.retypeRunner()
	op, err := r.Store.Create(w.ctx, controls.Actor{Name: "ops"}, fleetupgrade.Options{Kind: fleetupgrade.KindRetype, Hosts: []string{w.host},
		Retypes: map[string]novaconf.Change{w.host: ch}, MaxUnavailable: 1, StopOnFailure: true})
	testsvc.Must(t, err, "create")
	ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
	defer cancel()
	testsvc.Must(t, r.Drive(ctx, op.ID), "drive")
	got, err := r.Store.Get(w.ctx, op.ID)
	testsvc.Must(t, err, "get")
	h := got.Hosts[0]
	if h.State != fleetupgrade.Failed || !strings.Contains(h.Error, "GPU "+gpuA+" holds 1 vGPU") || h.UpgradeCommand != nil {
		t.Fatalf("host %+v", h)
	}
	if w.drained() {
		t.Error("the host was drained for a refused re-type")
	}
}
