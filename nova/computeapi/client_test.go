package computeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fakeNova answers like nova-api for the calls the client makes and
// records what it was sent.
type fakeNova struct {
	t    *testing.T
	got  []string // "METHOD path body"
	ids  []string // X-OpenStack-Request-ID of each call
	code int      // status of actions (default 202)
}

func (f *fakeNova) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := r.Header.Get("X-Auth-Token"); h != "admin:admin" {
		f.t.Errorf("%s %s: X-Auth-Token %q", r.Method, r.URL.Path, h)
	}
	if h := r.Header.Get("OpenStack-API-Version"); h != "compute 2.79" {
		f.t.Errorf("%s %s: OpenStack-API-Version %q", r.Method, r.URL.Path, h)
	}
	body, _ := io.ReadAll(r.Body)
	f.got = append(f.got, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+string(body)))
	f.ids = append(f.ids, r.Header.Get(HeaderRequestID))
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v2.1/servers/s1":
		fmt.Fprint(w, `{"server": {"id": "s1", "name": "vm", "status": "VERIFY_RESIZE", "OS-EXT-STS:vm_state": "resized",
			"OS-EXT-STS:task_state": null, "OS-EXT-SRV-ATTR:host": "cmp1", "OS-EXT-SRV-ATTR:hypervisor_hostname": "cmp1.example",
			"flavor": {"original_name": "m1.small.t4-4q", "vcpus": 2, "ram": 2048, "disk": 20, "ephemeral": 0, "swap": 0,
				"extra_specs": {"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required"}}}}`)
	case r.Method == http.MethodGet && r.URL.Path == "/v2.1/servers/gone":
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"itemNotFound": {"code": 404, "message": "Instance gone could not be found."}}`)
	case r.Method == http.MethodGet && r.URL.Path == "/v2.1/flavors/detail":
		if r.URL.Query().Get("marker") == "" {
			var fl []string
			for i := range flavorPage {
				fl = append(fl, fmt.Sprintf(`{"id": "f%d", "name": "n%d", "vcpus": 1, "ram": 512, "disk": 1, "swap": "", "os-flavor-access:is_public": true}`, i, i))
			}
			fmt.Fprintf(w, `{"flavors": [%s]}`, strings.Join(fl, ","))
			return
		}
		fmt.Fprint(w, `{"flavors": [{"id": "x", "name": "m1.small.t4-4q", "vcpus": 2, "ram": 2048, "disk": 20, "swap": 512,
			"OS-FLV-EXT-DATA:ephemeral": 5, "os-flavor-access:is_public": false, "extra_specs": {"resources:VGPU": "1"}}]}`)
	case r.Method == http.MethodGet && r.URL.Path == "/v2.1/os-migrations":
		fmt.Fprint(w, `{"migrations": [{"id": 3, "uuid": "m-old", "instance_uuid": "s1", "migration_type": "migration", "status": "confirmed",
			"source_compute": "cmp1", "dest_compute": "cmp2"}, {"id": 7, "uuid": "m-new", "instance_uuid": "s1", "migration_type": "live-migration",
			"status": "running", "source_compute": "cmp2", "dest_compute": "cmp1"}]}`)
	case r.Method == http.MethodGet && r.URL.Path == "/v2.1/servers/detail":
		fmt.Fprint(w, `{"servers": [{"id": "s1", "name": "vm", "status": "ACTIVE"}]}`)
	case r.Method == http.MethodPost && r.URL.Path == "/v2.1/servers/s1/action":
		if f.code != 0 {
			w.WriteHeader(f.code)
			fmt.Fprintf(w, `{"conflictingRequest": {"code": %d, "message": "Cannot 'resize' instance s1 while it is in task_state resize_prep"}}`, f.code)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func newClient(t *testing.T) (*Client, *fakeNova) {
	f := &fakeNova{t: t}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := New(context.Background(), Config{Endpoint: srv.URL + "/v2.1", Token: "admin:admin"})
	if err != nil {
		t.Fatal(err)
	}
	return c, f
}

func TestServer(t *testing.T) {
	c, f := newClient(t)
	s, err := c.Server(context.Background(), "s1", "req-11111111-2222-3333-4444-555555555555")
	if err != nil {
		t.Fatal(err)
	}
	want := Server{ID: "s1", Name: "vm", Status: "VERIFY_RESIZE", VMState: "resized", Host: "cmp1", Node: "cmp1.example",
		Flavor: Flavor{Name: "m1.small.t4-4q", VCPUs: 2, RAM: 2048, Disk: 20, ExtraSpecs: map[string]string{"resources:VGPU": "1", "trait:CUSTOM_NVIDIA_232": "required"}}}
	gb, _ := json.Marshal(s)
	wb, _ := json.Marshal(want)
	if string(gb) != string(wb) {
		t.Errorf("got  %s\nwant %s", gb, wb)
	}
	if !s.Resizing() {
		t.Error("VERIFY_RESIZE is resizing")
	}
	if f.ids[0] != "req-11111111-2222-3333-4444-555555555555" {
		t.Errorf("request id sent %q", f.ids[0])
	}
	_, err = c.Server(context.Background(), "gone", "")
	if !IsNotFound(err) || !strings.Contains(err.Error(), "Instance gone could not be found.") {
		t.Errorf("missing server: %v", err)
	}
}

func TestFlavorsPages(t *testing.T) {
	c, f := newClient(t)
	all, err := c.Flavors(context.Background(), "req-x")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != flavorPage+1 {
		t.Fatalf("got %d flavors, want %d", len(all), flavorPage+1)
	}
	last := all[len(all)-1]
	if last.ID != "x" || last.Swap != 512 || last.Ephemeral != 5 || last.Public || last.ExtraSpecs["resources:VGPU"] != "1" {
		t.Errorf("last flavor %+v", last)
	}
	wantCalls := []string{"GET /v2.1/flavors/detail?is_public=None&limit=1000",
		fmt.Sprintf("GET /v2.1/flavors/detail?is_public=None&limit=1000&marker=f%d", flavorPage-1)}
	if strings.Join(f.got, "\n") != strings.Join(wantCalls, "\n") {
		t.Errorf("calls\n%s\nwant\n%s", strings.Join(f.got, "\n"), strings.Join(wantCalls, "\n"))
	}
}

func TestActions(t *testing.T) {
	c, f := newClient(t)
	ctx := context.Background()
	for _, call := range []func() error{
		func() error { return c.Resize(ctx, "s1", "42", "req-a") },
		func() error { return c.ConfirmResize(ctx, "s1", "req-b") },
		func() error { return c.RevertResize(ctx, "s1", "req-c") },
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{`POST /v2.1/servers/s1/action {"resize":{"flavorRef":"42"}}`,
		`POST /v2.1/servers/s1/action {"confirmResize":null}`,
		`POST /v2.1/servers/s1/action {"revertResize":null}`}
	if strings.Join(f.got, "\n") != strings.Join(want, "\n") {
		t.Errorf("calls\n%s\nwant\n%s", strings.Join(f.got, "\n"), strings.Join(want, "\n"))
	}
	if strings.Join(f.ids, ",") != "req-a,req-b,req-c" {
		t.Errorf("request ids %v", f.ids)
	}
	tests := []struct {
		code      int
		conflict  bool
		retryable bool
	}{{409, true, false}, {400, false, false}, {503, false, true}, {429, false, true}}
	for _, tc := range tests {
		f.code = tc.code
		err := c.Resize(ctx, "s1", "42", "")
		if err == nil || IsConflict(err) != tc.conflict || IsRetryable(err) != tc.retryable {
			t.Errorf("%d: %v (conflict %v, retryable %v)", tc.code, err, IsConflict(err), IsRetryable(err))
		}
		if !strings.Contains(err.Error(), "while it is in task_state resize_prep") {
			t.Errorf("%d: Nova's message missing: %v", tc.code, err)
		}
	}
	// A connection failure may succeed later.
	dead, err := New(ctx, Config{Endpoint: "http://127.0.0.1:1/v2.1", Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.ConfirmResize(ctx, "s1", ""); !IsRetryable(err) {
		t.Errorf("connection refused: %v is not retryable", err)
	}
}

func TestMicroversion(t *testing.T) {
	for v, ok := range map[string]bool{"2.61": true, "2.79": true, "2.96": true, "2.60": false, "3.1": false, "2.x": false, "": false} {
		if err := CheckMicroversion(v); (err == nil) != ok {
			t.Errorf("CheckMicroversion(%q) = %v", v, err)
		}
	}
}

// TestMigrateCalls: the move calls' bodies and queries, and the
// migrations newest first.
func TestMigrateCalls(t *testing.T) {
	c, f := newClient(t)
	ctx := context.Background()
	for _, call := range []func() error{
		func() error { return c.Migrate(ctx, "s1", "", "req-a") },
		func() error { return c.Migrate(ctx, "s1", "cmp2", "req-b") },
		func() error { return c.LiveMigrate(ctx, "s1", "cmp2", "req-c") },
		func() error { return c.LiveMigrate(ctx, "s1", "", "req-d") },
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	ms, err := c.Migrations(ctx, "s1", "req-e")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].UUID != "m-new" || ms[0].Finished() || ms[0].Type != "live-migration" || !ms[1].Finished() {
		t.Errorf("migrations %+v", ms)
	}
	srvs, err := c.ServersOnHost(ctx, "cmp1", "req-f")
	if err != nil || len(srvs) != 1 || srvs[0].ID != "s1" || srvs[0].Status != "ACTIVE" {
		t.Errorf("servers on host: %+v, %v", srvs, err)
	}
	want := []string{`POST /v2.1/servers/s1/action {"migrate":null}`,
		`POST /v2.1/servers/s1/action {"migrate":{"host":"cmp2"}}`,
		`POST /v2.1/servers/s1/action {"os-migrateLive":{"block_migration":"auto","host":"cmp2"}}`,
		`POST /v2.1/servers/s1/action {"os-migrateLive":{"block_migration":"auto","host":null}}`,
		`GET /v2.1/os-migrations?instance_uuid=s1`,
		`GET /v2.1/servers/detail?all_tenants=1&host=cmp1`}
	if strings.Join(f.got, "\n") != strings.Join(want, "\n") {
		t.Errorf("calls\n%s\nwant\n%s", strings.Join(f.got, "\n"), strings.Join(want, "\n"))
	}
}
