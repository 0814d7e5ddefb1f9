// SPDX-License-Identifier: Apache-2.0

package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// TestJWTHangingIssuer: while a jwt source's JWKS url hangs, requests with
// a token naming a kid the keys lack share one fetch (never two in flight)
// and each ends with its own context, while tokens whose key is in hand,
// other sources and the rest of the API go on answering; once the fetch
// fails, unknown kids are answered 503 jwks_unavailable at once, without
// another fetch.
func TestJWTHangingIssuer(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	testsvc.Must(t, err, "ec key")
	stranger, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	testsvc.Must(t, err, "ec key")
	p := newIDP(t)
	p.publish(t, map[string]any{"k1": key})
	var hang atomic.Bool
	var inflight, most atomic.Int64
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hang.Load() {
			p.Config.Handler.ServeHTTP(w, r)
			return
		}
		p.gets.Add(1)
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select {
		case <-release:
			http.Error(w, "gave up", http.StatusBadGateway)
		case <-r.Context().Done():
		}
	}))
	var once sync.Once
	unhang := func() { once.Do(func() { close(release) }) }
	t.Cleanup(func() { unhang(); hanging.Close() })

	var skew atomic.Int64
	e := newEnv(t, []webhook.Source{jwtSourceOf("scheduler", hanging.URL), batchSource()}, withSkew(&skew))
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	post := func(ctx context.Context, tok string) (answer, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/webhooks/scheduler", bytes.NewReader(nativeBody("")))
		testsvc.Must(t, err, "request")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Idempotency-Key", uuid.NewString())
		resp, err := e.client().Do(req)
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return answer{status: resp.StatusCode, header: resp.Header, body: b.Bytes()}, nil
	}
	known := func() string { return signJWT(t, key, jose.ES256, "k1", tokenClaims(now(), nil)) }
	unknown := func(i int) string {
		return signJWT(t, stranger, jose.ES256, fmt.Sprintf("rotated-%d", i), tokenClaims(now(), nil))
	}
	a, err := post(context.Background(), known())
	testsvc.Must(t, err, "post")
	e.want202(a)

	hang.Store(true)
	skew.Add(int64(time.Minute)) // the least interval between fetches is long past
	const callers = 100
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { post(ctx, unknown(i)) })
	}
	waitFor(t, "the JWKS fetch", func() bool { return inflight.Load() == 1 })
	// Meanwhile: a token whose key is in hand, another source, the API.
	for range 5 {
		a, err := post(context.Background(), known())
		testsvc.Must(t, err, "post with a known key")
		e.want202(a)
	}
	e.want202(e.postHub("batch", secretNew, nativeBody(""), "hmac-1"))
	if a := e.do(http.MethodGet, "/healthz", nil, nil); a.status != http.StatusOK {
		t.Errorf("/healthz: %d %s", a.status, a.body)
	}
	// The callers give up: each request ends, the fetch still hanging.
	cancel()
	wg.Wait()
	waitFor(t, "every waiting request to end", func() bool {
		return e.metric("vgpu_bridge_webhook_refused_total", `reason="jwks_unavailable",source="scheduler"`) == callers
	})
	if inflight.Load() != 1 {
		t.Error("the requests ended only once the fetch did, not with their own context")
	}
	if m, n := most.Load(), p.gets.Load(); m != 1 || n != 2 {
		t.Errorf("%d fetches at most at once, %d in all; want 1 and 2 (the first, and the hanging one)", m, n)
	}
	// The fetch fails: an unknown kid is answered at once, 503 with
	// Retry-After, and starts no other fetch.
	unhang()
	waitFor(t, "the fetch to end", func() bool { return inflight.Load() == 0 })
	for i := range 20 {
		a, err := post(context.Background(), unknown(1000+i))
		testsvc.Must(t, err, "post")
		wantProblem(t, a, http.StatusServiceUnavailable, "jwks_unavailable")
		if a.header.Get("Retry-After") == "" {
			t.Fatal("no Retry-After")
		}
	}
	if n := p.gets.Load(); n != 2 {
		t.Errorf("%d fetches right after the failed one, want none", n-2)
	}
	a, err = post(context.Background(), known())
	testsvc.Must(t, err, "post")
	e.want202(a)
}

// TestJWTStatusNarrowedByProjects: with jwt_projects_claim, a token reads
// (GET /v1/requests/{id}, the status_url) only the requests about
// instances of its projects, as it may only make those: another
// project's token of the same source gets 404, as for a request that does
// not exist.
func TestJWTStatusNarrowedByProjects(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	testsvc.Must(t, err, "ec key")
	p := newIDP(t)
	p.publish(t, map[string]any{"k1": key})
	s := jwtSourceOf("tenants", p.URL)
	s.JWTProjectsClaim = "projects"
	allowed := jwtSourceOf("allowed", p.URL)
	allowed.JWTAudience = "vgpu-bridge-allowed"
	allowed.JWTProjectsClaim = "projects"
	allowed.AllowedProjects = []string{"proj-a"}
	e := newEnv(t, []webhook.Source{s, allowed})
	vms := map[string]string{"proj-a": uuid.NewString(), "proj-b": uuid.NewString()}
	for proj, vm := range vms {
		_, err := e.pool.Exec(context.Background(), `INSERT INTO instances (uuid, project_id, host) VALUES ($1, $2, 'cmp1')`, vm, proj)
		testsvc.Must(t, err, "instance")
	}
	tok := func(projects any, aud string) string {
		return signJWT(t, key, jose.ES256, "k1", tokenClaims(time.Now(), map[string]any{"projects": projects, "aud": aud}))
	}
	post := func(source, tok, vm string) uuid.UUID {
		body := []byte(`{"type":"GPU_REQUEST","vm_id":"` + vm + `","workload":"training","vgpu_profile":"T4-4Q","nonce":"` + uuid.NewString() + `"}`)
		return e.want202(e.do(http.MethodPost, "/v1/webhooks/"+source, body, map[string]string{"Authorization": "Bearer " + tok, "Idempotency-Key": uuid.NewString()}))
	}
	get := func(id uuid.UUID, tok string) answer {
		return e.do(http.MethodGet, "/v1/requests/"+id.String(), nil, map[string]string{"Authorization": "Bearer " + tok})
	}
	reqA := post("tenants", tok("proj-a", jwtAudience), vms["proj-a"])
	reqB := post("tenants", tok([]string{"proj-b"}, jwtAudience), vms["proj-b"])
	for _, c := range []struct {
		name string
		id   uuid.UUID
		tok  string
		ok   bool
	}{
		{"A's token, A's request", reqA, tok("proj-a", jwtAudience), true},
		{"a token of A and B, A's request", reqA, tok([]string{"proj-b", "proj-a"}, jwtAudience), true},
		{"B's token, B's request", reqB, tok("proj-b", jwtAudience), true},
		{"B's token, A's request", reqA, tok("proj-b", jwtAudience), false},
		{"A's token, B's request", reqB, tok([]string{"proj-a"}, jwtAudience), false},
		{"a token of no project", reqA, tok([]string{}, jwtAudience), false},
		{"a token of a project with no instance", reqA, tok("proj-z", jwtAudience), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := get(c.id, c.tok)
			if c.ok {
				if a.status != http.StatusOK || a.json(t)["id"] != c.id.String() {
					t.Fatalf("%d %s, want 200 with the request", a.status, a.body)
				}
				return
			}
			wantProblem(t, a, http.StatusNotFound, "no_such_request")
		})
	}
	// allowed_projects narrows the claim for reads as for writes.
	reqAllowed := post("allowed", tok([]string{"proj-a", "proj-b"}, "vgpu-bridge-allowed"), vms["proj-a"])
	if a := get(reqAllowed, tok("proj-a", "vgpu-bridge-allowed")); a.status != http.StatusOK {
		t.Errorf("allowed: A's token: %d %s", a.status, a.body)
	}
	wantProblem(t, get(reqAllowed, tok("proj-b", "vgpu-bridge-allowed")), http.StatusNotFound, "no_such_request")
	// Operator credentials still read every request.
	if a := e.do(http.MethodGet, "/v1/requests/"+reqA.String(), nil, map[string]string{"Authorization": "Bearer " + readToken}); a.status != http.StatusOK {
		t.Errorf("operator reader: %d %s", a.status, a.body)
	}
}

// TestJWTBoundToSourceAndLifetime: a token is for one source (its aud
// names it: without jwt_audience, vgpu-bridge:webhook:NAME), and valid for
// at most jwt_max_lifetime (1h by default) from its iat to its exp.
func TestJWTBoundToSourceAndLifetime(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	testsvc.Must(t, err, "ec key")
	p := newIDP(t)
	p.publish(t, map[string]any{"k1": key})
	a, b := jwtSourceOf("alpha", p.URL), jwtSourceOf("beta", p.URL)
	a.JWTAudience, b.JWTAudience = "", ""
	e := newEnv(t, []webhook.Source{a, b})
	post := func(source string, changes map[string]any) answer {
		tok := signJWT(t, key, jose.ES256, "k1", tokenClaims(time.Now(), changes))
		return e.do(http.MethodPost, "/v1/webhooks/"+source, nativeBody(""), map[string]string{
			"Authorization": "Bearer " + tok, "Idempotency-Key": uuid.NewString()})
	}
	forAlpha := map[string]any{"aud": "vgpu-bridge:webhook:alpha"}
	e.want202(post("alpha", forAlpha))
	wantProblem(t, post("beta", forAlpha), http.StatusUnauthorized, "wrong_audience")
	wantProblem(t, post("alpha", nil), http.StatusUnauthorized, "wrong_audience") // "vgpu-bridge" names no source
	e.want202(post("beta", map[string]any{"aud": []string{"vgpu-bridge:webhook:beta"}}))

	long := map[string]any{"aud": "vgpu-bridge:webhook:alpha", "exp": time.Now().Add(2 * time.Hour).Unix()}
	wantProblem(t, post("alpha", long), http.StatusUnauthorized, "token_lifetime_too_long")
	old := map[string]any{"aud": "vgpu-bridge:webhook:alpha", "iat": time.Now().Add(-30 * 24 * time.Hour).Unix()}
	wantProblem(t, post("alpha", old), http.StatusUnauthorized, "token_lifetime_too_long")
	if n := e.count(`SELECT count(*) FROM requests`); n != 2 {
		t.Errorf("%d requests stored, want 2", n)
	}
}

// TestJWTTenantsKeySpaces: tenants sharing a jwt source (tokens of other
// projects, or another sub) each have their own idempotency keys: the same
// Idempotency-Key makes a request of each, not a 409 for the other's, and
// each retry replays its own answer.
func TestJWTTenantsKeySpaces(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	testsvc.Must(t, err, "ec key")
	p := newIDP(t)
	p.publish(t, map[string]any{"k1": key})
	s := jwtSourceOf("tenants", p.URL)
	s.JWTProjectsClaim = "projects"
	e := newEnv(t, []webhook.Source{s})
	vms := map[string]string{"proj-a": uuid.NewString(), "proj-b": uuid.NewString()}
	for proj, vm := range vms {
		_, err := e.pool.Exec(context.Background(), `INSERT INTO instances (uuid, project_id, host) VALUES ($1, $2, 'cmp1')`, vm, proj)
		testsvc.Must(t, err, "instance")
	}
	post := func(sub, proj string, body []byte) answer {
		tok := signJWT(t, key, jose.ES256, "k1", tokenClaims(time.Now(), map[string]any{"projects": proj, "sub": sub}))
		return e.do(http.MethodPost, "/v1/webhooks/tenants", body, map[string]string{"Authorization": "Bearer " + tok, "Idempotency-Key": "job-1"})
	}
	body := func(proj string) []byte {
		return []byte(`{"type":"GPU_REQUEST","vm_id":"` + vms[proj] + `","workload":"training","vgpu_profile":"T4-4Q"}`)
	}
	idA := e.want202(post("scheduler", "proj-a", body("proj-a")))
	idB := e.want202(post("scheduler", "proj-b", body("proj-b")))
	if idA == idB {
		t.Fatal("both tenants got one request")
	}
	for proj, id := range map[string]uuid.UUID{"proj-a": idA, "proj-b": idB} {
		a := post("scheduler", proj, body(proj))
		if a.status != http.StatusAccepted || a.header.Get("Idempotent-Replayed") != "true" || a.json(t)["request_id"] != id.String() {
			t.Errorf("%s's retry: %d %s, want its own first answer (%s)", proj, a.status, a.body, id)
		}
	}
	// Another client (sub) of the same project: its own keys too.
	e.want202(post("other-client", "proj-a", body("proj-a")))
	wantProblem(t, post("scheduler", "proj-a", body("proj-b")), http.StatusForbidden, "project_not_allowed")
	if n := e.count(`SELECT count(*) FROM requests`); n != 3 {
		t.Errorf("%d requests stored, want 3", n)
	}
}
