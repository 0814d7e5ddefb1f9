package keystone_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testbridge"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// cacheTTL is [keystone] cache_ttl in this test: how long a revoked token
// may still pass.
const cacheTTL = 2 * time.Second

type answer struct {
	status      int
	contentType string
	body        []byte
	challenge   string // WWW-Authenticate
}

func (a answer) problem(t *testing.T) map[string]any {
	t.Helper()
	if a.contentType != "application/problem+json" {
		t.Errorf("content type %q, want application/problem+json (body %s)", a.contentType, a.body)
	}
	var m map[string]any
	if err := json.Unmarshal(a.body, &m); err != nil {
		t.Fatalf("problem body %s: %v", a.body, err)
	}
	return m
}

type api struct {
	t    *testing.T
	base string
}

func (c api) do(method, path, token string) answer {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, nil)
	testsvc.Must(c.t, err, "request")
	if token != "" {
		req.Header.Set("X-Auth-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	testsvc.Must(c.t, err, method+" "+path)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("Content-Type"), b, resp.Header.Get("WWW-Authenticate")}
}

// doBody is do with a JSON body.
func (c api) doBody(method, path, token, body string) answer {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	testsvc.Must(c.t, err, "request")
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("X-Auth-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	testsvc.Must(c.t, err, method+" "+path)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("Content-Type"), b, resp.Header.Get("WWW-Authenticate")}
}

// expect checks the status of a call and returns its answer.
func (c api) expect(want int, method, path, token, who string) answer {
	c.t.Helper()
	a := c.do(method, path, token)
	if a.status != want {
		c.t.Errorf("%s: %s %s = %d, want %d (%s)", who, method, path, a.status, want, a.body)
	}
	return a
}

// ids returns the sorted values of key in the objects of the list field.
func ids(t *testing.T, a answer, field, key string) []string {
	t.Helper()
	var m map[string][]map[string]any
	if err := json.Unmarshal(a.body, &m); err != nil {
		t.Fatalf("list %s: %v (%s)", field, err, a.body)
	}
	var out []string
	for _, o := range m[field] {
		s, _ := o[key].(string)
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

func sorted(ss ...string) []string {
	out := append([]string(nil), ss...)
	sort.Strings(out)
	return out
}

func equal(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// world is a Keystone with two projects and their users, and a bridge
// validating their tokens.
type world struct {
	ks                  *keystone
	api                 api
	url                 string
	clouds              string
	region              string // the test's region (its identity endpoint is proxy)
	pa, pb              *projects.Project
	projA, projB        string
	instA, instB        string
	reqA, reqB, reqNone string
	gpu                 string // the GPU seedWalk puts in the Placement mirror
	proxy               *testsvc.Proxy
	svc                 user
	pool                *pgxpool.Pool // the bridge's database
}

// newWorld starts the world; settings are more configuration
// ("section.option=value"), e.g. an [oslo_policy] policy_file.
func newWorld(t *testing.T, settings ...string) *world {
	t.Helper()
	ks := newKeystone(t)
	w := &world{ks: ks}
	pa, pb, psvc := ks.project("vgpu-test-a"), ks.project("vgpu-test-b"), ks.project("vgpu-test-service")
	w.pa, w.pb, w.projA, w.projB = pa, pb, pa.ID, pb.ID
	// The bridge's own user has only Keystone's "service" role, enough to
	// validate others' tokens under Keystone's default policy.
	w.svc = ks.user("vgpu-bridge", psvc, "service")

	// The bridge validates tokens at the identity endpoint the catalog
	// names for its region: in this test's region, a proxy the test can cut.
	ksu, err := url.Parse(keystoneURL())
	testsvc.Must(t, err, "keystone url")
	w.proxy = testsvc.NewProxy(t, ksu.Host)
	region := ks.regionVia("http://" + w.proxy.Addr() + "/v3/")
	w.region = region
	w.clouds = writeCloudsYAML(t,
		cloud{name: "bridge", authURL: keystoneURL(), user: w.svc.name, password: w.svc.password, project: psvc.Name, region: region})
	t.Setenv("OS_CLIENT_CONFIG_FILE", w.clouds)

	db := testsvc.Postgres(t)
	v := testbridge.Config(t, db, append([]string{
		"api.auth_strategy=keystone",
		"keystone.cloud=bridge",
		"keystone.admin_roles=admin",
		"keystone.reader_roles=reader,member",
		"keystone.cache_ttl=" + cacheTTL.String(),
		"keystone.invalid_cache_ttl=1s",
		"keystone.timeout=1m", // a loaded test machine: Keystone may take seconds
		// The tests write the Placement mirror directly (providers and
		// allocations the real Placement does not have); a sync round
		// would remove them while a slow test still reads them.
		"placement.sync_interval=24h", "placement.full_sync_interval=168h",
	}, settings...)...,
	)
	d := testbridge.Start(t, v)
	w.pool = d.Pool
	w.url = "http://" + d.API.Addr()
	w.api = api{t: t, base: w.url}

	// What Nova's notifications would have told the bridge: one instance
	// in each project, and a request about each, plus one about no instance.
	ctx := context.Background()
	w.instA, w.instB = uuid.NewString(), uuid.NewString()
	for inst, proj := range map[string]string{w.instA: w.projA, w.instB: w.projB} {
		_, err := d.Pool.Exec(ctx, `INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state)
			VALUES ($1, $2, 'u', 'host-k', 'node-k', 'active', 'running')`, inst, proj)
		testsvc.Must(t, err, "insert instance")
	}
	store := requests.NewStore(d.Pool, "test")
	ia, ib := uuid.MustParse(w.instA), uuid.MustParse(w.instB)
	rs := []requests.Request{
		{ID: uuid.New(), Source: "operator", Kind: "GPU_REQUEST", InstanceUUID: &ia},
		{ID: uuid.New(), Source: "operator", Kind: "GPU_REQUEST", InstanceUUID: &ib},
		{ID: uuid.New(), Source: "operator", Kind: "GPU_LOAD"},
	}
	testsvc.Must(t, store.Do(ctx, func(tx pgx.Tx) error { return store.CreateBatch(ctx, tx, rs) }), "create requests")
	w.reqA, w.reqB, w.reqNone = rs[0].ID.String(), rs[1].ID.String(), rs[2].ID.String()
	return w
}

func TestKeystoneAuth(t *testing.T) {
	w := newWorld(t)
	ks, projA, projB := w.ks, w.pa, w.pb

	// Users: a member and a reader of A, a member of B, and one whose
	// only role the bridge does not know.
	alice := ks.user("alice", projA, "member")
	rita := ks.user("rita", projA, "reader")
	carol := ks.user("carol", projB, "member")
	eve := ks.user("eve", projA, "vgpu-test-"+uuid.NewString()[:8])
	admin, tAlice, tRita, tCarol, tEve := ks.adminToken(), ks.token(alice), ks.token(rita), ks.token(carol), ks.token(eve)

	t.Run("no or bad token is 401", func(t *testing.T) {
		c := api{t: t, base: w.url}
		a := c.expect(401, "GET", "/v1/instances", "", "no token")
		if p := a.problem(t); p["code"] != "no_token" {
			t.Errorf("problem %v", p)
		}
		// Where to get a token: the cloud's Keystone, as keystonemiddleware says.
		if want := `Keystone uri="` + keystoneURL() + `"`; a.challenge != want {
			t.Errorf("WWW-Authenticate %q, want %q", a.challenge, want)
		}
		p := c.expect(401, "GET", "/v1/instances", "gAAAAABnot-a-keystone-token", "bad token").problem(t)
		if p["code"] != "bad_token" {
			t.Errorf("problem %v", p)
		}
		// A token that is not one of this Keystone's, cached as refused: still 401.
		c.expect(401, "GET", "/v1/requests", "gAAAAABnot-a-keystone-token", "bad token again")
	})

	t.Run("admin sees every project", func(t *testing.T) {
		c := api{t: t, base: w.url}
		got := ids(t, c.expect(200, "GET", "/v1/instances", admin, "admin"), "instances", "uuid")
		if !equal(got, sorted(w.instA, w.instB)) {
			t.Errorf("admin instances = %v, want A's and B's", got)
		}
		got = ids(t, c.expect(200, "GET", "/v1/requests", admin, "admin"), "requests", "id")
		if !equal(got, sorted(w.reqA, w.reqB, w.reqNone)) {
			t.Errorf("admin requests = %v, want all three", got)
		}
		c.expect(200, "GET", "/v1/instances/"+w.instB, admin, "admin")
		c.expect(200, "GET", "/v1/requests/"+w.reqNone, admin, "admin")
		c.expect(200, "GET", "/v1/dead-letters", admin, "admin")
	})

	t.Run("member of A sees only A", func(t *testing.T) {
		c := api{t: t, base: w.url}
		got := ids(t, c.expect(200, "GET", "/v1/instances", tAlice, "alice"), "instances", "uuid")
		if !equal(got, []string{w.instA}) {
			t.Errorf("alice instances = %v, want only %s", got, w.instA)
		}
		// Asking for B's project by name changes nothing.
		got = ids(t, c.expect(200, "GET", "/v1/instances?project="+w.projB, tAlice, "alice"), "instances", "uuid")
		if len(got) != 0 {
			t.Errorf("alice instances of project B = %v, want none", got)
		}
		got = ids(t, c.expect(200, "GET", "/v1/requests", tAlice, "alice"), "requests", "id")
		if !equal(got, []string{w.reqA}) {
			t.Errorf("alice requests = %v, want only %s", got, w.reqA)
		}
		c.expect(200, "GET", "/v1/instances/"+w.instA, tAlice, "alice")
		c.expect(200, "GET", "/v1/requests/"+w.reqA, tAlice, "alice")
		for _, p := range []string{"/v1/instances/" + w.instB, "/v1/requests/" + w.reqB, "/v1/requests/" + w.reqNone} {
			c.expect(404, "GET", p, tAlice, "alice").problem(t)
		}
		c.expect(403, "GET", "/v1/dead-letters", tAlice, "alice").problem(t)
	})

	t.Run("member of B sees only B", func(t *testing.T) {
		c := api{t: t, base: w.url}
		got := ids(t, c.expect(200, "GET", "/v1/instances", tCarol, "carol"), "instances", "uuid")
		if !equal(got, []string{w.instB}) {
			t.Errorf("carol instances = %v, want only %s", got, w.instB)
		}
		c.expect(404, "GET", "/v1/instances/"+w.instA, tCarol, "carol")
		c.expect(404, "GET", "/v1/requests/"+w.reqA, tCarol, "carol")
	})

	t.Run("reader can read but not cancel", func(t *testing.T) {
		c := api{t: t, base: w.url}
		c.expect(200, "GET", "/v1/requests/"+w.reqA, tRita, "rita")
		p := c.expect(403, "POST", "/v1/requests/"+w.reqA+"/cancel", tRita, "rita").problem(t)
		if p["code"] != "forbidden" {
			t.Errorf("problem %v", p)
		}
		c.expect(403, "POST", "/v1/requests/"+w.reqA+"/cancel", tAlice, "alice")
		var r struct{ State, Code string }
		testsvc.Must(t, json.Unmarshal(c.expect(200, "GET", "/v1/requests/"+w.reqA, admin, "admin").body, &r), "decode")
		if r.State != "accepted" {
			t.Errorf("request A is %s after refused cancels, want accepted", r.State)
		}
	})

	t.Run("unknown role is 403", func(t *testing.T) {
		c := api{t: t, base: w.url}
		p := c.expect(403, "GET", "/v1/instances", tEve, "eve").problem(t)
		if d, _ := p["detail"].(string); !strings.Contains(d, "reader_roles") {
			t.Errorf("problem %v: want the roles named", p)
		}
	})

	t.Run("admin cancels", func(t *testing.T) {
		c := api{t: t, base: w.url}
		var r struct{ State, Code string }
		testsvc.Must(t, json.Unmarshal(c.expect(200, "POST", "/v1/requests/"+w.reqB+"/cancel", admin, "admin").body, &r), "decode")
		if r.State != "failed" || r.Code != "cancelled" {
			t.Errorf("cancelled request: %+v", r)
		}
	})

	t.Run("revoked token refused after the cache time", func(t *testing.T) {
		c := api{t: t, base: w.url}
		tok := ks.token(alice)
		c.expect(200, "GET", "/v1/instances/"+w.instA, tok, "alice") // validated and cached
		revokedAt := time.Now()
		ks.revoke(tok)
		// Within cache_ttl the bridge may still trust its cached answer;
		// once it has passed, Keystone is asked again and refuses.
		time.Sleep(time.Until(revokedAt.Add(cacheTTL + 100*time.Millisecond)))
		p := c.expect(401, "GET", "/v1/instances/"+w.instA, tok, "alice revoked").problem(t)
		if p["code"] != "bad_token" {
			t.Errorf("problem %v", p)
		}
		// Alice's other token is untouched.
		c.expect(200, "GET", "/v1/instances/"+w.instA, tAlice, "alice")
	})

	t.Run("keystone unreachable is 503, then recovers", func(t *testing.T) {
		c := api{t: t, base: w.url}
		tok := ks.token(carol) // not cached yet
		w.proxy.Cut()
		p := c.expect(503, "GET", "/v1/instances", tok, "carol, keystone cut").problem(t)
		if p["code"] != "identity_unavailable" {
			t.Errorf("problem %v", p)
		}
		w.proxy.Restore(t)
		// The outage is remembered for its Retry-After (5 s), then
		// Keystone is asked again.
		waitUntil(t, time.Minute, "carol accepted with keystone back", func() bool {
			return c.do("GET", "/v1/instances", tok).status == 200
		})
	})

	t.Run("metrics", func(t *testing.T) {
		c := api{t: t, base: w.url}
		m := string(c.expect(200, "GET", "/metrics", "", "anyone").body)
		// Every outcome happened above, so none may be 0.
		for _, series := range []string{`vgpu_bridge_keystone_validations_total{result="valid"}`,
			`vgpu_bridge_keystone_validations_total{result="refused"}`, `vgpu_bridge_keystone_validations_total{result="forbidden"}`,
			`vgpu_bridge_keystone_validations_total{result="error"}`, `vgpu_bridge_keystone_cache_lookups_total{result="hit"}`} {
			value := ""
			for _, line := range strings.Split(m, "\n") {
				if v, ok := strings.CutPrefix(line, series+" "); ok {
					value = v
				}
			}
			if value == "" || value == "0" {
				t.Errorf("/metrics: %s = %q, want a count above 0", series, value)
			}
		}
	})

	t.Run("vgpuctl --os-cloud", func(t *testing.T) {
		clouds := writeCloudsYAML(t,
			cloud{name: "alice", authURL: keystoneURL(), user: alice.name, password: alice.password, project: projA.Name, region: "RegionOne"},
			cloud{name: "admin", authURL: keystoneURL(), user: "admin", password: adminPassword(t), project: "admin", region: "RegionOne"})
		env := []string{"OS_CLIENT_CONFIG_FILE=" + clouds, "VGPUCTL_TOKEN=", "OS_CLOUD="}
		code, out, errs := vgpuctl(t, env, "--url", w.url, "--os-cloud", "alice", "instances", "-o", "json")
		if code != 0 {
			t.Fatalf("vgpuctl instances as alice: exit %d\n%s", code, errs)
		}
		if !strings.Contains(out, w.instA) || strings.Contains(out, w.instB) {
			t.Errorf("vgpuctl instances as alice = %s; want A's instance only", out)
		}
		code, out, errs = vgpuctl(t, env, "--url", w.url, "--os-cloud", "admin", "instances", "-o", "json")
		if code != 0 || !strings.Contains(out, w.instA) || !strings.Contains(out, w.instB) {
			t.Errorf("vgpuctl instances as admin: exit %d, out %s, err %s; want both instances", code, out, errs)
		}
		code, _, errs = vgpuctl(t, env, "--url", w.url, "--os-cloud", "alice", "requests", "cancel", w.reqA)
		if code != 1 || !strings.Contains(errs, "403") && !strings.Contains(strings.ToLower(errs), "forbidden") {
			t.Errorf("vgpuctl cancel as alice: exit %d, stderr %s; want exit 1, forbidden", code, errs)
		}
		code, _, errs = vgpuctl(t, env, "--url", w.url, "--os-cloud", "OS_CLOUD_absent", "instances")
		if code == 0 || !strings.Contains(errs, "OS_CLOUD_absent") {
			t.Errorf("vgpuctl with an unknown cloud: exit %d, stderr %s", code, errs)
		}
	})
}
