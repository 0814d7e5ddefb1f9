// SPDX-License-Identifier: Apache-2.0

package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
)

const (
	testIssuer   = "https://idp.example.org/realms/hpc"
	testAudience = "vgpu-bridge"
)

// testKeys are the signing keys of the tests, made once per process.
type testKeys struct {
	rsa, rsa2, rsaOther *rsa.PrivateKey
	ec, ecOther         *ecdsa.PrivateKey
	ed, edOther         ed25519.PrivateKey
}

var (
	keysOnce sync.Once
	theKeys  testKeys
)

func keys(t testing.TB) testKeys {
	t.Helper()
	keysOnce.Do(func() {
		gen := func() *rsa.PrivateKey {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				panic(err)
			}
			return k
		}
		genEC := func() *ecdsa.PrivateKey {
			k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				panic(err)
			}
			return k
		}
		genEd := func() ed25519.PrivateKey {
			_, k, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				panic(err)
			}
			return k
		}
		theKeys = testKeys{rsa: gen(), rsa2: gen(), rsaOther: gen(), ec: genEC(), ecOther: genEC(), ed: genEd(), edOther: genEd()}
	})
	return theKeys
}

// jwksOf is the JWKS of the public parts of keys (kid → private key).
func jwksOf(t testing.TB, keys map[string]any) []byte {
	t.Helper()
	var set jose.JSONWebKeySet
	for kid, k := range keys {
		var pub any
		switch k := k.(type) {
		case *rsa.PrivateKey:
			pub = &k.PublicKey
		case *ecdsa.PrivateKey:
			pub = &k.PublicKey
		case ed25519.PrivateKey:
			pub = k.Public()
		default:
			t.Fatalf("key type %T", k)
		}
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: pub, KeyID: kid, Use: "sig"})
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mint signs claims as a compact JWT with key under alg, naming kid ("":
// none); extra headers are added as given.
func mint(t testing.TB, key any, alg jose.SignatureAlgorithm, kid string, claims any, extra ...func(*jose.SignerOptions)) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader("kid", kid)
	}
	for _, f := range extra {
		f(opts)
	}
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(sig).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// claimsAt are valid claims at now, changed by the mods.
func claimsAt(now time.Time, mods ...func(map[string]any)) map[string]any {
	c := map[string]any{"iss": testIssuer, "aud": testAudience, "sub": "scheduler",
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(5 * time.Minute).Unix()}
	for _, m := range mods {
		m(c)
	}
	return c
}

func set(k string, v any) func(map[string]any) { return func(c map[string]any) { c[k] = v } }
func del(k string) func(map[string]any)        { return func(c map[string]any) { delete(c, k) } }

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// unsigned is a token with alg (none, in any spelling) and no signature,
// written by hand as an attacker would.
func unsigned(alg, kid string, claims map[string]any) string {
	h := `{"alg":"` + alg + `","typ":"JWT"`
	if kid != "" {
		h += `,"kid":"` + kid + `"`
	}
	p, _ := json.Marshal(claims)
	return b64(h+"}") + "." + base64.RawURLEncoding.EncodeToString(p) + "."
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// jwksServer serves a JWKS that tests replace, and counts the GETs.
type jwksServer struct {
	*httptest.Server
	body   atomic.Pointer[[]byte]
	status atomic.Int32
	gets   atomic.Int64
}

func newJWKSServer(t testing.TB, body []byte) *jwksServer {
	s := &jwksServer{}
	s.serve(body)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.gets.Add(1)
		if st := s.status.Load(); st != 0 {
			w.WriteHeader(int(st))
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Write(*s.body.Load())
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) serve(body []byte) { s.body.Store(&body); s.status.Store(0) }

// testVerifier builds the verifier of a jwt source as New does.
func testVerifier(t testing.TB, s Source, clk *fakeClock, log *slog.Logger) *jwtVerifier {
	t.Helper()
	s.Name, s.Auth, s.Rate, s.Burst = "idp", AuthJWT, 1, 1
	if s.JWTIssuer == "" {
		s.JWTIssuer, s.JWTAudience = testIssuer, testAudience
	}
	if err := checkSource(&s); err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	v, err := newJWTVerifier(&s, log, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func wantReason(t *testing.T, err *authError, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("refused (%s: %s), want accepted", err.reason, err.detail)
	case want != "" && err == nil:
		t.Fatalf("accepted, want refused %s", want)
	case want != "" && err.reason != want:
		t.Fatalf("refused %s (%s), want %s", err.reason, err.detail, want)
	}
}

func TestJWTVerify(t *testing.T) {
	k := keys(t)
	now := time.Unix(1_800_000_000, 0)
	clk := &fakeClock{t: now}
	srv := newJWKSServer(t, jwksOf(t, map[string]any{"rsa-1": k.rsa, "ec-1": k.ec, "ed-1": k.ed}))
	v := testVerifier(t, Source{JWKSURL: srv.URL, JWTLeeway: time.Minute}, clk, nil)

	rsaDER, err := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	rsaPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: rsaDER})
	rsaPKCS1 := x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey)
	ok := claimsAt(now)
	// The attacker's public key embedded in the header, under a known kid.
	embed := func(o *jose.SignerOptions) { o.EmbedJWK = true }
	otherJWK := jose.JSONWebKey{Key: k.rsaOther, KeyID: "rsa-1"}
	notJSON, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: k.rsa}, (&jose.SignerOptions{}).WithHeader("kid", "rsa-1"))
	if err != nil {
		t.Fatal(err)
	}
	signRaw := func(payload string) string {
		o, err := notJSON.Sign([]byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		s, err := o.CompactSerialize()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	jsonSerialized := func() string {
		o, err := notJSON.Sign([]byte(`{"iss":"` + testIssuer + `"}`))
		if err != nil {
			t.Fatal(err)
		}
		return o.FullSerialize()
	}

	tests := []struct {
		name string
		tok  string
		want string // "" accepted, else the reason
	}{
		{"RS256", mint(t, k.rsa, jose.RS256, "rsa-1", ok), ""},
		{"ES256", mint(t, k.ec, jose.ES256, "ec-1", ok), ""},
		{"EdDSA", mint(t, k.ed, jose.EdDSA, "ed-1", ok), ""},
		{"aud an array holding ours", mint(t, k.ec, jose.ES256, "ec-1", claimsAt(now, set("aud", []string{"other", testAudience}))), ""},
		{"no kid: tried against the keys of its algorithm", mint(t, k.ed, jose.EdDSA, "", ok), ""},
		{"expired 30 s ago, within the leeway", mint(t, k.rsa, jose.RS256, "rsa-1", claimsAt(now, set("exp", now.Add(-30*time.Second).Unix()))), ""},
		{"nbf 30 s ahead, within the leeway", mint(t, k.rsa, jose.RS256, "rsa-1", claimsAt(now, set("nbf", now.Add(30*time.Second).Unix()))), ""},
		{"no nbf, no iat", mint(t, k.rsa, jose.RS256, "rsa-1", claimsAt(now, del("nbf"), del("iat"))), ""},

		{"no token", "", "missing_token"},
		{"garbage", "garbage", "bad_token"},
		{"three empty parts", "..", "bad_token"},
		{"not base64", "!!.??.**", "bad_token"},
		{"too long", strings.Repeat("a", maxJWTBytes+1), "bad_token"},
		{"JWS JSON serialization", jsonSerialized(), "bad_token"},
		{"claims not an object", signRaw(`["not","claims"]`), "bad_token"},
		{"payload not JSON", signRaw(`not json`), "bad_token"},
		{"exp a string", mint(t, k.rsa, jose.RS256, "rsa-1", claimsAt(now, set("exp", "tomorrow"))), "bad_token"},
		{"no exp", mint(t, k.rsa, jose.RS256, "rsa-1", claimsAt(now, del("exp"))), "bad_token"},

		{"alg none", unsigned("none", "", ok), "bad_algorithm"},
		{"alg none naming a known kid", unsigned("none", "rsa-1", ok), "bad_algorithm"},
		{"alg None", unsigned("None", "", ok), "bad_algorithm"},
		{"alg empty", unsigned("", "", ok), "bad_token"},
		{"HS256 keyed with the RSA key's PEM", mint(t, rsaPEM, jose.HS256, "rsa-1", ok), "bad_algorithm"},
		{"HS256 keyed with the RSA key's DER", mint(t, rsaDER, jose.HS256, "rsa-1", ok), "bad_algorithm"},
		{"HS384 keyed with the RSA key's PKCS#1", mint(t, rsaPKCS1, jose.HS384, "", ok), "bad_algorithm"},
		{"HS512 keyed with the RSA key's DER", mint(t, rsaDER, jose.HS512, "rsa-1", ok), "bad_algorithm"},
		{"RS384", mint(t, k.rsa, jose.RS384, "rsa-1", ok), "bad_algorithm"},
		{"PS256", mint(t, k.rsa, jose.PS256, "rsa-1", ok), "bad_algorithm"},
		{"ES256 under the RSA key's kid", mint(t, k.ecOther, jose.ES256, "rsa-1", ok), "bad_algorithm"},

		{"unknown kid", mint(t, k.rsaOther, jose.RS256, "rsa-9", ok), "unknown_key"},
		{"signed by another key under a known kid", mint(t, k.rsaOther, jose.RS256, "rsa-1", ok), "bad_signature"},
		{"another EC key under a known kid", mint(t, k.ecOther, jose.ES256, "ec-1", ok), "bad_signature"},
		{"another Ed25519 key, no kid", mint(t, k.edOther, jose.EdDSA, "", ok), "bad_signature"},
		{"another key embedded in the header", mint(t, otherJWK, jose.RS256, "", ok, embed), "bad_signature"},
		{"payload swapped", func() string {
			a := strings.Split(mint(t, k.rsa, jose.RS256, "rsa-1", ok), ".")
			b := strings.Split(mint(t, k.rsa, jose.RS256, "rsa-1", claimsAt(now, set("sub", "root"))), ".")
			return a[0] + "." + b[1] + "." + a[2]
		}(), "bad_signature"},

		{"wrong issuer", mint(t, k.rsa, jose.RS256, "rsa-1", claimsAt(now, set("iss", "https://evil.example.org"))), "wrong_issuer"},
		{"issuer with a trailing slash", mint(t, k.rsa, jose.RS256, "rsa-1", claimsAt(now, set("iss", testIssuer+"/"))), "wrong_issuer"},
		{"no issuer", mint(t, k.rsa, jose.RS256, "rsa-1", claimsAt(now, del("iss"))), "wrong_issuer"},
		{"wrong audience", mint(t, k.ec, jose.ES256, "ec-1", claimsAt(now, set("aud", "someone-else"))), "wrong_audience"},
		{"audience array without ours", mint(t, k.ec, jose.ES256, "ec-1", claimsAt(now, set("aud", []string{"a", "b"}))), "wrong_audience"},
		{"no audience", mint(t, k.ec, jose.ES256, "ec-1", claimsAt(now, del("aud"))), "wrong_audience"},
		{"expired 2 min ago", mint(t, k.ed, jose.EdDSA, "ed-1", claimsAt(now, set("exp", now.Add(-2*time.Minute).Unix()))), "token_expired"},
		{"nbf 2 min ahead", mint(t, k.ed, jose.EdDSA, "ed-1", claimsAt(now, set("nbf", now.Add(2*time.Minute).Unix()))), "token_not_yet_valid"},
		{"iat 2 min ahead", mint(t, k.ed, jose.EdDSA, "ed-1", claimsAt(now, set("iat", now.Add(2*time.Minute).Unix()), del("nbf"))), "token_not_yet_valid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.verify(context.Background(), tc.tok, clk.now())
			wantReason(t, err, tc.want)
			if err != nil && (err.status != 0 || strings.Contains(err.detail, tc.tok) && tc.tok != "") {
				t.Errorf("refusal %+v: want a 401 whose detail does not quote the token", err)
			}
		})
	}
	// One fetch served every case: the unknown kid asked for another
	// within the first 10 s, which was not made.
	if n := srv.gets.Load(); n != 1 {
		t.Errorf("%d JWKS fetches, want 1", n)
	}
}

// TestJWKSRotation: a key rotated at the issuer is picked up by a token
// naming its kid, without a restart; fetches are at least 10 s apart
// whatever tokens arrive.
func TestJWKSRotation(t *testing.T) {
	k := keys(t)
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	srv := newJWKSServer(t, jwksOf(t, map[string]any{"old": k.rsa}))
	v := testVerifier(t, Source{JWKSURL: srv.URL}, clk, nil)
	check := func(key any, alg jose.SignatureAlgorithm, kid, want string, gets int64) {
		t.Helper()
		_, err := v.verify(context.Background(), mint(t, key, alg, kid, claimsAt(clk.now())), clk.now())
		wantReason(t, err, want)
		if n := srv.gets.Load(); n != gets {
			t.Fatalf("%d JWKS fetches, want %d", n, gets)
		}
	}
	check(k.rsa, jose.RS256, "old", "", 1)
	check(k.rsa, jose.RS256, "old", "", 1) // cached

	srv.serve(jwksOf(t, map[string]any{"new": k.ec, "old": k.rsa}))
	clk.add(time.Second)
	// The first fetch was a second ago: the new kid waits.
	check(k.ec, jose.ES256, "new", "unknown_key", 1)
	for i := range 50 {
		check(k.ecOther, jose.ES256, fmt.Sprintf("probe-%d", i), "unknown_key", 1)
	}
	clk.add(10 * time.Second)
	check(k.ec, jose.ES256, "new", "", 2)
	check(k.rsa, jose.RS256, "old", "", 2)
	// Unknown kids, again: one fetch per 10 s at most.
	for i := range 50 {
		clk.add(100 * time.Millisecond)
		check(k.ecOther, jose.ES256, fmt.Sprintf("probe-%d", i), "unknown_key", 2)
	}
	clk.add(5 * time.Second) // 10 s after the last fetch
	check(k.ecOther, jose.ES256, "probe-x", "unknown_key", 3)
	check(k.ecOther, jose.ES256, "probe-y", "unknown_key", 3)

	// The old key retired at the issuer: gone at the next fetch.
	srv.serve(jwksOf(t, map[string]any{"new": k.ec}))
	clk.add(11 * time.Second)
	check(k.ec, jose.ES256, "new", "", 3) // known: no fetch
	check(k.rsa, jose.RS256, "old", "", 3)
	clk.add(DefaultJWKSRefresh)
	// Older than the refresh interval: fetched again in the background,
	// the request served from the keys in hand.
	if _, err := v.verify(context.Background(), mint(t, k.rsa, jose.RS256, "old", claimsAt(clk.now())), clk.now()); err != nil {
		t.Fatalf("stale keys: %v", err)
	}
	waitFor(t, func() bool { return v.keys.set.Load().at.Equal(clk.now()) })
	check(k.rsa, jose.RS256, "old", "unknown_key", 4)
	check(k.ec, jose.ES256, "new", "", 4)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestJWKSFetchFailures: a failed fetch keeps the keys in hand; with no
// keys at all the answer is 503 jwks_unavailable, until a fetch succeeds.
func TestJWKSFetchFailures(t *testing.T) {
	k := keys(t)
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	good := jwksOf(t, map[string]any{"a": k.ed})
	srv := newJWKSServer(t, good)
	srv.status.Store(http.StatusInternalServerError)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	v := testVerifier(t, Source{JWKSURL: srv.URL}, clk, log)
	tok := func() string { return mint(t, k.ed, jose.EdDSA, "a", claimsAt(clk.now())) }

	_, err := v.verify(context.Background(), tok(), clk.now())
	wantReason(t, err, "jwks_unavailable")
	if err.status != http.StatusServiceUnavailable || err.retryAfter < defaultJWKSMinInterval || err.retryAfter > defaultJWKSMinInterval*5/4 {
		t.Errorf("jwks_unavailable: status %d, retry after %s; want 503 after 10s (+25 %% jitter at most)", err.status, err.retryAfter)
	}
	_, err = v.verify(context.Background(), tok(), clk.now())
	wantReason(t, err, "jwks_unavailable")
	if n := srv.gets.Load(); n != 1 {
		t.Errorf("%d fetches within 10 s of a failure, want 1", n)
	}

	srv.serve(good)
	clk.add(v.keys.retryIn())
	_, err = v.verify(context.Background(), tok(), clk.now())
	wantReason(t, err, "")

	var lastWait time.Duration
	// Each failure keeps the keys in hand: an error status, a body over
	// 1 MiB, a JWKS with no usable key, an issuer that is gone. A kid
	// the keys lack is then 503 jwks_unavailable (perhaps the issuer
	// rotated to it: the sender retries), not a 401; and the next fetch
	// waits longer after each failure in a row.
	for _, fail := range []func(){
		func() { srv.status.Store(http.StatusBadGateway) },
		func() {
			srv.serve(append([]byte(`{"keys":[],"pad":"`), append(bytes.Repeat([]byte("x"), maxJWKSBytes), `"}`...)...))
		},
		func() { srv.serve([]byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0c2VjcmV0c2VjcmV0","kid":"a"}]}`)) },
		func() { srv.serve([]byte(`<html>`)) },
	} {
		fail()
		clk.add(v.keys.retryIn())
		before := srv.gets.Load()
		_, err = v.verify(context.Background(), mint(t, k.edOther, jose.EdDSA, "rotated", claimsAt(clk.now())), clk.now())
		wantReason(t, err, "jwks_unavailable")
		if srv.gets.Load() != before+1 {
			t.Fatal("the unknown kid did not fetch")
		}
		wait := v.keys.retryIn()
		if wait < lastWait {
			t.Errorf("the wait after a failure in a row shrank: %s after %s", wait, lastWait)
		}
		lastWait = wait
		_, err = v.verify(context.Background(), mint(t, k.edOther, jose.EdDSA, "rotated", claimsAt(clk.now())), clk.now())
		wantReason(t, err, "jwks_unavailable")
		if srv.gets.Load() != before+1 {
			t.Fatal("a fetch again right after a failed one")
		}
		_, err = v.verify(context.Background(), tok(), clk.now())
		wantReason(t, err, "")
	}
	if lastWait < 4*defaultJWKSMinInterval {
		t.Errorf("after four failures in a row the next fetch waits %s, want it backed off (at least 40s)", lastWait)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "keeping the keys in hand") {
		t.Errorf("no warning logged for a failed fetch:\n%s", logs.String())
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestJWKSFile: jwks_file is read again when it changes, kept when its
// new version does not load, and read again on SIGHUP (SetCredentials).
func TestJWKSFile(t *testing.T) {
	k := keys(t)
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	f := filepath.Join(t.TempDir(), "jwks.json")
	write := func(b []byte, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f, mod, mod); err != nil {
			t.Fatal(err)
		}
		clk.add(fileLookInterval) // the file is looked at once a second at most
	}
	t0 := time.Unix(1_700_000_000, 0)
	write(jwksOf(t, map[string]any{"a": k.ec}), t0)
	s := Source{Name: "idp", Auth: AuthJWT, JWTIssuer: testIssuer, JWTAudience: testAudience, JWKSFile: f, Rate: 1, Burst: 1}
	if err := checkSource(&s); err != nil {
		t.Fatal(err)
	}
	v, err := newJWTVerifier(&s, slog.New(slog.DiscardHandler), clk.now)
	if err != nil {
		t.Fatal(err)
	}
	e := &Endpoint{sources: map[string]*source{"idp": {cfg: s, jwt: v}}}
	check := func(key any, alg jose.SignatureAlgorithm, kid, want string) {
		t.Helper()
		_, err := v.verify(context.Background(), mint(t, key, alg, kid, claimsAt(clk.now())), clk.now())
		wantReason(t, err, want)
	}
	check(k.ec, jose.ES256, "a", "")
	check(k.ed, jose.EdDSA, "b", "unknown_key")

	write(jwksOf(t, map[string]any{"b": k.ed}), t0.Add(time.Second))
	check(k.ed, jose.EdDSA, "b", "")
	check(k.ec, jose.ES256, "a", "unknown_key")

	// Within a second of the last look, a change is not looked for.
	write(jwksOf(t, map[string]any{"a": k.ec}), t0.Add(1500*time.Millisecond))
	clk.add(-fileLookInterval / 2)
	check(k.ec, jose.ES256, "a", "unknown_key")
	clk.add(fileLookInterval / 2)
	check(k.ec, jose.ES256, "a", "")
	write(jwksOf(t, map[string]any{"b": k.ed}), t0.Add(1700*time.Millisecond))
	check(k.ed, jose.EdDSA, "b", "")

	write([]byte(`{"keys": [`), t0.Add(2*time.Second)) // half written
	check(k.ed, jose.EdDSA, "b", "")

	// Changed without a new time or size: only SIGHUP sees it.
	ab := jwksOf(t, map[string]any{"c": k.rsa})
	write(ab, t0.Add(3*time.Second))
	check(k.rsa, jose.RS256, "c", "")
	write(bytes.Replace(ab, []byte(`"c"`), []byte(`"d"`), 1), t0.Add(3*time.Second))
	check(k.rsa, jose.RS256, "d", "unknown_key")
	if err := e.SetCredentials([]Source{s}); err != nil {
		t.Fatal(err)
	}
	check(k.rsa, jose.RS256, "d", "")

	// A reload with a file that does not load is refused, changing nothing.
	write([]byte(`{}`), t0.Add(4*time.Second))
	if err := e.SetCredentials([]Source{s}); err == nil || !strings.Contains(err.Error(), "jwks_file") {
		t.Errorf("SetCredentials with a broken jwks_file: %v", err)
	}
	check(k.rsa, jose.RS256, "d", "")
	// As is one that changes a jwt setting.
	s2 := s
	s2.JWTIssuer = "https://other.example.org"
	if err := e.SetCredentials([]Source{s2}); err == nil || !strings.Contains(err.Error(), "changing jwt_issuer needs a restart") {
		t.Errorf("SetCredentials with another issuer: %v", err)
	}
}

func TestJWTProjectsClaim(t *testing.T) {
	k := keys(t)
	now := time.Unix(1_800_000_000, 0)
	clk := &fakeClock{t: now}
	srv := newJWKSServer(t, jwksOf(t, map[string]any{"a": k.ec}))
	v := testVerifier(t, Source{JWKSURL: srv.URL, JWTProjectsClaim: "projects"}, clk, nil)
	for _, tc := range []struct {
		name  string
		claim any // nil: absent
		want  []string
		fail  string
	}{
		{"one", "proj-a", []string{"proj-a"}, ""},
		{"array", []string{"proj-a", "proj-b"}, []string{"proj-a", "proj-b"}, ""},
		{"empty array: no project", []string{}, []string{}, ""},
		{"empty strings name nothing", []string{"", "proj-a"}, []string{"proj-a"}, ""},
		{"absent", nil, nil, "missing_projects_claim"},
		{"null", json.RawMessage(`null`), nil, "missing_projects_claim"},
		{"a number", 7, nil, "bad_token"},
		{"an object", map[string]string{"a": "b"}, nil, "bad_token"},
		{"an array of numbers", []int{1, 2}, nil, "bad_token"},
		{"too many", make([]string, maxClaimProjects+1), nil, "bad_token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := claimsAt(now)
			if tc.claim != nil {
				c["projects"] = tc.claim
			}
			g, err := v.verify(context.Background(), mint(t, k.ec, jose.ES256, "a", c), now)
			wantReason(t, err, tc.fail)
			if err == nil && (!g.scoped || !slices.Equal(g.projects, tc.want)) {
				t.Errorf("grant %+v, want scoped to %q", g, tc.want)
			}
		})
	}
	// Without a configured claim, tokens are not scoped.
	v2 := testVerifier(t, Source{JWKSURL: srv.URL}, clk, nil)
	if g, err := v2.verify(context.Background(), mint(t, k.ec, jose.ES256, "a", claimsAt(now)), now); err != nil || g.scoped {
		t.Errorf("no claim configured: %+v, %v", g, err)
	}

	for _, tc := range []struct {
		allowed, claimed, want []string
	}{
		{nil, []string{"a", "b"}, []string{"a", "b"}},
		{[]string{"a", "c"}, []string{"a", "b"}, []string{"a"}},
		{[]string{"c"}, []string{"a", "b"}, []string{}},
		{[]string{"a"}, nil, []string{}},
	} {
		if got := narrowProjects(tc.allowed, tc.claimed); !slices.Equal(got, tc.want) {
			t.Errorf("narrowProjects(%q, %q) = %q, want %q", tc.allowed, tc.claimed, got, tc.want)
		}
	}
}

// TestJWTAuthenticate: a jwt source's replay key is the Idempotency-Key,
// and the grant travels with it.
func TestJWTAuthenticate(t *testing.T) {
	k := keys(t)
	now := time.Unix(1_800_000_000, 0)
	srv := newJWKSServer(t, jwksOf(t, map[string]any{"a": k.ed}))
	s := Source{Name: "idp", Auth: AuthJWT, JWTIssuer: testIssuer, JWTAudience: testAudience, JWKSURL: srv.URL,
		JWTProjectsClaim: "projects", Rate: 1, Burst: 1}
	if err := checkSource(&s); err != nil {
		t.Fatal(err)
	}
	v, err := newJWTVerifier(&s, slog.New(slog.DiscardHandler), func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	src := &source{cfg: s, jwt: v}
	r := httptest.NewRequest(http.MethodPost, "/v1/webhooks/idp", nil)
	r.Header.Set("Authorization", "Bearer "+mint(t, k.ed, jose.EdDSA, "a", claimsAt(now, set("projects", "p1"))))
	r.Header.Set(HeaderIdempotencyKey, "job-1")
	an, aerr := src.authenticate(r, nil, now)
	if aerr != nil || an.key != "job-1" || an.bodyOnly || !an.scoped || !slices.Equal(an.projects, []string{"p1"}) {
		t.Errorf("authenticate = %+v, %v", an, aerr)
	}
	r.Header.Set("Authorization", "Basic dXNlcjpwYXNz")
	if _, aerr := src.authenticate(r, nil, now); aerr == nil || aerr.reason != "missing_token" {
		t.Errorf("Basic auth: %v, want missing_token", aerr)
	}
}

func TestParseKeySet(t *testing.T) {
	k := keys(t)
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwk := func(key any, kid, use, alg string) string {
		b, err := json.Marshal(jose.JSONWebKey{Key: key, KeyID: kid, Use: use, Algorithm: alg})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name string
		keys []string
		want []string // the kids kept; nil: an error
	}{
		{"the three kinds", []string{jwk(&k.rsa.PublicKey, "r", "sig", "RS256"), jwk(&k.ec.PublicKey, "e", "", ""), jwk(k.ed.Public(), "d", "sig", "EdDSA")}, []string{"r", "e", "d"}},
		{"private keys give their public part", []string{jwk(k.rsa, "r", "", "")}, []string{"r"}},
		{"others are skipped", []string{
			`{"kty":"oct","k":"c2VjcmV0c2VjcmV0c2VjcmV0","kid":"hmac"}`,
			jwk(&small.PublicKey, "small", "", ""),
			jwk(&p384.PublicKey, "p384", "", ""),
			jwk(&k.rsa.PublicKey, "enc", "enc", ""),
			jwk(&k.rsa.PublicKey, "ps", "sig", "PS256"),
			jwk(&k.ec.PublicKey, "es384", "sig", "ES384"),
			`{"kty":"RSA","kid":"broken"}`,
			`"not a key"`,
			jwk(&k.rsa.PublicKey, "ok", "sig", ""),
		}, []string{"ok"}},
		{"nothing usable", []string{jwk(&small.PublicKey, "small", "", "")}, nil},
		{"no keys", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks, err := parseKeySet([]byte(`{"keys":[` + strings.Join(tc.keys, ",") + `]}`))
			if tc.want == nil {
				if err == nil {
					t.Fatalf("parsed %d keys, want an error", len(ks.keys))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var kids []string
			for _, k := range ks.keys {
				kids = append(kids, k.KeyID)
				if !k.IsPublic() {
					t.Errorf("key %s is not public", k.KeyID)
				}
			}
			if !slices.Equal(kids, tc.want) {
				t.Errorf("kept %q, want %q", kids, tc.want)
			}
		})
	}
	if _, err := parseKeySet([]byte(`not json`)); err == nil {
		t.Error("not JSON parsed")
	}
}

func TestCheckJWTSource(t *testing.T) {
	base := Source{Name: "idp", Auth: AuthJWT, JWTIssuer: testIssuer, JWTAudience: testAudience,
		JWKSURL: "https://idp.example.org/certs", Rate: 1, Burst: 1}
	for _, tc := range []struct {
		name    string
		mod     func(*Source)
		wantErr string
	}{
		{"good", func(*Source) {}, ""},
		{"file", func(s *Source) { s.JWKSURL, s.JWKSFile = "", "/etc/jwks.json" }, ""},
		{"http to loopback", func(s *Source) { s.JWKSURL = "http://127.0.0.1:8080/certs" }, ""},
		{"http to localhost", func(s *Source) { s.JWKSURL = "http://localhost/certs" }, ""},
		{"http to ::1", func(s *Source) { s.JWKSURL = "http://[::1]:80/certs" }, ""},
		{"alertmanager", func(s *Source) { s.Format = FormatAlertmanager }, ""},
		{"no issuer", func(s *Source) { s.JWTIssuer = "" }, "jwt_issuer"},
		{"no audience: one of its own", func(s *Source) { s.JWTAudience = "" }, ""},
		{"lifetime too long", func(s *Source) { s.JWTMaxLifetime = 25 * time.Hour }, "jwt_max_lifetime"},
		{"negative lifetime", func(s *Source) { s.JWTMaxLifetime = -time.Second }, "jwt_max_lifetime"},
		{"no keys", func(s *Source) { s.JWKSURL = "" }, "exactly one of jwks_url and jwks_file"},
		{"both", func(s *Source) { s.JWKSFile = "/etc/jwks.json" }, "exactly one of jwks_url and jwks_file"},
		{"http elsewhere", func(s *Source) { s.JWKSURL = "http://idp.example.org/certs" }, "loopback"},
		{"ftp", func(s *Source) { s.JWKSURL = "ftp://idp.example.org/certs" }, "not https"},
		{"relative", func(s *Source) { s.JWKSURL = "/certs" }, "absolute"},
		{"credentials", func(s *Source) { s.JWKSURL = "https://u:p@idp.example.org/certs" }, "credentials"},
		{"leeway too large", func(s *Source) { s.JWTLeeway = 6 * time.Minute }, "jwt_leeway"},
		{"negative leeway", func(s *Source) { s.JWTLeeway = -time.Second }, "jwt_leeway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			tc.mod(&s)
			err := checkSource(&s)
			if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("checkSource: %v, want %q", err, tc.wantErr)
			}
			if err == nil && (s.JWKSRefresh != DefaultJWKSRefresh || s.JWKSMinInterval != defaultJWKSMinInterval ||
				s.JWTMaxLifetime != DefaultJWTMaxLifetime || s.JWTAudience == "") {
				t.Errorf("defaults not set: %s, %s, %s, %q", s.JWKSRefresh, s.JWKSMinInterval, s.JWTMaxLifetime, s.JWTAudience)
			}
			if err == nil && tc.name == "no audience: one of its own" && s.JWTAudience != "vgpu-bridge:webhook:idp" {
				t.Errorf("default audience %q, want vgpu-bridge:webhook:idp", s.JWTAudience)
			}
		})
	}
}

// FuzzJWTVerify: whatever the token, verify neither panics nor accepts.
// The keys are trusted, but every seed is refused for one reason (expired,
// another issuer or audience, another key, a forbidden algorithm), and no
// change to a token can fix that without a private key.
func FuzzJWTVerify(f *testing.F) {
	k := keys(f)
	now := time.Unix(1_800_000_000, 0)
	file := filepath.Join(f.TempDir(), "jwks.json")
	if err := os.WriteFile(file, jwksOf(f, map[string]any{"rsa-1": k.rsa, "ec-1": k.ec, "ed-1": k.ed}), 0o600); err != nil {
		f.Fatal(err)
	}
	v := testVerifier(f, Source{JWKSFile: file, JWTLeeway: time.Minute, JWTProjectsClaim: "projects"}, &fakeClock{t: now}, nil)
	expired := claimsAt(now, set("exp", now.Add(-time.Hour).Unix()), set("projects", []string{"p"}))
	valid := claimsAt(now, set("projects", []string{"p"}))
	rsaDER, _ := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	for _, seed := range []string{
		mint(f, k.rsa, jose.RS256, "rsa-1", expired),
		mint(f, k.ec, jose.ES256, "ec-1", expired),
		mint(f, k.ed, jose.EdDSA, "", expired),
		mint(f, k.ed, jose.EdDSA, "ed-1", claimsAt(now, set("iss", "x"), set("projects", "p"))),
		mint(f, k.ec, jose.ES256, "ec-1", claimsAt(now, set("aud", []string{"x"}))),
		mint(f, k.rsa, jose.RS256, "rsa-1", claimsAt(now, set("nbf", now.Add(time.Hour).Unix()))),
		mint(f, k.rsa, jose.RS256, "rsa-1", claimsAt(now)), // no projects claim
		mint(f, k.rsaOther, jose.RS256, "rsa-1", valid),
		mint(f, k.edOther, jose.EdDSA, "", valid),
		mint(f, rsaDER, jose.HS256, "rsa-1", valid),
		unsigned("none", "rsa-1", valid),
		"", "a.b.c", "..", "e30.e30.", "eyJhbGciOiJSUzI1NiJ9.e30.AAAA",
	} {
		f.Add(seed)
	}
	reasons := []string{"missing_token", "bad_token", "bad_algorithm", "unknown_key", "bad_signature", "wrong_issuer",
		"wrong_audience", "token_expired", "token_not_yet_valid", "token_lifetime_too_long", "missing_projects_claim"}
	f.Fuzz(func(t *testing.T, tok string) {
		g, err := v.verify(context.Background(), tok, now)
		if err == nil {
			t.Fatalf("accepted %q (grant %+v)", tok, g)
		}
		if !slices.Contains(reasons, err.reason) {
			t.Fatalf("reason %q for %q", err.reason, tok)
		}
	})
}

// TestJWTLifetime: a token valid for longer than jwt_max_lifetime (from
// its iat, or nbf, or now without either, to its exp) is refused.
func TestJWTLifetime(t *testing.T) {
	k := keys(t)
	now := time.Unix(1_800_000_000, 0)
	clk := &fakeClock{t: now}
	srv := newJWKSServer(t, jwksOf(t, map[string]any{"a": k.ec}))
	def := testVerifier(t, Source{JWKSURL: srv.URL, JWTLeeway: time.Minute}, clk, nil)
	short := testVerifier(t, Source{JWKSURL: srv.URL, JWTMaxLifetime: 10 * time.Minute}, clk, nil)
	at := func(d time.Duration) int64 { return now.Add(d).Unix() }
	for _, tc := range []struct {
		name string
		v    *jwtVerifier
		c    map[string]any
		want string
	}{
		{"an hour from iat", def, claimsAt(now, set("exp", at(time.Hour))), ""},
		{"an hour and a second", def, claimsAt(now, set("exp", at(time.Hour+time.Second))), "token_lifetime_too_long"},
		{"issued long ago, expiring soon", def, claimsAt(now, set("iat", at(-48*time.Hour))), "token_lifetime_too_long"},
		{"a year", def, claimsAt(now, set("exp", at(365*24*time.Hour))), "token_lifetime_too_long"},
		{"far in the future", def, claimsAt(now, set("exp", int64(1)<<50)), "token_lifetime_too_long"},
		{"no iat: from nbf", def, claimsAt(now, del("iat"), set("nbf", at(-2*time.Hour))), "token_lifetime_too_long"},
		{"no iat, no nbf: from now", def, claimsAt(now, del("iat"), del("nbf"), set("exp", at(2*time.Hour))), "token_lifetime_too_long"},
		{"no iat, no nbf: an hour from now, within the leeway", def, claimsAt(now, del("iat"), del("nbf"), set("exp", at(time.Hour+30*time.Second))), ""},
		{"per source: 10 minutes", short, claimsAt(now, set("exp", at(10*time.Minute))), ""},
		{"per source: 11 minutes", short, claimsAt(now, set("exp", at(11*time.Minute))), "token_lifetime_too_long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.v.verify(context.Background(), mint(t, k.ec, jose.ES256, "a", tc.c), now)
			wantReason(t, err, tc.want)
			if err != nil && !strings.Contains(err.detail, "jwt_max_lifetime") {
				t.Errorf("detail %q does not name jwt_max_lifetime", err.detail)
			}
		})
	}
}

// TestJWTBoundToSource: a token names the source it is for. Without
// jwt_audience a source's audience is its own, so a token for one source
// of an issuer is refused by another; two sources of one issuer cannot
// share an audience.
func TestJWTBoundToSource(t *testing.T) {
	k := keys(t)
	now := time.Unix(1_800_000_000, 0)
	srv := newJWKSServer(t, jwksOf(t, map[string]any{"a": k.ec}))
	src := func(name, aud string) Source {
		return Source{Name: name, Auth: AuthJWT, JWTIssuer: testIssuer, JWTAudience: aud, JWKSURL: srv.URL, Rate: 1, Burst: 1}
	}
	build := func(ss ...Source) (*Endpoint, error) {
		return New(Config{Sources: ss, Store: &requests.Store{}, Pool: &pgxpool.Pool{}, Now: func() time.Time { return now }})
	}
	e, err := build(src("alpha", ""), src("beta", ""))
	if err != nil {
		t.Fatal(err)
	}
	tokFor := func(aud any) string { return mint(t, k.ec, jose.ES256, "a", claimsAt(now, set("aud", aud))) }
	for _, tc := range []struct {
		source string
		aud    any
		want   string
	}{
		{"alpha", "vgpu-bridge:webhook:alpha", ""},
		{"beta", "vgpu-bridge:webhook:beta", ""},
		{"beta", "vgpu-bridge:webhook:alpha", "wrong_audience"},
		{"alpha", []string{"vgpu-bridge:webhook:beta"}, "wrong_audience"},
		{"alpha", testAudience, "wrong_audience"},
	} {
		_, err := e.sources[tc.source].jwt.verify(context.Background(), tokFor(tc.aud), now)
		wantReason(t, err, tc.want)
	}
	if _, err := build(src("alpha", "vgpu-bridge"), src("beta", "vgpu-bridge")); err == nil ||
		!strings.Contains(err.Error(), `source "beta"`) || !strings.Contains(err.Error(), "own jwt_audience") {
		t.Errorf("two sources of one issuer sharing an audience: %v, want refused", err)
	}
	other := src("beta", "vgpu-bridge")
	other.JWTIssuer = "https://other.example.org"
	if _, err := build(src("alpha", "vgpu-bridge"), other); err != nil {
		t.Errorf("one audience at two issuers: %v", err)
	}
}

func TestJWTGrantKeySpace(t *testing.T) {
	a := jwtGrant{scoped: true, subject: "s", projects: []string{"p1", "p2"}}
	if got := (jwtGrant{subject: "s"}).keySpace(); got != "" {
		t.Errorf("unscoped grant: key space %q, want none", got)
	}
	same := jwtGrant{scoped: true, subject: "s", projects: []string{"p2", "p1"}}
	if a.keySpace() == "" || a.keySpace() != same.keySpace() {
		t.Errorf("the same projects in another order: %q and %q", a.keySpace(), same.keySpace())
	}
	for _, other := range []jwtGrant{
		{scoped: true, subject: "t", projects: []string{"p1", "p2"}},
		{scoped: true, subject: "s", projects: []string{"p1"}},
		{scoped: true, subject: "s", projects: []string{"p1p2"}},
		{scoped: true, subject: "s\x00p1", projects: []string{"p2"}},
	} {
		if other.keySpace() == a.keySpace() {
			t.Errorf("%+v shares %+v's key space", other, a)
		}
	}
}
