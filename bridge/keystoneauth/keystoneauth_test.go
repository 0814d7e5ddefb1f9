package keystoneauth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
)

// fakeValidator answers from a map of tokens and counts its calls.
type fakeValidator struct {
	mu     sync.Mutex
	tokens map[string]*TokenInfo
	err    error // returned for every token when set
	calls  atomic.Int32
	gate   chan struct{} // when set, Validate waits on it
}

func (f *fakeValidator) Validate(ctx context.Context, token string) (*TokenInfo, error) {
	f.calls.Add(1)
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	ti, ok := f.tokens[token]
	if !ok {
		return nil, ErrInvalidToken
	}
	c := *ti
	return &c, nil
}

func (f *fakeValidator) set(token string, ti *TokenInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ti == nil {
		delete(f.tokens, token)
		return
	}
	f.tokens[token] = ti
}

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var t0 = time.Date(2031, 1, 2, 2, 0, 0, 0, time.UTC)

func newAuth(t *testing.T, f *fakeValidator, mod func(*Config)) (*Authenticator, *clock) {
	t.Helper()
	clk := &clock{t: t0}
	cfg := Config{Validator: f, AdminRoles: []string{"admin"}, ReaderRoles: []string{"reader", "member"},
		CacheTTL: 5 * time.Minute, InvalidCacheTTL: 10 * time.Second, Now: clk.Now,
		ChallengeURI: "https://keystone.example.org:5000"}
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a, clk
}

func request(token string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/v1/instances", nil)
	if token != "" {
		r.Header.Set("X-Auth-Token", token)
	}
	return r
}

func status(err error) int {
	var p *api.ProblemDetails
	if errors.As(err, &p) {
		return p.Status
	}
	if err != nil {
		return -1
	}
	return http.StatusOK
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestRolesAndScope(t *testing.T) {
	exp := t0.Add(time.Hour)
	tests := []struct {
		name        string
		ti          TokenInfo
		wantStatus  int
		wantRole    api.Role
		wantProject string
		wantName    string
	}{
		{"admin on a project sees all", TokenInfo{UserName: "root", ProjectID: "p-admin", ProjectName: "admin", Roles: []string{"admin", "member", "reader"}},
			200, api.RoleAdmin, "", "root@admin"},
		{"admin role compared without case", TokenInfo{UserName: "root", ProjectID: "p1", Roles: []string{"Admin"}},
			200, api.RoleAdmin, "", "root@p1"},
		{"member is a reader of its project", TokenInfo{UserName: "alice", ProjectID: "p-a", ProjectName: "a", Roles: []string{"member"}},
			200, api.RoleReader, "p-a", "alice@a"},
		{"reader is a reader of its project", TokenInfo{UserName: "bob", ProjectID: "p-b", ProjectName: "b", Roles: []string{"reader"}},
			200, api.RoleReader, "p-b", "bob@b"},
		{"system reader sees all", TokenInfo{UserName: "mon", System: true, Roles: []string{"reader"}},
			200, api.RoleReader, "", "mon@system"},
		{"domain-scoped reader refused", TokenInfo{UserName: "dom", DomainID: "d1", Roles: []string{"reader"}},
			403, "", "", ""},
		{"domain-scoped admin is admin", TokenInfo{UserName: "dadm", DomainID: "d1", Roles: []string{"admin"}},
			200, api.RoleAdmin, "", "dadm@domain:d1"},
		{"no known role", TokenInfo{UserName: "eve", ProjectID: "p-e", Roles: []string{"load-balancer_member", "creator"}},
			403, "", "", ""},
		{"unscoped token has no roles", TokenInfo{UserName: "eve"}, 403, "", "", ""},
		{"user id when no name", TokenInfo{UserID: "u-1", ProjectID: "p-1", ProjectName: "one", Roles: []string{"member"}},
			200, api.RoleReader, "p-1", "u-1@one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ti := tt.ti
			ti.ExpiresAt = exp
			f := &fakeValidator{tokens: map[string]*TokenInfo{"tok": &ti}}
			a, _ := newAuth(t, f, nil)
			p, err := a.Authenticate(request("tok"))
			if got := status(err); got != tt.wantStatus {
				t.Fatalf("status = %d (%v), want %d", got, err, tt.wantStatus)
			}
			if tt.wantStatus != 200 {
				return
			}
			if p.Role != tt.wantRole || p.Project != tt.wantProject || p.Name != tt.wantName {
				t.Errorf("principal = %+v, want role %q project %q name %q", *p, tt.wantRole, tt.wantProject, tt.wantName)
			}
		})
	}
}

func TestForbiddenNamesRoles(t *testing.T) {
	f := &fakeValidator{tokens: map[string]*TokenInfo{"tok": {UserName: "eve", ProjectID: "p", Roles: []string{"creator"}, ExpiresAt: t0.Add(time.Hour)}}}
	a, _ := newAuth(t, f, nil)
	_, err := a.Authenticate(request("tok"))
	var p *api.ProblemDetails
	if !errors.As(err, &p) || p.Status != 403 || p.Code != "forbidden" {
		t.Fatalf("err = %v, want a 403 problem", err)
	}
	want := "the token's roles [creator] include none of [keystone] admin_roles [admin] or reader_roles [reader, member]"
	if p.Detail != want {
		t.Errorf("detail = %q, want %q", p.Detail, want)
	}
}

func TestNoToken(t *testing.T) {
	f := &fakeValidator{tokens: map[string]*TokenInfo{}}
	a, _ := newAuth(t, f, nil)
	_, err := a.Authenticate(request(""))
	var p *api.ProblemDetails
	const challenge = `Keystone uri="https://keystone.example.org:5000"` // newAuth's ChallengeURI
	if !errors.As(err, &p) || p.Status != 401 || p.Code != "no_token" || p.Headers["WWW-Authenticate"] != challenge {
		t.Fatalf("err = %#v, want 401 no_token with WWW-Authenticate: %s", err, challenge)
	}
	if f.calls.Load() != 0 {
		t.Errorf("Keystone asked %d times without a token", f.calls.Load())
	}
}

func TestBearerHeaderAccepted(t *testing.T) {
	f := &fakeValidator{tokens: map[string]*TokenInfo{"tok": {UserName: "a", ProjectID: "p", Roles: []string{"admin"}, ExpiresAt: t0.Add(time.Hour)}}}
	a, _ := newAuth(t, f, nil)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer tok")
	if _, err := a.Authenticate(r); err != nil {
		t.Fatal(err)
	}
}

// A valid token is cached until the TTL or its expiry, whichever is first;
// then Keystone is asked again and a revoked token is refused.
func TestValidCachedUntilTTLOrExpiry(t *testing.T) {
	tests := []struct {
		name    string
		expires time.Duration // after t0
		ttl     time.Duration
		fresh   time.Duration // last moment still served from cache
	}{
		{"ttl first", time.Hour, 5 * time.Minute, 5*time.Minute - time.Second},
		{"expiry first", 2 * time.Minute, 5 * time.Minute, 2*time.Minute - time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeValidator{tokens: map[string]*TokenInfo{"tok": {UserName: "a", ProjectID: "p", Roles: []string{"member"}, ExpiresAt: t0.Add(tt.expires)}}}
			a, clk := newAuth(t, f, func(c *Config) { c.CacheTTL = tt.ttl })
			if _, err := a.Authenticate(request("tok")); err != nil {
				t.Fatal(err)
			}
			f.set("tok", nil) // revoked in Keystone
			clk.Add(tt.fresh)
			if _, err := a.Authenticate(request("tok")); err != nil {
				t.Fatalf("within the cache time: %v", err)
			}
			if got := f.calls.Load(); got != 1 {
				t.Fatalf("Keystone asked %d times, want 1", got)
			}
			clk.Add(time.Second)
			if got := status(func() error { _, err := a.Authenticate(request("tok")); return err }()); got != 401 {
				t.Fatalf("after the cache time: status %d, want 401", got)
			}
			if got := f.calls.Load(); got != 2 {
				t.Fatalf("Keystone asked %d times, want 2", got)
			}
		})
	}
}

func TestZeroTTLAsksEveryTime(t *testing.T) {
	f := &fakeValidator{tokens: map[string]*TokenInfo{"tok": {UserName: "a", ProjectID: "p", Roles: []string{"admin"}, ExpiresAt: t0.Add(time.Hour)}}}
	a, _ := newAuth(t, f, func(c *Config) { c.CacheTTL = 0 })
	for range 3 {
		if _, err := a.Authenticate(request("tok")); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.calls.Load(); got != 3 {
		t.Errorf("Keystone asked %d times, want 3", got)
	}
	if a.CacheLen() != 0 {
		t.Errorf("cache holds %d entries, want 0", a.CacheLen())
	}
}

func TestExpiredTokenRefused(t *testing.T) {
	f := &fakeValidator{tokens: map[string]*TokenInfo{"tok": {UserName: "a", ProjectID: "p", Roles: []string{"admin"}, ExpiresAt: t0.Add(-time.Second)}}}
	a, _ := newAuth(t, f, nil)
	if got := status(func() error { _, err := a.Authenticate(request("tok")); return err }()); got != 401 {
		t.Fatalf("status %d, want 401", got)
	}
}

func TestInvalidCachedBriefly(t *testing.T) {
	f := &fakeValidator{tokens: map[string]*TokenInfo{}}
	a, clk := newAuth(t, f, func(c *Config) { c.InvalidCacheTTL = 10 * time.Second })
	auth := func() int { _, err := a.Authenticate(request("nope")); return status(err) }
	if got := auth(); got != 401 {
		t.Fatalf("status %d, want 401", got)
	}
	clk.Add(9 * time.Second)
	if got := auth(); got != 401 {
		t.Fatalf("status %d, want 401", got)
	}
	if got := f.calls.Load(); got != 1 {
		t.Fatalf("Keystone asked %d times within invalid_cache_ttl, want 1", got)
	}
	if r, h := counter(t, a.validations.WithLabelValues("refused")), counter(t, a.lookups.WithLabelValues("hit")); r != 1 || h != 1 {
		t.Errorf("metrics: refused %v, cache hits %v; want 1 and 1", r, h)
	}
	// The token became valid (e.g. clock skew on issue): seen after the TTL.
	f.set("nope", &TokenInfo{UserName: "a", ProjectID: "p", Roles: []string{"member"}, ExpiresAt: t0.Add(time.Hour)})
	clk.Add(time.Second)
	if got := auth(); got != 200 {
		t.Fatalf("after invalid_cache_ttl: status %d, want 200", got)
	}
}

// Keystone outages answer 503, are remembered for the few seconds of
// Retry-After only (not asked again back to back), and never log the
// token.
func TestOutageBrieflyCachedNotLogged(t *testing.T) {
	var buf bytes.Buffer
	f := &fakeValidator{err: errors.New("dial tcp 127.0.0.1:5000: connect: connection refused")}
	a, clk := newAuth(t, f, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&buf, nil)) })
	const tok = "gAAAAABsecret-token-value"
	for i := range 4 {
		if i == 2 {
			clk.Add(outageRetry)
		}
		_, err := a.Authenticate(request(tok))
		var p *api.ProblemDetails
		if !errors.As(err, &p) || p.Status != 503 || p.Code != "identity_unavailable" || p.Headers["Retry-After"] == "" {
			t.Fatalf("err = %#v, want 503 identity_unavailable with Retry-After", err)
		}
		if strings.Contains(p.Detail, tok) {
			t.Fatal("the problem holds the token")
		}
	}
	if got := f.calls.Load(); got != 2 {
		t.Errorf("Keystone asked %d times, want 2 (once, and again after Retry-After)", got)
	}
	f.mu.Lock()
	f.err = nil
	f.tokens = map[string]*TokenInfo{tok: {UserName: "a", ProjectID: "p", Roles: []string{"member"}, ExpiresAt: t0.Add(time.Hour)}}
	f.mu.Unlock()
	clk.Add(outageRetry)
	if _, err := a.Authenticate(request(tok)); err != nil {
		t.Errorf("Keystone back: %v", err)
	}
	if e := counter(t, a.validations.WithLabelValues("error")); e != 2 {
		t.Errorf("metrics: %v errors, want 2", e)
	}
	if !strings.Contains(buf.String(), "connection refused") || strings.Contains(buf.String(), tok) {
		t.Errorf("log = %q: want the cause, never the token", buf.String())
	}
}

func TestCacheBoundedLRU(t *testing.T) {
	f := &fakeValidator{tokens: map[string]*TokenInfo{}}
	for i := range 4 {
		f.tokens[fmt.Sprint("t", i)] = &TokenInfo{UserName: "u", ProjectID: "p", Roles: []string{"member"}, ExpiresAt: t0.Add(time.Hour)}
	}
	a, _ := newAuth(t, f, func(c *Config) { c.CacheSize = 2 })
	auth := func(tok string) {
		t.Helper()
		if _, err := a.Authenticate(request(tok)); err != nil {
			t.Fatal(err)
		}
	}
	auth("t0")
	auth("t1")
	auth("t0") // t0 most recent: t1 is evicted next
	auth("t2")
	if a.CacheLen() != 2 {
		t.Fatalf("cache holds %d entries, want 2", a.CacheLen())
	}
	before := f.calls.Load()
	auth("t0")
	auth("t2")
	if got := f.calls.Load() - before; got != 0 {
		t.Errorf("t0 and t2 should be cached; Keystone asked %d times", got)
	}
	auth("t1")
	if got := f.calls.Load() - before; got != 1 {
		t.Errorf("t1 should have been evicted; Keystone asked %d times, want 1", got)
	}
}

// Concurrent requests with the same uncached token cause one validation.
func TestOneValidationPerToken(t *testing.T) {
	f := &fakeValidator{tokens: map[string]*TokenInfo{"tok": {UserName: "a", ProjectID: "p", Roles: []string{"member"}, ExpiresAt: t0.Add(time.Hour)}},
		gate: make(chan struct{})}
	a, _ := newAuth(t, f, nil)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := a.Authenticate(request("tok"))
			errs <- err
		}()
	}
	// Callers that come while the validation waits share it; those that
	// come after it find the cache: either way Keystone is asked once.
	for f.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(f.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := f.calls.Load(); got != 1 {
		t.Errorf("Keystone asked %d times for %d concurrent callers, want 1", got, n)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := New(Config{AdminRoles: []string{"admin"}}); err == nil {
		t.Error("no validator accepted")
	}
	if _, err := New(Config{Validator: &fakeValidator{}}); err == nil {
		t.Error("no roles accepted")
	}
}

// TestHangingKeystone: while Keystone hangs, the callers of one token share
// one validation and each is answered 503 when its own request ends, the
// validation still under way; once it fails, the token is answered 503
// for a few seconds without asking Keystone again.
func TestHangingKeystone(t *testing.T) {
	f := &fakeValidator{tokens: map[string]*TokenInfo{}, err: errors.New("i/o timeout"), gate: make(chan struct{})}
	a, clk := newAuth(t, f, func(c *Config) { c.Timeout = time.Hour })
	const n = 100
	ctx, cancel := context.WithCancel(context.Background())
	codes := make(chan int, n)
	for range n {
		go func() {
			_, err := a.Authenticate(request("tok").WithContext(ctx))
			codes <- status(err)
		}()
	}
	for f.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	got := map[int]int{}
	timeout := time.After(30 * time.Second)
	for range n {
		select {
		case c := <-codes:
			got[c]++
		case <-timeout:
			t.Fatalf("callers still waiting after their request ended (answered: %v)", got)
		}
	}
	if got[http.StatusServiceUnavailable] != n {
		t.Errorf("answers %v, want %d × 503", got, n)
	}
	if c := f.calls.Load(); c != 1 {
		t.Errorf("Keystone asked %d times, want 1", c)
	}
	close(f.gate) // the validation fails
	for a.CacheLen() == 0 {
		time.Sleep(time.Millisecond)
	}
	for range 20 {
		if _, err := a.Authenticate(request("tok")); status(err) != http.StatusServiceUnavailable {
			t.Fatalf("after the failed validation: %v, want 503", err)
		}
	}
	if c := f.calls.Load(); c != 1 {
		t.Errorf("Keystone asked %d times right after it failed, want once in all", c)
	}
	clk.Add(outageRetry)
	a.Authenticate(request("tok"))
	if c := f.calls.Load(); c != 2 {
		t.Errorf("Keystone asked %d times after Retry-After, want 2", c)
	}
}

// TestPrincipalKeyedByIDs: callers of the same user and project names in
// two domains share a name (for people) but not a key (ids).
func TestPrincipalKeyedByIDs(t *testing.T) {
	exp := t0.Add(time.Hour)
	f := &fakeValidator{tokens: map[string]*TokenInfo{
		"d1":  {UserID: "u-1", UserName: "alice", ProjectID: "p-1", ProjectName: "research", Roles: []string{"member"}, ExpiresAt: exp},
		"d2":  {UserID: "u-2", UserName: "alice", ProjectID: "p-2", ProjectName: "research", Roles: []string{"member"}, ExpiresAt: exp},
		"sys": {UserID: "u-3", UserName: "mon", System: true, Roles: []string{"reader"}, ExpiresAt: exp},
	}}
	a, _ := newAuth(t, f, nil)
	keys := map[string]string{}
	for tok, want := range map[string]string{"d1": "u-1@p-1", "d2": "u-2@p-2", "sys": "u-3@system"} {
		p, err := a.Authenticate(request(tok))
		if err != nil {
			t.Fatal(err)
		}
		if p.ID != want || p.Key() != want {
			t.Errorf("%s: id %q, key %q, want %q", tok, p.ID, p.Key(), want)
		}
		keys[tok] = p.Name
	}
	if keys["d1"] != "alice@research" || keys["d2"] != keys["d1"] {
		t.Errorf("names %v, want alice@research for both", keys)
	}
}

// TestRulesReproduceRoleLists: with no policy file, the access rules
// written from the [keystone] role lists admit exactly whom the role
// lists admitted before there were rules — for every combination of
// roles and token scope, each rule's routes as their class did (and
// POST /v1/requests as an admin or a member of a project).
func TestRulesReproduceRoleLists(t *testing.T) {
	type before struct {
		refused bool
		role    api.Role
		project string
	}
	// classify is the mapping of roles and scope the role lists made.
	classify := func(c Config, ti TokenInfo) before {
		has := func(want []string) bool { return hasAny(ti.Roles, lower(want)) }
		switch {
		case has(c.AdminRoles):
			return before{role: api.RoleAdmin}
		case has(c.FleetReaderRoles):
			return before{role: api.RoleReader}
		case has(c.ReaderRoles) && ti.System:
			return before{role: api.RoleReader}
		case has(c.ReaderRoles) && ti.ProjectID != "" && has(c.MemberRoles):
			return before{role: api.RoleMember, project: ti.ProjectID}
		case has(c.ReaderRoles) && ti.ProjectID != "":
			return before{role: api.RoleReader, project: ti.ProjectID}
		}
		return before{refused: true}
	}
	// allows is what a class let in before.
	allows := func(b before, rule api.Rule) bool {
		switch {
		case rule.Name == "vgpu:requests:create":
			return b.role == api.RoleAdmin || (b.role == api.RoleMember && b.project != "")
		case rule.Class == api.Project || rule.Class == api.Custom:
			return true // every role
		case rule.Class == api.Fleet:
			return b.role == api.RoleAdmin || b.project == ""
		}
		return b.role == api.RoleAdmin
	}
	configs := map[string]func(*Config){
		"defaults": nil,
		"fleet readers and two admin roles": func(c *Config) {
			c.FleetReaderRoles, c.AdminRoles = []string{"observer"}, []string{"admin", "vgpu-admin"}
		},
		"members": func(c *Config) { c.MemberRoles = []string{"member"} },
		"no reader roles": func(c *Config) {
			c.ReaderRoles, c.MemberRoles, c.FleetReaderRoles = nil, []string{"member"}, []string{"observer"}
		},
	}
	roles := []string{"admin", "vgpu-admin", "reader", "member", "observer", "creator"}
	scopes := map[string]TokenInfo{
		"project": {ProjectID: "p1", ProjectName: "one"}, "system": {System: true},
		"domain": {DomainID: "d1"}, "unscoped": {},
	}
	for cname, mod := range configs {
		for sname, scope := range scopes {
			for mask := 0; mask < 1<<len(roles); mask++ {
				ti := scope
				ti.UserID, ti.ExpiresAt = "u1", t0.Add(time.Hour)
				for i, r := range roles {
					if mask&(1<<i) != 0 {
						ti.Roles = append(ti.Roles, r)
					}
				}
				f := &fakeValidator{tokens: map[string]*TokenInfo{"tok": &ti}}
				a, _ := newAuth(t, f, mod)
				want := classify(a.cfg, ti)
				p, err := a.Authenticate(request("tok"))
				what := fmt.Sprintf("%s, %s token, roles %v", cname, sname, ti.Roles)
				if want.refused {
					if status(err) != 403 {
						t.Errorf("%s: %v (%+v), want 403 as before", what, err, p)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v, want %+v", what, err, want)
					continue
				}
				if p.Role != want.role || p.Project != want.project {
					t.Errorf("%s: role %q project %q, want %q %q", what, p.Role, p.Project, want.role, want.project)
				}
				rules, err := api.Rules(a.cfg.RoleNames())
				if err != nil {
					t.Fatal(err)
				}
				for _, rule := range rules {
					if len(rule.Routes) == 0 {
						continue
					}
					if got := a.cfg.Policy.Allowed(rule.Name, p); got != allows(want, rule) {
						t.Errorf("%s: rule %s (%s) = %v, want %v as before", what, rule.Name, a.cfg.Policy.Rule(rule.Name), got, !got)
					}
				}
			}
		}
	}
}

// TestOverrideLetsRoleIn: a policy file that gives a role of its own a
// right lets that role's token in, to that right only, scoped to its
// project; without the file the token is refused as before.
func TestOverrideLetsRoleIn(t *testing.T) {
	ti := &TokenInfo{UserName: "mia", UserID: "u-mia", ProjectID: "p-ops", ProjectName: "ops", Roles: []string{"vgpu-maintainer"}, ExpiresAt: t0.Add(time.Hour)}
	pol, err := api.NewPolicy(api.RoleNames{Admin: []string{"admin"}, Reader: []string{"reader", "member"}},
		map[string]string{"vgpu:hosts:drain": "rule:admin or role:vgpu-maintainer"})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := newAuth(t, &fakeValidator{tokens: map[string]*TokenInfo{"tok": ti}}, func(c *Config) { c.Policy = pol })
	p, err := a.Authenticate(request("tok"))
	if err != nil {
		t.Fatalf("maintainer refused: %v", err)
	}
	if p.Role != api.RoleNone || p.Project != "p-ops" {
		t.Errorf("maintainer = %+v, want no API role, limited to p-ops", *p)
	}
	for rule, want := range map[string]bool{"vgpu:hosts:drain": true, "vgpu:gpus:drain": false, "vgpu:hosts:migrate_all": false,
		"vgpu:instances:list": false, "vgpu:hosts:list": false, "vgpu:controls:update": false} {
		if got := pol.Allowed(rule, p); got != want {
			t.Errorf("maintainer: %s = %v, want %v", rule, got, want)
		}
	}
	plain, _ := newAuth(t, &fakeValidator{tokens: map[string]*TokenInfo{"tok": ti}}, nil)
	if _, err := plain.Authenticate(request("tok")); status(err) != 403 {
		t.Errorf("without the policy file: %v, want 403", err)
	}
}

// TestCachedTokenJudgedByRulesInForce: a policy file reloaded (the rules
// replaced in place) applies to a token validated and cached before: the
// cache keeps what Keystone said of the token, not what the old rules
// made of it, and Keystone is not asked again.
func TestCachedTokenJudgedByRulesInForce(t *testing.T) {
	f := &fakeValidator{tokens: map[string]*TokenInfo{"tok": {UserID: "u1", UserName: "ops", ProjectID: "p1",
		Roles: []string{"vgpu-operator"}, ExpiresAt: t0.Add(time.Hour)}}}
	a, _ := newAuth(t, f, nil)
	pol := a.cfg.Policy
	if got := status(func() error { _, err := a.Authenticate(request("tok")); return err }()); got != http.StatusForbidden {
		t.Fatalf("with the default rules: status %d, want 403", got)
	}
	granted, err := api.NewPolicy(a.cfg.RoleNames(), map[string]string{api.RuleAdmin: "role:admin or role:vgpu-operator"})
	if err != nil {
		t.Fatal(err)
	}
	pol.Replace(granted)
	p, err := a.Authenticate(request("tok"))
	if err != nil || p.Role != api.RoleAdmin {
		t.Fatalf("after the rules were replaced: %+v, %v; want admin", p, err)
	}
	pol.Replace(mustPolicy(t, a.cfg.RoleNames()))
	if got := status(func() error { _, err := a.Authenticate(request("tok")); return err }()); got != http.StatusForbidden {
		t.Fatalf("with the defaults back: status %d, want 403", got)
	}
	if got := f.calls.Load(); got != 1 {
		t.Errorf("Keystone asked %d times, want 1 (the token stays cached)", got)
	}
}

func mustPolicy(t *testing.T, names api.RoleNames) *api.Policy {
	t.Helper()
	p, err := api.NewPolicy(names, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
