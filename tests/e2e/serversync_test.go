package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestServersKnownFromNovaAPI: the bridge installed into a cloud that
// already runs servers. Two servers run before the bridge's first start
// (its notification queue does not exist yet, so no notification of
// theirs ever reaches it); the bridge, configured with a notification
// topic Nova does not use, hears nothing from Nova at all. Its first
// listing of Nova's servers makes both known, on their host, with the
// listing as their last event; a GPU_REQUEST for one attaches a vGPU
// (before, it failed no_instance). Then, with no notification: a server
// created and one deleted after the start are learnt by the next
// changes-since listings.
func TestServersKnownFromNovaAPI(t *testing.T) {
	n := sharedNova(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	host, gpu := addDirectHost(t, n, "sync")
	prefix := testsvc.Name("sync")
	plain := n.CreateFlavor(t, prefix+".small", 2, 2048, 10, nil)
	before, doomed := n.CreateServer(t, prefix+"-before", plain, host), n.CreateServer(t, prefix+"-doomed", plain, host)
	n.WaitServer(t, before, "ACTIVE")
	n.WaitServer(t, doomed, "ACTIVE")

	d, api := startNovaBridge(t, n,
		"notifications.topics="+testsvc.Name("silent"), // nothing from Nova: the listing alone tells
		"nova.server_sync_interval=2s",
		"pipeline.poll_interval=50ms",
		"placement.sync_interval=2s",
	)
	w := &directWorld{t: t, ctx: ctx, n: n, host: host, gpu: gpu, api: api, pool: d.Pool, flavor: plain}

	known := func(id string) (apiclient.Instance, bool) {
		in, err := api.Instance(ctx, id)
		return in, err == nil && in.Host != nil && *in.Host == host
	}
	for _, id := range []string{before, doomed} {
		waitFor(t, time.Minute, "the bridge to know "+id+" from Nova's API", func() bool { _, ok := known(id); return ok })
		in, _ := known(id)
		if in.LastEventType == nil || *in.LastEventType != ingest.ServerListEvent || in.VMState == nil || *in.VMState != "active" ||
			in.ProjectID == nil || *in.ProjectID == "" {
			t.Errorf("instance %s as listed: %+v, want active with its project, last event %s", id, in.Instance, ingest.ServerListEvent)
		}
	}
	var events int
	testsvc.Must(t, d.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE source = 'nova'`).Scan(&events), "events")
	if events != 0 {
		t.Fatalf("%d Nova notifications reached the bridge; the test wants none", events)
	}

	// A vGPU for a server the bridge never heard of from a notification.
	if r := w.waitFinal(w.gpuRequest(before, "T4-4Q")); r.State != "succeeded" {
		t.Fatalf("attach to %s, created before the bridge: %s (%s): %s", before, r.State, r.Code, r.Reason)
	}
	if al := n.Allocations(t, before); al[gpu]["VGPU"] != 1 {
		t.Errorf("allocations of %s: %v, want VGPU 1 on %s", before, al, gpu)
	}

	// Caught up without notifications: a new server, a deleted one.
	after := n.CreateServer(t, prefix+"-after", plain, host)
	n.WaitServer(t, after, "ACTIVE")
	n.DeleteServer(t, doomed)
	waitFor(t, time.Minute, "the bridge to learn "+after+" from a changes-since listing", func() bool { _, ok := known(after); return ok })
	waitFor(t, time.Minute, "the bridge to learn that "+doomed+" is deleted", func() bool {
		in, err := api.Instance(ctx, doomed)
		return err == nil && in.DeletedAt != nil && in.VMState != nil && *in.VMState == "deleted"
	})
	n.DeleteServer(t, before)
	n.DeleteServer(t, after)
}

// startNovaBridge starts a bridge on Nova's broker with the Nova-native
// path configured (the harness's noauth2 admin token), the direct policy,
// the webhook source e2e (directSecret) and the extra overrides.
func startNovaBridge(t *testing.T, n *novaharness.Nova, extra ...string) (*bridge.Daemon, *apiclient.Client) {
	t.Helper()
	return startNovaBridgeINI(t, n, "", extra...)
}

// startNovaBridgeINI is startNovaBridge with more of the configuration
// file (ini: sections of its own, such as other webhook sources).
func startNovaBridgeINI(t *testing.T, n *novaharness.Nova, ini string, extra ...string) (*bridge.Daemon, *apiclient.Client) {
	t.Helper()
	dir := t.TempDir()
	rules, tok := filepath.Join(dir, "policy.yaml"), filepath.Join(dir, "nova-token")
	secretFile, iniFile := filepath.Join(dir, "webhook.secret"), filepath.Join(dir, "bridge.conf")
	testsvc.Must(t, os.WriteFile(rules, []byte(directPolicy), 0o600), "policy")
	testsvc.Must(t, os.WriteFile(tok, []byte(n.Token()+"\n"), 0o600), "nova token")
	testsvc.Must(t, os.WriteFile(secretFile, []byte(directSecret+"\n"), 0o600), "secret")
	ini = strings.ReplaceAll(ini, "SECRET_FILE", secretFile)
	testsvc.Must(t, os.WriteFile(iniFile, []byte("[webhook_source:e2e]\nauth = hmac\nsecret_files = "+secretFile+
		"\nrate = 100\nburst = 100\n"+ini), 0o600), "bridge.conf")
	v, err := bridge.LoadConfig(conf.Source{File: iniFile, Overrides: testbridge.Overrides(t, testsvc.Postgres(t), append([]string{
		"DEFAULT.transport_url=" + n.TransportURL(),
		"policy.rules_file=" + rules,
		"nova.endpoint_override=" + n.ComputeEndpoint(),
		"nova.token_file=" + tok,
	}, extra...)...)})
	testsvc.Must(t, err, "bridge configuration")
	d := testbridge.Start(t, v)
	return d, apiclient.New(apiclient.Config{URL: "http://" + d.API.Addr(), Token: testbridge.AdminToken, Timeout: 30 * time.Second})
}

// addDirectHost adds a compute host with one T4 (directTrait, 4 units) as
// a child provider and starts its agent; it returns the host and the
// GPU provider.
func addDirectHost(t *testing.T, n *novaharness.Nova, prefix string) (host, gpu string) {
	t.Helper()
	host = n.AddHost(t, prefix)
	gpu = n.AddVGPUChild(t, host, directGPU, directTrait, 4)
	n.StartAgent(t, host)
	return host, gpu
}
