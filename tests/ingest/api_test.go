package ingest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// headerAuth: "X-Test-Role: reader|admin", optional "X-Test-Project".
type headerAuth struct{}

func (headerAuth) Authenticate(r *http.Request) (*api.Principal, error) {
	role := r.Header.Get("X-Test-Role")
	if role == "" {
		return nil, api.Problem(http.StatusUnauthorized, "Unauthorized", "no role")
	}
	return &api.Principal{Name: "test", Role: api.Role(role), Project: r.Header.Get("X-Test-Project")}, nil
}

func TestAPI(t *testing.T) {
	r := newRig(t)
	cfg := r.config(r.amqpURL)
	r.declare(cfg)
	t0 := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	vgpu := map[string]string{"resources:VGPU": "2", "trait:CUSTOM_NVIDIA_232": "required"}
	var bodies [][]byte
	for i := 0; i < 5; i++ {
		specs := map[string]string(nil)
		if i%2 == 0 {
			specs = vgpu
		}
		uuid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		bodies = append(bodies, instanceMsg(t, fmt.Sprintf("c%d", i), "instance.create.end", uuid, "active", fmt.Sprintf("h%d", i%2), specs, t0.Add(time.Duration(i)*time.Second)))
	}
	bodies = append(bodies, []byte("garbage"), instanceMsg(t, "p0", "instance.power_off.end", "00000000-0000-4000-8000-000000000000", "stopped", "h0", vgpu, t0.Add(time.Minute)))
	r.publish(infoKey, bodies...)
	r.start(cfg)
	r.waitCount(6, 30*time.Second, `SELECT count(*) FROM events`)
	r.waitCount(1, 10*time.Second, `SELECT count(*) FROM dead_letters`)

	srv := api.New(api.Config{Auth: headerAuth{}})
	ingest.NewAPI(r.pool).Register(srv)
	if u := srv.Undescribed(); len(u) > 0 {
		t.Errorf("routes not in OpenAPI: %v", u)
	}
	hs := httptest.NewServer(srv.Echo())
	defer hs.Close()
	get := func(path string, hdr map[string]string, out any) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, hs.URL+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		testsvc.Must(t, err, "GET "+path)
		defer resp.Body.Close()
		if out != nil && resp.StatusCode == http.StatusOK {
			testsvc.Must(t, json.NewDecoder(resp.Body).Decode(out), "decode "+path)
		}
		return resp.StatusCode
	}
	reader := map[string]string{"X-Test-Role": "reader"}

	var in ingest.Instance
	if code := get("/v1/instances/00000000-0000-4000-8000-000000000000", reader, &in); code != 200 {
		t.Fatalf("get instance: %d", code)
	}
	if in.VMState == nil || *in.VMState != "stopped" || !in.HasVGPU || in.VGPUs != 2 || *in.Host != "h0" {
		t.Errorf("instance %+v", in)
	}
	if code := get("/v1/instances/00000000-0000-4000-8000-000000000099", reader, nil); code != 404 {
		t.Errorf("unknown instance: %d", code)
	}
	if code := get("/v1/instances/nope", reader, nil); code != 422 {
		t.Errorf("bad uuid: %d", code)
	}
	if code := get("/v1/instances/00000000-0000-4000-8000-000000000000", map[string]string{"X-Test-Role": "reader", "X-Test-Project": "other"}, nil); code != 404 {
		t.Errorf("other project's instance: %d", code)
	}
	var list ingest.InstanceList
	get("/v1/instances?has_vgpu=true", reader, &list)
	if len(list.Instances) != 3 {
		t.Errorf("has_vgpu=true: %d instances, want 3", len(list.Instances))
	}
	get("/v1/instances?host=h1&has_vgpu=false", reader, &list)
	if len(list.Instances) != 2 {
		t.Errorf("host=h1: %d instances, want 2", len(list.Instances))
	}
	// Pagination walks every instance once.
	seen := map[string]bool{}
	for path, pages := "/v1/instances?limit=2", 0; ; pages++ {
		list = ingest.InstanceList{}
		if code := get(path, reader, &list); code != 200 || pages > 5 {
			t.Fatalf("page %d: %d", pages, code)
		}
		for _, i := range list.Instances {
			seen[i.UUID] = true
		}
		if list.NextCursor == "" {
			break
		}
		path = "/v1/instances?limit=2&cursor=" + url.QueryEscape(list.NextCursor)
	}
	if len(seen) != 5 {
		t.Errorf("pagination saw %d instances, want 5", len(seen))
	}
	if code := get("/v1/instances?cursor=zzz", reader, nil); code != 422 {
		t.Errorf("bad cursor: %d", code)
	}

	var evs ingest.EventList
	get("/v1/events?instance=00000000-0000-4000-8000-000000000000", reader, &evs)
	// Inbox ids follow commit order; with two committers, two batches may
	// commit in either order, so judge the set of events, not their order.
	types := map[string]bool{}
	for _, ev := range evs.Events {
		types[ev.EventType] = true
	}
	if len(evs.Events) != 2 || !types["instance.create.end"] || !types["instance.power_off.end"] {
		t.Errorf("events of instance 0: %+v", evs.Events)
	}
	get("/v1/events?type=instance.power*&payload=true", reader, &evs)
	if len(evs.Events) != 1 || len(evs.Events[0].Payload) == 0 {
		t.Errorf("type prefix: %+v", evs.Events)
	}
	get("/v1/events?since=2024-05-01T12:00:03Z", reader, &evs)
	if len(evs.Events) != 3 {
		t.Errorf("since: %d events, want 3", len(evs.Events))
	}
	get("/v1/events?limit=4", reader, &evs)
	if len(evs.Events) != 4 || evs.NextCursor == "" {
		t.Fatalf("limit 4: %d events, cursor %q", len(evs.Events), evs.NextCursor)
	}
	next := evs.NextCursor
	evs = ingest.EventList{}
	get("/v1/events?limit=4&cursor="+url.QueryEscape(next), reader, &evs)
	if len(evs.Events) != 2 || evs.NextCursor != "" {
		t.Errorf("second page: %d events, cursor %q", len(evs.Events), evs.NextCursor)
	}
	if code := get("/v1/events?since=yesterday", reader, nil); code != 422 {
		t.Errorf("bad since: %d", code)
	}

	if code := get("/v1/dead-letters", reader, nil); code != 403 {
		t.Errorf("dead letters as reader: %d, want 403", code)
	}
	var dl ingest.DeadLetterList
	if code := get("/v1/dead-letters", map[string]string{"X-Test-Role": "admin"}, &dl); code != 200 {
		t.Fatalf("dead letters: %d", code)
	}
	if len(dl.DeadLetters) != 1 || dl.DeadLetters[0].Reason != "not_json" || dl.DeadLetters[0].Raw != "garbage" {
		t.Errorf("dead letters %+v", dl.DeadLetters)
	}
}
