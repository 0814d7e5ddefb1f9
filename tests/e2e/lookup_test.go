package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/flow"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/novaharness"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestServerLookedUpOnDemand: the bridge, with its listing of Nova's
// servers off and no notification from Nova, gets requests naming servers
// it never heard of. A GPU_REQUEST for a server booted before the bridge
// started attaches a vGPU: the bridge asked the real Nova for that server
// (GET /servers/{id}) and stored it as the listing does. A request naming
// a random UUID ends unknown_instance with Nova's no in the reason. A
// source limited to the server's project (allowed_projects) is refused a
// server of another project exactly as it is refused an id Nova does not
// have: nothing tells the caller the server exists.
func TestServerLookedUpOnDemand(t *testing.T) {
	n := sharedNova(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	host, gpu := addDirectHost(t, n, "lookup")
	prefix := testsvc.Name("lookup")
	plain := n.CreateFlavor(t, prefix+".small", 2, 2048, 10, nil)
	// Servers of project admin (the harness's token admin:admin).
	before, mine := n.CreateServer(t, prefix+"-before", plain, host), n.CreateServer(t, prefix+"-mine", plain, host)
	otherProject := strings.ReplaceAll(uuid.NewString(), "-", "")
	var out struct {
		Server struct{ ID string } `json:"server"`
	}
	testsvc.Must(t, n.ComputeAs(ctx, http.MethodPost, "/servers", "admin:"+otherProject, map[string]any{"server": map[string]any{
		"name": prefix + "-other", "flavorRef": plain, "imageRef": novaharness.ImageID, "networks": "none", "host": host}}, &out),
		"create a server in another project")
	other := out.Server.ID
	n.WaitServer(t, before, "ACTIVE")
	n.WaitServer(t, other, "ACTIVE")
	n.WaitServer(t, mine, "ACTIVE")
	defer n.DeleteServer(t, before)
	defer n.DeleteServer(t, other)
	defer n.DeleteServer(t, mine)

	d, api := startNovaBridgeINI(t, n, "[webhook_source:scoped]\nauth = hmac\nsecret_files = SECRET_FILE\nallowed_projects = admin\n",
		"notifications.topics="+testsvc.Name("silent"), // nothing from Nova
		"nova.server_sync_interval=0",                  // and no listing: only the lookup can tell
		"pipeline.poll_interval=50ms",
		"placement.sync_interval=2s",
	)
	w := &directWorld{t: t, ctx: ctx, n: n, host: host, gpu: gpu, api: api, pool: d.Pool, flavor: plain}
	for _, id := range []string{before, other, mine} {
		if _, err := api.Instance(ctx, id); err == nil {
			t.Fatalf("the bridge knows %s before any request named it; the test wants it unknown", id)
		}
	}

	// A server Nova has, created before the bridge: looked up, attached.
	if r := w.waitFinal(w.gpuRequest(before, "T4-4Q")); r.State != "succeeded" {
		t.Fatalf("attach to %s, created before the bridge and never listed: %s (%s): %s", before, r.State, r.Code, r.Reason)
	}
	if al := n.Allocations(t, before); al[gpu]["VGPU"] != 1 {
		t.Errorf("allocations of %s: %v, want VGPU 1 on %s", before, al, gpu)
	}
	in, err := api.Instance(ctx, before)
	testsvc.Must(t, err, "instance "+before)
	if in.LastEventType == nil || *in.LastEventType != ingest.ServerListEvent || in.Host == nil || *in.Host != host ||
		in.ProjectID == nil || *in.ProjectID != "admin" {
		t.Errorf("instance %s as looked up: %+v, want on %s in project admin, last event %s", before, in.Instance, host, ingest.ServerListEvent)
	}

	// An id Nova does not have.
	random := uuid.NewString()
	r := w.waitFinal(w.gpuRequest(random, "T4-4Q"))
	if r.Code != flow.CodeNoInstance || !strings.Contains(r.Reason, "Nova has no such server") {
		t.Errorf("request for %s, which Nova does not have: %s (%s): %s; want %s saying Nova has no such server",
			random, r.State, r.Code, r.Reason, flow.CodeNoInstance)
	}

	// A source limited to project admin: another project's server is
	// refused as an id Nova does not have is, the same status, code and
	// words.
	scoped := func(vm string) apiclient.Problem {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"type": "GPU_REQUEST", "vm_id": vm, "workload": "training", "vgpu_profile": "T4-4Q",
			"count": 1, "nonce": uuid.NewString()})
		_, err := api.SendWebhook(ctx, "scoped", body, apiclient.WebhookAuth{Scheme: apiclient.SchemeHub, Key: []byte(directSecret),
			IdempotencyKey: apiclient.NewIdempotencyKey()})
		var ae *apiclient.Error
		if !errors.As(err, &ae) {
			t.Fatalf("scoped request for %s: %v, want a refusal", vm, err)
		}
		ae.Problem.Detail = strings.ReplaceAll(ae.Problem.Detail, vm, "<vm>")
		ae.Problem.RequestID, ae.Problem.Instance = "", ""
		return ae.Problem
	}
	ofOther, ofNobody := scoped(other), scoped(uuid.NewString())
	if ofOther.Status != http.StatusForbidden || ofOther.Code != "project_not_allowed" || !reflect.DeepEqual(ofOther, ofNobody) {
		t.Errorf("another project's server: %+v\nan id Nova does not have: %+v\nwant the same 403 project_not_allowed", ofOther, ofNobody)
	}
	// The source's own project's server, unknown to the bridge until the
	// source's request made it ask Nova: accepted, attached.
	body, _ := json.Marshal(map[string]any{"type": "GPU_REQUEST", "vm_id": mine, "workload": "training", "vgpu_profile": "T4-4Q",
		"count": 1, "nonce": uuid.NewString()})
	a, err := api.SendWebhook(ctx, "scoped", body, apiclient.WebhookAuth{Scheme: apiclient.SchemeHub, Key: []byte(directSecret),
		IdempotencyKey: apiclient.NewIdempotencyKey()})
	testsvc.Must(t, err, "scoped request for "+mine+", a server of the source's project")
	if r := w.waitFinal(a.RequestID); r.State != "succeeded" {
		t.Errorf("scoped attach to %s: %s (%s): %s", mine, r.State, r.Code, r.Reason)
	}
}
