// SPDX-License-Identifier: Apache-2.0

package webhook

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/uuid"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/webhook"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

const (
	jwtIssuer   = "https://idp.example.org/realms/hpc"
	jwtAudience = "vgpu-bridge"
)

// idp is an identity provider of the tests: it signs tokens and serves
// its JWKS (which tests replace) over loopback HTTP, counting the GETs.
type idp struct {
	*httptest.Server
	jwks atomic.Pointer[[]byte]
	down atomic.Bool
	gets atomic.Int64
}

func newIDP(t *testing.T) *idp {
	t.Helper()
	p := &idp{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.gets.Add(1)
		if p.down.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Write(*p.jwks.Load())
	}))
	t.Cleanup(p.Close)
	return p
}

// publish makes the JWKS hold the public parts of keys (kid → private key).
func (p *idp) publish(t *testing.T, keys map[string]any) {
	t.Helper()
	var set jose.JSONWebKeySet
	for kid, k := range keys {
		pub := k.(crypto.Signer).Public()
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: pub, KeyID: kid, Use: "sig"})
	}
	b, err := json.Marshal(set)
	testsvc.Must(t, err, "jwks")
	p.jwks.Store(&b)
}

// signJWT signs claims under alg with key, naming kid.
func signJWT(t *testing.T, key any, alg jose.SignatureAlgorithm, kid string, claims map[string]any) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	testsvc.Must(t, err, "signer")
	tok, err := jwt.Signed(sig).Claims(claims).Serialize()
	testsvc.Must(t, err, "sign")
	return tok
}

// tokenClaims are valid claims at now, with the given changes (a nil
// value deletes the claim).
func tokenClaims(now time.Time, changes map[string]any) map[string]any {
	c := map[string]any{"iss": jwtIssuer, "aud": []string{"other", jwtAudience}, "sub": "batch-scheduler",
		"iat": now.Unix(), "exp": now.Add(5 * time.Minute).Unix(), "jti": uuid.NewString()}
	for k, v := range changes {
		if v == nil {
			delete(c, k)
			continue
		}
		c[k] = v
	}
	return c
}

func jwtSourceOf(name, jwksURL string) webhook.Source {
	return webhook.Source{Name: name, Auth: webhook.AuthJWT, Format: webhook.FormatNative,
		JWTIssuer: jwtIssuer, JWTAudience: jwtAudience, JWKSURL: jwksURL, JWTLeeway: time.Minute,
		Rate: 1000, Burst: 1000, MaxBodyBytes: 4096}
}

// withSkew runs the endpoint's clock ahead of the real one by *skew.
func withSkew(skew *atomic.Int64) option {
	return func(wc *webhook.Config, _ *api.Config) {
		wc.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	}
}

// TestJWTSource: an auth = jwt source against the real server and
// Postgres: a token signed by a key of the issuer's JWKS is accepted
// (202, durable), a retry with its Idempotency-Key is a replay, each
// forged, misdirected or stale token is refused 401 with its own code in
// the endpoint's order of checks, and a key rotated at the issuer is
// picked up without a restart, with fetches at least 10 s apart.
func TestJWTSource(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	testsvc.Must(t, err, "rsa key")
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	testsvc.Must(t, err, "ec key")
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	testsvc.Must(t, err, "ed25519 key")
	_, strangerKey, err := ed25519.GenerateKey(rand.Reader)
	testsvc.Must(t, err, "ed25519 key")

	p := newIDP(t)
	p.publish(t, map[string]any{"rsa-2026": rsaKey})
	var skew atomic.Int64
	e := newEnv(t, []webhook.Source{jwtSourceOf("scheduler", p.URL+"/certs")}, withSkew(&skew))
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	post := func(tok string, body []byte, key string) answer {
		h := map[string]string{"Idempotency-Key": key}
		if tok != "" {
			h["Authorization"] = "Bearer " + tok
		}
		return e.do(http.MethodPost, "/v1/webhooks/scheduler", body, h)
	}

	// Accepted; the retry under the same Idempotency-Key is a replay.
	tok := signJWT(t, rsaKey, jose.RS256, "rsa-2026", tokenClaims(now(), nil))
	body := nativeBody("")
	id := e.want202(post(tok, body, "job-1"))
	a := post(tok, body, "job-1")
	if a.status != http.StatusAccepted || a.header.Get("Idempotent-Replayed") != "true" || a.json(t)["request_id"] != id.String() {
		t.Fatalf("retry: %d %s (replayed %q), want the first answer", a.status, a.body, a.header.Get("Idempotent-Replayed"))
	}
	wantProblem(t, post(tok, nativeBody(""), "job-1"), http.StatusConflict, "idempotency_conflict")

	// The issuer rotates to an EC key, retiring the RSA key. The first
	// fetch was moments ago: a token naming the new kid waits (at most
	// one fetch per 10 s), then is accepted, without a restart.
	p.publish(t, map[string]any{"ec-2027": ecKey})
	gets := p.gets.Load()
	wantProblem(t, post(signJWT(t, ecKey, jose.ES256, "ec-2027", tokenClaims(now(), nil)), nativeBody(""), "rot-1"),
		http.StatusUnauthorized, "unknown_key")
	if p.gets.Load() != gets {
		t.Fatalf("a fetch %d after the last one: the 10 s rate limit does not hold", p.gets.Load()-gets)
	}
	skew.Add(int64(11 * time.Second))
	e.want202(post(signJWT(t, ecKey, jose.ES256, "ec-2027", tokenClaims(now(), nil)), nativeBody(""), "rot-2"))
	if got := p.gets.Load(); got != gets+1 {
		t.Errorf("%d fetches for the rotation, want 1", got-gets)
	}
	// The retired key is refused, and asks for no fetch within 10 s.
	wantProblem(t, post(signJWT(t, rsaKey, jose.RS256, "rsa-2026", tokenClaims(now(), nil)), nativeBody(""), "rot-3"),
		http.StatusUnauthorized, "unknown_key")
	if got := p.gets.Load(); got != gets+1 {
		t.Errorf("%d fetches after the rotation, want 1", got-gets)
	}

	// Refusals: 401, problem+json, their own code, WWW-Authenticate.
	p.publish(t, map[string]any{"ec-2027": ecKey, "ed-2027": edKey})
	skew.Add(int64(11 * time.Second)) // the Ed25519 key is fetched by its first token
	valid := func(changes map[string]any) string {
		return signJWT(t, ecKey, jose.ES256, "ec-2027", tokenClaims(now(), changes))
	}
	e.want202(post(signJWT(t, edKey, jose.EdDSA, "ed-2027", tokenClaims(now(), nil)), nativeBody(""), "ed-1"))
	hdr := base64.RawURLEncoding.EncodeToString
	claims, _ := json.Marshal(tokenClaims(now(), nil))
	spki, _ := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	stored := e.count(`SELECT count(*) FROM requests`)
	for _, c := range []struct {
		name, tok, code string
	}{
		{"no token", "", "missing_token"},
		{"garbage", "not-a-jwt", "bad_token"},
		{"alg none", hdr([]byte(`{"alg":"none","typ":"JWT","kid":"ec-2027"}`)) + "." + hdr(claims) + ".", "bad_algorithm"},
		{"HS256 keyed with the public key", signJWT(t, spki, jose.HS256, "ec-2027", tokenClaims(now(), nil)), "bad_algorithm"},
		{"unknown kid", signJWT(t, strangerKey, jose.EdDSA, "stranger", tokenClaims(now(), nil)), "unknown_key"},
		{"a stranger under a known kid", signJWT(t, strangerKey, jose.EdDSA, "ed-2027", tokenClaims(now(), nil)), "bad_signature"},
		{"wrong issuer", valid(map[string]any{"iss": "https://evil.example.org"}), "wrong_issuer"},
		{"wrong audience", valid(map[string]any{"aud": "someone-else"}), "wrong_audience"},
		{"expired 2 min ago", valid(map[string]any{"exp": now().Add(-2 * time.Minute).Unix()}), "token_expired"},
		{"not yet valid", valid(map[string]any{"nbf": now().Add(10 * time.Minute).Unix()}), "token_not_yet_valid"},
		{"no exp", valid(map[string]any{"exp": nil}), "bad_token"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := post(c.tok, nativeBody(""), "r-"+c.name)
			wantProblem(t, a, http.StatusUnauthorized, c.code)
			if a.header.Get("WWW-Authenticate") == "" {
				t.Error("no WWW-Authenticate")
			}
		})
	}
	// Expired 30 s ago: within the minute of leeway.
	e.want202(post(valid(map[string]any{"exp": now().Add(-30 * time.Second).Unix()}), nativeBody(""), "leeway"))
	if n := e.count(`SELECT count(*) FROM requests`); n != stored+1 {
		t.Errorf("%d requests stored by the refusals", n-stored-1)
	}

	// The order of checks: size (413) before the token, the token (401)
	// before JSON (400).
	big := nativeBody(`"metrics":{"pad":"` + strings.Repeat("x", 5000) + `"}`)
	wantProblem(t, post("garbage", big, "o1"), http.StatusRequestEntityTooLarge, "body_too_large")
	wantProblem(t, post("garbage", []byte("{not json"), "o2"), http.StatusUnauthorized, "bad_token")
	wantProblem(t, post(valid(nil), []byte("{not json"), "o3"), http.StatusBadRequest, "not_json")

	if got := e.metric("vgpu_bridge_webhook_refused_total", `reason="bad_algorithm",source="scheduler"`); got != 2 {
		t.Errorf("bad_algorithm refusals counted %v, want 2", got)
	}
	if l := e.logs.String(); strings.Contains(l, tok) || strings.Contains(l, string(claims)) || strings.Contains(l, "eyJ") {
		t.Error("a token appears in the log")
	}
}

// TestJWTProjectsClaim: jwt_projects_claim narrows allowed_projects per
// token. An instance in allowed_projects but not in the token's projects,
// or in the token's projects but not in allowed_projects, is refused 403
// project_not_allowed, nothing stored; a token without the claim is 401.
func TestJWTProjectsClaim(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	testsvc.Must(t, err, "ec key")
	p := newIDP(t)
	p.publish(t, map[string]any{"k1": key})
	s := jwtSourceOf("tenants", p.URL)
	s.JWTProjectsClaim = "projects"
	s.AllowedProjects = []string{"proj-a", "proj-b"}
	open := jwtSourceOf("open", p.URL) // no allowed_projects: the claim alone scopes
	open.JWTProjectsClaim = "projects"
	open.JWTAudience = "vgpu-bridge-open" // its own: a token is bound to one source
	e := newEnv(t, []webhook.Source{s, open})
	vms := map[string]string{"proj-a": uuid.NewString(), "proj-b": uuid.NewString(), "proj-c": uuid.NewString()}
	for proj, vm := range vms {
		_, err := e.pool.Exec(context.Background(), `INSERT INTO instances (uuid, project_id, host) VALUES ($1, $2, 'cmp1')`, vm, proj)
		testsvc.Must(t, err, "instance")
	}
	post := func(source string, projects any, vm string) answer {
		changes := map[string]any{"projects": projects}
		if source == "open" {
			changes["aud"] = open.JWTAudience
		}
		tok := signJWT(t, key, jose.ES256, "k1", tokenClaims(time.Now(), changes))
		body := []byte(`{"type":"GPU_REQUEST","vm_id":"` + vm + `","workload":"training","vgpu_profile":"T4-4Q","nonce":"` + uuid.NewString() + `"}`)
		return e.do(http.MethodPost, "/v1/webhooks/"+source, body, map[string]string{"Authorization": "Bearer " + tok, "Idempotency-Key": uuid.NewString()})
	}
	e.want202(post("tenants", "proj-a", vms["proj-a"]))
	e.want202(post("tenants", []string{"proj-a", "proj-b"}, vms["proj-b"]))
	for _, c := range []struct {
		name     string
		projects any
		vm       string
	}{
		{"allowed, not in the token", []string{"proj-a"}, vms["proj-b"]},
		{"in the token, not allowed", []string{"proj-c"}, vms["proj-c"]},
		{"a token of no project", []string{}, vms["proj-a"]},
		{"unknown instance", []string{"proj-a"}, uuid.NewString()},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantProblem(t, post("tenants", c.projects, c.vm), http.StatusForbidden, "project_not_allowed")
		})
	}
	wantProblem(t, post("tenants", nil, vms["proj-a"]), http.StatusUnauthorized, "missing_projects_claim")
	if n := e.count(`SELECT count(*) FROM requests`); n != 2 {
		t.Errorf("%d requests stored, want 2", n)
	}
	// Without allowed_projects, the token's projects are the scope.
	e.want202(post("open", []string{"proj-c"}, vms["proj-c"]))
	wantProblem(t, post("open", []string{"proj-c"}, vms["proj-a"]), http.StatusForbidden, "project_not_allowed")
}

// TestJWTKeysUnavailable: with no keys at all (the issuer is down since
// start), a token is answered 503 jwks_unavailable with Retry-After, so
// that the sender retries; once the issuer is back, it is accepted.
func TestJWTKeysUnavailable(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	testsvc.Must(t, err, "ec key")
	p := newIDP(t)
	p.publish(t, map[string]any{"k1": key})
	p.down.Store(true)
	var skew atomic.Int64
	e := newEnv(t, []webhook.Source{jwtSourceOf("scheduler", p.URL)}, withSkew(&skew))
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	post := func() answer {
		tok := signJWT(t, key, jose.ES256, "k1", tokenClaims(now(), nil))
		return e.do(http.MethodPost, "/v1/webhooks/scheduler", nativeBody(""), map[string]string{
			"Authorization": "Bearer " + tok, "Idempotency-Key": uuid.NewString()})
	}
	a := post()
	wantProblem(t, a, http.StatusServiceUnavailable, "jwks_unavailable")
	ra, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 13 {
		t.Errorf("Retry-After %q, want the next fetch's time: 10 s after the failure, with jitter", a.header.Get("Retry-After"))
	}
	p.down.Store(false)
	skew.Add(int64(time.Duration(ra+1) * time.Second))
	e.want202(post())
	if !strings.Contains(e.logs.String(), "cannot fetch the JWKS") {
		t.Error("the failed fetch was not logged")
	}
}
